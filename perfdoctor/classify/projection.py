"""Project CPU-side NVTX ranges onto the GPU work they launched ("NVTX GPU projection").

A GPU operation belongs to an NVTX range when the CUDA API call that launched it (joined on
correlation id inside the same process) lies within the range on the same thread; the innermost such
range (latest start) wins (research/nsys_schema.md §4.1-4.2, the rule nsys' own reports use).
Vectorised: one sort of the ranges per thread, one ``searchsorted`` per launch.
"""

from __future__ import annotations

import numpy as np

from perfdoctor.mapped import like
from perfdoctor.memo import per_object
from perfdoctor.model import Timeline
from perfdoctor.table import Table, distinct, stable_order

NO_RANGE = -1
# How many earlier-starting candidates to try when the latest-starting range on a thread ended before
# the launch (a sibling, not an ancestor). Ranges of one kind are rarely nested deeper than this.
MAX_DEPTH = 8
# Correlation ids up to this many times the call count (plus the slack) use a direct lookup table.
DENSE_FACTOR, DENSE_SLACK = 4, 1 << 20
LOOKUP_SLICE = 1 << 20  # calls entered in the lookup table at once


def launch_calls(ops: Table, api: Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each GPU op, the launching call's (start, end, tid); -1 where no call matches.

    Correlation ids are unique within a process, and both tables belong to one process here.
    """
    return calls_of(ops.col("correlation_id") if len(ops) else np.zeros(0, dtype=np.int64), api)


def calls_of(corr: np.ndarray, api: Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``launch_calls`` for bare correlation ids."""
    start, end, tid = call_columns(corr, api, ("start", "end", "tid"))
    return start, end, tid


def call_columns(corr: np.ndarray, api: Table, columns: tuple[str, ...]) -> tuple[np.ndarray, ...]:
    """``columns`` of :func:`calls_of`, only those: each is a gather from the CUDA calls (at 10M ops, 30 ms
    for each column no one reads)."""
    n = corr.size
    if not n or not len(api):
        return tuple(np.full(n, -1, dtype=np.int64) for _ in columns)
    rows, hit = _rows_of(api, corr)
    if rows.size == n:  # every op found its call (the usual case): the gathers are the answer
        return tuple(api.col(column)[rows] for column in columns)
    out = []
    for column in columns:
        values = np.full(n, -1, dtype=np.int64)
        values[hit] = api.col(column)[rows]
        out.append(values)
    return tuple(out)


def rows_of(api: Table, corr: np.ndarray) -> np.ndarray:
    """Rows of ``api`` holding the correlation ids ``corr`` (those found), in the order of ``corr``."""
    return _rows_of(api, corr)[0] if corr.size and len(api) else np.zeros(0, dtype=np.int64)


def _rows_of(api: Table, want: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row of ``api`` holding each correlation id of ``want`` (for the ``hit`` ones; ids <= 0 never match)."""
    lookup = _lookup_table(api)
    if lookup is not None:
        table, base = lookup
        at = want - base  # the table's index of each id
        inside = want.size and at.min() > 0 and at.max() < table.size  # (at > 0: want > base >= 0)
        looked = table[at if inside else np.where((want > 0) & (at > 0) & (at < table.size), at, 0)]
        hit = looked >= 0  # table[0] is -1: ids <= 0 and ids outside the table (sent to 0) never hit
        return (looked if hit.all() else looked[hit]), hit
    corr = api.col("correlation_id")
    order = stable_order(corr)
    sorted_corr = corr if order is None else corr[order]
    pos = np.minimum(np.searchsorted(sorted_corr, want), max(sorted_corr.size - 1, 0))
    hit = (sorted_corr[pos] == want) & (want > 0)
    return pos[hit] if order is None else order[pos[hit]], hit


@per_object
def _lookup_table(api: Table) -> tuple[np.ndarray, int] | None:
    """Row of each correlation id (index = id − base, −1: none) and the base, built once per API table; None
    when the ids are too sparse for a table. nsys numbers correlation ids densely from 1, so one gather
    replaces a binary search per op. The table spans the ids present: a window's calls (perfdoctor.measure.
    windows), numbered millions in, get a table of their own span, not one from id 0."""
    corr = api.col("correlation_id")
    if not corr.size or corr.min() < 0:
        return None
    base = max(int(corr.min()) - 1, 0)  # index 0 stays below every id: the "no call" entry
    if int(corr.max()) - base > DENSE_FACTOR * corr.size + DENSE_SLACK:
        return None
    # int32 rows while they fit: this table lives as long as the timeline (40 MB, not 80, at 10M calls).
    table = like(int(corr.max()) - base + 1, np.int32 if corr.size < np.iinfo(np.int32).max else np.int64,
                 corr, fill=-1)
    # A slice of calls at a time: the ids' places and the rows of 10M calls are 80 MB of fresh pages at once.
    for lo in range(0, corr.size, LOOKUP_SLICE):
        part = corr[lo:lo + LOOKUP_SLICE]
        table[part - base] = np.arange(lo, lo + part.size, dtype=table.dtype)
    table[0] = -1  # id 0 (or the id below the first): no correlation
    return table, base


def kernel_launch_calls(tl: Timeline,
                        rows: np.ndarray | slice | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``launch_calls`` of a timeline's kernels (of those ``rows`` when given: the comm kernels, a slice).
    Made on each call, not kept for the timeline's life: at 10M kernels the three columns are 240 MB, and
    the lookup they are gathered from (:func:`_lookup_table`) is kept, so making them again is three gathers."""
    corr = tl.kernels.col("correlation_id") if len(tl.kernels) else np.zeros(0, dtype=np.int64)
    return calls_of(corr if rows is None else corr[rows], tl.api)


def enclosing_range(call_start: np.ndarray, call_end: np.ndarray, call_tid: np.ndarray,
                    ranges: Table) -> np.ndarray:
    """Index (row position in ``ranges``) of the innermost range enclosing each call, or ``NO_RANGE``.

    ``ranges`` need columns start, end, tid; only ranges that start and end on the same thread count.
    """
    result = np.full(call_start.size, NO_RANGE, dtype=np.int64)
    if not len(ranges) or not call_start.size:
        return result
    r_start = ranges.col("start")
    r_end = ranges.col("end")
    r_tid = ranges.col("tid")
    same_thread = ranges.col("end_tid") < 0 if "end_tid" in ranges else np.ones(len(ranges), dtype=bool)
    for t in distinct(r_tid[same_thread]):
        sel = np.flatnonzero(same_thread & (r_tid == t))
        sel = sel[np.argsort(r_start[sel], kind="stable")]
        starts, ends = r_start[sel], r_end[sel]
        calls = np.flatnonzero(call_tid == t)
        if not calls.size:
            continue
        cand = np.searchsorted(starts, call_start[calls], side="right") - 1
        pending = np.ones(calls.size, dtype=bool)
        for _ in range(MAX_DEPTH):
            valid = pending & (cand >= 0)
            if not valid.any():
                break
            c = np.where(valid, cand, 0)
            inside = valid & (ends[c] >= call_end[calls])
            result[calls[inside]] = sel[c[inside]]
            pending &= ~inside
            cand = cand - 1
    return result
