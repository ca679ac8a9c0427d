"""Turn the paths a user typed into the trace files (and memory snapshots) to load."""

from __future__ import annotations

from pathlib import Path

from perfdoctor.errors import InputError
from perfdoctor.load.file_kind import is_sqlite
from perfdoctor.load.nsys_report import REPORT_SUFFIX, export_report

TRACE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
KINETO_SUFFIXES = (".json", ".json.gz")  # PyTorch profiler traces (perfdoctor.load.kineto)
SNAPSHOT_SUFFIXES = (".pickle", ".pkl")  # PyTorch CUDA memory snapshots (perfdoctor.load.memsnap)


def discover(paths: list[Path]) -> list[Path]:
    """Files are taken as given; a directory (a run dir) contributes every SQLite export below it and
    every ``.nsys-rep`` report that has no export of the same name beside it. Reports are exported
    with the ``nsys`` on PATH into a cache (perfdoctor.load.nsys_report), never beside the input."""
    found: list[Path] = []
    for path in paths:
        if not path.exists():
            raise InputError(f"{path}: no such file or directory")
        if path.is_file():
            if path.suffix == REPORT_SUFFIX:
                found.append(export_report(path))
            elif path.suffix not in SNAPSHOT_SUFFIXES:  # snapshots come from discover_snapshots
                found.append(path)
            continue
        exports = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TRACE_SUFFIXES)
        exported = {p.with_suffix("") for p in exports}
        reports = sorted(p for p in path.rglob(f"*{REPORT_SUFFIX}")
                         if p.is_file() and p.with_suffix("") not in exported)
        exports += sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(KINETO_SUFFIXES)
                          and is_kineto(p))
        if not exports and not reports:
            raise InputError(f"{path}: directory holds no nsys SQLite exports, .nsys-rep reports or PyTorch "
                             "profiler traces")
        found.extend(exports)
        found.extend(export_report(p) for p in reports)
    if not found and paths:
        raise InputError(f"{paths[0]}: only memory snapshots given; analyse them with `perfdoctor memory`, "
                         "or add the traces they belong to")
    kinds = {reads_as_kineto(p) for p in found}
    if len(kinds) > 1:
        raise InputError(f"{paths[0]}: mixes nsys exports and PyTorch profiler traces; their clocks and labels "
                         "cannot be combined into one run: analyse one kind at a time")
    return found


def reads_as_kineto(path: Path) -> bool:
    """Whether the Kineto loader reads ``path``: a ``.json``/``.json.gz`` name (its errors then speak of
    JSON), or Kineto content under any other name."""
    return path.name.endswith(KINETO_SUFFIXES) or is_kineto(path)


def is_kineto(path: Path) -> bool:
    """A PyTorch profiler trace, judged by content: JSON files in a run directory count only when they
    are (not manifests or saved reports), and a given file is read as one whatever its name."""
    if is_sqlite(path):  # an export: no need to load the JSON reader to say no
        return False
    from perfdoctor.load.kineto import is_kineto as sniffed

    return sniffed(path)


def discover_snapshots(paths: list[Path]) -> list[Path]:
    """Memory snapshots among the inputs: ``*.pickle`` files given directly, and every one below a
    run directory (the capture hook writes ``RUN_DIR/memory/rank<R>.pickle``)."""
    found: list[Path] = []
    for path in paths:
        if path.is_file() and path.suffix in SNAPSHOT_SUFFIXES:
            found.append(path)
        elif path.is_dir():
            found.extend(sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SNAPSHOT_SUFFIXES))
    return found
