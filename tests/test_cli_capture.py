"""`perfdoctor capture` on the command line: options it does not know belong to the training command, and
`--analyze` runs analyze, with analyze's own defaults, on the run directory. (The capture itself is
replaced: tests/capture and tests/e2e run it for real.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from perfdoctor.capture import launcher
from perfdoctor.capture.launcher import CaptureOptions, CaptureResult
from tests.paths import REAL_H100
from tests.test_cli_bad_input import run_cli


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[CaptureOptions]:
    """Each capture's options; the "training" leaves one export in the run directory and exits 3."""
    seen: list[CaptureOptions] = []

    def run_capture(options: CaptureOptions, say) -> CaptureResult:
        seen.append(options)
        export = shutil.copy(REAL_H100, tmp_path / "rank0.sqlite")
        return CaptureResult(run_dir=tmp_path, exit_code=3, reports=[], exports=[Path(export)],
                             manifest=tmp_path / "manifest.json", notes=[], training_exit_code=3, interrupted_by=None)

    monkeypatch.setattr(launcher, "run_capture", run_capture)
    return seen


def test_unknown_options_go_to_the_training_command(capsys, captured):
    code, _, err = run_cli(capsys, "capture", "--steps", "2-3", "--per-node", "--nsys-arg=--x=1", "torchrun",
                           "--nproc_per_node", "2", "train.py", "--", "--lr", "1", "-o", "x")
    assert code == 3, err  # the training command's exit code
    options = captured[0]
    assert options.command == ["torchrun", "--nproc_per_node", "2", "train.py", "--lr", "1", "-o", "x"]
    assert (options.steps, options.per_rank, options.nsys_args, options.out) == ((2, 3), False, ["--x=1"], None)
    assert (options.memory, options.memory_max_entries, options.keep_reports) == (True, 100_000, False)
    assert options.profiler == "auto"


def test_profiler_option(capsys, captured):
    code, _, err = run_cli(capsys, "capture", "--profiler", "torch", "--", "python", "train.py")
    assert code == 3, err
    assert captured[0].profiler == "torch"
    code, _, err = run_cli(capsys, "capture", "--profiler", "perf", "--", "python", "train.py")
    assert code == 2 and "perf" in err and len(captured) == 1


def test_analyze_flag_analyses_the_run_directory(capsys, captured, tmp_path):
    code, out, err = run_cli(capsys, "capture", "--analyze", "--", "python", "train.py")
    assert code == 3, err
    assert f"trace {tmp_path / 'rank0.sqlite'}" in out.replace("\n", "")  # analyze's terminal report
    assert "findings" in out and "Traceback" not in err
