"""Terminal output: one block of rich tables per device, then the warnings.

User-controlled strings (kernel names, NVTX text, paths) are passed as ``Text`` objects so rich
never interprets them as markup (kernel names are full of ``[lambda ...]``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from perfdoctor.model import DeviceSummary, Report
from perfdoctor.render import scale
from perfdoctor.render import summary as sm
from perfdoctor.render.escape import safe_console
from perfdoctor.render.snippets import knob_snippets

NS_PER_MS = 1e6
# A run of many ranks shows this many outlier ranks and this many warnings (JSON keeps everything).
OUTLIERS_SHOWN = 16
WARNINGS_SHOWN = 10


@contextmanager
def analysis_progress(console: Console | None = None) -> Iterator[Callable[[int, int, str], None] | None]:
    """A transient progress bar on stderr for ``api.analyze(progress=...)``; None (no bar) when stderr
    is not a terminal, so logs and CI output stay clean. rich honours ``NO_COLOR`` and the width."""
    console = console or safe_console(stderr=True)
    if not console.is_terminal:
        yield _every_tenth(console)
        return
    from rich.progress import (  # a live bar on a terminal only: logs and pipes never pay for its import
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("loading traces", total=None)

        def update(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=escape(what))  # a path is not markup

        yield update


def _every_tenth(console: Console) -> Callable[[int, int, str], None]:
    """Progress for logs: one line each time another 10 % of the tasks is done (only for runs of
    10 tasks or more, so a single trace prints nothing)."""
    shown = [0]

    def update(done: int, total: int, what: str) -> None:
        if total >= 10 and done * 10 // total > shown[0]:
            shown[0] = done * 10 // total
            console.print(f"perfdoctor: {what} ({shown[0] * 10} %)", highlight=False, soft_wrap=True)

    return update


def render_terminal(report: Report, console: Console) -> None:
    if scale.many(report):
        _render_many(report, console)
        return
    for info in report.run.traces:
        console.print(Text.assemble(("trace ", "bold"), str(info.path),
                                    f"  ({info.producer}, {info.counts.get('kernels', 0):,} kernels)"))
    for dev in report.devices:
        console.print(_device_block(dev, report.metrics["ranks"].get(str(dev.rank), {})))
    if report.findings:
        _findings(report, console)
    _warnings(report.warnings, console)


def _render_many(report: Report, console: Console) -> None:
    """A run of many ranks: the run in one paragraph, the findings, then only the ranks that stand out."""
    producers = sorted({t.producer.split(",")[0] for t in report.run.traces})
    kernels = sum(t.counts.get("kernels", 0) for t in report.run.traces)
    all_m = report.metrics.get("all", {})
    console.print(Text.assemble(("run ", "bold"), scale.run_name(report),
                                f"  ({'; '.join(producers)}, {kernels:,} kernels; step "
                                f"{_ms(all_m.get('step.time_ms'))} median over ranks)"))
    if report.findings:
        _findings(report, console)
    shown = scale.outliers(report, OUTLIERS_SHOWN)
    table = Table(title=f"ranks that stand out ({len(shown)} of {len(report.devices)}; the others are within "
                  "the spread of these)", title_justify="left", title_style="bold")
    for column in ("rank", "why", "step", "GPU busy", "exposed comm", "device idle"):
        table.add_column(column, justify="left" if column == "why" else "right")
    for rank, why in shown:
        m = report.metrics["ranks"].get(rank, {})
        table.add_row(rank, why, _ms(m.get("step.time_ms")), _share(m.get("gpu.busy_fraction")),
                      _share(m.get("comm.exposed_fraction")), _share(m.get("host.idle_fraction")))
    console.print(table)
    by_rank = {str(d.rank): d for d in report.devices}
    if shown and shown[0][0] in by_rank:  # the first outlier in full: where its time goes
        rank, why = shown[0]
        console.print(Text(f"rank {rank}: {why}", style="bold"))
        console.print(_device_block(by_rank[rank], report.metrics["ranks"].get(rank, {})))
    _warnings(report.warnings, console)


def _findings(report: Report, console: Console) -> None:
    console.print(Text(f"framework: {report.run.framework.get('name')} ({report.run.framework.get('source')})",
                       style="dim"))
    console.print(findings_panel(report.findings, report.run.framework, sm.total_impact_ms(report)))


def _warnings(warnings: list[str], console: Console) -> None:
    if not warnings:
        return
    console.print(Text("warnings", style="bold yellow"))
    for w in warnings[:WARNINGS_SHOWN]:
        console.print(Text(f"  ! {w}", style="yellow"))
    if len(warnings) > WARNINGS_SHOWN:
        console.print(Text(f"  ! … and {len(warnings) - WARNINGS_SHOWN} more (all of them in --format json)",
                           style="yellow"))


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f} %"


def _device_block(dev: DeviceSummary, metrics: dict) -> Panel:
    title = Text(dev.label + (f" · {dev.gpu_name}" if dev.gpu_name else "") +
                 (f" · {dev.process_name}" if dev.process_name else ""))
    parts: list = [_overview(dev)]
    if dev.device_id is not None:
        parts += [_blocking(metrics), _measurements(metrics, dev.groups), _categories(dev), _collectives(dev),
                  _streams(dev), _top_kernels(dev)]
        if "memory" in dev.evidence:  # the rank's CUDA memory snapshot
            from perfdoctor.render.memory import memory_tables

            parts += memory_tables(metrics, dev.evidence["memory"])
    else:
        parts.append(_nvtx(dev))
    return Panel(Group(*[p for p in parts if p is not None]), title=title, title_align="left")


def _window_ns(dev: DeviceSummary) -> int:
    return (dev.window[1] - dev.window[0]) if dev.window else 0


def _overview(dev: DeviceSummary) -> Table:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    span = _window_ns(dev)
    t.add_row("window", f"{span / NS_PER_MS:,.2f} ms" if dev.window else "no events")
    steps = len(dev.step_ns)
    step_note = {"window": "no step markers: whole window = 1 step", "nvtx-step": "perfdoctor step ranges",
                 "profiler-step": "ProfilerStep ranges", "periodic": "optimizer period",
                 "framework-step": f"framework ranges `{dev.step_label}`",
                 "repeating-range": f"the run's repeating `{dev.step_label}` ranges"}.get(dev.step_source,
                                                                                          dev.step_source)
    t.add_row("steps", f"{steps} ({step_note})")
    if dev.excluded_ns > 0:
        named = f" ({', '.join(dev.excluded_ranges)})" if dev.excluded_ranges else ""
        t.add_row("before steps", f"{dev.excluded_ns / NS_PER_MS:,.2f} ms left out{named}")
    if dev.device_id is None:
        t.add_row("GPU", "no CUDA activity in this process")
        return t
    t.add_row("kernels", f"{dev.kernel_count:,} ({dev.comm_kernel_count:,} communication), "
                         f"{dev.memcpy_count:,} memcpy, {dev.memset_count:,} memset")
    t.add_row("GPU busy", f"{_pct(dev.busy_ns, span)} of the window (union of kernels, copies, fills)")
    t.add_row("compute", f"{_pct(dev.compute_ns, span)} of the window")
    t.add_row("communication", f"{_pct(dev.comm_ns, span)} of the window")
    return t


def _how_labelled(info: dict | None) -> str:
    """``nvtx`` / ``heuristic, low confidence`` …: the source and confidence holding most of the time."""
    if not info:
        return ""
    source = max(info["label_source"].items(), key=lambda kv: kv[1]["ns"])[0]
    confidence = max(info["confidence"].items(), key=lambda kv: kv[1]["ns"])[0]
    return f" [{source}]" if confidence == "high" else f" [{source}, {confidence} confidence]"


def _blocking(m: dict) -> Table | None:
    """Where the median step's time went along its critical path: one line per cause, summing to the step."""
    rows = sm.blocking(m)
    if not rows:
        return None
    t = Table(title="what blocked the step (critical path)", title_justify="left")
    t.add_column("cause")
    t.add_column("ms", justify="right", no_wrap=True)
    t.add_column("% of step", justify="right", no_wrap=True)
    for cause, ms, share in rows:
        t.add_row(Text(cause), f"{ms:,.2f}", f"{100 * share:.1f} %")
    return t


def _measurements(m: dict, groups: dict) -> Table | None:
    """Per-step medians of the measurements (DESIGN §3); rows for unknown values are left out."""
    if m.get("step.time_ms") is None:
        return None
    t = Table(title="per step (median over steps)", title_justify="left")
    t.add_column("measurement")
    t.add_column("ms", justify="right", no_wrap=True)
    t.add_column("% of step", justify="right", no_wrap=True)
    step = m["step.time_ms"]

    def row(name: str, ms: float | None, frac: float | None = None) -> None:
        if ms is None and frac is None:
            return
        if frac is None and ms is not None and step:
            frac = ms / step
        t.add_row(Text(name), "–" if ms is None else f"{ms:,.2f}", "–" if frac is None else f"{100 * frac:.1f} %")

    row("step time", step, 1.0)
    row("exposed comm, upper bound on blocking (all)", m.get("comm.exposed_ms"), m.get("comm.exposed_fraction"))
    for g in ("dp", "tp", "cp", "pp", "ep", "other"):
        if m.get(f"comm.{g}.time_ms"):
            row(f"  {g.upper()} comm (exposed / total {m[f'comm.{g}.time_ms']:,.2f} ms){_how_labelled(groups.get(g))}",
                m.get(f"comm.{g}.exposed_ms"), m.get(f"comm.{g}.exposed_fraction"))
    row("device idle", None, m.get("host.idle_fraction"))
    for cause, label in (("launch_bound", "launch-bound (Python, launch overhead)"), ("sync", "sync stall"),
                         ("gc", "garbage collection"), ("data", "data loading"), ("optimizer", "optimizer step"),
                         ("outside_ops", "outside profiled ops (GC, I/O, Python)"), ("other", "unattributed"),
                         ("device_wait", "device waiting (dependency, other rank)")):
        if m.get(f"host.{cause}_ms"):
            row(f"  {label}", m[f"host.{cause}_ms"])
    if m.get("ln.blocked_count"):
        row(f"LayerNorm blocked by NCCL ({m['ln.blocked_count']:.0f} kernels)", m.get("ln.blocked_ms"))
    if m.get("pipeline.bubble_fraction") is not None:
        theory = m.get("pipeline.bubble_fraction_theory")
        note = f" (theory {100 * theory:.1f} %)" if theory is not None else ""
        row(f"pipeline bubble{note}", m.get("pipeline.bubble_ms"), m["pipeline.bubble_fraction"])
    return t


def _categories(dev: DeviceSummary) -> Table:
    span = _window_ns(dev)
    t = Table(title="time by category (sum of kernel durations)", title_justify="left", expand=False)
    t.add_column("category")
    t.add_column("count", justify="right")
    t.add_column("ms", justify="right")
    t.add_column("% of window", justify="right")
    for cat, ns in sorted(dev.category_ns.items(), key=lambda kv: -kv[1]):
        t.add_row(Text(cat), f"{dev.category_count.get(cat, 0):,}", f"{ns / NS_PER_MS:,.2f}", _pct(ns, span))
    return t


def _collectives(dev: DeviceSummary) -> Table | None:
    if not dev.collectives:
        return None
    t = Table(title="communication by collective", title_justify="left")
    t.add_column("collective")
    t.add_column("kernels", justify="right")
    t.add_column("ms", justify="right")
    for coll, v in sorted(dev.collectives.items(), key=lambda kv: -kv[1]["ns"]):
        t.add_row(Text(coll), f"{v['count']:,}", f"{v['ns'] / NS_PER_MS:,.2f}")
    libs = ", ".join(f"{lib} ({n})" for lib, n in dev.comm_libraries.items())
    t.caption = Text(f"libraries: {libs}")
    return t


def _streams(dev: DeviceSummary) -> Table | None:
    if not dev.streams:
        return None
    t = Table(title="streams", title_justify="left")
    for col in ("stream", "kernels", "ms", "comm kernels", "comm ms"):
        t.add_column(col, justify="right")
    for s in dev.streams[:8]:
        t.add_row(str(s["stream"]), f"{s['kernels']:,}", f"{s['ns'] / NS_PER_MS:,.2f}",
                  f"{s['comm_kernels']:,}", f"{s['comm_ns'] / NS_PER_MS:,.2f}")
    if len(dev.streams) > 8:
        t.caption = f"{len(dev.streams) - 8} more streams"
    return t


def _top_kernels(dev: DeviceSummary) -> Table | None:
    if not dev.top_kernels:
        return None
    total = sum(dev.category_ns.values())
    t = Table(title="top kernels by time", title_justify="left", expand=True)
    t.add_column("kernel", overflow="ellipsis", no_wrap=True, ratio=1, min_width=16)
    t.add_column("category", no_wrap=True)
    t.add_column("count", justify="right", no_wrap=True)
    t.add_column("ms", justify="right", no_wrap=True, min_width=8)
    t.add_column("% time", justify="right", no_wrap=True, min_width=6)
    for k in dev.top_kernels:
        t.add_row(Text(k["name"]), k["category"], f"{k['count']:,}", f"{k['ns'] / NS_PER_MS:,.2f}",
                  _pct(k["ns"], total))
    return t


def _nvtx(dev: DeviceSummary) -> Table:
    t = Table(title="NVTX and OS runtime", title_justify="left")
    t.add_column("domain")
    t.add_column("events", justify="right")
    for domain, n in sorted(dev.nvtx_domains.items(), key=lambda kv: -kv[1]):
        t.add_row(Text(domain), f"{n:,}")
    t.caption = f"{dev.nvtx_ranges:,} ranges, {dev.nvtx_marks:,} marks, {dev.osrt_calls:,} OS-runtime calls"
    return t


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f} %" if whole else "–"


_SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan", "info": "dim"}
_FRAMEWORKS = (("megatron_bridge", "Megatron-Bridge"), ("nemo", "NeMo 2"), ("megatron_lm", "Megatron-LM"),
               ("env", "env"))


def findings_panel(findings: list[dict], framework: dict | None = None, total_ms: float | None = None) -> Panel:
    """Findings, largest impact first: what is wrong, how sure, the numbers, the fix and the knob per framework."""
    parts: list[Text] = []
    for f in findings:
        head = Text.assemble((f"{f['severity'].upper():6s} ", _SEVERITY_STYLE.get(f["severity"], "")),
                             (f["rule"], "bold"), f"  {f['title']}")
        parts.append(head)
        parts.append(Text(f"       {f['summary']}"))
        parts.append(Text(f"       {sm.confidence_text(f)}", style="dim"))
        if sm.overlap_text(f):
            parts.append(Text(f"       {sm.overlap_text(f)}", style="dim"))
        if f.get("advice"):
            parts.append(Text(f"       fix: {f['advice']}"))
        if f.get("already_set"):
            parts.append(Text("       already set: " + ", ".join(f"{k}={v}" for k, v in f["already_set"].items()),
                              style="dim"))
        if f.get("next_step"):
            parts.append(Text(f"       next step: {f['next_step']}"))
        fixes = [k for k in f.get("knobs", []) if k.get("role") != "reference"]
        if fixes:
            parts.append(Text(f"       {sm.knobs_heading(f, framework, 'fix')}:", style="dim"))
        for knob in fixes:
            code = " | ".join(s.code.replace("\n", "; ") for s in knob_snippets(knob))
            parts.append(Text(f"       → {code}", style="green" if knob.get("role") == "fix" else ""))
            for extra in (knob.get("note"), sm.what_if_text(knob)):
                if extra:
                    parts.append(Text(f"         {extra}", style="dim"))
        if len(fixes) < len(f.get("knobs", [])):  # reference only (not a recognised Megatron run): one line
            parts.append(Text(f"       {sm.reference_line(f)}", style="dim"))
        parts.append(Text(f"       guide: {f['guide']}  (perfdoctor explain {f['rule']})", style="dim"))
    if total_ms is not None:
        parts.append(Text(f"together: {total_ms:,.2f} ms per step (overlapping findings counted once)", style="bold"))
    return Panel(Group(*parts), title=Text(f"findings ({len(findings)})"), title_align="left")

