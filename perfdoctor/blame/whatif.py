"""What a step would lose if one cause took no time: the dependency graph replayed forward (DESIGN §3
"a what-if re-walks the graph with the knob's edges shortened").

For the median step of a rank, every op is started again in its original order at the latest of its
dependencies' new times (launch, stream, event: :mod:`perfdoctor.blame.graph`) plus the latency it had
after them, and runs for its duration — zero for the ops of the removed cause. The host moves too: a
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
from perfdoctor.blame.graph import LAUNCH, Edges, Ops
from perfdoctor.measure import intervals as iv

HOST_CAUSES = tuple(CODE[c] for c in CAUSES if c.startswith("host.") and c != "host.sync")


class Replay:
    """One step of one rank, ready to be replayed without each cause in turn."""

    def __init__(self, ops: Ops, edges: Edges, walker: object, lo: int, hi: int, first: int, stop: int,
                 tail_tid: int) -> None:
        self.ops, self.lo, self.hi, self.first, self.stop = ops, lo, hi, first, stop
        self.walker = walker
        self.tail_tid = tail_tid
        order = np.argsort(edges.dst, kind="stable")
        dst = edges.dst[order]
        bounds = np.searchsorted(dst, np.arange(first, stop + 1))
        self.into = [(edges.kind[order[a:b]].tolist(), edges.src[order[a:b]].tolist(),
                      edges.ready[order[a:b]].tolist()) for a, b in zip(bounds[:-1], bounds[1:])]
        self.start, self.end = ops.start.tolist(), ops.end.tolist()
        self.launch, self.tid, self.cause = ops.launch.tolist(), ops.tid.tolist(), ops.cause.tolist()
        self.syncs = {tid: [(int(a), int(b)) for a, b in zip(*calls) if lo <= b <= hi]
                      for tid, calls in walker.blocking.items()}
        self.last_op = (max(range(first, stop), key=lambda n: min(self.end[n], hi)) if stop > first else -1)

    def saving(self, cause: int) -> int:
        """ns the step would be shorter without ``cause`` (0 when it would not be)."""
        end2 = {}
        removed = self._host_removal(cause) if cause in HOST_CAUSES else None
        state = {tid: [0, 0, 0] for tid in self.syncs}  # per thread: next sync, shift at it, its return
        for n in range(self.first, self.stop):
            kinds, srcs, readies = self.into[n - self.first]
            start = self.start[n]
            binding = max(readies, default=start)
            start2 = start if not kinds else self.lo
            for kind, src, ready in zip(kinds, srcs, readies):
                if kind == LAUNCH:
                    ready2 = ready - self._shift(state, end2, self.tid[n], ready, removed)
                else:
                    ready2 = end2.get(src, self.end[src])
                # the latency it had after the edge that bound it (a launch call's own time, the device's
                # start latency); an edge that did not bind has no known latency
                start2 = max(start2, ready2 + (start - ready if ready == binding else 0))
            end2[n] = start2 + (0 if self.cause[n] == cause else self.end[n] - start)
        device = (end2[self.last_op] if self.last_op >= 0 else self.lo)
        device_old = min(self.end[self.last_op], self.hi) if self.last_op >= 0 else self.lo
        host = self.hi - self._shift(state, end2, self.tail_tid, self.hi, removed) if device_old < self.hi else device
        return max(0, self.hi - max(device, host, self.lo + 1))

    def _shift(self, state: dict, end2: dict, tid: int, t: int, removed: dict | None) -> int:
        """How much earlier the host thread ``tid`` reaches time ``t`` in the replay."""
        syncs = self.syncs.get(tid)
        if syncs is None:
            return self._removed(removed, tid, self.lo, t)
        st = state[tid]
        while st[0] < len(syncs) and syncs[st[0]][1] <= t:
            c0, c1 = syncs[st[0]]
            before = st[1] + self._removed(removed, tid, st[2] or self.lo, c0)
            q = self.walker.last_ended(c1)
            if q != -1 and self.end[q] > c0:
                c1_new = max(c0 - before, end2.get(q, self.end[q]) + (c1 - self.end[q]))
            else:
                c1_new = c1 - before
            st[0], st[1], st[2] = st[0] + 1, max(c1 - c1_new, 0), c1
        return st[1] + self._removed(removed, tid, st[2] or self.lo, t)

    def _removed(self, removed: dict | None, tid: int, a: int, b: int) -> int:
        if removed is None or b <= a or tid not in removed:
            return 0
        return iv.measure(iv.clip(removed[tid], a, b))

    def _host_removal(self, cause: int) -> dict[int, iv.Intervals]:
        """Per thread, the intervals of host cause ``cause`` in the step (see causes.HostRanges.split)."""
        host = self.walker.host
        name = CAUSES[cause]
        out = {}
        for tid in set(self.tid[self.first:self.stop]) | {self.tail_tid}:
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
            quiet = host.quiet_stretches(self.lo, self.hi, tid)
            out[tid] = iv.intersect(rest, quiet) if name == "host.outside_ops" else iv.subtract(rest, quiet)
        return out
