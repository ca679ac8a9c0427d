"""Checks before a capture launches anything: the command exists (else 127 at once), its Python can emit the
labels, and nsys can write reports (else one line and exit 2, with nothing started)."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from perfdoctor.capture import preflight
from perfdoctor.capture.command import parse_launch
from perfdoctor.capture.hook import nvtx_emit
from perfdoctor.capture.nsys_cli import NsysCli, find_nsys
from perfdoctor.errors import InputError
from tests.capture.test_capture_signals_phases import capture


def test_a_missing_command_exits_127_at_once(fake_nsys: Path, tmp_path: Path) -> None:
    began = time.monotonic()
    proc = capture(fake_nsys, tmp_path / "run", "no-such-training-command", "--lr", "1")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 127, err
    assert err.count("\n") == 1 and "no-such-training-command: command not found" in err
    assert time.monotonic() - began < 20 and not (tmp_path / "run").exists()


def test_a_training_python_without_nvtx_is_refused_before_anything_runs(fake_nsys: Path, tmp_path: Path) -> None:
    blocked = tmp_path / "blocked"
    (blocked / "nvtx").mkdir(parents=True)
    (blocked / "nvtx" / "__init__.py").write_text("raise ImportError('nvtx blocked by the test')\n")
    for library in nvtx_emit._c_libraries():
        try:
            __import__("ctypes").CDLL(library)
        except OSError:
            continue
        pytest.skip(f"this machine has the NVTX C library {library}: the hook would use it")
    marker = tmp_path / "ran"
    proc = capture(fake_nsys, tmp_path / "run", sys.executable, "-c", f"open({str(marker)!r}, 'w')",
                   env={"PYTHONPATH": str(blocked)})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert err.count("\n") == 1 and "cannot emit NVTX labels" in err and "perfdoctor[capture]" in err
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_an_nsys_that_cannot_write_reports_is_refused(tmp_path: Path) -> None:
    """NVIDIA's layout: target-linux-x64/nsys needs host-linux-x64/QdstrmImporter (Debian lacks the link)."""
    cli = tmp_path / "nsight" / "target-linux-x64" / "nsys"
    cli.parent.mkdir(parents=True)
    cli.write_text("")
    with pytest.raises(InputError, match="write no report .*QdstrmImporter.*install_nsys.sh"):
        preflight.check_nsys(NsysCli(str(cli), "2022.4.2.1"))
    importer = tmp_path / "nsight" / "host-linux-x64" / "QdstrmImporter"
    importer.parent.mkdir()
    importer.write_text("")
    preflight.check_nsys(NsysCli(str(cli), "2022.4.2.1"))
    if shutil.which("nsys"):
        preflight.check_nsys(find_nsys())  # the installed one passes


def test_the_training_python_is_found_from_the_launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHON_EXEC", raising=False)
    script = tmp_path / "train"
    script.write_text("#!/usr/bin/env python3\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    python3 = shutil.which("python3")
    assert preflight.training_python(parse_launch(["python3", "train.py"])) == python3
    assert preflight.training_python(parse_launch(["srun", "-N", "2", "python3", "train.py"])) == python3
    assert preflight.training_python(parse_launch(["train", "--lr", "1"])) == python3  # its #! line
    assert preflight.training_python(parse_launch(["/bin/sh", "run.sh"])) is None
    monkeypatch.setenv("PYTHON_EXEC", "/opt/env/bin/python")
    torchrun = parse_launch(["torchrun", "--nproc_per_node", "8", "t.py"])
    assert preflight.training_python(torchrun) == "/opt/env/bin/python"
