"""Load and validate rule files: the shipped catalog (``perfdoctor.rules``) plus user ``--rules DIR``s.

Every file is checked twice: against ``perfdoctor/schema/rule.schema.json`` (shape and types) and then
for meaning (the id matches the file name, every name resolves in a known namespace, placeholders in
texts name readable values, superseded rules exist). A bad file is one line, ``file: field: problem``,
raised as :class:`RuleError` (exit 2), so a typo in a user rule never passes silently as a rule that
cannot fire.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from perfdoctor.diagnose.conditions import NAMESPACES
from perfdoctor.errors import InputError

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.]*)\}")
# Values a text template may name besides the namespaces (filled in by the finding itself).
SPECIAL_NAMES = ("impact_ms", "impact_percent", "ranks", "step_ms")


class RuleError(InputError):
    """A rule file or rules directory that cannot be used (exit 2)."""


@dataclass(frozen=True)
class Rule:
    """One validated rule; ``spec`` is the parsed YAML (see rules/README.md for the fields)."""

    id: str
    source: Path
    spec: dict[str, Any]

    @property
    def title(self) -> str:
        return self.spec["title"]

    @property
    def scope(self) -> str:
        return self.spec.get("scope", "rank")

    @property
    def builtin(self) -> bool:
        return self.source.parent == builtin_dir()


def builtin_dir() -> Path:
    """The shipped catalog: the ``perfdoctor.rules`` resource package of an installed wheel, or the
    ``rules/`` folder of a source checkout (editable installs do not map it into the package)."""
    try:
        return Path(str(resources.files("perfdoctor.rules")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "rules"

# libyaml's safe loader when PyYAML was built with it (10x faster on the catalog); same safe subset.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@cache
def _validator() -> Draft202012Validator:
    schema_path = Path(__file__).resolve().parents[1] / "schema" / "rule.schema.json"
    return Draft202012Validator(json.loads(schema_path.read_text()))


@cache
def known_metrics() -> frozenset[str]:
    """Metric keys a rule may name (the JSON report's ``metrics``)."""
    from perfdoctor.measure.metrics import METRIC_KEYS

    return frozenset(METRIC_KEYS)


def load_rules(extra_dirs: list[Path | str] | None = None) -> list[Rule]:
    """The shipped rules plus those of ``extra_dirs``, sorted by id; raises :class:`RuleError`."""
    files = sorted(builtin_dir().glob("*.yaml"))
    for d in extra_dirs or []:
        d = Path(d)
        if not d.is_dir():
            raise RuleError(f"{d}: rules directory not found")
        found = sorted(d.glob("*.yaml")) + sorted(d.glob("*.yml"))
        if not found:
            raise RuleError(f"{d}: no *.yaml rule files")
        files.extend(found)
    rules: dict[str, Rule] = {}
    for path in files:
        rule = load_rule(path)
        if rule.id in rules:
            raise RuleError(f"{path}: id: duplicate rule id {rule.id!r} (also {rules[rule.id].source})")
        rules[rule.id] = rule
    for rule in rules.values():
        for i, other in enumerate(rule.spec.get("supersedes", [])):
            if other not in rules:
                raise RuleError(f"{rule.source}: supersedes.{i}: unknown rule {other!r}")
    return sorted(rules.values(), key=lambda r: r.id)


def load_rule(path: Path) -> Rule:
    """Parse and validate one rule file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        spec = yaml.load(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "<yaml>"
        raise RuleError(f"{path}: {where}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    if not isinstance(spec, dict):
        raise RuleError(f"{path}: <top>: a rule file must be a mapping")
    error = best_match(_validator().iter_errors(spec))
    if error is not None:
        field = ".".join(str(p) for p in error.absolute_path) or "<top>"
        raise RuleError(f"{path}: {field}: {_short(error.message)}")
    if spec["id"] != path.stem:
        raise RuleError(f"{path}: id: {spec['id']!r} does not match the file name ({path.stem!r})")
    for field, name in _names(spec):
        if problem := _name_problem(name):
            raise RuleError(f"{path}: {field}: {problem}")
    for field, text in _texts(spec):
        for name in PLACEHOLDER.findall(text):
            if name not in SPECIAL_NAMES and (problem := _name_problem(name)):
                raise RuleError(f"{path}: {field}: placeholder {{{name}}}: {problem}")
    if spec.get("ranks_from") and spec.get("scope", "rank") != "run":
        raise RuleError(f"{path}: ranks_from: only meaningful with scope: run")
    return Rule(id=spec["id"], source=path, spec=spec)


def _short(message: str) -> str:
    first = message.splitlines()[0]
    return first if len(first) <= 160 else first[:157] + "..."


def _name_problem(name: str) -> str | None:
    head, _, rest = name.partition(".")
    if head in NAMESPACES:
        return None if rest else f"{name!r} needs a key after '{head}.'"
    if name in known_metrics():
        return None
    return (f"unknown metric {name!r} (metric keys are listed by `perfdoctor rules --metrics`; "
            f"other names start with {', '.join(n + '.' for n in NAMESPACES)})")


def _conditions(spec: dict[str, Any]) -> list[tuple[str, Any]]:
    out = [(key, spec[key]) for key in ("when", "unless") if key in spec]
    knob_lists = [("knobs", spec.get("knobs", []))]
    if "next_step" in spec:
        knob_lists.append(("next_step.knobs", spec["next_step"].get("knobs", [])))
    for prefix, knobs in knob_lists:
        for i, knob in enumerate(knobs):
            out.extend((f"{prefix}.{i}.{key}", knob[key]) for key in ("when", "set_when") if key in knob)
    return out


def _names(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, name) for every name the rule reads."""
    out: list[tuple[str, str]] = []

    def walk(field: str, cond: Any) -> None:
        for key in ("all", "any"):
            for i, sub in enumerate(cond.get(key, [])):
                walk(f"{field}.{key}.{i}", sub)
        if "not" in cond:
            walk(f"{field}.not", cond["not"])
        if "metric" in cond:
            refs = cond["metric"] if isinstance(cond["metric"], list) else [cond["metric"]]
            out.extend((f"{field}.metric", r) for r in refs)
            if isinstance(cond.get("value"), dict):
                out.append((f"{field}.value.metric", cond["value"]["metric"]))

    for field, cond in _conditions(spec):
        walk(field, cond)
    impact = spec["impact"]
    if impact.get("metric"):
        out.append(("impact.metric", impact["metric"]))
    out.extend((f"impact.times.{i}", n) for i, n in enumerate(impact.get("times", [])))
    otherwise = impact.get("otherwise", {})
    if otherwise.get("metric"):
        out.append(("impact.otherwise.metric", otherwise["metric"]))
    out.extend((f"impact.otherwise.times.{i}", n) for i, n in enumerate(otherwise.get("times", [])))
    out.extend((f"evidence.{i}", n) for i, n in enumerate(spec.get("evidence", [])))
    if spec.get("ranks_from"):
        out.append(("ranks_from", spec["ranks_from"]))
    return out


def _texts(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, text) for every template the finding fills in."""
    out = [("summary", spec["summary"])]
    if "next_step" in spec:
        out.append(("next_step.text", spec["next_step"]["text"]))
    for i, knob in enumerate(spec.get("knobs", [])):
        out.extend((f"knobs.{i}.set_shows.{k}", v) for k, v in knob.get("set_shows", {}).items())
    return out
