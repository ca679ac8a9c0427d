"""The causes a step's time is blamed on, and what the host was doing in an interval of the critical path.

Every ns of a step lies on exactly one cause (DESIGN §3). The names are a contract: the JSON report's
``blocking.<cause>_ms`` metrics use them with the dots after the family turned into underscores
(``compute.gemm`` → ``blocking.compute_gemm_ms``), and ``path`` entries carry them as written.

Host time on the path (the device waited for the CPU) is split by what the launching thread was doing:
inside a blocking CUDA call → ``host.sync``; inside a ``gc`` range → ``host.gc``; inside a data-loading
range → ``host.data``; inside an optimizer range (``Optimizer.step#…``, ``optimizer``) → ``host.optimizer``;
otherwise ``host.launch`` while the process kept calling CUDA, and ``host.outside_ops`` across a pause of
the host (no CUDA call or profiled operator for much longer than usual: ``measure.host.host_pauses``, the
same pauses the host-gap measurement calls outside ops): one long pause is not launch overhead. The range
patterns are the host-gap measurement's too, so exposure and blocking name host time alike.
"""

from __future__ import annotations

import copy

import numpy as np

from perfdoctor.blame.calls import WindowCalls
from perfdoctor.load.labels import labelled, matching
from perfdoctor.measure import intervals as iv
from perfdoctor.measure.host import DATA_RANGE, OPTIMIZER_RANGE, host_pauses
from perfdoctor.measure.kernel_mix import UNFUSED_KINDS
from perfdoctor.model import Timeline
from perfdoctor.quantiles import median
from perfdoctor.table import distinct

COMPUTE = ("gemm", "attention", "norm", "elementwise", "optimizer", "other")
TRANSFER = ("dp", "tp", "cp", "ep", "other")  # pipeline-parallel transfer is pipeline.p2p
HOST = ("launch", "data", "gc", "optimizer", "outside_ops", "sync")
PIPELINE = ("theory", "imbalance", "p2p", "wait")
CAUSES: tuple[str, ...] = (*(f"compute.{c}" for c in COMPUTE), *(f"transfer.{g}" for g in TRANSFER),
                           "wait.rank", "copy", *(f"host.{h}" for h in HOST), *(f"pipeline.{p}" for p in PIPELINE))
CODE = {c: i for i, c in enumerate(CAUSES)}
# Kernel taxonomy category → compute cause (norm_persistent is a norm; memset fills are "other" work).
CATEGORY_CAUSE = {"gemm": "compute.gemm", "attention": "compute.attention", "norm": "compute.norm",
                  "norm_persistent": "compute.norm", "elementwise": "compute.elementwise",
                  "optimizer": "compute.optimizer", "memcpy": "copy", "memset": "compute.other",
                  "other": "compute.other"}
# Handing off: a stretch of the launching thread with no CUDA call this many times its median interval
# between calls (never under QUIET_MIN_NS) during which another thread called CUDA (see HostRanges.handoff).
QUIET_FACTOR = 10
QUIET_MIN_NS = 100_000
HOST_RANGES = (("host.gc", "gc"), ("host.data", "data"), ("host.optimizer", "optimizer"))


def metric_key(cause: str) -> str:
    """``compute.gemm`` → ``blocking.compute_gemm_ms`` (the JSON metric of a cause)."""
    return f"blocking.{cause.replace('.', '_')}_ms"


def whatif_key(cause: str) -> str:
    """``compute.gemm`` → ``whatif.compute_gemm_ms`` (ms per step saved without the cause: blame/whatif.py)."""
    return f"whatif.{cause.replace('.', '_')}_ms"


# What some rules weigh inside the causes (perfdoctor.blame.focus): they overlap the causes, never add to them.
FOCUS = ("unfused", *(f"unfused_{kind}" for kind in UNFUSED_KINDS), "ln_blocked", "sync_stall")
CAUSE_KEYS = tuple(metric_key(c) for c in CAUSES)
FOCUS_KEYS = (*(f"blocking.{f}_ms" for f in FOCUS), *(f"whatif.{f}_ms" for f in FOCUS))
BLOCKING_KEYS = (*CAUSE_KEYS, "blocking.residual_ms", *(whatif_key(c) for c in CAUSES), *FOCUS_KEYS)


class HostRanges:
    """Per thread, the merged ranges of each host cause and the CUDA API calls, to split host intervals."""

    def __init__(self, tl: Timeline, calls: WindowCalls | None = None) -> None:
        """``calls``: the calls handed out a window at a time (:meth:`within`), else merged here whole."""
        self.ranges: dict[str, dict[int, iv.Intervals]] = {}
        for cause, kind in HOST_RANGES:
            rows = (labelled(tl.nvtx, "gc") if kind == "gc" else
                    matching(tl.nvtx, DATA_RANGE if kind == "data" else OPTIMIZER_RANGE))
            rows = rows.take(rows.col("end") >= 0) if len(rows) else rows
            self.ranges[cause] = _by_thread(rows.col("start") if len(rows) else np.zeros(0, np.int64),
                                            rows.col("end") if len(rows) else np.zeros(0, np.int64),
                                            rows.col("tid") if len(rows) else np.zeros(0, np.int64))
        api = tl.api
        if calls is None:
            self.calls = _by_thread(api.col("start"), api.col("end"), api.col("tid")) if len(api) else {}
        else:
            self.calls = {}
        self._window_calls = calls
        self._quiet: dict[int, float] | None = None
        self.pauses = host_pauses(tl)

    @property
    def quiet(self) -> dict[int, float]:
        """Per thread, how long a stretch without a CUDA call is quiet (QUIET_FACTOR times its median
        interval between calls); asked only where the process has two threads that call CUDA."""
        if self._quiet is None:
            medians = (self._window_calls.medians if self._window_calls is not None else
                       {tid: float(median(np.diff(c[0]))) if c[0].size > 1 else None
                        for tid, c in self.calls.items()})
            self._quiet = {tid: max(QUIET_MIN_NS, QUIET_FACTOR * m) if m is not None else QUIET_MIN_NS
                           for tid, m in medians.items()}
        return self._quiet

    def within(self, calls: dict[int, iv.Intervals]) -> HostRanges:
        """These ranges with the calls of one window (perfdoctor.blame.calls)."""
        out = copy.copy(self)
        out.calls = calls
        return out

    def quiet_stretches(self, lo: int, hi: int) -> iv.Intervals:
        """The host's pauses (no CUDA call or profiled operator for much longer than usual) in [lo, hi)."""
        return iv.intersect((np.array([lo], dtype=np.int64), np.array([hi], dtype=np.int64)), self.pauses)

    def handoff(self, lo: int, hi: int, tid: int) -> tuple[int, int, int] | None:
        """The latest quiet stretch of ``tid`` in [lo, hi) during which another thread called CUDA: (when
        the stretch ends, that thread, the end of its last call in the stretch), or None."""
        calls = self.calls.get(tid)
        if calls is None or len(self.calls) < 2:
            return None
        quiet = iv.complement(calls, lo, hi)
        long = np.flatnonzero(quiet[1] - quiet[0] >= self.quiet.get(tid, QUIET_MIN_NS))
        for q in long[::-1].tolist():
            q0, q1 = int(quiet[0][q]), int(quiet[1][q])
            best, when = -1, q0
            for other, (s, e) in self.calls.items():
                if other == tid:
                    continue
                j = int(np.searchsorted(e, q1, side="left")) - 1
                if j >= 0 and e[j] > when and s[j] < q1:
                    best, when = other, int(e[j])
            if best != -1 and when < hi:
                return q1, best, when
        return None

    def split(self, lo: int, hi: int, tid: int) -> list[tuple[str, int]]:
        """ns of [lo, hi) on thread ``tid`` per host cause (not sync: the caller knows its blocking calls);
        the causes of HOST_RANGES first (in that order of precedence), the rest launch vs outside ops."""
        left = (np.array([lo], dtype=np.int64), np.array([hi], dtype=np.int64))
        out = []
        for cause, _ in HOST_RANGES:
            mine = self.ranges[cause].get(tid)
            if mine is None or not mine[0].size:
                continue
            inside = iv.intersect(left, mine)
            if (ns := iv.measure(inside)) > 0:
                out.append((cause, ns))
                left = iv.subtract(left, inside)
        rest = iv.measure(left)
        if rest <= 0:
            return out
        outside = iv.measure(iv.intersect(left, self.quiet_stretches(lo, hi)))
        if outside:
            out.append(("host.outside_ops", outside))
        if rest - outside:
            out.append(("host.launch", rest - outside))
        return out


def _by_thread(start: np.ndarray, end: np.ndarray, tid: np.ndarray) -> dict[int, iv.Intervals]:
    if tid.size and tid.min() == tid.max():  # one thread (most processes launch from one): no sort, no copy
        return {int(tid[0]): iv.union(start, end)}
    out = {}
    for thread in distinct(tid).tolist():
        sel = tid == thread
        out[int(thread)] = iv.union(start[sel], end[sel])
    return out
