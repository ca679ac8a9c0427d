"""Real nsys: signals during training reach the program through nsys, and what was captured is still exported.

The cases that failed with nsys 2022.4 itself (a second Ctrl-C or a SIGHUP made nsys quit without a
report; torchrun + Ctrl-C exited 0). The phase-by-phase state machine is tested with the fake nsys in
tests/capture/test_capture_signals_phases.py; these few stay short for CI.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.nsys
WAITING = ("import sys, time\ntry:\n    print('ready', flush=True)\n    time.sleep(120)\n"
           "except KeyboardInterrupt:\n    open({marker!r}, 'w').close()\n    time.sleep(1)\n    sys.exit(5)\n")


def interrupt(run: Path, command: list[str], signals: tuple[signal.Signals, ...]) -> tuple[int, str]:
    if shutil.which("nsys") is None:
        pytest.skip("no nsys on PATH (scripts/install_nsys.sh installs nsys 2022.4 on Debian 12)")
    proc = subprocess.Popen([sys.executable, "-m", "perfdoctor", "capture", "--out", str(run), "--keep-reports", "yes",
                             "--", *command],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    for line in proc.stdout:  # nsys prints its own lines too
        if line.strip() == "ready":
            break
    for sig in signals:
        proc.send_signal(sig)
        time.sleep(0.3)
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err


@pytest.mark.parametrize("signals", [(signal.SIGINT,), (signal.SIGINT, signal.SIGINT), (signal.SIGHUP,)],
                         ids=["ctrl-c", "ctrl-c-twice", "sighup"])
def test_signals_under_real_nsys_keep_the_report(tmp_path: Path, signals: tuple[signal.Signals, ...]) -> None:
    run, marker = tmp_path / "run", tmp_path / "got-sigint"
    rc, err = interrupt(run, [sys.executable, "-c", WAITING.format(marker=str(marker))], signals)
    assert list(run.glob("node-*.nsys-rep")), err
    manifest = json.loads((run / "manifest.json").read_text())
    if signals == (signal.SIGINT,):
        assert marker.exists(), err
        assert rc == 5 == manifest["exit_code"], err  # one Ctrl-C reaches the program once: its clean-up ran
    elif signals[0] == signal.SIGINT:
        assert marker.exists(), err
        assert rc == 130 == manifest["exit_code"], err  # the second one ended its clean-up
    else:
        assert rc == 128 + signal.SIGHUP, err  # the program's default SIGHUP action ended it
    (export,) = run.glob("node-*.sqlite")
    assert export.stat().st_size > 0
    assert manifest["interrupted"] and manifest["interrupted_by"] == signals[0].name


def test_torchrun_ctrl_c_is_not_success(tmp_path: Path) -> None:
    if shutil.which("torchrun") is None:
        pytest.skip("no torch (`pip install torch==2.13.0` installs the CPU build here; .ci/run does)")
    run, script = tmp_path / "run", tmp_path / "wait.py"
    script.write_text(WAITING.format(marker=str(tmp_path / "got-sigint")))
    rc, err = interrupt(run, ["torchrun", "--nproc_per_node", "1", str(script)], (signal.SIGINT,))
    manifest = json.loads((run / "manifest.json").read_text())
    assert rc != 0 and rc == manifest["capture_exit_code"], err
    assert manifest["interrupted_by"] == "SIGINT"
    assert list(run.glob("node-*.sqlite")), err
