"""An SQLite file opened read-only: its tables and columns, and the queries that read a large table in
rowid slices through connectorx, without numpy.

What :mod:`perfdoctor.load.sqlite_export` needs before any column is made: kept apart so that the first
slices of an export can be read while the analysis's modules (numpy among them) are still being imported
(:mod:`perfdoctor.load.read_ahead`). How the file is opened and why: that module's docstring.
"""

from __future__ import annotations

import re
import sqlite3
import sys
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from perfdoctor.errors import InputError
from perfdoctor.load.file_kind import SQLITE_MAGIC, not_sqlite_reason

# Event tables up to this many rows are read through sqlite3 (docs/benchmarks.md, "SQLite readers").
SMALL_TABLE_ROWS = 50_000
# Rows of one slice of a large table read slice by slice (perfdoctor.load.sqlite_export.SqliteExport.read_slices):
# about 40 MB of kernel columns, in Arrow and then numpy, per slice in flight.
SLICE_ROWS = 1 << 19


class SqliteFile:
    """One SQLite file opened read-only, with its table and column names cached, and the connectorx reads of
    its large tables (:meth:`slice_queries`, :meth:`arrow`); :class:`perfdoctor.load.sqlite_export.SqliteExport`
    turns what they read into numpy columns."""

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

    def slice_queries(self, table: str, columns: Mapping[str, str], rows: int | None = None) -> list[str] | None:
        """The queries that read ``table``'s ``columns`` (output name → SQL expression, ``NULL`` placeholders
        left out: :func:`present`) in rowid slices of one size, at most ``rows`` (:data:`SLICE_ROWS`), in file
        order; None for a table read whole through sqlite3 (missing, small, or nothing to select). The last two
        slices, read side by side, end together."""
        selected = present(columns)
        rowids = self._rowids(table) if table in self.tables and selected else None
        if rowids is None:
            return None
        select = ", ".join(f"{expr} AS {name}" for name, expr in selected.items())
        low, high = rowids
        count = -(-(high - low + 1) // max(rows or SLICE_ROWS, 1))
        bounds = [low + (high - low + 1) * i // count for i in range(count + 1)]
        return rowid_slices(f"SELECT {select} FROM [{table}]", bounds)

    def arrow(self, sql: str) -> tuple[list[str], list[list[tuple[int, int]]]]:
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


def rowid_slices(sql: str, bounds: list[int]) -> list[str]:
    """``sql`` once per rowid slice [bounds[i], bounds[i + 1]); the last slice takes any later rows."""
    queries = [f"{sql} WHERE rowid >= {a} AND rowid < {b}" for a, b in zip(bounds[:-1], bounds[1:])]
    queries[-1] = f"{sql} WHERE rowid >= {bounds[-2]}"
    return queries


def present(columns: Mapping[str, str]) -> dict[str, str]:
    """The columns to select: all but the ``NULL`` placeholders of optional columns the export lacks."""
    return {name: expr for name, expr in columns.items() if expr.strip().upper() != "NULL"}
