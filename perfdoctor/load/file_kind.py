"""Name what a file is when it is not what perfdoctor reads, so the one-line error says what to do.

Users hand perfdoctor whatever their profiling produced: an nsys report that was never exported, a Git
LFS pointer checked out without ``git lfs pull``. "Not an SQLite file" is true for all of them and helps with
none. Only the first bytes are read, so naming a file costs the same whatever its size. (PyTorch profiler
traces are read, by perfdoctor.load.kineto.)
"""

from __future__ import annotations

from pathlib import Path

HEAD_BYTES = 64 * 1024
SQLITE_MAGIC = b"SQLite format 3\x00"
LFS_POINTER = b"version https://git-lfs.github.com/spec/"
NSYS_REPORT = b"NVIDIA Tegra Profiler Report"  # the first bytes of every .nsys-rep
PICKLE_PROTOCOL = b"\x80"
EXPORT_HINT = "export the report with `nsys export --type sqlite`"


def foreign_format(path: Path) -> str | None:
    """What ``path`` is when it is a known format perfdoctor does not read (None otherwise)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(HEAD_BYTES)
    except OSError:
        return None
    if head.startswith(LFS_POINTER):
        return "a Git LFS pointer, not the file it points to (run `git lfs pull` to fetch the file)"
    if head.startswith(NSYS_REPORT):
        return f"an Nsight Systems report, not its SQLite export ({EXPORT_HINT})"
    if path.suffix == ".qdstrm":
        return "an unfinished nsys capture (.qdstrm): nsys's QdstrmImporter turns it into a .nsys-rep"
    if head.startswith(PICKLE_PROTOCOL) and path.suffix not in (".pickle", ".pkl"):
        return "a Python pickle (a CUDA memory snapshot must be named *.pickle or *.pkl)"
    return None


def is_sqlite(path: Path) -> bool:
    """Whether ``path`` starts like an SQLite database (an unreadable file is not one)."""
    try:
        with path.open("rb") as fh:
            return fh.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


def not_sqlite_reason(path: Path) -> str:
    """The rest of the one-line error for a trace input that is not an SQLite file."""
    return foreign_format(path) or f"not an SQLite file ({EXPORT_HINT})"
