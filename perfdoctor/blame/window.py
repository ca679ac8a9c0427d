"""A rank's critical path walked a window of whole steps at a time, so that only one window's ops, edges
and lifting tables are alive at once (at 10M kernels the whole graph was the run's peak).

Why a window gives the whole graph's paths (blame/path.py, blame/graph.py): the walk of a step never goes
back past the step's start ``lo``. An op it follows an edge out of (``bind``, the chain's links) started
after ``lo``; an op that started at or before ``lo`` is only reached as the last op of a walk (a chain's
link past ``lo``, the op that ended last before a blocking call returned, a device edge's source), and of
that op only its own columns are read (start, end, cause, kernel), never its edges. So the ops of a window
of steps [lo0, hi] are those that start in it — the *core*, whose edges must be the whole graph's — and a
*margin* of earlier ops, with which each core op finds the same edges and the walk the same ops:

- the last op of each stream before the window (a core op's stream predecessor, the source of its stream
  edge, however long ago it ran);
- the ops still running at lo0 (end at or after it) and the EVENT_LOOKS (three) that ended last before it:
  a core op's event candidate is the op of another stream that ended last at or before its start, stepping
  over at most two ops of its own stream (graph.edges), and the op that ended last before a time (the
  walk's ``last_ended``) is one of these or a core op for any time at or after lo0.

The margin ops get edges of their own inside the window that may differ from the whole graph's; no walk
reads them. The window's ops keep the whole graph's order, so ties (a stable sort by end, the first of the
latest ends) resolve alike. The margin of the next window is this window's ops (and those between the two
windows, taken in chunks) that start before its start, reduced again: it stays a few ops per stream.

Steps out of order are walked on the whole graph. Steps may overlap: a window runs from its first step's
start to its steps' latest end. A step with more ops than a window (a capture without step markers is one
step) is cut into parts at op starts, each with its margin, and walked back a part at a time (:class:`Parts`):
the walk leaves a part only for what started or ended before it and goes on in the part it lies in.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import numpy as np

from perfdoctor.blame import path
from perfdoctor.blame.calls import WindowCalls
from perfdoctor.blame.focus import KernelMarks
from perfdoctor.blame.graph import EVENT_LOOKS, NONE, Ops, OpSource, edges, stream_waits
from perfdoctor.blame.path import HostSide, RankPath, StepWalks, Walk, _Walker
from perfdoctor.measure.steps import Steps
from perfdoctor.model import Timeline
from perfdoctor.table import distinct

# Ops in a window (one step at least): its graph, edges and lifting tables take about 100 bytes an op at
# their peak. Tests shrink it to walk a trace in many windows.
WINDOW_OPS = 1 << 18
LATEST_TAIL = 1 << 12  # the last ends of a margin whose k-th largest bounds the k latest from below (_latest)
LOWEST, HIGHEST = np.iinfo(np.int64).min, np.iinfo(np.int64).max


def windowed_path(tl: Timeline, source: OpSource, steps: Steps, instances: np.ndarray,
                  marks: Callable[[], KernelMarks]) -> RankPath:
    """Every step of the rank walked as on the whole graph (blame/path.py ``rank_path``), a window of whole
    steps at a time, a step larger than a window a part at a time (:class:`Parts`). ``marks`` gives the
    kernels' marks (:func:`perfdoctor.blame.focus.kernel_marks`), asked for when the first window is walked:
    another thread may make them meanwhile (perfdoctor.api.analyze_timeline)."""
    walks = StepWalks(tl, steps, instances)
    host = HostSide(tl, source.threads(), WindowCalls(tl))
    waits = stream_waits(tl.sync)
    for i0, i1, lo, hi, ops in window_ops(source, steps, walks.rep):
        if isinstance(ops, Parts):
            walks.record(i0, ops.walk(tl, steps, host, waits, marks()))
            continue
        graph = edges(ops, waits)
        walks.walk(_Walker(tl, ops, graph, steps, host.within(lo, hi)), ops, graph, marks().of(ops), i0, i1)
        del ops, graph
    return walks.result()


def window_ops(source: OpSource, steps: Steps, rep: int = -1) -> Iterator[tuple[int, int, int, int, Ops | Parts]]:
    """Per window (windows), its steps ``i0:i1``, its time [lo, hi] (the first step's start, the latest end)
    and its ops: the margin, then those that start in [lo, hi] (an op starting right at hi may be the one a
    walk finds ended last). A step with more ops than a window comes as :class:`Parts` instead, unless it is
    the representative step ``rep`` and few enough to be replayed (blame/path.py REPLAY_MAX_OPS: the replay
    reads the step's whole graph)."""
    if not len(steps):
        return
    spans = windows(steps, source)
    margin, done = source.between(LOWEST, LOWEST), LOWEST  # every op starting before ``done`` is in margin
    ids = np.zeros(0, dtype=np.int64)  # the margin's places among all ops
    for i0, i1 in spans or [(0, len(steps))]:
        lo, hi = (int(steps.starts[i0]), int(steps.ends[i0:i1].max())) if spans else (LOWEST, HIGHEST)
        for a, b in _chunks(source, done, lo):  # the ops between windows: only their margin is kept
            ops = source.between(a, b).after(margin)
            margin, ids = _taken(ops, ids, int(source.rank(np.array([a]), "left")[0]), _margin(ops, lo))
            del ops
        done = max(lo, min(hi, HIGHEST - 1) + 1)
        count = int(np.diff(source.rank(np.array([lo, hi]), "left"))[0]) if spans else 0
        if i1 == i0 + 1 and count > WINDOW_OPS and not (i0 == rep and count <= path.REPLAY_MAX_OPS):
            parts = Parts(source, lo, hi, margin, ids)
            yield i0, i1, lo, hi, parts
            if i1 < len(steps):
                margin, ids, done = parts.margin_at(int(steps.starts[i1]))
            continue
        ops = source.between(lo, done).after(margin)
        yield i0, i1, lo, hi, ops
        if i1 < len(steps):
            margin, ids = _taken(ops, ids, int(source.rank(np.array([lo]), "left")[0]),
                                 _margin(ops, int(steps.starts[i1])))
        del ops  # before the next window's are taken


def _taken(ops: Ops, ids: np.ndarray, first: int, keep: np.ndarray) -> tuple[Ops, np.ndarray]:
    """``keep`` of ``ops`` (a margin, its places ``ids`` among all ops, then the ops from place ``first``
    on), with their places."""
    n = ids.size
    return ops.take(keep), np.where(keep < n, ids[np.minimum(keep, max(n - 1, 0))] if n else 0, first + keep - n)


class Parts:
    """A step with more ops than a window (a capture without step markers is one step): cut into parts at
    op starts, each with the margin of the ops before it (found in a pass forward, with the op that ends
    the step last), and walked back from the last part to the first, each part's graph built when the walk
    reaches it and dropped when it leaves (blame/path.py ``_Walker.run``: a walk leaves a part only for an op
    that started before it, or the op that had ended by a time before it, and never comes back).

    A part's ops that start in it have the whole graph's edges (module docstring, the cut for a window), so
    on them the walk takes the same steps; a margin op the walk reaches is taken up again in the part it
    starts in, by its place among all ops; the op that had ended by a time before the part is found in the
    part the time falls in."""

    def __init__(self, source: OpSource, lo: int, hi: int, margin: Ops, ids: np.ndarray) -> None:
        self.source, self.lo, self.hi = source, lo, hi
        big = max(source.starts, key=lambda s: s.size)
        a, b = int(np.searchsorted(big, lo, side="left")), int(np.searchsorted(big, hi, side="right"))
        cuts = distinct(big[a + WINDOW_OPS:b:WINDOW_OPS])  # every WINDOW_OPS-th start of the largest table
        self.cuts = np.concatenate(([lo], cuts[cuts > lo])).astype(np.int64)  # part j: ops starting in [c_j, c_j+1)
        self.firsts = source.rank(self.cuts, "left")  # the place of each part's first op among all
        self.total = int(source.rank(np.array([HIGHEST]), "right")[0])
        self.margins: list[tuple[Ops, np.ndarray]] = []
        self.last, self.last_t = NONE, lo  # the op that ends the step last (its place; clipped at hi), when
        self.last_tid = self.last_start = NONE
        for j in range(self.cuts.size):
            self.margins.append((margin, ids))
            ops = self._core(j)
            mine = np.flatnonzero(ops.start < hi)
            if mine.size:
                clipped = np.minimum(ops.end[mine], hi)
                k = int(np.argmax(clipped))
                if self.last == NONE or int(clipped[k]) > self.last_t:
                    self.last, self.last_t = int(self.firsts[j]) + int(mine[k]), int(clipped[k])
                    self.last_tid, self.last_start = int(ops.tid[mine[k]]), int(ops.start[mine[k]])
            if j + 1 < self.cuts.size:
                ops = ops.after(margin)
                margin, ids = _taken(ops, ids, int(self.firsts[j]), _margin(ops, int(self.cuts[j + 1])))
            del ops

    def _core(self, j: int) -> Ops:
        end = int(self.cuts[j + 1]) if j + 1 < self.cuts.size else self.hi + 1  # (an op starting at hi too)
        return self.source.between(int(self.cuts[j]), end)

    def _hosts(self, host: HostSide) -> Callable[[int], HostSide]:
        """Per part, the host with the calls it needs. The walk of a part asks the calls about the times from
        a blocking call's return in the part (a thread's first call after it: found in the parts after this
        one when not in it) and, where two threads call CUDA, about the quiet stretches back to the last
        blocking call, which may lie parts before: then every part has the step's calls, merged once."""
        calls = host.window_calls
        if calls is None or not calls.one_thread or not calls.in_order:
            step = host.within(self.lo, self.hi)
            return lambda j: step
        spans, since = [], None
        for j, cut in enumerate(self.cuts.tolist()):  # the calls each part merges (blame/calls.py)
            opened, a = since = calls.open_at(cut, since)
            spans.append(calls.span(cut, int(self.cuts[j + 1]) if j + 1 < self.cuts.size else self.hi, opened, a))

        def later(j: int, tid: int, c1: int, t: int) -> int | None:
            for k in range(j + 1, self.cuts.size):
                if self.cuts[k] > t:
                    break
                mine = calls.merged(spans[k]).get(tid)
                at = int(np.searchsorted(mine[0], c1, side="right")) if mine is not None else 0
                if mine is not None and at < mine[0].size:
                    return int(mine[0][at])
            return None
        return lambda j: host.with_calls(calls.merged(spans[j]), functools.partial(later, j))

    def part(self, j: int) -> tuple[Ops, np.ndarray]:
        """Part ``j``'s ops (its margin, then those that start in it) and their places among all ops (in
        order: the margin's come first)."""
        margin, ids = self.margins[j]
        ops = self._core(j)
        first = int(self.firsts[j])
        return ops.after(margin), np.concatenate([ids, np.arange(first, first + len(ops))])

    def margin_at(self, t: int) -> tuple[Ops, np.ndarray, int]:
        """The margin of a window starting at ``t`` (at or after the step's start; past the step's ops, of
        those up to them), its places among all ops, and the time it is the margin at: from the last part
        starting at or before it and the ops of that part before it."""
        t = min(t, self.hi + 1)
        j = int(np.searchsorted(self.cuts, t, side="right")) - 1
        margin, ids = self.margins[j]
        c = int(self.cuts[j])
        if t == c:
            return margin, ids, t
        ops = self.source.between(c, t).after(margin)
        margin, ids = _taken(ops, ids, int(self.firsts[j]), _margin(ops, t))
        return margin, ids, t

    def _part(self, x: int) -> int:
        """The part a time after the step's start falls in."""
        return int(np.searchsorted(self.cuts, x, side="right")) - 1

    def walk(self, tl: Timeline, steps: Steps, host: HostSide, waits: dict[int, np.ndarray],
             kernel_marks: KernelMarks) -> Walk:
        """The step walked back part by part; its segments settled (blame/path.py)."""
        lo, hi = self.lo, self.hi
        hosts = self._hosts(host)
        j = self.cuts.size - 1 if self.last_t < hi else self._part(self.last_start)
        w, n = None, self.last
        while True:
            ops, places = self.part(j)
            graph = edges(ops, waits)
            walker = _Walker(tl, ops, graph, steps, hosts(j), margin=len(self.margins[j][1]), cut=int(self.cuts[j]))
            local = NONE if n == NONE else int(np.searchsorted(places, n))
            if w is None:
                w = walker.begin(lo, hi, local if self.last_t >= hi else NONE, self.last_t, self.last_tid,
                                 self.total + 1)
            elif w.at == "op":
                w.n = local
            walker.run(w)
            where = NONE
            if w.at == "op":  # a margin op that started after lo: its place among all ops
                n, where = int(places[w.n]), int(ops.start[w.n])
            elif w.at == "sync":
                where = w.c1
            w.seg.settle(ops, kernel_marks.of(ops), places)
            del ops, graph, walker, places
            if w.at == "done":
                return w
            j = self._part(where)


def windows(steps: Steps, source: OpSource) -> list[tuple[int, int]]:
    """Runs of whole steps of about WINDOW_OPS ops each (a longer step is a window of its own); none when the
    steps are out of order (the whole graph is walked). Steps may overlap (a CPU range's start and the
    device's end): a window then starts at its first step's start and ends at the latest end of its steps,
    and the next one's margin is taken at its own first start."""
    n = len(steps)
    lows, highs = steps.starts, steps.ends
    if not n or np.any(lows[1:] < lows[:-1]):
        return []
    before = source.rank(lows, "left")  # ops that start before each step
    through = source.rank(np.maximum.accumulate(highs), "right")  # ops that start at or before the steps' ends
    out, i0 = [], 0
    while i0 < n:
        i1 = max(int(np.searchsorted(through, before[i0] + WINDOW_OPS, side="right")), i0 + 1)
        out.append((i0, i1))
        i0 = i1
    return out


def _chunks(source: OpSource, t0: int, t1: int) -> list[tuple[int, int]]:
    """[t0, t1) cut into spans of about WINDOW_OPS ops each (at the starts of every WINDOW_OPS-th op of the
    largest table)."""
    if t1 <= t0:
        return []
    start = max(source.starts, key=lambda s: s.size) if source.starts else np.zeros(0, dtype=np.int64)
    a, b = np.searchsorted(start, [t0, t1], side="left").tolist()
    cuts = [t0, *start[a + WINDOW_OPS:b:WINDOW_OPS].tolist(), t1]
    return [(x, y) for x, y in zip(cuts[:-1], cuts[1:]) if y > x]


def _margin(ops: Ops, t: int) -> np.ndarray:
    """Of ``ops`` (in order; every op that starts before ``t`` not among them is not needed), those a window
    starting at ``t`` needs (module docstring), as rows."""
    n, parts = _margin_parts(ops, t)
    keep = np.zeros(n, dtype=bool)
    for rows in parts.values():
        keep[rows] = True
    return np.flatnonzero(keep)


def _margin_parts(ops: Ops, t: int) -> tuple[int, dict[str, np.ndarray]]:
    """How many of ``ops`` start before ``t``, and which of those a window starting at ``t`` needs, by why:
    the last of each stream, those still running at ``t``, the EVENT_LOOKS that ended last before it."""
    n = int(np.searchsorted(ops.start, t, side="left"))
    end = ops.end[:n]
    running = end >= t
    ended = np.flatnonzero(~running)
    return n, {"stream": _last_of_each(ops.stream[:n]), "running": np.flatnonzero(running),
               "ended": ended[_latest(end[ended], EVENT_LOOKS)]}


def _latest(values: np.ndarray, k: int) -> np.ndarray:
    """``np.argsort(values, kind="stable")[-k:]`` without sorting them all: the ``k`` largest are at least
    the ``k``-th largest of the last LATEST_TAIL values (ends come nearly sorted, so it is near the top),
    and only the values that reach it are sorted. A window's margin looked at a quarter of a million ends:
    its sort was 2-2.7 ms a window, this 0.5 ms."""
    near = np.arange(values.size)
    if values.size > LATEST_TAIL:
        floor = np.partition(values[-LATEST_TAIL:], LATEST_TAIL - k)[LATEST_TAIL - k]
        near = np.flatnonzero(values >= floor)
    return near[np.argsort(values[near], kind="stable")[-k:]]


def _last_of_each(values: np.ndarray) -> np.ndarray:
    """The position of the last occurrence of each distinct value (stream ids: a few small integers, so one
    pass keeping the largest position per id, without a sort)."""
    if not values.size:
        return np.zeros(0, dtype=np.intp)
    lo, hi = int(values.min()), int(values.max())
    if hi - lo >= 1 << 16:
        _, first = np.unique(values[::-1], return_index=True)
        return values.size - 1 - first
    last = np.full(hi - lo + 1, -1, dtype=np.intp)
    np.maximum.at(last, values - lo, np.arange(values.size))
    return last[last >= 0]
