"""``perfdoctor mcp``: a Model Context Protocol server over stdio, for coding agents.

Built on the official MCP SDK (``pip install 'perfdoctor[mcp]'``); the CLI imports this module only when
the ``mcp`` command runs, so nothing of the SDK (or pydantic under it) slows the other commands. Tools:

- ``analyze(paths, config, config_file, rules)``: the findings (rule, severity, impact, knobs), the blocking
  path when the report has one, the key metrics; compact, plus the path of the full JSON report, written to
  ``$XDG_CACHE_HOME/perfdoctor/mcp/`` (never beside the inputs);
- ``explain(rule_id)``: what ``perfdoctor explain`` prints;
- ``diff(base, head)``: the verdict, significant metric deltas, new / resolved findings;
- ``rules()``: the catalog, as ``perfdoctor rules --format json`` lists it.

Inputs go through the same checks as on the command line (:mod:`perfdoctor.invocation`, the loaders'
own limits); a bad input or an internal error comes back as a tool error with the CLI's one-line message,
never as a crashed server.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from perfdoctor import __version__
from perfdoctor.errors import PerfdoctorError

KEY_METRICS = ("step.time_ms", "step.time_p90_ms", "gpu.busy_fraction", "compute.fraction", "comm.exposed_ms",
               "comm.exposed_fraction", "pipeline.bubble_fraction", "pipeline.bubble_fraction_theory",
               "host.idle_fraction", "host.launch_bound_ms", "host.sync_ms", "host.gc_ms", "ln.blocked_ms", "mfu",
               "memory.peak_allocated_bytes", "ranks.slowest", "ranks.late_ms", "ranks.clock_residual_us")
FINDING_KEYS = ("rule", "severity", "confidence", "title", "summary", "ranks", "impact_ms_per_step", "overlaps",
                "guide_url")
KNOB_KEYS = ("megatron_bridge", "nemo", "megatron_lm", "env", "value", "note")
MAX_PATH_SEGMENTS = 20  # per rank, the longest segments of the blocking path in the compact answer

server = MCPServer("perfdoctor", version=__version__, instructions=(
    "perfdoctor reads Nsight Systems (SQLite / .nsys-rep) or PyTorch profiler traces of Megatron / NeMo / PyTorch "
    "training and says where step time goes and which knob fixes it. Call analyze on a trace, a run directory or "
    "several files of one run; explain a rule id it reports; after changing one knob and capturing again, diff "
    "the base and head runs (traces or the JSON reports analyze wrote)."))


def reports_dir() -> Path:
    """Where the full JSON reports go (``$XDG_CACHE_HOME/perfdoctor/mcp``), created on first use."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    out = Path(base) / "perfdoctor" / "mcp"
    out.mkdir(parents=True, exist_ok=True)
    return out


def _guarded(work: Any) -> Any:
    """Run ``work()``; perfdoctor's own errors become tool errors with their one line, anything else an
    internal error (as the CLI's exit 3), so the server answers the next call either way."""
    try:
        return work()
    except PerfdoctorError as exc:
        raise ToolError(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__) from None
    except ToolError:
        raise
    except Exception as exc:  # a bug: say so in one line, keep serving
        raise ToolError(f"internal error: {type(exc).__name__}: {exc}") from None


@server.tool()
def analyze(paths: list[str], config: dict[str, int] | None = None, config_file: str | None = None,
            rules: list[str] | None = None) -> dict[str, Any]:
    """Analyse traces of one training run: nsys SQLite exports, .nsys-rep reports, PyTorch profiler traces
    (.json / .json.gz), CUDA memory snapshots, or run directories of them. ``config``: parallel sizes the
    trace does not state (tp, pp, vpp, cp, dp, ep, num_microbatches); ``config_file``: Megatron arguments
    or a Megatron-Bridge / NeMo config; ``rules``: directories of extra rule files. Returns the findings
    sorted by impact (ms per step), the blocking path when measured, key metrics, warnings, and report_path:
    the full JSON report (every metric per rank, evidence, knobs)."""
    def work() -> dict[str, Any]:
        from perfdoctor import api
        from perfdoctor.invocation import analysis_config
        from perfdoctor.outputs import write_text
        from perfdoctor.render.json import render_json, report_dict

        inputs = [Path(p) for p in paths]
        if not inputs:
            raise ToolError("paths: give at least one trace or run directory")
        extra = [Path(r) for r in rules or []]
        cfg_file = Path(config_file) if config_file else None
        out = reports_dir() / _report_name(inputs)
        cfg, sources = analysis_config(inputs, dict(config or {}), cfg_file, extra, {"report": out})
        report = api.analyze(inputs, cfg, rules_dirs=extra or None, timeline_excerpts=False, config_sources=sources)
        write_text(out, render_json(report))
        return compact_report(report_dict(report), out)

    return _guarded(work)


@server.tool()
def explain(rule_id: str) -> str:
    """What a rule detects, why it costs time, how to fix it per framework (Megatron-Bridge, NeMo 2,
    Megatron-LM, environment) and how to verify the fix: ``perfdoctor explain RULE``."""
    def work() -> str:
        from perfdoctor.diagnose.explain import explain_text
        from perfdoctor.diagnose.rules import load_rules
        from perfdoctor.errors import UsageError

        catalog = {r.id: r for r in load_rules()}
        if rule_id not in catalog:
            raise UsageError(f"unknown rule {rule_id!r} (see the rules tool)")
        return explain_text(catalog[rule_id])

    return _guarded(work)


@server.tool()
def diff(base: str, head: str, config_file: str | None = None) -> dict[str, Any]:
    """Compare two runs, BASE → HEAD (each a trace, a run directory, or a JSON report analyze wrote): the
    verdict on the step time against noise, the metrics that changed beyond noise, and the findings that
    are new, resolved or changed."""
    def work() -> dict[str, Any]:
        from perfdoctor import api
        from perfdoctor.diff import diff_dict
        from perfdoctor.invocation import diff_config
        from perfdoctor.render.diff_markdown import basis_line, verdict_line

        b, h = Path(base), Path(head)
        cfg, sources = diff_config(b, h, Path(config_file) if config_file else None, {}, None)
        d = api.diff(b, h, cfg, config_sources=sources)
        full = diff_dict(d)
        return {"verdict": verdict_line(d), "basis": basis_line(d), "comparable": d.basis.comparable,
                "step": full["step"], "step_regression_pct": full["step_regression_pct"],
                "significant": [m for m in full["metrics"] if m["significant"]], "findings": full["findings"],
                "notes": full["notes"]}

    return _guarded(work)


@server.tool()
def rules() -> list[dict[str, Any]]:
    """The diagnosis rules: id, scope, title, severity, what they need (``perfdoctor rules``)."""
    def work() -> list[dict[str, Any]]:
        from perfdoctor.diagnose.explain import rule_row
        from perfdoctor.diagnose.rules import load_rules

        return [rule_row(r) for r in load_rules()]

    return _guarded(work)


def compact_report(report: dict[str, Any], report_path: Path) -> dict[str, Any]:
    """What an agent needs first from a JSON report; the rest stays in the file at ``report_path``."""
    metrics = report.get("metrics", {}).get("all", {})
    blocking = {k: v for k, v in metrics.items() if k.startswith("blocking.") and v is not None}
    findings = []
    for f in report.get("findings") or []:
        row = {k: f.get(k) for k in FINDING_KEYS if f.get(k) is not None}
        row["knobs"] = [{k: knob.get(k) for k in KNOB_KEYS if knob.get(k) is not None}
                        for knob in f.get("knobs") or [] if isinstance(knob, dict)]
        findings.append(row)
    out = {"report_path": str(report_path),
           "run": {k: report.get("run", {}).get(k) for k in ("ranks", "devices", "gpu", "config", "framework")},
           "steps": report.get("steps"),
           "metrics": {k: metrics.get(k) for k in KEY_METRICS if metrics.get(k) is not None} | blocking,
           "findings": findings, "warnings": report.get("warnings") or []}
    path = report.get("path")
    if path:
        out["blocking_path"] = _compact_path(path)
    return out


def _compact_path(path: Any) -> dict[str, list[dict[str, Any]]]:
    """Per rank, the longest segments of the blocking path (DESIGN §5 ``path``), in time order."""
    per_rank: dict[str, list[dict[str, Any]]] = {}
    items = path.items() if isinstance(path, dict) else [(None, path)]
    for rank, segments in items:
        for s in segments or []:
            if isinstance(s, dict):
                per_rank.setdefault(str(s.get("rank", rank)), []).append(s)
    out = {}
    for rank, segments in per_rank.items():
        longest = sorted(segments, key=lambda s: s.get("end_ns", 0) - s.get("start_ns", 0), reverse=True)
        keep = sorted(longest[:MAX_PATH_SEGMENTS], key=lambda s: s.get("start_ns", 0))
        out[rank] = [{"cause": s.get("cause"), "what": s.get("what"), "inferred": s.get("inferred"),
                      "ms": round((s.get("end_ns", 0) - s.get("start_ns", 0)) / 1e6, 3)} for s in keep]
    return out


def _report_name(inputs: list[Path]) -> str:
    """A file name per analysis: the first input's name, a hash of all resolved inputs, and the time."""
    digest = hashlib.sha256(json.dumps([os.path.realpath(p) for p in inputs]).encode()).hexdigest()[:12]
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in inputs[0].name)[:60] or "run"
    return f"{stem}-{digest}-{time.strftime('%Y%m%dT%H%M%S')}.json"


def serve() -> None:
    """Serve MCP over stdin/stdout until the client closes the connection."""
    server.run("stdio")
