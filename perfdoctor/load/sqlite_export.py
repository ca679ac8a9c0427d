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
  :data:`perfdoctor.load.sqlite_file.SMALL_TABLE_ROWS` rows go through the read-only ``sqlite3``
  connection, which reads them before connectorx would be imported. connectorx hands its columns over
  as Arrow C structs, copied into numpy by :mod:`perfdoctor.load.arrow_c` without importing pyarrow.

Both open the file as the SQLite URI ``file:PATH?mode=ro&immutable=1``
(:func:`perfdoctor.load.sqlite_file.read_only_uri`), so reading never creates a file beside the input.
connectorx takes a plain path after ``sqlite://`` and opens it read-write, creating it when it is
missing (``?mode=ro`` there becomes part of a new file's name), and for a file in WAL journal mode it
creates ``-wal`` and ``-shm`` beside it while it reads; handed the URI instead (percent-encoded whole,
which connectorx decodes once), SQLite opens it as a URI. A file with a hot journal or a WAL file beside
it is refused before either opens it: immutable reads would ignore the changes those hold.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import numpy as np

from perfdoctor import cores
from perfdoctor.errors import InputError
from perfdoctor.load import arrow_c, read_ahead, sqlite_file
from perfdoctor.load.sqlite_file import SqliteFile, connectorx_read_sql, present, rowid_slices
from perfdoctor.table import Table

if TYPE_CHECKING:
    from concurrent.futures import Future


class SqliteExport(SqliteFile):
    """One SQLite file opened read-only (:class:`perfdoctor.load.sqlite_file.SqliteFile`), its tables read into
    numpy columns."""

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
        selected = present(columns)
        if selected:
            select = ", ".join(f"{expr} AS {name}" for name, expr in selected.items())
            sql = f"SELECT {select} FROM [{table}]"
            rowids = self._rowids(table)
            frame = Table(self._read_rows(sql, list(selected)) if rowids is None
                          else self._read_arrow(sql, list(selected), rowids))
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

    def read_many(self, requests: list[tuple[str, Mapping[str, str]]], rows: int | None = None,
                  narrow: Mapping[str, Mapping[str, type[np.integer]]] | None = None) -> Iterator[tuple[int, Table]]:
        """:meth:`read_slices` of several tables, one after the other, as (request index, slice): the slices
        of all of them are one queue read by ``cores.PER_TASK`` threads with one slice more in flight than
        there are readers, so a reader that finishes goes on to the next slice while this thread turns the
        oldest into columns, and the next table's first slices are read while the last ones of this table
        are (one table after another, the readers waited for that, and for the slowest slice, at every
        boundary; with a slice in flight per reader, each waited for this thread to take its slice).
        ``narrow``: per table, integer columns a slice read in pieces gives as that type where its values fit
        it and none is NULL (:func:`perfdoctor.load.arrow_c.columns`)."""
        plans = [(index, table, columns, present(columns), self.slice_queries(table, columns, rows))
                 for index, (table, columns) in enumerate(requests)]
        work = [query for *_, queries in plans if queries for query in queries]
        if not work:
            for index, table, columns, _, _ in plans:
                frame = self.read(table, columns)
                if len(frame):
                    yield index, frame
            return
        from concurrent.futures import ThreadPoolExecutor

        connectorx_read_sql()  # loaded here, once, not by two slice threads at the same time
        readers = max(1, cores.PER_TASK)
        ahead = readers + 1
        with ThreadPoolExecutor(max_workers=readers, thread_name_prefix="perfdoctor-read") as pool:

            def submit(sql: str) -> Future:  # a slice read ahead (perfdoctor.load.read_ahead) is not read again
                return read_ahead.take(self.path, sql) or pool.submit(self.arrow, sql)

            pending = [submit(q) for q in work[:ahead]]
            queued = len(pending)
            try:
                for index, table, columns, selected, queries in plans:
                    if queries is None:
                        frame = self.read(table, columns)
                        if len(frame):
                            yield index, frame
                        continue
                    for _ in queries:
                        _, batches = pending.pop(0).result()
                        if queued < len(work):
                            pending.append(submit(work[queued]))
                            queued += 1
                        try:
                            part = arrow_c.columns(batches, list(selected), (narrow or {}).get(table))
                        except ValueError as exc:
                            raise InputError(f"{self.path}: {exc}") from None
                        if not part or not len(next(iter(part.values()))):
                            continue
                        n = len(next(iter(part.values())))
                        yield index, Table({name: part[name] if name in part else np.full(n, np.nan)
                                            for name in columns}, rows=n)
            except BaseException:
                _release(pending)  # slices read ahead of an error are released before it goes on
                raise

    def close(self) -> None:
        """Close the file, and release the slices read ahead of it that no read asked for (a read ahead of a
        load that failed first, or of other columns: perfdoctor.load.read_ahead)."""
        _release(read_ahead.rest(self.path))
        super().close()

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
        parts = max(1, min(cores.PER_TASK, (high - low + 1) // sqlite_file.SMALL_TABLE_ROWS)) if high > low else 1
        if parts == 1:
            results = [self.arrow(sql)]
        else:
            from concurrent.futures import ThreadPoolExecutor

            bounds = [low + (high - low + 1) * i // parts for i in range(parts + 1)]
            slices = rowid_slices(sql, bounds)
            with ThreadPoolExecutor(max_workers=parts, thread_name_prefix="perfdoctor-read") as pool:
                futures = [pool.submit(self.arrow, one) for one in slices]
            failed = [f.exception() for f in futures if f.exception() is not None]
            if failed:  # the slices that were read are released before the error is raised
                _release(futures)
                raise failed[0]
            results = [f.result() for f in futures]
        try:
            return arrow_c.columns((batch for _, batches in results for batch in batches), names)
        except ValueError as exc:
            raise InputError(f"{self.path}: {exc}") from None


def _release(reads: list[Future]) -> None:
    """Release what the finished ones of ``reads`` (connectorx queries) hold, waiting for the others."""
    for read in reads:
        if read.exception() is None:
            arrow_c.release(read.result()[1])


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
