"""A timeline's CUDA calls per thread, merged (``intervals.union``), for one window of steps at a time
(blame/window.py): at 10M launches the merged calls of the whole timeline and their temporaries were the
largest part of the critical path's host side.

The walk of a step asks the calls of a thread only about [lo, hi] of its window (blame/causes.py
``HostRanges.handoff``: the quiet stretches between calls in it and which other thread called last before
one ended; blame/path.py: a thread's first call after a time in it). Merging only the calls that end at or
after lo and start at or before hi gives the same merged intervals there: the same ends after lo, the same
starts after lo, the same cover of [lo, hi]. What is asked of the whole thread — its median interval between
merged calls, which sets how long a quiet stretch is (``HostRanges.quiet``) — is computed once, a slice of
the calls at a time.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from perfdoctor.measure import intervals as iv
from perfdoctor.model import Timeline
from perfdoctor.quantiles import median
from perfdoctor.table import distinct

SLICE = 1 << 20  # calls per slice when the medians are computed


class WindowCalls:
    """The calls of a timeline in start order, handed out a window at a time (windows in order)."""

    def __init__(self, tl: Timeline) -> None:
        api = tl.api
        self.start, self.end, self.tid = ((api.col("start"), api.col("end"), api.col("tid")) if len(api) else
                                          (np.zeros(0, dtype=np.int64),) * 3)
        one = self.tid.size and self.tid.min() == self.tid.max()  # most processes launch from one thread
        self.threads = [int(self.tid[0])] if one else distinct(self.tid).tolist()
        self.one_thread = len(self.threads) == 1
        self.in_order = bool(np.all(self.start[1:] >= self.start[:-1]))
        self._whole = None if self.in_order else _by_thread(self.start, self.end, self.tid, self.threads)
        self._open = np.zeros(0, dtype=np.int64)  # calls before ``_at`` that end at or after the last window's lo
        self._at = 0

    @cached_property
    def medians(self) -> dict[int, float | None]:
        """Per thread, the median interval between the starts of its merged calls (None: fewer than two);
        computed once, when first asked."""
        if self._whole is not None:
            return {t: float(median(np.diff(c[0]))) if c[0].size > 1 else None for t, c in self._whole.items()}
        out: dict[int, float | None] = {}
        for thread in self.threads:
            gaps, reach, last = [], np.iinfo(np.int64).min, None
            for a in range(0, self.start.size, SLICE):
                s, e = self.start[a:a + SLICE], self.end[a:a + SLICE]
                if not self.one_thread:
                    mine = self.tid[a:a + SLICE] == thread
                    s, e = s[mine], e[mine]
                keep = e > s  # as intervals.union: empty calls are no calls
                s, e = s[keep], e[keep]
                if not s.size:
                    continue
                ahead = np.maximum.accumulate(e)
                np.maximum(ahead, reach, out=ahead)
                new = np.empty(s.size, dtype=bool)
                new[0] = last is None or s[0] > reach
                np.greater(s[1:], ahead[:-1], out=new[1:])
                starts = s[new]
                reach = int(ahead[-1])
                if starts.size:
                    if last is not None:
                        gaps.append(starts[:1] - last)
                    gaps.append(np.diff(starts))
                    last = int(starts[-1])
            joined = np.concatenate(gaps) if gaps else np.zeros(0, dtype=np.int64)
            out[int(thread)] = float(median(joined, overwrite_input=True)) if joined.size else None
        return out

    def window(self, lo: int, hi: int) -> dict[int, iv.Intervals]:
        """Per thread, its merged calls as they are in [lo, hi] (module docstring); every thread of the
        timeline is there, without calls in the window too. ``lo`` never decreases from call to call."""
        if self._whole is not None:
            return self._whole
        self._open, self._at = self.open_at(lo)
        return self.merged(self.span(lo, hi, self._open, self._at))

    def open_at(self, lo: int, since: tuple[np.ndarray, int] | None = None) -> tuple[np.ndarray, int]:
        """The calls that start before ``lo`` and end at or after it, and how many start before it, from
        those of an earlier time (``since``; else the last window's), without changing them."""
        opened, at = since if since is not None else (self._open, self._at)
        a = int(np.searchsorted(self.start, lo, side="left"))
        passed = at + np.flatnonzero(self.end[at:a] >= lo)  # calls that started since then, before lo
        return np.concatenate([opened[self.end[opened] >= lo], passed]), a

    def span(self, lo: int, hi: int, opened: np.ndarray, a: int) -> tuple[np.ndarray, int, int]:
        """The calls a window [lo, hi] merges: ``opened`` (open_at lo, ``a`` the calls before lo), then those
        that start in [lo, hi]."""
        return opened, a, int(np.searchsorted(self.start, hi, side="right"))

    def merged(self, span: tuple[np.ndarray, int, int]) -> dict[int, iv.Intervals]:
        """Per thread, the merged calls of a span (:meth:`span`)."""
        opened, a, b = span
        if not opened.size:  # nothing from before the window still runs: slices, not copies
            return _by_thread(self.start[a:b], self.end[a:b], self.tid[a:b], self.threads)
        rows = np.concatenate([opened, np.arange(a, b)])
        return _by_thread(self.start[rows], self.end[rows], self.tid[rows], self.threads)


def _by_thread(start: np.ndarray, end: np.ndarray, tid: np.ndarray, threads: list[int]) -> dict[int, iv.Intervals]:
    if len(threads) == 1:
        return {int(threads[0]): iv.union(start, end)}
    return {int(t): iv.union(start[tid == t], end[tid == t]) for t in threads}
