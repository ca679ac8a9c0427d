"""Ground truth per rank and step, computed from the intervals the simulator wrote (DESIGN §3).

- exposed comm of group g = |union(comm kernels of g) − union(compute kernels)| within the step;
  `exposed_total` uses the union over all groups;
- host gaps: device-idle intervals in the step, where the device is busy while any kernel, copy or fill
  runs; host-caused when the launch call of the op (kernel, copy or fill) that ends the gap began at or
  after the gap began; cause = what the host thread was doing at the gap's
  start (sync call > GC range > data range > launch-bound); other idle time is `device_wait`;
- bubble (PP > 1) = exposed PP comm + device-side idle; theory (p−1)/(v·m+p−1) of the step;
- LN blocked: tuned (cooperative) norms whose start was delayed by a side-stream NCCL kernel.

With NCCL payloads (labels.nccl_payload) a rank's truth also has `communicators`: id (decimal string) ->
group kind, size and member ranks in group-rank order. `rank_truth` sees a stage's shared timeline, not
the rank, so it lists the communicators of every written rank of that stage; a rank's own are those whose
`ranks` hold it, and its rank in one is its position there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from perfdoctor.synth.intervals import clip_measure, gaps, union
from perfdoctor.synth.kernels import KernelTable
from perfdoctor.synth.recorder import API_SYNC_STREAM, GROUP_CODES, RankRecorder
from perfdoctor.synth.scenario import Scenario
from perfdoctor.synth.schedule import bubble_fraction_theory

COMM_GROUPS = ("dp", "tp", "cp", "pp", "ep")
HOST_CAUSES = ("launch_bound", "sync", "gc", "data")


def _ms(ns: float) -> float:
    return round(ns / 1e6, 6)


def rank_truth(
    sc: Scenario, rec: RankRecorder, table: KernelTable, bounds: list[int], offset_ns: int
) -> dict[str, Any]:
    """Per-step truth of one rank; all times in the file's clock (global − offset)."""
    k = rec.kernel_arrays()
    start, end = k["start"] - offset_ns, k["end"] - offset_ns
    is_comm = np.asarray([s.is_comm for s in table.specs], dtype=bool)[k["spec"]]
    group = k["group"]
    cs, ce = union(start[~is_comm], end[~is_comm])
    ops = rec.op_arrays()
    c_start = np.asarray(rec.c_start, dtype=np.int64) - offset_ns
    f_start = np.asarray(rec.f_start, dtype=np.int64) - offset_ns
    op_start, op_end = ops["start"] - offset_ns, ops["end"] - offset_ns
    all_s, all_e = union(op_start, op_end)
    per_group = {
        g: union(start[is_comm & (group == GROUP_CODES[g])], end[is_comm & (group == GROUP_CODES[g])])
        for g in COMM_GROUPS
    }
    with_compute = {g: union(np.concatenate([cs, gs]), np.concatenate([ce, ge])) for g, (gs, ge) in per_group.items()}
    comm_all = union(start[is_comm], end[is_comm])
    comm_all_c = union(np.concatenate([cs, comm_all[0]]), np.concatenate([ce, comm_all[1]]))
    # start of the API call that issued each op, via correlation id (ids grow with the calls)
    r_corr = np.asarray(rec.r_corr, dtype=np.int64)
    r_start = np.asarray(rec.r_start, dtype=np.int64) - offset_ns
    r_end = np.asarray(rec.r_end, dtype=np.int64) - offset_ns
    launch_start = r_start[np.searchsorted(r_corr, ops["corr"])]
    by_start = np.argsort(op_start, kind="stable")
    sorted_start = op_start[by_start]
    sync_mask = np.asarray([n == API_SYNC_STREAM for n in rec.r_name], dtype=bool)
    sync_s, sync_e = r_start[sync_mask], r_end[sync_mask]
    ranges = {
        c: (
            np.asarray([r[0] for r in rec.host_ranges if r[2] == c], dtype=np.int64) - offset_ns,
            np.asarray([r[1] for r in rec.host_ranges if r[2] == c], dtype=np.int64) - offset_ns,
        )
        for c in ("gc", "data")
    }
    ln_idx = np.asarray([i for i, _ in rec.ln_blocked], dtype=np.int64)
    ln_delay = np.asarray([d for _, d in rec.ln_blocked], dtype=np.int64)
    p, v, m = sc.parallel["pp"], sc.parallel["vpp"], sc.model["num_microbatches"]
    theory = bubble_fraction_theory(p, v, m)
    steps = []
    for n in range(len(bounds) - 1):
        lo, hi = bounds[n] - offset_ns, bounds[n + 1] - offset_ns
        step_ns = hi - lo
        compute_ns = clip_measure(cs, ce, lo, hi)
        comm_ms, exposed_ms = {}, {}
        for g in COMM_GROUPS:
            comm_ms[g] = _ms(clip_measure(*per_group[g], lo, hi))
            exposed_ms[g] = _ms(clip_measure(*with_compute[g], lo, hi) - compute_ns)
        exposed_total = clip_measure(*comm_all_c, lo, hi) - compute_ns
        host = dict.fromkeys(HOST_CAUSES, 0)
        device_wait = 0
        gs, ge = gaps(all_s, all_e, lo, hi)
        for g0, g1 in zip(gs.tolist(), ge.tolist()):
            j = np.searchsorted(sorted_start, g1 if g1 < hi else g0, side="left")
            if j >= len(sorted_start):
                cause = _cause_at(g0, sync_s, sync_e, ranges)
                host[cause] += g1 - g0
                continue
            nxt = by_start[j]
            if launch_start[nxt] >= g0:
                host[_cause_at(g0, sync_s, sync_e, ranges)] += g1 - g0
            else:
                device_wait += g1 - g0
        in_step = (start[ln_idx] >= lo) & (start[ln_idx] < hi) if len(ln_idx) else np.zeros(0, bool)
        bubble = (exposed_ms["pp"] * 1e6 + device_wait) if p > 1 else 0.0
        steps.append(
            {
                "n": n,
                "start_ns": int(lo),
                "end_ns": int(hi),
                "step_ms": _ms(step_ns),
                "compute_ms": _ms(compute_ns),
                "busy_ms": _ms(clip_measure(all_s, all_e, lo, hi)),
                "comm_ms": comm_ms,
                "exposed_ms": exposed_ms,
                "exposed_total_ms": _ms(exposed_total),
                "bubble_ms": _ms(bubble),
                "bubble_fraction": round(bubble / step_ns, 6),
                "bubble_fraction_theory": round(theory, 6),
                "host_gap_ms": {c: _ms(host[c]) for c in HOST_CAUSES},
                "device_wait_ms": _ms(device_wait),
                "ln_blocked_count": int(in_step.sum()),
                "ln_blocked_ms": _ms(int(ln_delay[in_step].sum()) if len(ln_idx) else 0),
                "kernels": int(((start >= lo) & (start < hi)).sum()),
                "memcpy": int(((c_start >= lo) & (c_start < hi)).sum()),
                "memset": int(((f_start >= lo) & (f_start < hi)).sum()),
            }
        )
    out: dict[str, Any] = {"steps": steps}
    if rec.communicators is not None:
        out["communicators"] = _communicators(sc, rec)
    return out


def _communicators(sc: Scenario, rec: RankRecorder) -> dict[str, dict[str, Any]]:
    written = set(sc.output_ranks())
    out: dict[str, dict[str, Any]] = {}
    for rank, comms in sorted(rec.communicators.items()) if rec.communicators else ():
        if rank in written:
            for c in comms.values():
                out[str(c.id)] = {"group": c.group, "size": len(c.ranks), "ranks": list(c.ranks)}
    return out


def _cause_at(t: int, sync_s: np.ndarray, sync_e: np.ndarray, ranges: dict[str, tuple[np.ndarray, np.ndarray]]) -> str:
    """What the launching thread was doing at instant `t`."""
    if np.any((sync_s <= t) & (t < sync_e)):
        return "sync"
    for cause in ("gc", "data"):
        s, e = ranges[cause]
        if np.any((s <= t) & (t < e)):
            return cause
    return "launch_bound"
