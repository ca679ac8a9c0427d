"""The rows every human-facing report shows, taken from the Report and shared by HTML and Markdown.

Nothing here measures: it picks metrics by name, orders ranks, and splits a step into the stacked
parts the breakdown chart draws (each part is a reported metric; "other" is the rest of the step).
Missing metrics stay missing, so a trace without GPU data or labels shows fewer rows, not zeros.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from perfdoctor.blame.causes import CAUSE_KEYS, CAUSES
from perfdoctor.diagnose.findings import combined_impact_ms
from perfdoctor.model import Report
from perfdoctor.render.snippets import python_literal

GROUPS = ("dp", "tp", "cp", "pp", "ep", "other")
HOST_CAUSES = (("launch_bound", "launch-bound"), ("sync", "sync stall"), ("gc", "garbage collection"),
               ("data", "data loading"), ("optimizer", "optimizer step"), ("outside_ops", "outside profiled ops"),
               ("other", "unattributed"), ("device_wait", "device waiting"))
SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2, "info": 3}
# Metrics of the per-rank heatmap and the summary, with a label and a unit for formatting.
RANK_METRICS = (("step.time_ms", "step time", "ms"), ("gpu.busy_fraction", "GPU busy", "%"),
                ("comm.exposed_fraction", "exposed comm", "%"), ("comm.dp.exposed_ms", "exposed DP", "ms"),
                ("comm.tp.exposed_ms", "exposed TP", "ms"), ("comm.pp.exposed_ms", "exposed PP", "ms"),
                ("host.idle_fraction", "device idle", "%"), ("pipeline.bubble_fraction", "PP bubble", "%"),
                ("ln.blocked_ms", "LN blocked", "ms"), ("mfu", "MFU", "%"))


SHOWN_MS = 0.005  # causes that would print as 0.00 ms are left out of the per-cause lines


def blocking(m: dict[str, Any]) -> list[tuple[str, float, float]]:
    """What blocked the step, one row per cause on the critical path (perfdoctor.blame): (cause, ms, share
    of the step), largest first, then the residual when there is one; they add up to the step."""
    step = m.get("step.time_ms")
    if not step or m.get("blocking.residual_ms") is None:
        return []
    rows = [(cause, float(v), float(v) / step) for cause, key in zip(CAUSES, CAUSE_KEYS)
            if (v := m.get(key)) is not None and abs(v) >= SHOWN_MS]
    rows.sort(key=lambda r: -r[1])
    residual = m["blocking.residual_ms"]
    if abs(residual) >= SHOWN_MS:
        rows.append(("residual (not attributed)", residual, residual / step))
    return rows


def ranks(report: Report) -> list[str]:
    """Rank keys of ``metrics.ranks`` in numeric order."""
    return sorted(report.metrics.get("ranks", {}), key=lambda r: (not r.lstrip("-").isdigit(), int(r)
                                                                   if r.lstrip("-").isdigit() else 0, r))


def breakdown(m: dict[str, Any]) -> list[tuple[str, float]]:
    """A step split into stacked parts (ms): compute, exposed comm per group, host idle, other.

    Exposed comm of several groups can overlap in time; the per-group parts are scaled down to the
    exposed union so the stack never exceeds the step.
    """
    step = m.get("step.time_ms")
    if not step:
        return []
    parts: list[tuple[str, float]] = []
    if m.get("compute.fraction") is not None:
        parts.append(("compute", m["compute.fraction"] * step))
    groups = [(g, m.get(f"comm.{g}.exposed_ms") or 0.0) for g in GROUPS]
    union = m.get("comm.exposed_ms")
    labelled = sum(v for _, v in groups)
    if union is not None:
        scale = min(1.0, union / labelled) if labelled else 0.0
        parts += [(f"exposed {g.upper()}", v * scale) for g, v in groups if v]
        if union > labelled:
            parts.append(("exposed comm (unlabelled)", union - labelled))
    if m.get("host.idle_fraction") is not None:
        parts.append(("device idle", m["host.idle_fraction"] * step))
    rest = step - sum(v for _, v in parts)
    if rest > 1e-9 and parts:
        parts.append(("other", rest))
    return parts


def findings(report: Report) -> list[dict[str, Any]]:
    """Findings by impact (largest first; unknown impact last), then severity, then rule id."""
    def key(f: dict[str, Any]) -> tuple:
        impact = f.get("impact_ms_per_step")
        return (impact is None, -(impact or 0.0), SEVERITY_ORDER.get(f.get("severity", "info"), 9), f.get("rule", ""))
    return sorted(report.findings, key=key)


def evidence(report: Report, topic: str) -> list[tuple[int, dict[str, Any]]]:
    """(rank, evidence[topic]) for every device that has the topic."""
    out = []
    for d in report.devices:
        ev = getattr(d, "evidence", None) or {}
        if isinstance(ev.get(topic), dict):
            out.append((d.rank, ev[topic]))
    return out


def fmt(value: Any, unit: str) -> str:
    """A metric for a table cell: ``12.34 ms``, ``41.2 %``, ``–`` when unknown."""
    if value is None:
        return "–"
    if unit == "%":
        return f"{100 * value:.1f} %"
    if unit == "ms":
        return f"{value:,.2f} ms"
    if unit == "bytes":
        return f"{value / 2**30:,.2f} GiB"
    return f"{value:,.4g}"


def knob_label(knob: dict[str, Any]) -> str:
    """The shortest honest name of a knob: the first framework path it gives, with its value as code."""
    for key in ("megatron_bridge", "megatron_lm", "nemo", "env"):
        if knob.get(key):
            value, where = knob.get("value"), str(knob[key])
            if value is None:
                return f"{where} = <{knob.get('type') or 'value'}>"
            return f"{where} = {python_literal(value, knob) if key != 'env' else value}"
    return "–"


def total_impact_ms(report: Report) -> float | None:
    """ms per step the findings explain together: overlapping findings counted once, at most the step."""
    return combined_impact_ms(report.findings, report.metrics.get("all", {}).get("step.time_ms"))


def confidence_text(f: dict[str, Any]) -> str:
    """``confidence: low (only 5 kernels in the trace; ...)``."""
    level = f.get("confidence") or "–"
    reasons = f.get("confidence_reasons") or []
    return f"confidence: {level}" + (f" ({'; '.join(str(r) for r in reasons)})" if reasons else "")


def overlap_text(f: dict[str, Any]) -> str | None:
    if not f.get("overlaps"):
        return None
    return f"explains the same time as {', '.join(f['overlaps'])} (impacts not added)"


def knobs_heading(f: dict[str, Any], framework: dict[str, Any] | None, role: str | None = None) -> str:
    """Whether the knobs are the fix or a reference (DESIGN §5 framework awareness); ``role`` heads a list
    of knobs of that role only (a run that is not Megatron's: its environment knobs are the fix, the
    Megatron settings a reference)."""
    if (role or f.get("knobs_role")) == "reference":
        name = (framework or {}).get("name", "unknown")
        return (f"Megatron-Bridge / NeMo 2 / Megatron-LM settings for reference only: this run is not "
                f"recognised as a Megatron run (framework: {name}); the fix is the advice above")
    return "knobs (the fix)"


# Snapshot times are Unix microseconds (PyTorch converts its clock to Unix time); outside these years a
# value is some other clock and gets no wall-clock time.
_UNIX_US = (978_307_200_000_000, 4_102_444_800_000_000)  # 2001-01-01 .. 2100-01-01


def history_time(t_us: int | None, start_us: int | None) -> str:
    """A memory-history instant as people read it: ``+0.071 s`` after the history starts, and the wall
    clock when the value is a Unix time (``+0.071 s, 14:03:35.120 UTC 2026-11-26``)."""
    if t_us is None:
        return ""
    parts = [f"+{(t_us - start_us) / 1e6:,.3f} s after the history starts"] if start_us is not None else []
    if _UNIX_US[0] <= t_us < _UNIX_US[1]:
        wall = datetime.fromtimestamp(t_us / 1e6, tz=timezone.utc)
        parts.append(wall.strftime("%Y-%m-%d %H:%M:%S.") + f"{wall.microsecond // 1000:03d} UTC")
    return ", ".join(parts) if parts else f"t={t_us:,} µs"


def reference_line(f: dict[str, Any]) -> str:
    """The one line that stands for a finding's reference-only knobs (the run is not recognised as
    Megatron's, so they are not the fix): where to read them."""
    return f"{reference_what(f)} for reference: `perfdoctor explain {f['rule']}`"


def reference_what(f: dict[str, Any]) -> str:
    """What a finding's reference-only knobs are: Megatron settings, or (environment only) settings."""
    megatron = any(k.get("megatron_bridge") or k.get("nemo") or k.get("megatron_lm")
                   for k in f.get("knobs", []) if k.get("role") == "reference")
    return "Megatron settings" if megatron else "settings"


def what_if_text(knob: dict[str, Any]) -> str | None:
    what_if = knob.get("what_if")
    if not isinstance(what_if, dict):
        return None
    saved = what_if.get("expected_ms_per_step_saved")
    amount = f"{saved:,.2f} ms per step" if isinstance(saved, (int, float)) else "not estimable from this trace"
    return f"what-if: {amount} saved ({what_if.get('how', '')})"
