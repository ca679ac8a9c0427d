"""Project CPU-side NVTX ranges onto the GPU work they launched ("NVTX GPU projection").

A GPU operation belongs to an NVTX range when the CUDA API call that launched it (joined on
correlation id inside the same process) lies within the range on the same thread; the innermost such
range (latest start) wins (research/nsys_schema.md §4.1-4.2, the rule nsys' own reports use).
Vectorised: one sort of the ranges per thread, one ``searchsorted`` per launch.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfdoctor.memo import per_object
from perfdoctor.model import Timeline

NO_RANGE = -1
# How many earlier-starting candidates to try when the latest-starting range on a thread ended before
# the launch (a sibling, not an ancestor). Ranges of one kind are rarely nested deeper than this.
MAX_DEPTH = 8


def launch_calls(ops: pd.DataFrame, api: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each GPU op, the launching call's (start, end, tid); -1 where no call matches.

    Correlation ids are unique within a process, and both tables belong to one process here.
    """
    n = len(ops)
    start = np.full(n, -1, dtype=np.int64)
    end = np.full(n, -1, dtype=np.int64)
    tid = np.full(n, -1, dtype=np.int64)
    if not n or not len(api):
        return start, end, tid
    corr = api["correlation_id"].to_numpy()
    # Correlation ids grow with call order, so the table is usually sorted already.
    order = np.arange(corr.size) if np.all(corr[1:] >= corr[:-1]) else np.argsort(corr, kind="stable")
    sorted_corr = corr[order]
    want = ops["correlation_id"].to_numpy()
    pos = np.searchsorted(sorted_corr, want)
    pos_ok = np.minimum(pos, sorted_corr.size - 1)
    hit = (pos < sorted_corr.size) & (sorted_corr[pos_ok] == want) & (want > 0)
    rows = order[pos_ok[hit]]
    start[hit] = api["start"].to_numpy()[rows]
    end[hit] = api["end"].to_numpy()[rows]
    tid[hit] = api["tid"].to_numpy()[rows]
    return start, end, tid


@per_object
def kernel_launch_calls(tl: Timeline) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``launch_calls`` of all of a timeline's kernels, computed once (several detectors need them)."""
    return launch_calls(tl.kernels, tl.api)


def enclosing_range(call_start: np.ndarray, call_end: np.ndarray, call_tid: np.ndarray,
                    ranges: pd.DataFrame) -> np.ndarray:
    """Index (row position in ``ranges``) of the innermost range enclosing each call, or ``NO_RANGE``.

    ``ranges`` need columns start, end, tid; only ranges that start and end on the same thread count.
    """
    result = np.full(call_start.size, NO_RANGE, dtype=np.int64)
    if not len(ranges) or not call_start.size:
        return result
    r_start = ranges["start"].to_numpy()
    r_end = ranges["end"].to_numpy()
    r_tid = ranges["tid"].to_numpy()
    same_thread = ranges["end_tid"].to_numpy() < 0 if "end_tid" in ranges else np.ones(len(ranges), dtype=bool)
    for t in np.unique(r_tid[same_thread]):
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
