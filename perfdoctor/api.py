"""The pipeline, top to bottom: load → classify → measure → blame → (diagnose) → Report.

Renderers (``perfdoctor.render``) turn the Report into terminal tables, JSON, HTML or Markdown;
nothing here formats output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from perfdoctor import __version__, shared
from perfdoctor.blame import join as blame_join
from perfdoctor.blame.causes import BLOCKING_KEYS
from perfdoctor.blame.focus import KernelMarks, kernel_marks
from perfdoctor.blame.graph import OpSource
from perfdoctor.blame.join import across as blocking_across
from perfdoctor.blame.join import join, late_blocking
from perfdoctor.blame.path import RankPath
from perfdoctor.blame.window import windowed_path
from perfdoctor.classify.framework import detect_framework, timeline_fingerprints
from perfdoctor.classify.groups import GROUPS, GroupLabels, label_groups
from perfdoctor.classify.timeline import copy_classes, kernel_classes
from perfdoctor.cores import Later, beside, on_demand, sized_for
from perfdoctor.diagnose import diagnose, load_rules
from perfdoctor.errors import InputError
from perfdoctor.execute import run_tasks
from perfdoctor.heap import MMAP_ABOVE, give_back, huge_pages_for
from perfdoctor.load.discover import discover, discover_snapshots
from perfdoctor.load.labels import config_mark, rank_mark
from perfdoctor.load.run import assign_ranks, attach_snapshots, load_trace, merge_config
from perfdoctor.load.run_identity import check_one_run, last_event_ns
from perfdoctor.measure.activity import activity, group_comm
from perfdoctor.measure.breakdown import activity_window, measured_ns, summarize
from perfdoctor.measure.collectives import Collectives, Unpacked, add_context, collectives, finish, pack
from perfdoctor.measure.excerpt import excerpt, representative_step
from perfdoctor.measure.graphs import graph_metrics
from perfdoctor.measure.host import HostContext, LaunchStats, host_gaps, host_pauses, launch_stats
from perfdoctor.measure.kernel_mix import unfused_kinds
from perfdoctor.measure.memory import MemoryMeasurement, measure_memory, measure_run_memory
from perfdoctor.measure.metrics import across_ranks, step_quantities, timeline_metrics
from perfdoctor.measure.peers import match
from perfdoctor.measure.pipeline import theory
from perfdoctor.measure.ranks import peer_metrics, rank_metrics, rank_stages, stage_evidence
from perfdoctor.measure.step_series import step_series
from perfdoctor.measure.steps import Steps, find_steps
from perfdoctor.measure.trace_excerpt import middle_step, run_trace, trace_excerpt
from perfdoctor.measure.windows import windows
from perfdoctor.measure.work_units import kernel_work
from perfdoctor.model import DeviceSummary, Report, Run, Timeline, TimelineInfo, TraceInfo
from perfdoctor.records import Loaded, Records
from perfdoctor.sample import glance, pick
from perfdoctor.table import Table

if TYPE_CHECKING:
    from perfdoctor.diff import Diff


def analyze(paths: list[Path | str], config: dict[str, Any] | None = None,
            progress: Callable[[int, int, str], None] | None = None,
            rules_dirs: list[Path | str] | None = None, timeline_excerpts: bool = True,
            jobs: int | None = None, dask: str | None = None, sample: int | None = None,
            config_sources: dict[str, str] | None = None, allow_mixed: bool = False,
            device_memory_bytes: int | None = None, trace_excerpts: bool = False) -> Report:
    """Analyse trace files or run directories into one Report; ``progress(done, total, what)`` is
    called as each file's ranks are analysed (the CLI's progress bar). Findings come from the shipped
    rules plus those in ``rules_dirs`` (loaded first, so a bad rule file fails before the analysis).
    ``timeline_excerpts``: draw the representative step for the HTML report (the CLI skips it when no
    HTML is wanted: it costs a pass over the kernels). ``jobs`` / ``dask``: where the per-rank tasks
    run (perfdoctor.execute); the Report is the same whichever runs them. ``sample``: analyse that many
    representative files of a large run (perfdoctor.sample), and say so in the warnings.
    ``config_sources`` says where each ``config`` value came from (default "cli"); ``allow_mixed``
    analyses inputs that are several captures as one. ``device_memory_bytes`` (``--device-memory``): the
    GPU's memory for the headroom rules, over what the trace's GPU table says. ``trace_excerpts``: keep one
    step of every rank and the waits between ranks on one clock for the Perfetto timeline (``--perfetto``;
    perfdoctor.measure.trace_excerpt)."""
    rules = load_rules(rules_dirs)
    files = discover([Path(p) for p in paths])
    found = discover_snapshots([Path(p) for p in paths])
    if found:
        from perfdoctor.load.memsnap import load_snapshot  # the pickle reader: only when there are snapshots
    snapshots = [load_snapshot(p) for p in found]  # small next to traces: fail fast
    cli = config or {}
    sampled = None
    if sample is not None:
        files, sampled = pick(run_tasks(glance, files, jobs, dask), sample, cli)
    tasks = [FileTask(path, cli, timeline_excerpts, trace_excerpts) for path in files]
    seen: dict[Any, Any] = {}
    store = Records()  # the tasks' results, out of memory while the pool runs beside this process
    results = [_kept(s, store, seen) for s in run_tasks(analyze_packed, tasks, jobs, dask, progress,
                                                         keep=lambda sent: _stored(sent, store))]
    run = Run(traces=[r.trace for r in results], timelines=[rank.info for r in results for rank in r.ranks])
    for info in run.traces:
        run.warnings.extend(f"{info.path.name}: {w}" for w in info.warnings)
    check_one_run(run, [Path(p) for p in paths], allow_mixed)
    assign_ranks(run, mark_of=lambda tl: tl.rank_mark)
    attach_snapshots(run, snapshots)
    merge_config(run, cli, config_sources, mark_of=lambda tl: tl.config_mark)
    run.framework = detect_framework(run)
    results = _reclassify(results, run.config, jobs, dask, store, seen)
    ranks = sorted((rank for r in results for rank in r.ranks), key=lambda rank: rank.info.rank)
    run.timelines = [rank.info for rank in ranks]
    stages, world = rank_stages(run)
    # The cross-rank analysis first, on each rank's collectives and critical path read from the store rank
    # by rank, before the ranks' report content is loaded: their peaks and that content do not add up.
    cols = Unpacked(Loaded(store, {rank.info.rank: rank.stored[1] for rank in ranks if rank.stored[1] >= 0},
                           seen, 0))
    waits = match(cols, {rank.info.rank: rank.exposed for rank in ranks if rank.exposed is not None},
                  run.config, world)
    give_back()  # match's table of every rank's instances, not reused by join: held, the two peaks added up
    pp_theory = theory(run.config)[0] if (run.config.get("pp") or 1) > 1 else None
    blocking, paths = join(Loaded(store, {rank.info.rank: rank.stored[2] for rank in ranks if rank.stored[2] >= 0},
                                  seen, blame_join.ACROSS_CACHE), cols, waits.instances, pp_theory, waits.clock)
    del cols
    give_back()  # join's paths and entries of the ranks
    for rank in ranks:
        rank.load(store, seen)
    store.close()
    devices, per_rank, series, excerpts = _summaries(ranks)
    memory_warnings = measure_run_memory(run, devices, per_rank, device_memory_bytes)
    across = rank_metrics(per_rank, stages)
    critical = across["pipeline.critical_stage"]
    for device in devices:
        if (run.config.get("pp") or 1) > 1 and stages.get(str(device.rank)) is not None:
            device.evidence["pipeline"] = stage_evidence(stages[str(device.rank)],
                                                         per_rank.get(str(device.rank), {}), critical)
    for device in devices:
        if str(device.rank) in waits.evidence:
            device.evidence["peers"] = waits.evidence[str(device.rank)]
    for r, metrics in per_rank.items():
        metrics.update(waits.metrics.get(r, {}))
        metrics["ranks.late_ms"] = waits.late_ms.get(r)
    for r, metrics in per_rank.items():
        metrics.update(blocking.get(r) or dict.fromkeys(BLOCKING_KEYS))
    blocking_all = blocking_across(per_rank)
    metrics_all = across_ranks(per_rank) | across | peer_metrics(waits, per_rank, devices) | blocking_all
    metrics_all["ranks.late_blocking_ms"] = late_blocking(per_rank, metrics_all.get("ranks.slowest"))
    warnings = ([sampled] if sampled else []) + list(run.warnings) + memory_warnings
    if (run.config.get("pp") or 1) > 1 and (missing := theory(run.config)[1]):
        flag = "--" + missing[0].replace("_", "-")
        warnings.append(f"pipeline bubble theory needs {', '.join(missing)} (give it with {flag})")
    if any(d.step_source == "window" for d in devices if d.window):
        warnings.append("no step markers found (perfdoctor `step` or `ProfilerStep#N` ranges, framework or "
                        "repeating NVTX ranges, optimizer period): the whole capture window is treated as one step")
    warnings.extend(before_steps(devices))
    report = Report(tool_version=__version__, run=run, devices=devices,
                    metrics={"all": metrics_all, "ranks": per_rank}, warnings=warnings, series=series,
                    excerpts=excerpts, path=paths)
    if trace_excerpts:
        report.run_trace = run_trace({rank.info.rank: rank.trace_excerpt for rank in ranks
                                      if rank.trace_excerpt is not None}, waits)
    report.findings = diagnose(report, rules)
    if (too_little := too_little_to_analyse(devices)) is not None:
        report.warnings.insert(0, too_little)
        for f in report.findings:  # what such a capture shows is not evidence of a problem
            f["severity"], f["confidence"] = "info", "low"
    return report


# A training or inference step launches hundreds of kernels; a capture whose busiest rank holds fewer than
# this many (a profiler range closed early, a capture of the wrong phase) has nothing to diagnose.
MIN_KERNELS_PER_RANK = 10


def too_little_to_analyse(devices: list[DeviceSummary]) -> str | None:
    """One line saying why the input holds too little to diagnose, or None."""
    gpus = [d for d in devices if d.device_id is not None]
    most = max((d.kernel_count for d in gpus), default=0)
    if not gpus or most >= MIN_KERNELS_PER_RANK:  # a CPU-only capture says so in its own words
        return None
    steps = max((len(d.step_ns) for d in gpus if d.step_source != "window"), default=0)
    what = f"at most {most} kernel{'s' if most != 1 else ''} per rank"
    return (f"too little to analyse: {what} and {steps or 'no'} step{'s' if steps != 1 else ''} marked "
            f"(a step launches hundreds of kernels): findings are shown as info only; capture at least one "
            f"whole iteration")


def before_steps(devices: list[DeviceSummary]) -> list[str]:
    """One warning when the steps leave out the work before the first of them: init and warm-up ranges
    the program named, or device time longer than a step."""
    left = [d for d in devices if d.window and d.excluded_ns > 0
            and (d.excluded_ranges or d.excluded_ns > (max(d.step_ns) if d.step_ns else 0))]
    if not left:
        return []
    ms = sorted(d.excluded_ns for d in left)[len(left) // 2] / 1e6
    names = list(dict.fromkeys(r for d in left for r in d.excluded_ranges))
    named = f" (ranges {', '.join(f'`{n}`' for n in names)})" if names else ""
    source = f"`{left[0].step_label}` ranges" if left[0].step_label else left[0].step_source
    return [f"{ms:,.1f} ms of device work before the first step{named} is left out of every measurement "
            f"(steps from {source}; {len(left)} of {len(devices)} devices)"]


@dataclass(frozen=True)
class FileTask:
    """One unit of work: a trace file and the config to classify its ranks with."""

    path: Path
    config: dict[str, Any]
    excerpts: bool
    trace_excerpts: bool = False


@dataclass
class RankResult:
    """What one rank's task sends back (small and picklable; never the timeline). As the driver receives
    it (analyze_packed), only ``info`` and ``exposed``: the rest is in the records ``stored`` numbers."""

    info: TimelineInfo
    device: DeviceSummary
    metrics: dict[str, Any] | None
    series: dict[str, list[float]] | None
    excerpt: Any
    collectives: Collectives | None
    trace_excerpt: Any = None
    blame: RankPath | None = None
    # Per communication group, the metrics' comm.<group>.exposed_ms (what match needs of them); None without
    # metrics. Set where the task runs.
    exposed: dict[str, float | None] | None = None
    # Where analyze keeps the rank until its turn: the numbers in its Records of the report's content
    # (device, metrics, series, excerpts: :meth:`load`), of the packed collectives and of the critical path
    # (read by match and join); -1: none.
    stored: tuple[int, int, int] = (-1, -1, -1)

    def load(self, store: Records, seen: dict[Any, Any]) -> None:
        """The report's content of the rank, from ``store`` (names resolved in ``seen``: perfdoctor.shared)."""
        self.device, self.metrics, self.series, self.excerpt, self.trace_excerpt = \
            shared.loads(store[self.stored[0]], seen)


@dataclass
class FileResult:
    trace: TraceInfo
    config: dict[str, Any]  # the config its ranks were classified with
    excerpts: bool
    trace_excerpts: bool = False
    ranks: list[RankResult] = field(default_factory=list)


# What a file's task sends back (analyze_packed): the FileResult with only its ranks' identities, and per
# rank its report content (RankResult.load), its packed collectives and its critical path, each pickled on its
# own (perfdoctor.shared).
Sent = tuple[bytes, list[tuple[bytes, bytes | None, bytes | None]]]
# A Sent in the driver's Records: the record numbers in its place (-1: none).
Stored = tuple[int, list[tuple[int, int, int]]]


def _stored(sent: Sent, store: Records) -> Stored:
    """A file's result as the driver holds it while the pool runs: in ``store``, an integer a record here."""
    head, parts = sent
    return store.add(head), [tuple(-1 if p is None else store.add(p) for p in part) for part in parts]


def _kept(stored: Stored, store: Records, seen: dict[Any, Any]) -> FileResult:
    """A file's result as the driver keeps it until the report is made: the names in it (metrics, kernels,
    categories, environment, tables) in one copy among all files (perfdoctor.shared); each rank's report
    content, collectives and critical path left in ``store`` (RankResult.stored)."""
    head, numbers = stored
    result = shared.loads(store[head], seen)
    for rank, stored_at in zip(result.ranks, numbers):
        rank.stored = stored_at
    return result


def _reclassify(results: list[FileResult], config: dict[str, Any], jobs: int | None,
                dask: str | None, store: Records, seen: dict[Any, Any]) -> list[FileResult]:
    """A file whose own config marks differ from the run's (say it has none) is analysed again with the
    run's config, so every rank is classified and measured under the same parallel config."""
    stale = [i for i, r in enumerate(results) if r.config != config]
    if not stale:
        return results
    again = run_tasks(analyze_packed, [FileTask(results[i].trace.path, config, results[i].excerpts,
                                                results[i].trace_excerpts) for i in stale], jobs, dask,
                      keep=lambda sent: _stored(sent, store))
    results = list(results)
    for i, result in zip(stale, (_kept(s, store, seen) for s in again)):
        for old, new in zip(results[i].ranks, result.ranks):
            new.info = old.info  # the run-level rank and memory snapshot
        results[i] = result
    return results


def _summaries(ranks: list[RankResult]) -> tuple[list[DeviceSummary], dict[str, dict[str, Any]],
                                                 dict[str, dict[str, list[float]]], list[Any]]:
    """Devices, per-rank metrics, step series and excerpts of the ranks, under their run-level rank."""
    devices, per_rank, series, excerpts = [], {}, {}, []
    for rank in ranks:
        key = str(rank.info.rank)
        rank.device.rank, rank.device.label = rank.info.rank, rank.info.label
        if rank.excerpt is not None:
            rank.excerpt.rank = rank.info.rank
        devices.append(rank.device)
        excerpts.append(rank.excerpt)
        if rank.series is not None:
            series[key] = rank.series
        if rank.metrics is not None:
            per_rank[key] = rank.metrics
    return devices, per_rank, series, excerpts


def analyze_packed(task: FileTask) -> Sent:
    """:func:`analyze_file` as the driver receives it (:data:`Sent`), pickled with its names shared (see
    :func:`_kept`): the ranks' identities, and apart each rank's report content, collective instances (packed
    where the task runs: perfdoctor.measure.collectives.pack) and critical path, for the driver to keep out of
    memory until their turn (the cross-rank analysis reads the last two, then the report the first)."""
    result = analyze_file(task)
    parts = []
    for rank in result.ranks:
        parts.append((shared.dumps((rank.device, rank.metrics, rank.series, rank.excerpt, rank.trace_excerpt)),
                      None if rank.collectives is None else shared.dumps(pack(rank.collectives)),
                      None if rank.blame is None else shared.dumps(rank.blame)))
        if rank.metrics is not None:
            rank.exposed = {g: rank.metrics.get(f"comm.{g}.exposed_ms") for g in GROUPS}
        rank.device = rank.metrics = rank.series = rank.excerpt = rank.trace_excerpt = None  # type: ignore[assignment]
        rank.collectives = rank.blame = None
    return shared.dumps(result), parts


def analyze_file(task: FileTask) -> FileResult:
    """Load one file, then analyse its timelines one at a time, each put together from the file's pieces
    when its turn comes (perfdoctor.load.pieces) and dropped once summarised."""
    trace, timelines = load_trace(task.path, detail=False, lazy=True)
    run = Run(traces=[trace], timelines=timelines)
    assign_ranks(run)  # provisional (within the file); the run-level assignment has the last word
    merge_config(run, task.config)
    result = FileResult(trace, run.config, task.excerpts, task.trace_excerpts)
    while timelines:
        tl = timelines.pop(0).filled()
        tables = (tl.kernels, tl.api, tl.nvtx, tl.memcpy, tl.memset)
        with sized_for(sum(t.nbytes for t in tables), sum(t.nbytes_in_memory for t in tables)), \
                huge_pages_for(8 * max(len(t) for t in (tl.kernels, tl.api, tl.nvtx, tl.memcpy, tl.memset))):
            result.ranks.append(analyze_timeline(tl, run.config, task.excerpts, task.trace_excerpts))
        del tl  # not held while the next timeline is analysed
    return result


def analyze_timeline(tl: Timeline, config: dict[str, Any], excerpts: bool, trace_excerpts: bool = False) -> RankResult:
    """One rank: classify → measure → summary → critical path. The measurements on the device's interval
    sets run a window of whole steps at a time (:func:`measure_windows`); the rest (tallies, medians over
    kernels, evidence) once over the whole tables. Where the task has a second core, the critical path
    (:func:`blame`, the largest single piece of work: it needs only the taxonomy, the group labels and the
    steps) is computed beside every other measurement (:func:`perfdoctor.cores.beside`), started as soon as
    its inputs are known; so are the launch statistics, which need the timeline's columns alone: counted
    while the kernels are classified; and the kernels' work (:func:`kernel_work`), beside the summary and the
    metrics once the windows are measured. One at a time, each comes when its result is asked for."""
    launches_later = beside(host_side, tl) if tl.device_id is not None else None
    kcls = kernel_classes(tl.kernels)
    ccls = copy_classes(tl.memcpy)
    window = activity_window(tl)
    steps = find_steps(tl, window, kcls) if window else None
    on_device = tl.device_id is not None and steps is not None and len(steps) > 0
    groups = label_groups(tl, kcls, config)
    marks = on_demand(kernel_marks, tl, kcls, steps) if on_device else None
    blame_later = beside(blame, tl, kcls, ccls, groups, steps, marks) if on_device else None
    if marks is not None:
        marks.result()  # made here while the critical path begins (it asks at its first window's walk)
    info = TimelineInfo(trace=tl.trace, pid=tl.pid, global_pid=tl.global_pid, device_id=tl.device_id,
                        process_name=tl.process_name, rank=tl.rank, rank_source=tl.rank_source,
                        rank_mark=rank_mark(tl), config_mark=config_mark(tl), last_event_ns=last_event_ns(tl),
                        fingerprints=timeline_fingerprints(tl))
    cols = collectives(tl, steps, groups) if on_device else None
    # On a timeline whose columns are mapped on their own (heap.MMAP_ABOVE: millions of kernels) the heap's
    # free pages go back before and after the windows: the classification's temporaries are not reused by
    # the windows' (smaller), nor the windows' by the tallies' columns. On a smaller one the heap serves its
    # next arrays as it is (a trim costs its page faults again: 0.1 s at 1M).
    trim = give_back if 8 * len(tl.kernels) >= MMAP_ABOVE else lambda: None
    trim()
    measured = measure_windows(tl, kcls, groups, steps, config, on_device, cols,
                               excerpts and steps is not None, trace_excerpts and steps is not None)
    trim()
    # The kernels' work (one pass over every kernel) beside the summary and the metrics: the critical path
    # ends about when the windows do, and the main thread's last passes were then the run's tail on one core.
    work_later = beside(kernel_work, tl.kernels, kcls, steps) if steps is not None else None
    device = summarize(tl, kcls, ccls, steps, measured.ns)
    device.groups = groups.summary(tl.kernels)
    result = RankResult(info, device, None, None, None, None)
    if steps is None:
        return result
    result.excerpt, result.trace_excerpt = measured.excerpt, measured.trace_excerpt
    launches = launches_later.result() if on_device else None
    result.metrics, device.evidence = timeline_metrics(tl, kcls, steps, groups, measured.quantities, launches,
                                                       config)
    result.metrics |= graph_metrics(tl, steps)
    result.series = measured.series
    if (work := work_later.result()) is not None:
        device.evidence["work"] = work
    if cols is not None:  # on a device: so is the critical path
        result.collectives = finish(cols)
        result.blame = blame_later.result()
    return result


@dataclass
class Measured:
    """What :func:`measure_windows` measured on a timeline's interval sets, its windows joined."""

    ns: tuple[int, int, int]  # busy, compute, comm (perfdoctor.measure.breakdown.measured)
    quantities: dict[str, np.ndarray]  # per step (perfdoctor.measure.metrics.step_quantities)
    series: dict[str, list[float]] | None = None
    excerpt: Any = None
    trace_excerpt: Any = None


def host_side(tl: Timeline) -> LaunchStats:
    """The launch statistics, after the process's host pauses (kept for both that ask for them: the host
    gaps' context, :class:`perfdoctor.measure.host.HostContext`, and the critical path's causes). Beside
    the classification both are ready before either asks: computed by the first to ask, they held up the
    other (on a 10M-kernel export the critical path waited 0.18 s of the 0.31 s the main thread spent on them
    as its windows began)."""
    host_pauses(tl)
    return launch_stats(tl)


def measure_windows(tl: Timeline, kcls: Table, groups: GroupLabels, steps: Steps | None, config: dict[str, Any],
                    on_device: bool, cols: Collectives | None, excerpts: bool, trace_excerpts: bool) -> Measured:
    """The measurements of ``tl`` on its interval sets (what ran, computed, communicated; each group's
    exposed comm; the host gaps), a window of whole steps at a time (perfdoctor.measure.windows): each
    window's sets are let go before the next window's are made. The collective instances ``cols`` get
    their context from the windows."""
    ns = np.zeros(3, dtype=np.int64)
    if steps is None:  # no device work and no NVTX: nothing to measure
        return Measured((0, 0, 0), {})
    counts = np.bincount(groups.codes[groups.codes >= 0].astype(np.int64), minlength=len(GROUPS))
    whole = (bool(len(tl.kernels)), tuple(int(c) for c in counts))
    context = HostContext(tl) if on_device or trace_excerpts else None
    shown = representative_step(steps) if excerpts and len(steps) else -1
    middle = middle_step(steps) if trace_excerpts and len(steps) else 0
    unfused = unfused_kinds(tl.kernels)[0] if on_device else None
    parts: list[tuple[dict[str, np.ndarray], dict[str, list[float]]]] = []
    out = Measured((0, 0, 0), {})
    for win in windows(tl, steps):
        if win.tl is tl:  # one window: the timeline's own arrays
            w_kcls, w_groups, w_unfused = kcls, groups, unfused
        else:
            w_kcls = kcls.take(win.kernels)
            w_groups = GroupLabels(groups.codes[win.kernels], groups.source_codes[win.kernels],
                                   groups.confidence_codes[win.kernels])
            w_unfused = unfused[win.kernels] if unfused is not None else None
        act = activity(win.tl, w_kcls, copy_classes(win.tl.memcpy))
        ns += measured_ns(act, win.owns)
        if not len(steps):
            continue
        by_group = group_comm(win.tl.kernels, act, w_groups.codes, len(GROUPS))
        in_window = win.first <= shown < win.first + len(win.steps)
        if in_window:
            out.excerpt = excerpt(win.tl, w_kcls, act, steps, w_groups, by_group, config, step_index=shown,
                                  context=context)
        if trace_excerpts and win.first <= middle < win.first + max(len(win.steps), 1):
            out.trace_excerpt = trace_excerpt(win.tl, w_kcls, copy_classes(win.tl.memcpy), act, steps, w_groups,
                                              by_group, config, context)
        gaps = host_gaps(win.tl, win.steps, act.busy, context, win.next_start) if on_device else None
        quantities = step_quantities(win.tl, w_kcls, act, win.steps, groups.any_labelled, by_group, gaps, w_unfused,
                                     config) if on_device else {}
        parts.append((quantities, step_series(win.steps, quantities, whole)))
        if cols is not None:
            add_context(cols, win.owns, act, by_group, gaps)
        del act, by_group, gaps
    out.ns = tuple(int(v) for v in ns)
    if parts:
        out.quantities = {key: np.concatenate([q[key] for q, _ in parts]) for key in parts[0][0]}
        out.series = {key: [x for _, s in parts for x in s[key]] for key in parts[0][1]}
    elif not len(steps):
        out.series = {}
    return out


def blame(tl: Timeline, kcls: Table, ccls: Table, groups: GroupLabels, steps: Steps,
          marks: Later[KernelMarks]) -> RankPath:
    """The rank's critical path (perfdoctor.blame): its device ops, their dependency graph, each step walked.
    ``marks``: the kernels' marks (:func:`perfdoctor.blame.focus.kernel_marks`), made by whoever asks first."""
    return windowed_path(tl, OpSource(tl, kcls, ccls, groups), steps, np.flatnonzero(groups.codes >= 0),
                         marks.result)


def memory(paths: list[Path | str], device_total_bytes: int | None = None,
           device: int | None = None) -> list[MemoryMeasurement]:
    """Analyse CUDA memory snapshots on their own (``perfdoctor memory``): one measurement per file,
    in rank order. ``device_total_bytes`` is the GPU's memory, for the headroom (a snapshot does not
    record it)."""
    files: list[Path] = []
    for path in map(Path, paths):
        if not path.exists():
            raise InputError(f"{path}: no such file or directory")
        files.extend([path] if path.is_file() else discover_snapshots([path]))  # a file is taken as given
    if not files:
        raise InputError(f"{paths[0]}: no memory snapshots (*.pickle) found")
    from perfdoctor.load.memsnap import load_snapshot, rank_from_name

    out = []
    for path in files:
        mem = measure_memory(load_snapshot(path), device, device_total_bytes)
        mem.rank = rank_from_name(path)
        out.append(mem)
    return sorted(out, key=lambda m: (m.rank is None, m.rank or 0))


def diff(base: Path | str, head: Path | str, config: dict[str, Any] | None = None,
         config_sources: dict[str, str] | None = None, allow_mixed: bool = False, trace_excerpts: bool = False) -> Diff:
    """Compare two runs (each a trace, a run directory or a saved JSON report): BASE → HEAD.
    ``trace_excerpts``: keep each analysed side's RunTrace in ``Diff.sides`` (for ``--perfetto``)."""
    from perfdoctor.diff import compare, read_report  # only `perfdoctor diff` needs them
    from perfdoctor.render.json import report_dict

    sides: list[tuple[dict[str, Any], Any]] = []

    def side(path: Path) -> dict[str, Any]:
        saved = read_report(path)
        if saved is not None:
            sides.append((saved, None))
            return saved
        report = analyze([path], config, config_sources=config_sources, allow_mixed=allow_mixed,
                         trace_excerpts=trace_excerpts)
        sides.append((report_dict(report), report.run_trace))
        return sides[-1][0]

    impact = {r.id: r.spec["impact"]["metric"] for r in load_rules() if isinstance(r.spec.get("impact"), dict)
              and r.spec["impact"].get("metric")}
    d = compare(side(Path(base)), side(Path(head)), str(base), str(head), impact)
    d.sides = sides if trace_excerpts else []
    return d

