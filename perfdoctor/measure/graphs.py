"""CUDA graphs: does the run replay graphs, and how much of the GPU's time do whole-graph replays hide?

``graphs.launches_per_step`` counts ``cudaGraphLaunch`` calls per step (median over steps): in either
nsys graph-trace mode it says the run already uses CUDA graphs (so graph capture is no advice for it).
``graphs.replay_fraction`` is the share of the step covered by graph replays, each from its first
kernel's start to its last kernel's end: a replay traced as a whole graph (``--cuda-graph-trace=graph``,
perfdoctor.load.graph_trace) is one row; a replay traced node by node (``--cuda-graph-trace=node``, and
every PyTorch profiler trace) is the kernels that share its ``cudaGraphLaunch``'s correlation id. Under
whole-graph tracing the kernels inside are unknown, so the measurements that need each kernel's identity
are unknown too (``HIDDEN_BY_REPLAYS`` → None) instead of reading a replay as one slow "other" kernel (no
GEMM share, one long kernel per layer).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from perfdoctor.load.graph_trace import replay_mask
from perfdoctor.measure import intervals as iv
from perfdoctor.measure.kernel_mix import FAMILIES, UNFUSED_KINDS
from perfdoctor.measure.steps import Steps
from perfdoctor.model import Timeline
from perfdoctor.quantiles import median
from perfdoctor.table import Table

GRAPH_LAUNCH = "cudaGraphLaunch"
HIDDEN_BY_REPLAYS: tuple[str, ...] = (
    "kernels.count_per_step", "kernels.gemm_fraction", "kernels.median_us", "host.short_kernel_fraction",
    "host.launch_call_us", "host.launch_interval_us", "ln.blocked_count", "ln.blocked_ms",
    *(f"kernels.{f}_fraction" for f in FAMILIES), "kernels.unfused_ms",
    *(f"kernels.unfused.{kind}_ms" for kind in UNFUSED_KINDS), "moe.expert_gemm_launches",
)


def graph_metrics(tl: Timeline, steps: Steps) -> dict[str, Any]:
    """``graphs.*`` of one timeline, plus None for every metric whole-graph replays make unknown."""
    if not len(steps):
        return {}
    durations = steps.durations.astype(np.float64)
    launch_rows = _graph_launches(tl.api["name"]) if len(tl.api) else np.zeros(0, dtype=bool)
    launches = np.sort(tl.api.col("start")[launch_rows]) if len(tl.api) else np.zeros(0, dtype=np.int64)
    per_step = np.searchsorted(launches, steps.ends) - np.searchsorted(launches, steps.starts)
    out: dict[str, Any] = {"graphs.launches_per_step": float(median(per_step))}
    k = tl.kernels
    whole = replay_mask(k)
    s0, s1 = _node_replays(k, tl.api.col("correlation_id")[launch_rows] if len(tl.api) else launches, ~whole)
    covered = iv.overlap_per_interval(steps.starts, steps.ends,
                                      iv.union(np.concatenate([k.col("start")[whole], s0]),
                                               np.concatenate([k.col("end")[whole], s1])))
    safe = np.where(durations > 0, durations, np.nan)
    out["graphs.replay_fraction"] = float(np.nanmedian(covered / safe)) if covered.any() else 0.0
    return (out | dict.fromkeys(HIDDEN_BY_REPLAYS)) if whole.any() else out


def _node_replays(k: Table, graph_corr: np.ndarray, candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Spans (first kernel start, last kernel end) of the replays traced node by node: the ``candidates``
    kernels launched by one of the ``graph_corr`` cudaGraphLaunch calls, grouped by that call."""
    if not graph_corr.size:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    mine = candidates & np.isin(k.col("correlation_id"), graph_corr)
    if not mine.any():
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    corr, start, end = k.col("correlation_id")[mine], k.col("start")[mine], k.col("end")[mine]
    order = np.argsort(corr, kind="stable")
    corr, start, end = corr[order], start[order], end[order]
    first = np.flatnonzero(np.concatenate(([True], corr[1:] != corr[:-1])))
    return np.minimum.reduceat(start, first), np.maximum.reduceat(end, first)


def _graph_launches(names: Any) -> np.ndarray:
    """Rows of the CUDA API table that launch a graph (``cudaGraphLaunch``, version suffix stripped)."""
    cats = names.values
    hit = np.fromiter((str(c).startswith(GRAPH_LAUNCH) for c in cats), dtype=bool, count=len(cats))
    codes = names.codes
    return hit[codes] & (codes >= 0)
