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

from dataclasses import dataclass

import numpy as np

from perfdoctor.blame.causes import CATEGORY_CAUSE, CODE
from perfdoctor.classify.groups import GROUPS, GroupLabels
from perfdoctor.classify.projection import launch_calls
from perfdoctor.model import Timeline
from perfdoctor.table import Table

LAUNCH, STREAM, EVENT = 0, 1, 2
EDGE_KINDS = ("launch", "stream", "event")
# Dependent work on another stream starts within a few us of the end it waited for (the device's own
# scheduling latency); an op that started this close after another stream's op ended, later than its own
# stream and launch allowed, waited for it.
EVENT_EPS_NS = 10_000
SYNC_STREAM_WAIT_EVENT = 2  # nsys ENUM_CUPTI_SYNC_TYPE
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


@dataclass(frozen=True)
class Edges:
    """Dependency edges as columns, and per op its binding edge (aligned with the ops)."""

    src: np.ndarray  # op index, −1 for the host (launch edges)
    dst: np.ndarray
    kind: np.ndarray  # int8: LAUNCH, STREAM or EVENT
    inferred: np.ndarray  # bool
    ready: np.ndarray  # when the edge was satisfied (source end; launch call start)
    bind: np.ndarray  # per op: the index into these columns of its binding edge, −1 when it has none
    # per op, the sources of its stream and event edges (−1: none): the replay (blame/whatif.py) reads them
    stream_src: np.ndarray
    event_src: np.ndarray
    # per op with a recorded stream wait (nsys) that never bound: the other stream's op that ended last
    # before it, the wait's likely source (−1: none). Not an edge of the path (it did not bind); the replay
    # keeps it, so an op does not run ahead of data it needed once what delayed it more is removed.
    wait_src: np.ndarray


def device_ops(tl: Timeline, kcls: Table, ccls: Table, groups: GroupLabels) -> Ops:
    """Kernels, copies and fills of ``tl`` with their cause and launch call."""
    k, c, f = tl.kernels, tl.memcpy, tl.memset
    k_cause = _kernel_causes(kcls, groups)
    c_cause = np.full(len(c), CODE["copy"], dtype=np.int16)
    if len(c):
        c_cause[ccls["category"].mask("comm")] = CODE["transfer.other"]  # peer copies move data between GPUs
    parts = [(t, cause, np.arange(len(t)) if t is k else np.full(len(t), NONE)) for t, cause in
             ((k, k_cause), (c, c_cause), (f, np.full(len(f), CODE["compute.other"], dtype=np.int16)))]
    cols = {name: np.concatenate([t.col(name) if len(t) else np.zeros(0, np.int64) for t, _, _ in parts])
            for name in ("start", "end", "stream")}
    calls = [launch_calls(t, tl.api) if len(t) else (np.zeros(0, np.int64),) * 3 for t, _, _ in parts]
    launch = np.concatenate([call[0] for call in calls])
    tid = np.concatenate([call[2] for call in calls])
    cause = np.concatenate([cause for _, cause, _ in parts])
    kernel = np.concatenate([rows for _, _, rows in parts])
    order = np.argsort(cols["start"], kind="stable")
    return Ops(cols["start"][order], cols["end"][order], cols["stream"][order], cause[order], kernel[order],
               launch[order], tid[order])


def _kernel_causes(kcls: Table, groups: GroupLabels) -> np.ndarray:
    """Per kernel its cause code: compute by class, comm by parallel group."""
    n = len(kcls)
    out = np.full(n, CODE["compute.other"], dtype=np.int16)
    if not n:
        return out
    category = kcls["category"]
    for cat, cause in CATEGORY_CAUSE.items():
        out[category.mask(cat)] = CODE[cause]
    comm = category.mask("comm")
    group = groups.codes
    for g, name in enumerate(GROUPS):
        cause = "pipeline.p2p" if name == "pp" else f"transfer.{name}"
        out[comm & (group == g)] = CODE.get(cause, CODE["transfer.other"])
    out[comm & (group < 0)] = CODE["transfer.other"]
    return out


def edges(ops: Ops, sync: Table) -> Edges:
    """Every op's launch, stream and (inferred) event edges, and its binding edge."""
    n = len(ops)
    idx = np.arange(n)
    # Stream predecessors: ops grouped by stream in start order.
    by_stream = np.argsort(ops.stream, kind="stable")  # by stream, then start order (a third faster than lexsort)
    same = np.zeros(n, dtype=bool)
    same[1:] = ops.stream[by_stream[1:]] == ops.stream[by_stream[:-1]]
    prev = np.full(n, NONE)
    prev[by_stream[1:][same[1:]]] = by_stream[:-1][same[1:]]
    # Event candidates: the op of another stream that ended last at or before this op's start.
    by_end = np.argsort(ops.end, kind="stable")
    ends = ops.end[by_end]
    other = np.full(n, NONE)
    j = np.searchsorted(ends, ops.start, side="right") - 1
    for _ in range(3):  # step over ops of the same stream (their end is the stream edge already)
        ok = (j >= 0) & (other == NONE)
        cand = np.where(ok, by_end[np.maximum(j, 0)], NONE)
        hit = ok & (ops.stream[np.maximum(cand, 0)] != ops.stream)
        other[hit] = cand[hit]
        j = np.where(ok & ~hit, j - 1, -1)
    s_ready = np.where(prev >= 0, ops.end[np.maximum(prev, 0)], np.iinfo(np.int64).min)
    e_ready = np.where(other >= 0, ops.end[np.maximum(other, 0)], np.iinfo(np.int64).min)
    l_ready = np.where(ops.launch >= 0, ops.launch, np.iinfo(np.int64).min)
    event = (other >= 0) & (ops.start - e_ready <= EVENT_EPS_NS) & (e_ready > s_ready) & (e_ready > l_ready)
    recorded = _recorded_waits(ops, prev, sync)
    has = (ops.launch >= 0, prev >= 0, event)  # per kind (LAUNCH, STREAM, EVENT): which ops have the edge
    # Binding edge per op: the latest ready; on a tie the device edge (the later kind) wins. The event
    # edge exists only where it is later than the others.
    bind_kind = np.where(event, EVENT, np.where(has[1] & (s_ready >= l_ready), STREAM,
                                                np.where(has[0], LAUNCH, NONE)))
    # Edge columns: the kept edges of each kind in turn, ops in order within a kind.
    keep = np.concatenate(has)
    position = np.cumsum(keep) - 1
    bind = np.where(bind_kind >= 0, position[np.maximum(bind_kind, 0) * n + idx], NONE)
    kind = np.repeat(np.array([LAUNCH, STREAM, EVENT], dtype=np.int8), [int(h.sum()) for h in has])
    src = np.concatenate([np.full(int(has[0].sum()), NONE), prev[has[1]], other[has[2]]])
    dst = np.concatenate([idx[h] for h in has])
    ready = np.concatenate([l_ready[has[0]], s_ready[has[1]], e_ready[has[2]]])
    inferred = np.concatenate([np.zeros(int(has[0].sum() + has[1].sum()), dtype=bool), ~recorded[has[2]]])
    return Edges(src, dst, kind, inferred, ready, bind, prev, np.where(event, other, NONE),
                 np.where(recorded & ~event & (other >= 0), other, NONE))


def _recorded_waits(ops: Ops, prev: np.ndarray, sync: Table) -> np.ndarray:
    """Per op: whether a stream-wait synchronization record on its stream lies between its stream
    predecessor's launch and its own launch (the trace recorded the wait, so the event edge is not
    inferred)."""
    out = np.zeros(len(ops), dtype=bool)
    if not len(sync) or "sync_type" not in sync:
        return out
    waits = sync.take(sync.col("sync_type") == SYNC_STREAM_WAIT_EVENT)
    if not len(waits):
        return out
    w_stream, w_start = waits.col("stream"), waits.col("start")
    lo = np.where(prev >= 0, ops.launch[np.maximum(prev, 0)], np.iinfo(np.int64).min)
    for stream in np.unique(w_stream).tolist():
        times = np.sort(w_start[w_stream == stream])
        mine = np.flatnonzero((ops.stream == stream) & (ops.launch >= 0))
        first = np.searchsorted(times, lo[mine], side="left")
        out[mine] = (first < times.size) & (times[np.minimum(first, times.size - 1)] <= ops.launch[mine])
    return out
