"""Package list and build step for setuptools (everything else is in pyproject.toml).

``find_packages`` cannot map the top-level ``rules/`` folder into the package, so it is added here as
``perfdoctor.rules``; tests/test_packaging.py checks that the built wheel holds every module and rule.

The build also writes ``perfdoctor/rules/catalog.json``: every shipped rule parsed once, here, with the
CRC-32 of its YAML, so that an installed perfdoctor reads one JSON file at start-up instead of parsing
25 YAML files (perfdoctor.diagnose.rules takes a rule from it only while its file is unchanged).
"""

import json
import zlib
from pathlib import Path

import yaml
from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py


class BuildWithRuleCatalog(build_py):
    def run(self) -> None:
        super().run()
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # as perfdoctor.safe_yaml parses them
        catalog = {}
        for path in sorted(Path(__file__).resolve().parent.joinpath("rules").glob("*.yaml")):
            raw = path.read_bytes()
            spec = yaml.load(raw.decode("utf-8"), Loader=loader)
            if json.loads(json.dumps(spec)) != spec:
                raise SystemExit(f"{path}: holds values JSON cannot carry; the rule catalog cannot be built")
            catalog[path.name] = {"crc32": zlib.crc32(raw), "spec": spec}
        target = Path(self.build_lib, "perfdoctor", "rules", "catalog.json")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(catalog, sort_keys=True, ensure_ascii=False), encoding="utf-8")


setup(
    packages=[*find_namespace_packages(include=["perfdoctor", "perfdoctor.*"]), "perfdoctor.rules"],
    package_dir={"perfdoctor.rules": "rules"},
    cmdclass={"build_py": BuildWithRuleCatalog},
)
