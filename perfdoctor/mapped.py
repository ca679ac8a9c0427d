"""Large columns kept in unlinked temporary files and mapped into memory: only the pages a step reads are
resident, and :func:`release` lets go of them between steps.

A timeline of tens of millions of kernels holds about 60 bytes per kernel in its tables (2 GB at 30M).
Every measurement reads them a window of steps or a slice of rows at a time, so most of those bytes need
not be resident at once. A mapped column lives in the page cache: reading it faults its pages in (a
minor fault from the cache, no disk read while memory is free), and :func:`release`
(``madvise(MADV_DONTNEED)`` on a shared file mapping) drops them from this process without losing data:
the kernel writes dirty ones back to the file when it needs the memory, instead of the process being
killed. The files are unlinked at once (``tempfile.TemporaryFile``), so their space returns when the
columns are let go or the process ends, Ctrl-C included; nothing is written beside the input.

Columns come from the loader (one large process's rows, written to a file per column as they are read:
:mod:`perfdoctor.load.pieces`) and from takes, conversions and joins of mapped columns (:func:`taken`,
:func:`converted`, :func:`joined`, :func:`like`), so that a table derived from a mapped one is mapped too.
Measurements read columns in whole-column operations as well as in slices, and the kernel keeps every page
read until memory runs short, counted as this process's: a pager thread lets them go whenever more than
:data:`RESIDENT` bytes of them are resident.

Only where ``$TMPDIR`` is a disk: on a RAM file system (``tmpfs``) a mapped page is memory all the same,
so columns stay ordinary arrays there (:func:`available`).
"""

from __future__ import annotations

import mmap
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import numpy as np

from perfdoctor.errors import InputError

# A process's rows are mapped only when its tables hold at least this many bytes (4M kernels with their
# CUDA calls): below it they fit beside the measurements' own arrays with room to spare, and a mapping's
# page faults cost time for nothing.
MAP_ABOVE = 256 << 20
# A take (rows by position or mask) from a mapped column of at least this many bytes is mapped too.
MAP_TAKES_ABOVE = 16 << 20
RAM_FILE_SYSTEMS = {"tmpfs", "ramfs"}
# The pages of mapped columns this process may hold before they are let go: the pager looks this often.
RESIDENT = 128 << 20
PAGER_EVERY_S = 0.005

_live: list[weakref.ref[mmap.mmap]] = []
_lock = threading.Lock()
_pager: threading.Thread | None = None


def available(folder: str | None = None) -> bool:
    """Whether temporary files live on a disk (not a RAM file system): only there does mapping a column
    take it out of memory. Linux only (``/proc/self/mountinfo``)."""
    try:
        with open("/proc/self/mountinfo") as fh:
            mounts = [line.split() for line in fh]
    except OSError:
        return False
    return on_disk(os.path.realpath(folder or tempfile.gettempdir()), mounts)


def on_disk(folder: str, mounts: list[list[str]]) -> bool:
    """Whether ``folder`` is on a file system other than a RAM one, by the mount that holds it (the longest
    mount point above it) in ``mounts`` (the fields of ``/proc/self/mountinfo`` lines: the mount point is
    the fifth, the file system type follows the ``-``)."""
    best, kind = "", None
    for fields in mounts:
        point = fields[4]
        inside = folder == point or folder.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best) and "-" in fields[6:]:
            best, kind = point, fields[fields.index("-", 6) + 1]
    return kind is not None and kind not in RAM_FILE_SYSTEMS


def empty(rows: int, dtype: np.dtype | type) -> np.ndarray:
    """A writable column of ``rows`` zeros of ``dtype`` in a temporary file of its own, mapped (a full or
    unwritable temporary folder is said in one line, as bad input is)."""
    dtype = np.dtype(dtype)
    size = rows * dtype.itemsize
    if not size:
        return np.zeros(rows, dtype=dtype)
    try:
        with tempfile.TemporaryFile(prefix="perfdoctor-column-") as fh:
            # The blocks reserved now: a full disk is an error here, not a SIGBUS when a page is first written.
            os.posix_fallocate(fh.fileno(), 0, size)
            return of_file(fh, rows, dtype)
    except OSError as exc:
        raise _no_room(exc) from None


def written(pieces: Iterable[np.ndarray], rows: int, dtype: np.dtype | type) -> np.ndarray:
    """A writable mapped column of the ``rows`` values of ``pieces`` (in order, as ``dtype``), written to
    its temporary file (:func:`write`) rather than through the mapping: a page first written through a
    mapping is a page fault each, and a fresh page of the page cache the write path fills costs a fraction of
    that (690 MB: 0.3 s written, 1.3-2.0 s filled through the mapping, on our CI machine)."""
    dtype = np.dtype(dtype)
    count = 0
    try:
        with tempfile.TemporaryFile(prefix="perfdoctor-column-") as fh:
            for piece in pieces:
                write(fh, piece.astype(dtype, copy=False))
                count += piece.size
            if count != rows:  # a mapping past the file's end would be a SIGBUS when read
                raise ValueError(f"{count} values written for a column of {rows}")
            return of_file(fh, rows, dtype)
    except OSError as exc:
        raise _no_room(exc) from None


# Bytes per write to a temporary file. The size of a write sets the size of the page-cache pages that take
# it where the file system uses large folios (ext4 since Linux 6.x): a 4 MB column slice written at once
# fills 2 MB pages, and on a virtual machine that hands its free memory back to the host (virtio-balloon
# free page reporting, which reports free blocks of 2 MB and up) each such page is a block the host must
# fault in again, 4 kB at a time. Measured on our 2-core CI machine, 690 MB (a 10M-kernel export's rows)
# into a fresh temporary file: 2.2 s in 4 MB writes, 1.0 s in 1 MB writes, 0.3 s in 64-512 kB writes.
WRITE_BYTES = 256 << 10


def write(fh: BinaryIO, values: np.ndarray) -> None:
    """Append ``values``' bytes to ``fh``, :data:`WRITE_BYTES` at a time."""
    data = memoryview(np.ascontiguousarray(values)).cast("B")
    for at in range(0, len(data), WRITE_BYTES):
        fh.write(data[at:at + WRITE_BYTES])


def _no_room(exc: OSError) -> InputError:
    return InputError(f"cannot map a column in the temporary folder {tempfile.gettempdir()} "
                      f"({exc.strerror or exc}): set TMPDIR to a folder with room for it")


def of_file(fh: BinaryIO, rows: int, dtype: np.dtype | type) -> np.ndarray:
    """The first ``rows`` values of ``dtype`` written in the temporary file ``fh`` (from its start) as a
    writable mapped column; the file may be closed after: the mapping keeps it."""
    dtype = np.dtype(dtype)
    if not rows:
        return np.zeros(0, dtype=dtype)
    fh.flush()
    mapping = mmap.mmap(fh.fileno(), rows * dtype.itemsize, flags=mmap.MAP_SHARED,
                        prot=mmap.PROT_READ | mmap.PROT_WRITE)
    with _lock:
        _live.append(weakref.ref(mapping))
    _start_pager()
    return np.frombuffer(mapping, dtype=dtype)


# Derived columns are made a piece of this many bytes at a time: a column is never held twice, and a piece
# is small enough for the heap to serve it again (below perfdoctor.heap.MMAP_ABOVE, no fresh pages each time).
SLICE_BYTES = 8 << 20


def like(rows: int, dtype: np.dtype | type, column: np.ndarray, fill: object = None) -> np.ndarray:
    """A new column of ``rows`` rows for values derived from ``column``: mapped when ``column`` is and the
    new one is large (:data:`MAP_TAKES_ABOVE`), else an ordinary array; filled with ``fill`` when given."""
    dtype = np.dtype(dtype)
    if rows * dtype.itemsize < MAP_TAKES_ABOVE or not is_mapped(column):
        return np.empty(rows, dtype=dtype) if fill is None else np.full(rows, fill, dtype=dtype)
    if fill is None or fill == 0:
        return empty(rows, dtype)
    step = max(1, SLICE_BYTES // dtype.itemsize)
    piece = np.full(min(step, rows), fill, dtype=dtype)
    return written((piece[:min(step, rows - lo)] for lo in range(0, rows, step)), rows, dtype)


def taken(values: np.ndarray, rows: np.ndarray | slice, count: int) -> np.ndarray:
    """``values[rows]`` (``count`` rows): a mapped column, gathered a piece at a time, when ``values`` or
    ``rows`` is one and the result is large (:data:`MAP_TAKES_ABOVE`); else the plain numpy take."""
    if isinstance(rows, slice) or count * values.itemsize < MAP_TAKES_ABOVE or not (
            is_mapped(values) or is_mapped(rows)):
        return values[rows]
    rows = np.asarray(rows)
    step = max(1, SLICE_BYTES // values.itemsize)
    if rows.dtype == bool:
        pieces = (values[lo:lo + step][rows[lo:lo + step]] for lo in range(0, rows.size, step))
    else:
        pieces = (values[rows[lo:lo + step]] for lo in range(0, rows.size, step))
    return written(pieces, count, values.dtype)


def joined(parts: list[np.ndarray]) -> np.ndarray:
    """``np.concatenate(parts)``: a mapped column when one of them is and the result is large."""
    size = sum(p.size for p in parts)
    dtype = np.result_type(*parts)
    if size * dtype.itemsize < MAP_TAKES_ABOVE or not any(is_mapped(p) for p in parts):
        return np.concatenate(parts)
    return written((piece for part in parts for piece in _pieces(part)), size, dtype)


def converted(values: np.ndarray, dtype: np.dtype | type) -> np.ndarray:
    """``values.astype(dtype)``, mapped a piece at a time when ``values`` is a large mapped column."""
    if values.dtype == dtype or values.nbytes < MAP_TAKES_ABOVE or not is_mapped(values):
        return values.astype(dtype, copy=False)
    return written(_pieces(values), values.size, dtype)


def _pieces(values: np.ndarray) -> Iterator[np.ndarray]:
    """``values`` a piece of :data:`SLICE_BYTES` at a time (views)."""
    step = max(1, SLICE_BYTES // max(values.itemsize, 1))
    for lo in range(0, values.size, step):
        yield values[lo:lo + step]


def _mapping(values: np.ndarray) -> mmap.mmap | None:
    """The mapping under a column (through its views), None for an ordinary array."""
    base = values
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):  # np.frombuffer's base: a view of the mapping
        base = base.obj
    return base if isinstance(base, mmap.mmap) else None


def is_mapped(values: np.ndarray) -> bool:
    """Whether a column (or a view of one) lives in a mapped file."""
    return _mapping(values) is not None


def release() -> int:
    """Let go of the resident pages of every mapped column alive (their data stays in the files); how many
    mappings there are."""
    global _live
    with _lock:
        alive = [(ref, m) for ref in _live if (m := ref()) is not None and not m.closed]
        _live = [ref for ref, _ in alive]
    for _, mapping in alive:
        mapping.madvise(mmap.MADV_DONTNEED)
    return len(alive)


def _file_pages() -> int:
    """Bytes of file pages this process has resident (``RssFile``: its mapped columns, and its libraries)."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"RssFile:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _page() -> None:
    """The pager: while mapped columns are alive, let their pages go whenever more than :data:`RESIDENT`
    bytes of them are resident. Measurements read columns in whole-column operations as well as in slices;
    the kernel would keep every page read until memory runs short, counted as this process's."""
    global _pager
    floor = _file_pages()  # the libraries' pages, not ours to let go
    while True:
        time.sleep(PAGER_EVERY_S)
        with _lock:
            if not any(ref() is not None for ref in _live):
                _pager = None
                return
        if _file_pages() > floor + RESIDENT:
            release()
            floor = _file_pages()  # what is left is not the columns' (libraries loaded since)


def _start_pager() -> None:
    global _pager
    with _lock:
        if _pager is None:
            _pager = threading.Thread(target=_page, name="perfdoctor-pager", daemon=True)
            _pager.start()


def _forked() -> None:
    """A forked child has no pager thread (and its own copies of the mappings): it starts one when it maps."""
    global _pager, _lock
    _pager, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forked)
