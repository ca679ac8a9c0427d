"""Real nsys: Ctrl-C reaches the training program through nsys, and what was captured is still exported."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.nsys


def test_sigint_under_real_nsys(tmp_path: Path) -> None:
    if shutil.which("nsys") is None:
        pytest.skip("no nsys on PATH (scripts/install_nsys.sh installs nsys 2022.4 on Debian 12)")
    run, marker = tmp_path / "run", tmp_path / "got-sigint"
    program = ("import sys, time\ntry:\n    print('ready', flush=True)\n    time.sleep(120)\n"
               f"except KeyboardInterrupt:\n    open({str(marker)!r}, 'w').close()\n    sys.exit(5)\n")
    proc = subprocess.Popen([sys.executable, "-m", "perfdoctor", "capture", "--out", str(run), "--", sys.executable,
                             "-c", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    for line in proc.stdout:  # nsys prints its own lines too
        if line.strip() == "ready":
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert marker.exists(), err
    assert proc.returncode == 5, err
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["interrupted_by"] == "SIGINT"
    (export,) = run.glob("node-*.sqlite")
    assert export.stat().st_size > 0
