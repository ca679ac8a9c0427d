"""The first slices of an export's kernel table, read while `perfdoctor analyze` is still importing the
analysis.

Before its first read the command imports numpy and the pipeline: about 0.1 s of one core, while the other
core has nothing to do. The SQLite reads need none of it (connectorx, a compiled module, and the numpy-free
:mod:`perfdoctor.load.sqlite_file`), so :func:`start` begins the reads the loader will ask for first (the
kernel table's first slices, by the same columns: :func:`perfdoctor.load.nsys_columns.routed_tables`) on
threads of their own, and the loader takes each one (:func:`take`) instead of reading it again. A read is
matched by the file and its SQL text, so one the loader does not ask for is never used: it is handed back
(:func:`rest`) and its memory released. Anything wrong with the file is left to the loader to say: a file
that does not open here is simply not read ahead.

Measured on a 1M-kernel export (the whole installed CLI, farm-bench, 15 alternating pairs, 2 cores): 0.95x
the wall time (medians 0.803 s against 0.843 s), the reads starting at 0.05 s instead of 0.2 s; with numpy
imported first they would start at 0.1 s and win half as much. The 10M-kernel export: the same within noise.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from perfdoctor.errors import InputError
from perfdoctor.load.nsys_columns import routed_tables, selected
from perfdoctor.load.sqlite_file import SqliteFile, connectorx_read_sql, read_only_uri

if TYPE_CHECKING:
    from concurrent.futures import Future

# The reads started and not yet taken: (file's URI, SQL) → its result (column names, Arrow batches).
_reads: dict[tuple[str, str], Future] = {}
_lock = threading.Lock()


def start(path: Path, slices: int) -> int:
    """Start reading the first ``slices`` slices of ``path``'s kernel table that `perfdoctor analyze`'s loader
    (``detail=False``) will ask for, each on a thread of its own; how many were started (0 for a file that
    is not an nsys export read slice by slice)."""
    try:
        db = SqliteFile(path)
    except InputError:
        return 0
    try:
        table, wanted, _ = routed_tables(detail=False)["kernels"]
        queries = db.slice_queries(table, selected(db, table, wanted)) or []
    except InputError:
        return 0
    finally:
        db.close()
    if not queries or slices < 1:
        return 0
    from concurrent.futures import Future

    connectorx_read_sql()  # loaded once, here, not by two threads at the same time
    uri = read_only_uri(path)
    for sql in queries[:slices]:
        future: Future = Future()
        with _lock:
            _reads[(uri, sql)] = future
        # Not a daemon: a thread inside connectorx when the interpreter ends would be stopped in Rust code;
        # the command waits for at most these few slices instead.
        threading.Thread(target=_read, args=(db, sql, future), name="perfdoctor-read-ahead").start()
    return min(len(queries), slices)


def _read(db: SqliteFile, sql: str, future: Future) -> None:
    try:
        future.set_result(db.arrow(sql))
    except BaseException as exc:  # the loader raises it where it asks for this slice
        future.set_exception(exc)


def take(path: Path, sql: str) -> Future | None:
    """The read of ``sql`` on ``path`` started ahead, now the loader's (None when there is none)."""
    if not _reads:
        return None
    with _lock:
        return _reads.pop((read_only_uri(path), sql), None)


def rest(path: Path) -> list[Future]:
    """The reads of ``path`` started ahead that nobody took, now the caller's to release."""
    if not _reads:
        return []
    uri = read_only_uri(path)
    with _lock:
        keys = [key for key in _reads if key[0] == uri]
        return [_reads.pop(key) for key in keys]
