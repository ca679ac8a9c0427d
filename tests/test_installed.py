"""What a user installs works: runtime imports are declared, the catalog loads outside a source checkout.

.ci/run runs this suite against the installed wheel from outside the source tree and sets
``PERFDOCTOR_TEST_INSTALLED=1``; tests marked ``installed`` then prove that is what was imported (on
a developer machine they skip, and conftest turns that skip into a failure when CI is set).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import tomllib

from tests.paths import REPO

RULE_FILES = sorted(p.stem for p in (REPO / "rules").glob("*.yaml"))
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
# Import name -> distribution name where they differ.
DISTRIBUTION = {"yaml": "pyyaml"}


def installed_mode() -> bool:
    return os.environ.get("PERFDOCTOR_TEST_INSTALLED") == "1"


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in requirements}


def _third_party_imports(root: Path) -> dict[str, str]:
    """Top-level module -> first file importing it, for every absolute non-stdlib import under ``root``."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != "perfdoctor" and top not in sys.stdlib_module_names:
                    found.setdefault(top, str(path.relative_to(REPO)))
    return found


def test_runtime_imports_are_declared_dependencies():
    """`pip install .` must be enough to run analyze: every import outside the capture extra is a dependency."""
    core = _requirement_names(PYPROJECT["dependencies"])
    capture = core | _requirement_names(PYPROJECT["optional-dependencies"]["capture"])
    dask = _requirement_names(PYPROJECT["optional-dependencies"]["distributed"]) | {"distributed"}
    mcp = _requirement_names(PYPROJECT["optional-dependencies"]["mcp"])
    imports = _third_party_imports(REPO / "perfdoctor")
    capture_only = _third_party_imports(REPO / "perfdoctor" / "capture")
    missing = []
    for module, where in imports.items():
        allowed = capture if module in capture_only and where.startswith("perfdoctor/capture") else core
        if module == "nvidia":  # the CUDA Python bindings of the capture tools, found at run time if present
            continue
        if where == "perfdoctor/execute.py" and DISTRIBUTION.get(module, module).lower() in dask:
            continue  # --dask: the `distributed` extra, imported only when asked for
        if where == "perfdoctor/mcp_server.py" and DISTRIBUTION.get(module, module).lower() in mcp:
            continue  # `perfdoctor mcp`: the `mcp` extra, imported only by that command
        if DISTRIBUTION.get(module, module).lower() not in allowed:
            missing.append(f"{module} ({where})")
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_catalog_loads_from_a_zip(tmp_path):
    """The catalog is read through importlib.resources Traversables, so a zipped package keeps its rules."""
    archive = tmp_path / "perfdoctor.zip"
    with zipfile.ZipFile(archive, "w") as z:
        # Directory entries too, as `zip -r` writes them: zipimport finds namespace packages by them.
        for path in sorted((REPO / "perfdoctor").rglob("*")):
            if "__pycache__" not in path.parts:
                z.write(path, path.relative_to(REPO).as_posix())
        z.write(REPO / "rules", "perfdoctor/rules")
        for path in (REPO / "rules").glob("*.yaml"):
            z.write(path, f"perfdoctor/rules/{path.name}")
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); import perfdoctor; "
            "from perfdoctor.diagnose.rules import load_rules; "
            "print(json.dumps([perfdoctor.__file__, [r.id for r in load_rules()]]))")
    proc = subprocess.run([sys.executable, "-c", code, str(archive)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    origin, ids = json.loads(proc.stdout)
    assert origin.startswith(str(archive))
    assert ids == RULE_FILES


def _perfdoctor_command() -> list[str]:
    """The installed console script under CI; ``python -m perfdoctor`` (the worktree) on a developer machine."""
    if installed_mode():
        script = Path(sysconfig.get_path("scripts")) / "perfdoctor"
        assert script.is_file(), f"no console script at {script}"
        return [str(script)]
    return [sys.executable, "-m", "perfdoctor"]


def test_rules_command_lists_every_rule_file():
    proc = subprocess.run([*_perfdoctor_command(), "rules", "--format", "json"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    listed = sorted(row["id"] for row in json.loads(proc.stdout))
    assert listed == RULE_FILES
    assert all(row["builtin"] for row in json.loads(proc.stdout))


@pytest.mark.installed
def test_suite_imports_the_installed_package_not_the_source_tree(tmp_path):
    if not installed_mode():
        pytest.skip("PERFDOCTOR_TEST_INSTALLED=1 is set by .ci/run, which runs the suite on the installed wheel")
    import perfdoctor

    site = {Path(sysconfig.get_path(k)).resolve() for k in ("purelib", "platlib")}
    here = Path(perfdoctor.__file__).resolve()
    assert not here.is_relative_to(REPO.resolve()), here
    assert any(here.is_relative_to(s) for s in site), (here, site)
    # What `python -m perfdoctor` resolves to from the working directory the tests' subprocesses use.
    proc = subprocess.run([sys.executable, "-c", "import perfdoctor; print(perfdoctor.__file__)"],
                          capture_output=True, text=True, timeout=60)
    assert Path(proc.stdout.strip()).resolve() == here, proc.stdout + proc.stderr
