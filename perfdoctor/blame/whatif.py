"""What a step would lose if one cause took no time: the dependency graph replayed forward (DESIGN §3
"a what-if re-walks the graph with the knob's edges shortened").

For the median step of a rank, every op is started again in its original order at the latest of its
dependencies' new times (launch, stream, event: :mod:`perfdoctor.blame.graph`) plus the latency it had
after them, and no earlier than the op a recorded stream wait of its own most likely waited for (an nsys
stream-wait record that never bound: removing what delayed the op more must not let it run ahead of data
it needed), and runs for its duration — zero for the ops of the removed cause. The host moves too: a
removed host cause takes its time out of the thread's launch times (GC, data loading, optimizer and
outside-ops ranges, or the launch overhead itself), and a blocking call returns as soon as the op it
waited for ends in the replay, so everything the host did after it moves up by as much. The step's new
length is the later of its last op's end and the host's end; the saving is the difference, never more than
the cause's time on the critical path (a gain of at most T/(T−R), R its blocking time).

Knobs shorten a cause rather than remove it; rules scale the saving (rules/*.yaml ``what_if``).
"""

from __future__ import annotations

import numpy as np

from perfdoctor.blame.causes import CAUSES, CODE, HOST_RANGES
from perfdoctor.blame.graph import Edges, Ops
from perfdoctor.measure import intervals as iv
from perfdoctor.table import distinct

_NEVER = np.iinfo(np.int64).max  # the return of a blocking call after the last: later than every launch
HOST_CAUSES = tuple(CODE[c] for c in CAUSES if c.startswith("host.") and c != "host.sync")


class Replay:
    """One step of one rank, ready to be replayed without each cause in turn. The replay is a Python loop
    over the step's ops (each op waits for ops the replay moved before it), so everything that does not
    depend on the cause replayed is computed once here: per op, its duration, the latency it had after
    its launch and after each edge, and where each edge's source ends (its slot in the replay's list of
    ends: an op of the step, or one before or after it, whose end the replay never moves)."""

    def __init__(self, ops: Ops, edges: Edges, walker: object, lo: int, hi: int, first: int, stop: int,
                 tail_tid: int) -> None:
        self.lo, self.hi, self.first, self.stop = lo, hi, first, stop
        self.walker, self.tail_tid = walker, tail_tid
        self.end = ops.end  # sources may lie before the step: looked up one at a time
        mine = slice(first, stop)
        start, end = ops.start[mine], ops.end[mine]
        self.tid_s, self.cause_s = ops.tid[mine].tolist(), ops.cause[mine]
        self.dur = (end - start).tolist()
        launch = ops.launch[mine]
        self.launch = launch.tolist()
        stream, event, wait = edges.stream_src[mine], edges.event_src[mine], edges.wait_src[mine]
        binding = edges.ready[mine]  # an op's start where no edge binds it
        # the latency an op had after the launch or edge that bound it; one that did not bind has none known
        launch_lat = np.where(launch == binding, start - launch, 0)
        outside = distinct(np.concatenate([s[(s >= 0) & ((s < first) | (s >= stop))] for s in (stream, event, wait)]))
        # ends in the replay: the step's ops (moved as they are replayed), then the outside sources (never moved)
        self.ends0 = np.concatenate([end, ops.end[outside]]).tolist()
        n = stop - first

        def slot(src: np.ndarray) -> np.ndarray:
            inside = (src >= first) & (src < stop)
            return np.where(src < 0, -1, np.where(inside, src - first, n + np.searchsorted(outside, src)))

        def lat(src: np.ndarray) -> np.ndarray:
            src_end = ops.end[np.maximum(src, 0)] if len(ops.end) else np.zeros(src.size, dtype=np.int64)
            return np.where((src >= 0) & (src_end == binding), start - src_end, 0)

        self.event_slot = slot(event).tolist()  # a replay may cut event edges: kept apart from the rest
        free = (launch < 0) & (stream < 0) & (event < 0)  # starts where it started
        # what every replay reads of an op and no cause changes, one tuple per op: the loop walks four
        # sequences instead of twelve
        self.rows = list(zip(start.tolist(), free.tolist(), self.launch, self.tid_s, launch_lat.tolist(),
                             slot(stream).tolist(), lat(stream).tolist(), lat(event).tolist(), slot(wait).tolist()))
        self.syncs = {tid: [(int(a), int(b)) for a, b in zip(*calls) if lo <= b <= hi]
                      for tid, calls in walker.blocking.items()}
        self.last_op = first + int(np.argmax(np.minimum(end, hi))) if stop > first else -1
        self.no_sync = False

    def saving(self, cause: int, zero: list[bool] | None = None, cut: list[bool] | None = None,
               no_sync: bool = False) -> int:
        """ns the step would be shorter without ``cause`` (0 when it would not be); or (cause −1) without
        the step's ops marked in ``zero``, with the ops marked in ``cut`` not waiting for another stream
        (their event edge removed), or with every blocking call returning at once (``no_sync``)."""
        self.no_sync = no_sync
        removed = self._host_removal(cause) if cause in HOST_CAUSES else None
        before = self._removed_before_launch(removed)
        # per thread with blocking calls: the next call, the shift after the last one, removed host time up
        # to its return, and when the next call returns (past every launch once none is left)
        state = {tid: [0, 0, 0, calls[0][1] if calls else _NEVER] for tid, calls in self.syncs.items()}
        gone = self.cause_s == cause
        if zero is not None:
            gone |= np.asarray(zero, dtype=bool)
        dur = np.where(gone, 0, self.dur).tolist() if gone.any() else self.dur
        event_slot = self.event_slot if cut is None else [-1 if c else s for s, c in zip(self.event_slot, cut)]
        ends = self.ends0.copy()  # the replayed ends so far (an op not replayed yet: its own end)
        lo = self.lo
        for i, ((start, free, launch, tid, launch_lat, s_slot, s_lat, e_lat, w_slot), e_slot, d, removed_to) in \
                enumerate(zip(self.rows, event_slot, dur, before)):
            if free:
                ends[i] = start + d
                continue
            start2 = lo
            if launch >= 0:
                st = state.get(tid)
                if st is None:
                    shift = removed_to
                elif st[3] <= launch:
                    shift = self._shift(state, ends, tid, launch, removed, removed_to)
                else:
                    shift = st[1] + removed_to - st[2]
                start2 = launch - shift + launch_lat
            if s_slot >= 0 and (t := ends[s_slot] + s_lat) > start2:
                start2 = t
            if e_slot >= 0 and (t := ends[e_slot] + e_lat) > start2:
                start2 = t
            if w_slot >= 0 and (t := ends[w_slot]) > start2:  # a recorded wait that never bound: no later
                start2 = t
            ends[i] = start2 + d
        device = ends[self.last_op - self.first] if self.last_op >= 0 else self.lo
        device_old = min(int(self.end[self.last_op]), self.hi) if self.last_op >= 0 else self.lo
        host = device
        if device_old < self.hi:
            host = self.hi - self._shift(state, ends, self.tail_tid, self.hi, removed, None)
        return max(0, self.hi - max(device, host, self.lo + 1))

    def _shift(self, state: dict, ends: list[int], tid: int, t: int, removed: dict | None,
               removed_to_t: int | None) -> int:
        """How much earlier the host thread ``tid`` reaches time ``t`` in the replay; ``removed_to_t`` is
        the removed host time of the thread in [lo, t) when known; ``ends``: the replay's ends so far."""
        if removed_to_t is None:
            removed_to_t = self._removed(removed, tid, self.lo, t)
        syncs = self.syncs.get(tid)
        if syncs is None:
            return removed_to_t
        st = state[tid]  # as saving() made it
        while st[0] < len(syncs) and syncs[st[0]][1] <= t:
            c0, c1 = syncs[st[0]]
            at_c0 = self._removed(removed, tid, self.lo, c0)
            early = st[1] + at_c0 - st[2]
            q = self.walker.last_ended(c1)
            if self.no_sync:
                c1_new = c0 - early
            elif q != -1 and self.end[q] > c0:
                q_end = int(self.end[q])
                q_new = ends[q - self.first] if self.first <= q < self.stop else q_end
                c1_new = max(c0 - early, q_new + (c1 - q_end))
            else:
                c1_new = c1 - early
            st[0], st[1], st[2] = st[0] + 1, max(c1 - c1_new, 0), self._removed(removed, tid, self.lo, c1)
        st[3] = syncs[st[0]][1] if st[0] < len(syncs) else _NEVER
        return st[1] + removed_to_t - st[2]

    def _removed(self, removed: dict | None, tid: int, a: int, b: int) -> int:
        if removed is None or b <= a or tid not in removed:
            return 0
        return iv.measure(iv.clip(removed[tid], a, b))

    def _removed_before_launch(self, removed: dict | None) -> list[int]:
        """Per op of the step, the removed host time of its launching thread from the step's start to its
        launch (one vectorised pass instead of one interval clip per op)."""
        n = self.stop - self.first
        if removed is None:
            return [0] * n
        launch = np.asarray(self.launch, dtype=np.int64)
        tid = np.asarray(self.tid_s, dtype=np.int64)
        out = np.zeros(n, dtype=np.int64)
        for thread, spans in removed.items():
            sel = np.flatnonzero((tid == thread) & (launch > self.lo))
            if sel.size and spans[0].size:
                out[sel] = iv.overlap_per_interval(np.full(sel.size, self.lo, dtype=np.int64), launch[sel], spans)
        return out.tolist()

    def _host_removal(self, cause: int) -> dict[int, iv.Intervals]:
        """Per thread, the intervals of host cause ``cause`` in the step (see causes.HostRanges.split)."""
        host = self.walker.host
        name = CAUSES[cause]
        out = {}
        for tid in set(self.tid_s) | {self.tail_tid}:
            if tid < 0:
                continue
            span = (np.array([self.lo], dtype=np.int64), np.array([self.hi], dtype=np.int64))
            if name in dict(HOST_RANGES):
                out[tid] = iv.intersect(span, host.ranges[name].get(tid, iv.EMPTY))
                continue
            parts = [host.ranges[c].get(tid, iv.EMPTY) for c, _ in HOST_RANGES]
            parts.append(self.walker.blocking.get(tid, iv.EMPTY))
            ranged = iv.union(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
            rest = iv.subtract(span, ranged)
            quiet = host.quiet_stretches(self.lo, self.hi)
            out[tid] = iv.intersect(rest, quiet) if name == "host.outside_ops" else iv.subtract(rest, quiet)
        return out
