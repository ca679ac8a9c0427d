"""Capture's signal state machine, phase by phase, with the fake nsys (fast and deterministic).

Every phase (before launch, training, export) and the repeated-signal and SIGHUP cases: the exit code is
the training command's (128 + signal when the capture was interrupted and the command reported success
or never ran), what was captured is exported or said to be lost, no ``nsys export`` outlives
perfdoctor, and manifest.json always says ``interrupted`` and which signal. Real nsys: tests/e2e/.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

READY_PROGRAM = ("import signal, sys, time\n{setup}\ntry:\n    print('ready', flush=True)\n    time.sleep(60)\n"
                 "except KeyboardInterrupt:\n    time.sleep({cleanup})\n    sys.exit({on_interrupt})\n")


def capture(fake_nsys: Path, run: Path, *command: str, options: tuple[str, ...] = (),
            env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "perfdoctor", "capture", "--nsys", str(fake_nsys), "--out",
                             str(run), *options, "--", *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def program(on_interrupt: int = 0, cleanup: float = 0.0, setup: str = "") -> list[str]:
    return [sys.executable, "-c", READY_PROGRAM.format(on_interrupt=on_interrupt, cleanup=cleanup, setup=setup)]


def wait_for(path: Path, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def manifest_of(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_before_launch_starts_nothing(fake_nsys: Path, tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM at start-up used to exit 0 although training never ran."""
    run, pid_file, marker = tmp_path / "run", tmp_path / "nsys.pid", tmp_path / "ran"
    proc = capture(fake_nsys, run, sys.executable, "-c", f"open({str(marker)!r}, 'w')",
                   env={"FAKE_NSYS_VERSION_S": "1.5", "FAKE_NSYS_PID_FILE": str(pid_file)})
    wait_for(pid_file)  # perfdoctor is asking nsys for its version
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    assert not marker.exists()
    manifest = manifest_of(run)
    assert manifest["interrupted"] and manifest["interrupted_by"] == sig.name
    assert manifest["interrupted_during"] == "start" and manifest["exit_code"] is None
    assert manifest["capture_exit_code"] == 128 + sig
    assert any("not started" in note for note in manifest["notes"])
    assert "Traceback" not in err


def test_ctrl_c_when_the_command_then_exits_0_is_130(fake_nsys: Path, tmp_path: Path) -> None:
    """torchrun + Ctrl-C used to exit 0: an interrupted capture never reports success."""
    run = tmp_path / "run"
    proc = capture(fake_nsys, run, *program(on_interrupt=0))
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    manifest = manifest_of(run)
    assert manifest["exit_code"] == 0 and manifest["capture_exit_code"] == 130
    assert manifest["interrupted"] and manifest["interrupted_during"] == "training"
    assert any(f.endswith(".sqlite") for f in manifest["files"])
    assert "interrupted by SIGINT" in err


def test_sighup_during_training_still_exports(fake_nsys: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = capture(fake_nsys, run, *program())
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGHUP, err  # the program died of SIGHUP
    manifest = manifest_of(run)
    assert manifest["interrupted_by"] == "SIGHUP" and manifest["exit_code"] == 128 + signal.SIGHUP
    assert any(f.endswith(".sqlite") for f in manifest["files"])


def test_two_ctrl_c_03_s_apart_keep_the_report(fake_nsys: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = capture(fake_nsys, run, *program(on_interrupt=5, cleanup=1.0))
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)  # arrives during the program's clean-up
    _, err = proc.communicate(timeout=120)
    assert list(run.glob("*.sqlite")), err
    manifest = manifest_of(run)
    assert manifest["signals_received"] == 2 and manifest["interrupted_by"] == "SIGINT"
    assert proc.returncode == manifest["exit_code"] != 0, err
    assert "SIGINT again: passed on" in err


def test_a_third_signal_kills_the_run_and_says_what_is_lost(fake_nsys: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = capture(fake_nsys, run, *program(setup="signal.signal(signal.SIGINT, signal.SIG_IGN)"))
    assert proc.stdout.readline().strip() == "ready"
    for _ in range(3):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.2)
    _, err = proc.communicate(timeout=120)
    manifest = manifest_of(run)
    assert proc.returncode == 128 + signal.SIGKILL == manifest["exit_code"], err  # nsys itself was killed
    assert manifest["interrupted"] and manifest["signals_received"] == 3
    assert any("what it captured is lost" in note for note in manifest["notes"])


def test_ctrl_c_during_export_lets_the_export_finish(fake_nsys: Path, tmp_path: Path) -> None:
    run, pid_file = tmp_path / "run", tmp_path / "export.pid"
    proc = capture(fake_nsys, run, "true", env={"FAKE_NSYS_EXPORT_S": "1.5", "FAKE_NSYS_PID_FILE": str(pid_file)})
    wait_for(pid_file)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    manifest = manifest_of(run)
    assert manifest["exit_code"] == 0 and manifest["interrupted_during"] == "export"
    assert any(f.endswith(".sqlite") for f in manifest["files"])


@pytest.mark.parametrize("signals", [(signal.SIGTERM,), (signal.SIGINT, signal.SIGINT)])
def test_sigterm_or_a_second_ctrl_c_stops_the_export_without_orphans(fake_nsys: Path, tmp_path: Path,
                                                                      signals: tuple[signal.Signals, ...]) -> None:
    run, pid_file = tmp_path / "run", tmp_path / "export.pid"
    proc = capture(fake_nsys, run, "true", env={"FAKE_NSYS_EXPORT_S": "60", "FAKE_NSYS_PID_FILE": str(pid_file)})
    wait_for(pid_file)
    began = time.monotonic()
    for sig in signals:
        proc.send_signal(sig)
        time.sleep(0.3)
    _, err = proc.communicate(timeout=120)
    assert time.monotonic() - began < 30, err
    assert proc.returncode == 128 + signals[0], err
    assert not alive(int(pid_file.read_text()))  # the nsys export was killed and waited for
    manifest = manifest_of(run)
    assert manifest["interrupted_during"] == "export" and manifest["exit_code"] == 0
    assert not list(run.glob("*.sqlite")) and not list(run.glob(".*sqlite*"))
    assert [f for f in manifest["files"] if f.endswith(".nsys-rep")]  # the report is kept...
    assert any("export it by hand" in note for note in manifest["notes"])  # ...and the manifest says so
