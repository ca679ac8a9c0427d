"""Load every input into one :class:`Run`: timelines with ranks, and the parallel/model config.

Rank of a timeline (DESIGN §2): what a single-process file states (a Kineto trace's
``distributedInfo.rank``), the capture hook's ``rank`` mark, else the ``RANK``-style variable of
the captured environment (only meaningful when the file holds a single process), else file order —
and each timeline records which source was used.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfdoctor.load.discover import discover, discover_snapshots, reads_as_kineto
from perfdoctor.load.labels import config_mark, rank_mark
from perfdoctor.load.nsys import load_export
from perfdoctor.load.run_identity import check_one_run, last_event_ns
from perfdoctor.model import Run, Timeline, TraceInfo

if TYPE_CHECKING:
    from perfdoctor.load.memsnap import MemorySnapshot

RANK_ENV_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def load_run(paths: list[Path], config: dict[str, Any] | None = None,
             config_sources: dict[str, str] | None = None, allow_mixed: bool = False, *,
             detail: bool = True) -> Run:
    """Read all inputs into memory at once (``api.analyze`` instead runs one file per task); ``config``
    holds values given by the user (they win over marks), each from ``config_sources[key]`` ("cli"
    unless said: "config-file" for --config). Inputs that are several captures are refused unless
    ``allow_mixed`` (perfdoctor.load.run_identity). ``detail=False``: without the columns no analysis
    reads (load.nsys_columns.DETAIL_COLUMNS)."""
    traces, timelines = [], []
    exports = discover(paths)
    from perfdoctor.load.memsnap import load_snapshot  # the pickle reader: only when there are snapshots

    snapshots = [load_snapshot(p) for p in discover_snapshots(paths)]  # small next to traces: fail fast
    for path in exports:
        info, tls = load_trace(path, detail=detail)
        traces.append(info)
        timelines.extend(tls)
    run = Run(traces=traces, timelines=timelines)
    for info in traces:
        run.warnings.extend(f"{info.path.name}: {w}" for w in info.warnings)
    check_one_run(run, paths, allow_mixed)
    assign_ranks(run)
    attach_snapshots(run, snapshots)
    merge_config(run, config or {}, config_sources or {})
    return run


def load_trace(path: Path, *, detail: bool = True, lazy: bool = False) -> tuple[TraceInfo, list[Timeline]]:
    """One input file, whichever format it is (nsys SQLite export or PyTorch profiler trace). ``lazy``:
    an export's timelines may come back without their large tables (:meth:`Timeline.filled` reads them)."""
    if reads_as_kineto(path):
        from perfdoctor.load.kineto import load_kineto  # msgspec and the JSON reader: only for Kineto input

        return load_kineto(path)
    return load_export(path, detail=detail, lazy=lazy)


def attach_snapshots(run: Run, snapshots: list[MemorySnapshot]) -> None:
    """Give each memory snapshot to the GPU timeline of the rank in its file name; a single snapshot
    without a rank in its name (Megatron-LM's ``snapshot.pickle``) goes to a single GPU timeline."""
    if not snapshots:  # most analyses: the snapshot reader stays unimported
        return
    from perfdoctor.load.memsnap import outside_session, rank_from_name

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
        elif other_run := outside_session(snap, tl.trace.session_start_utc_ns, _trace_end_ns(tl)):
            run.warnings.append(f"{snap.path.name}: memory snapshot not used: {other_run}")
        else:
            tl.memory = snap


def _trace_end_ns(tl: Any) -> int | None:
    """UTC time of the timeline's last event (times are ns since the session start)."""
    last = last_event_ns(tl)
    if tl.trace.session_start_utc_ns is None or last is None:
        return None
    return tl.trace.session_start_utc_ns + last


def assign_ranks(run: Run, mark_of: Callable[[Any], dict[str, int] | None] = rank_mark) -> None:
    """Rank of every timeline, over the whole run (duplicates and file order need all of them);
    ``mark_of`` reads a timeline's rank mark (a TimelineInfo carries it, a Timeline has its NVTX)."""
    per_file: dict[Path, int] = {}
    for tl in run.timelines:
        per_file[tl.trace.path] = per_file.get(tl.trace.path, 0) + 1
        tl.rank = tl.rank_source = None
    for tl in run.timelines:
        mark = mark_of(tl)
        if tl.trace.rank is not None and per_file[tl.trace.path] == 1:
            tl.rank, tl.rank_source = tl.trace.rank, "file"  # a Kineto trace's distributedInfo
        elif mark and "r" in mark:
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


def merge_config(run: Run, cli: dict[str, Any], sources: dict[str, str] | None = None,
                 mark_of: Callable[[Any], dict[str, Any]] = config_mark) -> None:
    """Config marks in rank order (the first rank that names a key wins), then what files state (a
    Kineto trace's Megatron process groups), then the user's values (``sources``: "cli" unless said)."""
    for tl in run.timelines:
        for key, value in mark_of(tl).items():
            if key not in run.config:
                run.config[key] = value
                run.config_sources[key] = "nvtx-mark"
    for info in run.traces:
        for key, value in info.config.items():
            if key not in run.config:
                run.config[key] = value
                run.config_sources[key] = f"{info.format}:process-groups"
    for key, value in cli.items():
        if value is not None:
            run.config[key] = value
            run.config_sources[key] = (sources or {}).get(key, "cli")
