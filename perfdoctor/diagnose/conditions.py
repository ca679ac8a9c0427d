"""Rule conditions are data, evaluated here: ``all``/``any``/``not`` over comparisons of named values.

A name resolves in one of five namespaces (DESIGN §6): a metric key (``comm.dp.exposed_fraction``),
``config.<key>`` (run configuration), ``env.<NAME>`` (environment captured in the trace),
``evidence.<topic>.<field>`` (per-device evidence) or ``device.<field>`` (GPU properties of the rank).
A missing value makes every comparison false (only ``exists`` can see it), so a rule never fires on
something the trace could not measure. Nothing here evaluates code: operators are a fixed table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

NAMESPACES = ("config", "env", "evidence", "device")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass
class Context:
    """The values one rule evaluation can see: one rank's (or the run's) metrics plus config, env, evidence."""

    metrics: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)
    device: dict[str, Any] = field(default_factory=dict)

    def resolve(self, name: str) -> Any:
        """Value of ``name`` or ``None`` when the trace does not carry it."""
        head, _, rest = name.partition(".")
        if head == "config" and rest:
            return self.config.get(rest)
        if head == "env" and rest:
            return self.env.get(rest)
        if head in ("evidence", "device") and rest:
            value: Any = self.evidence if head == "evidence" else self.device
            for part in rest.split("."):
                if not isinstance(value, dict):
                    return None
                value = value.get(part)
            return value
        return self.metrics.get(name)

    def value(self, ref: str | list[str]) -> Any:
        """A name's value, or the product of several (``[config.tp, config.cp]``)."""
        if isinstance(ref, str):
            return self.resolve(ref)
        product = 1.0
        for name in ref:
            number = as_number(self.resolve(name))
            if number is None:
                return None
            product *= number
        return product


def as_number(value: Any) -> float | None:
    """Numbers, and strings that spell one (captured env values are strings: ``"16"``)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
        return None if math.isnan(number) else number
    return None


def _as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    return None


def _equal(left: Any, right: Any) -> bool:
    if isinstance(left, bool) or isinstance(right, bool):
        a, b = _as_bool(left), _as_bool(right)
        return a is not None and a == b
    a, b = as_number(left), as_number(right)
    if a is not None and b is not None:
        return a == b
    return str(left) == str(right)


def _order(op: str, left: Any, right: Any) -> bool:
    a, b = as_number(left), as_number(right)
    if a is None or b is None:
        return False
    return {"gt": a > b, "ge": a >= b, "lt": a < b, "le": a <= b}[op]


def _right(ctx: Context, value: Any) -> tuple[bool, Any]:
    """The comparison's right-hand side: a constant, or another name's value times ``scale``."""
    if isinstance(value, dict):
        number = as_number(ctx.resolve(value["metric"]))
        if number is None:
            return False, None
        return True, number * value.get("scale", 1.0)
    return True, value


def compare(ctx: Context, cmp: dict[str, Any]) -> bool:
    op = cmp["op"]
    left = ctx.value(cmp["metric"])
    if op == "exists":
        return (left is not None) == bool(cmp.get("value", True))
    if left is None:
        return False
    known, right = _right(ctx, cmp.get("value"))
    if not known:
        return False
    if op in ("gt", "ge", "lt", "le"):
        return _order(op, left, right)
    if op == "eq":
        return _equal(left, right)
    if op == "ne":
        return not _equal(left, right)
    if op == "in":
        return any(_equal(left, item) for item in (right if isinstance(right, list) else [right]))
    if op == "contains":
        if isinstance(left, (list, dict)):
            return any(_equal(item, right) for item in left)
        return str(right) in str(left)
    raise ValueError(f"unknown operator {op!r}")  # the schema admits none other


def evaluate(ctx: Context, cond: dict[str, Any] | None) -> bool:
    """True when ``cond`` holds in ``ctx`` (an absent condition holds)."""
    if cond is None:
        return True
    if "all" in cond:
        return all(evaluate(ctx, c) for c in cond["all"])
    if "any" in cond:
        return any(evaluate(ctx, c) for c in cond["any"])
    if "not" in cond:
        return not evaluate(ctx, cond["not"])
    return compare(ctx, cond)


def names(cond: dict[str, Any] | None) -> list[str]:
    """Every name a condition reads, in order, without repeats (the evidence a finding shows)."""
    out: list[str] = []

    def walk(c: dict[str, Any] | None) -> None:
        if not c:
            return
        for key in ("all", "any"):
            for sub in c.get(key, []):
                walk(sub)
        if "not" in c:
            walk(c["not"])
        if "metric" in c:
            refs = c["metric"] if isinstance(c["metric"], list) else [c["metric"]]
            if isinstance(c.get("value"), dict):
                refs = [*refs, c["value"]["metric"]]
            for ref in refs:
                if ref not in out:
                    out.append(ref)

    walk(cond)
    return out
