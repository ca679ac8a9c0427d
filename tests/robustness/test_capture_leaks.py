"""Capture, round 2 (issue 24): nothing leaked by default, nothing lost without the manifest saying so.

- **Secrets in the report.** An ``.nsys-rep`` holds the profiled run's environment and command line and
  cannot be edited, so by default (``--keep-reports no``) each report is deleted once its scrubbed
  export is written: a grep for the canary values of the environment (tokens, passwords, URL
  credentials) and of the command line over every file of the run directory finds nothing. Reports
  that stay (``--keep-reports yes``, or an export that did not finish) are owner-only (mode 600), and
  capture says what they hold.
- **A signal during the export.** The report is kept, and ``manifest.json`` lists it under
  ``not_exported`` with what is lost (the export only) and the command that exports it by hand.
- **A command that exists but cannot be run** exits 126 at once, as a shell does (was 127).

The fake nsys (tests/capture/fake_nsys.py) writes a report holding the environment and the command line
and exports them as real 2022.4 / 2023.4 exports do; real nsys: tests/e2e/test_capture_e2e.py.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.paths import REPO

FAKE_NSYS = REPO / "tests" / "capture" / "fake_nsys.py"
CANARY_ENV = {"MY_API_TOKEN": "canary-tok-0123456", "AWS_SECRET_ACCESS_KEY": "canary-aws-6543210",
              "NCCL_IB_PASSWD": "canary-ib-4242", "DATABASE_URL": "postgres://bob:canary-url-55@db.example/x"}
CANARY_ARGV = ["--api-key", "canary-cli-key", "--password=canary-cli-pw", "https://ann:canary-cli-url@example.com/x"]
CANARIES = ["canary-tok-0123456", "canary-aws-6543210", "canary-ib-4242", "canary-url-55", "canary-cli-key",
            "canary-cli-pw", "canary-cli-url"]


@pytest.fixture
def nsys(tmp_path: Path) -> Path:
    exe = tmp_path / "bin" / "nsys"
    exe.parent.mkdir()
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_NSYS} \"$@\"\n")
    exe.chmod(0o755)
    return exe


def capture(nsys: Path, run: Path, *command: str, options: tuple[str, ...] = (),
            env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "perfdoctor", "capture", "--nsys", str(nsys), "--out", str(run),
                             *options, "--", *command], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def leaks(run: Path) -> dict[str, list[str]]:
    """Canary values found in any file of ``run`` (hidden files included), by file."""
    found = {}
    for path in run.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            hits = [c for c in CANARIES if c.encode() in data]
            if hits:
                found[str(path.relative_to(run))] = hits
    return found


PROGRAM = [sys.executable, "-c", "import sys; print(sys.argv)", *CANARY_ARGV]


def test_default_capture_leaves_no_secret_in_any_file(nsys, tmp_path):
    run = tmp_path / "run"
    proc = capture(nsys, run, *PROGRAM, env=CANARY_ENV)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert {p.suffix for p in run.iterdir()} >= {".sqlite", ".json"}
    assert not list(run.glob("*.nsys-rep"))
    assert leaks(run) == {}
    assert not [c for c in CANARIES if c in err]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["capture"]["keep_reports"] is False and manifest["not_exported"] == []


def test_kept_reports_are_owner_only_and_announced(nsys, tmp_path):
    """*control* for the grep: with --keep-reports yes the report holds the canaries (the fake writes them
    as nsys does), and it is readable by its owner only."""
    run = tmp_path / "run"
    proc = capture(nsys, run, *PROGRAM, options=("--keep-reports", "yes"), env=CANARY_ENV)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    (report,) = run.glob("*.nsys-rep")
    assert set(leaks(run)) == {report.name}
    assert stat.S_IMODE(report.stat().st_mode) == 0o600
    assert "owner only" in err and "unredacted" in err


def test_sigterm_during_export_says_what_was_lost_and_how_to_export(nsys, tmp_path):
    run, pid_file = tmp_path / "run", tmp_path / "export.pid"
    proc = capture(nsys, run, *PROGRAM, env={**CANARY_ENV, "FAKE_NSYS_EXPORT_S": "60",
                                             "FAKE_NSYS_PID_FILE": str(pid_file)})
    end = time.monotonic() + 60
    while not pid_file.exists():
        assert time.monotonic() < end and proc.poll() is None, proc.communicate()[1]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    manifest = json.loads((run / "manifest.json").read_text())
    (report,) = run.glob("*.nsys-rep")
    (entry,) = manifest["not_exported"]
    assert entry["report"] == report.name and "SIGTERM" in entry["why"]
    assert entry["export_by_hand"] == f"nsys export --type sqlite --output {report.stem}.sqlite {report.name}"
    assert "holds everything captured" in entry["lost"]
    assert stat.S_IMODE(report.stat().st_mode) == 0o600
    assert set(leaks(run)) == {report.name}  # the kept report only: the manifest and the rest are scrubbed


@pytest.mark.parametrize("kind", ["not executable", "a directory"])
def test_a_command_that_cannot_be_run_exits_126(nsys, tmp_path, kind):
    command = tmp_path / "train.sh"
    if kind == "a directory":
        command.mkdir()
    else:
        command.write_text("#!/bin/sh\necho hi\n")
        command.chmod(0o644)
    proc = capture(nsys, tmp_path / "run", str(command))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 126, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"perfdoctor: {command}: permission denied"), err
    assert not (tmp_path / "run").exists()  # nothing started, nothing written
