"""Fixtures for the real-nsys tests: the CLI, one capture of programs/emit_nvtx.py, its exports.

The capture is made once per session with the system nsys (2022.4 from scripts/install_nsys.sh) and
exported by every release we can find: the system CLI itself, plus the 2023.4 and 2024.2 trees that
scripts/install_nsys_extra.sh unpacks under $PERFDOCTOR_NSYS_EXTRA (default /opt/nsys-extra).
Newer exporters read older reports, so one capture tests three SQLite schemas, each both as a
default (lazy) export and as a full one (``--lazy=false``: every table, most of them empty).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from perfdoctor.load.nsys import load_export
from perfdoctor.model import Timeline, TraceInfo
from tests.nsys.capture import NsysCli, export_sqlite, find_nsys, profile

PROGRAMS = Path(__file__).resolve().parent / "programs"
RELEASES = ("2022.4", "2023.4", "2024.2")
EXTRA_DIR = Path(os.environ.get("PERFDOCTOR_NSYS_EXTRA", "/opt/nsys-extra"))
# An environment variable given to the profiled program: exporters from 2023.4 on write the
# program's environment into META_DATA_CAPTURE, and the loader must read it back.
ENV_MARKER = ("PERFDOCTOR_TEST_MARKER", "emit-nvtx")


@dataclass(frozen=True)
class NvtxCapture:
    """The report of one run of emit_nvtx.py and what that run says it emitted."""

    report: Path
    manifest: dict[str, Any]
    program: str  # the interpreter that ran it
    wall_ns: tuple[int, int]  # UTC ns just before nsys started and just after it returned


@dataclass(frozen=True)
class LoadedExport:
    """One exporter's SQLite file of the capture, as the loader reads it."""

    release: str
    path: Path
    capture: NvtxCapture
    info: TraceInfo
    timelines: list[Timeline]


@pytest.fixture(scope="session")
def nsys_cli() -> NsysCli:
    cli = find_nsys()
    if cli is None:
        pytest.skip("no working nsys CLI on PATH (scripts/install_nsys.sh installs nsys 2022.4 on Debian 12)")
    return cli


@pytest.fixture(scope="session")
def nvtx_capture(nsys_cli: NsysCli, tmp_path_factory: pytest.TempPathFactory) -> NvtxCapture:
    _require_nvtx_that_records(nsys_cli)
    folder = tmp_path_factory.mktemp("nvtx_capture")
    manifest = folder / "manifest.json"
    before = time.time_ns()
    cap = profile(
        [sys.executable, str(PROGRAMS / "emit_nvtx.py"), str(manifest)],
        folder / "emit_nvtx.nsys-rep",
        nsys=nsys_cli.path,
        env={**os.environ, ENV_MARKER[0]: ENV_MARKER[1]},
    )
    after = time.time_ns()
    assert cap.returncode == 0, cap.log
    return NvtxCapture(cap.report, json.loads(manifest.read_text()), sys.executable, (before, after))


@pytest.fixture(scope="session")
def export_of(nsys_cli: NsysCli, nvtx_capture: NvtxCapture) -> Callable[[str, bool], Path]:
    """``export_of(release, lazy)``: the capture exported by that release's CLI (made once, then reused)."""
    exports: dict[tuple[str, bool], Path] = {}

    def export(release: str, lazy: bool) -> Path:
        if (release, lazy) not in exports:
            cli = nsys_cli if nsys_cli.release == release else find_nsys(str(EXTRA_DIR / release / "nsys"))
            if cli is None or cli.release != release:
                pytest.skip(f"no nsys {release} exporter (scripts/install_nsys_extra.sh puts one in {EXTRA_DIR})")
            report = nvtx_capture.report
            output = report.parent / f"{report.stem}.{release}.{'lazy' if lazy else 'full'}.sqlite"
            exports[release, lazy] = export_sqlite(report, output, nsys=cli.path, lazy=lazy)
        return exports[release, lazy]

    return export


@pytest.fixture(
    scope="session",
    params=[(release, lazy) for release in RELEASES for lazy in (True, False)],
    ids=lambda p: f"{p[0]}-{'lazy' if p[1] else 'full'}",
)
def loaded(
    request: pytest.FixtureRequest, nvtx_capture: NvtxCapture, export_of: Callable[[str, bool], Path]
) -> LoadedExport:
    """The capture as the loader reads it, from each release's default (lazy) and full export."""
    release, lazy = request.param
    path = export_of(release, lazy)
    info, timelines = load_export(path)
    return LoadedExport(release, path, nvtx_capture, info, timelines)


def _require_nvtx_that_records(cli: NsysCli) -> None:
    """nvtx >= 0.2.12 records nothing under nsys 2022.4 (research/nsys_local.md §1): say so, not 0 rows."""
    try:
        version = importlib.metadata.version("nvtx")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the nvtx package is not installed (pip install '.[dev]' brings nvtx==0.2.11)")
    parts = tuple(int(p) for p in version.split(".")[:3] if p.isdigit())
    if parts >= (0, 2, 12) and cli.release == "2022.4":
        pytest.skip(f"nvtx {version} records no ranges under nsys 2022.4; install nvtx==0.2.11")
