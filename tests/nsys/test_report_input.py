"""`perfdoctor analyze run.nsys-rep`: a real report (Debian nsys 2022.4) is exported into the cache
(never beside the input), reused while unchanged, and analysed like its hand-made export."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from perfdoctor.load.nsys_report import cache_dir
from tests.nsys.conftest import NvtxCapture
from tests.test_cli_bad_input import fingerprint, run_cli

pytestmark = pytest.mark.nsys


def analyze_json(capsys, *inputs: Path, out: Path) -> dict:
    code, _, err = run_cli(capsys, "analyze", *map(str, inputs), "--format", "json", "-o", str(out))
    assert code == 0, err
    return json.loads(out.read_text())


def comparable(report: dict) -> list:
    """What must not depend on who exported the report: the devices and the event counts."""
    return [report["devices"], [{k: v for k, v in i.items() if k != "path"} for i in report["inputs"]]]


def test_report_is_exported_into_the_cache_and_reused(capsys, tmp_path, nsys_cli, nvtx_capture: NvtxCapture,
                                                      export_of):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    report = Path(shutil.copy2(nvtx_capture.report, run_dir / "rank0.nsys-rep"))
    before = fingerprint(report)

    first = analyze_json(capsys, report, out=tmp_path / "a.json")
    assert sorted(p.name for p in run_dir.iterdir()) == ["rank0.nsys-rep"]  # nothing written beside it
    assert fingerprint(report) == before
    (cached,) = cache_dir().glob("rank0-*.sqlite")
    assert first["inputs"][0]["path"] == str(cached)
    assert first["inputs"][0]["nsys_version"] == nsys_cli.release
    by_hand = analyze_json(capsys, export_of(nsys_cli.release, True), out=tmp_path / "h.json")
    assert comparable(first) == comparable(by_hand)

    stamp = cached.stat().st_mtime_ns
    again = analyze_json(capsys, run_dir, out=tmp_path / "b.json")  # a run directory holding only the report
    assert comparable(again) == comparable(first)
    assert cached.stat().st_mtime_ns == stamp and len(list(cache_dir().glob("rank0-*.sqlite"))) == 1

    os.utime(report, ns=(before[1] + 10**9, before[1] + 10**9))  # the report changed: exported afresh
    analyze_json(capsys, report, out=tmp_path / "c.json")
    assert len(list(cache_dir().glob("rank0-*.sqlite"))) == 2


def test_exported_report_keeps_its_run_directory(capsys, tmp_path, nsys_cli, nvtx_capture: NvtxCapture, export_of):
    """A report exported into the cache still belongs to the capture whose manifest lies beside it."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copy2(nvtx_capture.report, run_dir / "a.nsys-rep")
    shutil.copy2(export_of(nsys_cli.release, True), run_dir / "b.sqlite")
    (run_dir / "manifest.json").write_text(json.dumps({"manifest_version": 1, "command": "python emit_nvtx.py"}))
    report = analyze_json(capsys, run_dir, out=tmp_path / "r.json")
    assert len(report["inputs"]) == 2
