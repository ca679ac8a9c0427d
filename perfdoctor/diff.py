"""Compare two analyses (BASE → HEAD): metric deltas judged against noise, and what changed in findings.

Both sides are JSON report dicts (DESIGN §5), made from traces by ``api.diff`` or read from saved
reports. A metric delta is *significant* only when it exceeds ``K`` times the noise of the two medians
and an absolute and relative floor: the noise is the standard error of the median of the per-step
series in the report's ``series`` (1.2533·σ/√n per rank, median over ranks, the two sides added in
quadrature), so step-to-step jitter of a run is never called a regression. Fractions of the step
borrow the noise of their ms counterpart divided by the step time; metrics without any series are
judged by wider floors alone (10 %, or 2 points of a fraction).

Steps decide what can be compared (perfdoctor.diff_basis): two captures without step markers or periodic
iterations are compared per unit of work (time per GEMM launch replaces step time and
totals are divided by the units each side ran), or declared not comparable, never "no change". A
finding that no longer fires is *resolved* only when the metric behind it (its rule's impact metric)
improved beyond noise; otherwise it is listed as gone but not resolved, with the reason.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfdoctor.diff_basis import Basis, choose_basis, is_total, work_note
from perfdoctor.errors import InputError
from perfdoctor.load.file_kind import foreign_format
from perfdoctor.report_shape import report_problem
from perfdoctor.safe_yaml import load_json_file

K = 3.0  # noise multiples a delta must exceed
REL_FLOOR = 0.02  # of the larger of the two values
ABS_FLOOR = {"ms": 0.05, "fraction": 0.005, "us": 1.0, "bytes": float(2**20), "count": 0.5}
# Without a per-step series there is no noise estimate: such metrics (kernel shares, launch statistics,
# rank spread) move by several % between seeds of one configuration, so they need a wider margin.
UNMEASURED_REL_FLOOR = 0.10
UNMEASURED_ABS_FLOOR = {**ABS_FLOOR, "fraction": 0.02}
# Direction of "worse" per metric family (prefix match); others are just "changed".
WORSE_IF_HIGHER = re.compile(r"^(step\.time|work\.unit_ms|comm\.(\w+\.)?exposed|host\.|pipeline\."
                             r"(bubble_ms|bubble_fraction$|warmup|steady|stage_imbalance)|ln\.|kernels\.unfused|memcpy\.exposed|tp\.serialized"
                             r"|ranks\.step_time_spread)")
BETTER_IF_HIGHER = re.compile(r"^(mfu|model\.tflops|gpu\.busy)")
NOT_COMPARED = ("ranks.slowest", "pipeline.bubble_fraction_theory")
UNIT_TIME = "work.unit_ms"  # per unit of work (perfdoctor.diff_basis): wall time per unit, in place of step time
MAX_REPORT_BYTES = 256 << 20  # a saved report of a 1,000-rank run is a few MB


@dataclass(frozen=True)
class MetricDelta:
    key: str
    base: float
    head: float
    noise: float | None  # standard error of the difference, when per-step series give one
    threshold: float  # |delta| must exceed this to be significant
    significant: bool
    verdict: str  # worse | better | changed | same

    @property
    def delta(self) -> float:
        return self.head - self.base

    @property
    def relative(self) -> float | None:
        return self.delta / abs(self.base) if self.base else None


@dataclass
class Diff:
    base_label: str
    head_label: str
    step: MetricDelta | None  # step time; per unit of work, time per unit (work.unit_ms); None: not comparable
    metrics: list[MetricDelta]
    new_findings: list[dict[str, Any]] = field(default_factory=list)
    resolved_findings: list[dict[str, Any]] = field(default_factory=list)
    changed_findings: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    basis: Basis = field(default_factory=lambda: Basis("steps"))
    # Findings that no longer fire although the metric behind them did not improve beyond noise (the rule
    # stopped firing for another reason, e.g. less work fitted into the window): (finding, why)
    gone_findings: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    base_all: dict[str, Any] = field(default_factory=dict)  # metrics.all of each side, for charts
    head_all: dict[str, Any] = field(default_factory=dict)
    # (report dict, RunTrace or None) of the base and the head, kept only for the Perfetto timeline
    sides: list[tuple[dict[str, Any], Any]] = field(default_factory=list)

    @property
    def step_regression_pct(self) -> float:
        """Significant increase of the median step time, in % of the base; 0 when none."""
        s = self.step
        if s is None or not s.significant or s.delta <= 0 or not s.base:
            return 0.0
        return 100.0 * s.delta / s.base

    @property
    def significant(self) -> list[MetricDelta]:
        return [m for m in self.metrics if m.significant]


def compare(base: dict[str, Any], head: dict[str, Any], base_label: str = "base", head_label: str = "head",
            impact_metrics: dict[str, str] | None = None) -> Diff:
    """The diff of two JSON report dicts, on the basis their steps allow (perfdoctor.diff_basis).

    ``impact_metrics`` maps a rule id to the metric behind its findings (the rule's ``impact.metric``):
    a finding is *resolved* only when that metric improved beyond noise."""
    b_all, h_all = base.get("metrics", {}).get("all", {}), head.get("metrics", {}).get("all", {})
    b_noise, h_noise = _noise(base), _noise(head)
    step_b, step_h = b_all.get("step.time_ms"), h_all.get("step.time_ms")
    basis = choose_basis(base, head)
    per_unit = basis.kind == "per unit of work"
    scale_b, scale_h = (basis.base_units or 1.0, basis.head_units or 1.0) if per_unit else (1.0, 1.0)
    deltas = []
    if per_unit:  # a single window per rank: no per-step series, so floors only
        deltas.append(_delta(UNIT_TIME, float(basis.base_unit_ms or 0.0), float(basis.head_unit_ms or 0.0), None))
    for key in sorted(set(b_all) | set(h_all)):
        b, h = b_all.get(key), h_all.get(key)
        if key in NOT_COMPARED or not _number(b) or not _number(h) or not _compared(key, basis):
            continue
        nb, nh = _metric_noise(key, b_noise, step_b), _metric_noise(key, h_noise, step_h)
        if per_unit and is_total(key):  # per-window totals → per unit of work
            b, h = b / scale_b, h / scale_h
            nb, nh = (None if nb is None else nb / scale_b), (None if nh is None else nh / scale_h)
        deltas.append(_delta(key, float(b), float(h), _combined(nb, nh)))
    step_key = UNIT_TIME if per_unit else "step.time_ms"
    notes = []
    if per_unit:
        notes.append(f"compared per unit of work ({basis.unit}) because {basis.reason}; every *_ms and per-step total "
                     f"is per unit of work on both sides ({basis.base_units:,.1f} units per window in base, "
                     f"{basis.head_units:,.1f} in head)")
    elif not basis.comparable:
        notes.append("the runs are not comparable: step time and per-step totals are not compared, only shares of "
                     "the window and per-kernel statistics")
    elif (note := work_note(basis)) is not None:
        notes.append(note)
    for label, rep in ((base_label, base), (head_label, head)):
        counts = rep.get("steps", {}).get("count")
        if counts is not None and counts < 2:
            notes.append(f"{label} has {counts} step(s): no noise estimate from step variance, floors only")
    if base.get("run", {}).get("config") != head.get("run", {}).get("config"):
        notes.append("the two runs have different parallel/model configurations")
    diff = Diff(base_label, head_label, next((d for d in deltas if d.key == step_key), None), deltas,
                notes=notes, basis=basis, base_all=b_all, head_all=h_all)
    _compare_findings(diff, base.get("findings") or [], head.get("findings") or [], impact_metrics or {})
    return diff


def _compared(key: str, basis: Basis) -> bool:
    """Per unit of work, step time is replaced by time per unit; without a basis, nothing that grows with
    the work done in the window is compared."""
    if basis.kind == "per unit of work":
        return key not in ("step.time_ms", "step.time_p90_ms")
    return basis.comparable or not is_total(key)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _unit(key: str) -> str:
    if key.endswith("_ms"):
        return "ms"
    if key.endswith("_fraction") or key in ("mfu", "mfu.fp8"):
        return "fraction"
    if key.endswith("_us"):
        return "us"
    if key.endswith("_bytes"):
        return "bytes"
    return "count"


def _delta(key: str, b: float, h: float, noise: float | None) -> MetricDelta:
    unit, larger = _unit(key), max(abs(b), abs(h))
    if noise is None:
        threshold = max(UNMEASURED_ABS_FLOOR[unit], UNMEASURED_REL_FLOOR * larger)
    else:
        threshold = max(K * noise, ABS_FLOOR[unit], REL_FLOOR * larger)
    significant = abs(h - b) > threshold
    if not significant:
        verdict = "same"
    elif WORSE_IF_HIGHER.match(key):
        verdict = "worse" if h > b else "better"
    elif BETTER_IF_HIGHER.match(key):
        verdict = "better" if h > b else "worse"
    else:
        verdict = "changed"
    return MetricDelta(key, b, h, noise, threshold, significant, verdict)


def _noise(report: dict[str, Any]) -> dict[str, float]:
    """Per series key, the standard error of the per-step median (median over ranks)."""
    per_key: dict[str, list[float]] = {}
    for series in (report.get("series") or {}).values():
        for key, values in series.items():
            values = [float(v) for v in values if _number(v)]
            if len(values) >= 2:
                per_key.setdefault(key, []).append(1.2533 * statistics.stdev(values) / math.sqrt(len(values)))
    return {k: statistics.median(v) for k, v in per_key.items()}


def _metric_noise(key: str, noise: dict[str, float], step_ms: Any) -> float | None:
    if key in noise:
        return noise[key]
    if key.endswith("_fraction") and _number(step_ms) and step_ms > 0:
        twin = {"host.idle_fraction": "host.idle_ms", "gpu.busy_fraction": "host.idle_ms"}.get(
            key, key[: -len("_fraction")] + "_ms")
        if twin in noise:
            return noise[twin] / step_ms
    return None


def _combined(a: float | None, b: float | None) -> float | None:
    if a is None and b is None:
        return None
    if a is None or b is None:
        return math.sqrt(2) * (a if a is not None else b)
    return math.hypot(a, b)


def _compare_findings(diff: Diff, base: list[dict[str, Any]], head: list[dict[str, Any]],
                      impact_metrics: dict[str, str]) -> None:
    b_by = {f.get("rule"): f for f in base}
    h_by = {f.get("rule"): f for f in head}
    diff.new_findings = [f for r, f in h_by.items() if r not in b_by]
    by_key = {m.key: m for m in diff.metrics}
    for rule, f in b_by.items():
        if rule in h_by:
            continue
        why = _not_improved(impact_metrics.get(str(rule)), by_key)
        if why is None:
            diff.resolved_findings.append(f)
        else:
            diff.gone_findings.append((f, why))
    for rule in (r for r in h_by if r in b_by):
        b, h = b_by[rule], h_by[rule]
        bi, hi = b.get("impact_ms_per_step"), h.get("impact_ms_per_step")
        if diff.basis.kind == "per unit of work" and _number(bi) and _number(hi):  # per window → per unit
            bi, hi = bi / (diff.basis.base_units or 1.0), hi / (diff.basis.head_units or 1.0)
        impact_moved = _number(bi) and _number(hi) and abs(hi - bi) > max(0.25 * abs(bi), ABS_FLOOR["ms"] * 2)
        if b.get("severity") != h.get("severity") or impact_moved:
            diff.changed_findings.append((b, h))


def _not_improved(metric: str | None, by_key: dict[str, MetricDelta]) -> str | None:
    """None when the metric behind a finding fell beyond noise (the finding is resolved), else why not.
    Impact metrics measure the problem (ms or share of the step it costs), so lower is better."""
    if metric is None:
        return "the metric behind this finding is unknown (a rule outside the catalog)"
    m = by_key.get(metric)
    if m is None:
        return f"{metric} could not be compared on this basis"
    if m.significant and m.delta < 0:
        return None
    return (f"{metric} did not improve beyond noise ({m.base:,.4g} → {m.head:,.4g}, threshold ±{m.threshold:,.3g}): "
            "the rule stopped firing for another reason")


def diff_dict(diff: Diff) -> dict[str, Any]:
    """The JSON form of a diff (``perfdoctor diff --format json``)."""
    def metric(m: MetricDelta) -> dict[str, Any]:
        return {"key": m.key, "base": m.base, "head": m.head, "delta": m.delta, "relative": m.relative,
                "noise": m.noise, "threshold": m.threshold, "significant": m.significant, "verdict": m.verdict}

    def brief(f: dict[str, Any]) -> dict[str, Any]:
        return {k: f.get(k) for k in ("rule", "severity", "title", "summary", "impact_ms_per_step")}

    return {
        "diff_schema_version": "1",
        "base": diff.base_label,
        "head": diff.head_label,
        "basis": diff.basis.as_dict(),
        "step": metric(diff.step) if diff.step else None,
        "step_regression_pct": diff.step_regression_pct,
        "metrics": [metric(m) for m in diff.metrics],
        "findings": {"new": [brief(f) for f in diff.new_findings],
                     "resolved": [brief(f) for f in diff.resolved_findings],
                     "gone_unresolved": [{**brief(f), "why": why} for f, why in diff.gone_findings],
                     "changed": [{"base": brief(b), "head": brief(h)} for b, h in diff.changed_findings]},
        "notes": diff.notes,
    }


def read_report(path: Path) -> dict[str, Any] | None:
    """A saved JSON report, detected by content (a file whose first non-blank byte is ``{``); None for
    anything else (a trace, a run directory). A JSON file that is not a perfdoctor report is bad input."""
    if not path.is_file():
        return None
    try:
        with path.open("rb") as fh:
            head = fh.read(64).lstrip()
    except OSError as exc:
        raise InputError(f"{path}: not a readable JSON report ({exc.strerror or exc})") from None
    if not head.startswith(b"{"):
        return None
    from perfdoctor.load.kineto import is_kineto

    if is_kineto(path):  # a PyTorch profiler trace: analysed like any other trace
        return None
    data = load_json_file(path, MAX_REPORT_BYTES)
    if not isinstance(data, dict) or "schema_version" not in data or not isinstance(data.get("metrics"), dict):
        why = foreign_format(path) or "JSON but not a perfdoctor report (no schema_version/metrics)"
        raise InputError(f"{path}: {why}")
    if str(data["schema_version"]) != "1":
        raise InputError(f"{path}: report schema_version {data['schema_version']!r} is not supported (expected '1')")
    if problem := report_problem(data):
        raise InputError(f"{path}: not a perfdoctor report: {problem}")
    return data
