"""Read-only, column-wise access to an SQLite file.

Two connections serve two purposes:

* a Python ``sqlite3`` connection opened read-only checks the file, lists tables and columns,
  and reads the small metadata tables;
* connectorx reads the large event tables in Rust into Arrow columns (chosen by measurement,
  ``benchmarks/bench_readers.py``, in docs/benchmarks.md: about 1.5–1.8× the time of a C-level
  ``SELECT total(...)`` scan on one core, as fast as or faster than ADBC's SQLite driver, against 6–7×
  for ``sqlite3`` rows turned into numpy). A large table is read in ``perfdoctor.cores.PER_TASK`` slices of
  its rowids at once, one connectorx query per slice on its own thread (connectorx releases the GIL),
  and the slices joined in file order: on two cores the kernel and CUDA-call tables of a million
  kernels are read in about the time of the one-core C scan. Tables of at most
  :data:`SMALL_TABLE_ROWS` rows go through the read-only ``sqlite3`` connection, which reads them
  before connectorx would be imported. connectorx hands its columns over as Arrow C structs, copied
  into numpy by :mod:`perfdoctor.load.arrow_c` without importing pyarrow.

Both open the file as the SQLite URI ``file:PATH?mode=ro&immutable=1`` (:func:`read_only_uri`), so
reading never creates a file beside the input. connectorx takes a plain path after ``sqlite://`` and
opens it read-write, creating it when it is missing (``?mode=ro`` there becomes part of a new file's
name), and for a file in WAL journal mode it creates ``-wal`` and ``-shm`` beside it while it reads;
handed the URI instead (percent-encoded whole, which connectorx decodes once), SQLite opens it as a
URI. A file with a hot journal or a WAL file beside it is refused before either opens it: immutable
reads would ignore the changes those hold.
"""

from __future__ import annotations

import re
import sqlite3
import sys
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from perfdoctor import cores
from perfdoctor.errors import InputError
from perfdoctor.load import arrow_c
from perfdoctor.load.file_kind import SQLITE_MAGIC, not_sqlite_reason
from perfdoctor.table import Table

# Event tables up to this many rows are read through sqlite3 (docs/benchmarks.md, "SQLite readers").
SMALL_TABLE_ROWS = 50_000
# Rows of one slice of a large table read slice by slice (:meth:`SqliteExport.read_slices`): about 40 MB of
# kernel columns, in Arrow and then numpy, per slice in flight.
SLICE_ROWS = 1 << 19


class SqliteExport:
    """One SQLite file opened read-only, with its table and column names cached."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._check_file()
        uri = read_only_uri(path)
        try:
            self.conn = sqlite3.connect(uri, uri=True)
            rows = self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:  # names are decoded as UTF-8
            raise InputError(f"{path}: not a readable SQLite database ({exc})") from None
        self.tables: frozenset[str] = frozenset(r[0] for r in rows)
        self._columns: dict[str, tuple[str, ...]] = {}
        self._spans: dict[str, tuple[int, int] | None] = {}

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

    def read(self, table: str, columns: Mapping[str, str]) -> Table:
        """Bulk-read ``table`` into a :class:`Table` whose columns are the keys of ``columns``.

        ``columns`` maps output name → SQL expression over the table's columns (usually a plain column
        name). Missing tables give an empty table with the requested columns. An expression ``NULL``
        (an optional column this export lacks) becomes an all-NaN column added after the read:
        connectorx cannot type a NULL literal, and a valid export without an optional column is not a
        corrupt file. Integer columns holding NULLs come back as float with NaN, text as objects.
        """
        if table not in self.tables:
            return Table.empty(columns)
        present = _present(columns)
        if present:
            select = ", ".join(f"{expr} AS {name}" for name, expr in present.items())
            sql = f"SELECT {select} FROM [{table}]"
            rowids = self._rowids(table)
            frame = Table(self._read_rows(sql, list(present)) if rowids is None
                          else self._read_arrow(sql, list(present), rowids))
        else:
            frame = Table(rows=self.query(f"SELECT COUNT(*) FROM [{table}]")[0][0])
        out = Table(rows=len(frame))
        for name in columns:
            out[name] = frame[name] if name in frame else np.full(len(frame), np.nan)
        return out

    def read_slices(self, table: str, columns: Mapping[str, str], rows: int | None = None) -> Iterator[Table]:
        """``table`` as :meth:`read` gives it, in rowid slices of about ``rows`` rows, in file order: the
        caller holds one slice at a time, never the whole table (perfdoctor.load.pieces routes each slice
        to its process). Up to ``cores.PER_TASK`` slices are read at once, on threads (connectorx releases
        the GIL); a small table is one slice. Each slice's NULL-placeholder columns are all NaN, as in
        :meth:`read`."""
        for _, part in self.read_many([(table, columns)], rows):
            yield part

    def read_many(self, requests: list[tuple[str, Mapping[str, str]]],
                  rows: int | None = None) -> Iterator[tuple[int, Table]]:
        """:meth:`read_slices` of several tables, one after the other, as (request index, slice): the slices
        of all of them are one queue with up to ``cores.PER_TASK`` in flight, so the next table's first
        slices are read while the last ones of this table are still being turned into columns (one
        table after another, the readers waited for that, and for the slowest slice, at every boundary)."""
        plans: list[tuple[int, str, Mapping[str, str], dict[str, str], list[str] | None]] = []
        for index, (table, columns) in enumerate(requests):
            present = _present(columns)
            rowids = self._rowids(table) if table in self.tables and present else None
            queries = None
            if rowids is not None:
                select = ", ".join(f"{expr} AS {name}" for name, expr in present.items())
                low, high = rowids
                # slices of one size (at most ``rows``): the last two, read side by side, end together
                count = -(-(high - low + 1) // max(rows or SLICE_ROWS, 1))
                bounds = [low + (high - low + 1) * i // count for i in range(count + 1)]
                queries = _rowid_slices(f"SELECT {select} FROM [{table}]", bounds)
            plans.append((index, table, columns, present, queries))
        work = [query for *_, queries in plans if queries for query in queries]
        if not work:
            for index, table, columns, _, _ in plans:
                frame = self.read(table, columns)
                if len(frame):
                    yield index, frame
            return
        from concurrent.futures import ThreadPoolExecutor

        connectorx_read_sql()  # loaded here, once, not by two slice threads at the same time
        ahead = max(1, cores.PER_TASK)
        with ThreadPoolExecutor(max_workers=ahead, thread_name_prefix="perfdoctor-read") as pool:
            pending = [pool.submit(self._arrow, q) for q in work[:ahead]]
            queued = len(pending)
            try:
                for index, table, columns, present, queries in plans:
                    if queries is None:
                        frame = self.read(table, columns)
                        if len(frame):
                            yield index, frame
                        continue
                    for _ in queries:
                        _, batches = pending.pop(0).result()
                        if queued < len(work):
                            pending.append(pool.submit(self._arrow, work[queued]))
                            queued += 1
                        try:
                            part = arrow_c.columns(batches, list(present))
                        except ValueError as exc:
                            raise InputError(f"{self.path}: {exc}") from None
                        if not part or not len(next(iter(part.values()))):
                            continue
                        n = len(next(iter(part.values())))
                        yield index, Table({name: part[name] if name in part else np.full(n, np.nan)
                                            for name in columns}, rows=n)
            except BaseException:
                for f in pending:  # slices read ahead are released before the error goes on
                    if f.exception() is None:
                        arrow_c.release(f.result()[1])
                raise

    def rows_at_most(self, table: str) -> int:
        """An upper bound on the rows of ``table`` before it is read: its rowid span (:meth:`_span`); 0 for a
        missing or empty table, or one without rowids (its read says what is wrong with it)."""
        try:
            span = self._span(table) if table in self.tables else None
        except InputError:
            return 0
        return 0 if span is None else span[1] - span[0] + 1

    def _span(self, table: str) -> tuple[int, int] | None:
        """The first and last rowid of ``table`` (None when it is empty): each end is one b-tree lookup (in
        two subqueries: SQLite scans the table for ``min(rowid), max(rowid)`` in one). A table without
        rowids is :class:`InputError`. Asked once per table: the loader sizes its routing by it before the
        read slices the table by it."""
        if table not in self._spans:
            low, high = self.query(f"SELECT (SELECT min(rowid) FROM [{table}]), "
                                   f"(SELECT max(rowid) FROM [{table}])")[0]
            self._spans[table] = None if low is None else (int(low), int(high))
        return self._spans[table]

    def _rowids(self, table: str) -> tuple[int, int] | None:
        """The first and last rowid of a large table, to slice it by (:meth:`_span`); ``None`` for a small
        one (at most :data:`SMALL_TABLE_ROWS` rows): only a span beyond the limit (ids can be sparse:
        ``StringIds``) is checked by stepping over that many rows, not counting all of them."""
        try:
            span = self._span(table)
        except InputError:  # a table without rowid: one slice
            return 0, 0
        if span is None or span[1] - span[0] < SMALL_TABLE_ROWS:
            return None
        beyond = self.query(f"SELECT 1 FROM [{table}] LIMIT 1 OFFSET {SMALL_TABLE_ROWS}")
        return span if beyond else None

    def _read_rows(self, sql: str, names: list[str]) -> dict[str, np.ndarray]:
        """A small table through the open sqlite3 connection: for a few thousand rows this is faster than
        importing connectorx (about 25 ms) to read them."""
        rows = self.query(sql)
        if not rows:
            return {name: np.zeros(0, dtype=np.int64) for name in names}
        return {name: _column(values) for name, values in zip(names, zip(*rows))}

    def _read_arrow(self, sql: str, names: list[str], rowids: tuple[int, int]) -> dict[str, np.ndarray]:
        """A large table through connectorx, in up to ``cores.PER_TASK`` rowid slices read at once
        (connectorx's own partitioning returns the slices out of order), joined in file order."""
        connectorx_read_sql()  # loaded here, once, not by two slice threads at the same time
        low, high = rowids
        parts = max(1, min(cores.PER_TASK, (high - low + 1) // SMALL_TABLE_ROWS)) if high > low else 1
        if parts == 1:
            results = [self._arrow(sql)]
        else:
            from concurrent.futures import ThreadPoolExecutor

            bounds = [low + (high - low + 1) * i // parts for i in range(parts + 1)]
            slices = _rowid_slices(sql, bounds)
            with ThreadPoolExecutor(max_workers=parts, thread_name_prefix="perfdoctor-read") as pool:
                futures = [pool.submit(self._arrow, one) for one in slices]
            failed = [f.exception() for f in futures if f.exception() is not None]
            if failed:  # the slices that were read are released before the error is raised
                arrow_c.release(batch for f in futures if f.exception() is None for batch in f.result()[1])
                raise failed[0]
            results = [f.result() for f in futures]
        try:
            return arrow_c.columns((batch for _, batches in results for batch in batches), names)
        except ValueError as exc:
            raise InputError(f"{self.path}: {exc}") from None

    def _arrow(self, sql: str) -> tuple[list[str], list[list[tuple[int, int]]]]:
        """One query through connectorx's reader (:func:`connectorx_read_sql`), its result as Arrow C data
        interface pointers: the column names and, per record batch, one (array, schema) address pair per
        column. This is what ``connectorx.read_sql(..., return_type="arrow")`` gets before it imports pyarrow
        to wrap them: the same call in connectorx 0.3.3 to 0.4.6 (pyproject allows those;
        tests/test_sqlite_reader.py checks every value against sqlite3)."""
        read_sql = connectorx_read_sql()
        # connectorx decodes the URL once and hands the rest to SQLite, which opens a file: URI as one
        url = "sqlite://" + urllib.parse.quote(read_only_uri(self.path), safe="")
        try:
            return read_sql(url, "arrow", queries=[sql], protocol="binary", partition_query=None)
        except BaseException as exc:  # connectorx raises Rust panics as BaseException subclasses
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise InputError(self._read_error(msg)) from None

    def _read_error(self, message: str) -> str:
        """A failed read as one line: a column this file lacks is a schema mismatch, not corruption."""
        if match := re.search(r"no such column: ([\w.\[\]\"]+)", message):
            return (f"{self.path}: readable SQLite file without the column {match.group(1)} that perfdoctor "
                    "needs (not an nsys export, or from an nsys release whose schema perfdoctor does not know)")
        return f"{self.path}: corrupt or truncated SQLite file ({message})"

    def close(self) -> None:
        self.conn.close()


def connectorx_read_sql() -> Callable[..., Any]:
    """connectorx's compiled ``read_sql``, from its extension module ``connectorx.connectorx`` loaded on its
    own where it can be: the package's ``__init__`` imports ``importlib.metadata`` to look up its version and
    sets up the Java paths of its federated queries, which reading SQLite never uses (17 ms of
    `perfdoctor analyze` at 1M kernels, against 6 ms for the module alone). Where the module is not found
    beside the package (another layout), the package is imported as usual."""
    module = sys.modules.get("connectorx.connectorx")
    if module is None:
        import importlib.machinery
        import importlib.util

        spec = importlib.util.find_spec("connectorx")  # finds the package without running it
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        found = [Path(folder) / f"connectorx{suffix}" for folder in folders
                 for suffix in importlib.machinery.EXTENSION_SUFFIXES]
        path = next((p for p in found if p.is_file()), None)
        if path is None:
            from connectorx import connectorx as module
        else:
            loader = importlib.machinery.ExtensionFileLoader("connectorx.connectorx", str(path))
            module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
            loader.exec_module(module)
            sys.modules[loader.name] = module  # the package, imported later, takes this one
    return module.read_sql


def read_only_uri(path: Path) -> str:
    """The SQLite URI that opens ``path`` read-only and immutable: SQLite takes no locks and opens no
    journal, so no ``-journal``, ``-wal`` or ``-shm`` file appears beside it, even for a file in WAL
    journal mode (whose content is all in the file when no ``-wal`` lies beside it: one that does is
    refused before), and a missing file is an error, never created."""
    return "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro&immutable=1"


def _rowid_slices(sql: str, bounds: list[int]) -> list[str]:
    """``sql`` once per rowid slice [bounds[i], bounds[i + 1]); the last slice takes any later rows."""
    queries = [f"{sql} WHERE rowid >= {a} AND rowid < {b}" for a, b in zip(bounds[:-1], bounds[1:])]
    queries[-1] = f"{sql} WHERE rowid >= {bounds[-2]}"
    return queries


def _present(columns: Mapping[str, str]) -> dict[str, str]:
    """The columns to select: all but the ``NULL`` placeholders of optional columns the export lacks."""
    return {name: expr for name, expr in columns.items() if expr.strip().upper() != "NULL"}


def _column(values: tuple) -> np.ndarray:
    """One column of sqlite3 rows as numpy: integers int64, numbers with NULLs float with NaN (as the
    Arrow reader gives them), text and blobs objects. The NULLs are counted and the types looked at in C
    (``tuple.count``, ``map(type, ...)``): a nullable column of an export (most of NVTX's payload columns are
    all NULL) is not walked value by value in Python."""
    nulls = values.count(None)
    if nulls == len(values):
        return np.full(len(values), np.nan)
    if isinstance(next(v for v in values if v is not None), (str, bytes)):
        return np.array(values, dtype=object)  # text: no detour through a fixed-width unicode array
    if not nulls:
        arr = np.array(values)
        if arr.dtype.kind in "iuf":
            return arr
    if set(map(type, values)) <= {int, float, type(None)}:
        return np.array(values, dtype=np.float64)  # None becomes NaN
    return np.array(values, dtype=object)
