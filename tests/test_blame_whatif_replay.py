"""The what-if replay (perfdoctor/blame/whatif.py) gives exactly the savings of the plain loop it replaced,
kept below as the reference: every cause, random ops taking no time, random event edges cut, and every
blocking call returning at once, on the steps the analysis replays in synthetic and real exports."""

from __future__ import annotations

import random

import numpy as np
import pytest

import perfdoctor.blame.path as blame_path
from perfdoctor.api import analyze
from perfdoctor.blame.causes import CAUSES
from perfdoctor.blame.whatif import HOST_CAUSES, Replay
from tests.paths import REAL_H100, SAMPLES


class LoopReplay(Replay):
    """The replay as it was: one dict of new ends, every edge looked up and its latency found per op."""

    def __init__(self, ops, edges, walker, lo, hi, first, stop, tail_tid) -> None:  # noqa: ANN001
        self.lo, self.hi, self.first, self.stop = lo, hi, first, stop
        self.walker, self.tail_tid = walker, tail_tid
        self.end = ops.end
        self.start_s, self.end_s = ops.start[first:stop].tolist(), ops.end[first:stop].tolist()
        self.tid_s, self.cause_s = ops.tid[first:stop].tolist(), ops.cause[first:stop].tolist()
        mine = slice(first, stop)
        self.launch = ops.launch[mine].tolist()
        self.stream_src, self.event_src = edges.stream_src[mine].tolist(), edges.event_src[mine].tolist()
        self.wait_src = edges.wait_src[mine].tolist()
        self.binding = edges.ready[mine].tolist()
        self.syncs = {tid: [(int(a), int(b)) for a, b in zip(*calls) if lo <= b <= hi]
                      for tid, calls in walker.blocking.items()}
        self.last_op = first + int(np.argmax(np.minimum(ops.end[first:stop], hi))) if stop > first else -1
        self.no_sync = False

    def saving(self, cause, zero=None, cut=None, no_sync=False) -> int:  # noqa: ANN001
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


TRACES = [REAL_H100, *(SAMPLES / name / f"{name}.rank0.sqlite" for name in
                       ("host_bound", "gc_pause", "data_stall", "ln_blocked", "exposed_tp", "pp_1f1b", "moe_ep"))]


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.parent.name)
def test_replay_matches_the_loop(trace, monkeypatch) -> None:  # noqa: ANN001
    made: list[tuple] = []

    class Recorded(Replay):
        def __init__(self, *args) -> None:  # noqa: ANN002
            made.append(args)
            super().__init__(*args)

    monkeypatch.setattr(blame_path, "Replay", Recorded)
    analyze([trace])
    assert made, "the analysis replayed no step"
    rng = random.Random(trace.name)
    seen_host = seen_saving = False
    for args in made:
        new, old = Replay(*args), LoopReplay(*args)
        n = new.stop - new.first
        variants = [{"cause": c} for c in range(len(CAUSES))]
        variants += [{"cause": -1, "no_sync": True}]
        for share in (0.1, 0.5, 0.9):
            variants.append({"cause": -1, "zero": [rng.random() < share for _ in range(n)]})
            variants.append({"cause": -1, "cut": [rng.random() < share for _ in range(n)]})
        variants.append({"cause": int(rng.choice(HOST_CAUSES)), "cut": [rng.random() < 0.5 for _ in range(n)]})
        for kw in variants:
            got = new.saving(**kw)
            assert got == old.saving(**kw), (trace.name, kw.get("cause"), sorted(kw))
            seen_saving |= got > 0
            seen_host |= kw["cause"] in HOST_CAUSES and got > 0
    assert seen_saving
