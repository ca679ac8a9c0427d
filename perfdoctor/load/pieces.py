"""The rows of an export's large tables, routed per process while they are read, so that one process's
rows are in memory at a time (DESIGN §1 "Execution": memory bounded per piece of a file).

A per-node nsys export holds the kernels and CUDA calls of every GPU's process in one table each, rows of
all processes interleaved. Read whole, the file's tables are held while its first timeline is analysed;
routed, each slice of a table (:meth:`perfdoctor.load.sqlite_export.SqliteExport.read_slices`) is split
by process as it arrives, and a process's rows are put together only when its timeline is analysed.

Rows stay in memory while they are few (:data:`SPILL_ABOVE`) or belong to one process whose tables are
not large (a per-rank export: nothing to route). Past that, every process's rows go to an unnamed
temporary file of its own (``tempfile.TemporaryFile`` in ``$TMPDIR``: unlinked at once, so the space
returns to the system when it is closed or the process ends, even on Ctrl-C); a process's file is read
back, and closed, when its timelines are built. A process whose rows hold more than
:data:`perfdoctor.mapped.MAP_ABOVE` (millions of kernels) gets them back as mapped columns, so its tables
are never all in memory: one GPU's 30M kernels are measured in the memory of a few windows. Nothing is ever
written beside the input.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np

from perfdoctor import mapped as mapped_columns
from perfdoctor.errors import InputError
from perfdoctor.heap import give_back_freed
from perfdoctor.table import Table, distinct

# In-memory rows of a file with several processes, summed over its tables, before they go to temporary
# files: about two slices' worth. Below it (any sample, a per-node capture of a few steps) nothing is
# written; above it, memory holds the slices in flight, then one process's rows.
SPILL_ABOVE = 64 << 20


@dataclass
class _Rows:
    """One table's rows of one process: chunks in memory, or their places in a temporary file, or in one
    temporary file per column (``by_column``: a large table of one process, whose files become its mapped
    columns as they are, with no copy)."""

    chunks: list[dict[str, np.ndarray]] = field(default_factory=list)
    file: BinaryIO | None = None
    files: dict[str, BinaryIO] | None = None  # by column
    spilled: list[tuple[int, dict[str, tuple[np.dtype, int, int]]]] = field(default_factory=list)
    rows: int = 0
    nbytes: int = 0

    def spill(self, by_column: bool = False) -> None:
        """Move the chunks in memory to this table's temporary file, or to its columns' files (``by_column``,
        fixed at the first spill); a full or unwritable temporary folder is said in one line, as bad input
        is."""
        try:
            if self.file is None and self.files is None:
                if by_column:
                    self.files = {}
                else:
                    self.file = tempfile.TemporaryFile(prefix="perfdoctor-rows-")
            for chunk in self.chunks:
                places = {}
                for name, values in chunk.items():
                    file = self._file(name)
                    places[name] = (values.dtype, file.tell(), values.size)
                    mapped_columns.write(file, values)  # (not at once: mapped_columns.WRITE_BYTES)
                self.spilled.append((len(next(iter(chunk.values()))), places))
        except OSError as exc:
            raise InputError(f"cannot write the export's rows to the temporary folder {tempfile.gettempdir()} "
                             f"({exc.strerror or exc}): set TMPDIR to a folder with room for them") from None
        self.chunks = []

    def _file(self, name: str) -> BinaryIO:
        if self.files is None:
            return self.file
        if name not in self.files:
            self.files[name] = tempfile.TemporaryFile(prefix="perfdoctor-column-")
        return self.files[name]

    def table(self, columns: list[str], mapped: bool = False) -> Table:
        """All rows, in the order they were added, one column at a time (each column's chunks let go as
        it is joined); ``mapped``: each column in a mapped file (:mod:`perfdoctor.mapped`): a column's own
        file where its rows went to one (``by_column``) at one width."""
        if self.files is not None:
            self.spill()  # the column files hold every row
        out = {}
        for name in columns:
            dtypes = {place[name][0] for _, place in self.spilled} | {chunk[name].dtype for chunk in self.chunks}
            dtype = np.result_type(*dtypes) if dtypes else np.int64
            if mapped and self.files is not None and dtypes == {dtype}:
                out[name] = mapped_columns.of_file(self._file(name), self.rows, dtype)
                continue
            if mapped:  # written to the column's file a chunk at a time (perfdoctor.mapped.written)
                out[name] = mapped_columns.written(self._parts(name), self.rows, dtype)
            else:
                out[name], at = np.empty(self.rows, dtype=dtype), 0
                for part in self._parts(name, out[name]):
                    if part.base is not out[name]:
                        out[name][at:at + part.size] = part
                    at += part.size
            give_back_freed(out[name].nbytes)  # the chunks were heap memory that no later large array reuses
        self.close()
        return Table(out, rows=self.rows)

    def _parts(self, name: str, into: np.ndarray | None = None) -> Iterator[np.ndarray]:
        """A column's rows chunk by chunk, in the order they were added: the spilled ones read back (straight
        into the rows of ``into`` where it is given and the chunk has its width), then those in memory."""
        at = 0
        for n, place in self.spilled:  # spilled chunks come before those still in memory
            dtype, offset, size = place[name]
            file = self._file(name)
            file.seek(offset)
            part = into[at:at + n] if into is not None and dtype == into.dtype else np.empty(size, dtype=dtype)
            file.readinto(memoryview(part).cast("B"))
            yield part
            at += n
        for chunk in self.chunks:
            yield chunk.pop(name)

    def close(self) -> None:
        for file in [self.file, *(self.files or {}).values()]:
            if file is not None:
                file.close()
        self.file, self.files, self.chunks, self.spilled = None, None, [], []


class Pieces:
    """The large tables of one export, split by process as their slices arrive (:meth:`add`); a process's
    rows of a table are taken once (:meth:`take`)."""

    def __init__(self, spill_above: int | None = None) -> None:
        self._rows: dict[tuple[str, int], _Rows] = {}
        self._columns: dict[str, list[str]] = {}
        self._held = 0
        self._spill_above = SPILL_ABOVE if spill_above is None else spill_above
        self._spilling = False
        # One process's rows are spilled, then taken as mapped columns, past this (a disk-backed $TMPDIR only)
        self._map_above = mapped_columns.MAP_ABOVE if mapped_columns.available() else float("inf")
        self._processes: set[int] = set()
        self.counts: dict[str, int] = {}
        self._mapped: dict[int, bool] = {}
        self._expected: dict[str, int] = {}  # rows each table will have at most (:meth:`expect`)
        self._row_bytes: dict[str, float] = {}  # bytes per row of each table, from its first slice
        self.pairs: set[tuple[int, int]] = set()  # (process, device) of the rows of tables with a device

    def expect(self, table: str, rows: int) -> None:
        """Say how many rows ``table`` will have at most, before its slices come: rows bound to be mapped
        (:meth:`take`) then go to their files from the first spill threshold on, a slice at a time, not all
        at once when they reach the mapping threshold (a quarter of a GB written while the readers wait)."""
        self._expected[table] = rows

    def _foreseen(self) -> float:
        """The bytes the tables will hold by what they said to :meth:`expect`, over those with a slice."""
        return sum(self._expected.get(table, 0) * size for table, size in self._row_bytes.items())

    def add(self, table: str, key: np.ndarray, rows: Table) -> None:
        """Route a slice of ``table``: each row to the process ``key`` names (its globalPid)."""
        self._columns.setdefault(table, rows.columns)
        self.counts[table] = self.counts.get(table, 0) + len(rows)
        if not len(rows):
            return
        self._row_bytes.setdefault(table, rows.nbytes / len(rows))
        for process, part in _by_process(key, rows):
            self._processes.add(process)
            held = self._rows.setdefault((table, process), _Rows())
            held.chunks.append({name: part[name] for name in part.columns})
            held.rows += len(part)
            held.nbytes += part.nbytes
            if "device_id" in part:
                device = part["device_id"]
                devices = device[:1] if device.min() == device.max() else distinct(device)
                self.pairs.update((process, int(d)) for d in devices)
            self._held += part.nbytes
            if self._spilling:
                held.spill(by_column=len(self._processes) == 1)
        if not self._spilling and self._held > self._spill_above and (
                len(self._processes) > 1 or max(self._held, self._foreseen()) > self._map_above):
            self._spilling = True
            for held in self._rows.values():
                held.spill(by_column=len(self._processes) == 1)

    def shape(self, table: str) -> Table:
        """``table`` without rows: its columns, as :meth:`take` gives them."""
        return Table({name: np.zeros(0, dtype=np.int64) for name in self._columns[table]}, rows=0)

    def keep(self, processes: set[int]) -> None:
        """Let go of the rows of every other process (no timeline will take them); once the rows are on
        disk, the heap the slices were read into goes back to the system (nothing later reuses all of it:
        one process's tables are a fraction of the file's)."""
        for key in [key for key in self._rows if key[1] not in processes]:
            self._rows.pop(key).close()
        if self._spilling:
            give_back_freed(self._held)

    def most_rows(self, process: int) -> int:
        """The most rows the process has in one table (its largest column's length once taken)."""
        return max((held.rows for (_, p), held in self._rows.items() if p == process), default=0)

    def take(self, table: str, process: int) -> Table | None:
        """The process's rows of ``table`` in file order (then forgotten); None when it has none."""
        held = self._rows.pop((table, process), None)
        if held is None:
            return None
        if process not in self._mapped:  # decided at its first table, over all its tables' rows
            self._mapped[process] = held.nbytes + sum(
                rows.nbytes for (_, p), rows in self._rows.items() if p == process) > self._map_above
        return held.table(self._columns[table], mapped=self._mapped[process])

    @property
    def spilled(self) -> bool:
        """Whether rows went to temporary files (the export has several processes and many rows)."""
        return self._spilling


# A slice whose process changes fewer times than once per this many rows is split into its runs (views,
# no copy): nsys writes each process's activity buffers whole, so rows come in long runs of one process.
ROWS_PER_RUN = 64


def _by_process(key: np.ndarray, rows: Table) -> list[tuple[int, Table]]:
    """A slice's rows as (process, rows) parts in file order: whole for one process, its runs as views
    when processes come in long runs, else one stable reordering by process."""
    if key.min() == key.max():  # a per-rank export, or a slice of one process's buffer
        return [(int(key[0]), rows)]
    edges = np.flatnonzero(key[1:] != key[:-1]) + 1
    if edges.size * ROWS_PER_RUN < key.size:
        bounds = [0, *edges.tolist(), key.size]
        return [(int(key[a]), rows.take(slice(a, b))) for a, b in zip(bounds[:-1], bounds[1:])]
    order = np.argsort(key, kind="stable")
    ordered, grouped = key[order], rows.take(order)
    bounds = [0, *(np.flatnonzero(ordered[1:] != ordered[:-1]) + 1).tolist(), key.size]
    return [(int(ordered[a]), grouped.take(slice(a, b))) for a, b in zip(bounds[:-1], bounds[1:])]
