"""Event tables as named numpy columns: what a Timeline holds instead of pandas DataFrames.

Every measurement reads whole columns and does numpy interval algebra on them, so a table needs only
equal-length columns, row selection (``take``) and dictionary-encoded strings. pandas gave that at
about 0.2 s of import per run and an extra copy per column (issue 16: a small file's whole analysis
must fit in 0.3 s above ``python -c pass``); these classes give it at no import cost.

Strings that repeat (kernel names, CUDA call names) are :class:`Strings`: codes into the distinct
values, as narrow as their number allows (:func:`perfdoctor.width.code_type`), decoded only where a
measurement needs the text of a few rows. A column that holds one value for the whole table (a
timeline's process and device) is a read-only broadcast of it: :meth:`Table.take` keeps it one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from perfdoctor.mapped import is_mapped, joined, like, taken
from perfdoctor.width import code_type

# Integer keys spanning at most this many values per row are factorized through a lookup table (O(n))
# instead of a sort.
_DENSE_SPAN_PER_ROW = 4
_CONCAT_SLICE = 1 << 20  # string codes remapped at a time by Strings.concat
_COMPARED_HITS = 4  # Strings masks of up to this many hit values compare codes (two passes each) instead of gathering


class Strings:
    """A dictionary-encoded string column: ``values[codes]`` is the text of every row.

    ``values`` are distinct (an object array; ``None`` may be one of them) and ``codes`` index them.
    """

    __slots__ = ("codes", "values", "__weakref__")

    def __init__(self, codes: np.ndarray, values: np.ndarray) -> None:
        self.codes = np.asarray(codes)
        self.values = np.asarray(values, dtype=object)

    @classmethod
    def encode(cls, text: Iterable[Any]) -> Strings:
        """Encode plain values (first-appearance order of the distinct values)."""
        codes, values = factorize(np.asarray(text, dtype=object), keep_missing=True)
        return cls(codes.astype(code_type(values.size), copy=False), values)

    def __len__(self) -> int:
        return self.codes.size

    def __iter__(self) -> Iterator[Any]:
        return iter(self.decode())

    def __getitem__(self, rows: Any) -> Any:
        if isinstance(rows, (int, np.integer)):
            return self.values[self.codes[rows]]
        return Strings(self.codes[rows], self.values)

    def decode(self) -> np.ndarray:
        """The text of every row, as an object array."""
        return self.values[self.codes] if self.codes.size else np.zeros(0, dtype=object)

    def mask(self, *wanted: Any) -> np.ndarray:
        """Rows whose text is one of ``wanted``: compared once per distinct value."""
        return self._hit_rows(np.array([v in wanted for v in self.values], dtype=bool))

    def where(self, predicate: Any) -> np.ndarray:
        """Rows whose text satisfies ``predicate`` (called once per distinct value)."""
        return self._hit_rows(np.array([bool(predicate(v)) for v in self.values], dtype=bool))

    def _hit_rows(self, hit: np.ndarray) -> np.ndarray:
        """``hit[codes]``, whether each row's value is a hit: the rows' codes compared with the few hit codes
        (a code −k is value n − k, as indexing reads it), else gathered. A compare of narrow codes is
        vectorised; a gather is a lookup per row: 2 ms against 19 ms for 10M int8 codes and one hit value."""
        if not hit.size:
            return np.zeros(self.codes.size, dtype=bool)
        at = np.flatnonzero(hit).tolist()
        if len(at) > _COMPARED_HITS:
            return hit[self.codes]
        out = np.zeros(self.codes.size, dtype=bool)
        for code in at:
            out |= self.codes == code
            out |= self.codes == code - hit.size
        return out

    def map(self, function: Any, dtype: Any = object) -> np.ndarray:
        """``function`` of every row's text, computed once per distinct value."""
        out = np.array([function(v) for v in self.values], dtype=dtype)
        return out[self.codes] if out.size else np.zeros(self.codes.size, dtype=dtype)

    @staticmethod
    def concat(parts: list[Strings]) -> Strings:
        """One column from several, with the distinct values merged."""
        values = np.concatenate([p.values for p in parts]) if parts else np.zeros(0, dtype=object)
        offsets = np.cumsum([0] + [p.values.size for p in parts[:-1]])
        if not parts:
            return Strings(np.zeros(0, dtype=np.int8), values)
        remap, distinct = factorize(values, keep_missing=True)
        remap = remap.astype(code_type(distinct.size))
        codes = [p.codes for p in parts]
        # mapped (perfdoctor.mapped) when a part is; the codes remapped a slice at a time either way
        out = like(sum(c.size for c in codes), remap.dtype, next((c for c in codes if is_mapped(c)), codes[0]))
        at = 0
        for part, offset in zip(codes, offsets):
            for lo in range(0, part.size, _CONCAT_SLICE):
                piece = part[lo:lo + _CONCAT_SLICE]
                out[at:at + piece.size] = remap[piece.astype(np.int64) + offset]
                at += piece.size
        return Strings(out, distinct)


Column = np.ndarray | Strings


class Table:
    """Equal-length named columns (numpy arrays or :class:`Strings`), one row per event."""

    __slots__ = ("_columns", "_rows", "__weakref__")

    def __init__(self, columns: Mapping[str, Any] | None = None, rows: int | None = None) -> None:
        self._columns: dict[str, Column] = {}
        self._rows = rows
        for name, values in (columns or {}).items():
            self[name] = values
        if self._rows is None:
            self._rows = 0

    @classmethod
    def empty(cls, names: Iterable[str], dtype: Any = np.int64) -> Table:
        return cls({n: np.zeros(0, dtype=dtype) for n in names}, rows=0)

    def __len__(self) -> int:
        return int(self._rows or 0)

    def __contains__(self, name: object) -> bool:
        return name in self._columns

    def __getitem__(self, key: str | np.ndarray | slice) -> Any:
        """A column by name; rows (``take``) by positions, a boolean mask or a slice."""
        return self._columns[key] if isinstance(key, str) else self.take(key)

    def __setitem__(self, name: str, values: Any) -> None:
        if not isinstance(values, Strings):
            values = np.asarray(values)
        if self._rows is None:
            self._rows = len(values)
        elif len(values) != self._rows:
            raise ValueError(f"column {name!r} has {len(values)} rows, the table {self._rows}")
        self._columns[name] = values

    def get(self, name: str, default: Any = None) -> Any:
        return self._columns.get(name, default)

    @property
    def columns(self) -> list[str]:
        return list(self._columns)

    @property
    def nbytes(self) -> int:
        """Bytes of the columns' arrays (a string column's codes; an object column's pointers)."""
        return sum(v.codes.nbytes if isinstance(v, Strings) else v.nbytes for v in self._columns.values())

    @property
    def nbytes_in_memory(self) -> int:
        """Bytes of the columns' arrays that are not mapped files (perfdoctor.mapped)."""
        return sum(0 if is_mapped(codes := v.codes if isinstance(v, Strings) else v) else codes.nbytes
                   for v in self._columns.values())

    def col(self, name: str, dtype: Any = None) -> np.ndarray:
        """A column as a plain array (strings decoded), converted to ``dtype`` when given."""
        values = self._columns[name]
        if isinstance(values, Strings):
            values = values.decode()
        return values if dtype is None else values.astype(dtype, copy=False)

    def take(self, rows: np.ndarray | slice) -> Table:
        """The rows at integer positions, under a boolean mask, or in a slice, in that order. A column
        that is one value broadcast stays one (indexing it would copy the value once per row)."""
        n = _count(rows, len(self))
        return Table({name: _rows_of(values, rows, n) for name, values in self._columns.items()}, rows=n)

    def equals(self, other: Table) -> bool:
        """Same columns in the same order with the same values (strings compared as text, NaN equal)."""
        if self.columns != other.columns or len(self) != len(other):
            return False
        for name in self.columns:
            a, b = self.col(name), other.col(name)
            if a.dtype.kind == "f" and b.dtype.kind == "f":
                if not np.array_equal(a, b, equal_nan=True):
                    return False
            elif a.tolist() != b.tolist():
                return False
        return True

    def rows(self) -> Iterator[Any]:
        """Each row as a named tuple of Python values (strings decoded): for tests and small tables."""
        from collections import namedtuple

        Row = namedtuple("Row", self.columns)  # noqa: PYI024 - field names are the table's columns
        columns = [self.col(name).tolist() for name in self.columns]
        return (Row(*values) for values in zip(*columns))

    def select(self, names: Iterable[str]) -> Table:
        """The named columns only (no copy)."""
        return Table({n: self._columns[n] for n in names}, rows=len(self))

    def sorted_by(self, name: str) -> Table:
        """Rows in order of one column (stable); the table itself when already in order."""
        order = stable_order(self._columns[name])
        return self if order is None else self.take(order)

    @staticmethod
    def concat(parts: list[Table]) -> Table:
        """Rows of several tables with the same columns, one after another."""
        names = parts[0].columns
        out: dict[str, Column] = {}
        for name in names:
            cols = [p[name] for p in parts]
            out[name] = Strings.concat(cols) if isinstance(cols[0], Strings) else joined(cols)
        return Table(out, rows=sum(len(p) for p in parts))

    def __repr__(self) -> str:
        return f"Table({len(self)} rows: {', '.join(self._columns)})"


def stable_order(values: np.ndarray) -> np.ndarray | None:
    """The rows of ``values`` in ascending order (a stable sort: ties keep row order); None, and no sort, when
    they already are (kernels by start, CUDA calls by correlation id, as nsys writes them)."""
    if values.size < 2 or bool(np.all(values[1:] >= values[:-1])):
        return None
    return np.argsort(values, kind="stable")


def starts_in_order(table: Table) -> tuple[np.ndarray, np.ndarray | None]:
    """A table's starts in ascending order and the rows that put them so (a stable sort: ties keep row order),
    the order None where the rows already are (kernels, and CUDA calls and copies as nsys writes them: then the
    starts are the table's own column). For whoever searches a table by time many times (windows of steps,
    the host gaps' next ops, the critical path's ops): sorted once, searched by every window."""
    start = table.col("start") if len(table) else np.zeros(0, dtype=np.int64)
    order = stable_order(start)
    return (start, None) if order is None else (start[order], order)


def repeated(values: np.ndarray, rows: int) -> np.ndarray:
    """``values[0]`` as a read-only column of ``rows`` rows of ``values``' type, held once."""
    return np.broadcast_to(values[:1], (rows,))


def is_repeated(values: Column) -> bool:
    """Whether a column is one value broadcast over its rows (:func:`repeated`)."""
    return isinstance(values, np.ndarray) and values.ndim == 1 and values.size > 1 and values.strides == (0,)


def _rows_of(values: Column, rows: np.ndarray | slice, n: int) -> Column:
    """A column's rows: a broadcast one stays one; a large take from a mapped one is mapped
    (:func:`perfdoctor.mapped.taken`)."""
    if isinstance(values, Strings):
        return Strings(taken(values.codes, rows, n), values.values)
    return repeated(values, n) if is_repeated(values) else taken(values, rows, n)


def _count(rows: np.ndarray | slice, length: int) -> int:
    """How many rows a ``take`` of ``rows`` from ``length`` rows gives."""
    if isinstance(rows, slice):
        return len(range(length)[rows])
    rows = np.asarray(rows)
    if rows.dtype == bool:
        if rows.shape != (length,):
            raise IndexError(f"boolean index of {rows.size} rows for a table of {length}")
        return int(np.count_nonzero(rows))
    return rows.size


def distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)``: for integers of a small range (stream ids, codes) which of them occur, marked in
    a table of the range (:func:`_dense`, as :func:`factorize` sorted), neither sorted nor hashed; others
    sorted, by np.unique asked for counts too (plain, numpy 2.3+ hashes them, and asks numpy.ma whether the
    array is masked: importing it took 8 ms of start-up, inside the critical path's first window at 1M)."""
    if not values.size:
        return values.flatten()
    if (dense := _dense(values)) is not None:
        numbers, shifted, span = dense
        # in the values' own type, wrapping around exactly as the shift did
        return (np.flatnonzero(_present(shifted, span)).astype(numbers.dtype) + numbers.min()).astype(values.dtype)
    return np.unique(values, return_counts=True)[0]


def _dense(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, int] | None:
    """For integers (or booleans) of a small range: the values as numbers (booleans as bytes, narrow signed
    integers widened: an int8 −100..100 shifted would wrap), their offsets from the smallest as int64, and
    the range's size; None for any others."""
    if values.dtype.kind not in "iub":
        return None
    lo, hi = int(values.min()), int(values.max())
    if hi - lo > _DENSE_SPAN_PER_ROW * values.size + 1024:
        return None
    numbers = values.view(np.uint8) if values.dtype.kind == "b" else values
    if numbers.dtype.kind == "i" and numbers.dtype.itemsize < 8:
        numbers = numbers.astype(np.int64)
    return numbers, (numbers - numbers.min()).astype(np.int64), hi - lo + 1


def _present(shifted: np.ndarray, span: int) -> np.ndarray:
    """Which offsets of the range (:func:`_dense`) occur."""
    present = np.zeros(span, dtype=bool)
    present[shifted] = True
    return present


def factorize(values: np.ndarray, *, sort: bool = False, keep_missing: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(codes, distinct)`` with ``distinct[codes] == values``, as ``pandas.factorize``: distinct values
    in order of first appearance (ascending with ``sort``); None and NaN get code −1 and are left out
    of ``distinct``, or with ``keep_missing`` are values of their own.

    Small-range integers use a lookup table (no sort), other numbers a sort, objects a dict.
    """
    values = np.asarray(values)
    n = values.size
    if n == 0:
        return np.zeros(0, dtype=np.int64), values[:0]
    if (dense := _dense(values)) is not None:
        numbers, shifted, span = dense
        if sort:  # which values occur is enough: no first appearances to find
            present = _present(shifted, span)
            code_of = np.cumsum(present, dtype=np.int64) - 1
            # In the values' own type, wrapping around exactly as the shift did.
            distinct = (np.flatnonzero(present).astype(numbers.dtype) + numbers.min()).astype(values.dtype)
            return code_of[shifted], distinct
        first = np.full(span, n, dtype=np.int64)
        np.minimum.at(first, shifted, np.arange(n))
        distinct = np.flatnonzero(first < n)
        distinct = distinct[np.argsort(first[distinct], kind="stable")]
        code_of = np.zeros(first.size, dtype=np.int64)
        code_of[distinct] = np.arange(distinct.size)
        return code_of[shifted], values[first[distinct]]
    if values.dtype.kind in "iufbmM":
        distinct, first, inverse = np.unique(values, return_index=True, return_inverse=True, equal_nan=True)
        inverse = inverse.reshape(-1).astype(np.int64, copy=False)
        if not sort:
            order = np.argsort(first, kind="stable")
            rank = np.empty(order.size, dtype=np.int64)
            rank[order] = np.arange(order.size)
            inverse, distinct = rank[inverse], distinct[order]
        if not keep_missing and values.dtype.kind == "f" and np.isnan(distinct).any():
            missing = np.isnan(distinct)
            new = np.where(missing, -1, np.cumsum(~missing) - 1)
            inverse, distinct = new[inverse], distinct[~missing]
        return inverse, distinct
    items = values.tolist()
    first_seen = dict.fromkeys(items)  # distinct values in order of appearance, in C
    # NaNs (each its own key there) can only be floats: the per-value test runs only where a float is
    floats = any(issubclass(t, float) for t in set(map(type, first_seen)))
    if floats and any(isinstance(v, float) and v != v for v in first_seen):
        index: dict[Any, int] = {}
        codes = np.fromiter((index.setdefault(_key(v), len(index)) for v in items), dtype=np.int64, count=n)
        distinct = np.empty(len(index), dtype=object)
        for key, code in index.items():
            distinct[code] = np.nan if key is _NAN else key
        missing = np.array([v is None or v is _NAN for v in index], dtype=bool)
    else:  # the keys are the values themselves, in code order: no loop in Python over them
        index = dict(zip(first_seen, range(len(first_seen))))
        codes = np.fromiter(map(index.__getitem__, items), dtype=np.int64, count=n)
        distinct = np.fromiter(first_seen, dtype=object, count=len(first_seen))
        missing = np.zeros(len(index), dtype=bool)
        if None in index:
            missing[index[None]] = True
    if sort or (missing.any() and not keep_missing):
        order = np.arange(distinct.size)
        if sort:
            order = np.array(sorted(order, key=lambda i: (missing[i], str(distinct[i]))), dtype=np.int64)
        if not keep_missing:
            order = order[~missing[order]]
        new = np.full(distinct.size, -1, dtype=np.int64)
        new[order] = np.arange(order.size)
        codes, distinct = new[codes], distinct[order]
    return codes, distinct


class _Nan:
    """One key for every float NaN (NaN != NaN, so a dict would keep each apart)."""


_NAN = _Nan()


def _key(value: Any) -> Any:
    return _NAN if isinstance(value, float) and value != value else value
