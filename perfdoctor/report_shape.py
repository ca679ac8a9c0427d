"""Is a saved JSON report something ``perfdoctor diff`` can do arithmetic on? Checked before any of it.

The shape is the shipped JSON Schema (``perfdoctor/schema/report.schema.json``), applied by the small
subset of JSON Schema it uses (``type``, ``properties``, ``additionalProperties``, ``items``, ``enum``,
``const``, ``minimum``, ``$ref`` into ``$defs``): the ``jsonschema`` package costs 80-200 ms of import,
more than half of the CLI's start-up budget, for a check that takes 7 ms here for a 4-rank report
(0.27 s for 1,000 ranks, 9 MiB). Keys a
report lacks are not required (a report saved by an older perfdoctor, or trimmed by hand, is compared
on what it holds); what it holds must have the schema's type. On top of the schema:

- every number is finite and below 2**63 in magnitude (a report's largest honest number is a UTC
  timestamp in ns, about 2**61), so sums, products and differences of two of them stay finite;
- the parts of ``devices`` that perfdoctor.diff_basis reads (``step_source``, ``evidence.work``) have
  the types it reads them as.
"""

from __future__ import annotations

import json
import math
from functools import cache
from importlib.resources import files
from typing import Any

from perfdoctor.errors import shown, shown_key

NUMBER_LIMIT = 2.0**63
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
WORK = {"type": "object", "properties": {
    "kernels": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "integer",
                                                                                      "minimum": 0}}},
    "steps": {"type": "number", "minimum": 0}, "span_ns": {"type": "number", "minimum": 0}}}
DEVICE = {"type": "object", "properties": {"step_source": {"type": ["string", "null"]},
                                           "evidence": {"type": "object", "properties": {"work": WORK}}}}


def report_problem(report: dict[str, Any]) -> str | None:
    """Where and how ``report`` departs from the report schema (one line), or None."""
    schema = _schema()
    problem = _check({**report, "schema_version": str(report.get("schema_version"))}, schema, schema, "")
    if problem is None:
        for i, device in enumerate(report.get("devices") or []):
            if problem := _check(device, DEVICE, schema, f"devices.{i}"):
                break
            work = (device.get("evidence") or {}).get("work")
            bad = next((k for k, v in (work or {}).get("kernels", {}).items() if len(v) != 2), None)
            if bad is not None:
                return f"devices.{i}.evidence.work.kernels.{shown_key(bad)}: expected [count, ns]"
    return problem


@cache
def _schema() -> dict[str, Any]:
    return json.loads(files("perfdoctor").joinpath("schema/report.schema.json").read_text())


def _check(value: Any, node: dict[str, Any], root: dict[str, Any], where: str) -> str | None:
    if "$ref" in node:
        node = root["$defs"][node["$ref"].rsplit("/", 1)[1]]
    here = where or "the report"
    if "const" in node and value != node["const"]:
        return f"{here}: expected {node['const']!r}, got {shown(value)}"
    if "enum" in node and not any(value == e and type(value) is type(e) for e in node["enum"]):
        return f"{here}: expected one of {', '.join(map(json.dumps, node['enum']))}, got {shown(value)}"
    if "type" in node:
        types = [node["type"]] if isinstance(node["type"], str) else node["type"]
        if not any(_is(value, t) for t in types):
            return f"{here}: expected {' or '.join(types)}, got {shown(value)}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not (math.isfinite(value) and abs(value) < NUMBER_LIMIT):
            return f"{here}: {shown(value)} is not a number perfdoctor writes (finite, below 2**63)"
        if "minimum" in node and value < node["minimum"]:
            return f"{here}: expected at least {node['minimum']}, got {shown(value)}"
    if isinstance(value, dict):
        properties, extra = node.get("properties", {}), node.get("additionalProperties")
        for key, item in value.items():
            sub = properties.get(key, extra if isinstance(extra, dict) else None)
            at = f"{where}.{shown_key(key)}" if where else shown_key(key)
            if sub is not None and (problem := _check(item, sub, root, at)):
                return problem
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for i, item in enumerate(value):
            if problem := _check(item, node["items"], root, f"{where}.{i}"):
                return problem
    return None


def _is(value: Any, kind: str) -> bool:
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
    return isinstance(value, _TYPES[kind])
