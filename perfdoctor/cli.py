"""Command line: parses arguments, calls :mod:`perfdoctor.api`, maps errors to exit codes.

Exit codes (DESIGN §5): 0 ok; 1 findings at or above ``--fail-on``; 2 bad usage or bad input (one
line on stderr, never a traceback); 3 internal error. Heavy modules are imported inside the commands
so that ``perfdoctor --help`` stays fast.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from typer.exceptions import TyperException

from perfdoctor import __version__
from perfdoctor.errors import PerfdoctorError, UsageError
from perfdoctor.outputs import check_outputs, flush_stdout, stdout_error, write_stdout, write_text

if TYPE_CHECKING:
    from rich.console import Console

app = typer.Typer(
    name="perfdoctor",
    help="Why is this Megatron/NeMo training run slow, and which knob fixes it? Reads Nsight Systems traces.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class OutputFormat(str, Enum):
    terminal = "terminal"
    json = "json"


class PlotlyJs(str, Enum):
    inline = "inline"
    cdn = "cdn"


class FailOn(str, Enum):
    high = "high"
    medium = "medium"
    low = "low"


class SynthFormat(str, Enum):
    sqlite = "sqlite"
    kineto = "kineto"


class DiffFormat(str, Enum):
    terminal = "terminal"
    json = "json"
    markdown = "markdown"


def _version(value: bool) -> None:
    if value:
        typer.echo(f"perfdoctor {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """perfdoctor: trace-based performance diagnosis for Megatron-Core training."""


CONFIG_OPTION = typer.Option("--config", help="Run configuration: Megatron-LM arguments (JSON/YAML), a "
                             "Megatron-Bridge ConfigContainer YAML or a NeMo 2 recipe dump; flags override it.")
ALLOW_MIXED_OPTION = typer.Option("--allow-mixed", help="Analyse inputs that are different captures (other session "
                                  "times, manifests or world sizes) as one run anyway.")


def _gib_bytes(gib: float | None) -> int | None:
    """``--device-memory`` GiB → bytes; a GPU has between 1 MiB and 1 PiB of it."""
    if gib is None:
        return None
    if not (gib > 0 and math.isfinite(gib)) or gib * (1 << 30) >= 1 << 50 or gib * (1 << 30) < 1 << 20:
        raise UsageError(f"--device-memory must be a positive number of GiB (e.g. 80), not {gib}")
    return int(gib * (1 << 30))


@app.command()
def analyze(
    paths: Annotated[list[Path], typer.Argument(help="nsys SQLite exports, or run directories holding them.")],
    output_format: Annotated[OutputFormat, typer.Option("--format", "-f", help="Output format.")] =
        OutputFormat.terminal,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write to FILE instead of stdout.")] = None,
    tp: Annotated[Optional[int], typer.Option(help="Tensor-parallel size, if the trace does not say.")] = None,
    pp: Annotated[Optional[int], typer.Option(help="Pipeline-parallel size.")] = None,
    vpp: Annotated[Optional[int], typer.Option(help="Virtual pipeline stages per rank.")] = None,
    cp: Annotated[Optional[int], typer.Option(help="Context-parallel size.")] = None,
    dp: Annotated[Optional[int], typer.Option(help="Data-parallel size.")] = None,
    ep: Annotated[Optional[int], typer.Option(help="Expert-parallel size.")] = None,
    num_microbatches: Annotated[Optional[int], typer.Option(help="Micro-batches per step.")] = None,
    html: Annotated[Optional[Path], typer.Option("--html", help="Also write a self-contained HTML report.")] = None,
    markdown: Annotated[Optional[Path], typer.Option("--markdown", help="Also write a Markdown report (PR comment).")]
        = None,
    plotly_js: Annotated[PlotlyJs, typer.Option("--plotly-js", help="HTML: inline plotly.js (offline) or a CDN link.")]
        = PlotlyJs.inline,
    fail_on: Annotated[Optional[FailOn], typer.Option("--fail-on", help="Exit 1 when a finding has this severity or "
                                                      "higher (CI gating).")] = None,
    rules: Annotated[Optional[list[Path]], typer.Option("--rules", help="Directory of extra rule files (*.yaml); "
                                                        "repeatable.")] = None,
    config_file: Annotated[Optional[Path], CONFIG_OPTION] = None,
    allow_mixed: Annotated[bool, ALLOW_MIXED_OPTION] = False,
    device_memory: Annotated[Optional[float], typer.Option(
        "--device-memory", metavar="GIB", help="GPU memory in GiB (e.g. 80) for the memory headroom rules; "
                                               "wins over the trace's GPU table (MIG slices).")] = None,
    jobs: Annotated[Optional[int], typer.Option("--jobs", "-j", min=1, help="Processes analysing ranks in parallel "
                                                "(default: the machine's cores).")] = None,
    dask: Annotated[Optional[str], typer.Option("--dask", help="Run the per-rank tasks on Dask: `local` (a "
                                                "LocalCluster of --jobs workers) or tcp://HOST:PORT.")] = None,
    sample: Annotated[Optional[int], typer.Option("--sample", min=1, help="Analyse this many representative files "
                                                  "of a large run (every PP stage, the slowest and fastest of a "
                                                  "first pass, the rest spread over ranks).")] = None,
) -> None:
    """Measure where each GPU's time goes and print the breakdown."""
    from perfdoctor import api
    from perfdoctor.load.config_file import user_config
    from perfdoctor.render.terminal import analysis_progress

    check_outputs({"--output": output, "--html": html, "--markdown": markdown},
                  [*paths, *(rules or []), *([config_file] if config_file else [])])
    config, sources = user_config(config_file, {"tp": tp, "pp": pp, "vpp": vpp, "cp": cp, "dp": dp, "ep": ep,
                                                "num_microbatches": num_microbatches})
    with analysis_progress() as progress:
        report = api.analyze(paths, config, progress=progress, rules_dirs=rules, timeline_excerpts=html is not None,
                             config_sources=sources, allow_mixed=allow_mixed,
                             device_memory_bytes=_gib_bytes(device_memory), jobs=jobs, dask=dask, sample=sample)
    _write_reports(report, html, markdown, plotly_js.value)
    if output_format is OutputFormat.json:
        from perfdoctor.render.json import render_json

        _emit(render_json(report), output)
    else:
        from perfdoctor.render.terminal import render_terminal

        _print_rich(lambda console, to_file: render_terminal(report, console), output)
    if fail_on is not None:
        failing = _failing_findings(report.findings, fail_on.value)
        if failing:
            sys.stderr.write(f"perfdoctor: {len(failing)} finding(s) at or above --fail-on {fail_on.value}: "
                             f"{', '.join(failing)}\n")
            raise typer.Exit(1)


class RulesFormat(str, Enum):
    table = "table"
    json = "json"


@app.command("rules")
def list_rules(
    rules: Annotated[Optional[list[Path]], typer.Option("--rules", help="Directory of extra rule files; repeatable.")]
        = None,
    output_format: Annotated[RulesFormat, typer.Option("--format", "-f", help="Output format.")] = RulesFormat.table,
    metrics: Annotated[bool, typer.Option("--metrics", help="List the metric names rules can use instead.")] = False,
) -> None:
    """List the diagnosis rules (shipped catalog plus --rules directories)."""
    import json

    from perfdoctor.diagnose.explain import rule_row
    from perfdoctor.diagnose.rules import known_metrics, load_rules

    if metrics:
        names = sorted(known_metrics())
        _emit(json.dumps(names, indent=2) + "\n" if output_format is RulesFormat.json else "\n".join(names) + "\n",
              None)
        return
    rows = [rule_row(r) for r in load_rules(rules)]
    if output_format is RulesFormat.json:
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
def explain(
    rule_id: Annotated[str, typer.Argument(metavar="RULE", help="Rule id, e.g. exposed-dp-comm.")],
    rules: Annotated[Optional[list[Path]], typer.Option("--rules", help="Directory of extra rule files; repeatable.")]
        = None,
) -> None:
    """Explain one rule: what it detects, why it happens, how to fix it per framework, how to verify."""
    from perfdoctor.diagnose.explain import explain_text
    from perfdoctor.diagnose.rules import load_rules

    catalog = {r.id: r for r in load_rules(rules)}
    if rule_id not in catalog:
        raise UsageError(f"unknown rule {rule_id!r} (see `perfdoctor rules`)")
    from perfdoctor.render.escape import terminal_text

    _emit(terminal_text(explain_text(catalog[rule_id])), None)  # rule texts are user text


@app.command()
def diff(
    base: Annotated[Path, typer.Argument(help="Base run: a trace, a run directory, or a JSON report.")],
    head: Annotated[Path, typer.Argument(help="Head run (the change under review), same kinds as BASE.")],
    output_format: Annotated[DiffFormat, typer.Option("--format", "-f", help="Output format.")] = DiffFormat.terminal,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write to FILE instead of stdout.")] = None,
    html: Annotated[Optional[Path], typer.Option("--html", help="Also write the diff as a self-contained HTML page.")]
        = None,
    markdown: Annotated[Optional[Path], typer.Option("--markdown", help="Also write the diff as Markdown.")] = None,
    plotly_js: Annotated[PlotlyJs, typer.Option("--plotly-js", help="HTML: inline plotly.js or link the CDN.")]
        = PlotlyJs.inline,
    fail_on_regression: Annotated[Optional[float], typer.Option(
        "--fail-on-regression", metavar="PCT",
        help="Exit 1 when the median step time (per unit of work for window-only captures) grew by more than "
             "PCT %, beyond noise, or when the runs are not comparable.")] = None,
    config_file: Annotated[Optional[Path], CONFIG_OPTION] = None,
    allow_mixed: Annotated[bool, ALLOW_MIXED_OPTION] = False,
) -> None:
    """Compare two runs: per-metric deltas against noise, new / resolved / changed findings."""
    from perfdoctor import api
    from perfdoctor.load.config_file import user_config

    if fail_on_regression is not None and fail_on_regression < 0:
        raise UsageError("--fail-on-regression must be a percentage >= 0")
    check_outputs({"--output": output, "--html": html, "--markdown": markdown},
                  [base, head, *([config_file] if config_file else [])])
    config, sources = user_config(config_file, {})
    d = api.diff(base, head, config, config_sources=sources, allow_mixed=allow_mixed)
    if html is not None:
        from perfdoctor.render.diff_html import render_diff_html

        _emit(render_diff_html(d, plotly_js.value), html)
    if markdown is not None:
        from perfdoctor.render.diff_markdown import render_diff_markdown

        _emit(render_diff_markdown(d), markdown)
    if output_format is DiffFormat.json:
        import json

        from perfdoctor.diff import diff_dict

        _emit(json.dumps(diff_dict(d), indent=2) + "\n", output)
    elif output_format is DiffFormat.markdown:
        from perfdoctor.render.diff_markdown import render_diff_markdown

        _emit(render_diff_markdown(d), output)
    else:
        from perfdoctor.render.diff_terminal import render_diff_terminal

        _print_rich(lambda console, to_file: render_diff_terminal(d, console, show_all=to_file), output)
    if fail_on_regression is not None and not d.basis.comparable:
        sys.stderr.write(f"perfdoctor: the runs are not comparable ({d.basis.reason}): cannot rule out a regression\n")
        raise typer.Exit(1)
    if fail_on_regression is not None and d.step_regression_pct > fail_on_regression:
        sys.stderr.write(f"perfdoctor: step time regressed by {d.step_regression_pct:.1f} % "
                         f"(> --fail-on-regression {fail_on_regression:g})\n")
        raise typer.Exit(1)


@app.command()
def memory(
    paths: Annotated[list[Path], typer.Argument(help="PyTorch CUDA memory snapshots (*.pickle from "
                                                "torch.cuda.memory._dump_snapshot), or run directories.")],
    output_format: Annotated[OutputFormat, typer.Option("--format", "-f", help="Output format.")] =
        OutputFormat.terminal,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write to FILE instead of stdout.")] = None,
    device_memory: Annotated[Optional[float], typer.Option(
        "--device-memory", metavar="GIB", help="GPU memory in GiB (e.g. 80), for the headroom.")] = None,
    device: Annotated[Optional[int], typer.Option(help="Device to measure (default: the one holding the most).")]
        = None,
) -> None:
    """Peak allocated/reserved memory, fragmentation, headroom and top allocation sites of snapshots.

    Snapshots are read without running any code from them (a pickle that asks for a function is refused).
    """
    from perfdoctor import __version__, api

    total = _gib_bytes(device_memory)
    check_outputs({"--output": output}, paths)
    measurements = api.memory(paths, device_total_bytes=total, device=device)
    if output_format is OutputFormat.json:
        from perfdoctor.render.memory import render_memory_json

        _emit(render_memory_json(measurements, __version__), output)
    else:
        from perfdoctor.render.memory import render_memory_terminal

        _print_rich(lambda console, to_file: render_memory_terminal(measurements, console), output)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def capture(
    ctx: typer.Context,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Run directory (default: "
                                                "perfdoctor-runs/<date-time>).")] = None,
    steps: Annotated[Optional[str], typer.Option(help="Optimizer steps to capture, A-B (from 0), e.g. 10-12.")]
        = None,
    ranks: Annotated[str, typer.Option(help="Ranks to profile: all, or a list like 0,1,8.")] = "all",
    per_rank: Annotated[Optional[bool], typer.Option("--per-rank/--per-node", help="One report per rank, or one per "
                                                     "node (default: per node; per rank under srun alone).")]
        = None,
    memory: Annotated[bool, typer.Option("--memory/--no-memory", help="Record CUDA memory history and dump a "
                                         "snapshot per rank at the end of the window.")] = True,
    memory_max_entries: Annotated[int, typer.Option(help="Allocator events kept per rank (ring buffer).")]
        = 100_000,
    nsys_arg: Annotated[Optional[list[str]], typer.Option("--nsys-arg", help="Extra `nsys profile` argument "
                                                          "(repeatable; write --nsys-arg=--flag=value).")] = None,
    nsys: Annotated[Optional[str], typer.Option("--nsys", help="The nsys CLI to use (default: nsys on PATH).")]
        = None,
    force: Annotated[bool, typer.Option("--force", help="Write into a non-empty run directory, overwriting "
                                        "files of the same names.")] = False,
    run_analyze: Annotated[bool, typer.Option("--analyze", help="Run `perfdoctor analyze RUN_DIR` at the end.")]
        = False,
    keep_reports: Annotated[str, typer.Option("--keep-reports", help="yes, or no: delete each .nsys-rep once its "
                                              "scrubbed SQLite export is written (reports hold the unredacted "
                                              "environment; use no for runs you will share).")] = "yes",
) -> None:
    """Run a training command under nsys with perfdoctor's per-rank labels: perfdoctor capture [OPTIONS] -- CMD ...

    CMD is `torchrun ...`, `python ...` or `srun ...`. The training code is not modified: a sitecustomize
    hook labels steps, collectives (by parallel group), GC and micro-batches, and records CUDA memory
    history. The exit code is the training command's.
    """
    from perfdoctor.capture.launcher import CaptureOptions, parse_ranks, parse_steps, run_capture

    if memory_max_entries <= 0:
        raise UsageError("--memory-max-entries must be positive")
    if keep_reports not in ("yes", "no"):
        raise UsageError(f"--keep-reports {keep_reports!r}: expected yes or no")
    options = CaptureOptions(command=list(ctx.args), out=out, steps=parse_steps(steps), ranks=parse_ranks(ranks),
                             per_rank=per_rank, memory=memory, memory_max_entries=memory_max_entries,
                             nsys_args=list(nsys_arg or []), nsys=nsys, force=force,
                             keep_reports=keep_reports == "yes")

    def say(line: str) -> None:
        sys.stderr.write(f"perfdoctor: {line}\n")

    result = run_capture(options, say)
    for note in result.notes:
        say(note)
    training = "not started" if result.training_exit_code is None else result.training_exit_code
    interrupted = f", interrupted by {result.interrupted_by}" if result.interrupted_by else ""
    say(f"run directory {result.run_dir}: {len(result.reports)} report(s), {len(result.exports)} SQLite "
        f"export(s), manifest.json; training exit code {training}{interrupted}")
    if run_analyze and not result.interrupted_by:
        if result.exports or any(result.run_dir.glob("*.sqlite")):
            analyze([result.run_dir])
        else:
            say("--analyze: nothing to analyse (no SQLite export)")
    if result.exit_code:
        raise typer.Exit(result.exit_code)


@app.command()
def synth(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML (see perfdoctor/synth/scenarios/).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the traces and truth files.")],
    seed: Annotated[Optional[int], typer.Option(help="Override the scenario's seed.")] = None,
    schema: Annotated[Optional[str], typer.Option(help="nsys export schema style to write.")] = None,
    trace_format: Annotated[SynthFormat, typer.Option("--format", help="sqlite: nsys exports; kineto: PyTorch "
                                                      "profiler traces (one .pt.trace.json.gz per rank).")]
        = SynthFormat.sqlite,
) -> None:
    """Simulate Megatron training steps and write nsys SQLite (or PyTorch profiler) traces plus ground-truth JSON."""
    from perfdoctor.synth import run_scenario

    for path in run_scenario(scenario, out, seed=seed, schema=schema, fmt=trace_format.value):
        typer.echo(str(path))


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
    """Draw rich output on the terminal, or into ``output`` as plain text 120 columns wide;
    ``draw(console, to_file)``."""
    import io

    from perfdoctor.render.escape import safe_console

    if output is None:
        if sys.stdout is None:
            raise UsageError("stdout is closed: give --output FILE")
        try:
            draw(safe_console(), False)
        except OSError as exc:
            raise stdout_error(exc) from None
        return
    buffer = io.StringIO()
    draw(safe_console(file=buffer, width=120, no_color=True), True)
    write_text(output, buffer.getvalue())


def _emit(text: str, output: Path | None) -> None:
    if output is None:
        write_stdout(text)
    else:
        write_text(output, text)


def main() -> None:
    """Console entry point: one line on stderr and the right exit code for every failure."""
    from perfdoctor import interrupts

    interrupts.install()
    try:
        code = app(standalone_mode=False)
    except PerfdoctorError as exc:
        _fail(str(exc), exc.exit_code)
    except typer.Exit as exc:
        _exit_interrupted_or(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        _fail("interrupted", 130)
    except TyperException as exc:  # usage errors (typer's bundled click) carry their own exit code
        if type(exc).__name__ == "NoArgsIsHelpError":
            exc.show()  # prints the help, as click does
            sys.exit(exc.exit_code)
        _fail(f"{exc.format_message()} (see `perfdoctor --help`)", exc.exit_code)
    except Exception as exc:
        if os.environ.get("PERFDOCTOR_DEBUG"):
            raise
        _fail(f"internal error: {type(exc).__name__}: {exc} (set PERFDOCTOR_DEBUG=1 for a traceback)", 3)
    _exit_interrupted_or(code if isinstance(code, int) else 0)


def _exit_interrupted_or(code: int) -> None:
    """Exit with ``code``, or 130 when a Ctrl-C was swallowed on the way (see perfdoctor.interrupts)."""
    from perfdoctor import interrupts

    if interrupts.received():
        _fail("interrupted", 130)
    try:
        flush_stdout()
    except UsageError as exc:
        _fail(str(exc), exc.exit_code)
    sys.exit(code)


def _fail(message: str, code: int) -> None:
    first = message.strip().splitlines()[0] if message.strip() else "error"
    sys.stderr.write(f"perfdoctor: {first}\n")
    sys.exit(code)


if __name__ == "__main__":
    main()
