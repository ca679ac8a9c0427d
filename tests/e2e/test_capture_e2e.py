"""`perfdoctor capture --steps 2-4 -- torchrun --nproc_per_node 2 tests/e2e/tiny_train.py` with real nsys.

CPU build of torch, gloo, Debian nsys 2022.4 (installed by .ci/run): the run directory must hold
SQLite exports whose NVTX carries the step ranges of the window, comm ranges labelled with both
groups, rank/config marks and GC ranges; a manifest; no byte of any file but the .nsys-rep (kept here
with --keep-reports yes, owner-only) holding a secret of the environment or the command line (also once
the report is re-exported by the 2023.4 and 2024.2 exporters, whose META_DATA_CAPTURE holds the
environment and command line, and scrubbed); under default options no byte of any file at all; and
`perfdoctor analyze RUN_DIR` must find the steps and ranks. Marked nsys: CI refuses to skip it.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from perfdoctor.capture.scrub import scrub_sqlite, secret_values
from perfdoctor.load.labels import parse_label
from tests.nsys.capture import export_sqlite, find_nsys
from tests.nsys.conftest import EXTRA_DIR

pytestmark = pytest.mark.nsys
HERE = Path(__file__).resolve().parent
SECRET = "hunter2-e2e-secret"
SECRET_ENV = {"NCCL_DEBUG_AUTH_TOKEN": SECRET, "MY_API_TOKEN": "tok-e2e-0123456",
              "AWS_SECRET_ACCESS_KEY": "aws-e2e-6543210", "NCCL_IB_PASSWD": "ib-pw-e2e-4242"}
SECRET_ARGS = ["--api-key", "xyz-e2e-api-key", "--url", "https://bob:url-pw-e2e-55@example.com/data"]
SECRET_VALUES = [*SECRET_ENV.values(), "xyz-e2e-api-key", "url-pw-e2e-55"]
TRAIN = ["torchrun", "--nproc_per_node", "2", str(HERE / "tiny_train.py"), "7", *SECRET_ARGS]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("nsys") is None:
        pytest.skip("no nsys on PATH (scripts/install_nsys.sh installs nsys 2022.4 on Debian 12)")
    if shutil.which("torchrun") is None:
        pytest.skip("no torch (`pip install torch==2.13.0` installs the CPU build here; .ci/run does)")
    run = tmp_path_factory.mktemp("capture") / "run"
    env = {**os.environ, **SECRET_ENV, "NCCL_ALGO": "Ring"}
    proc = subprocess.run([sys.executable, "-m", "perfdoctor", "capture", "--out", str(run), "--steps", "2-4",
                           "--keep-reports", "yes", "--", *TRAIN],
                          capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not [v for v in SECRET_VALUES if v in proc.stderr]
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
        assert sum(k == "data" for k, _ in kinds) == 3  # one DataLoader fetch per step of the window
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


def leaks(path: Path) -> list[str]:
    data = path.read_bytes()
    return [v for v in SECRET_VALUES if v.encode() in data]


def test_no_file_but_the_report_holds_a_secret(run_dir: Path) -> None:
    """With --keep-reports yes; by default the report is deleted once exported (the test below)."""
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    (report,) = [p for p in files if p.suffix == ".nsys-rep"]
    assert leaks(report)  # the report holds them: that is why it is owner-only, announced, and not kept by default
    assert stat.S_IMODE(report.stat().st_mode) == 0o600
    checked = [p for p in files if p != report]
    assert {p.suffix for p in checked} >= {".sqlite", ".json"}
    assert {str(p): leaks(p) for p in checked} == {str(p): [] for p in checked}


@pytest.mark.parametrize("release", ["2023.4", "2024.2"])
def test_newer_exporters_schemas_are_scrubbed_too(run_dir: Path, release: str, tmp_path: Path) -> None:
    """2023.4+ exports write the environment and the command line to META_DATA_CAPTURE."""
    cli = find_nsys(str(EXTRA_DIR / release / "nsys"))
    if cli is None:
        pytest.skip(f"no nsys {release} exporter (scripts/install_nsys_extra.sh puts one in {EXTRA_DIR})")
    (report,) = run_dir.glob("*.nsys-rep")
    raw = export_sqlite(report, tmp_path / "raw.sqlite", nsys=cli.path)
    with sqlite3.connect(raw) as db:
        rows = db.execute("SELECT value FROM META_DATA_CAPTURE WHERE name LIKE 'PROCESS_%'").fetchall()
    assert any("MY_API_TOKEN" in v for (v,) in rows) and any("xyz-e2e-api-key" in v for (v,) in rows)
    clean = tmp_path / "clean.sqlite"
    scrub_sqlite(raw, clean, secret_values(SECRET_ENV, TRAIN))
    assert leaks(clean) == []
    with sqlite3.connect(clean) as db:
        values = {v for (v,) in db.execute("SELECT value FROM META_DATA_CAPTURE")}
    assert 'MY_API_TOKEN="<redacted>"' in values and 'NCCL_ALGO="Ring"' in values


def test_default_capture_leaves_no_secret_in_any_file(tmp_path: Path) -> None:
    """Default options (the report deleted once exported): no byte of any file of the run directory
    holds a secret of the environment or the command line."""
    if shutil.which("nsys") is None:
        pytest.skip("no nsys on PATH (scripts/install_nsys.sh installs nsys 2022.4 on Debian 12)")
    run = tmp_path / "run"
    program = [sys.executable, "-c", "import sys; print(sys.argv)", *SECRET_ARGS]
    proc = subprocess.run([sys.executable, "-m", "perfdoctor", "capture", "--out", str(run), "--", *program],
                          capture_output=True, text=True, timeout=300, env={**os.environ, **SECRET_ENV},
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = [p for p in run.rglob("*") if p.is_file()]
    assert {p.suffix for p in files} >= {".sqlite", ".json"} and not [p for p in files if p.suffix == ".nsys-rep"]
    assert {str(p): leaks(p) for p in files} == {str(p): [] for p in files}
    assert not [v for v in SECRET_VALUES if v in proc.stderr]
