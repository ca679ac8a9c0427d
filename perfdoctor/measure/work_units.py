"""The work a timeline's steps held: launches and GPU time of each compute kernel, for ``perfdoctor diff``.

A capture cut by time (``nsys --duration``, a fixed 300 ms window) holds whatever work fitted into it:
a faster run fits more transformer layers. Per-window totals then compare window lengths, not runs.
What the window did is countable, though: how many times each compute kernel ran. Weighted by how long
that kernel takes in one of the two runs, these counts give the work of each window in a common unit
(ms of that run's kernel time), and the time per unit of work compares the runs however much work each
window held (perfdoctor.diff_basis). Communication kernels are left out: their length is mostly
waiting, not work.

The counts cover the timeline's steps (the whole window when there are none), so the unit also
tells when a step of one run holds more work than a step of the other.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from perfdoctor.classify.timeline import category_mask
from perfdoctor.measure.steps import Steps
from perfdoctor.table import Table

# Kernel names kept per timeline, by GPU time: the long tail of tiny kernels adds nothing to the work.
MAX_NAMES = 400
SLICE = 1 << 18  # kernels counted at a time


def kernel_work(kernels: Table, kcls: Table, steps: Steps) -> dict[str, Any] | None:
    """``{"span_ns", "steps", "kernels": {name: [launches, ns]}}`` of the compute kernels that start
    inside the steps; None without any."""
    if not len(steps) or not len(kernels):
        return None
    start, end = kernels.col("start"), kernels.col("end")
    comm = category_mask(kcls, "comm")
    names = kernels["short_name"].values
    counts = np.zeros(len(names), dtype=np.int64)
    ns = np.zeros(len(names))
    # A kernel is inside the last step that starts at or before it when it starts before that step's end. The
    # kernels come sorted by start (perfdoctor.model.Timeline), and so do the steps: each step's kernels are
    # one run of rows, found by two searches per step instead of one per kernel (cut at the next step's
    # first row: a kernel belongs to the latest step started).
    first = np.searchsorted(start, steps.starts, side="left")
    last = np.minimum(np.searchsorted(start, steps.ends, side="left"), np.append(first[1:], start.size))
    inside = np.zeros(start.size, dtype=bool)
    for a, b in zip(first.tolist(), last.tolist()):
        inside[a:b] = True
    # A slice of kernels at a time: no duration per kernel held whole (the sums are of whole nanoseconds,
    # exact in float64, so the slices' sums are one bincount's).
    for lo in range(0, start.size, SLICE):
        mine = inside[lo:lo + SLICE] & ~comm[lo:lo + SLICE]
        codes = kernels["short_name"].codes[lo:lo + SLICE][mine]
        counts += np.bincount(codes, minlength=len(names))
        ns += np.bincount(codes, weights=(end[lo:lo + SLICE] - start[lo:lo + SLICE])[mine], minlength=len(names))
    if not counts.any():
        return None
    order = [j for j in np.argsort(-ns, kind="stable")[:MAX_NAMES] if counts[j]]
    return {"span_ns": int(steps.durations.sum()), "steps": len(steps),
            "kernels": {str(names[j]): [int(counts[j]), int(round(ns[j]))] for j in order}}
