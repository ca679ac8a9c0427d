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
start to its steps' latest end. A trace of one step is one window: nothing bounds its graph but the step.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from perfdoctor.blame.calls import WindowCalls
from perfdoctor.blame.focus import KernelMarks
from perfdoctor.blame.graph import EVENT_LOOKS, Ops, OpSource, edges, stream_waits
from perfdoctor.blame.path import HostSide, RankPath, StepWalks, _Walker
from perfdoctor.measure.steps import Steps
from perfdoctor.model import Timeline

# Ops in a window (one step at least): its graph, edges and lifting tables take about 100 bytes an op at
# their peak. Tests shrink it to walk a trace in many windows.
WINDOW_OPS = 1 << 18
LOWEST, HIGHEST = np.iinfo(np.int64).min, np.iinfo(np.int64).max


def windowed_path(tl: Timeline, source: OpSource, steps: Steps, instances: np.ndarray,
                  kernel_marks: KernelMarks) -> RankPath:
    """Every step of the rank walked as on the whole graph (blame/path.py ``rank_path``), a window of whole
    steps at a time."""
    walks = StepWalks(tl, steps, instances)
    host = HostSide(tl, source.threads(), WindowCalls(tl))
    waits = stream_waits(tl.sync)
    for i0, i1, lo, hi, ops in window_ops(source, steps):
        graph = edges(ops, waits)
        walks.walk(_Walker(tl, ops, graph, steps, host.within(lo, hi)), ops, graph, kernel_marks.of(ops), i0, i1)
        del ops, graph
    return walks.result()


def window_ops(source: OpSource, steps: Steps) -> Iterator[tuple[int, int, int, int, Ops]]:
    """Per window (windows), its steps ``i0:i1``, its time [lo, hi] (the first step's start, the latest end)
    and its ops: the margin, then those that start in [lo, hi] (an op starting right at hi may be the one a
    walk finds ended last)."""
    if not len(steps):
        return
    spans = windows(steps, source)
    margin, done = source.between(LOWEST, LOWEST), LOWEST  # every op starting before ``done`` is in margin
    for i0, i1 in spans or [(0, len(steps))]:
        lo, hi = (int(steps.starts[i0]), int(steps.ends[i0:i1].max())) if spans else (LOWEST, HIGHEST)
        for a, b in _chunks(source, done, lo):  # the ops between windows: only their margin is kept
            margin = _margin(source.between(a, b).after(margin), lo)
        done = max(lo, min(hi, HIGHEST - 1) + 1)
        ops = source.between(lo, done).after(margin)
        yield i0, i1, lo, hi, ops
        if i1 < len(steps):
            margin = _margin(ops, int(steps.starts[i1]))
        del ops  # before the next window's are taken


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


def _margin(ops: Ops, t: int) -> Ops:
    """Of ``ops`` (in order; every op that starts before ``t`` not among them is not needed), those a window
    starting at ``t`` needs (module docstring)."""
    n, parts = _margin_parts(ops, t)
    keep = np.zeros(n, dtype=bool)
    for rows in parts.values():
        keep[rows] = True
    return ops.take(np.flatnonzero(keep))


def _margin_parts(ops: Ops, t: int) -> tuple[int, dict[str, np.ndarray]]:
    """How many of ``ops`` start before ``t``, and which of those a window starting at ``t`` needs, by why:
    the last of each stream, those still running at ``t``, the EVENT_LOOKS that ended last before it."""
    n = int(np.searchsorted(ops.start, t, side="left"))
    end = ops.end[:n]
    running = end >= t
    ended = np.flatnonzero(~running)
    return n, {"stream": _last_of_each(ops.stream[:n]), "running": np.flatnonzero(running),
               "ended": ended[np.argsort(end[ended], kind="stable")[-EVENT_LOOKS:]]}


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
