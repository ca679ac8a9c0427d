"""Host gaps: device-idle time inside steps, and what the CPU was doing that caused it (DESIGN §3).

A gap is *host-caused* when the launch call of the op that ends it had not begun when the gap began
(the CPU was late); otherwise the device was waiting on something else (a dependency, another rank).
A host-caused gap is attributed, whole, to one cause of what the host did between the device going idle
and the next launch call (the gap's *host window*):

1. a range the trace records covers most of the window: data loading (perfdoctor ``data``, PyTorch's
   ``enumerate(DataLoader)#…`` / ``…DataLoaderIter.__next__``, Megatron's ``batch-generator``) → ``data``;
   perfdoctor ``gc`` → ``gc``; ``Optimizer.step#…`` / ``Optimizer.zero_grad#…`` / Megatron's
   ``optimizer…`` timers → ``optimizer``;
2. else what the launching thread was inside at the instant the device went idle: a CUDA synchronize or
   blocking copy → ``sync``; one of those ranges → its cause;
3. else, when most of the window is a *pause* of the whole process — no CUDA call and, in a PyTorch
   profiler trace, no operator, for an order of magnitude longer than its usual stretch between them —
   → ``outside_ops``: the host was outside anything profiled (GC, I/O, plain Python). One long gap with
   no launch call in it is not launch overhead;
4. else → ``launch_bound``: the CPU was issuing launches and ops, just not fast enough.

Gaps whose next op has no launch call in the trace cannot be attributed and count as ``other``.
:func:`gap_causes` gives every gap with its cause (the critical path blames host time with it);
:func:`host_gaps` sums them per step. Both work a window of whole steps at a time (``WINDOW_OPS``), so the
per-gap arrays are a window's while the timeline-wide lookups (next op, launch calls, ranges, pauses) are
made once; a step's gaps never cross a window, so the results are the one pass's, bit for bit.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from perfdoctor.classify.projection import call_columns, kernel_launch_calls, launch_calls
from perfdoctor.heap import give_back_freed
from perfdoctor.load.labels import labelled, matching
from perfdoctor.measure import intervals as iv
from perfdoctor.measure.steps import Steps, step_at
from perfdoctor.memo import per_object
from perfdoctor.model import Timeline
from perfdoctor.quantiles import median
from perfdoctor.table import Table, distinct, factorize, starts_in_order

CAUSES = ("launch_bound", "sync", "gc", "data", "optimizer", "outside_ops", "other")
DEVICE_WAIT = -1  # cause code of a gap the device waited out (a dependency, another rank): not host-caused
RANGE_CAUSES = ("gc", "data", "optimizer")

# Calls that block the CPU until the device drains (names without the _vNNNN suffix).
BLOCKING_API = re.compile(
    r"^(cuda(Device|Stream|Event|Ctx|Thread)Synchronize|cu(Ctx|Stream|Event)Synchronize"
    r"|cudaMemcpy(2D|3D)?(ToSymbol|FromSymbol|ToArray|FromArray)?|cudaMemcpyPeer|cudaMemset(2D|3D)?"
    r"|cuMemcpy(DtoH|HtoD|DtoD|AtoH|HtoA|Peer)?(_v\d+)?"
    # ROCm (HIP runtime names in PyTorch-profiler traces from AMD GPUs)
    r"|hip(Device|Stream|Event|Ctx)Synchronize|hipMemcpy(2D|3D)?(ToSymbol|FromSymbol|WithStream|Peer)?"
    r"|hipMemset(2D|3D)?)$"
)
# Data-loading ranges: perfdoctor's own label, what PyTorch's profiler names the DataLoader fetch, Megatron's
# batch timer.
DATA_RANGE = re.compile(r"^(data( .*)?|enumerate\(DataLoader\).*|.*DataLoaderIter.*__next__.*|batch-generator)$")
# Optimizer ranges: PyTorch's profiler names every optimizer step and zero_grad (``Optimizer.step#AdamW.step``);
# Megatron's timers ``optimizer``, ``optimizer-copy-to-main-grad``, ``optimizer-inner-step``, ...
OPTIMIZER_RANGE = re.compile(r"^(Optimizer\.(step|zero_grad)#.*|optimizer(-[\w-]+)?)$")
# A stretch without any CUDA call or operator this many times the process's median one is a pause of the
# host (GC, I/O, Python outside ops), not the launch loop's own pace (whose stretches vary by a few times).
PAUSE_FACTOR = 10.0


@dataclass(frozen=True)
class GapCauses:
    """Every device-idle interval inside the steps (sorted, disjoint; a gap spanning a step boundary is
    split), with ``cause`` an index into ``CAUSES`` or ``DEVICE_WAIT``, ``step`` the index of its step,
    and for sync gaps ``returned``, when the blocking call returned (else the gap's start)."""

    start: np.ndarray  # int64 ns
    end: np.ndarray
    cause: np.ndarray  # int8
    step: np.ndarray  # int64
    returned: np.ndarray  # int64 ns

    @property
    def names(self) -> np.ndarray:
        """Cause names (object array; ``"device_wait"`` for gaps the device waited out)."""
        return np.array([*CAUSES, "device_wait"], dtype=object)[np.where(self.cause >= 0, self.cause, len(CAUSES))]


@dataclass(frozen=True)
class HostGaps:
    """Per step (aligned with the steps), ns of device idle time by cause, and device-side waits."""

    by_cause: dict[str, np.ndarray]
    device_wait: np.ndarray
    idle: np.ndarray
    wait_intervals: iv.Intervals  # the device-side waits themselves (pipeline bubbles are made of them)
    spans: dict[str, iv.Intervals] = field(default_factory=dict)  # the host-caused gaps by cause (timeline excerpt)
    # Of the sync-stall time per step, the part after the blocking call returned (host work before the next
    # launch, DESIGN §3): the rest is the CPU waiting for the device to drain.
    sync_host: np.ndarray = field(default_factory=lambda: np.zeros(0))


# Gaps are attributed a window of whole steps at a time, each window about this many device-busy intervals
# (so about as many gaps): the per-gap temporaries (a dozen arrays) are a window's, not the trace's, and at
# 2 MB each the heap serves them again window after window (heap.py) instead of mapping fresh pages.
WINDOW_OPS = 1 << 18


def host_gaps(tl: Timeline, steps: Steps, busy: iv.Intervals, context: HostContext | None = None,
              next_start: int | None = None) -> HostGaps:
    """Attribute every idle interval of ``busy`` inside the steps, summed per step and cause. For a window of
    a timeline's steps (perfdoctor.measure.windows), ``context`` is the whole timeline's and ``next_start``
    the start of the step after the window's last."""
    n = len(steps)
    width = len(CAUSES) + 1  # column 0 the device-side waits
    table = np.zeros((n, width))
    sync_host = np.zeros(n)
    # the gaps of each cause, and the device-side waits: at most one per busy interval and step edge
    bound = busy[0].size + 2 * n + 2
    spans = {c: (iv.Column(bound), iv.Column(bound)) for c in CAUSES}
    waits = iv.Column(bound), iv.Column(bound)
    windows = 0
    for gaps in _windows(tl, steps, busy, context, next_start):
        windows += 1
        g0, g1, cause, step_of = gaps.start, gaps.end, gaps.cause, gaps.step
        length = (g1 - g0).astype(np.float64)
        # A step's gaps all lie in one window, so its sums are the ones a single pass gives (added to 0.0).
        table += np.bincount(step_of * width + cause + 1, weights=length, minlength=n * width).reshape(n, width)
        for i, c in enumerate(CAUSES):
            of = cause == i
            spans[c][0].add(g0[of])
            spans[c][1].add(g1[of])
        waiting = cause == DEVICE_WAIT
        waits[0].add(g0[waiting])
        waits[1].add(g1[waiting])
        sync = cause == CAUSES.index("sync")
        after = np.clip(g1[sync] - np.maximum(gaps.returned[sync], g0[sync]), 0, None).astype(np.float64)
        sync_host += np.bincount(step_of[sync], weights=after, minlength=n)
    if not windows:
        zero = np.zeros(n)
        return HostGaps({c: zero.copy() for c in CAUSES}, zero, zero.copy(), iv.EMPTY, sync_host=zero.copy())
    by_cause = {c: table[:, i + 1] for i, c in enumerate(CAUSES)}
    device_wait, idle = table[:, 0], table.sum(axis=1)
    joined = {c: (spans[c][0].done(), spans[c][1].done()) for c in CAUSES}
    waited = waits[0].done(), waits[1].done()
    # The windows' temporaries were heap memory that the (large, mapped) columns do not reuse.
    give_back_freed(sum(s.nbytes + e.nbytes for s, e in [waited, *joined.values()]))
    return HostGaps(by_cause, device_wait, idle, waited, joined, sync_host)


def gap_causes(tl: Timeline, steps: Steps, busy: iv.Intervals) -> GapCauses:
    """Every idle interval of ``busy`` inside the steps, with its cause (module docstring)."""
    parts = list(_windows(tl, steps, busy))
    if not parts:
        none = np.zeros(0, dtype=np.int64)
        return GapCauses(none, none, none.astype(np.int8), none, none)
    if len(parts) == 1:
        return parts[0]
    return GapCauses(*(np.concatenate([getattr(p, f) for p in parts])
                       for f in ("start", "end", "cause", "step", "returned")))


def window_bounds(steps: Steps, busy: iv.Intervals, size: int) -> np.ndarray:
    """Step indices where the windows begin and end (``[0, ..., len(steps)]``): consecutive steps with about
    ``size`` busy intervals between them, a larger step alone. Steps out of order make one window."""
    n = len(steps)
    if n < 2 or not np.all(steps.starts[1:] >= steps.starts[:-1]):
        return np.array([0, n])
    before = np.searchsorted(busy[0], steps.starts, side="left")  # busy intervals starting before each step
    cut = np.flatnonzero(np.diff(before // max(size, 1))) + 1
    return np.concatenate(([0], cut, [n]))


def _windows(tl: Timeline, steps: Steps, busy: iv.Intervals, context: HostContext | None = None,
             next_start: int | None = None) -> Iterator[GapCauses]:
    """:class:`GapCauses` of each window of whole steps (:func:`window_bounds`) that has gaps, in time order.
    The per-timeline lookups (ranges, blocking calls, pauses) are made once, at the first window with gaps."""
    n = len(steps)
    if not n:
        return
    # Steps stay separate intervals (not merged when they touch), so a gap spanning a step boundary is
    # split and each step is charged its own part.
    step_ends = np.minimum(steps.ends, np.append(steps.starts[1:], steps.ends[-1] if next_start is None
                                                 else next_start))
    bounds = window_bounds(steps, busy, WINDOW_OPS)
    ops: list[tuple[np.ndarray, np.ndarray]] | None = None
    for a, b in zip(bounds[:-1], bounds[1:]):
        starts, ends = steps.starts[a:b], step_ends[a:b]
        lo, hi = int(starts.min()), int(ends.max())
        first = np.searchsorted(busy[1], lo, side="right")  # the busy intervals reaching into [lo, hi)
        last = np.searchsorted(busy[0], hi, side="left")
        g0, g1 = iv.intersect(iv.complement((busy[0][first:last], busy[1][first:last]), lo, hi), (starts, ends))
        if not g0.size:
            continue
        context = context or HostContext(tl)
        ops = ops or _op_starts(tl)
        yield _causes(tl, steps, g0, g1, context, ops)


class HostContext:
    """What a gap's cause is looked up in besides the device's ops: the timeline's ranges, blocking calls,
    pauses and main thread. Made once from the whole timeline and shared by its windows: a pause is long
    next to the whole process's median stretch, a range or a blocking call may begin windows earlier."""

    def __init__(self, tl: Timeline) -> None:
        self.ranges = {c: _ranges_where(tl, c) for c in RANGE_CAUSES}
        self.threads = {c: _by_thread(self.ranges[c]) for c in RANGE_CAUSES}
        self.blocking = _by_thread(_blocking_calls(tl.api))
        self.pauses = host_pauses(tl)
        self.present = [c for c in RANGE_CAUSES if len(self.ranges[c])]
        self.spans = [_spans(self.ranges[c]) for c in self.present]
        self._tl: Timeline | None = tl
        self._main: int | None = None

    def main_thread(self) -> int:
        """:func:`main_thread` of the whole timeline, found once, when first asked (only gaps with no later
        op and the Perfetto excerpt ask)."""
        if self._main is None:
            self._main = main_thread(self._tl)
            self._tl = None
        return self._main


def _causes(tl: Timeline, steps: Steps, g0: np.ndarray, g1: np.ndarray, look: HostContext,
            ops: list[tuple[np.ndarray, np.ndarray]]) -> GapCauses:
    """The causes of the gaps ``[g0, g1)`` (sorted, each inside one step)."""
    step_of = np.clip(step_at(steps.starts, g0), 0, len(steps) - 1)
    has_next, next_corr = _next_ops(ops, g1)  # the op that ends the gap (first start >= gap end)
    next_launch, next_tid = call_columns(next_corr, tl.api, ("start", "tid"))
    if not has_next.all():
        # No later op: the CPU never launched again within the trace; look at the main launching thread.
        next_tid = np.where(has_next, next_tid, look.main_thread())
    unknown = has_next & (next_launch < 0)
    host_caused = ~unknown & (~has_next | (next_launch >= g0))
    # The host window: from the device going idle to the next launch call (the whole gap without one).
    w1 = np.where(has_next & (next_launch >= g0), np.minimum(next_launch, g1), g1)
    window = (w1 - g0).astype(np.float64)

    blocking = look.blocking
    # 2. at the instant the device went idle; the later assignments win (sync over gc over data over optimizer)
    cause = np.full(g0.size, CAUSES.index("launch_bound"), dtype=np.int8)
    for c in ("optimizer", "data", "gc"):
        cause[_inside(g0, next_tid, look.threads[c])] = CAUSES.index(c)
    cause[_inside(g0, next_tid, blocking)] = CAUSES.index("sync")
    # 3. a pause of the whole process over most of the window
    paused = _covered(g0, w1, look.pauses) * 2 > window
    cause[paused & (cause == CAUSES.index("launch_bound"))] = CAUSES.index("outside_ops")
    # 1. a recorded range over most of the window wins over both
    # (a cause without ranges covers nothing, so it can be the most of no window: only the others are weighed)
    if present := look.present:
        cover = np.stack([_covered(g0, w1, spans) for spans in look.spans])
        best = np.argmax(cover, axis=0)
        most = cover[best, np.arange(g0.size)] * 2 > window
        cause[most] = np.array([CAUSES.index(c) for c in present], dtype=np.int8)[best[most]]
    cause[~host_caused] = DEVICE_WAIT
    cause[unknown] = CAUSES.index("other")
    returned = g0.copy()
    sync = cause == CAUSES.index("sync")
    returned[sync] = _covering_end(g0[sync], next_tid[sync], blocking)
    return GapCauses(g0, g1, cause, step_of.astype(np.int64), returned)


def _covered(starts: np.ndarray, ends: np.ndarray, spans: iv.Intervals) -> np.ndarray:
    """ns of each window [starts[i], ends[i]) that ``spans`` (normal form) covers, as float."""
    return iv.overlap_per_interval(starts, ends, spans).astype(np.float64)


def _spans(rows: Table) -> iv.Intervals:
    """The union of ``rows`` over every thread of the process."""
    if not len(rows):
        return iv.EMPTY
    return iv.union(rows.col("start"), rows.col("end"))


@per_object  # the host-gap causes and the critical path's host split both ask
def host_pauses(tl: Timeline) -> iv.Intervals:
    """Stretches in which no thread of the process made a CUDA call or (PyTorch profiler) ran an operator,
    at least ``PAUSE_FACTOR`` times the process's median stretch between them."""
    starts, ends = [tl.api.col("start")], [tl.api.col("end")]
    nvtx = tl.nvtx
    if tl.trace.format == "kineto-json" and len(nvtx):
        from perfdoctor.load.kineto import OP_CATEGORY  # loaded already for this input; an nsys one never pays

        ops = nvtx.col("category") == OP_CATEGORY
        starts.append(nvtx.col("start")[ops])
        ends.append(nvtx.col("end")[ops])
    if len(starts) == 1 and np.all(starts[0][1:] >= starts[0][:-1]):  # the calls come sorted (nsys)
        return _sorted_pauses(starts[0], ends[0])
    s, e = iv.union(*((starts[0], ends[0]) if len(starts) == 1 else (np.concatenate(starts), np.concatenate(ends))))
    if s.size < 2:
        return iv.EMPTY
    gap_s, gap_e = e[:-1], s[1:]
    length = gap_e - gap_s
    long = length > PAUSE_FACTOR * float(median(length))
    return gap_s[long], gap_e[long]


def _sorted_pauses(start: np.ndarray, end: np.ndarray) -> iv.Intervals:
    """:func:`host_pauses` of calls sorted by start, without their union: the stretches between them are
    found a slice at a time (twice: for the median, then for the long ones), so only their lengths are
    counted (:class:`_Median`), not held (at 10M calls 8 MB, instead of the union's and the stretches' 300 MB)."""
    length = _Median()
    for gap_s, gap_e in _stretches(start, end):
        length.add(gap_e - gap_s)
    if not length.size:
        return iv.EMPTY
    limit = PAUSE_FACTOR * length.median()
    out = [(gap_s[long], gap_e[long]) for gap_s, gap_e in _stretches(start, end) for long in [gap_e - gap_s > limit]]
    return np.concatenate([s for s, _ in out]), np.concatenate([e for _, e in out])


def _stretches(start: np.ndarray, end: np.ndarray):
    """The gaps of the union of the intervals ``[start, end)`` (sorted by start), slice by slice: as
    :func:`iv.union` merges them (empty ones dropped, touching ones merged), the gap before each interval
    that begins past everything before it, from how far those reach."""
    reach = None
    for lo in range(0, start.size, WINDOW_OPS):
        s = np.asarray(start[lo:lo + WINDOW_OPS], dtype=np.int64)
        e = np.asarray(end[lo:lo + WINDOW_OPS], dtype=np.int64)
        keep = e > s
        if not keep.all():
            s, e = s[keep], e[keep]
        if not s.size:
            continue
        before = np.empty_like(e)  # how far the intervals before each one reach
        before[0] = e[0]
        np.maximum.accumulate(e[:-1], out=before[1:])
        if reach is None:
            new = s[1:] > before[1:]
            yield before[1:][new], s[1:][new]
        else:
            before[0] = reach
            np.maximum(before, reach, out=before)
            new = s > before
            yield before[new], s[new]
        reach = max(int(before[-1]), int(e[-1]))


def _op_starts(tl: Timeline) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each device-op table's (start, correlation id), sorted by start, kernels first (a kernel wins a tie
    in :func:`_next_ops`): sorted once, searched by every window."""
    out = []
    for table in (tl.kernels, tl.memcpy, tl.memset):
        if not len(table):
            continue
        start, order = starts_in_order(table)  # kernels come sorted; copies and fills may not
        ids = table.col("correlation_id")
        out.append((start, ids if order is None else ids[order]))
    return out


def _next_ops(ops: list[tuple[np.ndarray, np.ndarray]], t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each instant ``t[i]``: whether a device op (kernel, copy, fill) starts at or after it, and the
    correlation id of the first one (a kernel wins a tie). One search per table and gap, instead of
    merging and sorting every op of the timeline."""
    first = np.full(t.size, np.iinfo(np.int64).max, dtype=np.int64)
    corr = np.full(t.size, -1, dtype=np.int64)
    for start, ids in ops:
        i = np.minimum(np.searchsorted(start, t, side="left"), start.size - 1)
        found = start[i]
        earlier = (found >= t) & (found < first)
        i = i[earlier]
        first[earlier], corr[earlier] = found[earlier], ids[i]
    return first < np.iinfo(np.int64).max, corr


def main_thread(tl: Timeline) -> int:
    """The thread that launched most device work (−1 when no launch call is known)."""
    call_tid = np.concatenate([kernel_launch_calls(tl)[2], launch_calls(tl.memcpy, tl.api)[2],
                               launch_calls(tl.memset, tl.api)[2]])
    known = call_tid[call_tid >= 0]
    if not known.size:
        return -1
    codes, values = factorize(known)
    return int(values[np.argmax(np.bincount(codes))])


def _blocking_calls(api: Table) -> Table:
    if not len(api):
        return api
    return api.take(api["name"].where(lambda name: bool(BLOCKING_API.match(str(name)))))


def _ranges_where(tl: Timeline, cause: str) -> Table:
    """The closed ranges that name ``cause``: perfdoctor ``gc``, data-loading or optimizer ranges."""
    if cause == "gc":
        rows = labelled(tl.nvtx, "gc")
    else:
        rows = matching(tl.nvtx, DATA_RANGE if cause == "data" else OPTIMIZER_RANGE)
    return rows.take(rows.col("end") >= 0)


def _by_thread(spans: Table) -> dict[int, iv.Intervals]:
    """The union of ``spans`` on each thread that has any (made once, looked up by every window)."""
    if not len(spans):
        return {}
    s_tid = spans.col("tid")
    out = {}
    for thread in distinct(s_tid):
        sel = s_tid == thread
        out[int(thread)] = iv.union(spans.col("start")[sel], spans.col("end")[sel])
    return out


def _covering_end(t: np.ndarray, tid: np.ndarray, covers: dict[int, iv.Intervals]) -> np.ndarray:
    """For instants known to lie inside one of the spans ``covers`` holds for their thread: when that
    (merged) span ends."""
    out = t.copy()
    for thread in distinct(tid):
        if (cover := covers.get(int(thread))) is None:
            continue
        mine = np.flatnonzero(tid == thread)
        k = np.clip(np.searchsorted(cover[0], t[mine], side="right") - 1, 0, None)
        out[mine] = cover[1][k]
    return out


def _inside(t: np.ndarray, tid: np.ndarray, covers: dict[int, iv.Intervals]) -> np.ndarray:
    """Whether instant ``t[i]`` lies inside one of the spans (start <= t < end) on thread ``tid[i]``."""
    result = np.zeros(t.size, dtype=bool)
    if not t.size:
        return result
    for thread, cover in covers.items():
        mine = np.flatnonzero(tid == thread)
        if not mine.size or not cover[0].size:  # zero-length spans (a GC of 0 ms) cover no instant
            continue
        k = np.searchsorted(cover[0], t[mine], side="right") - 1
        ok = k >= 0
        kk = np.maximum(k, 0)
        result[mine] = ok & (t[mine] < cover[1][kk])
    return result


@dataclass(frozen=True)
class LaunchStats:
    """Kernel time against launch time: when kernels are shorter than the CPU's interval between
    launches, the GPU drains its queue faster than Python fills it (a host-bound run)."""

    kernel_us: float | None  # median kernel duration (per launch call: a graph's kernels as one span)
    launch_call_us: float | None  # median duration of the launch API call
    launch_interval_us: float | None  # median time between consecutive launches on a thread
    short_kernel_fraction: float | None  # kernels shorter than the interval to the next launch


def launch_stats(tl: Timeline) -> LaunchStats:
    """:class:`LaunchStats` of the timeline's kernels: a slice of kernels at a time where every kernel has
    its own launch call, in launch order on one thread (:func:`_eager_launch_stats`, the usual eager
    program), else from whole columns (:func:`_launch_stats`)."""
    return _eager_launch_stats(tl) or _launch_stats(tl)


class _Median:
    """The exact median of integers added a slice at a time, in bounded memory: the values from 0 to
    :data:`COUNTED` (1 ms in ns: nearly every launch interval, call and kernel) are counted, one count per
    value, and only the others are kept. At 10M kernels the three launch columns took 120 MB held whole;
    their counts take 8 MB each at most."""

    COUNTED = 1 << 20

    def __init__(self) -> None:
        self.counts = np.zeros(0, dtype=np.int64)
        self.below: list[np.ndarray] = []  # the values under 0
        self.above: list[np.ndarray] = []  # those past COUNTED
        self.size = 0

    def add(self, values: np.ndarray) -> None:
        counted = (values >= 0) & (values < self.COUNTED)
        if not counted.all():
            self.below.append(values[values < 0].astype(np.int64))
            self.above.append(values[values >= self.COUNTED].astype(np.int64))
            values = values[counted]
        if values.size:
            tally = np.bincount(values)
            if tally.size > self.counts.size:
                tally[:self.counts.size] += self.counts
                self.counts = tally
            else:
                self.counts[:tally.size] += tally
        self.size += counted.size

    def median(self) -> float:
        """What ``np.median`` gives for all the values (the two middle ones averaged in float64)."""
        below = np.sort(np.concatenate(self.below)) if self.below else np.zeros(0, dtype=np.int64)
        above = np.sort(np.concatenate(self.above)) if self.above else np.zeros(0, dtype=np.int64)
        cumulative = np.cumsum(self.counts)
        counted = int(cumulative[-1]) if cumulative.size else 0

        def at(rank: int) -> float:
            if rank < below.size:
                return float(below[rank])
            rank -= below.size
            if rank < counted:
                return float(np.searchsorted(cumulative, rank, side="right"))
            return float(above[rank - counted])

        return float(np.mean([at((self.size - 1) // 2), at(self.size // 2)]))


class _NotEager(Exception):
    """The kernels are not in launch order on one thread, each with its launch call."""


def _eager_calls(tl: Timeline) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The launch calls of the kernels a slice at a time, for kernels in launch order on one thread that all
    have theirs: per slice each call's start, GPU span (its first kernel's start to its last kernel's end:
    a call that started several kernels is one span) and duration. A slice ends before the last call it
    reaches, so a call's kernels are never split. Raises :class:`_NotEager` for any other kernels."""
    k = tl.kernels
    n = len(k)
    k_start, k_end = k.col("start"), k.col("end")
    lo, last, thread = 0, None, None
    while lo < n:
        hi = min(lo + WINDOW_OPS, n)
        start, end, tid = kernel_launch_calls(tl, slice(lo, hi))
        thread = tid[0] if thread is None else thread
        if not ((start >= 0).all() and (tid == thread).all() and np.all(start[1:] >= start[:-1])
                and (last is None or start[0] > last)):
            raise _NotEager
        if hi < n:  # the next slice begins with the last call's first kernel
            cut = int(np.searchsorted(start, start[-1], side="left"))
            if not cut:  # one call for the whole slice: let the whole columns say
                raise _NotEager
            start, end, hi = start[:cut], end[:cut], lo + cut
        new = start[1:] != start[:-1]
        if new.all():
            span = k_end[lo:hi] - k_start[lo:hi]
        else:
            first = np.flatnonzero(np.concatenate(([True], new)))
            span = np.maximum.reduceat(k_end[lo:hi], first)
            span -= np.minimum.reduceat(k_start[lo:hi], first)
            start, end = start[first], end[first]
        yield start, span, end - start
        last, lo = int(start[-1]), hi


def _eager_launch_stats(tl: Timeline) -> LaunchStats | None:
    """:func:`_launch_stats` for kernels in launch order on one thread that all have their launch call (None
    for others): the calls are gathered a slice at a time (:func:`_eager_calls`) and only the three columns
    whose medians are asked are counted (:class:`_Median`). At 10M kernels a few MB instead of the launch
    calls' 240 MB and their temporaries."""
    n = len(tl.kernels)
    if n < 2 or not len(tl.api):
        return None
    interval, took, spans = _Median(), _Median(), _Median()
    calls = shorter = 0
    before: tuple[int, int] | None = None  # the previous slice's last call: its start and span
    try:
        for start, span, call in _eager_calls(tl):
            if before is not None:
                start, span = np.concatenate(([before[0]], start)), np.concatenate(([before[1]], span))
            gap = np.diff(start)  # from each call to the next
            interval.add(gap)
            shorter += int(np.count_nonzero(span[:-1] < gap))  # kernels shorter than the interval to the next launch
            took.add(call)
            spans.add(span[before is not None:])
            calls += call.size
            before = int(start[-1]), int(span[-1])
    except _NotEager:
        return None
    if calls < 2:  # one call (a graph): no interval, as the whole columns say
        return None
    return LaunchStats(spans.median() / 1e3, took.median() / 1e3, interval.median() / 1e3, shorter / (calls - 1))


def _launch_stats(tl: Timeline) -> LaunchStats:
    k = tl.kernels
    call_start, call_end, call_tid = kernel_launch_calls(tl)
    ok = call_start >= 0
    n_ok = int(np.count_nonzero(ok))
    if n_ok < 2:
        return LaunchStats(None, None, None, None)
    k_start, k_end, start, end, tid = k.col("start"), k.col("end"), call_start, call_end, call_tid
    if n_ok < ok.size:  # kernels without a launch call in the trace are left out
        k_start, k_end, start, end, tid = k_start[ok], k_end[ok], start[ok], end[ok], tid[ok]
    if not ((tid == tid[0]).all() and np.all(start[1:] >= start[:-1])):  # else: one thread, launch order
        order = np.lexsort((start, tid))
        start, end, tid, k_start, k_end = start[order], end[order], tid[order], k_start[order], k_end[order]
    # One launch call can start many kernels (a CUDA graph traced kernel by kernel): statistics are per
    # call, its GPU work from its first kernel's start to its last kernel's end.
    distinct = start[1:] != start[:-1]
    distinct |= tid[1:] != tid[:-1]
    # Each array per call below is made when it is needed and let go after (the medians reorder their own
    # arrays in place): at 10M kernels, 80 MB each, three alive at most instead of seven.
    first = duration = None  # one kernel per call (eager launches): no spans to merge, k_end - k_start
    if not distinct.all():
        first = np.flatnonzero(np.concatenate(([True], distinct)))
        duration = np.maximum.reduceat(k_end, first)
        duration -= np.minimum.reduceat(k_start, first)
        tid = tid[first]
    del distinct
    same_thread = tid[1:] == tid[:-1]
    del tid
    if first is not None:
        start = start[first]
    n = start.size
    shorter = np.empty(n - 1, dtype=bool)  # kernels shorter than the interval to the next launch
    for lo in range(0, n - 1, WINDOW_OPS):
        hi = min(lo + WINDOW_OPS, n - 1)
        took = duration[lo:hi] if duration is not None else k_end[lo:hi] - k_start[lo:hi]
        np.less(took, start[lo + 1:hi + 1] - start[lo:hi], out=shorter[lo:hi])
    kernel_us = float(median(k_end - k_start if duration is None else duration, overwrite_input=True)) / 1e3
    del duration, k_start, k_end
    if not same_thread.all():
        shorter = shorter[same_thread]
    if not shorter.size:
        return LaunchStats(kernel_us, None, None, None)
    interval = np.diff(start)
    if not same_thread.all():
        interval = interval[same_thread]
    del same_thread
    interval_us = float(median(interval, overwrite_input=True)) / 1e3
    del interval
    took = end - start if first is None else end[first]
    if first is not None:
        del first
        took -= start
    call_us = float(median(took, overwrite_input=True)) / 1e3
    return LaunchStats(kernel_us, call_us, interval_us, float(shorter.mean()))
