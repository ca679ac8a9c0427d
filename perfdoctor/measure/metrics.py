"""The named metrics of the JSON report (DESIGN §5), per timeline and across ranks.

Every key is always present; a metric this version cannot measure yet, or that the trace cannot
support (no GPU data, unknown model config), is ``None`` — never a made-up number.
``*_ms`` are per step, ``*_fraction`` are of step time; both are medians over steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from perfdoctor.classify.groups import GROUPS, GroupLabels, decode
from perfdoctor.classify.timeline import category_mask
from perfdoctor.measure import intervals as iv
from perfdoctor.measure.activity import Activity, GroupComm
from perfdoctor.measure.comm_stats import comm_stats
from perfdoctor.measure.host import CAUSES, HostGaps, LaunchStats
from perfdoctor.measure.kernel_mix import FAMILIES, UNFUSED_KINDS, mix_evidence, mix_per_step
from perfdoctor.measure.layernorm import blocked_norms
from perfdoctor.measure.memory import MEMORY_KEYS
from perfdoctor.measure.mfu import estimate
from perfdoctor.measure.pipeline import bubbles, theory
from perfdoctor.measure.ranks import RANK_METRIC_KEYS
from perfdoctor.measure.steps import Steps
from perfdoctor.measure.tp_overlap import serialized_overlap
from perfdoctor.model import Timeline
from perfdoctor.quantiles import median, percentile
from perfdoctor.table import Table

METRIC_KEYS: tuple[str, ...] = (
    "step.time_ms", "step.time_p90_ms", "gpu.busy_fraction", "compute.fraction", "compute.time_ms",
    "comm.time_ms", "comm.exposed_ms", "comm.exposed_fraction",
    *(f"comm.{g}.{m}" for g in GROUPS for m in ("time_ms", "exposed_ms", "exposed_fraction")),
    *(f"comm.{g}.{m}" for g in GROUPS for m in ("exposed_wait_ms", "exposed_transfer_ms")),  # measure/peers.py
    "pipeline.bubble_ms", "pipeline.bubble_fraction", "pipeline.bubble_fraction_theory",
    "pipeline.warmup_cooldown_ms", "pipeline.steady_stall_ms",
    "host.idle_fraction", "host.launch_bound_ms", "host.sync_ms", "host.gc_ms", "host.data_ms", "host.optimizer_ms",
    "host.outside_ops_ms", "host.other_ms",
    "host.device_wait_ms", "host.launch_call_us", "host.launch_interval_us", "host.short_kernel_fraction",
    "host.sync_wait_ms", "host.sync_host_ms",
    "kernels.median_us",
    "ln.blocked_count", "ln.blocked_ms",
    "kernels.count_per_step", "kernels.gemm_fraction",
    "mfu", *MEMORY_KEYS,  # from the rank's CUDA memory snapshot (measure/memory.py), when the run has one
    "mfu.fp8", "model.tflops_per_gpu",
    *(f"kernels.{f}_fraction" for f in FAMILIES), "kernels.unfused_ms",
    *(f"kernels.unfused.{kind}_ms" for kind in UNFUSED_KINDS), "moe.expert_gemm_launches", "memcpy.exposed_ms",
    "tp.serialized_overlap_ms",
    "graphs.launches_per_step", "graphs.replay_fraction",  # measure/graphs.py, set by api.analyze
    "comm.dp.kernels_per_step", "comm.dp.median_kernel_us", "comm.dp.fp32_fraction",
    *RANK_METRIC_KEYS,
)
# Environment variables the evidence quotes: the knobs whose symptoms these measurements show.
LN_MARGIN_ENV = ("NVTE_FWD_LAYERNORM_SM_MARGIN", "NVTE_BWD_LAYERNORM_SM_MARGIN")
WORST_SHOWN = 3

NS_PER_MS = 1e6


def step_quantities(tl: Timeline, kcls: Table, act: Activity, steps: Steps, labelled: bool, by_group: GroupComm,
                    gaps: HostGaps, unfused: np.ndarray, config: dict[str, Any]) -> dict[str, np.ndarray]:
    """Per step of ``steps`` (ns, float), the quantities of :func:`timeline_metrics` that are measured on the
    device's interval sets: busy, compute, communication and its exposed part (all and per group when
    ``labelled``: the whole timeline has group labels), host gaps by cause, pipeline bubbles, the kernel
    mix (``unfused``: the kernels' unfused kinds, perfdoctor.measure.kernel_mix.unfused_kinds). A window of
    the steps (perfdoctor.measure.windows) gives the same arrays for its steps as the whole timeline does, so
    the windows' arrays joined are the timeline's."""
    def per_step(s: iv.Intervals) -> np.ndarray:
        return iv.overlap_per_interval(steps.starts, steps.ends, s).astype(np.float64)

    k = tl.kernels
    gemm = category_mask(kcls, "gemm")
    q = {"busy": per_step(act.busy), "compute": per_step(act.compute), "comm": per_step(act.comm),
         "exposed": per_step(act.exposed_comm),
         "gemm": per_step(iv.union(k.col("start")[gemm], k.col("end")[gemm])),
         "idle": gaps.idle, "device_wait": gaps.device_wait, "sync_host": gaps.sync_host}
    q |= {f"host.{cause}": gaps.by_cause[cause] for cause in CAUSES}
    if labelled:
        for i, g in enumerate(GROUPS):
            q[f"{g}.time"] = per_step(by_group.busy[i])
            q[f"{g}.exposed"] = per_step(by_group.exposed[i])
        if (config.get("pp") or 1) > 1:
            b = bubbles(steps, gaps.device_wait, by_group.exposed[GROUPS.index("pp")], gaps.wait_intervals,
                        act.compute)
            q["bubble"], q["bubble_edge"] = b.bubble_ns, b.edge_ns
    mix = mix_per_step(tl, kcls, steps, act.compute, unfused)
    q |= {f"mix.{family}": ns for family, ns in mix.family_ns.items()}
    q |= {f"unfused.{kind}": ns for kind, ns in mix.unfused_ns.items()}
    q["unfused"], q["memcpy_exposed"] = mix.unfused_total_ns, mix.memcpy_exposed_ns
    return q


def timeline_metrics(tl: Timeline, kcls: Table, steps: Steps, groups: GroupLabels, q: dict[str, np.ndarray],
                     launches: LaunchStats | None, config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Metrics of one timeline that the measurements can support (the rest stay ``None``), and the
    evidence behind them: per topic, the kernels, groups and environment values a finding quotes.
    ``q`` are the per-step quantities of the steps (:func:`step_quantities`, joined over the timeline's
    windows), ``launches`` the launch statistics (:mod:`perfdoctor.measure.host`); ``launches`` is
    ``None`` where nothing ran on a GPU.

    Per-group communication metrics need group labels: without any (a plain capture, before the
    heuristics of the group classifier apply) they stay ``None`` rather than report zeros.
    """
    out: dict[str, Any] = dict.fromkeys(METRIC_KEYS)
    evidence: dict[str, Any] = {}
    if not len(steps):
        return out, evidence
    durations = steps.durations.astype(np.float64)
    out["step.time_ms"] = float(median(durations)) / NS_PER_MS
    out["step.time_p90_ms"] = float(percentile(durations, 90)) / NS_PER_MS
    if tl.device_id is None:
        return out, evidence  # CPU-only capture: nothing ran on a GPU

    k = tl.kernels
    safe = np.where(durations > 0, durations, np.nan)
    out["gpu.busy_fraction"] = _median(q["busy"] / safe)
    out["compute.fraction"] = _median(q["compute"] / safe)
    out["compute.time_ms"] = _median(q["compute"]) / NS_PER_MS
    out["comm.time_ms"] = _median(q["comm"]) / NS_PER_MS
    out["comm.exposed_ms"] = _median(q["exposed"]) / NS_PER_MS
    out["comm.exposed_fraction"] = _median(q["exposed"] / safe)
    out["kernels.gemm_fraction"] = _median(q["gemm"] / safe)
    out["host.idle_fraction"] = _median(q["idle"] / safe)
    for cause in CAUSES:
        out[f"host.{cause}_ms"] = _median(q[f"host.{cause}"]) / NS_PER_MS
    out["host.device_wait_ms"] = _median(q["device_wait"]) / NS_PER_MS
    out["host.sync_host_ms"] = _median(q["sync_host"]) / NS_PER_MS
    out["host.sync_wait_ms"] = _median(q["host.sync"] - q["sync_host"]) / NS_PER_MS
    out["kernels.median_us"] = launches.kernel_us
    out["host.launch_call_us"] = launches.launch_call_us
    out["host.launch_interval_us"] = launches.launch_interval_us
    out["host.short_kernel_fraction"] = launches.short_kernel_fraction
    ln = blocked_norms(tl, kcls, steps)
    out["ln.blocked_count"] = _median(ln.count_per_step)
    out["ln.blocked_ms"] = _median(ln.ms_per_step)
    evidence["ln"] = _ln_evidence(tl, ln, groups, out)
    if groups.any_labelled:
        for g in GROUPS:
            out[f"comm.{g}.time_ms"] = _median(q[f"{g}.time"]) / NS_PER_MS
            out[f"comm.{g}.exposed_ms"] = _median(q[f"{g}.exposed"]) / NS_PER_MS
            out[f"comm.{g}.exposed_fraction"] = _median(q[f"{g}.exposed"] / safe)
        stats = comm_stats(k, kcls, groups, steps)
        evidence["comm"] = {g: s.as_evidence() for g, s in stats.items()}
        if "dp" in stats:
            out["comm.dp.kernels_per_step"] = stats["dp"].kernels_per_step
            out["comm.dp.median_kernel_us"] = stats["dp"].median_kernel_us
            out["comm.dp.fp32_fraction"] = stats["dp"].fp32_fraction
    if (config.get("pp") or 1) > 1:
        out["pipeline.bubble_fraction_theory"] = theory(config)[0]
        if "bubble" in q:
            out["pipeline.bubble_ms"] = _median(q["bubble"]) / NS_PER_MS
            out["pipeline.bubble_fraction"] = _median(q["bubble"] / safe)
            out["pipeline.warmup_cooldown_ms"] = _median(q["bubble_edge"]) / NS_PER_MS
            out["pipeline.steady_stall_ms"] = _median(q["bubble"] - q["bubble_edge"]) / NS_PER_MS
    starts = k.col("start")  # sorted by the loader
    in_step = np.searchsorted(starts, steps.ends) - np.searchsorted(starts, steps.starts)
    out["kernels.count_per_step"] = _median(in_step.astype(np.float64))
    gpu_name = tl.gpu.name if tl.gpu else None
    mfu = estimate(config, gpu_name, out["step.time_ms"] if steps.source != "window" else None, tl.trace.env)
    out["mfu"], out["mfu.fp8"], out["model.tflops_per_gpu"] = mfu.mfu, mfu.mfu_fp8, mfu.tflops_per_gpu
    evidence["mfu"] = {"gpu": gpu_name, "peak_bf16_tflops": mfu.peak_bf16_tflops,
                       "peak_fp8_tflops": mfu.peak_fp8_tflops, "flops_per_step": mfu.flops_per_step,
                       "assumed": list(mfu.assumptions), "unknown_because": mfu.reason}
    for family in FAMILIES:
        out[f"kernels.{family}_fraction"] = _median(q[f"mix.{family}"] / safe)
    out["kernels.unfused_ms"] = _median(q["unfused"]) / NS_PER_MS
    for kind in UNFUSED_KINDS:
        out[f"kernels.unfused.{kind}_ms"] = _median(q[f"unfused.{kind}"]) / NS_PER_MS
    mix = mix_evidence(tl, kcls)
    if mix.moe_gemm_launches is not None:
        out["moe.expert_gemm_launches"] = float(mix.moe_gemm_launches)
    out["memcpy.exposed_ms"] = _median(q["memcpy_exposed"]) / NS_PER_MS
    evidence["attention"] = {"backend": mix.attention, "kernel": mix.attention_evidence}
    if mix.moe_gemm is not None or mix.moe_gemm_launches is not None:
        evidence["moe"] = {"expert_gemms": mix.moe_gemm, "expert_gemm_launches": mix.moe_gemm_launches,
                           "grouped": mix.moe_gemm == "grouped", "kernel": mix.moe_evidence}
    if mix.unfused_names:
        evidence["unfused"] = dict(mix.unfused_names)
    tp_overlap = serialized_overlap(tl, kcls, steps)
    if tp_overlap.ms_per_step is not None:
        out["tp.serialized_overlap_ms"] = _median(tp_overlap.ms_per_step)
        evidence["tp_overlap"] = {"serialized_ms_per_step": out["tp.serialized_overlap_ms"],
                                  "serialized_kernels": int(tp_overlap.index.size),
                                  "overlap_comm_kernels": tp_overlap.comm_count,
                                  "env": {"CUDA_DEVICE_MAX_CONNECTIONS": tp_overlap.connections}}
    return out, evidence


def _ln_evidence(tl: Timeline, ln: Any, groups: GroupLabels, out: dict[str, Any]) -> dict[str, Any]:
    """Which NCCL group held the SMs the blocked norms waited for, the worst cases, and the margins set."""
    names = tl.kernels["short_name"]  # a few rows are named: no decoding of every kernel's name
    blocker_group = decode(groups.codes[ln.blocker], GROUPS)
    labels = np.array([g if g is not None else "unlabelled" for g in blocker_group], dtype=object)
    by_group = {str(g): int(c) for g, c in zip(*np.unique(labels.astype(str), return_counts=True))} \
        if labels.size else {}
    worst = np.argsort(ln.delay_ns)[::-1][:WORST_SHOWN]
    k = tl.kernels
    ctas = (k.col("grid_x")[ln.blocker] * k.col("grid_y")[ln.blocker]
            * k.col("grid_z")[ln.blocker]) if ln.blocker.size and "grid_x" in k else np.zeros(0)
    return {
        "blocker_ctas": int(ctas.max()) if ctas.size else None,  # CTAs of the widest blocking NCCL kernel
        "blocked_count_per_step": out["ln.blocked_count"],
        "blocked_ms_per_step": out["ln.blocked_ms"],
        "by_group": by_group,
        "worst": [{"kernel": str(names[ln.index[i]]), "delay_us": round(float(ln.delay_ns[i]) / 1e3, 1),
                   "nccl_kernel": str(names[ln.blocker[i]]), "group": blocker_group[i]} for i in worst],
        "env": {var: tl.trace.env.get(var) for var in LN_MARGIN_ENV},
    }


def across_ranks(per_rank: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``all`` = median over ranks of each metric (ranks where it is unknown are left out)."""
    merged: dict[str, Any] = {}
    for key in METRIC_KEYS:
        values = [m[key] for m in per_rank.values() if m.get(key) is not None]
        merged[key] = float(median(values)) if values else None
    return merged


def _median(values: np.ndarray) -> float | None:
    values = values[~np.isnan(values)]
    return float(median(values)) if values.size else None
