"""Per-group reductions over rows that share a key, with numpy alone.

The cross-rank matching (:mod:`perfdoctor.measure.peers`) runs for every multi-GPU file in the main
process, and pandas alone costs ~0.2 s to import (issue 16: start-up), so its group-bys are done here:
rows get dense integer group codes in the sorted order of their key tuples (as a pandas group-by
orders its groups), and each reduction is one sort plus reads at the group boundaries. Sorts are on
single int64 keys made unique by the row number (numpy's fastest sort), not multi-key lexsorts.
"""

from __future__ import annotations

import numpy as np

# Packed keys stay below this, so that multiplying by one more key's span cannot overflow int64.
_PACK_LIMIT = 2**62


class Groups:
    """Rows (0..len-1) partitioned by key: ``codes[row]`` is the row's group, numbered 0..n-1 in the
    sorted order of the key tuples; ``order`` lists the rows group by group, each group's rows in row
    order; a group's rows are ``order[starts[j]:ends[j]]``. Groups made by :func:`groups` each have a
    row; the reductions need that."""

    def __init__(self, codes: np.ndarray, n: int, order: np.ndarray | None = None) -> None:
        self.codes, self.n = codes, n
        if order is None:
            in_order = codes.size < 2 or bool((codes[1:] >= codes[:-1]).all())  # e.g. rows already by rank
            order = np.arange(codes.size) if in_order else _within(codes, np.arange(codes.size))
        self.order = order
        self.size = np.bincount(codes, minlength=n)
        self.ends = np.cumsum(self.size)
        self.starts = self.ends - self.size

    def first(self, values: np.ndarray) -> np.ndarray:
        """Per group, the value of its first row (a group's key when ``values`` is a key column)."""
        return values[self.order[self.starts]]

    def position(self) -> np.ndarray:
        """Per row, its place among its group's rows (0, 1, … in row order)."""
        out = np.empty(self.codes.size, dtype=np.int64)
        out[self.order] = np.arange(self.codes.size) - np.repeat(self.starts, self.size)
        return out

    def rows(self, j: int) -> np.ndarray:
        return self.order[self.starts[j]:self.ends[j]]

    def sum(self, values: np.ndarray) -> np.ndarray:
        """Per group, the sum of ``values`` in their dtype (integers stay exact)."""
        if not self.n:
            return np.zeros(0, dtype=values.dtype)
        return np.add.reduceat(values[self.order], self.starts)

    def min(self, values: np.ndarray) -> np.ndarray:
        if not self.n:
            return np.zeros(0, dtype=values.dtype)
        return np.minimum.reduceat(values[self.order], self.starts)

    def median(self, values: np.ndarray) -> np.ndarray:
        """Per group, the float64 median of ``values``: the middle value, or the mean of the two middle
        ones ((lo + hi) / 2 after converting each to float64, as numpy and pandas compute it)."""
        if not self.n:
            return np.zeros(0)
        lo, hi = self.starts + (self.size - 1) // 2, self.starts + self.size // 2
        if values.dtype.kind in "iu" and int(values.max()) - int(values.min()) < _PACK_LIMIT:
            # Integers: each value's distance from its group's minimum, behind its group code, in one key.
            base = self.min(values).astype(np.int64)
            offset = values.astype(np.int64) - base[self.codes]
            span = int(offset.max()) + 1
            if self.n * span < _PACK_LIMIT:
                ordered = np.sort(self.codes * span + offset)
                group = np.arange(self.n)
                return ((ordered[lo] - group * span + base).astype(np.float64)
                        + (ordered[hi] - group * span + base).astype(np.float64)) / 2
        v = values.astype(np.float64)
        by_value = np.argsort(v)  # ties in any order: they are the same value
        rank = np.empty(v.size, dtype=np.int64)
        rank[by_value] = np.arange(v.size)
        ordered = v[by_value][_within(self.codes, rank)]
        return (ordered[lo] + ordered[hi]) / 2

    def first_max(self, values: np.ndarray) -> np.ndarray:
        """Per group, the row holding its largest value — on ties its first row (pandas' idxmax)."""
        if not self.n:
            return np.zeros(0, dtype=np.int64)
        ordered = values[self.order]
        top = ordered == np.maximum.reduceat(ordered, self.starts)[self.codes[self.order]]
        rows, codes = self.order[top], self.codes[self.order[top]]  # group by group, in row order
        return rows[np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])]


def groups(*keys: np.ndarray) -> Groups:
    """Group rows by the tuple of equal-length integer ``keys`` (lexicographic order of the tuples)."""
    rows = keys[0].size
    if not rows:
        return Groups(np.zeros(0, dtype=np.int64), 0)
    packed, span = np.zeros(rows, dtype=np.int64), 1
    for key in keys:
        code, key_span = _narrow(key)
        if span * key_span >= _PACK_LIMIT:
            packed, span = _narrow(packed, span)
        packed = packed * key_span + code
        span *= key_span
    bits = max(rows - 1, 1).bit_length()
    if span << bits >= _PACK_LIMIT:
        packed, span = _narrow(packed, span)
    # One sort of (packed key, row) gives the order, the groups' boundaries and their codes.
    ordered = np.sort((packed << bits) | np.arange(rows))
    order, key = ordered & ((1 << bits) - 1), ordered >> bits
    new = np.empty(rows, dtype=bool)
    new[0], new[1:] = True, key[1:] != key[:-1]
    codes = np.empty(rows, dtype=np.int64)
    codes[order] = np.cumsum(new) - 1
    return Groups(codes, int(codes[order[-1]]) + 1, order)


def _narrow(key: np.ndarray, span: int | None = None) -> tuple[np.ndarray, int]:
    """Non-negative int64 codes in the order of ``key``'s values, and their span: the offset from the
    minimum where the values lie in a range not much wider than the rows (``span``: the range of a
    non-negative key when known), else the rank among the distinct values (a sort)."""
    lo = 0 if span is not None else int(key.min())
    hi = span - 1 if span is not None else int(key.max())
    if hi - lo < 4 * key.size + 1024:
        offset = (key - key.dtype.type(lo)).astype(np.int64) if key.dtype.kind == "u" else key.astype(np.int64) - lo
        return offset, hi - lo + 1
    values, inverse = np.unique(key, return_inverse=True)
    return inverse.astype(np.int64), int(values.size)


def _within(codes: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """``rank`` (a permutation of 0..len-1) sorted by the rows' group code, then by itself: a plain sort
    of one int64 key per row, several times faster than an argsort (the rank is the key's low bits)."""
    bits = max(rank.size - 1, 1).bit_length()
    return np.sort((codes.astype(np.int64) << bits) | rank) & ((1 << bits) - 1)
