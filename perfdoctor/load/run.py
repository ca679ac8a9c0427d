"""Load every input into one :class:`Run`: timelines with ranks, and the parallel/model config.

Rank of a timeline (DESIGN §2): the capture hook's ``rank`` mark, else the ``RANK``-style variable of
the captured environment (only meaningful when the file holds a single process), else file order —
and each timeline records which source was used.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfdoctor.load.discover import discover, discover_snapshots
from perfdoctor.load.labels import config_mark, rank_mark
from perfdoctor.load.memsnap import MemorySnapshot, load_snapshot, rank_from_name
from perfdoctor.load.nsys import load_export
from perfdoctor.model import Run, Timeline

RANK_ENV_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def load_run(paths: list[Path], config: dict[str, Any] | None = None) -> Run:
    """Read all inputs; ``config`` holds values given on the command line (they win over marks)."""
    traces, timelines = [], []
    exports = discover(paths)
    snapshots = [load_snapshot(p) for p in discover_snapshots(paths)]  # small next to traces: fail fast
    for path in exports:
        info, tls = load_export(path)
        traces.append(info)
        timelines.extend(tls)
    run = Run(traces=traces, timelines=timelines)
    for info in traces:
        run.warnings.extend(f"{info.path.name}: {w}" for w in info.warnings)
    assign_ranks(run)
    attach_snapshots(run, snapshots)
    merge_config(run, config or {})
    return run


def attach_snapshots(run: Run, snapshots: list[MemorySnapshot]) -> None:
    """Give each memory snapshot to the GPU timeline of the rank in its file name; a single snapshot
    without a rank in its name (Megatron-LM's ``snapshot.pickle``) goes to a single GPU timeline."""
    gpu_timelines = [tl for tl in run.timelines if tl.device_id is not None]
    by_rank = {tl.rank: tl for tl in gpu_timelines}
    for snap in snapshots:
        snap.rank = rank_from_name(snap.path)
        if snap.rank is not None:
            tl = by_rank.get(snap.rank)
        else:
            tl = gpu_timelines[0] if len(gpu_timelines) == 1 and len(snapshots) == 1 else None
        if tl is None:
            why = (f"no GPU timeline has rank {snap.rank}" if snap.rank is not None
                   else "its name does not say which rank it belongs to (name it rank<R>.pickle)")
            run.warnings.append(f"{snap.path.name}: memory snapshot not used: {why}")
        elif tl.memory is not None:
            run.warnings.append(f"{snap.path.name}: memory snapshot not used: rank {tl.rank} already has "
                                f"{tl.memory.path.name}")
        else:
            tl.memory = snap


def assign_ranks(run: Run, mark_of: Callable[[Any], dict[str, int] | None] = rank_mark) -> None:
    """Rank of every timeline, over the whole run (duplicates and file order need all of them);
    ``mark_of`` reads a timeline's rank mark (a TimelineInfo carries it, a Timeline has its NVTX)."""
    per_file: dict[Path, int] = {}
    for tl in run.timelines:
        per_file[tl.trace.path] = per_file.get(tl.trace.path, 0) + 1
        tl.rank = tl.rank_source = None
    for tl in run.timelines:
        mark = mark_of(tl)
        if mark and "r" in mark:
            tl.rank, tl.rank_source = mark["r"], "nvtx-mark"
        elif per_file[tl.trace.path] == 1 and (env_rank := _env_rank(tl)) is not None:
            tl.rank, tl.rank_source = env_rank, "env"
    taken = [tl.rank for tl in run.timelines if tl.rank is not None]
    if len(taken) != len(set(taken)):
        run.warnings.append("several timelines claim the same rank; ranks were reassigned in file order")
        for tl in run.timelines:
            tl.rank = tl.rank_source = None
    free = (r for r in range(len(run.timelines) + len(taken)) if r not in set(taken))
    for tl in run.timelines:
        if tl.rank is None:
            tl.rank, tl.rank_source = next(free), "file-order"
    run.timelines.sort(key=lambda t: t.rank)


def _env_rank(tl: Timeline) -> int | None:
    for var in RANK_ENV_VARS:
        value = tl.trace.env.get(var)
        if value is not None and value.strip().isdigit():
            return int(value)
    return None


def merge_config(run: Run, cli: dict[str, Any],
                 mark_of: Callable[[Any], dict[str, Any]] = config_mark) -> None:
    """Config marks in rank order (the first rank that names a key wins), then the command line."""
    for tl in run.timelines:
        for key, value in mark_of(tl).items():
            if key not in run.config:
                run.config[key] = value
                run.config_sources[key] = "nvtx-mark"
    for key, value in cli.items():
        if value is not None:
            run.config[key] = value
            run.config_sources[key] = "cli"
