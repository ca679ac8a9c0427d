"""Turn the paths a user typed into the list of trace files to load."""

from __future__ import annotations

from pathlib import Path

from perfdoctor.errors import InputError

TRACE_SUFFIXES = (".sqlite", ".sqlite3", ".db")


def discover(paths: list[Path]) -> list[Path]:
    """Files are taken as given; a directory (a run dir) contributes every SQLite export below it."""
    found: list[Path] = []
    for path in paths:
        if not path.exists():
            raise InputError(f"{path}: no such file or directory")
        if path.is_file():
            found.append(path)
            continue
        exports = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TRACE_SUFFIXES)
        if not exports:
            reps = sorted(path.rglob("*.nsys-rep"))
            hint = (f" (found {len(reps)} .nsys-rep report(s): export them with `nsys export --type sqlite`)"
                    if reps else "")
            raise InputError(f"{path}: directory holds no nsys SQLite exports{hint}")
        found.extend(exports)
    return found
