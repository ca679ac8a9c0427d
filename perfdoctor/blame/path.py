"""The critical path of each step of one rank, walked back from the step's end (DESIGN §3).

From the op that ends the step last, each op's time is blamed on its cause, then the walk follows the
op's binding edge (:mod:`perfdoctor.blame.graph`):

- a device edge (stream order, event): to the op it waited for; the few us between that op's end and
  this one's start are this op's start latency, blamed with it; a longer gap that no recorded or inferred
  edge explains is left unattributed (the residual);
- a launch edge: the host was late. The launch call's own time until the op started is ``host.launch``;
  then the walk continues on the launching thread back in time: its time is blamed on what it was doing
  (:class:`perfdoctor.blame.causes.HostRanges`) back to the end of its last blocking call (synchronize,
  blocking copy, ``.item()``). That call returned when the device drained: the wait from the end of the
  last op that had ended to the return is ``host.sync``, and the walk goes on from that op.

The segments cover the step exactly once, back to back, so the causes plus the residual add up to the
step. Steps are walked one at a time (a Python loop over the ops on the path, on plain lists); the graph
itself is built once per rank with numpy. Collective ops are blamed on their group's transfer here; the
cross-rank join splits off the part spent waiting for a late peer (:mod:`perfdoctor.blame.join`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from perfdoctor.blame.calls import WindowCalls
from perfdoctor.blame.causes import CAUSES, CODE, FOCUS, HostRanges
from perfdoctor.blame.focus import LN, SYNC, Marks, on_path
from perfdoctor.blame.graph import LAUNCH, NONE, Edges, Ops
from perfdoctor.blame.whatif import Replay
from perfdoctor.measure import intervals as iv
from perfdoctor.measure.host import BLOCKING_API
from perfdoctor.measure.steps import Steps
from perfdoctor.model import Timeline
from perfdoctor.table import distinct
from perfdoctor.width import narrow, offsets, rows

# A device op starts this long after the op it waited for at most (the device's own latency); a longer
# gap with no edge that explains it is not blamed on anything.
START_LATENCY_NS = 20_000
HOST = -1  # ``what`` of host segments
# Causes on less of the step than this are not replayed (no rule fires below 1 % of the step; each replay
# is a pass over the step's ops): their what-if is unknown.
WHATIF_SHARE = 0.01
# A replay is a Python pass over the step's ops per cause (~3 us an op): steps with more ops than this are
# not replayed (their what-ifs are unknown), so a million-kernel window stays a matter of seconds.
REPLAY_MAX_OPS = 50_000
COMM = tuple(CODE[c] for c in CAUSES if c.startswith("transfer.") or c == "pipeline.p2p")
IS_COMM = np.isin(np.arange(len(CAUSES)), COMM)  # per cause code: a lookup per segment, not a set test
# The chains' lifting tables jump 16**j links (not 2**j): a quarter of binary lifting's tables (6 instead of
# 24 for a 10M-op chain: 4 bytes an op each), for at most 15 jumps per table where a walk searches a chain.
LIFT_BITS = 4
LIFT_RADIX = 1 << LIFT_BITS


class Segments:
    """Segments of one step's path, latest first: [start, end) blamed on ``cause``; ``op`` the device op
    (index into the Ops walked) or HOST; ``inferred`` when the edge into the segment was inferred. Device
    chains arrive as arrays and stay arrays; the few host segments are buffered as tuples. Their ops are
    settled (:meth:`settle`) before the graph they index is dropped."""

    NAMES = ("start", "end", "cause", "op", "inferred")
    SETTLED = (*NAMES, "kernel", "unfused", "delay")  # op: its place among the rank's ops (settle)

    def __init__(self) -> None:
        self._chunks: list[tuple[np.ndarray, ...]] = []
        self._settled: list[tuple[np.ndarray, ...]] = []
        self._rows: list[tuple[int, int, int, int, bool]] = []

    def extend(self, start: np.ndarray, end: np.ndarray, cause: np.ndarray, op: np.ndarray,
               inferred: np.ndarray) -> None:
        """Many segments at once (a device chain), latest first; empty ones are left out."""
        self._flush()
        keep = end > start
        self._chunks.append((start[keep], end[keep], cause[keep].astype(np.int64), op[keep].astype(np.int64),
                             inferred[keep]))

    def add(self, start: int, end: int, cause: int, op: int = HOST, inferred: bool = False) -> None:
        if end > start:
            self._rows.append((int(start), int(end), int(cause), int(op), bool(inferred)))

    def settle(self, ops: Ops, marks: Marks, ids: np.ndarray | None = None) -> None:
        """Name the device ops of the segments added since the last call by what outlives the graph they
        were walked on (blame/window.py walks a step on several): ``op`` becomes the op's place among all of
        the rank's (``ids``: per op of the graph), or stays its index in the graph (None: one graph holds
        every op a walk of the step reaches), with its kernel row and marks beside it."""
        self._flush()
        if not self._chunks:
            return
        start, end, cause, op, inferred = (np.concatenate(c) for c in zip(*self._chunks))
        self._chunks = []  # (a chunk per device chain: their arrays' own size is most of a long path's)
        if not len(ops):  # a graph without ops: host segments only
            named = (op, np.full(op.size, NONE), np.full(op.size, NONE, dtype=np.int8), np.zeros(op.size, np.int64))
        else:
            dev, at = op >= 0, np.maximum(op, 0)
            named = (np.where(dev, op if ids is None else ids[at], HOST), np.where(dev, ops.kernel[at], NONE),
                     np.where(dev, marks.unfused[at], NONE), np.where(dev, marks.delay[at], 0))
        self._settled.append((start, end, cause, named[0], inferred, *named[1:]))

    def columns(self) -> dict[str, np.ndarray]:
        """The settled segments as columns, latest first."""
        if not self._settled:
            dtypes = {"inferred": bool, "unfused": np.int8}
            return {name: np.zeros(0, dtype=dtypes.get(name, np.int64)) for name in self.SETTLED}
        return {name: np.concatenate([c[j] for c in self._settled]) for j, name in enumerate(self.SETTLED)}

    def _flush(self) -> None:
        if self._rows:
            cols = list(zip(*self._rows))
            self._chunks.append(tuple(np.array(c, dtype=bool if j == 4 else np.int64) for j, c in enumerate(cols)))
            self._rows = []


@dataclass
class RankPath:
    """One rank's blame: per step (rows, aligned with its steps) ns per cause (columns: CAUSES) and the
    unattributed rest; the comm segments on the paths (for the cross-rank join); the representative
    step's segments (in time order) for the report's ``path``."""

    by_cause: np.ndarray  # float64 [steps, causes]
    residual: np.ndarray  # float64 [steps]
    durations: np.ndarray  # int64 [steps]
    comm_step: np.ndarray  # per comm segment: step, collective instance (−1: none), start, end, cause
    comm_instance: np.ndarray
    comm_start: np.ndarray
    comm_end: np.ndarray
    comm_cause: np.ndarray
    representative: int
    path: dict[str, Any] = field(default_factory=dict)  # base, names, rows (see _compact)
    # The representative step replayed without each cause on its path (perfdoctor.blame.whatif): ns saved.
    saving: dict[str, int] = field(default_factory=dict)
    # per step ns of the path per perfdoctor.blame.focus.FOCUS entry (they overlap the causes), and the
    # representative step's savings without each
    focus: np.ndarray = field(default_factory=lambda: np.zeros((0, len(FOCUS))))
    focus_saving: dict[str, int] = field(default_factory=dict)


class HostSide:
    """What the walk knows of a rank's host, whatever ops it walks (the whole graph or a window of it):
    its ranges and CUDA calls per thread (:class:`perfdoctor.blame.causes.HostRanges`), its blocking calls,
    and the thread that launched most ops (found when first needed, from ``threads``: every op's)."""

    def __init__(self, tl: Timeline, threads: list[np.ndarray], calls: WindowCalls | None = None) -> None:
        self.ranges = HostRanges(tl, calls)
        self.blocking = _blocking(tl)
        self._threads = threads
        self.window_calls = calls
        # (thread, t0, t1): the start of the thread's first merged call in (t0, t1] that the calls of this
        # host do not reach, or None (blame/window.py Parts: the calls of the parts after this one)
        self.later: Callable[[int, int, int], int | None] | None = None

    def within(self, lo: int, hi: int) -> HostSide:
        """This host with the calls of the window [lo, hi] (handed out in order: perfdoctor.blame.calls)."""
        return self.with_calls(self.window_calls.window(lo, hi)) if self.window_calls is not None else self

    def with_calls(self, calls: dict[int, iv.Intervals],
                   later: Callable[[int, int, int], int | None] | None = None) -> HostSide:
        """This host with ``calls`` as its merged calls (and ``later``: see the constructor)."""
        out = copy.copy(self)
        out.ranges, out.later = self.ranges.within(calls), later
        return out

    @cached_property
    def main_tid(self) -> int:
        counts: dict[int, int] = {}
        for tid in self._threads:
            values, n = np.unique(tid[tid >= 0], return_counts=True)
            for v, c in zip(values.tolist(), n.tolist()):
                counts[v] = counts.get(v, 0) + c
        # the most ops, the lowest thread id on a tie (as np.unique's sorted values and argmax)
        return min(counts, key=lambda v: (-counts[v], v)) if counts else -1


@dataclass
class Walk:
    """A step's walk under way (:meth:`_Walker.run`), over one graph or several parts of the step's: where it
    is (``at``: on the device chain from op ``n`` up to ``t``; on the host at ``t`` on thread ``tid``;
    "sync": at the return ``c1`` of a blocking call that began at ``c0``; "done") and what it found."""

    lo: int
    hi: int
    seg: Segments
    residual: int = 0
    after_sync: int = 0  # ns of host work after blocking calls on the step's path (blame/focus.py)
    tail_tid: int = NONE  # the thread that ended the step
    at: str = "op"
    n: int = NONE
    t: int = 0
    tid: int = NONE
    c0: int = 0
    c1: int = 0
    turns: int = 0  # device turns left (a guard: each moves to an op that ended no later)
    limit: int = 0  # host turns per stretch on the host
    host_turns: int = 0  # host turns left in this stretch on the host (each moves back in time)


class _Walker:
    """The per-rank state of the walk: the graph as plain lists, the host's blocking calls per thread."""

    def __init__(self, tl: Timeline, ops: Ops, edges: Edges, steps: Steps, host: HostSide | None = None,
                 margin: int = 0, cut: int | None = None) -> None:
        """``margin``, ``cut``: the graph of a part of a step (blame/window.py), its first ``margin`` ops
        before the part (the margin), the others starting at or after ``cut``: a walk that needs more of
        what lies before stops there (:meth:`run`)."""
        # numpy columns, read an element at a time only where the walk leaves a device chain (few per step)
        self.start, self.end, self.cause, self.tid = ops.start, ops.end, ops.cause, ops.tid
        self.kind, self.src, self.ready = edges.kind, edges.src, edges.ready
        self.by_end = edges.by_end
        self.ends = ops.end[self.by_end]
        self.side = host if host is not None else HostSide(tl, [ops.tid])
        self.host, self.blocking = self.side.ranges, self.side.blocking
        self.margin, self.cut = margin, cut if cut is not None else np.iinfo(np.int64).min
        self._chains(ops, edges, steps)

    def _chains(self, ops: Ops, edges: Edges, steps: Steps) -> None:
        """Device chains: per op the op its binding device edge leads to when the op started within
        START_LATENCY_NS of it (``link``, else NONE), and binary-lifting tables over those links, so a run
        of device-bound ops is walked with numpy instead of op by op (tables of 16**j jumps: LIFT_BITS).

        A walk never follows a chain past its step's start, so the lifting tables stop each chain at its
        op's step start (:func:`_step_floor`): their number is the log of the longest chain in one step, not
        in the whole capture. The one op beyond that a walk takes (the op at or before the step's start) is
        ``link``'s."""
        n = len(ops)
        ready = np.minimum(edges.ready, ops.start)
        link = (edges.kind > LAUNCH) & (ops.start - ready <= START_LATENCY_NS)  # a device edge (NONE < LAUNCH)
        self.link = np.where(link, edges.src, NONE).astype(np.intp)
        self.link_ready = ready
        self.link_inferred = edges.inferred & link
        self.starts = ops.start
        self.causes = ops.cause
        floor = _step_floor(ops.start, steps)
        if self.cut > np.iinfo(np.int64).min:  # a part of a step: its chains stop at its start
            np.maximum(floor, self.cut - 1, out=floor)
        within = (self.link >= 0) & (ops.start[np.maximum(self.link, 0)] > floor)
        del floor
        # The last op of a chain links to a sentinel (index n, linking to itself): a jump past a chain's end
        # lands there and is refused, so every jump taken is exactly 2**j links and no depth table is needed.
        self.sentinel = n
        # int64 (a window's ops: a few MB a table): numpy converts int32 indices to int64 before every gather,
        # which made each of the tables' gathers ~3x slower at a window's 256k ops
        up = np.append(np.where(within, self.link, n), n).astype(np.int64)
        del within
        self.lift = [up]  # table j: each op's 16**j-th op back (its chain's end: the sentinel)
        while len(self.lift) < 16:
            further = self.lift[-1]
            for _ in range(LIFT_BITS):
                further = further[further]
            # every chain is shorter than this table's jump, or (zero-length ops of a damaged trace linking
            # to each other) the links go round in circles this table adds nothing to
            if (further == n).all() or np.array_equal(further, self.lift[-1]):
                break
            self.lift.append(further)

    def _chain(self, seg: Segments, n: int, t: int, lo: int) -> tuple[int, int, bool]:
        """Blame the device chain from op ``n`` (its time up to ``t``) back along its links to the first
        op with no link or that started at or before ``lo``; returns that op, the end of its segment, and
        False. On a part of a step (:meth:`run`) the chain may lead to an op before the part that started
        after ``lo``: then it stops before that op and returns it, the time it is blamed up to, and True."""
        cur, k = n, 0  # k: links from n to cur, all within the lifting tables
        for j in range(len(self.lift) - 1, -1, -1):  # the furthest op along the links still after lo
            table = self.lift[j]
            for _ in range(LIFT_RADIX - 1):
                cand = int(table[cur])
                if cand == self.sentinel or self.starts[cand] <= lo or k + LIFT_RADIX ** j > self.sentinel:
                    break  # (a chain has fewer links than there are ops: more is a circle of zero-length ops)
                cur, k = cand, k + (LIFT_RADIX ** j)
        chain = self._ancestors(n, k, 0)
        further = int(self.link[cur])
        away = 0 <= further < self.margin and self.starts[further] > lo
        if further >= 0 and not away:  # the op at/before lo
            chain = np.append(chain, further)
        start = self.starts[chain]
        ready = self.link_ready[chain]  # the end of the next op, as far as this one could see it
        op_end = np.concatenate(([t], ready[:-1]))
        gaps = chain.size - 1 + away  # the gap after the last op too when the chain goes on elsewhere
        starts = np.empty(chain.size + gaps, dtype=np.int64)
        ends = np.empty_like(starts)
        starts[0::2], ends[0::2] = np.maximum(start, lo), op_end
        starts[1::2], ends[1::2] = np.maximum(ready[:gaps], lo), start[:gaps]
        ops = np.repeat(chain, 2)[:starts.size]
        inferred = np.zeros(starts.size, dtype=bool)
        inferred[1::2] = self.link_inferred[chain[:gaps]]
        seg.extend(starts, ends, self.causes[ops].astype(np.int64), ops, inferred)
        if away:
            return further, int(ready[-1]), True
        return int(chain[-1]), int(op_end[-1]), False

    def _ancestors(self, n: int, k: int, j: int) -> np.ndarray:
        """The ops 0, r, 2r, … links back from ``n`` (r = 16**j), up to ``k`` links: the ops 16r apart from
        the next table, the 15 between each two of them one gather of this table each (about ``k / r``
        gathers in all, fewer than one per bit of ``k`` per op)."""
        step = LIFT_RADIX ** j
        count = k // step + 1
        if count == 1:
            return np.array([n], dtype=np.int64)
        heads = self._ancestors(n, k, j + 1)  # every 16th of these
        out = np.empty(count, dtype=np.int64)
        out[0::LIFT_RADIX] = heads[:out[0::LIFT_RADIX].size]
        cur = heads
        for r in range(1, min(LIFT_RADIX, count)):
            cur = self.lift[j][cur]
            slots = out[r::LIFT_RADIX]
            slots[:] = cur[:slots.size]
        return out

    def last_ended(self, t: int) -> int:
        """The op that ended last at or before ``t`` (NONE if none)."""
        j = int(np.searchsorted(self.ends, t, side="right")) - 1
        return int(self.by_end[j]) if j >= 0 else NONE

    def step(self, lo: int, hi: int, first: int, stop: int) -> Walk:
        """Walk [lo, hi) back from its end; ``first:stop`` are the ops that start inside it. Returns the
        walk: its segments, the ns left unattributed, the thread that ended the step."""
        if stop > first:
            clipped = np.minimum(np.asarray(self.end[first:stop]), hi)
            n = first + int(np.argmax(clipped))
            t, tid = int(clipped[n - first]), int(self.tid[n])
        else:
            n, t, tid = NONE, lo, NONE
        w = self.begin(lo, hi, n, t, tid, len(self.start) + 1)
        self.run(w)
        return w

    def begin(self, lo: int, hi: int, n: int, t: int, tid: int, turns: int) -> Walk:
        """A walk of [lo, hi) from the op that ends it last, ``n`` (NONE: none), at ``t`` (its end or hi),
        ``tid`` its launching thread: on the host when the device had finished before hi."""
        w = Walk(lo, hi, Segments(), turns=turns, limit=turns, host_turns=turns)
        w.tail_tid = self._tail_thread(t, hi, tid)
        if t < hi:  # the device had finished: the step's end is on the host
            w.at, w.t, w.tid = "host", hi, w.tail_tid
        elif n == NONE:
            w.at = "done"
        else:
            w.n, w.t = n, t
        return w

    def run(self, w: Walk) -> None:
        """Walk on until the step's start, or until the walk needs what lies before this graph's part of the
        step (``cut``: an op of the margin that started after the step's start, or the op that had ended
        by a time before the cut): ``w`` is left there, to go on on the part before (blame/window.py)."""
        lo, seg = w.lo, w.seg
        while w.at != "done":
            if w.at != "op":
                if self._host(w):
                    return
                continue
            n, t = w.n, w.t
            if n < self.margin and self.starts[n] > lo:
                return
            if w.turns <= 0:  # each turn moves to an op that ended no later: no cycles
                w.at = "done"
                break
            w.turns -= 1
            n, t, away = self._chain(seg, n, t, lo)
            if away:
                w.n, w.t = n, t
                return
            s = self.start[n]
            w.at = "done"
            if s <= lo:
                break
            kind = self.kind[n]
            if kind == NONE:
                w.residual += s - lo
                break
            r = self.ready[n]
            if kind == LAUNCH:
                seg.add(max(r, lo), s, CODE["host.launch"], n)
                if r > lo:
                    w.at, w.t, w.tid, w.host_turns = "host", r, int(self.tid[n]), w.limit
                continue
            r = min(r, s)  # a device edge with a gap longer than the start latency: not explained
            w.residual += s - max(r, lo)
            if r > lo:
                w.at, w.n, w.t = "op", int(self.src[n]), r

    def _tail_thread(self, t: int, hi: int, last_tid: int) -> int:
        """The thread that ended the step after the device finished at ``t``: the one whose blocking call
        returned last in (t, hi] (it waited for the device; PyTorch's autograd thread launches the
        backward pass but the training loop's thread synchronises), else the last op's launching thread."""
        best, when = NONE, t
        for tid, (_, ends) in self.blocking.items():
            j = int(np.searchsorted(ends, hi, side="right")) - 1
            if j >= 0 and ends[j] > when:
                best, when = tid, int(ends[j])
        if best != NONE:
            return best
        return last_tid if last_tid >= 0 else self.side.main_tid

    def _host(self, w: Walk) -> bool:
        """Walk the host back from ``w.t`` on thread ``w.tid``: its work (by cause) back to its last blocking
        call, whose return the device's drain bound. A long quiet stretch of the thread while another
        thread called CUDA is the thread waiting for that one (the training loop in ``backward()`` while
        autograd's thread launches): the walk goes on along the other thread from its last call. Leaves
        the walk at the op it continues from ("op"), or done when the host reached the step's start;
        returns True when it needs the op that had ended by a blocking call's return before ``cut``."""
        seg, lo = w.seg, w.lo
        while w.host_turns > 0 or w.at == "sync":  # every turn moves back in time
            if w.at == "sync":
                c0, c1 = w.c0, w.c1
                if c1 < self.cut:
                    return True
                w.after_sync += self._before_next_call(w.tid, c1, w.t)
                q = self.last_ended(c1)
                if q != NONE and self.end[q] > max(c0, lo):
                    seg.add(self.end[q], c1, CODE["host.sync"])
                    w.at, w.n, w.t = "op", q, int(self.end[q])
                    return False
                seg.add(max(c0, lo), c1, CODE["host.sync"])
                w.at, w.t = "host", c0
                continue
            w.host_turns -= 1
            t, tid = w.t, w.tid
            if t <= lo:
                break
            calls = self.blocking.get(tid)
            j = int(np.searchsorted(calls[0], t, side="left")) - 1 if calls is not None else -1
            floor = max(min(int(calls[1][j]), t), lo) if j >= 0 else lo
            handoff = self.host.handoff(floor, t, tid)
            if handoff is not None:
                resume, other, other_t = handoff
                self._host_work(seg, resume, t, tid)
                seg.add(other_t, resume, CODE["host.launch"])
                w.t, w.tid = other_t, other
                continue
            if j < 0 or calls[1][j] <= lo:
                self._host_work(seg, lo, t, tid)
                break
            c0, c1 = int(calls[0][j]), min(int(calls[1][j]), t)
            self._host_work(seg, c1, t, tid)
            w.at, w.c0, w.c1 = "sync", c0, c1  # (t, tid: the thread and time the stretch of host work ended)
        w.at = "done"
        return False

    def _before_next_call(self, tid: int, c1: int, t: int) -> int:
        """ns of [c1, t) on thread ``tid`` before its first CUDA call after ``c1``: the host computing
        after a blocking call returned, before it queued anything again (once it launches, its time is
        launch work, which the synchronisation did not cause)."""
        calls = self.host.calls.get(tid)
        if calls is None:
            return t - c1
        j = int(np.searchsorted(calls[0], c1, side="right"))
        if j < calls[0].size:
            return min(int(calls[0][j]), t) - c1
        later = self.side.later(tid, c1, t) if self.side.later is not None else None
        return (min(later, t) if later is not None else t) - c1

    def _host_work(self, seg: Segments, a: int, b: int, tid: int) -> None:
        """[a, b) of host work, split by cause; the pieces are laid back to back (their order inside the
        interval is not a dependency, only their sum matters)."""
        t = b
        for cause, ns in self.host.split(a, b, tid):
            seg.add(t - ns, t, CODE[cause])
            t -= ns


def _step_floor(start: np.ndarray, steps: Steps) -> np.ndarray:
    """Per op (``start`` sorted, as the ops are), the start of the earliest step it starts in: no walk that
    passes the op goes back past it (a walk of a step passes only ops that start inside the step). Steps may
    overlap (a CPU range's start and the device's end); an op inside none gets the start of the last step
    before it (no walk passes it). Steps out of order give no floor (the chains are not cut).

    The floor changes only just after a step's start or the latest end so far: it is found once per piece
    between those times and repeated over the piece's ops."""
    lows = steps.starts
    lowest = np.iinfo(np.int64).min
    if not lows.size or np.any(lows[1:] < lows[:-1]):
        return np.full(start.size, lowest)
    reach = np.maximum.accumulate(steps.ends)
    cuts = distinct(np.concatenate([lows, reach]))  # pieces: (−inf, c0], (c0, c1], …, (c_last, inf)
    probe = np.append(cuts, cuts[-1] + 1)  # a time in each piece (the floor is the same across it)
    at = np.searchsorted(lows, probe, side="left") - 1  # the last step that started before
    inside = np.searchsorted(reach, probe, side="left")  # the first step that ends at or after
    at = np.where(inside <= at, inside, at)
    floor = np.where(at >= 0, lows[np.maximum(at, 0)], lowest)
    bounds = np.searchsorted(start, cuts, side="right")
    return np.repeat(floor, np.diff(bounds, prepend=0, append=start.size))


def _blocking(tl: Timeline) -> dict[int, iv.Intervals]:
    """Per thread, the merged intervals of its blocking CUDA calls."""
    api = tl.api
    if not len(api):
        return {}
    rows = api["name"].where(lambda name: bool(BLOCKING_API.match(str(name))))
    s, e, tid = api.col("start")[rows], api.col("end")[rows], api.col("tid")[rows]
    return {int(t): iv.union(s[tid == t], e[tid == t]) for t in distinct(tid).tolist()}


def rank_path(tl: Timeline, ops: Ops, edges: Edges, steps: Steps, instances: np.ndarray,
              marks: Marks | None = None) -> RankPath:
    """Every step of one rank walked back on its whole graph (see the module docstring). ``instances``: the
    kernel rows of the rank's collective instances in order (perfdoctor.measure.collectives), so the join
    can find the peers' arrivals of each comm segment; ``marks``: the ops the focus metrics weigh
    (perfdoctor.blame.focus). blame/window.py walks the same steps a window of steps at a time."""
    walks = StepWalks(tl, steps, instances)
    walks.walk(_Walker(tl, ops, edges, steps), ops, edges, marks if marks is not None else Marks.empty(len(ops)),
               0, len(steps))
    return walks.result()


class StepWalks:
    """The walks of a rank's steps, filled a run of steps at a time (on the whole graph or on windows of it:
    blame/window.py), and the :class:`RankPath` they make."""

    def __init__(self, tl: Timeline, steps: Steps, instances: np.ndarray) -> None:
        self.tl, self.steps, self.instances = tl, steps, instances
        n = len(steps)
        self.by_cause = np.zeros((n, len(CAUSES)))
        self.focus = np.zeros((n, len(FOCUS)))
        self.focus_saving: dict[str, int] = {}
        self.residual = np.zeros(n)
        self.comm: list[list[np.ndarray]] = [[], [], [], [], []]
        self.durations = steps.durations.astype(np.int64)
        self.rep = int(np.argsort(self.durations, kind="stable")[(n - 1) // 2]) if n else 0  # the (lower) median
        self.path: dict[str, Any] = {}
        self.saving: dict[str, int] = {}

    def walk(self, walker: _Walker, ops: Ops, edges: Edges, marks: Marks, i0: int, i1: int) -> None:
        """Walk steps ``i0:i1`` on ``ops`` (every op a walk of them reaches: blame/window.py)."""
        lows, highs = self.steps.starts[i0:i1], self.steps.ends[i0:i1]
        firsts = np.searchsorted(ops.start, lows, side="left")
        stops = np.searchsorted(ops.start, highs, side="left")
        for i, (lo, hi, first, stop) in enumerate(zip(lows.tolist(), highs.tolist(), firsts.tolist(), stops.tolist()),
                                                  start=i0):
            w = walker.step(lo, hi, first, stop)
            w.seg.settle(ops, marks)
            self.record(i, w)
            if i == self.rep:
                self._representative(walker, ops, edges, marks, lo, hi, first, stop, w.tail_tid)

    def record(self, i: int, w: Walk) -> None:
        """Step ``i``'s walk (done, its segments settled): its causes, focus, comm segments, and its path
        when it is the representative step (its what-ifs are :meth:`_representative`'s)."""
        cols = w.seg.columns()
        cause = cols["cause"]
        self.by_cause[i] = np.bincount(cause, weights=cols["end"] - cols["start"], minlength=len(CAUSES))
        self.residual[i] = w.residual
        self.focus[i] = on_path(cols, w.lo, self.by_cause[i, CODE["host.sync"]], w.after_sync)
        on_comm = IS_COMM[cause]
        comm = self.comm
        comm[0].append(np.full(int(on_comm.sum()), i, dtype=np.int64))
        comm[1].append(_instance_of(cols["kernel"][on_comm], self.instances))
        comm[2].append(cols["start"][on_comm])
        comm[3].append(cols["end"][on_comm])
        comm[4].append(cause[on_comm])
        if i == self.rep:
            self.path = _compact(self.tl, {k: v[::-1] for k, v in cols.items()}, self.instances)

    def _representative(self, walker: _Walker, ops: Ops, edges: Edges, marks: Marks, lo: int, hi: int, first: int,
                        stop: int, tail_tid: int) -> None:
        """The representative step's what-ifs: it replayed without each cause (and focus entry) worth it."""
        i = self.rep
        by_cause, focus = self.by_cause, self.focus
        worth = [c for c in np.flatnonzero(by_cause[i] >= WHATIF_SHARE * (hi - lo)).tolist()
                 if CAUSES[c] != "host.sync"] if stop - first <= REPLAY_MAX_OPS else []
        large = stop - first > REPLAY_MAX_OPS
        worth_focus = [] if large else np.flatnonzero(focus[i] >= WHATIF_SHARE * (hi - lo)).tolist()
        if worth or worth_focus:
            replay = Replay(ops, edges, walker, lo, hi, first, stop, tail_tid)
            self.saving = {CAUSES[c]: replay.saving(c) for c in worth}
            focus_saving: dict[str, int] = {}
            kinds = np.flatnonzero(focus[i, 1:LN] > 0)
            for f in sorted(worth_focus, key=lambda f: f == 0):  # one kind of unfused kernel only: one replay
                same = f == 0 and kinds.size == 1 and FOCUS[1 + kinds[0]] in focus_saving
                focus_saving[FOCUS[f]] = (focus_saving[FOCUS[1 + kinds[0]]] if same
                                          else _focus_saving(replay, marks, f, first, stop))
            self.focus_saving = focus_saving

    def result(self) -> RankPath:
        arrays = [np.concatenate(c) if c else np.zeros(0, dtype=np.int64) for c in self.comm]
        return RankPath(self.by_cause, self.residual, self.durations, *arrays, representative=self.rep,
                        path=self.path, saving=self.saving, focus=self.focus, focus_saving=self.focus_saving)


def _focus_saving(replay: Replay, marks: Marks, f: int, first: int, stop: int) -> int:
    """ns the step would be shorter without focus entry ``f``: its kernels taking no time, the blocked
    norms starting when their own stream and launch let them, or the blocking calls returning at once."""
    if f == SYNC:
        return replay.saving(-1, no_sync=True)
    if f == LN:
        return replay.saving(-1, cut=(marks.delay[first:stop] > 0).tolist())
    kind = marks.unfused[first:stop]
    return replay.saving(-1, zero=(kind >= 0 if f == 0 else kind == f - 1).tolist())


def _instance_of(kernel: np.ndarray, instances: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
    """Collective instance index of each kernel row (−1: not an instance, or not a kernel)."""
    pos = np.minimum(np.searchsorted(instances, kernel), max(instances.size - 1, 0))
    hit = (kernel >= 0) & (instances.size > 0) & (instances[pos] == kernel) if instances.size else \
        np.zeros(kernel.size, dtype=bool)
    if valid is not None:
        hit &= valid
    return np.where(hit, pos, -1)


def _compact(tl: Timeline, cols: dict[str, np.ndarray], instances: np.ndarray) -> dict[str, np.ndarray]:
    """The representative step's segments (time order) for the report: adjacent segments of one cause
    merged, except collectives (the cross-rank join splits each at its own last arrival); each run named
    by its first segment: the kernel's name, copy/fill, or the host's activity (names are decoded for these
    runs only, never for every op). Columns at their width (the driver holds one per rank until the join,
    perfdoctor.width): one row per run, times as ``base`` + ``start`` offsets and ``length``, ``what``
    indexes ``names``, ``cause`` indexes CAUSES."""
    start, end, cause, op = cols["start"], cols["end"], cols["cause"], cols["op"]
    if not start.size:
        return {}
    comm = IS_COMM[cause]
    new_run = np.ones(start.size, dtype=bool)
    new_run[1:] = (cause[1:] != cause[:-1]) | (start[1:] != end[:-1]) | comm[1:] | comm[:-1]
    heads = np.flatnonzero(new_run)
    last = np.append(heads[1:], start.size) - 1
    inferred = np.logical_or.reduceat(cols["inferred"], heads)
    head_op = op[heads]
    kernel = cols["kernel"][heads]
    names = tl.kernels["short_name"] if len(tl.kernels) and "short_name" in tl.kernels else None
    decoded = (names[kernel[kernel >= 0]].decode() if names is not None and (kernel >= 0).any()
               else np.zeros(0, dtype=object))
    what, k = [], 0
    for c, kern in zip(cause[heads].tolist(), kernel.tolist()):
        name = CAUSES[c]
        if name.startswith("host."):
            what.append(HOST_WHAT[name])
        elif kern >= 0:
            what.append(str(decoded[k]) if names is not None else "device op")
        else:
            what.append("copy" if name == "copy" else "device op")
        k += kern >= 0
    unique, what_code = np.unique(np.array(what, dtype=object), return_inverse=True)
    base, since = offsets(start[heads])
    return {"base": base, "names": unique.tolist(), "rows": rows({
        "start": since, "length": narrow(end[last] - start[heads]), "cause": narrow(cause[heads]),
        "what": narrow(what_code), "inferred": inferred,
        "instance": narrow(_instance_of(kernel, instances, head_op >= 0))})}


HOST_WHAT = {"host.launch": "CPU issuing launches (Python and launch overhead)", "host.data": "data loading",
             "host.gc": "garbage collection", "host.optimizer": "optimizer step on the CPU",
             "host.outside_ops": "host work outside profiled ops (GC, I/O, Python)",
             "host.sync": "waiting for the device to drain (synchronize / blocking copy / .item())"}
