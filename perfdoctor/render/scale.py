"""What the reports show of a run with many ranks: its name (not every file) and the ranks that stand out.

At 1,024 ranks a block, a bar or a line per rank buries the findings; every renderer instead shows the
run as a whole, then the ranks furthest from the median rank (the straggler first), and says how many
it left out. Nothing here measures: ranks are ordered by the metrics the Report already holds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from perfdoctor.model import Report
from perfdoctor.render import summary as sm

# Above this many ranks, per-rank sections show the outliers only.
MANY_RANKS = 16
# Metrics where a larger value is better (a heatmap colours them the other way round).
HIGHER_IS_BETTER = {"gpu.busy_fraction", "mfu", "compute.fraction"}


def many(report: Report) -> bool:
    return len(report.metrics.get("ranks", {})) > MANY_RANKS


def run_name(report: Report) -> str:
    """One file: its name; several: the folder they share and how many files and ranks."""
    paths = [t.path for t in report.run.traces]
    if not paths:
        return "no input"
    if len(paths) == 1:
        return paths[0].name
    common = os.path.commonpath([str(p.parent) for p in paths]) if len({p.anchor for p in paths}) == 1 else ""
    folder = os.path.basename(common) or common or "several folders"
    return f"{folder} ({len(paths)} traces, {len(report.metrics.get('ranks', {}))} ranks)"


def deviation(report: Report, rank: str, key: str) -> float | None:
    """How much worse than the median rank ``rank`` is on ``key`` (relative; negative: better)."""
    value = report.metrics["ranks"].get(rank, {}).get(key)
    median = report.metrics.get("all", {}).get(key)
    if value is None or not median:
        return None
    dev = (value - median) / abs(median)
    return -dev if key in HIGHER_IS_BETTER else dev


def outliers(report: Report, n: int) -> list[tuple[str, str]]:
    """Up to ``n`` (rank, why) pairs: the straggler the others wait for, then the ranks whose worst
    metric is furthest from the median rank."""
    out: dict[str, str] = {}
    slowest = report.metrics.get("all", {}).get("ranks.slowest")
    late = report.metrics.get("all", {}).get("ranks.late_ms")
    if slowest is not None and late:
        out[str(int(slowest))] = f"the others wait {late:.2f} ms per step for it"
    scored = []
    for rank in sm.ranks(report):
        worst = max(((d, key, label) for key, label, _ in sm.RANK_METRICS
                     if (d := deviation(report, rank, key)) is not None), default=None)
        if worst is not None and worst[0] > 0:
            scored.append((worst[0], rank, f"{worst[2]} {worst[0] * 100:.0f} % worse than the median rank"))
    for _, rank, why in sorted(scored, key=lambda s: (-s[0], s[1])):
        out.setdefault(rank, why)
    return list(out.items())[:n]


def stage_groups(report: Report) -> dict[str, list[str]]:
    """Ranks grouped for the report's expandable panels: by pipeline stage when known, else one group."""
    groups: dict[str, list[str]] = {}
    stage_of = {str(d.rank): (d.evidence.get("pipeline") or {}).get("stage") for d in report.devices}
    for rank in sm.ranks(report):
        stage = stage_of.get(rank)
        groups.setdefault(f"stage {stage}" if stage is not None else "all ranks", []).append(rank)
    return groups


def metric_rows(report: Report, ranks: list[str]) -> list[dict[str, Any]]:
    """Per rank, its RANK_METRICS formatted (the rows of a per-rank table)."""
    ms = report.metrics["ranks"]
    return [{"rank": r, "values": [sm.fmt(ms[r].get(k), unit) for k, _, unit in sm.RANK_METRICS]} for r in ranks]


@dataclass(frozen=True)
class RankRow:
    """One row of a per-rank section: a rank, or for a run of many ranks an aggregate over all of them."""

    key: str  # the table's rank cell: "3", or "median" / "min" / "max"
    label: str  # a chart's row label: "rank 3", "median of 64 ranks"
    metrics: dict[str, Any]
    rank: str | None  # the rank whose evidence the row may quote (None for "min" / "max")
    spread: bool = False  # a min or max row: per metric, the extreme over ranks (tables only, never a bar)


def rank_rows(report: Report, n: int) -> list[RankRow]:
    """Every rank; for a run of many ranks, what every section holds at 8 ranks in aggregate: the median
    rank's metrics (the JSON's ``metrics.all``), their minimum and maximum over ranks, then the ranks that
    stand out, so that a chart holds at most ``n`` bars."""
    ms = report.metrics.get("ranks", {})
    if not many(report):
        return [RankRow(r, f"rank {r}", ms[r], r) for r in sm.ranks(report)]
    values = list(ms.values())
    numeric = {k for m in values for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    low, high = {}, {}
    for k in numeric:
        have = [v for m in values if isinstance(v := m.get(k), (int, float)) and not isinstance(v, bool)]
        low[k], high[k] = min(have), max(have)
    first = next(iter(sm.ranks(report)), None)
    rows = [RankRow("median", f"median of {len(ms)} ranks", report.metrics.get("all", {}), first),
            RankRow("min", "minimum over ranks", low, None, True),
            RankRow("max", "maximum over ranks", high, None, True)]
    rows += [RankRow(r, f"rank {r}", ms[r], r) for r, _ in outliers(report, n - 1) if r in ms]
    return rows
