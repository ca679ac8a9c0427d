"""Every shell command that README.md and docs/ show is run here, with its output checked.

The commands are read from the fenced ``bash`` blocks by scripts/doc_commands.py (the same parser
.ci/run uses for the README's set-up command). Each is either in RUNS (run in a scene folder that
holds the files its placeholders name, with what it must print or write) or in EXCLUDED with the
reason it cannot run on a CPU-only machine; a documented command in neither, or a listed command no
document shows any more, fails the test. Under .ci/run ``perfdoctor`` is the installed console
script; on a developer machine, the worktree's package.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.paths import REPO, SAMPLES

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_spec = importlib.util.spec_from_file_location("doc_commands", REPO / "scripts" / "doc_commands.py")
doc_commands = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(doc_commands)

CAPTURE_ON_GPUS = ("runs a training launch on GPUs (torchrun/srun with the user's script); `perfdoctor capture` "
                   "itself is tested for real on CPU by tests/e2e")
EXCLUDED = {
    "pip install . && perfdoctor analyze sample_traces/real_h100/h100_2gpu_fastvideo.sqlite":
        "set-up command 1: .ci/run runs it verbatim on a clean copy in a fresh virtual environment",
    "bash .ci/run": "set-up command 2: it is CI (needs root and apt)",
    "pip install '.[capture]'": "installs torch; .ci/run installs the wheel with the capture extra for the suite",
    "nsys profile -t cuda,nvtx,osrt --sample=none --cpuctxsw=none -o run torchrun ... train.py ...": CAPTURE_ON_GPUS,
    "perfdoctor capture --out runs/r1 --steps 10-12 -- torchrun --nproc_per_node 8 pretrain_gpt.py ...":
        CAPTURE_ON_GPUS,
    "perfdoctor capture --out $RUN --steps 10-12 -- srun --ntasks-per-node=8 python pretrain_gpt.py ...":
        CAPTURE_ON_GPUS,
    "perfdoctor capture --out $RUN --steps 10-12 -- srun --ntasks-per-node=1 torchrun --nproc_per_node 8 ... train.py":
        CAPTURE_ON_GPUS,
    "perfdoctor capture --steps 10-12 -- torchrun --nproc_per_node 8 pretrain_gpt.py ...": CAPTURE_ON_GPUS,
    "perfdoctor capture --out $RUN --steps 10-12 -- srun --ntasks-per-node=1 torchrun --nproc_per_node 8  --nnodes "
    "$SLURM_NNODES --rdzv-backend c10d --rdzv-endpoint $HEAD:29500 pretrain_gpt.py ...": CAPTURE_ON_GPUS,
    "perfdoctor capture --steps 10-12 -- torchrun --nproc_per_node 8 pretrain_gpt.py  --tensor-model-parallel-size 2 "
    "--pipeline-model-parallel-size 2 ...": CAPTURE_ON_GPUS,
    "perfdoctor capture --steps 10-12 -- torchrun --nproc_per_node 8 scripts/training/run_recipe.py  --recipe "
    "llama3_8b_pretrain_config ...": CAPTURE_ON_GPUS,
    "perfdoctor capture --steps 10-12 -- torchrun --nproc_per_node 8 -m nemo_run.core.runners.fdl_runner ...":
        CAPTURE_ON_GPUS,
    "perfdoctor capture --out runs/base --steps 10-12 -- torchrun --nproc_per_node 8 pretrain_gpt.py ...":
        CAPTURE_ON_GPUS,
    "perfdoctor capture --out runs/head --steps 10-12 -- torchrun --nproc_per_node 8 pretrain_gpt.py ... "
    "--overlap-grad-reduce": CAPTURE_ON_GPUS,
    "pip install '.[mcp]'": "installs the MCP SDK from the package index; .ci/run installs the wheel with the mcp "
                            "extra, and tests/test_mcp.py drives `perfdoctor mcp` with the SDK's own client",
    "perfdoctor capture --profiler torch --steps 10-12 -- torchrun --nproc_per_node 8 pretrain_gpt.py ...":
        CAPTURE_ON_GPUS,
    "bash tests/e2e/gpu_capture.sh":
        "needs a GPU machine; its --cpu variant runs in tests/e2e/test_capture_torch_e2e.py",
}


@dataclass(frozen=True)
class Check:
    """What a documented command must do in the scene: exit code, output pattern, files it writes."""

    rc: int = 0
    prints: str = ""  # regex searched in stdout + stderr
    writes: tuple[tuple[str, str], ...] = ()  # (file, regex its text must match)
    nsys: bool = False  # needs the real nsys CLI (and the scene's real report)
    substitute: tuple[tuple[str, str], ...] = ()  # placeholder -> concrete text in the scene
    creates: tuple[str, ...] = ()  # scene files the command makes itself (removed before it runs)


RUNS = {
    "nsys export --type sqlite -o run.sqlite run.nsys-rep": Check(
        nsys=True, creates=("run.sqlite",), writes=(("run.sqlite", "^SQLite format 3"),)),
    "perfdoctor analyze run.sqlite": Check(prints="exposed-dp-comm"),
    "perfdoctor analyze run.sqlite --format json -o report.json":
        Check(writes=(("report.json", r'"schema_version": "1"'),)),
    "perfdoctor analyze RUN_DIR/": Check(prints="pipeline-bubble"),
    "perfdoctor analyze run.nsys-rep": Check(nsys=True, prints="no CUDA data"),
    "perfdoctor analyze RUN_DIR --config megatron_args.yaml --tp 4":
        Check(writes=(("config.json", "pipeline-bubble"),),
              substitute=(("RUN_DIR", "RUN_DIR --format json -o config.json"),)),
    "perfdoctor rules": Check(prints="ln-sm-margin"),
    "perfdoctor explain ln-sm-margin": Check(prints="ln-sm-margin"),
    "perfdoctor analyze RUN_DIR --rules my_rules/": Check(prints="my-pipeline-check"),
    "perfdoctor analyze runs/r1": Check(prints="pipeline-bubble"),
    "perfdoctor analyze RUN_DIR --html report.html": Check(writes=(("report.html", "(?s)<html.*pipeline-bubble"),)),
    "perfdoctor analyze RUN_DIR --markdown report.md": Check(writes=(("report.md", r"pipeline\\?-bubble"),)),
    "perfdoctor analyze RUN_DIR --html r.html --plotly-js cdn": Check(writes=(("r.html", "cdn.plot.ly"),)),
    "perfdoctor analyze RUN_DIR --fail-on high": Check(rc=1, prints="at or above --fail-on high"),
    "perfdoctor diff base.json head.json --fail-on-regression 5 --markdown diff.md --html diff.html":
        Check(rc=1, prints="regressed by", writes=(("diff.md", "Step time"), ("diff.html", "<html"))),
    "perfdoctor memory RUN_DIR/memory/rank0.pickle --device-memory 80": Check(prints="peak allocated"),
    "perfdoctor analyze RUN_DIR": Check(prints="pipeline-bubble"),
    "perfdoctor analyze trace.sqlite snapshot_0.pickle --device-memory 80": Check(prints="memory"),
    "perfdoctor analyze perfdoctor-runs/<date-time>/":
        Check(prints="pipeline-bubble", substitute=(("<date-time>", "2026-11-23_10-00-00"),)),
    "perfdoctor analyze traces/head --format json -o head.json --html head.html --markdown head.md --fail-on high":
        Check(rc=1, writes=(("head.json", "exposed-dp-comm"), ("head.html", "<html"),
                            ("head.md", r"exposed\\?-dp\\?-comm"))),
    "perfdoctor analyze traces/base --format json -o base.json": Check(writes=(("base.json", '"findings"'),)),
    "perfdoctor analyze RUN_DIR --perfetto run.perfetto.json":
        Check(writes=(("run.perfetto.json", r'^\{"traceEvents":\[.*"process_name".*"critical path'),)),
    "perfdoctor diff traces/base traces/head --perfetto diff.perfetto.json":
        Check(writes=(("diff.perfetto.json", r'"base \\u00b7 rank 0".*"head \\u00b7 rank 0"'),)),
    "perfdoctor analyze runs/base --format json -o base.json": Check(writes=(("base.json", "exposed-dp-comm"),)),
    "perfdoctor explain exposed-dp-comm": Check(prints="overlap"),
    "perfdoctor diff runs/base runs/head --format json -o diff.json":
        Check(writes=(("diff.json", r'"step_regression_pct": 0\.0'),)),
    "perfdoctor diff base.json head.json --markdown diff.md --html diff.html --fail-on-regression 5":
        Check(rc=1, writes=(("diff.md", "Step time"), ("diff.html", "<html"))),
}
def documented() -> dict[str, list[str]]:
    """Command -> the documents that show it."""
    out: dict[str, list[str]] = {}
    for doc in DOCS:
        for cmd in doc_commands.commands(doc.read_text(encoding="utf-8")):
            out.setdefault(cmd, []).append(doc.name)
    return out


def test_every_documented_command_is_run_or_excluded_with_a_reason():
    shown = documented()
    unlisted = sorted(set(shown) - RUNS.keys() - EXCLUDED.keys())
    assert not unlisted, f"documented commands no test runs (add them to RUNS or EXCLUDED): {unlisted}"
    stale = sorted((RUNS.keys() | EXCLUDED.keys()) - set(shown))
    assert not stale, f"listed commands no document shows any more: {stale}"
    assert not RUNS.keys() & EXCLUDED.keys()


def test_readme_has_exactly_two_setup_commands():
    assert len(doc_commands.setup_commands((REPO / "README.md").read_text(encoding="utf-8"))) == 2


def _perfdoctor_on_path(bin_dir: Path) -> dict[str, str]:
    """PATH whose `perfdoctor` is the installed script under .ci/run, else a shim to the worktree's package."""
    env = dict(os.environ)
    if os.environ.get("PERFDOCTOR_TEST_INSTALLED") == "1":
        scripts = sysconfig.get_path("scripts")
        assert (Path(scripts) / "perfdoctor").is_file()
        env["PATH"] = scripts + os.pathsep + env.get("PATH", "")
        return env
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / "perfdoctor"
    shim.write_text(f'#!/bin/sh\nPYTHONPATH="{REPO}" exec "{sys.executable}" -m perfdoctor "$@"\n')
    shim.chmod(0o755)
    env["PATH"] = str(bin_dir) + os.pathsep + env.get("PATH", "")
    return env


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files the documented commands name, made from the bundled samples."""
    root = tmp_path_factory.mktemp("docs_scene")
    run_dir = SAMPLES / "pp_1f1b"
    snapshot = REPO / "tests" / "data" / "torch_profiler_snapshot.pickle"
    shutil.copyfile(SAMPLES / "exposed_dp" / "exposed_dp.rank0.sqlite", root / "run.sqlite")
    shutil.copyfile(SAMPLES / "exposed_dp" / "exposed_dp.rank0.sqlite", root / "trace.sqlite")
    shutil.copyfile(snapshot, root / "snapshot_0.pickle")
    for where in ("RUN_DIR", "runs/r1", "perfdoctor-runs/2026-11-23_10-00-00"):
        shutil.copytree(run_dir, root / where, ignore=shutil.ignore_patterns("*.truth.json"))
    (root / "RUN_DIR" / "memory").mkdir()
    shutil.copyfile(snapshot, root / "RUN_DIR" / "memory" / "rank0.pickle")
    # A rule of the user's own for `--rules my_rules/`: the shipped pipeline-bubble rule under another id.
    rule = yaml.safe_load((REPO / "rules" / "pipeline-bubble.yaml").read_text())
    rule.update(id="my-pipeline-check", title="Our team's pipeline-bubble check")
    rule.pop("supersedes", None)
    (root / "my_rules").mkdir()
    (root / "my_rules" / "my-pipeline-check.yaml").write_text(yaml.safe_dump(rule))
    (root / "megatron_args.yaml").write_text("tensor_model_parallel_size: 2\npipeline_model_parallel_size: 4\n"
                                             "hidden_size: 2048\nnum_layers: 8\n")
    shutil.copytree(SAMPLES / "clean_baseline", root / "traces" / "base")
    # docs/agents.md's loop: the base exposes DP comm, the head (one knob later) does not
    shutil.copytree(SAMPLES / "exposed_dp", root / "runs" / "base", ignore=shutil.ignore_patterns("*.truth.json"))
    shutil.copytree(SAMPLES / "clean_baseline", root / "runs" / "head", ignore=shutil.ignore_patterns("*.truth.json"))
    shutil.copytree(SAMPLES / "exposed_dp", root / "traces" / "head")
    env = _perfdoctor_on_path(root / ".bin")
    for name, sample in (("base", "clean_baseline"), ("head", "exposed_dp")):
        subprocess.run(["perfdoctor", "analyze", str(SAMPLES / sample), "--format", "json", "-o", f"{name}.json"],
                       cwd=root, env=env, check=True, capture_output=True, timeout=300)
    if shutil.which("nsys"):
        from tests.nsys.capture import profile

        code = "import nvtx\nfor i in range(3):\n    with nvtx.annotate(f'step n={i}'):\n        sum(range(10**5))\n"
        (root / ".prog.py").write_text(code)
        profile([sys.executable, str(root / ".prog.py")], root / "run.nsys-rep")
    return root


@pytest.mark.parametrize("command", [
    pytest.param(cmd, marks=[pytest.mark.nsys] if check.nsys else []) for cmd, check in RUNS.items()
])
def test_documented_command(command, scene, tmp_path):
    check = RUNS[command]
    if check.nsys and not (scene / "run.nsys-rep").is_file():
        pytest.skip("no nsys on PATH to make the scene's report")
    work = tmp_path / "scene"
    shutil.copytree(scene, work, symlinks=True)
    for name in check.creates:
        (work / name).unlink()
    text = command
    for placeholder, concrete in check.substitute:
        text = text.replace(placeholder, concrete)
    proc = subprocess.run(["bash", "-c", text], cwd=work, env=_perfdoctor_on_path(work / ".bin"),
                          capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == check.rc, output[-3000:]
    assert "Traceback" not in output
    assert re.search(check.prints, output), output[-3000:]
    for name, pattern in check.writes:
        assert re.search(pattern, (work / name).read_text(encoding="utf-8", errors="replace")), name
    if command.endswith("--format json -o report.json"):
        assert json.loads((work / "report.json").read_text())["findings"]
    if "--config" in command:  # the flag wins over the file; the file's other values are there, said so
        run = json.loads((work / "config.json").read_text())["run"]
        assert (run["config"]["tp"], run["config_sources"]["tp"]) == (4, "cli")
        assert (run["config"]["pp"], run["config_sources"]["pp"]) == (4, "config-file")
