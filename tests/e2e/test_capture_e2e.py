"""`perfdoctor capture --steps 2-4 -- torchrun --nproc_per_node 2 tests/e2e/tiny_train.py` with real nsys.

CPU build of torch, gloo, Debian nsys 2022.4 (installed by .ci/run): the run directory must hold
SQLite exports whose NVTX carries the step ranges of the window, comm ranges labelled with both
groups, rank/config marks and GC ranges; a manifest with the secret redacted; and `perfdoctor
analyze RUN_DIR` must find the steps and ranks. Marked nsys: CI refuses to skip it.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from perfdoctor.load.labels import parse_label

pytestmark = pytest.mark.nsys
HERE = Path(__file__).resolve().parent
SECRET = "hunter2-e2e-secret"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("nsys") is None:
        pytest.skip("no nsys on PATH (scripts/install_nsys.sh installs nsys 2022.4 on Debian 12)")
    if shutil.which("torchrun") is None:
        pytest.skip("no torch (`pip install torch==2.13.0` installs the CPU build here; .ci/run does)")
    run = tmp_path_factory.mktemp("capture") / "run"
    env = {**os.environ, "NCCL_DEBUG_AUTH_TOKEN": SECRET, "NCCL_ALGO": "Ring"}
    proc = subprocess.run([sys.executable, "-m", "perfdoctor", "capture", "--out", str(run), "--steps", "2-4", "--",
                           "torchrun", "--nproc_per_node", "2", str(HERE / "tiny_train.py")],
                          capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


def nvtx_rows(path: Path) -> list[tuple[int, str]]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return db.execute("SELECT (e.globalTid >> 24) & 16777215, COALESCE(e.text, s.value) FROM NVTX_EVENTS e "
                          "LEFT JOIN StringIds s ON s.id = e.textId WHERE e.eventType IN (34, 59, 60)").fetchall()


def test_exports_hold_the_labels_of_both_ranks(run_dir: Path) -> None:
    (export,) = run_dir.glob("node-*.sqlite")
    by_pid: dict[int, list[str]] = {}
    for pid, text in nvtx_rows(export):
        by_pid.setdefault(pid, []).append(text)
    assert len(by_pid) == 2  # the two ranks; the torchrun agent labels nothing
    ranks = set()
    for texts in by_pid.values():
        kinds = [parse_label(t) for t in texts]
        assert sorted(f["n"] for k, f in kinds if k == "step") == ["2", "3", "4"]
        (rank,) = [f for k, f in kinds if k == "rank"]
        ranks.add(rank["r"])
        assert rank["world"] == "2"
        assert sum(t.startswith("config {") for t in texts) == 1
        groups = {(f["op"], f["group"]) for k, f in kinds if k == "comm"}
        assert {("all_reduce", "dp"), ("all_gather", "tp"), ("send_recv", "pp")} <= groups
        assert all(int(f["bytes"]) > 0 and f["size"] == "2" for k, f in kinds if k == "comm")
        assert any(k == "gc" for k, _ in kinds)
    assert ranks == {"0", "1"}


def test_manifest_records_the_run_and_redacts_secrets(run_dir: Path) -> None:
    text = (run_dir / "manifest.json").read_text()
    assert SECRET not in text
    manifest = json.loads(text)
    assert manifest["env"]["NCCL_DEBUG_AUTH_TOKEN"] == "<redacted>" and manifest["env"]["NCCL_ALGO"] == "Ring"
    assert manifest["exit_code"] == 0 and manifest["world_size"] == 2
    assert [r["rank"] for r in manifest["ranks"]] == [0, 1]
    assert manifest["versions"]["torch"].startswith("2.") and manifest["nsys"]["version"].startswith("20")
    assert manifest["memory"]["0"]["status"] == "skipped" and "CUDA" in manifest["memory"]["0"]["reason"]
    assert any(f.endswith(".sqlite") for f in manifest["files"]) and any(f.endswith(".nsys-rep")
                                                                         for f in manifest["files"])


def test_analyze_finds_steps_and_ranks(run_dir: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "perfdoctor", "analyze", str(run_dir), "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["steps"]["source"] == "nvtx-step" and report["steps"]["count"] == 3
    assert report["run"]["ranks"] == [0, 1]
    assert {t["rank_source"] for t in report["run"]["timelines"]} == {"nvtx-mark"}
    assert any("no CUDA data" in w for w in report["warnings"])
