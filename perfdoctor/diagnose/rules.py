"""Load and validate rule files: the shipped catalog (``perfdoctor.rules``) plus user ``--rules DIR``s.

Every file is checked for meaning (the id matches the file name, every name resolves in a known
namespace, placeholders in texts name readable values, superseded rules exist); user files are first
checked against ``perfdoctor/schema/rule.schema.json`` (shape and types). The shipped catalog is
validated against that schema by the tests (tests/diagnose/test_shipped_rules_schema.py), so ``perfdoctor
analyze`` only checks its top-level keys instead of importing jsonschema and walking the schema on every
run. A bad file is one line, ``file: field: problem``, raised as :class:`RuleError` (exit 2), so a typo
in a user rule never passes silently as a rule that cannot fire.

An installed perfdoctor also ships ``catalog.json`` beside the rule files: every shipped rule parsed
once when the wheel was built (``setup.py``), with a checksum of its YAML. A rule whose file still has
that checksum is taken from it (one JSON read instead of 25 YAML parses, ~20 ms of every run); any
other file, and every rule of a source checkout (which has no catalog), is parsed from its YAML.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfdoctor.diagnose.conditions import NAMESPACES
from perfdoctor.diagnose.knob_values import COMPUTE, ESTIMATE, literal_problem
from perfdoctor.errors import InputError

if TYPE_CHECKING:  # importlib.resources.abc is 3.11+; only the annotations name it
    from importlib.resources.abc import Traversable

CATALOG = "catalog.json"  # written by setup.py into the built package; see the module docstring
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.]*)\}")
# Values a text template may name besides the namespaces (filled in by the finding itself).
SPECIAL_NAMES = ("impact_ms", "impact_percent", "ranks", "step_ms")


class RuleError(InputError):
    """A rule file or rules directory that cannot be used (exit 2)."""


@dataclass(frozen=True)
class Rule:
    """One validated rule; ``spec`` is the parsed YAML (see rules/README.md for the fields)."""

    id: str
    source: Traversable  # a Path for user rules; inside the installed package for the shipped ones
    spec: dict[str, Any]
    builtin: bool = False

    @property
    def title(self) -> str:
        return self.spec["title"]

    @property
    def scope(self) -> str:
        return self.spec.get("scope", "rank")


def builtin_dir() -> Traversable:
    """The shipped catalog, read as a Traversable so that it works from a wheel, a zip or an editable
    install: ``rules/`` inside the installed package, or the top-level ``rules/`` of a source checkout.
    (Reached from the regular package ``perfdoctor``: the namespace package ``perfdoctor.rules`` is a
    MultiplexedPath, which is no directory once zipped and whose ``str`` is no path.)"""
    shipped = resources.files("perfdoctor").joinpath("rules")
    return shipped if shipped.is_dir() else Path(__file__).resolve().parents[2] / "rules"


@cache
def _validator() -> Any:
    from jsonschema import Draft202012Validator

    return Draft202012Validator(_schema())


@cache
def known_metrics() -> frozenset[str]:
    """Metric keys a rule may name (the JSON report's ``metrics``)."""
    from perfdoctor.blame.causes import BLOCKING_KEYS
    from perfdoctor.measure.metrics import METRIC_KEYS

    return frozenset(METRIC_KEYS) | frozenset(BLOCKING_KEYS)


def load_rules(extra_dirs: list[Path | str] | None = None) -> list[Rule]:
    """The shipped rules plus those of ``extra_dirs``, sorted by id; raises :class:`RuleError`."""
    shipped = sorted((f for f in builtin_dir().iterdir() if f.name.endswith(".yaml")), key=lambda f: f.name)
    files: list[tuple[Traversable, bool]] = [(f, True) for f in shipped]
    for d in extra_dirs or []:
        d = Path(d)
        if not d.is_dir():
            raise RuleError(f"{d}: rules directory not found")
        found = sorted(d.glob("*.yaml")) + sorted(d.glob("*.yml"))
        if not found:
            raise RuleError(f"{d}: no *.yaml rule files")
        files.extend((f, False) for f in found)
    rules: dict[str, Rule] = {}
    parsed = _catalog()
    for path, builtin in files:
        rule = load_rule(path, builtin, schema_checked=builtin, parsed=parsed if builtin else None)
        if rule.id in rules:
            raise RuleError(f"{path}: id: duplicate rule id {rule.id!r} (also {rules[rule.id].source})")
        rules[rule.id] = rule
    for rule in rules.values():
        for key in ("supersedes", "overlaps"):
            for i, other in enumerate(rule.spec.get(key, [])):
                if other not in rules:
                    raise RuleError(f"{rule.source}: {key}.{i}: unknown rule {other!r}")
    return sorted(rules.values(), key=lambda r: r.id)


def load_rule(path: Traversable, builtin: bool = False, *, schema_checked: bool = False,
              parsed: dict[str, Any] | None = None) -> Rule:
    """Parse and validate one rule file; ``schema_checked``: a shipped rule, whose shape the tests
    validated against the schema, so only the checks of meaning run (no jsonschema import at start-up).
    ``parsed``: the shipped catalog (:func:`_catalog`), used where it holds this very file's text."""
    # A user's rule is read within bounds (size, depth, aliases, regular files only); a shipped one is
    # part of the package the tests checked, and parsing it once more to bound it costs start-up.
    if schema_checked:
        raw = path.read_bytes()
        entry = (parsed or {}).get(path.name)
        if isinstance(entry, dict) and entry.get("crc32") == zlib.crc32(raw):
            spec = entry["spec"]
        else:
            from perfdoctor.safe_yaml import load_trusted_yaml

            spec = load_trusted_yaml(raw.decode("utf-8"))
    else:
        from perfdoctor.safe_yaml import load_yaml_file

        spec = load_yaml_file(path, error=RuleError)
    if not isinstance(spec, dict):
        raise RuleError(f"{path}: <top>: a rule file must be a mapping")
    if schema_checked:
        _check_keys(path, spec)
    else:
        _check_schema(path, spec)
    stem = Path(path.name).stem
    if spec["id"] != stem:
        raise RuleError(f"{path}: id: {spec['id']!r} does not match the file name ({stem!r})")
    for field, name in _names(spec):
        if problem := _name_problem(name):
            raise RuleError(f"{path}: {field}: {problem}")
    for field, text in _texts(spec):
        for name in PLACEHOLDER.findall(text):
            if name not in SPECIAL_NAMES and (problem := _name_problem(name)):
                raise RuleError(f"{path}: {field}: placeholder {{{name}}}: {problem}")
    for field, problem in _knob_problems(spec):
        raise RuleError(f"{path}: {field}: {problem}")
    if spec.get("ranks_from") and spec.get("scope", "rank") != "run":
        raise RuleError(f"{path}: ranks_from: only meaningful with scope: run")
    return Rule(id=spec["id"], source=path, spec=spec, builtin=builtin)


def _catalog() -> dict[str, Any]:
    """The shipped rules as parsed at build time, by file name (``{"crc32": …, "spec": …}``); empty in a
    source checkout, or where the file cannot be read as the catalog (then every rule is parsed)."""
    try:
        data = json.loads(builtin_dir().joinpath(CATALOG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _check_keys(path: Path, spec: dict[str, Any]) -> None:
    """The cheap structural check of a shipped rule: the top-level keys the schema requires."""
    for key in _schema()["required"]:
        if key not in spec:
            raise RuleError(f"{path}: <top>: {key!r} is a required property")


@cache
def _schema() -> dict[str, Any]:
    return json.loads(resources.files("perfdoctor").joinpath("schema", "rule.schema.json").read_text(encoding="utf-8"))


def _check_schema(path: Path, spec: dict[str, Any]) -> None:
    from jsonschema.exceptions import best_match

    error = best_match(_validator().iter_errors(spec))
    if error is not None:
        field = ".".join(str(p) for p in error.absolute_path) or "<top>"
        raise RuleError(f"{path}: {field}: {_short(error.message)}")


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


def _knob_list(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = [(f"knobs.{i}", k) for i, k in enumerate(spec.get("knobs", []))]
    if "next_step" in spec:
        out += [(f"next_step.knobs.{i}", k) for i, k in enumerate(spec["next_step"].get("knobs", []))]
    return out


def _knob_problems(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """Knob values that are not literals of the knob's type, unknown computations, a placeholder
    without a type."""
    out = []
    for field, knob in _knob_list(spec):
        for key in ("value", "flag_value"):
            if key not in knob:
                continue
            value = knob[key]
            if isinstance(value, dict):
                if value["compute"] not in COMPUTE:
                    out.append((f"{field}.{key}.compute", f"unknown computation {value['compute']!r} "
                                f"(known: {', '.join(sorted(COMPUTE))})"))
                elif "type" not in knob:
                    out.append((f"{field}.type", "a computed value needs a type (its placeholder when unknown)"))
            elif (problem := literal_problem(value, knob.get("type") if key == "value" else None)):
                out.append((f"{field}.{key}", problem))
        if knob.get("value") is None and "type" not in knob:
            out.append((f"{field}.type", "a knob without a value needs a type (its placeholder)"))
        what_if = knob.get("what_if") or {}
        if "compute" in what_if and what_if["compute"] not in ESTIMATE:
            out.append((f"{field}.what_if.compute", f"unknown estimate {what_if['compute']!r} "
                        f"(known: {', '.join(sorted(ESTIMATE))})"))
    return out


def _conditions(spec: dict[str, Any]) -> list[tuple[str, Any]]:
    out = [(key, spec[key]) for key in ("when", "unless") if key in spec]
    knob_lists = [("knobs", spec.get("knobs", []))]
    if "next_step" in spec:
        knob_lists.append(("next_step.knobs", spec["next_step"].get("knobs", [])))
    for prefix, knobs in knob_lists:
        for i, knob in enumerate(knobs):
            out.extend((f"{prefix}.{i}.{key}", knob[key]) for key in ("when", "set_when") if key in knob)
    if isinstance(spec.get("advice"), list):
        out.extend((f"advice.{i}.when", v["when"]) for i, v in enumerate(spec["advice"]) if "when" in v)
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
    for part in ("plus", "times"):
        out.extend((f"impact.{part}.{i}", n) for i, n in enumerate(impact.get(part, [])))
    otherwise = impact.get("otherwise", {})
    if otherwise.get("metric"):
        out.append(("impact.otherwise.metric", otherwise["metric"]))
    for part in ("plus", "times"):
        out.extend((f"impact.otherwise.{part}.{i}", n) for i, n in enumerate(otherwise.get(part, [])))
    out.extend((f"evidence.{i}", n) for i, n in enumerate(spec.get("evidence", [])))
    for field, knob in _knob_list(spec):
        what_if = knob.get("what_if") or {}
        if what_if.get("metric"):
            out.append((f"{field}.what_if.metric", what_if["metric"]))
        for part in ("plus", "times"):
            out.extend((f"{field}.what_if.{part}.{i}", n) for i, n in enumerate(what_if.get(part, [])))
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
    for field, knob in _knob_list(spec):
        if "what_if" in knob:
            out.append((f"{field}.what_if.how", knob["what_if"]["how"]))
    advice = spec.get("advice")
    if isinstance(advice, str):
        out.append(("advice", advice))
    elif isinstance(advice, list):
        out.extend((f"advice.{i}.text", v["text"]) for i, v in enumerate(advice))
    return out
