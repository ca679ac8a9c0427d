"""The rows every human-facing report shows, taken from the Report and shared by HTML and Markdown.

Nothing here measures: it picks metrics by name, orders ranks, and splits a step into the stacked
parts the breakdown chart draws (each part is a reported metric; "other" is the rest of the step).
Missing metrics stay missing, so a trace without GPU data or labels shows fewer rows, not zeros.
"""

from __future__ import annotations

from typing import Any

from perfdoctor.model import Report

GROUPS = ("dp", "tp", "cp", "pp", "ep", "other")
HOST_CAUSES = (("launch_bound", "launch-bound"), ("sync", "sync stall"), ("gc", "garbage collection"),
               ("data", "data loading"), ("other", "unattributed"), ("device_wait", "device waiting"))
SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2, "info": 3}
# Metrics of the per-rank heatmap and the summary, with a label and a unit for formatting.
RANK_METRICS = (("step.time_ms", "step time", "ms"), ("gpu.busy_fraction", "GPU busy", "%"),
                ("comm.exposed_fraction", "exposed comm", "%"), ("comm.dp.exposed_ms", "exposed DP", "ms"),
                ("comm.tp.exposed_ms", "exposed TP", "ms"), ("comm.pp.exposed_ms", "exposed PP", "ms"),
                ("host.idle_fraction", "device idle", "%"), ("pipeline.bubble_fraction", "PP bubble", "%"),
                ("ln.blocked_ms", "LN blocked", "ms"), ("mfu", "MFU", "%"))


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
    """The shortest honest name of a knob: the first framework path it gives."""
    for key in ("megatron_bridge", "megatron_lm", "nemo", "env"):
        if knob.get(key):
            value, where = knob.get("value"), str(knob[key])
            return f"{where} = {value}" if value is not None and not any(c in where for c in "=( ") else where
    return "–"
