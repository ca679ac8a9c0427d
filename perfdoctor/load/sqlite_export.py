"""Read-only, column-wise access to an SQLite file.

Two connections serve two purposes:

* a Python ``sqlite3`` connection opened with ``mode=ro`` checks the file, lists tables and columns,
  and reads the small metadata tables;
* connectorx reads the large event tables straight into Arrow columns (chosen by measurement,
  ``benchmarks/bench_readers.py``, in docs/benchmarks.md: about 1.5–1.8× the time of a C-level
  ``SELECT total(...)`` scan, as fast as or faster than ADBC's SQLite driver, against 6–7× for
  ``sqlite3`` rows turned into numpy); tables of at most :data:`SMALL_TABLE_ROWS` rows go through the
  read-only ``sqlite3`` connection, which reads them before connectorx and pyarrow would be imported.

connectorx cannot be asked for ``mode=ro``, so it is only handed a file that the read-only
connection has already opened and validated, and never one with a hot journal or WAL beside it (a
read-write connection could roll that journal back into the user's file).
"""

from __future__ import annotations

import re
import sqlite3
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from perfdoctor.errors import InputError
from perfdoctor.load.file_kind import SQLITE_MAGIC, not_sqlite_reason
from perfdoctor.table import Table

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor


# Event tables up to this many rows are read through sqlite3 (docs/benchmarks.md, "SQLite readers").
SMALL_TABLE_ROWS = 50_000
# Whether a large table may be read on a second thread (SqliteExport.prefetch): perfdoctor.execute turns
# it off where the process has no core to spare (``--jobs 1``, and in pool workers, one per core).
READ_THREAD = True


class SqliteExport:
    """One SQLite file opened read-only, with its table and column names cached."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._check_file()
        uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro"
        try:
            self.conn = sqlite3.connect(uri, uri=True)
            rows = self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:  # names are decoded as UTF-8
            raise InputError(f"{path}: not a readable SQLite database ({exc})") from None
        self.tables: frozenset[str] = frozenset(r[0] for r in rows)
        self._columns: dict[str, tuple[str, ...]] = {}
        self._prefetched: dict[tuple[str, tuple], Future] = {}
        self._pool: ThreadPoolExecutor | None = None

    def _check_file(self) -> None:
        path = self.path
        if not path.exists():
            raise InputError(f"{path}: no such file or directory")
        if not path.is_file():
            raise InputError(f"{path}: not a file")
        try:
            with path.open("rb") as fh:
                head = fh.read(len(SQLITE_MAGIC))
        except OSError as exc:
            raise InputError(f"{path}: cannot read ({exc.strerror})") from None
        if head != SQLITE_MAGIC:
            raise InputError(f"{path}: {not_sqlite_reason(path)}")
        for suffix in ("-journal", "-wal"):
            side = path.with_name(path.name + suffix)
            if side.exists() and side.stat().st_size > 0:
                raise InputError(
                    f"{path}: a {suffix[1:]} file lies beside it (the export was interrupted or is still "
                    "being written); refusing to read it so that the file is not modified"
                )

    def columns(self, table: str) -> tuple[str, ...]:
        """Column names of ``table`` (empty when the table does not exist: nsys creates tables lazily)."""
        if table not in self.tables:
            return ()
        if table not in self._columns:
            rows = self.query(f"PRAGMA table_info([{table}])")
            self._columns[table] = tuple(r[1] for r in rows)
        return self._columns[table]

    def has(self, table: str, column: str | None = None) -> bool:
        return table in self.tables and (column is None or column in self.columns(table))

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Small reads through the read-only connection (metadata tables, counts)."""
        try:
            return self.conn.execute(sql, params).fetchall()
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
            raise InputError(self._read_error(str(exc))) from None

    def prefetch(self, table: str, columns: Mapping[str, str]) -> None:
        """Start reading a large table on another thread (connectorx releases the GIL while it reads);
        the next :meth:`read` of the same table and columns waits for it. Small tables are not worth it."""
        large = READ_THREAD and table in self.tables and _present(columns) and self._rows(table) > SMALL_TABLE_ROWS
        if not large:
            return
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="perfdoctor-read")
        key = (table, tuple(columns.items()))
        self._prefetched[key] = self._pool.submit(self._read, table, columns, True)

    def read(self, table: str, columns: Mapping[str, str]) -> Table:
        """Bulk-read ``table`` into a :class:`Table` whose columns are the keys of ``columns``.

        ``columns`` maps output name → SQL expression over the table's columns (usually a plain column
        name). Missing tables give an empty table with the requested columns. An expression ``NULL``
        (an optional column this export lacks) becomes an all-NaN column added after the read:
        connectorx cannot type a NULL literal, and a valid export without an optional column is not a
        corrupt file. Integer columns holding NULLs come back as float with NaN, text as objects.
        """
        pending = self._prefetched.pop((table, tuple(columns.items())), None)
        if pending is not None:
            return pending.result()
        if table not in self.tables:
            return Table.empty(columns)
        return self._read(table, columns, self._rows(table) > SMALL_TABLE_ROWS)

    def _read(self, table: str, columns: Mapping[str, str], large: bool) -> Table:
        present = _present(columns)
        if present:
            select = ", ".join(f"{expr} AS {name}" for name, expr in present.items())
            sql = f"SELECT {select} FROM [{table}]"
            frame = Table((self._read_arrow if large else self._read_rows)(sql, list(present)))
        else:
            frame = Table(rows=self.query(f"SELECT COUNT(*) FROM [{table}]")[0][0])
        out = Table(rows=len(frame))
        for name in columns:
            out[name] = frame[name] if name in frame else np.full(len(frame), np.nan)
        return out

    def _rows(self, table: str) -> int:
        """Rows of an event table, or at least more than :data:`SMALL_TABLE_ROWS`: its largest rowid
        bounds it at no cost, and only a larger bound (ids can be sparse: ``StringIds``) is counted."""
        try:
            bound = int(self.query(f"SELECT max(rowid) FROM [{table}]")[0][0] or 0)
        except InputError:  # a table without rowid
            bound = SMALL_TABLE_ROWS + 1
        return bound if bound <= SMALL_TABLE_ROWS else int(self.query(f"SELECT COUNT(*) FROM [{table}]")[0][0])

    def _read_rows(self, sql: str, names: list[str]) -> dict[str, np.ndarray]:
        """A small table through the open sqlite3 connection: for a few thousand rows this is faster than
        importing connectorx and pyarrow (about 45 ms) to read them."""
        rows = self.query(sql)
        if not rows:
            return {name: np.zeros(0, dtype=np.int64) for name in names}
        return {name: _column(values) for name, values in zip(names, zip(*rows))}

    def _read_arrow(self, sql: str, names: list[str]) -> dict[str, np.ndarray]:
        import connectorx

        url = "sqlite://" + urllib.parse.quote(str(self.path.resolve()))
        try:
            arrow = connectorx.read_sql(url, sql, return_type="arrow")
        except BaseException as exc:  # connectorx raises Rust panics as BaseException subclasses
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise InputError(self._read_error(msg)) from None
        # Integer columns with NULLs become float with NaN, text object arrays (pyarrow's to_numpy).
        return {name: arrow.column(name).to_numpy() for name in names}

    def _read_error(self, message: str) -> str:
        """A failed read as one line: a column this file lacks is a schema mismatch, not corruption."""
        if match := re.search(r"no such column: ([\w.\[\]\"]+)", message):
            return (f"{self.path}: readable SQLite file without the column {match.group(1)} that perfdoctor "
                    "needs (not an nsys export, or from an nsys release whose schema perfdoctor does not know)")
        return f"{self.path}: corrupt or truncated SQLite file ({message})"

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self.conn.close()


def _present(columns: Mapping[str, str]) -> dict[str, str]:
    """The columns to select: all but the ``NULL`` placeholders of optional columns the export lacks."""
    return {name: expr for name, expr in columns.items() if expr.strip().upper() != "NULL"}


def _column(values: tuple) -> np.ndarray:
    """One column of sqlite3 rows as numpy: integers int64, numbers with NULLs float with NaN (as the
    Arrow reader gives them), text and blobs objects."""
    if isinstance(next((v for v in values if v is not None), None), (str, bytes)):
        return np.array(values, dtype=object)  # text: no detour through a fixed-width unicode array
    arr = np.array(values)
    if arr.dtype.kind in "iuf":
        return arr
    if all(v is None or isinstance(v, (int, float)) for v in values):
        return np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    return np.array(values, dtype=object)
