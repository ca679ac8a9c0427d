"""Columns handed over through the Arrow C data interface, copied into numpy arrays.

connectorx reads SQLite in Rust and hands each column chunk over as a pair of pointers to the C
structs ``ArrowArray`` and ``ArrowSchema`` (https://arrow.apache.org/docs/format/CDataInterface.html,
a stable ABI). pyarrow's import of them costs 70 ms of start-up, and its ``to_numpy`` imports pandas
where that is installed (another 250 ms); the numbers need neither: this module reads the structs
with ctypes, copies the buffers of a column's chunks into one numpy array and releases every struct
(which frees the Rust side's memory), so a chunk is never imported twice nor leaked.

Types: the integers, floats and booleans connectorx gives for SQLite columns, and UTF-8 text or
binary. A numeric column with NULLs becomes float with NaN, text an object array with None, as
pyarrow's ``to_numpy`` gives them.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Mapping

import numpy as np

from perfdoctor.heap import give_back_freed
from perfdoctor.width import fits


class ArrowSchema(ctypes.Structure):
    """``struct ArrowSchema`` of the C data interface."""


class ArrowArray(ctypes.Structure):
    """``struct ArrowArray`` of the C data interface."""


ArrowSchema._fields_ = [
    ("format", ctypes.c_char_p), ("name", ctypes.c_char_p), ("metadata", ctypes.c_char_p),
    ("flags", ctypes.c_int64), ("n_children", ctypes.c_int64),
    ("children", ctypes.POINTER(ctypes.POINTER(ArrowSchema))), ("dictionary", ctypes.POINTER(ArrowSchema)),
    ("release", ctypes.CFUNCTYPE(None, ctypes.POINTER(ArrowSchema))), ("private_data", ctypes.c_void_p),
]
ArrowArray._fields_ = [
    ("length", ctypes.c_int64), ("null_count", ctypes.c_int64), ("offset", ctypes.c_int64),
    ("n_buffers", ctypes.c_int64), ("n_children", ctypes.c_int64),
    ("buffers", ctypes.POINTER(ctypes.c_void_p)), ("children", ctypes.POINTER(ctypes.POINTER(ArrowArray))),
    ("dictionary", ctypes.POINTER(ArrowArray)),
    ("release", ctypes.CFUNCTYPE(None, ctypes.POINTER(ArrowArray))), ("private_data", ctypes.c_void_p),
]

# Format strings of fixed-width numbers (and their numpy types); "b" is bit-packed booleans.
NUMBERS = {b"c": np.int8, b"C": np.uint8, b"s": np.int16, b"S": np.uint16, b"i": np.int32, b"I": np.uint32,
           b"l": np.int64, b"L": np.uint64, b"f": np.float32, b"g": np.float64}
# Variable-width text and binary: the width of their offsets.
VARIABLE = {b"u": np.int32, b"U": np.int64, b"z": np.int32, b"Z": np.int64}


def columns(batches: Iterable[Iterable[tuple[int, int]]], names: list[str],
            narrow: Mapping[str, type[np.integer]] | None = None) -> dict[str, np.ndarray]:
    """The columns ``names`` of a result given as record batches, each one ``(ArrowArray address,
    ArrowSchema address)`` pair per column, in order. Every struct is released, also when a column's
    type cannot be read (then ``ValueError`` naming it). ``narrow``: integer columns to copy out as that
    type where every value fits it and none is NULL (:func:`perfdoctor.width.fitted`, without the 64-bit
    copy in between); any other stays as it is read."""
    batches = [list(batch) for batch in batches]
    try:
        out = {}
        for i, name in enumerate(names):
            arrays = [ArrowArray.from_address(batch[i][0]) for batch in batches]
            formats = [ArrowSchema.from_address(batch[i][1]).format for batch in batches]
            try:
                out[name] = _join(arrays, formats, (narrow or {}).get(name))
            except ValueError as exc:
                raise ValueError(f"column {name}: {exc}") from None
            # Each column of a batch is its own struct: freeing its chunks now, not after the last column,
            # keeps one copy of the table (the numpy one) plus the rest of the Arrow one, not two.
            release([batch[i]] for batch in batches)
            give_back_freed(out[name].nbytes)
        return out
    finally:
        release(batches)


def release(batches: Iterable[Iterable[tuple[int, int]]]) -> None:
    """Release every array and schema of a result (frees the producer's memory; a struct already
    released has no release callback left and is skipped)."""
    for batch in batches:
        for array_addr, schema_addr in batch:
            for struct in (ArrowArray.from_address(array_addr), ArrowSchema.from_address(schema_addr)):
                if struct.release:
                    struct.release(ctypes.byref(struct))


def _join(arrays: list[ArrowArray], formats: list[bytes], narrow: type[np.integer] | None = None) -> np.ndarray:
    fmt = formats[0] if formats else b"l"
    if any(f != fmt for f in formats):
        raise ValueError(f"chunks of one column with different Arrow types: {sorted(set(formats))}")
    total = sum(a.length for a in arrays)
    nulls = sum(a.null_count for a in arrays) > 0
    if fmt in NUMBERS or fmt == b"b":
        dtype = np.dtype(NUMBERS.get(fmt, np.bool_))
        narrowed = _narrowed(arrays, dtype, narrow) if narrow is not None and not nulls and dtype.kind in "iu" else None
        if narrowed is not None:
            return narrowed
        out = np.empty(total, dtype=np.float64 if nulls else dtype)
        at = 0
        for a in arrays:
            out[at:at + a.length] = _values(a, dtype)
            if a.null_count:
                out[at:at + a.length][~_valid(a)] = np.nan
            at += a.length
        return out
    if fmt in VARIABLE:
        text = fmt in (b"u", b"U")
        values: list = []
        for a in arrays:
            values.extend(_strings(a, np.dtype(VARIABLE[fmt]), text))
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out
    raise ValueError(f"Arrow type {fmt.decode(errors='replace')!r} is not read")


def _narrowed(arrays: list[ArrowArray], dtype: np.dtype, narrow: type[np.integer]) -> np.ndarray | None:
    """The chunks of a NULL-free integer column copied into one array of type ``narrow``, each chunk checked
    (:func:`perfdoctor.width.fits`) just before it is cast into place, while it is still in the cache; None
    at the first chunk whose values do not all fit (the caller copies the column as it is)."""
    out = np.empty(sum(a.length for a in arrays), dtype=narrow)
    at = 0
    for a in arrays:
        values = _values(a, dtype)
        if not fits(values, narrow):
            return None
        out[at:at + a.length] = values
        at += a.length
    return out


def _buffer(a: ArrowArray, i: int, dtype: np.dtype, count: int) -> np.ndarray:
    """Buffer ``i`` of a chunk as ``count`` items of ``dtype``, without copying (valid until released)."""
    address = a.buffers[i]
    if not address or count <= 0:
        return np.zeros(max(count, 0), dtype=dtype)
    return np.frombuffer((ctypes.c_char * (count * dtype.itemsize)).from_address(address), dtype=dtype)


def _bits(a: ArrowArray, i: int) -> np.ndarray:
    """Bit-packed buffer ``i`` (validity or booleans) as one bool per value."""
    raw = _buffer(a, i, np.dtype(np.uint8), (a.offset + a.length + 7) // 8)
    return np.unpackbits(raw, count=a.offset + a.length, bitorder="little")[a.offset:].astype(bool)


def _valid(a: ArrowArray) -> np.ndarray:
    if not a.null_count or not a.buffers[0]:
        return np.ones(a.length, dtype=bool)
    return _bits(a, 0)


def _values(a: ArrowArray, dtype: np.dtype) -> np.ndarray:
    if dtype == np.bool_:
        return _bits(a, 1)
    return _buffer(a, 1, dtype, a.offset + a.length)[a.offset:]


def _strings(a: ArrowArray, offset_type: np.dtype, text: bool) -> list:
    """The values of a text or binary chunk as str or bytes, None where NULL."""
    offsets = _buffer(a, 1, offset_type, a.offset + a.length + 1)[a.offset:]
    size = int(offsets[-1]) if offsets.size else 0
    data = _buffer(a, 2, np.dtype(np.uint8), size).tobytes()
    valid = _valid(a)
    bounds = offsets.tolist()
    return [(data[s:e].decode("utf-8", errors="replace") if text else data[s:e]) if ok else None
            for s, e, ok in zip(bounds[:-1], bounds[1:], valid.tolist())]
