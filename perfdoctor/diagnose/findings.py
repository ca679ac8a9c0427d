"""Rules × measurements → findings (DESIGN §5): what is wrong, how much it costs, which knob fixes it.

A rank-scope rule is evaluated on every rank's metrics (with that rank's env, evidence and GPU); the
ranks where it fires become one finding whose impact is the median over those ranks. A run-scope rule
is evaluated once on ``metrics.all``. A rule that names others in ``supersedes`` is their root cause:
where it fires, their findings on the same ranks are dropped and the root finding says it explains them.
Knobs already set in the captured env/config (``set_when``) are not recommended again: the finding
shows what is set (``already_set``) and gives the rule's next step instead.

Text templates are filled by substituting ``{name}`` placeholders with formatted values — a regex over
names, never ``str.format`` (attribute access) and never eval.
"""

from __future__ import annotations

import json
import statistics
from typing import TYPE_CHECKING, Any

from perfdoctor.diagnose.conditions import Context, as_number, evaluate, names
from perfdoctor.diagnose.rules import PLACEHOLDER, Rule
from perfdoctor.tuning_env import REDACTED, is_secret

if TYPE_CHECKING:
    from perfdoctor.model import Report

SEVERITIES = ("high", "medium", "low", "info")
KNOB_FIELDS = ("megatron_bridge", "nemo", "megatron_lm", "env", "value", "note")


def diagnose(report: Report, rules: list[Rule]) -> list[dict[str, Any]]:
    """Findings of ``rules`` on an analysed run, sorted by impact (largest first, unknown last)."""
    run = report.run
    envs: dict[str, dict[str, str]] = {}
    gpus: dict[str, Any] = {}
    for tl in run.timelines:
        envs.setdefault(str(tl.rank), tl.trace.env)
        gpus.setdefault(str(tl.rank), tl.gpu)
    summaries = {str(d.rank): d for d in report.devices}
    contexts = {
        rank: Context(metrics=metrics, config=run.config, env=envs.get(rank, {}),
                      evidence=getattr(summaries.get(rank), "evidence", None) or {},
                      device=_device(gpus.get(rank), summaries.get(rank)))
        for rank, metrics in report.metrics.get("ranks", {}).items()
    }
    run_env: dict[str, str] = {}
    for info in run.traces:
        for name, value in info.env.items():
            run_env.setdefault(name, value)
    first = next(iter(contexts.values()), None)
    # Run-level evidence: the straggler's (measure/ranks.py peer_metrics), for run-scope rules.
    run_evidence = {topic: ev for d in report.devices for topic, ev in d.evidence.items() if topic == "straggler"}
    run_ctx = Context(metrics=report.metrics.get("all", {}), config=run.config, env=run_env,
                      evidence=run_evidence, device=first.device if first else {})
    return evaluate_rules(rules, contexts, run_ctx)


def _device(gpu: Any, summary: Any) -> dict[str, Any]:
    """GPU properties a rule may read as ``device.<field>``."""
    out: dict[str, Any] = {}
    if gpu is not None:
        out.update(name=gpu.name, sm_count=gpu.sm_count, total_memory_bytes=gpu.total_memory,
                   compute_capability=gpu.compute_capability)
    if summary is not None:
        out["comm_libraries"] = dict(summary.comm_libraries)
        out["gpu_name"] = summary.gpu_name
    return out


def evaluate_rules(rules: list[Rule], contexts: dict[str, Context], run_ctx: Context) -> list[dict[str, Any]]:
    """Pure core of :func:`diagnose`: rules over per-rank contexts (keyed by rank) and the run context."""
    hits: dict[str, dict[str, Context]] = {}
    for rule in rules:
        pool = contexts if rule.scope == "rank" else {"run": run_ctx}
        fired = {key: ctx for key, ctx in pool.items() if _fires(rule, ctx)}
        if fired:
            hits[rule.id] = fired
    explains: dict[str, list[str]] = {}
    for rule in rules:
        for other in rule.spec.get("supersedes", []):
            if rule.id in hits and other in hits:
                shared = set(hits[rule.id]) & set(hits[other])
                if shared:
                    explains.setdefault(rule.id, []).append(other)
                    for key in shared:
                        del hits[other][key]
    by_id = {r.id: r for r in rules}
    findings = [_finding(by_id[rid], fired, explains.get(rid, []), sorted(contexts, key=_rank_key))
                for rid, fired in hits.items() if fired]
    return sorted(findings, key=lambda f: (f["impact_ms_per_step"] is None, -(f["impact_ms_per_step"] or 0.0),
                                           SEVERITIES.index(f["severity"]), f["rule"]))


def _fires(rule: Rule, ctx: Context) -> bool:
    spec = rule.spec
    return evaluate(ctx, spec["when"]) and not ("unless" in spec and evaluate(ctx, spec["unless"]))


def impact_ms(rule: Rule, ctx: Context) -> float | None:
    """ms per step the rule's impact metric attributes to the problem (times factors, times scale; the
    ``otherwise`` estimate where that metric is unknown), never more than the step itself."""
    value = _estimate(rule.spec["impact"], ctx)
    if value is None and "otherwise" in rule.spec["impact"]:
        value = _estimate(rule.spec["impact"]["otherwise"], ctx)
    step = as_number(ctx.resolve("step.time_ms"))
    return min(value, step) if value is not None and step else value


def _estimate(spec: dict[str, Any], ctx: Context) -> float | None:
    if not spec.get("metric"):
        return None
    value = as_number(ctx.resolve(spec["metric"]))
    for name in spec.get("times", []):
        factor = as_number(ctx.resolve(name))
        value = None if value is None or factor is None else value * factor
    return None if value is None else value * spec.get("scale", 1.0)


class _Aggregate:
    """Values across the ranks a rule fired on: medians of numbers, the representative rank's otherwise."""

    def __init__(self, fired: dict[str, Context], representative: Context, special: dict[str, Any]):
        self.fired, self.rep, self.special = fired, representative, special

    def resolve(self, name: str) -> Any:
        if name in self.special:
            return self.special[name]
        values = [ctx.resolve(name) for ctx in self.fired.values()]
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if numbers and len(numbers) == len([v for v in values if v is not None]):
            return statistics.median(numbers)
        return self.rep.resolve(name)


def _finding(rule: Rule, fired: dict[str, Context], explained: list[str], all_ranks: list[str]) -> dict[str, Any]:
    spec = rule.spec
    impacts = {key: impact_ms(rule, ctx) for key, ctx in fired.items()}
    rep_key = max(sorted(fired, key=_rank_key), key=lambda k: (impacts[k] is not None, impacts[k] or 0.0))
    rep = fired[rep_key]
    known = [v for v in impacts.values() if v is not None]
    impact = statistics.median(known) if known else None
    steps = [v for v in (as_number(c.resolve("step.time_ms")) for c in fired.values()) if v]
    step_ms = statistics.median(steps) if steps else None
    fraction = impact / step_ms if impact is not None and step_ms else None
    if rule.scope == "rank":
        ranks = sorted(int(k) for k in fired if _is_int(k))
    else:
        target = as_number(rep.resolve(spec["ranks_from"])) if spec.get("ranks_from") else None
        ranks = [int(target)] if target is not None else [int(k) for k in all_ranks if _is_int(k)]
    special = {"impact_ms": impact, "impact_percent": fraction, "step_ms": step_ms, "ranks": _ranks_text(ranks)}
    agg = _Aggregate(fired, rep, special)

    evidence: dict[str, Any] = {}
    for name in [*spec.get("evidence", []), *names(spec["when"])]:
        value = _shown(name, agg.resolve(name))
        if value is not None and name not in evidence:
            evidence[name] = value
    if len(fired) > 1 and rule.scope == "rank" and impacts[rep_key] is not None:
        evidence["worst_rank"] = int(rep_key) if _is_int(rep_key) else rep_key
        evidence["worst_rank_impact_ms"] = round(impacts[rep_key], 3)
    if explained:
        evidence["explains"] = ", ".join(explained)

    knobs, already_set = _knobs(spec.get("knobs", []), rep, agg)
    next_step = None
    if already_set and "next_step" in spec:
        next_step = fill(spec["next_step"]["text"], agg)
        extra, more_set = _knobs(spec["next_step"].get("knobs", []), rep, agg)
        knobs.extend(k for k in extra if k not in knobs)
        already_set.update(more_set)
    guide = spec["guide"]
    return {
        "rule": rule.id,
        "severity": _severity(spec["severity"], fraction),
        "title": spec["title"],
        "summary": fill(spec["summary"], agg),
        "ranks": ranks,
        "evidence": evidence,
        "impact_ms_per_step": None if impact is None else round(impact, 3),
        "impact_fraction": None if fraction is None else round(fraction, 4),
        "knobs": knobs,
        "guide": guide["section"],
        "guide_url": guide.get("url"),
        "already_set": already_set,
        "next_step": next_step,
    }


def _knobs(specs: list[dict[str, Any]], rep: Context, agg: _Aggregate) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Knobs to recommend, and what is already set (knobs whose ``set_when`` holds are not repeated)."""
    out: list[dict[str, Any]] = []
    already: dict[str, Any] = {}
    for knob in specs:
        if "when" in knob and not evaluate(rep, knob["when"]):
            continue
        if "set_when" in knob and evaluate(rep, knob["set_when"]):
            if "set_shows" in knob:
                already.update({key: fill(text, agg) for key, text in knob["set_shows"].items()})
            else:
                for name in names(knob["set_when"]):
                    value = _shown(name, rep.resolve(name))
                    if value is not None:
                        already[name.split(".", 1)[1] if name.startswith(("env.", "config.")) else name] = value
            continue
        out.append({key: knob.get(key) for key in KNOB_FIELDS})
    return out, already


def _severity(spec: dict[str, Any], fraction: float | None) -> str:
    if "fixed" in spec:
        return spec["fixed"]
    if fraction is None:
        return spec.get("default", "low")
    if fraction >= spec["high"]:
        return "high"
    if fraction >= spec["medium"]:
        return "medium"
    return "low"


def _shown(name: str, value: Any) -> Any:
    """A value as evidence: numbers rounded, env secrets redacted, structures as compact JSON."""
    if value is None:
        return None
    if name.startswith("env.") and is_secret(name[4:]):
        return REDACTED
    if isinstance(value, bool) or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return round(value, 6)
    return json.dumps(value, sort_keys=True, default=str)


def fill(template: str, source: Any) -> str:
    """Replace each ``{name}`` with the formatted value ``source.resolve(name)`` ("n/a" when missing)."""
    return PLACEHOLDER.sub(lambda m: format_value(m.group(1), _display(m.group(1), source.resolve(m.group(1)))),
                           template)


def _display(name: str, value: Any) -> Any:
    return REDACTED if name.startswith("env.") and value is not None and is_secret(name[4:]) else value


def format_value(name: str, value: Any) -> str:
    """Human form of one value: fractions as percent, bytes as GiB, ms with sensible precision."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        if "_fraction" in name or name.endswith("_percent") or name == "mfu" or name.startswith("mfu."):
            return f"{value * 100:.1f} %"
        if name.endswith("_bytes"):
            return f"{value / 2**30:.1f} GiB"
        if float(value).is_integer():
            return str(int(value))
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {format_value(str(k), v)}" for k, v in value.items()) or "none"
    if isinstance(value, list):
        return ", ".join(format_value(name, v) for v in value) or "none"
    return str(value)


def _ranks_text(ranks: list[int]) -> str:
    """``rank 3`` / ``ranks 0-7`` / ``ranks 0, 2, 4-6``."""
    if not ranks:
        return "no rank"
    parts, start, prev = [], ranks[0], ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        if r is not None:
            start = prev = r
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


def _is_int(key: str) -> bool:
    return key.lstrip("-").isdigit()


def _rank_key(key: str) -> tuple[int, int | str]:
    return (0, int(key)) if _is_int(key) else (1, key)
