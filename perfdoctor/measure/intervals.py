"""Interval algebra over integer-nanosecond intervals, vectorised with numpy.

An *interval set* is a pair of int64 arrays ``(starts, ends)``, sorted, disjoint and non-empty
(``start < end``) — the normal form :func:`union` returns. All measurements (busy time, exposed
communication, idle gaps) are unions, differences and intersections of such sets, so the cost is
one sort plus linear passes, never per-event Python.
"""

from __future__ import annotations

import numpy as np

from perfdoctor.heap import MMAP_ABOVE
from perfdoctor.mapped import like
from perfdoctor.table import stable_order

Intervals = tuple[np.ndarray, np.ndarray]

EMPTY: Intervals = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))


# Inputs longer than this are merged a slice at a time when they come sorted (kernels do): the running
# reach and the masks are a slice's, not the input's (at 10M kernels 100 MB less at once).
SLICE = 1 << 18
# ``a − b`` with ``b`` this many times larger than ``a`` subtracts only the intervals of ``b`` that overlap
# ``a`` (:func:`_overlapping`): one search per interval of ``a`` instead of ``b``'s whole complement.
NEAR_FACTOR = 4


def union(starts: np.ndarray, ends: np.ndarray, where: np.ndarray | None = None) -> Intervals:
    """Merge possibly overlapping intervals into the normal form (touching intervals merge too); only the
    intervals ``where`` is true when that mask is given (``union(starts[where], ends[where])`` without the
    two gathered columns)."""
    if np.size(starts) > SLICE and (merged := _union_sorted(starts, ends, where)) is not None:
        return merged
    if where is not None:
        starts, ends = starts[where], ends[where]
    return _union(np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64))


def _union(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """:func:`union` of int64 columns, whole."""
    keep = ends > starts
    if not keep.all():
        starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return EMPTY
    order = stable_order(starts)  # kernels arrive sorted by start: no sort
    s, e = (starts, ends) if order is None else (starts[order], ends[order])
    reach = np.maximum.accumulate(e)
    # A new merged interval begins where the start lies beyond everything seen so far.
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    np.greater(s[1:], reach[:-1], out=new[1:])
    first = np.flatnonzero(new)
    del new
    merged_starts = s[first]
    # Each merged interval ends where everything up to the row before the next one reaches (written into
    # the result directly: no array of those rows beside it, at 10M kernels 160 MB less at once).
    first -= 1
    merged_ends = np.empty(first.size, dtype=reach.dtype)
    np.take(reach, first[1:], out=merged_ends[:-1])
    merged_ends[-1] = reach[-1]
    return merged_starts, merged_ends


def _union_sorted(starts: np.ndarray, ends: np.ndarray, where: np.ndarray | None) -> Intervals | None:
    """:func:`union` a slice at a time, carrying how far the intervals so far reach; None when the starts
    (of the non-empty intervals ``where`` selects) are not sorted: those need the whole columns' sort. The
    same merge as the whole columns' (the reach before a slice is the whole prefix's), so the same set.

    The merged intervals are written into arrays as long as the input (they are at most that many), not
    gathered in pieces and joined: the joined copy beside its pieces would double the set. Arrays that long
    are mapped on their own (perfdoctor.heap.MMAP_ABOVE) and only the pages written become resident, so the
    result is a view of their beginning; a shorter result is copied out of its heap block. Rows in mapped
    columns (perfdoctor.mapped: a window that is a whole timeline of millions of kernels, one step long)
    give a mapped set: one-step 10M-kernel capture 1,039 → 861 MB peak."""
    bound = starts.size if where is None else int(np.count_nonzero(where))
    out_s, out_e = like(bound, np.int64, starts), like(bound, np.int64, starts)  # mapped where the rows are
    m = 0  # merged intervals so far
    reach: int | None = None  # how far every interval so far reaches
    last = None  # the latest start so far
    for lo in range(0, starts.size, SLICE):
        s = np.asarray(starts[lo:lo + SLICE], dtype=np.int64)
        e = np.asarray(ends[lo:lo + SLICE], dtype=np.int64)
        keep = e > s
        if where is not None:
            keep &= where[lo:lo + SLICE]
        if not keep.all():
            s, e = s[keep], e[keep]
        del keep
        if not s.size:
            continue
        if not (np.all(s[1:] >= s[:-1]) and (last is None or s[0] >= last)):
            return None
        last = int(s[-1])
        r = np.maximum.accumulate(e)
        new = np.empty(s.size, dtype=bool)
        if reach is None:
            new[0] = True
        else:
            np.maximum(r, reach, out=r)
            new[0] = s[0] > reach
        np.greater(s[1:], r[:-1], out=new[1:])
        first = np.flatnonzero(new)
        del new
        if first.size:
            np.take(s, first, out=out_s[m:m + first.size])
            # each merged interval that begins here closes the one before it, at the reach just before
            if first[0] == 0:
                if reach is not None:
                    out_e[m - 1] = reach
                np.take(r, first[1:] - 1, out=out_e[m:m + first.size - 1])
            else:
                np.take(r, first - 1, out=out_e[m - 1:m + first.size - 1])
            m += first.size
        reach = int(r[-1])
    if reach is None:
        return EMPTY
    out_e[m - 1] = reach
    if bound * out_s.itemsize >= MMAP_ABOVE:
        return out_s[:m], out_e[:m]
    return out_s[:m].copy(), out_e[:m].copy()


class Column:
    """An int64 column made a piece at a time (a window's, a slice's), of at most about ``bound`` values.
    Where that many would be mapped on their own (perfdoctor.heap.MMAP_ABOVE), the pieces are written into
    one such array as they come (only the pages written become resident; past the bound it grows) and the
    column is a view of its beginning: no pieces joined beside a copy of them all. Shorter columns are
    the pieces joined."""

    def __init__(self, bound: int) -> None:
        self.mapped = bound * np.dtype(np.int64).itemsize >= MMAP_ABOVE
        self.values = np.empty(bound if self.mapped else 0, dtype=np.int64)
        self.pieces: list[np.ndarray] = []
        self.size = 0

    def add(self, part: np.ndarray) -> None:
        if not self.mapped:
            self.pieces.append(part)
        else:
            if self.size + part.size > self.values.size:
                grown = np.empty(max(2 * self.values.size, self.size + part.size), dtype=np.int64)
                grown[:self.size] = self.values[:self.size]
                self.values = grown
            self.values[self.size:self.size + part.size] = part
        self.size += part.size

    def done(self) -> np.ndarray:
        """The column (the pieces are let go)."""
        if self.mapped:
            return self.values[:self.size]
        pieces, self.pieces = self.pieces, []
        if len(pieces) == 1:
            return pieces[0]
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


def measure(iv: Intervals) -> int:
    """Total length in ns of an interval set in normal form (summed a slice at a time: no array of the
    lengths beside a large set)."""
    return sum(int((iv[1][lo:lo + SLICE] - iv[0][lo:lo + SLICE]).sum()) for lo in range(0, iv[0].size, SLICE))


def measure_within(iv: Intervals, lo: int, hi: int) -> int:
    """``measure(clip(iv, lo, hi))`` without the clipped copy: the intervals inside ``[lo, hi)`` whole, the
    two at its edges cut."""
    first = int(np.searchsorted(iv[1], lo, side="right"))  # the first ending after lo
    last = int(np.searchsorted(iv[0], hi, side="left"))  # past the last starting before hi
    if last <= first:
        return 0
    inside = (iv[0][first:last], iv[1][first:last])
    return measure(inside) - max(0, lo - int(inside[0][0])) - max(0, int(inside[1][-1]) - hi)


def clip(iv: Intervals, lo: int, hi: int) -> Intervals:
    """Restrict a normal-form set to ``[lo, hi)``."""
    s = np.maximum(iv[0], lo)
    e = np.minimum(iv[1], hi)
    keep = e > s
    return s[keep], e[keep]


def complement(iv: Intervals, lo: int, hi: int) -> Intervals:
    """The gaps of a normal-form set inside ``[lo, hi)``."""
    s, e = clip(iv, lo, hi)
    gap_starts = np.concatenate(([lo], e))
    gap_ends = np.concatenate((s, [hi]))
    keep = gap_ends > gap_starts
    return gap_starts[keep], gap_ends[keep]


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Intersection of two normal-form sets (sweep over both boundary lists)."""
    if a[0].size == 0 or b[0].size == 0:
        return EMPTY
    if a[0].dtype == a[1].dtype == b[0].dtype == b[1].dtype and separate(a) and separate(b):
        return _intersect_runs(*((a, b) if a[0].size <= b[0].size else (b, a)))
    return _intersect_pairs(a, b)


def separate(s: Intervals) -> bool:
    """Sorted, non-empty intervals that do not overlap (they may touch: steps, unlike unions, do)."""
    return bool(np.all(s[1] > s[0]) and np.all(s[0][1:] >= s[1][:-1]))


def _intersect_runs(small: Intervals, big: Intervals) -> Intervals:
    """:func:`intersect` of two :func:`separate` sets, as runs: the intervals of ``big`` that overlap one
    interval of ``small`` are consecutive, and only the first and last of each run are cut. A step's gaps
    or busy time (a few steps, a million intervals) is then one copy of the big set instead of a search per
    interval and a dozen passes. Both are separate, so the pieces come in the order, and with the values,
    that the pairwise sweep gives (each piece is non-empty: the sweep keeps them all)."""
    lo = np.searchsorted(big[1], small[0], side="right")  # the first of big ending after each small start
    hi = np.searchsorted(big[0], small[1], side="left")  # past the last of big starting before its end
    counts = np.maximum(hi - lo, 0)
    total = int(counts.sum())
    if total == 0:
        return EMPTY
    some = np.flatnonzero(counts)
    lo, counts = lo[some], counts[some]
    first = np.cumsum(counts) - counts  # where each run begins in the result
    # Each run's rows of big, in one gather (a big interval spanning two small ones is in both runs).
    rows = np.arange(total, dtype=np.int64)
    rows += np.repeat(lo - first, counts)
    starts, ends = big[0][rows], big[1][rows]
    del rows
    last = first + counts - 1
    starts[first] = np.maximum(starts[first], small[0][some])
    ends[last] = np.minimum(ends[last], small[1][some])
    return starts, ends


def _intersect_pairs(a: Intervals, b: Intervals) -> Intervals:
    """:func:`intersect` of any two sets: every overlapping pair (a's order, then b's) cut to its overlap."""
    # For each interval of a, the b intervals that may overlap it are a contiguous run.
    lo = np.searchsorted(b[1], a[0], side="right")
    hi = np.searchsorted(b[0], a[1], side="left")
    counts = np.maximum(hi - lo, 0)
    if counts.sum() == 0:
        return EMPTY
    ai = np.repeat(np.arange(a[0].size), counts)
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    bi = np.repeat(lo, counts) + offsets
    s = np.maximum(a[0][ai], b[0][bi])
    e = np.minimum(a[1][ai], b[1][bi])
    keep = e > s
    return s[keep], e[keep]


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """``a − b`` for normal-form sets."""
    if a[0].size == 0:
        return EMPTY
    if b[0].size == 0:
        return a
    if a[0].size * NEAR_FACTOR < b[0].size:
        b = _overlapping(b, a)
        if b[0].size == 0:
            return a[0].copy(), a[1].copy()
    lo = int(min(a[0][0], b[0][0]))
    hi = int(max(a[1][-1], b[1][-1]))
    return intersect(a, complement(b, lo, hi))


def _overlapping(big: Intervals, small: Intervals) -> Intervals:
    """The intervals of the normal-form set ``big`` that overlap one of ``small``'s (normal form): all that
    ``small − big`` depends on, so its complement is made of them, not of all of ``big`` (the exposed part
    of a group's communication takes the compute intervals around it, not a 10M-kernel trace's all)."""
    lo = np.searchsorted(big[1], small[0], side="right")  # the first of big ending after each small start
    hi = np.searchsorted(big[0], small[1], side="left")  # past the last of big starting before its end
    counts = np.maximum(hi - lo, 0)
    total = int(counts.sum())
    if not total:
        return EMPTY
    some = np.flatnonzero(counts)
    lo, counts = lo[some], counts[some]
    rows = np.arange(total, dtype=np.int64)
    rows += np.repeat(lo - (np.cumsum(counts) - counts), counts)
    # a big interval overlapping two small ones is in both runs, one after the other: once
    rows = rows[np.concatenate(([True], rows[1:] != rows[:-1]))]
    return big[0][rows], big[1][rows]


def overlap_per_interval(starts: np.ndarray, ends: np.ndarray, iv: Intervals) -> np.ndarray:
    """For each (possibly overlapping) input interval, the ns it shares with the normal-form set ``iv`` (or
    any :func:`separate` set: intervals that touch are counted the same as merged).

    Uses prefix sums of ``iv``'s coverage, so it is O((n + m) log m).
    """
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    if iv[0].size == 0 or starts.size == 0:
        return np.zeros(starts.size, dtype=np.int64)
    return _covered_before(ends, iv) - _covered_before(starts, iv)


def _covered_before(t: np.ndarray, iv: Intervals) -> np.ndarray:
    """Length of ``iv`` lying before each time in ``t``."""
    s, e = iv
    k = np.searchsorted(s, t, side="right")  # intervals starting at or before t
    if t.size * NEAR_FACTOR < s.size:  # fewer times than intervals: no prefix sums of all of them
        before = _lengths_before(iv, np.maximum(k - 1, 0))
    else:
        before = np.concatenate(([0], np.cumsum(e - s)))[np.maximum(k - 1, 0)]
    inside = np.where(k > 0, np.minimum(t, e[np.maximum(k - 1, 0)]) - s[np.maximum(k - 1, 0)], 0)
    return before * (k > 0) + np.maximum(inside, 0)


def _lengths_before(iv: Intervals, count: np.ndarray) -> np.ndarray:
    """Total length of the first ``count[j]`` intervals of ``iv``, for each j: the prefix sums a slice of
    ``iv`` at a time, each slice's read where the counts end in it (the prefix sums of all of ``iv`` are
    three arrays of its size)."""
    out = np.zeros(count.size, dtype=np.int64)
    order = np.argsort(count, kind="stable")
    ordered = count[order]
    a = int(np.searchsorted(ordered, 0, side="right"))  # counts of 0: nothing before
    total = 0
    for lo in range(0, iv[0].size, SLICE):
        if a == count.size:
            break
        hi = min(lo + SLICE, iv[0].size)
        cum = np.cumsum(iv[1][lo:hi] - iv[0][lo:hi])
        b = int(np.searchsorted(ordered, hi, side="right"))  # the counts ending in this slice
        out[order[a:b]] = cum[ordered[a:b] - lo - 1] + total
        total += int(cum[-1])
        a = b
    return out
