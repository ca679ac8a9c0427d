"""The pipeline, top to bottom: load → classify → measure → (diagnose) → Report.

Renderers (``perfdoctor.render``) turn the Report into terminal tables, JSON, HTML or Markdown;
nothing here formats output.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfdoctor import __version__
from perfdoctor.classify.framework import detect_framework
from perfdoctor.classify.groups import label_groups
from perfdoctor.classify.timeline import copy_classes, kernel_classes
from perfdoctor.diagnose import diagnose, load_rules
from perfdoctor.diff import Diff, compare, read_report
from perfdoctor.errors import InputError
from perfdoctor.load.discover import discover_snapshots
from perfdoctor.load.memsnap import load_snapshot, rank_from_name
from perfdoctor.load.run import load_run
from perfdoctor.measure.activity import activity
from perfdoctor.measure.breakdown import activity_window, summarize
from perfdoctor.measure.excerpt import excerpt
from perfdoctor.measure.graphs import graph_metrics
from perfdoctor.measure.memory import MemoryMeasurement, measure_memory, measure_run_memory
from perfdoctor.measure.metrics import across_ranks, timeline_metrics
from perfdoctor.measure.pipeline import theory
from perfdoctor.measure.ranks import rank_metrics, rank_stages
from perfdoctor.measure.step_series import step_series
from perfdoctor.measure.steps import find_steps
from perfdoctor.measure.work_units import kernel_work
from perfdoctor.model import Report


def analyze(paths: list[Path | str], config: dict[str, Any] | None = None,
            progress: Callable[[int, int, str], None] | None = None,
            rules_dirs: list[Path | str] | None = None, timeline_excerpts: bool = True,
            config_sources: dict[str, str] | None = None, allow_mixed: bool = False,
            device_memory_bytes: int | None = None) -> Report:
    """Analyse trace files or run directories into one Report; ``progress(done, total, what)`` is
    called as each timeline is analysed (the CLI's progress bar). Findings come from the shipped
    rules plus those in ``rules_dirs`` (loaded first, so a bad rule file fails before the analysis).
    ``timeline_excerpts``: draw the representative step for the HTML report (the CLI skips it when no
    HTML is wanted: it costs a pass over the kernels). ``config_sources`` says where each ``config``
    value came from (default "cli"); ``allow_mixed`` analyses inputs that are several captures as one.
    ``device_memory_bytes`` (``--device-memory``): the GPU's memory for the headroom rules, over what the
    trace's GPU table says."""
    rules = load_rules(rules_dirs)
    run = load_run([Path(p) for p in paths], config, config_sources, allow_mixed, detail=False)
    run.framework = detect_framework(run)
    devices, per_rank = [], {}
    series, excerpts = {}, []
    for done, tl in enumerate(run.timelines):
        if progress is not None:
            progress(done, len(run.timelines), f"analysing {tl.label}")
        kcls = kernel_classes(tl.kernels)
        ccls = copy_classes(tl.memcpy)
        groups = label_groups(tl, kcls, run.config)
        window = activity_window(tl)
        steps = find_steps(tl, window, kcls) if window else None
        act = activity(tl, kcls, ccls)
        device = summarize(tl, kcls, ccls, act, steps)
        device.groups = groups.summary(tl.kernels)
        devices.append(device)
        excerpts.append(excerpt(tl, kcls, act, steps, groups, run.config)
                        if steps is not None and timeline_excerpts else None)
        if steps is not None:
            series[str(tl.rank)] = step_series(tl.kernels, act, steps, groups)
        if steps is not None:
            per_rank[str(tl.rank)], device.evidence = timeline_metrics(tl, kcls, act, steps, groups, run.config)
            per_rank[str(tl.rank)] |= graph_metrics(tl, steps)
            if (work := kernel_work(tl.kernels, kcls, steps)) is not None:
                device.evidence["work"] = work
    memory_warnings = measure_run_memory(run, devices, per_rank, device_memory_bytes)
    stages = rank_stages(run)
    for device in devices:
        if (run.config.get("pp") or 1) > 1 and stages.get(str(device.rank)) is not None:
            device.evidence["pipeline"] = {"stage": stages[str(device.rank)]}
    metrics_all = across_ranks(per_rank) | rank_metrics(per_rank, stages)
    warnings = list(run.warnings) + memory_warnings
    if (run.config.get("pp") or 1) > 1 and (missing := theory(run.config)[1]):
        flag = "--" + missing[0].replace("_", "-")
        warnings.append(f"pipeline bubble theory needs {', '.join(missing)} (give it with {flag})")
    if any(d.step_source == "window" for d in devices if d.window):
        warnings.append("no step markers found (perfdoctor `step` or `ProfilerStep#N` ranges): "
                        "the whole capture window is treated as one step")
    report = Report(tool_version=__version__, run=run, devices=devices,
                    metrics={"all": metrics_all, "ranks": per_rank}, warnings=warnings, series=series,
                    excerpts=excerpts)
    report.findings = diagnose(report, rules)
    return report


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
    out = []
    for path in files:
        mem = measure_memory(load_snapshot(path), device, device_total_bytes)
        mem.rank = rank_from_name(path)
        out.append(mem)
    return sorted(out, key=lambda m: (m.rank is None, m.rank or 0))


def diff(base: Path | str, head: Path | str, config: dict[str, Any] | None = None,
         config_sources: dict[str, str] | None = None, allow_mixed: bool = False) -> Diff:
    """Compare two runs (each a trace, a run directory or a saved JSON report): BASE → HEAD."""
    from perfdoctor.render.json import report_dict

    def side(path: Path) -> dict[str, Any]:
        saved = read_report(path)
        return saved if saved is not None else report_dict(
            analyze([path], config, config_sources=config_sources, allow_mixed=allow_mixed))

    impact = {r.id: r.spec["impact"]["metric"] for r in load_rules() if isinstance(r.spec.get("impact"), dict)
              and r.spec["impact"].get("metric")}
    return compare(side(Path(base)), side(Path(head)), str(base), str(head), impact)

