"""The capture launcher with a fake nsys: exit codes, signal forwarding, run-directory safety, errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perfdoctor.capture import launcher
from perfdoctor.capture.launcher import CaptureOptions, prepare_run_dir, run_capture
from perfdoctor.errors import InputError, UsageError


def capture_cli(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "perfdoctor", "capture", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}, **kw)


def test_training_exit_code_is_the_capture_exit_code(fake_nsys: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = capture_cli("--nsys", str(fake_nsys), "--out", str(run), "--", sys.executable, "-c",
                       "raise SystemExit(7)")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 7, err
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["exit_code"] == 7 and manifest["interrupted_by"] is None
    assert (run / "node-" f"{os.uname().nodename}.sqlite").is_file()  # exported although training failed
    assert "training exit code 7" in err


def test_sigint_reaches_the_training_process_and_the_report_is_still_exported(fake_nsys: Path,
                                                                             tmp_path: Path) -> None:
    run, marker = tmp_path / "run", tmp_path / "got-sigint"
    program = ("import sys, time\ntry:\n    print('ready', flush=True)\n    time.sleep(120)\n"
               f"except KeyboardInterrupt:\n    open({str(marker)!r}, 'w').close()\n    sys.exit(5)\n")
    proc = capture_cli("--nsys", str(fake_nsys), "--out", str(run), "--", sys.executable, "-c", program)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert marker.exists(), err
    assert proc.returncode == 5, err
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["interrupted_by"] == "SIGINT" and manifest["exit_code"] == 5
    assert any(f.endswith(".sqlite") for f in manifest["files"])


def test_a_program_killed_by_a_signal_exits_128_plus_the_signal(fake_nsys: Path, tmp_path: Path) -> None:
    result = run_capture(CaptureOptions(command=[sys.executable, "-c", "import os, signal; os.kill(os.getpid(), "
                                                 "signal.SIGTERM)"], out=tmp_path / "run", nsys=str(fake_nsys)))
    assert result.exit_code == 128 + signal.SIGTERM


def test_missing_nsys_is_one_line_with_an_install_hint(tmp_path: Path) -> None:
    proc = capture_cli("--nsys", str(tmp_path / "no-such-nsys"), "--out", str(tmp_path / "run"), "--", "true")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert err.count("\n") == 1 and "not found" in err and "install_nsys.sh" in err
    assert not (tmp_path / "run").exists()  # nothing was created for a capture that could not start


def test_nsys_missing_from_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(InputError, match="nsys .*not found on PATH"):
        launcher.find_nsys(None)


def test_a_non_empty_run_dir_is_refused_without_force(fake_nsys: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty.*--force"):
        run_capture(CaptureOptions(command=["true"], out=run, nsys=str(fake_nsys)))
    result = run_capture(CaptureOptions(command=["true"], out=run, nsys=str(fake_nsys), force=True))
    assert result.exit_code == 0 and (run / "notes.txt").read_text() == "mine"


def test_unwritable_and_nearly_full_run_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(InputError, match="cannot write there"):
        prepare_run_dir(blocker / "run", force=False)
    usage = type("Usage", (), {"free": 10 * 2**20, "total": 2**40, "used": 0})
    monkeypatch.setattr(launcher.shutil, "disk_usage", lambda _path: usage)
    with pytest.raises(InputError, match="only 10 MiB free"):
        prepare_run_dir(tmp_path / "run", force=False)


def test_bad_options_are_usage_errors() -> None:
    for steps in ("4-2", "x", "-1-3"):
        with pytest.raises(UsageError):
            launcher.parse_steps(steps)
    assert launcher.parse_steps("10-12") == (10, 12) and launcher.parse_steps("3") == (3, 3)
    assert launcher.parse_ranks("all") is None and launcher.parse_ranks("3,1") == [1, 3]
    with pytest.raises(UsageError):
        launcher.parse_ranks("a,b")


def test_no_command_is_a_usage_error(fake_nsys: Path, tmp_path: Path) -> None:
    proc = capture_cli("--nsys", str(fake_nsys), "--out", str(tmp_path / "run"))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "no command to capture" in err


def test_the_hook_environment_reaches_the_program(fake_nsys: Path, tmp_path: Path) -> None:
    """PYTHONPATH puts the hook first (keeping the user's entries) and the settings travel in PERFDOCTOR_*."""
    dump = tmp_path / "env.json"
    program = (f"import json, os; json.dump({{k: v for k, v in os.environ.items() if k.startswith(('PERFDOCTOR_', "
               f"'PYTHONPATH'))}}, open({str(dump)!r}, 'w'))")
    began = time.time()
    result = run_capture(CaptureOptions(command=[sys.executable, "-c", program], out=tmp_path / "run",
                                        nsys=str(fake_nsys), steps=(2, 4), ranks=[0, 3], memory=False))
    assert result.exit_code == 0
    env = json.loads(dump.read_text())
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(launcher.HOOK_PATH)
    assert env["PERFDOCTOR_STEPS"] == "2-4" and env["PERFDOCTOR_RANKS"] == "0,3" and env["PERFDOCTOR_MEMORY"] == "0"
    assert Path(env["PERFDOCTOR_RUN_DIR"]) == (tmp_path / "run").resolve()
    manifest = json.loads(result.manifest.read_text())
    assert manifest["capture"]["steps"] == [2, 4] and manifest["start_time"] <= manifest["end_time"]
    assert manifest["duration_s"] <= time.time() - began + 1
