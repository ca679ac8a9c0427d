"""What a rule is about, on the critical path: the path time of particular kernels and host waits.

The causes (:mod:`perfdoctor.blame.causes`) split a step by family; some rules are about a narrower
quantity that lies inside those causes, and weigh it on the path too (rules/README.md):

- ``unfused`` / ``unfused_<kind>``: the path time of the unfused kernels (separate softmax,
  cross-entropy, dropout, bias+activation, RoPE kernels; :func:`perfdoctor.measure.kernel_mix.unfused_kind`
  by name) — part of the compute causes;
- ``ln_blocked``: persistent norm kernels held back by NCCL kernels holding SMs
  (:mod:`perfdoctor.measure.layernorm`): where such a norm lies on the path, the path's time in its
  delay (start − ready), i.e. the part of the NCCL kernel (or what the path followed) the norm waited
  through; the time stays blamed on that cause (usually a transfer);
- ``sync_stall``: ``host.sync`` (the device draining while the CPU waits in a blocking call) plus the
  host work on the path from each blocking call's return to the thread's next CUDA call: the CPU
  computed with nothing queued, so both are the synchronisation's cost (once it launches again, its time
  is launch work). That host work stays blamed on its own host cause too (launch, data, outside ops).

They overlap the causes (never add them to the step) and get ``blocking.<name>_ms`` and, from the graph
replayed without the kernels (the norms without their wait, the blocking calls returning at once),
``whatif.<name>_ms``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfdoctor.blame.causes import CAUSES, FOCUS
from perfdoctor.blame.graph import Ops
from perfdoctor.measure.kernel_mix import UNFUSED_KINDS, unfused_kinds
from perfdoctor.measure.layernorm import blocked_norms
from perfdoctor.measure.steps import Steps
from perfdoctor.model import Timeline
from perfdoctor.table import Table

LN, SYNC = FOCUS.index("ln_blocked"), FOCUS.index("sync_stall")
# Per cause code, whether it is the host's: looked up per segment (np.isin cost 30 us a step, 1,000 steps a rank).
IS_HOST = np.array([c.startswith("host.") for c in CAUSES])


@dataclass(frozen=True)
class Marks:
    """Per op of a rank (aligned with :class:`perfdoctor.blame.graph.Ops`): its unfused kind (index into
    UNFUSED_KINDS, −1: none) and, for the blocked norms, their delay (0: not blocked)."""

    unfused: np.ndarray  # int8
    delay: np.ndarray  # int64 ns

    @staticmethod
    def empty(n: int) -> Marks:
        return Marks(np.full(n, -1, dtype=np.int8), np.zeros(n, dtype=np.int64))


def marks(tl: Timeline, kcls: Table, steps: Steps, ops: Ops) -> Marks:
    """The ops' unfused kinds (by kernel name) and blocked-norm delays."""
    return kernel_marks(tl, kcls, steps).of(ops)


@dataclass(frozen=True)
class KernelMarks:
    """The marks of a timeline's kernels: per kernel row its unfused kind, and the blocked norms' rows and
    delays (few), so the marks of any set of ops (a window of the graph: blame/window.py) are a gather."""

    unfused: np.ndarray  # int8 per kernel row
    norm: np.ndarray  # kernel rows of the blocked norms
    delay_ns: np.ndarray

    def of(self, ops: Ops) -> Marks:
        out = Marks.empty(len(ops))
        k = ops.kernel
        has = k >= 0
        if not has.any():
            return out
        out.unfused[has] = self.unfused[k[has]]
        if self.norm.size:
            rows = np.flatnonzero(has)
            by_row = rows[np.argsort(k[rows], kind="stable")]
            pos = np.minimum(np.searchsorted(k[by_row], self.norm), max(by_row.size - 1, 0))
            found = k[by_row[pos]] == self.norm
            out.delay[by_row[pos[found]]] = self.delay_ns[found]
        return out


def kernel_marks(tl: Timeline, kcls: Table, steps: Steps) -> KernelMarks:
    if not len(tl.kernels):
        return KernelMarks(np.zeros(0, dtype=np.int8), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    codes, _ = unfused_kinds(tl.kernels)
    ln = blocked_norms(tl, kcls, steps)
    return KernelMarks(codes, ln.index, ln.delay_ns)


def on_path(cols: dict[str, np.ndarray], lo: int, sync_ns: float, after_sync_ns: int) -> np.ndarray:
    """ns of one step's path per FOCUS entry; ``cols``: the step's segments (blame/path.py ``Segments``: op,
    its unfused kind and delay per segment), ``sync_ns`` its host.sync time, ``after_sync_ns`` the host work
    after blocking calls the walk passed (blame/path.py)."""
    out = np.zeros(len(FOCUS))
    start, end, op = cols["start"], cols["end"], cols["op"]
    dev = (op >= 0) & ~IS_HOST[cols["cause"]]  # a launch segment names its op too
    kind = np.where(dev, cols["unfused"], -1)
    length = (end - start).astype(np.float64)
    unf = kind >= 0
    out[0] = length[unf].sum()
    out[1:1 + len(UNFUSED_KINDS)] = np.bincount(kind[unf], weights=length[unf], minlength=len(UNFUSED_KINDS))
    blocked = np.flatnonzero(dev & (cols["delay"] > 0))
    if blocked.size:
        # the norm's own segment starts where it started; the path's time in [start − delay, start)
        heads, first = np.unique(op[blocked], return_index=True)
        at = np.array([start[blocked][op[blocked] == h].max() for h in heads.tolist()], dtype=np.int64)
        order = np.argsort(start)
        s, e = start[order], end[order]
        before = np.concatenate(([0], np.cumsum(e - s)))

        def covered(t: np.ndarray) -> np.ndarray:  # path time before t
            j = np.searchsorted(s, t, side="right") - 1
            return before[np.maximum(j, 0)] + np.where(j >= 0, np.clip(t - s[np.maximum(j, 0)], 0,
                                                                          (e - s)[np.maximum(j, 0)]), 0)
        out[LN] = float((covered(at) - covered(np.maximum(at - cols["delay"][blocked[first]], lo))).sum())
    out[SYNC] = sync_ns + after_sync_ns
    return out
