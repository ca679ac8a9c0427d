"""One device's timeline measured a window of whole steps at a time (DESIGN §1 "Execution": memory bounded
per piece of a file).

The interval sets a device's measurements share (what ran, what computed, what communicated, each group's
exposed communication, the host gaps) grow with the trace: at 10M kernels they are several hundred MB held
together. Every per-step measurement clips them to its steps, so a run of whole steps can be measured on
its own, from the rows that reach into it:

- a window's **span** is ``[lo, hi)``: from its first step's start (for the first window, from the start of
  the capture) to the later of the next window's first step start (the end of the capture for the last)
  and its steps' last end (steps may overlap);
- its **rows** are the device ops (kernels, copies, fills) that overlap the span, and the first of each
  table that starts at or after it (the op that ends a gap at the span's end: perfdoctor.measure.host);
  the CUDA calls that overlap the span and the launch calls of its ops; the NVTX ranges and NCCL payloads
  whole (they are few);
- the time it **owns** is ``[lo, next window's lo)``: the windows' owned times cut the time axis without
  overlap, so a measure of the whole device (busy ns) is the sum of each window's measure of what it owns.

Per-step arrays are then the windows' arrays joined in step order, exactly those of one pass over the whole
timeline (tests/test_windows.py compares them window by window on every repository trace). Everything that
is not per step (tallies, medians over kernels, evidence) is computed once over the whole tables, which hold
no interval sets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from perfdoctor.classify.projection import rows_of
from perfdoctor.measure.steps import Steps
from perfdoctor.model import Timeline
from perfdoctor.table import Table, distinct, starts_in_order

# Kernels per window (a window holds at least one whole step): its interval sets and per-kernel temporaries
# are about 100 bytes a kernel, so a window's measurement holds some 25 MB. Measured at 10M kernels (peak RSS
# of the measurements above what they start from): 2^16 +104 MiB, 2^18 +109, 2^20 +178 (most of it the whole
# timeline's call lookup and kernel kinds); 2^18 costs no time against 2^19.
WINDOW_KERNELS = 1 << 18

NEVER = np.iinfo(np.int64).max


@dataclass(frozen=True)
class Window:
    """A run of whole steps and the rows that reach into it (module docstring)."""

    tl: Timeline
    steps: Steps  # its steps
    first: int  # the index of its first step among the device's
    kernels: np.ndarray | slice  # its kernels' rows in the device's kernels table (for per-kernel arrays)
    owns: tuple[int, int]  # the time it accounts for in whole-device measures
    next_start: int  # the start of the step after its last (its last end for the device's last window)


def window_steps(starts: np.ndarray, steps: Steps, size: int) -> list[tuple[int, int]]:
    """Runs of steps ``[a, b)`` with about ``size`` kernels each (``starts``: the kernels' sorted starts),
    a larger step alone. Steps out of order, or none, make one window."""
    n = len(steps)
    if n < 2 or not np.all(steps.starts[1:] >= steps.starts[:-1]):
        return [(0, n)]
    before = np.searchsorted(starts, steps.starts, side="left")  # kernels starting before each step
    cut = np.flatnonzero(np.diff(before // max(size, 1))) + 1
    bounds = [0, *cut.tolist(), n]
    return list(zip(bounds[:-1], bounds[1:]))


def windows(tl: Timeline, steps: Steps, size: int | None = None) -> Iterator[Window]:
    """The windows of ``tl``'s steps (:func:`window_steps`, ``size`` kernels each: by default
    :data:`WINDOW_KERNELS`), in time order, each built as its turn comes. With one window the timeline
    itself is the window's (nothing is copied)."""
    runs = window_steps(tl.kernels.col("start"), steps, WINDOW_KERNELS if size is None else size)
    n = len(steps)
    if len(runs) == 1:
        yield Window(tl, steps, 0, slice(0, len(tl.kernels)), (-NEVER, NEVER), int(steps.ends[-1]) if n else NEVER)
        return
    open_rows: dict[str, np.ndarray] = {}
    starts = {name: _Starts(getattr(tl, name)) for name in ("kernels", "memcpy", "memset", "api")}
    for i, (a, b) in enumerate(runs):
        lo = -NEVER if i == 0 else int(steps.starts[a])
        upto = NEVER if b == n else int(steps.starts[b])
        hi = max(upto, int(steps.ends[a:b].max()))
        rows = {name: _run(_rows(getattr(tl, name), starts[name], lo, hi, open_rows.get(name)))
                for name in ("kernels", "memcpy", "memset")}
        for name, r in rows.items():  # the rows still running at the next window's start
            open_rows[name] = _running_at(getattr(tl, name), r, upto)
        calls = _run(_rows(tl.api, starts["api"], lo, hi, open_rows.get("api"), after=False))
        open_rows["api"] = _running_at(tl.api, calls, upto)
        calls = _run(_joined(_positions(calls), *(rows_of(tl.api, getattr(tl, name).col("correlation_id")[r])
                                                  for name, r in rows.items())))
        sub = dataclasses.replace(tl, api=tl.api.take(calls),
                                  **{name: getattr(tl, name).take(r) for name, r in rows.items()})
        window_of = Steps(steps.starts[a:b], steps.ends[a:b], steps.source, steps.label, steps.excluded)
        yield Window(sub, window_of, a, rows["kernels"], (lo, upto),
                     int(steps.starts[b]) if b < n else int(steps.ends[-1]))


class _Starts:
    """A table's starts in order, found once for all its windows: the table's own column when the rows come
    sorted (kernels, and CUDA calls and copies as nsys writes them), else sorted with the order kept."""

    def __init__(self, table: Table) -> None:
        self.start, self.order = starts_in_order(table)

    def rows(self, a: int, b: int) -> np.ndarray:
        """The rows of the sorted positions ``[a, b)``, in table order."""
        return np.arange(a, b) if self.order is None else np.sort(self.order[a:b])


def _rows(table: Table, starts: _Starts, lo: int, hi: int, still_open: np.ndarray | None,
          after: bool = True) -> np.ndarray:
    """Rows of ``table`` overlapping ``[lo, hi)`` and, with ``after``, the first starting at or after ``hi``,
    in table order. ``still_open``: the previous window's rows still running at ``lo`` (the only rows
    starting before it that can reach into it)."""
    if not len(table):
        return np.zeros(0, dtype=np.int64)
    a, b = np.searchsorted(starts.start, [lo, hi], side="left").tolist()
    parts = [starts.rows(a, b)]
    if still_open is not None:
        parts.insert(0, still_open[table.col("end")[still_open] > lo])
    if after and b < starts.start.size:
        parts.append(starts.rows(b, b + 1))
    rows = np.concatenate(parts).astype(np.int64)
    return rows if starts.order is None else distinct(rows)


def _run(rows: np.ndarray) -> np.ndarray | slice:
    """Sorted, distinct ``rows`` as the slice they span when they are one run (a window's usually are:
    no op crosses its start): a slice of a column is a view of it, not a gather."""
    if rows.size and int(rows[-1]) - int(rows[0]) + 1 == rows.size:
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return rows


def _positions(rows: np.ndarray | slice) -> np.ndarray:
    """``rows`` as positions (a window's calls, a slice while their open ones are found by views: 20 ms
    less at 10M than gathering them, then joined with their ops' launch calls as positions)."""
    return np.arange(rows.start, rows.stop) if isinstance(rows, slice) else rows


def _running_at(table: Table, rows: np.ndarray | slice, t: int) -> np.ndarray:
    """Those of ``rows`` still running at ``t`` (started before it, ending after it)."""
    if not len(table):
        return np.zeros(0, dtype=np.int64)
    running = np.flatnonzero((table.col("end")[rows] > t) & (table.col("start")[rows] < t))
    return running + rows.start if isinstance(rows, slice) else rows[running]


def _joined(*parts: np.ndarray) -> np.ndarray:
    """The distinct rows of ``parts``, in order: marks over the rows' range (a window's calls and their
    neighbours), not a sort."""
    parts = tuple(p for p in parts if p.size)
    if not parts:
        return np.zeros(0, dtype=np.int64)
    first = min(int(p.min()) for p in parts)
    marks = np.zeros(max(int(p.max()) for p in parts) - first + 1, dtype=bool)
    for p in parts:
        marks[p - first] = True
    return np.flatnonzero(marks) + first
