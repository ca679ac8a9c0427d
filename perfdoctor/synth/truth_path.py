"""Ground truth of the critical path (DESIGN §3 "Exposed is not blocking"), from what the simulator scheduled.

The recorder starts every op at exactly ``max(launch call end + latency, stream free, event, SMs free)``
(synth/recorder.py) in integer ns, so the dependency that bound an op is the one whose time equals its
start: its launch (the host was late), the previous op on its stream (or the previous node of its graph
replay), or an op of another stream (an event wait or the SMs it waited for). The host is one thread: back
from a launch it was doing Python and launch calls (``host.launch``), GC or data loading (its cause
ranges), Python work that launched nothing (``host.outside_ops``), back to its last synchronize, which
returned 4 us after the device drained (``host.sync`` from the last op's end).

Comm kernels are their group's transfer, less what the simulator knows was waiting: a pipeline
send/receive's wait for its peer's data (``pipeline.wait``; in the trace it is the kernel's tail) and a
planted straggler's DP collectives' wait for the last member (``wait.rank``). A start that no recorded
dependency explains (a receive's data that arrived from another stage before its kernel began) is
``unexplained``. Per step the causes add up to the step; the representative (median) step's path is kept,
adjacent pieces of one cause merged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from perfdoctor.classify.kernels import classify_kernel
from perfdoctor.synth.kernels import KernelTable
from perfdoctor.synth.recorder import API_SYNC_STREAM, GRAPH_NODE_GAP_NS, GROUP_NAMES, RankRecorder

SYNC_TAIL_NS = 4_000  # recorder.synchronize: returns this long after the device drained
COMPUTE = {"gemm": "gemm", "attention": "attention", "norm": "norm", "norm_persistent": "norm",
           "elementwise": "elementwise", "optimizer": "optimizer"}


def path_truth(rec: RankRecorder, table: KernelTable, bounds: list[int], offset_ns: int,
               dp_last: np.ndarray | None = None) -> dict[str, Any]:
    """Per step the ms per cause on the critical path (``blocking``) and the median step's path."""
    w = _Walk(rec, table, offset_ns, dp_last)
    steps, paths = [], []
    for n in range(len(bounds) - 1):
        lo, hi = bounds[n] - offset_ns, bounds[n + 1] - offset_ns
        seg = w.step(lo, hi)
        totals: dict[str, float] = {}
        for s, e, cause in seg:
            totals[cause] = totals.get(cause, 0.0) + (e - s) / 1e6
        steps.append({"step_ms": round((hi - lo) / 1e6, 6), "blocking": {c: round(v, 6) for c, v in totals.items()}})
        paths.append(seg)
    if not steps:
        return {"blocking_steps": []}
    durations = np.array([s["step_ms"] for s in steps])
    rep = int(np.argsort(durations, kind="stable")[(len(steps) - 1) // 2])  # the (lower) median step
    merged: list[list[Any]] = []
    for s, e, cause in sorted(paths[rep]):
        if merged and merged[-1][2] == cause and merged[-1][1] == s:
            merged[-1][1] = e
        else:
            merged.append([s, e, cause])
    return {"blocking_steps": steps, "critical_path": {"step": rep, "segments": merged}}


class _Walk:
    def __init__(self, rec: RankRecorder, table: KernelTable, offset: int, dp_last: np.ndarray | None) -> None:
        n_k, n_c = len(rec.k_start), len(rec.c_start)
        self.start = [t - offset for t in rec.k_start + rec.c_start + rec.f_start]
        self.end = [t - offset for t in rec.k_end + rec.c_end + rec.f_end]
        self.stream = rec.k_stream + rec.c_stream + rec.f_stream
        corr = rec.k_corr + rec.c_corr + rec.f_corr
        self.graph = rec.k_graph + [0] * (len(self.start) - n_k)
        api_row = {c: i for i, c in enumerate(rec.r_corr)}
        self.call_start = [rec.r_start[api_row[c]] - offset for c in corr]
        self.ready = [rec.r_end[api_row[c]] - offset + rec.cost.latency_ns for c in corr]
        self.cause = [_kernel_cause(table, spec, g) for spec, g in zip(rec.k_spec, rec.k_group)] + \
            ["copy"] * n_c + ["compute.other"] * (len(self.start) - n_k - n_c)
        # what each kernel waited for inside it: (ns, cause, at its end?)
        self.waited: dict[int, tuple[int, str, bool]] = {k: (v, "pipeline.wait", True) for k, v in rec.p2p_wait.items()}
        if dp_last is not None:
            is_comm = np.asarray([s.is_comm for s in table.specs], dtype=bool)[np.asarray(rec.k_spec, dtype=np.int64)]
            dp = np.flatnonzero(is_comm & (np.asarray(rec.k_group) == 1))[: dp_last.size]
            for k, last in zip(dp.tolist(), dp_last.tolist()):
                if last - offset > self.start[k]:
                    self.waited[k] = (min(last - offset, self.end[k]) - self.start[k], "wait.rank", False)
        order = sorted(range(len(self.start)), key=lambda i: (self.stream[i], self.start[i], i))
        self.prev = [-1] * len(self.start)
        for a, b in zip(order, order[1:]):
            if self.stream[a] == self.stream[b]:
                self.prev[b] = a
        self.by_end: dict[int, list[int]] = {}
        for i, e in enumerate(self.end):
            self.by_end.setdefault(e, []).append(i)
        self.ends = np.array(sorted(set(self.end)), dtype=np.int64)
        self.by_start = np.argsort(np.asarray(self.start, dtype=np.int64), kind="stable")
        self.starts = np.asarray(self.start, dtype=np.int64)[self.by_start]
        syncs = [i for i, name in enumerate(rec.r_name) if name == API_SYNC_STREAM]
        self.sync_start = np.array([rec.r_start[i] - offset for i in syncs], dtype=np.int64)
        self.sync_end = np.array([rec.r_end[i] - offset for i in syncs], dtype=np.int64)
        self.ranges = [(s - offset, e - offset, f"host.{c}") for s, e, c in rec.host_ranges if c in ("gc", "data")]
        self.ranges += [(s - offset, e - offset, "host.outside_ops") for s, e in rec.quiet_host]

    def step(self, lo: int, hi: int) -> list[tuple[int, int, str]]:
        seg: list[tuple[int, int, str]] = []

        def add(s: int, e: int, cause: str) -> None:
            if e > max(s, lo):
                seg.append((max(s, lo), e, cause))

        a, b = np.searchsorted(self.starts, [lo, hi], side="left")
        inside = self.by_start[a:b].tolist()
        n = max(inside, key=lambda i: min(self.end[i], hi)) if inside else -1
        t = min(self.end[n], hi) if n >= 0 else lo
        if t < hi:
            n, t = self._host(add, hi, lo)
        while n >= 0 and t > lo:
            s = self.start[n]
            self._op(add, n, s, t)
            if s <= lo:
                break
            p = self.prev[n]
            if self.graph[n] and p >= 0 and self.graph[p] == self.graph[n] and s == self.end[p] + GRAPH_NODE_GAP_NS:
                add(self.end[p], s, self.cause[n])
                n, t = p, self.end[p]
            elif s == self.ready[n] and not (p >= 0 and self.graph[n] and self.graph[p] == self.graph[n]):
                add(self.call_start[n], s, "host.launch")
                n, t = self._host(add, self.call_start[n], lo)
            elif p >= 0 and self.end[p] == s:
                n, t = p, s
            elif s in self.by_end:
                n, t = self.by_end[s][0], s
            else:
                add(lo, s, "unexplained")
                break
        return seg

    def _op(self, add: Any, n: int, s: int, t: int) -> None:
        """The op's own time up to ``t``, less what it waited for inside it."""
        waited = self.waited.get(n)
        if waited is None:
            add(s, t, self.cause[n])
            return
        ns, cause, at_end = waited
        cut = self.end[n] - ns if at_end else s + ns
        first, second = (self.cause[n], cause) if at_end else (cause, self.cause[n])
        add(s, min(cut, t), first)
        add(cut, t, second)

    def _host(self, add: Any, t: int, lo: int) -> tuple[int, int]:
        """Back along the host thread from ``t`` to the device op its last synchronize waited for."""
        while t > lo:
            j = int(np.searchsorted(self.sync_end, t, side="right")) - 1
            c0, c1 = (int(self.sync_start[j]), int(self.sync_end[j])) if j >= 0 else (lo, lo)
            self._host_work(add, max(c1, lo), t)
            if j < 0 or c1 <= lo:
                return -1, lo
            drained = c1 - SYNC_TAIL_NS
            k = int(np.searchsorted(self.ends, drained, side="right")) - 1
            if k >= 0 and self.ends[k] > c0:
                add(int(self.ends[k]), c1, "host.sync")
                return self.by_end[int(self.ends[k])][0], int(self.ends[k])
            add(c0, c1, "host.sync")
            t = c0
        return -1, lo

    def _host_work(self, add: Any, a: int, b: int) -> None:
        """[a, b) of the host thread by its cause ranges; the rest is Python and launch calls."""
        if b <= a:
            return
        covered = 0
        for s, e, cause in self.ranges:
            if e > a and s < b:
                add(max(s, a), min(e, b), cause)
                covered += min(e, b) - max(s, a)
        if b - a - covered > 0:
            add(a, a + (b - a - covered), "host.launch")  # its place inside [a, b) does not matter


def _kernel_cause(table: KernelTable, spec: int, group: int) -> str:
    s = table.specs[spec]
    if s.is_comm:
        g = GROUP_NAMES[group] or "other"
        return "pipeline.p2p" if g == "pp" else f"transfer.{g}"
    category = classify_kernel(s.short, s.demangled).category
    return f"compute.{COMPUTE.get(category, 'other')}"
