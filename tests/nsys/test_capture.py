"""The capture helper's promises, against real nsys: exit codes pass through, nothing ever hangs."""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.nsys.capture import CaptureError, NsysCli, profile

pytestmark = pytest.mark.nsys


def test_program_exit_code_passes_through(nsys_cli: NsysCli, tmp_path: Path) -> None:
    cap = profile([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "exit3.nsys-rep", nsys=nsys_cli.path)
    assert cap.returncode == 3
    assert cap.report.is_file() and cap.report.stat().st_size > 0


def test_a_hung_capture_is_killed_with_its_agent(nsys_cli: NsysCli, tmp_path: Path) -> None:
    """The program outlives the timeout: the program, launcher and agent must all be gone after.

    The program is ``sleep`` under a unique name; nsys names its agent's session after the
    program's file name, so that name finds every process this capture started.
    """
    name = f"pd-hang-{uuid.uuid4().hex[:12]}"
    sleeper = tmp_path / name
    sleeper.symlink_to("/bin/sleep")
    began = time.monotonic()
    with pytest.raises(CaptureError, match="killed"):
        profile([str(sleeper), "600"], tmp_path / "hang.nsys-rep", nsys=nsys_cli.path, timeout_s=3)
    assert time.monotonic() - began < 30
    assert _processes_mentioning(name) == []


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline:
                found.append(f"{entry.name}: {cmdline}")
    return found
