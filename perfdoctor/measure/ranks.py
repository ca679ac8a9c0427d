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
from perfdoctor.model import Run

RANK_METRIC_KEYS = ("ranks.step_time_spread_fraction", "ranks.compute_spread_fraction", "ranks.slowest",
                    "pipeline.stage_imbalance_fraction")


def rank_stages(run: Run) -> dict[str, int | None]:
    """Pipeline stage of every timeline's rank (keys: rank as a string); None where unknown."""
    marked = max((m.get("world", 0) for tl in run.timelines if (m := rank_mark(tl))), default=None)
    world = world_size(run.config, marked or None)
    return {str(tl.rank): stage_of(tl.rank, run.config, world) for tl in run.timelines}


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
        out["ranks.step_time_spread_fraction"] = float((values.max() - values.min()) / np.median(values))
    compute = {r: m["compute.time_ms"] for r, m in per_rank.items() if m.get("compute.time_ms") is not None}
    by_stage: dict[int, dict[str, float]] = {}
    for r, ms in compute.items():
        if (stage := stages.get(r)) is not None:
            by_stage.setdefault(stage, {})[r] = ms
    worst: tuple[float, str] | None = None
    for members in by_stage.values():
        if len(members) < 2:
            continue
        med = float(np.median(list(members.values())))
        r, top = max(members.items(), key=lambda kv: kv[1])
        if med > 0 and (worst is None or (top - med) / med > worst[0]):
            worst = ((top - med) / med, r)
    if worst is not None:
        out["ranks.compute_spread_fraction"], out["ranks.slowest"] = worst[0], int(worst[1])
    if len(by_stage) >= 2:
        per_stage = np.array([np.median(list(m.values())) for m in by_stage.values()])
        if per_stage.max() > 0:
            out["pipeline.stage_imbalance_fraction"] = float((per_stage.max() - per_stage.min()) / per_stage.max())
    return out
