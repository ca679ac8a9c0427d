"""Rules × measurements → findings (DESIGN §5): what is wrong, how much it costs, which knob fixes it.

A rank-scope rule is evaluated on every rank's metrics (with that rank's env, evidence and GPU); the
ranks where it fires become one finding whose impact is the median over those ranks. A run-scope rule
is evaluated once on ``metrics.all``. A rule that names others in ``supersedes`` is their root cause:
where it fires, their findings on the same ranks are dropped and the root finding says it explains them.
Knobs already set in the captured env/config (``set_when``) are not recommended again: the finding
shows what is set (``already_set``) and gives the rule's next step instead.

A rank-scope rule is judged on the run: it fires when it holds on the median over ranks of every
number it reads (or on every rank), and the finding lists the ranks on which it holds on their own, so
two twins of one job never get different verdicts at a knife edge. Every finding says how sure it is
(``confidence``, see :mod:`perfdoctor.diagnose.evidence`), caps its severity by the evidence behind it,
names the findings that explain the same time (``overlaps``) and gives a framework-neutral ``advice``:
the knobs are *the* fix only for a recognised Megatron framework, a reference otherwise.

Text templates are filled by substituting ``{name}`` placeholders with formatted values — a regex over
names, never ``str.format`` (attribute access) and never eval.
"""

from __future__ import annotations

import json
import statistics
from typing import TYPE_CHECKING, Any

from perfdoctor.diagnose.conditions import Context, as_number, evaluate, names
from perfdoctor.diagnose.evidence import cap_severity, confidence, device_quality
from perfdoctor.diagnose.knob_values import estimate, resolve_value
from perfdoctor.diagnose.rules import PLACEHOLDER, Rule
from perfdoctor.tuning_env import REDACTED, is_secret

if TYPE_CHECKING:
    from perfdoctor.model import Report

SEVERITIES = ("high", "medium", "low", "info")
KNOB_FIELDS = ("megatron_bridge", "nemo", "megatron_lm", "env", "value", "note")
# Frameworks whose configuration the Megatron-Bridge / NeMo 2 / Megatron-LM knobs are (DESIGN §5).
MEGATRON = ("megatron-bridge", "nemo2", "megatron-lm", "megatron-core")


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
    return evaluate_rules(rules, contexts, run_ctx, run.framework.get("name", "unknown"))


def _device(gpu: Any, summary: Any) -> dict[str, Any]:
    """GPU properties a rule may read as ``device.<field>``, and how much evidence the rank holds."""
    out: dict[str, Any] = device_quality(summary) if summary is not None else {}
    if gpu is not None:
        out.update(name=gpu.name, sm_count=gpu.sm_count, total_memory_bytes=gpu.total_memory,
                   compute_capability=gpu.compute_capability)
    if summary is not None:
        out["comm_libraries"] = dict(summary.comm_libraries)
        out["gpu_name"] = summary.gpu_name
    return out


def evaluate_rules(rules: list[Rule], contexts: dict[str, Context], run_ctx: Context,
                   framework: str = "megatron-core") -> list[dict[str, Any]]:
    """Pure core of :func:`diagnose`: rules over per-rank contexts (keyed by rank) and the run context;
    ``framework`` (``run.framework.name``) decides whether the Megatron knobs are the fix."""
    hits: dict[str, dict[str, Context]] = {}
    median = _median_context(contexts)
    for rule in rules:
        if rule.scope == "rank":
            fired = _fired_on_run(rule, contexts, median)
        else:
            fired = {"run": run_ctx} if _fires(rule, run_ctx) else {}
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
    findings = [_finding(by_id[rid], fired, explains.get(rid, []), sorted(contexts, key=_rank_key), framework)
                for rid, fired in hits.items() if fired]
    _link_overlaps(findings, by_id)
    return sorted(findings, key=lambda f: (f["impact_ms_per_step"] is None, -(f["impact_ms_per_step"] or 0.0),
                                           SEVERITIES.index(f["severity"]), f["rule"]))


def _median_context(contexts: dict[str, Context]) -> Context | None:
    """The run as one rank: each metric the median over ranks; config, env, evidence and device of the
    first rank (they are per-rank facts, not numbers to average)."""
    if len(contexts) < 2:
        return None
    first = contexts[sorted(contexts, key=_rank_key)[0]]
    keys = {k for ctx in contexts.values() for k in ctx.metrics}
    metrics: dict[str, Any] = {}
    for key in keys:
        values = [ctx.metrics.get(key) for ctx in contexts.values()]
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        metrics[key] = statistics.median(numbers) if numbers else first.metrics.get(key)
    return Context(metrics=metrics, config=first.config, env=first.env, evidence=first.evidence, device=first.device)


def _fired_on_run(rule: Rule, contexts: dict[str, Context], median: Context | None) -> dict[str, Context]:
    """Ranks a rank-scope rule is reported on. It fires for the run when it holds on the median rank or on
    every rank; the finding lists the ranks where it holds on their own (all ranks when only the median
    crosses the threshold)."""
    own = {key: ctx for key, ctx in contexts.items() if _fires(rule, ctx)}
    if median is None or len(own) == len(contexts):
        return own
    if not _fires(rule, median):
        return {}
    return own or dict(contexts)


def _fires(rule: Rule, ctx: Context) -> bool:
    spec = rule.spec
    return evaluate(ctx, spec["when"]) and not ("unless" in spec and evaluate(ctx, spec["unless"]))


def impact_ms(rule: Rule, ctx: Context) -> float | None:
    """ms per step the rule's impact metric attributes to the problem (times factors, times scale; the
    ``otherwise`` estimate where that metric is unknown), never more than the step itself."""
    value = _product(rule.spec["impact"], ctx)
    if value is None and "otherwise" in rule.spec["impact"]:
        value = _product(rule.spec["impact"]["otherwise"], ctx)
    step = as_number(ctx.resolve("step.time_ms"))
    return min(value, step) if value is not None and step else value


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


def _finding(rule: Rule, fired: dict[str, Context], explained: list[str], all_ranks: list[str],
             framework: str) -> dict[str, Any]:
    spec = rule.spec
    impacts = {key: impact_ms(rule, ctx) for key, ctx in fired.items()}
    rep_key = max(sorted(fired, key=_rank_key), key=lambda k: (impacts[k] is not None, impacts[k] or 0.0))
    rep = fired[rep_key]
    known = [v for v in impacts.values() if v is not None]
    impact = statistics.median(known) if known else None
    steps = [v for v in (as_number(c.resolve("step.time_ms")) for c in fired.values()) if v]
    step_ms = statistics.median(steps) if steps else None
    if impact is not None and step_ms:
        impact = min(impact, step_ms)  # no problem costs more than the whole step
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

    level, reasons = confidence(rule, list(fired.values()))
    knobs, already_set = _knobs(spec.get("knobs", []), rep, agg, impact, framework)
    next_step = None
    if already_set and "next_step" in spec:
        next_step = fill(spec["next_step"]["text"], agg)
        extra, more_set = _knobs(spec["next_step"].get("knobs", []), rep, agg, impact, framework)
        knobs.extend(k for k in extra if k not in knobs)
        already_set.update(more_set)
    summary = fill(spec["summary"], agg)
    if any("heuristic" in r for r in reasons):
        summary += " (parallel-group label: heuristic, low confidence)"
    guide = spec["guide"]
    return {
        "rule": rule.id,
        "severity": cap_severity(_severity(spec["severity"], fraction), list(fired.values())),
        "confidence": level,
        "confidence_reasons": reasons,
        "title": spec["title"],
        "summary": summary,
        "advice": _advice(spec.get("advice"), rep, agg),
        "ranks": ranks,
        "evidence": evidence,
        "impact_ms_per_step": None if impact is None else round(impact, 3),
        "impact_fraction": None if fraction is None else round(fraction, 4),
        "overlaps": [],
        "knobs_role": "fix" if framework in MEGATRON else "reference",
        "knobs": knobs,
        "guide": guide["section"],
        "guide_url": guide.get("url"),
        "already_set": already_set,
        "next_step": next_step,
    }


def _advice(spec: Any, rep: Context, agg: _Aggregate) -> str | None:
    """The framework-neutral fix: the rule's ``advice`` text, or the first of its ``{when, text}`` variants
    whose condition holds."""
    if spec is None:
        return None
    if isinstance(spec, str):
        return fill(spec, agg)
    for variant in spec:
        if evaluate(rep, variant.get("when")):
            return fill(variant["text"], agg)
    return None


def _knobs(specs: list[dict[str, Any]], rep: Context, agg: _Aggregate, impact: float | None,
           framework: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Knobs to recommend with their values computed on the run, and what is already set (knobs whose
    ``set_when`` holds are not repeated). Outside the Megatron frameworks a knob is a reference; one that
    only a Megatron framework has is not offered to a program that is not even PyTorch."""
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
        megatron_only = not knob.get("env")
        if framework == "unknown" and megatron_only:
            continue
        item = {key: knob.get(key) for key in KNOB_FIELDS}
        item["value"] = resolve_value(knob.get("value"), agg)
        if "flag_value" in knob:
            item["flag_value"] = resolve_value(knob["flag_value"], agg)
        for key in ("type", "python_import"):
            if key in knob:
                item[key] = knob[key]
        item["computed"] = isinstance(knob.get("value"), dict)
        if "what_if" in knob:
            item["what_if"] = {"expected_ms_per_step_saved": estimate(knob["what_if"], agg, _product, impact),
                               "how": fill(knob["what_if"]["how"], agg)}
        item["role"] = "fix" if framework in MEGATRON or (framework == "pytorch" and not megatron_only) else "reference"
        out.append(item)
    return out, already


def _product(spec: dict[str, Any], src: Any) -> float | None:
    """(``metric`` + ``plus``) x ``times`` x ``scale`` over values of ``src`` (the impact/what-if formula);
    an unknown term makes the sum unknown."""
    value = as_number(src.resolve(spec["metric"])) if spec.get("metric") else None
    for name in spec.get("plus", []):
        term = as_number(src.resolve(name))
        value = None if value is None or term is None else value + term
    for name in spec.get("times", []):
        factor = as_number(src.resolve(name))
        value = None if value is None or factor is None else value * factor
    return None if value is None else value * spec.get("scale", 1.0)


def _link_overlaps(findings: list[dict[str, Any]], rules: dict[str, Rule]) -> None:
    """Each finding names the other findings that explain the same time (declared either way round)."""
    fired = {f["rule"] for f in findings}
    for f in findings:
        declared = set(rules[f["rule"]].spec.get("overlaps", []))
        declared |= {rid for rid in fired if f["rule"] in rules[rid].spec.get("overlaps", [])}
        f["overlaps"] = sorted((declared & fired) - {f["rule"]})


def combined_impact_ms(findings: list[dict[str, Any]], step_ms: float | None) -> float | None:
    """ms per step all findings explain together: findings that overlap count once (the largest of each
    group of overlapping findings), and the total never exceeds the step."""
    impacts = {f["rule"]: f.get("impact_ms_per_step") for f in findings if f.get("impact_ms_per_step") is not None}
    if not impacts:
        return None
    parent = {rid: rid for rid in impacts}

    def root(r: str) -> str:
        while parent[r] != r:
            r = parent[r]
        return r

    for f in findings:
        for other in f.get("overlaps") or []:
            if f["rule"] in parent and other in parent:
                parent[root(f["rule"])] = root(other)
    groups: dict[str, float] = {}
    for rid, value in impacts.items():
        groups[root(rid)] = max(groups.get(root(rid), 0.0), value)
    total = sum(groups.values())
    return round(min(total, step_ms) if step_ms else total, 3)


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
