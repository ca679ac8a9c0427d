"""Run-level metrics that compare ranks: stragglers and pipeline-stage imbalance.

Synchronous training makes every rank's step equally long — the slow rank sets the pace and the
others wait — so a straggler shows in *compute* per step, not in step time: the rank with the most
compute is the one the others wait for. Ranks are compared within their pipeline stage (stages do
different work by design); across stages, the spread of compute is the stage imbalance the tuning
guide fixes with uneven layer splits (first/last stage carry the embedding and the loss).

Stage of a rank follows Megatron's default rank order tp-cp-(ep)-dp-pp: ``stage = rank // (world/pp)``
(research/kernel_taxonomy.md §6.1), with ``world`` from the config or the capture's rank marks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from perfdoctor.load.labels import rank_mark
from perfdoctor.measure.peers import PeerWaits
from perfdoctor.model import DeviceSummary, Run, Timeline, TimelineInfo
from perfdoctor.quantiles import median

RANK_METRIC_KEYS = ("ranks.step_time_spread_fraction", "ranks.compute_spread_fraction", "ranks.slowest",
                    "pipeline.stage_imbalance_fraction", "pipeline.critical_stage", "ranks.late_ms",
                    "ranks.late_fraction", "ranks.clock_residual_us", "ranks.late_blocking_ms")
# What a straggler's cause part means, for the finding (perfdoctor.measure.peers.CAUSE_PARTS).
CAUSE_TEXT = {"compute": "more GPU compute", "host.launch_bound": "host gaps: launch-bound (Python/launch overhead)",
              "host.sync": "host gaps: sync stalls", "host.gc": "host gaps: garbage collection",
              "host.data": "host gaps: data loading", "host.optimizer": "host gaps: optimizer step",
              "host.outside_ops": "host gaps outside profiled ops (GC, I/O, Python)",
              "host.other": "host gaps of unknown cause",
              "other_comm": "waiting itself on another group"}
TOP_EXCESS_KERNELS = 3
LIKE_SHARE = 0.9


def rank_stages(run: Run) -> tuple[dict[str, int | None], int | None]:
    """Pipeline stage of every timeline's rank (keys: rank as a string; None where unknown), and the
    world size when known."""
    marked = max((m.get("world", 0) for tl in run.timelines if (m := _mark(tl))), default=None)
    world = world_size(run.config, marked or None)
    return {str(tl.rank): stage_of(tl.rank, run.config, world) for tl in run.timelines}, world


def _mark(tl: Timeline | TimelineInfo) -> dict[str, int] | None:
    return tl.rank_mark if isinstance(tl, TimelineInfo) else rank_mark(tl)


def stage_of(rank: int, config: dict[str, Any], world: int | None) -> int | None:
    """Pipeline stage of a global rank, or None when pp or the world size is unknown."""
    pp = config.get("pp") or 1
    if pp == 1:
        return 0
    if not world or world % pp:
        return None
    return rank // (world // pp)


def world_size(config: dict[str, Any], marked: int | None) -> int | None:
    """World size from the config (tp·cp·dp·pp, all known) or from the capture's rank marks."""
    sizes = [config.get(k) for k in ("tp", "cp", "dp", "pp")]
    sizes[0], sizes[1] = sizes[0] or 1, sizes[1] or 1
    if all(sizes):
        return int(np.prod(sizes))
    return marked


def rank_metrics(per_rank: dict[str, dict[str, Any]], stages: dict[str, int | None]) -> dict[str, Any]:
    """``ranks.*`` and ``pipeline.stage_imbalance_fraction`` from the per-rank metrics.

    - ``ranks.step_time_spread_fraction``: (max − min) / median of per-rank step time;
    - ``ranks.compute_spread_fraction``: the largest (max − median) / median of compute ms per step
      among the ranks of one stage (needs ≥ 2 ranks in a stage), ``ranks.slowest`` its rank;
    - ``pipeline.stage_imbalance_fraction``: (max − min) / max of the stages' compute ms per step
      (median over the ranks of each stage; needs ≥ 2 stages).
    """
    out: dict[str, Any] = dict.fromkeys(RANK_METRIC_KEYS)
    steps = {r: m["step.time_ms"] for r, m in per_rank.items() if m.get("step.time_ms")}
    if len(steps) >= 2:
        values = np.array(list(steps.values()))
        out["ranks.step_time_spread_fraction"] = float((values.max() - values.min()) / median(values))
    compute = {r: m["compute.time_ms"] for r, m in per_rank.items() if m.get("compute.time_ms") is not None}
    by_stage: dict[int, dict[str, float]] = {}
    for r, ms in compute.items():
        if (stage := stages.get(r)) is not None:
            by_stage.setdefault(stage, {})[r] = ms
    worst: tuple[float, str] | None = None
    for members in by_stage.values():
        if len(members) < 2:
            continue
        med = float(median(list(members.values())))
        r, top = max(members.items(), key=lambda kv: kv[1])
        if med > 0 and (worst is None or (top - med) / med > worst[0]):
            worst = ((top - med) / med, r)
    if worst is not None:
        out["ranks.compute_spread_fraction"], out["ranks.slowest"] = worst[0], int(worst[1])
    if len(by_stage) >= 2:
        per_stage = np.array([median(list(m.values())) for m in by_stage.values()])
        if per_stage.max() > 0:
            out["pipeline.stage_imbalance_fraction"] = float((per_stage.max() - per_stage.min()) / per_stage.max())
            # the stage with the most compute per step bounds the step: every other stage waits for it
            out["pipeline.critical_stage"] = list(by_stage)[int(np.argmax(per_stage))]
    return out


def stage_evidence(stage: int | None, metrics: dict[str, Any], critical: int | None) -> dict[str, Any]:
    """Per device of a pipeline run: its stage, its bubble against the schedule's theory, and whether it
    is the critical stage (the one the step waits for)."""
    bubble, theory = metrics.get("pipeline.bubble_fraction"), metrics.get("pipeline.bubble_fraction_theory")
    return {"stage": stage, "bubble_fraction": bubble, "bubble_fraction_theory": theory,
            "bubble_above_theory": None if bubble is None or theory is None else bubble - theory,
            "critical": critical is not None and stage == critical}


def peer_metrics(waits: PeerWaits, per_rank: dict[str, dict[str, Any]],
                 devices: list[DeviceSummary]) -> dict[str, Any]:
    """Run-level ``ranks.*`` from matched collectives (DESIGN §3 "Straggler"): the straggler, the
    others' wait it causes per step (and as a share of the step), the clock residual; and the
    straggler's evidence on its device (cause, kernels it spends more time in, its longest CUDA call).
    Empty when nothing was matched: ``rank_metrics``' most-compute fallback then stands."""
    out: dict[str, Any] = {}
    if waits.clock_residual_us is not None:
        out["ranks.clock_residual_us"] = waits.clock_residual_us
    s = waits.straggler
    if s is None:
        return out
    step = (per_rank.get(str(s.rank)) or {}).get("step.time_ms")
    late = min(s.late_ms, step) if step else s.late_ms  # the others cannot wait longer than a step
    out.update({"ranks.slowest": s.rank, "ranks.late_ms": late,
                "ranks.late_fraction": late / step if step else None})
    by_rank = {d.rank: d for d in devices}
    if s.rank in by_rank:
        others = [d for d in devices if d.rank != s.rank]
        by_rank[s.rank].evidence["straggler"] = {
            "rank": s.rank, "late_ms": round(late, 3), "group": s.group, "cause": CAUSE_TEXT[s.cause],
            "excess_ms_per_step": s.excess_ms, "host_call": s.host_call, "waits_on": s.waits_on,
            "kernels": excess_kernels(by_rank[s.rank], others),
            # ranks that hold the others back as much (a slow pipeline stage is all of its ranks)
            "like_ranks": sorted(int(r) for r, ms in waits.late_ms.items()
                                 if ms is not None and int(r) != s.rank and ms >= LIKE_SHARE * s.late_ms),
        }
    return out


def excess_kernels(rank: DeviceSummary, others: list[DeviceSummary]) -> list[dict[str, Any]]:
    """Kernels on which ``rank`` spends the most ms per step more than the median of ``others``."""
    def per_step(d: DeviceSummary) -> dict[str, float]:
        steps = max(len(d.step_ns), 1)
        return {k["name"]: k["ns"] / steps / 1e6 for k in d.top_kernels}

    mine, theirs = per_step(rank), [per_step(d) for d in others]
    excess = {name: ms - float(median([t.get(name, 0.0) for t in theirs])) for name, ms in mine.items()} \
        if theirs else {}
    top = sorted(((ms, name) for name, ms in excess.items() if ms > 0), reverse=True)[:TOP_EXCESS_KERNELS]
    return [{"name": name, "excess_ms_per_step": round(ms, 3)} for ms, name in top]
