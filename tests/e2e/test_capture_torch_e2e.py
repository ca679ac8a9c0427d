"""`perfdoctor capture --profiler torch --steps 2-4 -- torchrun --nproc_per_node 2 tests/e2e/tiny_train.py`.

No nsys: each rank profiles itself with torch.profiler (CPU build of torch, gloo, CPU activity only). The run
directory must hold one Kineto trace per rank whose labels (steps of the window, comm ranges by group,
GC, data waits) are perfdoctor's when loaded, with the rank and config marks and the hook's process-group
names from the trace's metadata; only the window is profiled; the manifest says `profiler: torch` and why
no memory snapshot exists; no byte of any file holds a secret of the environment or the command line;
and `perfdoctor analyze RUN_DIR` reads it without options.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from perfdoctor.load.labels import labelled, parse_label, rank_mark
from perfdoctor.load.run import load_run

HERE = Path(__file__).resolve().parent
SECRET_ENV = {"NCCL_DEBUG_AUTH_TOKEN": "hunter2-torch-e2e", "MY_API_TOKEN": "tok-torch-e2e-0123"}
SECRET_ARGS = ["--api-key", "xyz-torch-e2e-key", "--url", "https://bob:url-pw-torch-e2e@example.com/data"]
SECRET_VALUES = [*SECRET_ENV.values(), "xyz-torch-e2e-key", "url-pw-torch-e2e"]
STEPS = 7


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("torchrun") is None:
        pytest.skip("no torch (`pip install torch==2.13.0` installs the CPU build here; .ci/run does)")
    run = tmp_path_factory.mktemp("capture") / "run"
    env = {**os.environ, **SECRET_ENV, "NCCL_ALGO": "Ring"}
    proc = subprocess.run([sys.executable, "-m", "perfdoctor", "capture", "--profiler", "torch", "--out", str(run),
                           "--steps", "2-4", "--", "torchrun", "--nproc_per_node", "2", str(HERE / "tiny_train.py"),
                           str(STEPS), *SECRET_ARGS],
                          capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not [v for v in SECRET_VALUES if v in proc.stderr]
    assert "2 PyTorch profiler trace(s)" in proc.stderr
    return run


def test_one_trace_per_rank_with_the_capture_labels(run_dir: Path) -> None:
    run = load_run([run_dir])
    assert [tl.rank for tl in run.timelines] == [0, 1]
    for tl in run.timelines:
        assert tl.device_id is None and tl.trace.path.name == f"rank{tl.rank}.pt.trace.json.gz"
        assert rank_mark(tl) == {"r": tl.rank, "local": tl.rank, "world": 2}
        assert sorted(parse_label(t)[1]["n"] for t in labelled(tl.nvtx, "step")["text"]) == ["2", "3", "4"]
        comm = [parse_label(t)[1] for t in labelled(tl.nvtx, "comm")["text"]]
        assert {(f["op"], f["group"]) for f in comm} == {("all_reduce", "dp"), ("all_gather", "tp"),
                                                         ("send_recv", "pp")}
        assert all(int(f["bytes"]) > 0 and f["size"] == "2" for f in comm)
        assert len(labelled(tl.nvtx, "gc")) >= 1  # steps 3 collect garbage inside the window
        assert len(labelled(tl.nvtx, "data")) == 3  # one DataLoader fetch per step
        # c10d names: the world group ("0", dp without Megatron's parallel state), then the groups in order
        assert tl.trace.capture_groups == {"0": "dp", "1": "dp", "2": "tp", "3": "pp"}
        assert tl.trace.config == {"dp": 2, "tp": 2, "pp": 2}  # the profiler's own process-group record


def test_only_the_window_is_profiled(run_dir: Path) -> None:
    """Of 7 iterations, only the 3 of the window are in the trace: one gloo all-gather each."""
    for rank in (0, 1):
        trace = json.loads(gzip.decompress((run_dir / f"rank{rank}.pt.trace.json.gz").read_bytes()))
        names = [e.get("name") for e in trace["traceEvents"]]
        assert names.count("gloo:all_gather") == 3
        assert trace["perfdoctor"]["activities"] == ["cpu"]


def test_manifest_records_the_torch_capture(run_dir: Path) -> None:
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["profiler"] == "torch" and manifest["nsys"] is None and manifest["exit_code"] == 0
    assert [r["rank"] for r in manifest["ranks"]] == [0, 1] and manifest["world_size"] == 2
    assert [r["profiler"]["trace"] for r in manifest["ranks"]] == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    assert manifest["env"]["NCCL_DEBUG_AUTH_TOKEN"] == "<redacted>" and manifest["env"]["NCCL_ALGO"] == "Ring"
    assert manifest["memory"]["0"]["status"] == "skipped" and "CUDA" in manifest["memory"]["0"]["reason"]
    assert sorted(manifest["files"]) == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz", "ranks/rank0.json",
                                         "ranks/rank1.json"]


def test_no_file_holds_a_secret(run_dir: Path) -> None:
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert not [p for p in files if p.name.startswith(".")]  # no unscrubbed trace left behind
    for path in files:
        data = path.read_bytes()
        if path.name.endswith(".gz"):
            data = gzip.decompress(data)
        assert [v for v in SECRET_VALUES if v.encode() in data] == [], path


def test_analyze_reads_the_run_directory(run_dir: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "perfdoctor", "analyze", str(run_dir), "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["steps"]["source"] == "nvtx-step" and report["steps"]["count"] == 3
    assert report["run"]["ranks"] == [0, 1]
    assert {t["rank_source"] for t in report["run"]["timelines"]} == {"file"}
    assert all(d["nvtx_domains"]["perfdoctor"] > 0 and d["nvtx_marks"] == 2 for d in report["devices"])
    assert any("no CUDA data" in w for w in report["warnings"])
    assert report["run"]["config"]["tp"] == 2


def test_the_gpu_script_runs_on_cpu(tmp_path: Path) -> None:
    """tests/e2e/gpu_capture.sh --cpu: the GPU machine's script, with gloo and CPU activity, passes its checks."""
    if shutil.which("torchrun") is None or shutil.which("bash") is None:
        pytest.skip("needs bash and torch")
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(HERE / "gpu_capture.sh"), "--cpu", str(tmp_path)], capture_output=True,
                          text=True, timeout=600, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "FAIL" not in proc.stdout and proc.stdout.count("ok  ") == 7
    assert "analyze: steps {'count': 2" in proc.stdout
