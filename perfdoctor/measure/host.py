"""Host gaps: device-idle time inside steps, and what the CPU was doing that caused it (DESIGN §3).

A gap is *host-caused* when the launch call of the op that ends it had not begun when the gap began
(the CPU was late); otherwise the device was waiting on something else (a dependency, another rank).
A host-caused gap is attributed, whole, to what the launching thread was doing at the instant the
device went idle: inside a CUDA synchronize or blocking copy → ``sync``; inside a ``gc`` range →
``gc``; inside a data-loading range → ``data``; otherwise → ``launch_bound``. Gaps whose next op has
no launch call in the trace cannot be attributed and count as ``other``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from perfdoctor.classify.projection import calls_of, kernel_launch_calls, launch_calls
from perfdoctor.load.labels import labelled, matching
from perfdoctor.measure import intervals as iv
from perfdoctor.measure.steps import Steps
from perfdoctor.model import Timeline
from perfdoctor.table import Table, factorize

CAUSES = ("launch_bound", "sync", "gc", "data", "other")

# Calls that block the CPU until the device drains (names without the _vNNNN suffix).
BLOCKING_API = re.compile(
    r"^(cuda(Device|Stream|Event|Ctx|Thread)Synchronize|cu(Ctx|Stream|Event)Synchronize"
    r"|cudaMemcpy(2D|3D)?(ToSymbol|FromSymbol|ToArray|FromArray)?|cudaMemcpyPeer|cudaMemset(2D|3D)?"
    r"|cuMemcpy(DtoH|HtoD|DtoD|AtoH|HtoA|Peer)?(_v\d+)?)$"
)
# Data-loading ranges: perfdoctor's own label, or what PyTorch's profiler names the DataLoader fetch.
DATA_RANGE = re.compile(r"^(data( .*)?|enumerate\(DataLoader\).*|.*DataLoaderIter.*__next__.*)$")


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


def host_gaps(tl: Timeline, steps: Steps, busy: iv.Intervals) -> HostGaps:
    """Attribute every idle interval of ``busy`` inside the steps."""
    n = len(steps)
    by_cause = {c: np.zeros(n) for c in CAUSES}
    device_wait = np.zeros(n)
    # Steps stay separate intervals (not merged when they touch), so a gap spanning a step boundary is
    # split and each step is charged its own part.
    step_ends = np.minimum(steps.ends, np.append(steps.starts[1:], steps.ends[-1]))
    gaps = iv.intersect(iv.complement(busy, int(steps.starts.min()), int(steps.ends.max())),
                        (steps.starts, step_ends))
    g0, g1 = gaps
    if not g0.size:
        return HostGaps(by_cause, device_wait, device_wait.copy(), iv.EMPTY, sync_host=device_wait.copy())
    step_of = np.clip(np.searchsorted(steps.starts, g0, side="right") - 1, 0, n - 1)
    length = (g1 - g0).astype(np.float64)

    has_next, next_corr = _next_ops(tl, g1)  # the op that ends the gap (first start >= gap end)
    next_launch, _, next_tid = calls_of(next_corr, tl.api)
    if not has_next.all():
        # No later op: the CPU never launched again within the trace; look at the main launching thread.
        next_tid = np.where(has_next, next_tid, _main_thread(tl))
    unknown = has_next & (next_launch < 0)
    host_caused = ~unknown & (~has_next | (next_launch >= g0))

    # Cause per gap as an index into CAUSES; the later assignments win (sync over gc over data).
    cause = np.full(g0.size, CAUSES.index("launch_bound"), dtype=np.int8)
    cause[_inside(g0, next_tid, _ranges_where(tl, "data"))] = CAUSES.index("data")
    cause[_inside(g0, next_tid, _ranges_where(tl, "gc"))] = CAUSES.index("gc")
    blocking = _blocking_calls(tl.api)
    cause[_inside(g0, next_tid, blocking)] = CAUSES.index("sync")
    cause[~host_caused] = -1
    cause[unknown] = CAUSES.index("other")

    # One pass: ns per (step, cause), column 0 the device-side waits.
    width = len(CAUSES) + 1
    table = np.bincount(step_of * width + cause + 1, weights=length, minlength=n * width).reshape(n, width)
    by_cause = {c: table[:, i + 1] for i, c in enumerate(CAUSES)}
    waiting = cause < 0
    device_wait, idle = table[:, 0], table.sum(axis=1)
    spans = {c: (g0[cause == i], g1[cause == i]) for i, c in enumerate(CAUSES)}
    sync = cause == CAUSES.index("sync")
    returned = _covering_end(g0[sync], next_tid[sync], blocking)
    after = np.clip(g1[sync] - np.maximum(returned, g0[sync]), 0, None).astype(np.float64)
    sync_host = np.bincount(step_of[sync], weights=after, minlength=n)
    return HostGaps(by_cause, device_wait, idle, (g0[waiting], g1[waiting]), spans, sync_host)


def _next_ops(tl: Timeline, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each instant ``t[i]``: whether a device op (kernel, copy, fill) starts at or after it, and the
    correlation id of the first one (a kernel wins a tie). One search per table and gap, instead of
    merging and sorting every op of the timeline."""
    first = np.full(t.size, np.iinfo(np.int64).max, dtype=np.int64)
    corr = np.full(t.size, -1, dtype=np.int64)
    for table in (tl.kernels, tl.memcpy, tl.memset):
        if not len(table):
            continue
        start, ids = table.col("start"), table.col("correlation_id")
        if not np.all(start[1:] >= start[:-1]):  # kernels come sorted; copies and fills may not
            order = np.argsort(start, kind="stable")
            start, ids = start[order], ids[order]
        i = np.minimum(np.searchsorted(start, t, side="left"), start.size - 1)
        earlier = (start[i] >= t) & (start[i] < first)
        first[earlier], corr[earlier] = start[i][earlier], ids[i][earlier]
    return first < np.iinfo(np.int64).max, corr


def _main_thread(tl: Timeline) -> int:
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


def _ranges_where(tl: Timeline, kind: str) -> Table:
    """GC ranges (perfdoctor ``gc``) or data-loading ranges (perfdoctor ``data`` or DataLoader names)."""
    rows = labelled(tl.nvtx, "gc") if kind == "gc" else matching(tl.nvtx, DATA_RANGE)
    return rows.take(rows.col("end") >= 0)


def _covering_end(t: np.ndarray, tid: np.ndarray, spans: Table) -> np.ndarray:
    """For instants known to lie inside one of ``spans`` on their thread: when that (merged) span ends."""
    out = t.copy()
    s_tid = spans.col("tid") if len(spans) else np.zeros(0)
    for thread in np.unique(tid):
        sel = s_tid == thread
        mine = np.flatnonzero(tid == thread)
        if not sel.any():
            continue
        cover = iv.union(spans.col("start")[sel], spans.col("end")[sel])
        k = np.clip(np.searchsorted(cover[0], t[mine], side="right") - 1, 0, None)
        out[mine] = cover[1][k]
    return out


def _inside(t: np.ndarray, tid: np.ndarray, spans: Table) -> np.ndarray:
    """Whether instant ``t[i]`` lies inside one of ``spans`` (start <= t < end) on thread ``tid[i]``."""
    result = np.zeros(t.size, dtype=bool)
    if not len(spans) or not t.size:
        return result
    s_tid = spans.col("tid")
    for thread in np.unique(s_tid):
        sel = s_tid == thread
        cover = iv.union(spans.col("start")[sel], spans.col("end")[sel])
        mine = np.flatnonzero(tid == thread)
        if not mine.size:
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
    first = np.flatnonzero(np.concatenate(([True], (start[1:] != start[:-1]) | (tid[1:] != tid[:-1]))))
    if first.size == start.size:  # one kernel per call (eager launches): no spans to merge
        duration = k_end - k_start
    else:
        duration = np.maximum.reduceat(k_end, first) - np.minimum.reduceat(k_start, first)
        start, end, tid = start[first], end[first], tid[first]
    del first, k_start, k_end
    # The temporaries below are this function's own, so the medians may reorder them in place instead of
    # copying each (one array per kernel less alive at a time: this is the analysis' peak at 10M kernels).
    interval = np.diff(start)
    same_thread = tid[1:] == tid[:-1]
    shorter = duration[:-1] < interval
    if not same_thread.all():
        interval, shorter = interval[same_thread], shorter[same_thread]
    del same_thread
    kernel_us = float(np.median(duration, overwrite_input=True)) / 1e3
    del duration
    if not interval.size:
        return LaunchStats(kernel_us, None, None, None)
    call_us = float(np.median(end - start, overwrite_input=True)) / 1e3
    return LaunchStats(kernel_us, call_us, float(np.median(interval, overwrite_input=True)) / 1e3,
                       float(shorter.mean()))
