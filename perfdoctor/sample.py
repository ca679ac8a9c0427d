"""``--sample K``: which K files of a large run to analyse, from a cheap first pass over each file.

The first pass reads a few SQL aggregates per file (no timeline): the capture hook's rank and config
marks and the median length of its step ranges (else the span of its kernels). The sample then holds
every pipeline stage (stages do different work), the slowest and the fastest file by that step time
(a straggler and its opposite), and the rest spread evenly over rank order. The report says which
files were sampled and how.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfdoctor.load.discover import reads_as_kineto
from perfdoctor.load.sqlite_export import SqliteExport
from perfdoctor.measure.ranks import stage_of, world_size


@dataclass(frozen=True)
class Glance:
    """What the first pass saw of one file."""

    path: Path
    rank: int | None
    world: int | None
    config: dict[str, Any]
    step_ms: float | None


def glance(path: Path) -> Glance:
    """Rank and config marks and median step (or kernel span) of one export, by SQL aggregates only
    (a PyTorch profiler trace has no such shortcut: it is read, and what it states is used)."""
    if reads_as_kineto(path):
        return _glance_kineto(path)
    db = SqliteExport(path)
    try:
        texts = _nvtx(db)
        rank = world = None
        config: dict[str, Any] = {}
        steps = []
        for start, end, text in texts:
            if text.startswith("rank r="):
                fields = dict(kv.split("=", 1) for kv in text.split()[1:] if "=" in kv)
                rank, world = _int(fields.get("r")), _int(fields.get("world"))
            elif text.startswith("config {"):
                try:
                    config = json.loads(text.partition(" ")[2])
                except json.JSONDecodeError:
                    config = {}
            elif (text.startswith("step n=") or text.startswith("ProfilerStep#")) and end is not None and end > start:
                steps.append(end - start)
        if steps:
            step_ms = statistics.median(steps) / 1e6
        elif db.has("CUPTI_ACTIVITY_KIND_KERNEL"):
            lo, hi = db.query("SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0]
            step_ms = (hi - lo) / 1e6 if lo is not None else None
        else:
            step_ms = None
    finally:
        db.close()
    return Glance(path, rank, world, config if isinstance(config, dict) else {}, step_ms)


def _glance_kineto(path: Path) -> Glance:
    from perfdoctor.load.kineto import load_kineto  # msgspec and the JSON reader: only for Kineto input

    info, timelines = load_kineto(path)
    steps = [int(e - s) for tl in timelines[:1] for s, e, t in zip(tl.nvtx["start"], tl.nvtx["end"], tl.nvtx["text"])
             if isinstance(t, str) and t.startswith("ProfilerStep#") and e > s]
    if steps:
        step_ms = statistics.median(steps) / 1e6
    else:
        spans = [(int(tl.kernels["start"].min()), int(tl.kernels["end"].max())) for tl in timelines if len(tl.kernels)]
        step_ms = (max(e for _, e in spans) - min(s for s, _ in spans)) / 1e6 if spans else None
    return Glance(path, info.rank, info.world_size, dict(info.config), step_ms)


def _nvtx(db: SqliteExport) -> list[tuple[int, int | None, str]]:
    if not db.has("NVTX_EVENTS"):
        return []
    text = "text" if db.has("NVTX_EVENTS", "text") else "NULL"
    if db.has("NVTX_EVENTS", "textId") and db.has("StringIds"):
        sql = (f"SELECT e.start, e.end, COALESCE(e.{text}, s.value) FROM NVTX_EVENTS e "
               "LEFT JOIN StringIds s ON s.id = e.textId")
    else:
        sql = f"SELECT start, end, {text} FROM NVTX_EVENTS"
    where = " WHERE {t} LIKE 'rank r=%' OR {t} LIKE 'config {{%' OR {t} LIKE 'step n=%' OR {t} LIKE 'ProfilerStep#%'"
    column = f"COALESCE(e.{text}, s.value)" if "JOIN" in sql else text
    return [row for row in db.query(sql + where.format(t=column)) if row[2] is not None]


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def pick(glances: list[Glance], k: int, cli_config: dict[str, Any]) -> tuple[list[Path], str]:
    """The ``k`` files to analyse (in input order) and a sentence saying how they were chosen."""
    if k >= len(glances):
        return [g.path for g in glances], f"--sample {k}: all {len(glances)} files analysed"
    config = {**next((g.config for g in glances if g.config), {}), **cli_config}
    marked = max((g.world for g in glances if g.world), default=None)
    world = world_size(config, marked)
    chosen: dict[Path, str] = {}
    by_stage: dict[int, list[Glance]] = {}
    for g in glances:
        stage = stage_of(g.rank, config, world) if g.rank is not None else None
        if stage is not None and (config.get("pp") or 1) > 1:
            by_stage.setdefault(stage, []).append(g)
    for stage in sorted(by_stage):
        chosen.setdefault(by_stage[stage][0].path, "pipeline stage")
    timed = sorted((g for g in glances if g.step_ms is not None), key=lambda g: g.step_ms)
    if timed:
        chosen.setdefault(timed[-1].path, "slowest in the first pass")
        chosen.setdefault(timed[0].path, "fastest in the first pass")
    rest = [g.path for g in sorted(glances, key=lambda g: (g.rank is None, g.rank or 0)) if g.path not in chosen]
    free = k - len(chosen)
    if free > 0 and rest:
        stride = len(rest) / free
        for i in range(free):
            chosen.setdefault(rest[min(int(i * stride), len(rest) - 1)], "spread over ranks")
    picked = [g.path for g in glances if g.path in chosen][:max(k, len(by_stage))]
    kinds = sorted(set(chosen[p] for p in picked))
    return picked, (f"--sample {k}: analysed {len(picked)} of {len(glances)} files ({', '.join(kinds)}); "
                    "run-level medians and cross-rank waits cover the sampled ranks only")
