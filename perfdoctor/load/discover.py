"""Turn the paths a user typed into the trace files (and memory snapshots) to load."""

from __future__ import annotations

from pathlib import Path

from perfdoctor.errors import InputError

TRACE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
KINETO_SUFFIXES = (".json", ".json.gz")  # PyTorch profiler traces (perfdoctor.load.kineto)
SNAPSHOT_SUFFIXES = (".pickle", ".pkl")  # PyTorch CUDA memory snapshots (perfdoctor.load.memsnap)


def discover(paths: list[Path]) -> list[Path]:
    """Files are taken as given; a directory (a run dir) contributes every SQLite export below it."""
    found: list[Path] = []
    for path in paths:
        if not path.exists():
            raise InputError(f"{path}: no such file or directory")
        if path.is_file():
            if path.suffix not in SNAPSHOT_SUFFIXES:  # snapshots come from discover_snapshots
                found.append(path)
            continue
        exports = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TRACE_SUFFIXES)
        exports += sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(KINETO_SUFFIXES)
                          and _is_kineto(p))
        if not exports:
            reps = sorted(path.rglob("*.nsys-rep"))
            hint = (f" (found {len(reps)} .nsys-rep report(s): export them with `nsys export --type sqlite`)"
                    if reps else "")
            raise InputError(f"{path}: directory holds no nsys SQLite exports or PyTorch profiler traces{hint}")
        found.extend(exports)
    if not found and paths:
        raise InputError(f"{paths[0]}: only memory snapshots given; analyse them with `perfdoctor memory`, "
                         "or add the traces they belong to")
    kinds = {"PyTorch profiler (Kineto)" if p.name.endswith(KINETO_SUFFIXES) else "nsys" for p in found}
    if len(kinds) > 1:
        raise InputError(f"{paths[0]}: mixes nsys exports and PyTorch profiler traces; their clocks and labels "
                         "cannot be combined into one run: analyse one kind at a time")
    return found


def _is_kineto(path: Path) -> bool:
    """JSON files in a run directory count when they are Kineto traces (not manifests or reports)."""
    from perfdoctor.load.kineto import is_kineto

    return is_kineto(path)


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
