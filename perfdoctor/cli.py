"""Command line: parses arguments, calls :mod:`perfdoctor.api`, maps errors to exit codes.

Exit codes (DESIGN §5): 0 ok; 1 findings at or above ``--fail-on``; 2 bad usage or bad input (one
line on stderr, never a traceback); 3 internal error. Heavy modules are imported inside the commands
so that ``perfdoctor --help`` stays fast. Built on click directly: typer 0.29 imports pydantic and
builds a validator per parameter on every run (~160 ms of a 0.3 s start-up budget).
"""

from __future__ import annotations

import gc
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from perfdoctor import __version__
from perfdoctor.config_values import MAX_SIZE
from perfdoctor.errors import PerfdoctorError, UsageError
from perfdoctor.outputs import (
    Fill,
    check_outputs,
    flush_stdout,
    stdout_error,
    stream_stdout,
    write_stdout,
    write_stream,
    write_text,
)

if TYPE_CHECKING:
    from types import ModuleType

    from rich.console import Console

PATH = click.Path(path_type=Path)  # as given; an existing path must be readable
FORMATS = click.Choice(["terminal", "json"])
SIZE = click.IntRange(min=1, max=MAX_SIZE)  # parallel sizes, micro-batches: bounded before anything uses them
MAX_MEMORY_ENTRIES = 1 << 24  # allocator events per rank: each costs the training process memory
PLOTLY_JS = click.Choice(["inline", "cdn"])


class Argument(click.Argument):
    """A positional argument with a help text (click's take none), listed under "Arguments" in --help."""

    def __init__(self, *args: Any, help: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = help


class Command(click.Command):
    """Lists the arguments with their help above the options, as users of ``--help`` expect."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(p.human_readable_name, p.help) for p in self.get_params(ctx) if isinstance(p, Argument)]
        if rows:
            with formatter.section("Arguments"):
                formatter.write_dl(rows)
        super().format_options(ctx, formatter)


class Group(click.Group):
    command_class = Command

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)  # in the order of this file (the order of the workflow), not sorted

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """No arguments: the help on stdout and exit 2 (it is a usage error, but one worth a page)."""
        if not args and not ctx.resilient_parsing:
            click.echo(ctx.get_help(), color=ctx.color)
            ctx.exit(2)
        return super().parse_args(ctx, args)


def argument(name: str, help: str, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``click.argument`` with a help text."""
    return click.argument(name, cls=Argument, help=help, **kwargs)


def _version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"perfdoctor {__version__}")
        ctx.exit()


@click.group(cls=Group, name="perfdoctor", context_settings={"show_default": True})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_version,
              help="Print the version and exit.")
def app() -> None:
    """Why is this Megatron/NeMo training run slow, and which knob fixes it? Reads Nsight Systems traces."""


config_option = click.option("--config", "config_file", type=PATH, help=(
    "Run configuration: Megatron-LM arguments (JSON/YAML), a Megatron-Bridge ConfigContainer YAML or a NeMo 2 "
    "recipe dump; flags override it."))
allow_mixed_option = click.option("--allow-mixed", is_flag=True, help=(
    "Analyse inputs that are different captures (other session times, manifests or world sizes) as one run anyway."))


def _gib_bytes(gib: float | None) -> int | None:
    """``--device-memory`` GiB → bytes; a GPU has between 1 MiB and 1 PiB of it."""
    if gib is None:
        return None
    if not (gib > 0 and math.isfinite(gib)) or gib * (1 << 30) >= 1 << 50 or gib * (1 << 30) < 1 << 20:
        raise UsageError(f"--device-memory must be a positive number of GiB (e.g. 80), not {gib}")
    return int(gib * (1 << 30))


@app.command()
@argument("paths", nargs=-1, required=True, type=PATH, help="nsys SQLite exports, or run directories holding them.")
@click.option("--format", "-f", "output_format", type=FORMATS, default="terminal", help="Output format.")
@click.option("--output", "-o", type=PATH, help="Write to FILE instead of stdout.")
@click.option("--tp", type=SIZE, help="Tensor-parallel size, if the trace does not say.")
@click.option("--pp", type=SIZE, help="Pipeline-parallel size.")
@click.option("--vpp", type=SIZE, help="Virtual pipeline stages per rank.")
@click.option("--cp", type=SIZE, help="Context-parallel size.")
@click.option("--dp", type=SIZE, help="Data-parallel size.")
@click.option("--ep", type=SIZE, help="Expert-parallel size.")
@click.option("--num-microbatches", type=SIZE, help="Micro-batches per step.")
@click.option("--html", type=PATH, help="Also write a self-contained HTML report.")
@click.option("--markdown", type=PATH, help="Also write a Markdown report (PR comment).")
@click.option("--perfetto", type=PATH, help=(
    "Also write a Perfetto / Chrome-trace timeline (JSON): one step of every rank on the aligned clock, the "
    "critical path, findings and waits for peers; open it at ui.perfetto.dev."))
@click.option("--plotly-js", type=PLOTLY_JS, default="inline", help="HTML: inline plotly.js (offline) or a CDN link.")
@click.option("--fail-on", type=click.Choice(["high", "medium", "low"]),
              help="Exit 1 when a finding has this severity or higher (CI gating).")
@click.option("--rules", type=PATH, multiple=True, help="Directory of extra rule files (*.yaml); repeatable.")
@config_option
@allow_mixed_option
@click.option("--device-memory", type=float, metavar="GIB", help=(
    "GPU memory in GiB (e.g. 80) for the memory headroom rules; wins over the trace's GPU table (MIG slices)."))
@click.option("--jobs", "-j", type=click.IntRange(min=1), help=(
    "Cores to use: processes analysing ranks in parallel, or threads reading one large export's tables "
    "(default: the machine's cores)."))
@click.option("--dask", help="Run the per-rank tasks on Dask: `local` (a LocalCluster of --jobs workers) or "
                             "tcp://HOST:PORT.")
@click.option("--sample", type=click.IntRange(min=1), help=(
    "Analyse this many representative files of a large run (every PP stage, the slowest and fastest of a first "
    "pass, the rest spread over ranks)."))
def analyze(paths: tuple[Path, ...], output_format: str, output: Path | None, tp: int | None, pp: int | None,
            vpp: int | None, cp: int | None, dp: int | None, ep: int | None, num_microbatches: int | None,
            html: Path | None, markdown: Path | None, perfetto: Path | None, plotly_js: str, fail_on: str | None,
            rules: tuple[Path, ...], config_file: Path | None, allow_mixed: bool, device_memory: float | None,
            jobs: int | None, dask: str | None, sample: int | None) -> None:
    """Measure where each GPU's time goes and print the breakdown."""
    from perfdoctor.cores import SWITCH_INTERVAL_S, one_blas_thread

    if _whole_process:  # imports make objects that live as long as the process: nothing for the collector
        gc.disable()
        sys.setswitchinterval(SWITCH_INTERVAL_S)  # this process's own (perfdoctor.cores)
        _read_ahead(paths, jobs, dask, sample)
    with one_blas_thread():
        from perfdoctor import api
    from perfdoctor.heap import keep_freed_memory
    from perfdoctor.invocation import analysis_config
    from perfdoctor.render.progress import analysis_progress

    if _whole_process:
        # The modules, imported, are frozen out of the garbage collector: its collections during the analysis
        # walk the analysis's objects only (the full collection of the 2-GPU export's run took ~9 ms with
        # them, and ~130 young ones ran while numpy and perfdoctor imported). Not in-process (tests, callers
        # of app()): frozen objects are never collected, and the caller's cyclic garbage would stay.
        gc.freeze()
        gc.enable()
    keep_freed_memory()

    config, sources = analysis_config(list(paths), {"tp": tp, "pp": pp, "vpp": vpp, "cp": cp, "dp": dp, "ep": ep,
                                                    "num_microbatches": num_microbatches}, config_file, list(rules),
                                      {"--output": output, "--html": html, "--markdown": markdown,
                                       "--perfetto": perfetto})
    with analysis_progress() as progress:
        report = api.analyze(list(paths), config, progress=progress, rules_dirs=list(rules) or None,
                             timeline_excerpts=html is not None, config_sources=sources, allow_mixed=allow_mixed,
                             device_memory_bytes=_gib_bytes(device_memory), jobs=jobs, dask=dask, sample=sample,
                             trace_excerpts=perfetto is not None)
    _write_reports(report, html, markdown, plotly_js)
    if perfetto is not None:
        from perfdoctor.render.json import report_dict
        from perfdoctor.render.perfetto import render_perfetto

        _emit(render_perfetto([("", report_dict(report), report.run_trace)]), perfetto)
    if output_format == "json":
        from perfdoctor.render.json import write_json

        _emit_stream(lambda write: write_json(report, write), output)
    else:
        from perfdoctor.render.terminal import render_terminal

        _print_rich(lambda console, to_file: render_terminal(report, console), output)
    if fail_on is not None:
        failing = _failing_findings(report.findings, fail_on)
        if failing:
            sys.stderr.write(f"perfdoctor: {len(failing)} finding(s) at or above --fail-on {fail_on}: "
                             f"{', '.join(failing)}\n")
            raise click.exceptions.Exit(1)


def _read_ahead(paths: tuple[Path, ...], jobs: int | None, dask: str | None, sample: int | None) -> None:
    """Start reading a lone export's first slices while the pipeline is imported (perfdoctor.load.read_ahead):
    one file, analysed in this process with ``--jobs`` cores (as perfdoctor.execute runs a single task)."""
    if len(paths) != 1 or dask is not None or sample is not None or not paths[0].is_file():
        return
    from perfdoctor.execute import default_jobs
    from perfdoctor.heap import tune_malloc
    from perfdoctor.load import read_ahead

    tune_malloc()  # before the reading threads' first allocation: they share the one arena
    read_ahead.start(paths[0], jobs or default_jobs())


@app.command("rules")
@click.option("--rules", type=PATH, multiple=True, help="Directory of extra rule files; repeatable.")
@click.option("--format", "-f", "output_format", type=click.Choice(["table", "json"]), default="table",
              help="Output format.")
@click.option("--metrics", is_flag=True, help="List the metric names rules can use instead.")
def list_rules(rules: tuple[Path, ...], output_format: str, metrics: bool) -> None:
    """List the diagnosis rules (shipped catalog plus --rules directories)."""
    import json

    from perfdoctor.diagnose.explain import rule_row
    from perfdoctor.diagnose.rules import known_metrics, load_rules

    if metrics:
        names = sorted(known_metrics())
        _emit(json.dumps(names, indent=2) + "\n" if output_format == "json" else "\n".join(names) + "\n", None)
        return
    rows = [rule_row(r) for r in load_rules(list(rules) or None)]
    if output_format == "json":
        _emit(json.dumps(rows, indent=2) + "\n", None)
        return
    from rich.table import Table
    from rich.text import Text


    table = Table(title=f"{len(rows)} rules (perfdoctor explain RULE for details)")
    for column in ("rule", "scope", "title"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(Text(row["id"] + ("" if row["builtin"] else " (user)")), Text(row["scope"]), Text(row["title"]))
    _print_rich(lambda console, to_file: console.print(table), None)


@app.command()
@argument("rule_id", metavar="RULE", help="Rule id, e.g. exposed-dp-comm.")
@click.option("--rules", type=PATH, multiple=True, help="Directory of extra rule files; repeatable.")
def explain(rule_id: str, rules: tuple[Path, ...]) -> None:
    """Explain one rule: what it detects, why it happens, how to fix it per framework, how to verify."""
    from perfdoctor.diagnose.explain import explain_text
    from perfdoctor.diagnose.rules import load_rules

    catalog = {r.id: r for r in load_rules(list(rules) or None)}
    if rule_id not in catalog:
        raise UsageError(f"unknown rule {rule_id!r} (see `perfdoctor rules`)")
    from perfdoctor.render.escape import terminal_text

    _emit(terminal_text(explain_text(catalog[rule_id])), None)  # rule texts are user text


@app.command()
@argument("base", type=PATH, help="Base run: a trace, a run directory, or a JSON report.")
@argument("head", type=PATH, help="Head run (the change under review), same kinds as BASE.")
@click.option("--format", "-f", "output_format", type=click.Choice(["terminal", "json", "markdown"]),
              default="terminal", help="Output format.")
@click.option("--output", "-o", type=PATH, help="Write to FILE instead of stdout.")
@click.option("--html", type=PATH, help="Also write the diff as a self-contained HTML page.")
@click.option("--markdown", type=PATH, help="Also write the diff as Markdown.")
@click.option("--perfetto", type=PATH, help=(
    "Also write both runs as one Perfetto / Chrome-trace timeline (JSON), the base above the head (a saved JSON "
    "report side has only its path and findings)."))
@click.option("--plotly-js", type=PLOTLY_JS, default="inline", help="HTML: inline plotly.js or link the CDN.")
@click.option("--fail-on-regression", type=float, metavar="PCT", help=(
    "Exit 1 when the median step time (per unit of work for window-only captures) grew by more than PCT %, "
    "beyond noise, or when the runs are not comparable."))
@config_option
@allow_mixed_option
def diff(base: Path, head: Path, output_format: str, output: Path | None, html: Path | None, markdown: Path | None,
         perfetto: Path | None, plotly_js: str, fail_on_regression: float | None, config_file: Path | None,
         allow_mixed: bool) -> None:
    """Compare two runs: per-metric deltas against noise, new / resolved / changed findings."""
    from perfdoctor import api
    from perfdoctor.heap import keep_freed_memory
    from perfdoctor.invocation import diff_config

    keep_freed_memory()

    config, sources = diff_config(base, head, config_file, {"--output": output, "--html": html, "--markdown": markdown,
                                                            "--perfetto": perfetto}, fail_on_regression)
    d = api.diff(base, head, config, config_sources=sources, allow_mixed=allow_mixed,
                 trace_excerpts=perfetto is not None)
    if perfetto is not None:
        from perfdoctor.render.perfetto import render_perfetto

        _emit(render_perfetto([(label, report, trace) for label, (report, trace) in zip(("base", "head"), d.sides)]),
              perfetto)
    if html is not None:
        from perfdoctor.render.diff_html import render_diff_html

        _emit(render_diff_html(d, plotly_js), html)
    if markdown is not None:
        from perfdoctor.render.diff_markdown import render_diff_markdown

        _emit(render_diff_markdown(d), markdown)
    if output_format == "json":
        import json

        from perfdoctor.diff import diff_dict

        _emit(json.dumps(diff_dict(d), indent=2) + "\n", output)
    elif output_format == "markdown":
        from perfdoctor.render.diff_markdown import render_diff_markdown

        _emit(render_diff_markdown(d), output)
    else:
        from perfdoctor.render.diff_terminal import render_diff_terminal

        _print_rich(lambda console, to_file: render_diff_terminal(d, console, show_all=to_file), output)
    if fail_on_regression is not None and not d.basis.comparable:
        sys.stderr.write(f"perfdoctor: the runs are not comparable ({d.basis.reason}): cannot rule out a regression\n")
        raise click.exceptions.Exit(1)
    if fail_on_regression is not None and d.step_regression_pct > fail_on_regression:
        sys.stderr.write(f"perfdoctor: step time regressed by {d.step_regression_pct:.1f} % "
                         f"(> --fail-on-regression {fail_on_regression:g})\n")
        raise click.exceptions.Exit(1)


@app.command()
@argument("paths", nargs=-1, required=True, type=PATH, help=(
    "PyTorch CUDA memory snapshots (*.pickle from torch.cuda.memory._dump_snapshot), or run directories."))
@click.option("--format", "-f", "output_format", type=FORMATS, default="terminal", help="Output format.")
@click.option("--output", "-o", type=PATH, help="Write to FILE instead of stdout.")
@click.option("--device-memory", type=float, metavar="GIB", help="GPU memory in GiB (e.g. 80), for the headroom.")
@click.option("--device", type=int, help="Device to measure (default: the one holding the most).")
def memory(paths: tuple[Path, ...], output_format: str, output: Path | None, device_memory: float | None,
           device: int | None) -> None:
    """Peak allocated/reserved memory, fragmentation, headroom and top allocation sites of snapshots.

    Snapshots are read without running any code from them (a pickle that asks for a function is refused).
    """
    from perfdoctor import __version__, api

    total = _gib_bytes(device_memory)
    check_outputs({"--output": output}, list(paths))
    measurements = api.memory(list(paths), device_total_bytes=total, device=device)
    if output_format == "json":
        from perfdoctor.render.memory import render_memory_json

        _emit(render_memory_json(measurements, __version__), output)
    else:
        from perfdoctor.render.memory import render_memory_terminal

        _print_rich(lambda console, to_file: render_memory_terminal(measurements, console), output)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@click.option("--out", "-o", type=PATH, help="Run directory (default: perfdoctor-runs/<date-time>).")
@click.option("--steps", help="Optimizer steps to capture, A-B (from 0), e.g. 10-12.")
@click.option("--ranks", default="all", help="Ranks to profile: all, or a list like 0,1,8.")
@click.option("--per-rank/--per-node", default=None, help=(
    "One report per rank, or one per node (default: per node; per rank under srun alone)."))
@click.option("--memory/--no-memory", default=True, help=(
    "Record CUDA memory history and dump a snapshot per rank at the end of the window."))
@click.option("--memory-max-entries", type=click.IntRange(min=1, max=MAX_MEMORY_ENTRIES), default=100_000,
              help="Allocator events kept per rank (ring buffer).")
@click.option("--nsys-arg", multiple=True, help="Extra `nsys profile` argument (repeatable; write "
                                                "--nsys-arg=--flag=value).")
@click.option("--nsys", help="The nsys CLI to use (default: nsys on PATH).")
@click.option("--force", is_flag=True, help="Write into a non-empty run directory, overwriting files of the same "
                                            "names.")
@click.option("--analyze", "run_analyze", is_flag=True, help="Run `perfdoctor analyze RUN_DIR` at the end.")
@click.option("--profiler", type=click.Choice(["auto", "nsys", "torch"]), default="auto", help=(
    "nsys, or torch: each rank runs torch.profiler and writes a Kineto trace (no nsys needed). auto (default): "
    "nsys, or torch (said in one line) where nsys is missing or cannot write reports."))
@click.option("--keep-reports", default="no", help=(
    "no: delete each .nsys-rep once its scrubbed SQLite export is written; yes: keep it (owner-only; a report "
    "holds the run's environment and command line unredacted, secrets included)."))
@click.pass_context
def capture(ctx: click.Context, out: Path | None, steps: str | None, ranks: str, per_rank: bool | None, memory: bool,
            memory_max_entries: int, nsys_arg: tuple[str, ...], nsys: str | None, force: bool, run_analyze: bool,
            profiler: str, keep_reports: str) -> None:
    """Run a training command under nsys with perfdoctor's per-rank labels: perfdoctor capture [OPTIONS] -- CMD ...

    CMD is `torchrun ...`, `python ...` or `srun ...`. The training code is not modified: a sitecustomize
    hook labels steps, collectives (by parallel group), GC, data waits and micro-batches, and records CUDA
    memory history. Without nsys (--profiler torch) each rank profiles itself with torch.profiler. The exit
    code is the training command's.
    """
    from perfdoctor.capture.launcher import CaptureOptions, parse_ranks, parse_steps, run_capture

    if keep_reports not in ("yes", "no"):
        raise UsageError(f"--keep-reports {keep_reports!r}: expected yes or no")
    options = CaptureOptions(command=list(ctx.args), out=out, steps=parse_steps(steps), ranks=parse_ranks(ranks),
                             per_rank=per_rank, memory=memory, memory_max_entries=memory_max_entries,
                             nsys_args=list(nsys_arg), nsys=nsys, force=force,
                             keep_reports=keep_reports == "yes", profiler=profiler)

    def say(line: str) -> None:
        sys.stderr.write(f"perfdoctor: {line}\n")

    result = run_capture(options, say)
    for note in result.notes:
        say(note)
    training = "not started" if result.training_exit_code is None else result.training_exit_code
    interrupted = f", interrupted by {result.interrupted_by}" if result.interrupted_by else ""
    made = (f"{len(result.exports)} PyTorch profiler trace(s)" if result.profiler == "torch" else
            f"{len(result.reports)} report(s), {len(result.exports)} SQLite export(s)")
    say(f"run directory {result.run_dir}: {made}, manifest.json; training exit code {training}{interrupted}")
    if run_analyze and not result.interrupted_by:
        if result.exports or any(result.run_dir.glob("*.sqlite")):
            ctx.invoke(analyze, paths=(result.run_dir,))
        else:
            say("--analyze: nothing to analyse (no SQLite export or PyTorch profiler trace)")
    if result.exit_code:
        raise click.exceptions.Exit(result.exit_code)


@app.command()
@argument("scenario", type=PATH, help="Scenario YAML (see perfdoctor/synth/scenarios/).")
@click.option("--out", "-o", type=PATH, required=True, help="Directory for the traces and truth files.")
@click.option("--seed", type=int, help="Override the scenario's seed.")
@click.option("--schema", help="nsys export schema style to write.")
@click.option("--format", "trace_format", type=click.Choice(["sqlite", "kineto"]), default="sqlite", help=(
    "sqlite: nsys exports; kineto: PyTorch profiler traces (one .pt.trace.json.gz per rank)."))
def synth(scenario: Path, out: Path, seed: int | None, schema: str | None, trace_format: str) -> None:
    """Simulate Megatron training steps and write nsys SQLite (or PyTorch profiler) traces plus ground-truth JSON."""
    from perfdoctor.synth import run_scenario

    for path in run_scenario(scenario, out, seed=seed, schema=schema, fmt=trace_format):
        click.echo(str(path))


@app.command()
def mcp() -> None:
    """Serve the analysis to coding agents: a Model Context Protocol server over stdio (tools analyze, explain,
    diff, rules). Needs the MCP SDK: pip install 'perfdoctor[mcp]'."""
    try:
        from perfdoctor.mcp_server import serve
    except ImportError as exc:
        if exc.name is None or not exc.name.startswith("mcp"):
            raise
        raise UsageError("perfdoctor mcp needs the MCP SDK: pip install 'perfdoctor[mcp]'") from None
    serve()


SEVERITY_RANK = {"high": 3, "medium": 2, "low": 1, "info": 0}


def _failing_findings(findings: list[dict], level: str) -> list[str]:
    """Rule ids of findings at or above ``level`` (DESIGN §5 exit code 1)."""
    floor = SEVERITY_RANK[level]
    return [str(f.get("rule")) for f in findings if SEVERITY_RANK.get(str(f.get("severity")), 0) >= floor]


def _write_reports(report, html: Path | None, markdown: Path | None, plotly_js: str) -> None:
    if html is not None:
        from perfdoctor.render.html import render_html

        _emit(render_html(report, plotly_js=plotly_js), html)
    if markdown is not None:
        from perfdoctor.render.markdown import render_markdown

        _emit(render_markdown(report), markdown)


def _print_rich(draw: Callable[[Console, bool], None], output: Path | None) -> None:
    """Draw rich output on the terminal (a pipe: as wide as the content), or into ``output`` as plain text
    as wide as the content;
    ``draw(console, to_file)``."""
    import io

    from perfdoctor.render.escape import output_console, safe_console

    if output is None:
        if sys.stdout is None:
            raise UsageError("stdout is closed: give --output FILE")
        try:
            draw(output_console(), False)
        except OSError as exc:
            raise stdout_error(exc) from None
        return
    buffer = io.StringIO()
    draw(safe_console(file=buffer, fit_content=True, no_color=True), True)
    write_text(output, buffer.getvalue())


def _emit(text: str, output: Path | None) -> None:
    if output is None:
        write_stdout(text)
    else:
        write_text(output, text)


def _emit_stream(fill: Fill, output: Path | None) -> None:
    """Like :func:`_emit`, written piece by piece (the JSON report of a thousand ranks is never one string)."""
    if output is None:
        stream_stdout(fill)
    else:
        write_stream(output, fill)


def main() -> None:
    """Console entry point: one line on stderr and the right exit code for every failure."""
    from perfdoctor import interrupts

    global _whole_process
    _whole_process = True
    try:
        _main(interrupts)
    finally:  # main() called in-process (tests) leaves later app() calls in-process ones
        _whole_process = False


def _main(interrupts: ModuleType) -> None:
    interrupts.install()
    try:
        code = app(standalone_mode=False)
    except PerfdoctorError as exc:
        _fail(str(exc), exc.exit_code)
    except click.exceptions.Exit as exc:
        _exit_interrupted_or(exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        _fail("interrupted", 130)
    except PermissionError as exc:  # an input (or a folder above it) this user may not read or enter
        _fail(f"{exc.filename or exc}: permission denied (this user cannot read it, or cannot enter a folder "
              "above it)", 2)
    except click.ClickException as exc:  # usage errors carry their own exit code
        _fail(f"{exc.format_message()} (see `perfdoctor --help`)", exc.exit_code)
    except Exception as exc:
        if interrupts.received():  # Ctrl-C inside an import becomes that import's error (numpy: ImportError)
            _fail("interrupted", 130)
        if os.environ.get("PERFDOCTOR_DEBUG"):
            raise
        _fail(f"internal error: {type(exc).__name__}: {exc} (set PERFDOCTOR_DEBUG=1 for a traceback)", 3)
    _exit_interrupted_or(code if isinstance(code, int) else 0)


_whole_process = False  # main() runs: this process is the CLI's own, from start to exit


def _exit_interrupted_or(code: int) -> None:
    """Exit with ``code``, or 130 when a Ctrl-C was swallowed on the way (see perfdoctor.interrupts)."""
    from perfdoctor import interrupts

    if interrupts.received():
        _fail("interrupted", 130)
    try:
        flush_stdout()
    except UsageError as exc:
        _fail(str(exc), exc.exit_code)
    # Everything is written: the interpreter's teardown need not look through the analysis's objects for
    # reference cycles once more. Frozen, its last collections skip them (~20 ms of a ~0.45 s run on the
    # 2-GPU export, paired); atexit handlers and the streams' flushing run as before.
    gc.freeze()
    sys.exit(code)


def _fail(message: str, code: int) -> None:
    first = message.strip().splitlines()[0] if message.strip() else "error"
    sys.stderr.write(f"perfdoctor: {first}\n")
    if code == 130:
        # Interrupted: leave without interpreter teardown. CPython ends a process whose KeyboardInterrupt
        # ever left an exec() of source text (dataclass and namedtuple methods are made that way while a
        # module imports) by SIGINT instead of its exit code, however it was handled, and teardown under a
        # measurement still running beside the main thread (perfdoctor.cores.beside) can abort: 2 of 90
        # interrupts ended -2 or -6 before. The atomic writes removed their temporary files, and a process
        # pool was shut down, as the interrupt passed through them.
        for stream in (sys.stderr, sys.stdout):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
                pass
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
