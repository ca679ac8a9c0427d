"""Planted stragglers: one data-parallel rank simulated on its own (slower GEMMs or a slower host), then
the data-parallel collectives of every rank made to wait for it.

The stage programs simulate one timeline per pipeline stage (its ranks are symmetric), and NCCL's
rendezvous is not modelled there: a collective's kernel ends when its own transfer ends. With a
straggler the ranks of a stage differ, so after simulating the normal and the slow rank this module
applies the rendezvous: nothing moves before the last member arrives, so instance k of the DP
collectives ends at ``last arrival + its transfer time`` on every member, and everything that rank
did after the old end (device work, and host work, which soon blocks on it) moves by the same delay.
That is exact for collectives the rest of the step waits on (gradient reduction without overlap,
the classic synchronous straggler); the scenario validation only allows that case. In a pipeline run
the rendezvous happens during the simulation instead (simulate.py's lanes, ``StageProgram._meet``), since
the delay travels on through the pipeline sends.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from perfdoctor.synth.intervals import clip_measure, union
from perfdoctor.synth.kernels import KernelTable
from perfdoctor.synth.recorder import GROUP_CODES, RankRecorder

NS_PER_MS = 1e6


def rendezvous(recs: list[RankRecorder], bounds: list[list[int]], table: KernelTable) -> list[np.ndarray]:
    """Make the DP collectives of ``recs`` (one recorder per distinct rank timeline, all in one DP group,
    on one session clock) end together after their last member arrives. Shifts the recorders and step
    ``bounds`` in place; returns, per recorder, the last arrival of each of its DP collectives."""
    is_comm = np.asarray([s.is_comm for s in table.specs], dtype=bool)
    dp = [np.flatnonzero(is_comm[np.asarray(r.k_spec)] & (np.asarray(r.k_group) == GROUP_CODES["dp"]))
          for r in recs]
    count = min(len(d) for d in dp)
    lasts = [np.zeros(count, dtype=np.int64) for _ in recs]
    for k in range(count):
        last = max(r.k_start[d[k]] for r, d in zip(recs, dp))
        for rec, d, out, b in zip(recs, dp, lasts, bounds):
            i = d[k]
            out[k] = last
            new_end = max(rec.k_end[i], last + (rec.k_end[i] - rec.k_start[i]))
            delay = new_end - rec.k_end[i]
            if delay > 0:
                _shift(rec, b, rec.k_end[i], delay)
                rec.k_end[i] = new_end
    return lasts


def _shift(rec: RankRecorder, bounds: list[int], after: int, delay: int) -> None:
    """Move every time at or after ``after`` by ``delay`` (a range that spans it is stretched)."""
    def moved(t: int | None) -> int | None:
        return t + delay if t is not None and t >= after else t

    for starts, ends in ((rec.k_start, rec.k_end), (rec.c_start, rec.c_end), (rec.f_start, rec.f_end),
                         (rec.r_start, rec.r_end)):
        for j, (s, e) in enumerate(zip(starts, ends)):
            if s >= after:
                starts[j], ends[j] = s + delay, e + delay
            elif e >= after and starts is rec.r_start:
                ends[j] = e + delay  # a host call that blocks across the delay (a synchronize) lasts longer
    rec.syncs = [(moved(s), moved(e), *rest) for s, e, *rest in rec.syncs]
    rec.nvtx = [(moved(s), moved(e), *rest) for s, e, *rest in rec.nvtx]
    rec.host_ranges = [(moved(s), moved(e), c) for s, e, c in rec.host_ranges]
    rec.quiet_host = [(moved(s), moved(e)) for s, e in rec.quiet_host]
    bounds[:] = [moved(t) for t in bounds]


def wait_truth(rec: RankRecorder, table: KernelTable, last: np.ndarray, bounds: list[int],
               offset_ns: int) -> list[dict[str, Any]]:
    """Per step: exposed DP comm split into the wait before the last member arrived and the transfer
    (DESIGN §3), on the file's clock."""
    k = rec.kernel_arrays()
    is_comm = np.asarray([s.is_comm for s in table.specs], dtype=bool)[k["spec"]]
    start, end = k["start"] - offset_ns, k["end"] - offset_ns
    dp = np.flatnonzero(is_comm & (k["group"] == GROUP_CODES["dp"]))[: last.size]
    cs, ce = union(start[~is_comm], end[~is_comm])
    ws, we = union(start[dp], np.minimum(end[dp], last - offset_ns))
    gs, ge = union(start[dp], end[dp])

    def exposed(s: np.ndarray, e: np.ndarray, lo: int, hi: int) -> int:
        both = union(np.concatenate([cs, s]), np.concatenate([ce, e]))
        return clip_measure(*both, lo, hi) - clip_measure(cs, ce, lo, hi)

    out = []
    for n in range(len(bounds) - 1):
        lo, hi = bounds[n] - offset_ns, bounds[n + 1] - offset_ns
        wait, total = exposed(ws, we, lo, hi), exposed(gs, ge, lo, hi)
        out.append({"exposed_wait_ms": round(wait / NS_PER_MS, 6),
                    "exposed_transfer_ms": round((total - wait) / NS_PER_MS, 6)})
    return out
