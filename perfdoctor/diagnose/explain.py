"""What ``perfdoctor rules`` and ``perfdoctor explain RULE`` print: the catalog as data and as text.

The text follows one fixed layout per rule (like ``ruff rule CODE``): what it detects and when it
fires, why it happens, how to fix it with a snippet per framework, what to do when the knob is already
set, how to verify the fix, and the guide section.
"""

from __future__ import annotations

from typing import Any

from perfdoctor.diagnose.rules import Rule

_OPS = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤", "eq": "=", "ne": "≠", "in": "in", "contains": "contains"}
FRAMEWORKS = (("megatron_bridge", "Megatron-Bridge (Python config)"), ("nemo", "NeMo 2 (recipe)"),
              ("megatron_lm", "Megatron-LM (command line)"), ("env", "Environment"))


def condition_text(cond: dict[str, Any], top: bool = True) -> str:
    """A condition as one readable line: ``a ≥ 0.05 and (b or not c)``."""
    for key, word in (("all", " and "), ("any", " or ")):
        if key in cond:
            text = word.join(condition_text(c, False) for c in cond[key])
            return text if top or len(cond[key]) == 1 else f"({text})"
    if "not" in cond:
        return f"not {condition_text(cond['not'], False)}"
    left = " × ".join(cond["metric"]) if isinstance(cond["metric"], list) else cond["metric"]
    if cond["op"] == "exists":
        return f"{left} is {'known' if cond.get('value', True) else 'unknown'}"
    value = cond.get("value")
    if isinstance(value, dict):
        scale = value.get("scale", 1.0)
        right = value["metric"] if scale == 1.0 else f"{scale:g} × {value['metric']}"
    else:
        right = repr(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)
    return f"{left} {_OPS[cond['op']]} {right}"


def severity_text(spec: dict[str, Any]) -> str:
    if "fixed" in spec:
        return spec["fixed"]
    text = f"high ≥ {spec['high'] * 100:g} % of the step, medium ≥ {spec['medium'] * 100:g} %, else low"
    return text + (f"; {spec['default']} when the impact is unknown" if "default" in spec else "")


def impact_text(spec: dict[str, Any]) -> str:
    if not spec.get("metric"):
        return "not estimated" + (f" ({spec['note']})" if spec.get("note") else "")
    head = " + ".join([spec["metric"], *spec.get("plus", [])])
    parts = [f"({head})" if spec.get("plus") and spec.get("times") else head, *spec.get("times", [])]
    text = " × ".join(parts)
    if spec.get("scale", 1.0) != 1.0:
        text += f" × {spec['scale']:g}"
    return text + " (ms per step)" + (f"; {spec['note']}" if spec.get("note") else "")


def rule_row(rule: Rule) -> dict[str, Any]:
    """One rule as data (``perfdoctor rules --format json``)."""
    spec = rule.spec
    return {
        "id": rule.id,
        "title": rule.title,
        "scope": rule.scope,
        "severity": severity_text(spec["severity"]),
        "impact": impact_text(spec["impact"]),
        "when": condition_text(spec["when"]),
        "guide": spec["guide"]["section"],
        "knobs": [k.get("megatron_bridge") or k.get("env") or k.get("megatron_lm") or k.get("nemo")
                  for k in spec["knobs"]],
        "source": str(rule.source),
        "builtin": rule.builtin,
    }


def explain_text(rule: Rule) -> str:
    """The full explanation of one rule, as plain text (Markdown-flavoured headings)."""
    spec, ex = rule.spec, rule.spec["explain"]
    out = [f"{rule.id}: {rule.title}", ""]
    out += [f"scope: {'per rank' if rule.scope == 'rank' else 'whole run'} · severity: "
            f"{severity_text(spec['severity'])} · impact: {impact_text(spec['impact'])}", ""]
    out += ["## What it detects", ex["detects"].strip(), "", f"Fires when: {condition_text(spec['when'])}"]
    if "unless" in spec:
        out.append(f"Unless: {condition_text(spec['unless'])}")
    if spec.get("supersedes"):
        out.append(f"Root cause of: {', '.join(spec['supersedes'])} (their findings on the same ranks are folded in)")
    if spec.get("overlaps"):
        out.append(f"Explains the same time as: {', '.join(spec['overlaps'])} (impacts are not added)")
    if ex.get("needs"):
        out += ["", f"Needs: {ex['needs'].strip()}"]
    out += ["", "## Why it happens", ex["why"].strip(), "", "## How to fix it"]
    advice = spec.get("advice")
    for variant in ([{"text": advice}] if isinstance(advice, str) else advice or []):
        when = f"If {condition_text(variant['when'])}: " if "when" in variant else ""
        out.append(when + variant["text"].strip())
    if advice:
        out += ["", "Megatron knobs (the fix for Megatron-Bridge / NeMo 2 / Megatron-LM runs, a reference otherwise):"]
    for knob in spec["knobs"]:
        out.append("- " + _knob_line(knob))
    for key, label in FRAMEWORKS:
        if ex["fix"].get(key):
            out += ["", f"### {label}", _indent(ex["fix"][key].rstrip())]
    if "next_step" in spec:
        out += ["", "## If the knob is already set", spec["next_step"]["text"].strip()]
        for knob in spec["next_step"].get("knobs", []):
            out.append("- " + _knob_line(knob))
    out += ["", "## How to verify", ex["verify"].strip(), "", "## Guide", spec["guide"]["section"]]
    if spec["guide"].get("url"):
        out.append(spec["guide"]["url"])
    return "\n".join(out) + "\n"


def _knob_line(knob: dict[str, Any]) -> str:
    bits = [f"{label.split(' (')[0]}: {knob[key]}" for key, label in FRAMEWORKS if knob.get(key)]
    line = "; ".join(bits)
    line += f" → {_value_text(knob.get('value'), knob)}"
    if "flag_value" in knob:
        line += f" (Megatron-LM: {_value_text(knob['flag_value'], knob)})"
    if knob.get("note"):
        line += f" ({knob['note']})"
    if knob.get("what_if"):
        line += f"; what-if: {knob['what_if']['how']}"
    return line


def _value_text(value: Any, knob: dict[str, Any]) -> str:
    """A knob's value as the rule gives it: a literal, a computation over the run, or a typed placeholder."""
    if isinstance(value, dict):
        return f"computed from the run ({value['compute']}), else <{knob.get('type', 'value')}>"
    if value is None:
        return f"<{knob.get('type', 'value')}>"
    return str(value)


def _indent(text: str) -> str:
    return "\n".join("    " + line if line else "" for line in text.splitlines())
