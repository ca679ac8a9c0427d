"""The dependency graph of one rank's device work, as columns (DESIGN §3 "Exposed is not blocking").

Nodes are the device ops (kernels, copies, fills) in start order, each with its cause
(:mod:`perfdoctor.blame.causes`). Edges say what an op had to wait for before it could start:

- ``launch``: its launch call began (correlation id; the source is the host, ``src`` −1);
- ``stream``: the previous op on its stream ended;
- ``event``: an op on another stream ended (``cudaStreamWaitEvent``). The traces we read do not name the
  recorded event, so the source is the op of another stream that ended last before this one started, taken
  when it ended within :data:`EVENT_EPS_NS` of the start and later than the op's other dependencies; the
  edge is ``inferred`` unless the trace has a stream-wait synchronization record on the op's stream between
  its stream predecessor's launch and its own (nsys ``CUPTI_ACTIVITY_KIND_SYNCHRONIZATION``).

The *binding* edge of an op is the one satisfied last (its ``ready`` time latest): that is the edge the
critical path follows back (:mod:`perfdoctor.blame.path`). Cross-rank edges (collective rendezvous,
pipeline send → receive) are not here: they join the ranks' paths afterwards (:mod:`perfdoctor.blame.join`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields

import numpy as np

from perfdoctor.blame.causes import CATEGORY_CAUSE, CODE
from perfdoctor.classify.groups import GROUPS, GroupLabels
from perfdoctor.classify.projection import call_columns
from perfdoctor.model import Timeline
from perfdoctor.table import Table, distinct, starts_in_order

LAUNCH, STREAM, EVENT = 0, 1, 2
EDGE_KINDS = ("launch", "stream", "event")
# Dependent work on another stream starts within a few us of the end it waited for (the device's own
# scheduling latency); an op that started this close after another stream's op ended, later than its own
# stream and launch allowed, waited for it.
EVENT_EPS_NS = 10_000
EVENT_LOOKS = 3  # the latest ends before an op's start looked at for another stream's (blame/window.py keeps them)
SYNC_STREAM_WAIT_EVENT = 2  # nsys ENUM_CUPTI_SYNC_TYPE
ENDED_SLICE = 1 << 18  # starts per merge in _ended_by
THREAD_SLICE = 1 << 20  # ops whose launching threads are looked up at once (OpSource.threads)
NONE = -1


@dataclass(frozen=True)
class Ops:
    """The device ops of one timeline in start order (aligned int64 arrays; ``kernel`` is the row in
    ``tl.kernels`` or −1 for a copy or fill; launch columns −1 where the trace has no launch call)."""

    start: np.ndarray
    end: np.ndarray
    stream: np.ndarray
    cause: np.ndarray  # int16 code into causes.CAUSES
    kernel: np.ndarray
    launch: np.ndarray  # launch call start
    tid: np.ndarray  # launching thread

    def __len__(self) -> int:
        return int(self.start.size)

    def take(self, rows: np.ndarray) -> Ops:
        return Ops(*(col[rows] for col in _columns(self)))

    def after(self, other: Ops) -> Ops:
        """``other``'s ops, then these (``other`` all start before them); these themselves (shared, not
        copied) when there are none."""
        if not len(other):
            return self
        return Ops(*(np.concatenate([a, b]) for a, b in zip(_columns(other), _columns(self))))


def _columns(ops: Ops) -> tuple[np.ndarray, ...]:
    return tuple(getattr(ops, f.name) for f in fields(ops))


@dataclass(frozen=True)
class Edges:
    """Per op its binding edge: of its launch, stream and (inferred) event edges the one satisfied last (on a
    tie the device edge, the later kind), which is all the walk and the replay follow; and per op the sources
    of its other edges."""

    kind: np.ndarray  # int8 per op: the binding edge's LAUNCH, STREAM or EVENT; NONE where the op has no edge
    src: np.ndarray  # per op: the binding edge's source op; NONE for a launch edge (the host) or no edge
    ready: np.ndarray  # per op: when its binding edge was satisfied (source's end; launch call's start), else its start
    inferred: np.ndarray  # bool per op: its binding edge is an event edge the trace did not record
    # per op, the sources of its stream and event edges (−1: none): the replay (blame/whatif.py) reads them
    stream_src: np.ndarray
    event_src: np.ndarray
    # per op with a recorded stream wait (nsys) that never bound: the other stream's op that ended last
    # before it, the wait's likely source (−1: none). Not an edge of the path (it did not bind); the replay
    # keeps it, so an op does not run ahead of data it needed once what delayed it more is removed.
    wait_src: np.ndarray
    by_end: np.ndarray  # the ops in order of their end (stable): the walk finds the op that ended last before a time


def device_ops(tl: Timeline, kcls: Table, ccls: Table, groups: GroupLabels) -> Ops:
    """Kernels, copies and fills of ``tl`` with their cause and launch call. A timeline of kernels only (the
    loader keeps them in start order) shares its kernel columns: no copy, no sort."""
    return OpSource(tl, kcls, ccls, groups).between(np.iinfo(np.int64).min, np.iinfo(np.int64).max)


class OpSource:
    """The device ops of a timeline, taken a range of start times at a time (blame/window.py walks a rank in
    windows of whole steps): per table (kernels, copies, fills) its rows in start order, their cause and
    launch call. The ops of a range come in the order of all of them (start, then kernels before copies before
    fills, then row), so a window's ops are in the whole graph's order. Launch calls are looked up for the
    ops of each range as it is taken: held for every kernel, their starts and threads were 160 MB at 10M."""

    def __init__(self, tl: Timeline, kcls: Table, ccls: Table, groups: GroupLabels) -> None:
        k, c, f = tl.kernels, tl.memcpy, tl.memset
        c_cause = np.full(len(c), CODE["copy"], dtype=np.int16)
        if len(c):
            c_cause[ccls["category"].mask("comm")] = CODE["transfer.other"]  # peer copies move data between GPUs
        # per table: (table, cause, whether its rows are kernels)
        f_cause = np.full(len(f), CODE["compute.other"], dtype=np.int16)
        self.parts = [(t, cause, t is k) for t, cause in ((k, _kernel_causes(kcls, groups)), (c, c_cause), (f, f_cause))
                      if len(t)]
        self._api = tl.api
        # per table its rows in start order (None: the table's own order, the loader's for kernels) and starts
        self.order: list[np.ndarray | None] = []
        self.starts: list[np.ndarray] = []
        for t, *_ in self.parts:
            start, order = starts_in_order(t)
            self.order.append(order)
            self.starts.append(start)

    def rank(self, t: np.ndarray, side: str) -> np.ndarray:
        """Per time, how many ops start before it (``side`` "left") or at or before it ("right")."""
        out = np.zeros(np.shape(t), dtype=np.int64)
        for start in self.starts:
            out += np.searchsorted(start, t, side=side)
        return out

    def between(self, t0: int, t1: int) -> Ops:
        """The ops that start in [t0, t1), in order."""
        cols: list[list[np.ndarray]] = [[] for _ in range(7)]
        for (t, cause, kernel), order, start in zip(self.parts, self.order, self.starts):
            a, b = np.searchsorted(start, [t0, t1], side="left").tolist()
            rows = slice(a, b) if order is None else order[a:b]
            row = (np.arange(a, b) if order is None else rows) if kernel else np.full(b - a, NONE)
            launch, tid = call_columns(t.col("correlation_id")[rows], self._api, ("start", "tid"))
            for out, col in zip(cols, (t.col("start")[rows], t.col("end")[rows], t.col("stream")[rows], cause[rows],
                                       row, launch, tid)):
                out.append(col)
        if len(cols[0]) == 1:  # one table (kernels only, usually): its columns' slices, no copy, no sort
            return Ops(*(c[0] for c in cols))
        if not cols[0]:
            return Ops(*(np.zeros(0, dtype=np.int16 if j == 3 else np.int64) for j in range(7)))
        order = np.argsort(np.concatenate(cols[0]), kind="stable")
        return Ops(*(np.concatenate(c)[order] for c in cols))

    def threads(self) -> Iterable[np.ndarray]:
        """The launching thread of every op, a slice of a table at a time (as often as iterated)."""
        return _Threads(self.parts, self._api)


class _Threads:
    """:meth:`OpSource.threads`: the ops' launching threads, looked up a slice of ops at a time."""

    def __init__(self, parts: list[tuple[Table, np.ndarray, bool]], api: Table) -> None:
        self._parts, self._api = parts, api

    def __iter__(self) -> Iterator[np.ndarray]:
        for t, *_ in self._parts:
            corr = t.col("correlation_id")
            for lo in range(0, corr.size, THREAD_SLICE):
                yield call_columns(corr[lo:lo + THREAD_SLICE], self._api, ("tid",))[0]


def _kernel_causes(kcls: Table, groups: GroupLabels) -> np.ndarray:
    """Per kernel its cause code: compute by class, comm by parallel group (a cause per distinct class and
    per group, then one gather each)."""
    n = len(kcls)
    if not n:
        return np.full(n, CODE["compute.other"], dtype=np.int16)
    category = kcls["category"]
    by_value = np.array([CODE[CATEGORY_CAUSE.get(v, "compute.other")] for v in category.values.tolist()],
                        dtype=np.int16)
    out = by_value[category.codes]
    comm = np.flatnonzero(category.mask("comm"))
    if comm.size:
        by_group = np.array([CODE.get("pipeline.p2p" if name == "pp" else f"transfer.{name}", CODE["transfer.other"])
                             for name in GROUPS] + [CODE["transfer.other"]], dtype=np.int16)
        group = groups.codes[comm].astype(np.int64)
        known = group < len(GROUPS)  # (codes are GROUPS indices or UNLABELLED, < 0)
        out[comm[known]] = by_group[np.where(group[known] < 0, len(GROUPS), group[known])]
    return out


def edges(ops: Ops, sync: Table | dict[int, np.ndarray]) -> Edges:
    """Every op's binding edge among its launch, stream and (inferred) event edges. Op indices are int32 (a
    timeline holds fewer than 2**31 ops), but for the end order, int64 positions that gathers take as they
    are; each temporary is dropped once used: at 10M ops the graph is the rank's largest structure.
    ``sync``: the timeline's synchronization records, or their stream waits (:func:`stream_waits`, for
    building many windows' graphs)."""
    n = len(ops)
    index = np.int32 if n < np.iinfo(np.int32).max else np.int64
    # Stream predecessors: ops grouped by stream in start order (a stable sort keeps start order within one).
    stream = _small(ops.stream)
    by_stream = np.argsort(stream, kind="stable")
    grouped = stream[by_stream]
    same = grouped[1:] == grouped[:-1]
    prev = np.full(n, NONE, dtype=index)
    prev[by_stream[1:][same]] = by_stream[:-1][same]
    del by_stream, grouped, same
    # Event candidates: the op of another stream that ended last at or before this op's start (stepping over
    # at most EVENT_LOOKS - 1 ops of its own stream: their end is the stream edge already). The order is
    # kept as int64 positions: they index gathers here and in the walk (numpy converts narrower ones first).
    by_end = np.argsort(ops.end, kind="stable")
    j = _ended_by(ops.end[by_end], ops.start) - 1
    end_stream = stream[by_end]  # gathered once: the ops' starts are sorted, so j is too (near reads)
    other = np.full(n, NONE, dtype=index)
    for back in range(EVENT_LOOKS - 1, -1, -1):  # the nearest op of another stream wins: written last
        at = j - back
        hit = at >= 0
        np.maximum(at, 0, out=at)
        hit &= end_stream[at] != stream
        other[hit] = by_end[at[hit]]
    del j, at, hit, end_stream
    lowest = np.iinfo(np.int64).min
    has_prev, has_other, has_launch = prev >= 0, other >= 0, ops.launch >= 0
    s_ready = np.where(has_prev, ops.end[np.maximum(prev, 0).astype(np.intp)], lowest)
    e_ready = np.where(has_other, ops.end[np.maximum(other, 0).astype(np.intp)], lowest)
    l_ready = np.where(has_launch, ops.launch, lowest)
    event = has_other & (ops.start - e_ready <= EVENT_EPS_NS) & (e_ready > s_ready) & (e_ready > l_ready)
    recorded = _recorded_waits(ops, prev, sync if isinstance(sync, dict) else stream_waits(sync))
    # Binding edge per op: the latest ready; on a tie the device edge (the later kind) wins. The event edge
    # exists only where it is later than the others. Kept per op, not as columns of every edge: the walk and
    # the replay read an op's edges through its binding one alone (at 10M ops the edge columns, their
    # concatenation and the places of the binding edges among them were a quarter of the graph's time).
    kind = np.full(n, NONE, dtype=np.int8)
    kind[has_launch] = LAUNCH
    stream_bound = has_prev & (s_ready >= l_ready)
    kind[stream_bound] = STREAM
    kind[event] = EVENT
    ready = np.where(event, e_ready, np.where(stream_bound, s_ready, np.where(has_launch, l_ready, ops.start)))
    src = np.where(event, other, np.where(stream_bound, prev, NONE)).astype(index, copy=False)
    return Edges(kind, src, ready, event & ~recorded, prev, np.where(event, other, NONE),
                 np.where(recorded & ~event & has_other, other, NONE), by_end)


def _ended_by(ends: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """``searchsorted(ends, starts, "right")`` for sorted ``starts`` too (the ops' own), a slice of starts at
    a time: the slice and the ends it reaches merged by one stable sort (a merge of two sorted runs), each
    start's place in it less the starts before it (an end equal to a start sorts first: it counts). About
    twice as fast as a search per start; its temporaries are a slice's."""
    out = np.empty(starts.size, dtype=np.int64)
    for a in range(0, starts.size, ENDED_SLICE):
        mine = starts[a:a + ENDED_SLICE]
        lo, hi = np.searchsorted(ends, [mine[0], mine[-1]], side="right").tolist()
        merged = np.argsort(np.concatenate([ends[lo:hi], mine]), kind="stable")
        out[a:a + mine.size] = np.flatnonzero(merged >= hi - lo) - np.arange(mine.size) + lo
    return out


def _small(values: np.ndarray) -> np.ndarray:
    """Stream ids as int16 where they fit (CUDA's are small): numpy's stable sort of 16-bit keys is a
    radix sort, linear in the ops."""
    if values.size and values.min() >= np.iinfo(np.int16).min and values.max() <= np.iinfo(np.int16).max:
        return values.astype(np.int16)
    return values


def stream_waits(sync: Table) -> dict[int, np.ndarray]:
    """Per stream, the sorted times of its stream-wait synchronization records (nsys)."""
    if not len(sync) or "sync_type" not in sync:
        return {}
    waits = sync.take(sync.col("sync_type") == SYNC_STREAM_WAIT_EVENT)
    if not len(waits):
        return {}
    w_stream, w_start = waits.col("stream"), waits.col("start")
    return {stream: np.sort(w_start[w_stream == stream]) for stream in distinct(w_stream).tolist()}


def _recorded_waits(ops: Ops, prev: np.ndarray, waits: dict[int, np.ndarray]) -> np.ndarray:
    """Per op: whether a stream-wait synchronization record on its stream lies between its stream
    predecessor's launch and its own launch (the trace recorded the wait, so the event edge is not
    inferred)."""
    out = np.zeros(len(ops), dtype=bool)
    if not waits:
        return out
    lo = np.where(prev >= 0, ops.launch[np.maximum(prev, 0)], np.iinfo(np.int64).min)
    for stream, times in waits.items():
        mine = np.flatnonzero((ops.stream == stream) & (ops.launch >= 0))
        first = np.searchsorted(times, lo[mine], side="left")
        out[mine] = (first < times.size) & (times[np.minimum(first, times.size - 1)] <= ops.launch[mine])
    return out
