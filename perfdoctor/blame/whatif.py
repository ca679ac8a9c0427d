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

HOST_CAUSES = tuple(CODE[c] for c in CAUSES if c.startswith("host.") and c != "host.sync")


class Replay:
    """One step of one rank, ready to be replayed without each cause in turn (plain lists: the replay is a
    Python loop over the step's ops, one per cause replayed)."""

    def __init__(self, ops: Ops, edges: Edges, walker: object, lo: int, hi: int, first: int, stop: int,
                 tail_tid: int) -> None:
        self.lo, self.hi, self.first, self.stop = lo, hi, first, stop
        self.walker, self.tail_tid = walker, tail_tid
        self.end = ops.end  # sources may lie before the step: looked up one at a time
        self.start_s, self.end_s = ops.start[first:stop].tolist(), ops.end[first:stop].tolist()
        self.tid_s, self.cause_s = ops.tid[first:stop].tolist(), ops.cause[first:stop].tolist()
        mine = slice(first, stop)
        self.launch = ops.launch[mine].tolist()
        self.stream_src, self.event_src = edges.stream_src[mine].tolist(), edges.event_src[mine].tolist()
        self.wait_src = edges.wait_src[mine].tolist()
        bind = edges.bind[mine]
        ready = edges.ready if len(edges.ready) else np.zeros(1, dtype=np.int64)  # no edge at all: none binds
        self.binding = np.where(bind >= 0, ready[np.maximum(bind, 0)], ops.start[mine]).tolist()
        self.syncs = {tid: [(int(a), int(b)) for a, b in zip(*calls) if lo <= b <= hi]
                      for tid, calls in walker.blocking.items()}
        self.last_op = first + int(np.argmax(np.minimum(ops.end[first:stop], hi))) if stop > first else -1
        self.no_sync = False

    def saving(self, cause: int, zero: list[bool] | None = None, cut: list[bool] | None = None,
               no_sync: bool = False) -> int:
        """ns the step would be shorter without ``cause`` (0 when it would not be); or (cause −1) without
        the step's ops marked in ``zero``, with the ops marked in ``cut`` not waiting for another stream
        (their event edge removed), or with every blocking call returning at once (``no_sync``)."""
        end2: dict[int, int] = {}
        self.no_sync = no_sync
        removed = self._host_removal(cause) if cause in HOST_CAUSES else None
        before = self._removed_before_launch(removed)
        state = {tid: [0, 0, 0] for tid in self.syncs}
        for i, n in enumerate(range(self.first, self.stop)):
            start, binding = self.start_s[i], self.binding[i]
            start2 = self.lo
            launch = self.launch[i]
            if launch >= 0:
                shift = self._shift(state, end2, self.tid_s[i], launch, removed, before[i])
                start2 = launch - shift + (start - launch if launch == binding else 0)
            for src in (self.stream_src[i], -1 if cut is not None and cut[i] else self.event_src[i]):
                if src >= 0:
                    ready = int(self.end[src])
                    # the latency it had after the edge that bound it; an edge that did not bind has none known
                    start2 = max(start2, end2.get(src, ready) + (start - ready if ready == binding else 0))
            if (w := self.wait_src[i]) >= 0:  # a recorded wait that never bound: no later than it allows
                start2 = max(start2, end2.get(w, int(self.end[w])))
            if launch < 0 and self.stream_src[i] < 0 and self.event_src[i] < 0:
                start2 = start
            gone = self.cause_s[i] == cause or (zero is not None and zero[i])
            end2[n] = start2 + (0 if gone else self.end_s[i] - start)
        device = end2[self.last_op] if self.last_op >= 0 else self.lo
        device_old = min(int(self.end[self.last_op]), self.hi) if self.last_op >= 0 else self.lo
        host = device
        if device_old < self.hi:
            host = self.hi - self._shift(state, end2, self.tail_tid, self.hi, removed, None)
        return max(0, self.hi - max(device, host, self.lo + 1))

    def _shift(self, state: dict, end2: dict, tid: int, t: int, removed: dict | None,
               removed_to_t: int | None) -> int:
        """How much earlier the host thread ``tid`` reaches time ``t`` in the replay; ``removed_to_t`` is
        the removed host time of the thread in [lo, t) when known."""
        if removed_to_t is None:
            removed_to_t = self._removed(removed, tid, self.lo, t)
        syncs = self.syncs.get(tid)
        if syncs is None:
            return removed_to_t
        st = state[tid]  # next sync, the shift after the last one, removed host time up to its return
        while st[0] < len(syncs) and syncs[st[0]][1] <= t:
            c0, c1 = syncs[st[0]]
            at_c0 = self._removed(removed, tid, self.lo, c0)
            early = st[1] + at_c0 - st[2]
            q = self.walker.last_ended(c1)
            if self.no_sync:
                c1_new = c0 - early
            elif q != -1 and self.end[q] > c0:
                q_end = int(self.end[q])
                c1_new = max(c0 - early, end2.get(q, q_end) + (c1 - q_end))
            else:
                c1_new = c1 - early
            st[0], st[1], st[2] = st[0] + 1, max(c1 - c1_new, 0), self._removed(removed, tid, self.lo, c1)
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
