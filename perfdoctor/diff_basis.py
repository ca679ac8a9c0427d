"""On what basis two runs can be compared: per step, per unit of work, or not at all.

Per-step metrics of a capture without step markers are per-window metrics (DESIGN §3: the whole window
is one step). Two captures of fixed length then have the same "step time" whatever their speed, and
totals shrink when less work fitted. So the basis is chosen from how each side found its steps:

- ``steps``: both sides have step markers (perfdoctor ``step`` or ``ProfilerStep#N`` ranges);
- ``periodic steps``: both have whole iterations, at least one found from its optimizer bursts;
- ``per unit of work``: a side has only its capture window, and both ran the same kernels: each side's
  work is its compute-kernel launches weighted by the base run's mean duration of that kernel
  (measure/work_units.py), in ms of base kernel time. Time per unit of work replaces step time (in the
  base it is ≈ 1 / how densely the GPU ran compute kernels; in the head it grows exactly as much as the
  head is slower at the same kernels, wherever in an iteration its window fell), and every per-step
  total (``*_ms``, ``*per_step``) is divided by that side's units per step;
- ``not comparable``: a side has only its window and the two ran different kernels (or a saved report
  lacks the kernel counts): step time and totals are not compared, only shares of the window
  (fractions) and per-kernel statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfdoctor.quantiles import median

MARKED = ("nvtx-step", "profiler-step")
WHOLE_ITERATIONS = (*MARKED, "periodic")
UNIT = "ms of base compute-kernel time"
# Both runs must spend at least this share of their compute-kernel time in kernels the other also ran:
# below it they run different code, and counting one's kernels at the other's speed means nothing.
MIN_SHARED = 0.8
# Between two step-based runs, work per step may differ (another batch size, more layers): beyond this
# relative difference, per-step totals compare different amounts of work, which the diff says.
WORK_CHANGE = 0.05
NS_PER_MS = 1e6


@dataclass(frozen=True)
class Basis:
    kind: str  # steps | periodic steps | per unit of work | not comparable
    unit: str | None = None  # per unit of work: what one unit is
    reason: str = ""  # why this basis (and not a better one)
    base_units: float | None = None  # units of work per step (or window), median over ranks
    head_units: float | None = None
    base_unit_ms: float | None = None  # wall time per unit of work, median over ranks
    head_unit_ms: float | None = None
    shared: float | None = None  # the smaller of the two sides' share of kernel time in shared kernels

    @property
    def comparable(self) -> bool:
        return self.kind != "not comparable"

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "unit": self.unit, "reason": self.reason, "base_units_per_step": self.base_units,
                "head_units_per_step": self.head_units, "base_unit_ms": self.base_unit_ms,
                "head_unit_ms": self.head_unit_ms, "shared_kernel_time": self.shared}


def step_sources(report: dict[str, Any]) -> set[str]:
    """How the devices of a report found their steps (a report without devices says it once, under
    ``steps.source``)."""
    found = {d.get("step_source") for d in report.get("devices") or [] if d.get("window") is not None}
    found.discard(None)
    if not found and report.get("steps", {}).get("source"):
        found = {report["steps"]["source"]}
    return found


def _work(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [d["evidence"]["work"] for d in report.get("devices") or []
            if isinstance(d.get("evidence"), dict) and isinstance(d["evidence"].get("work"), dict)]


def choose_basis(base: dict[str, Any], head: dict[str, Any]) -> Basis:
    # A report that does not say how it found its steps (a hand-written one) is taken at its word.
    src_b, src_h = step_sources(base) or {"unknown"}, step_sources(head) or {"unknown"}
    units = work_units(base, head)
    if (src_b | src_h) <= {*MARKED, "unknown"}:
        return Basis("steps", reason="both runs have step markers", **units)
    if (src_b | src_h) <= {*WHOLE_ITERATIONS, "unknown"}:
        return Basis("periodic steps", reason="steps found from the optimizer bursts that end every iteration",
                     **units)
    windowed = [label for label, src in (("base", src_b), ("head", src_h)) if "window" in src]
    why = (f"{' and '.join(windowed)} {'has' if len(windowed) == 1 else 'have'} no steps (no step markers, no "
           "periodic optimizer bursts): a window-long 'step' measures the capture length, not the run")
    if units.get("base_unit_ms") and units.get("head_unit_ms"):
        return Basis("per unit of work", UNIT, why, **units)
    shared = units.get("shared")
    lacking = ("a report holds no kernel counts (saved by an older perfdoctor)" if shared is None else
               f"the runs ran different kernels (only {100 * shared:.0f} % of one's compute-kernel time is in "
               f"kernels both ran, {100 * MIN_SHARED:.0f} % needed)")
    return Basis("not comparable", None, f"{why}; no common unit of work: {lacking}", shared=shared)


def work_units(base: dict[str, Any], head: dict[str, Any]) -> dict[str, float | None]:
    """Units of work per step and wall time per unit of each side (median over ranks), with the base's
    mean kernel durations as weights; empty when a side has no kernel counts, only ``shared`` when the
    two ran different kernels."""
    wb, wh = _work(base), _work(head)
    if not wb or not wh:
        return {}
    count_b: dict[str, int] = {}
    ns_b: dict[str, int] = {}
    for w in wb:
        for name, (c, ns) in w["kernels"].items():
            count_b[name] = count_b.get(name, 0) + c
            ns_b[name] = ns_b.get(name, 0) + ns
    weight = {name: ns_b[name] / count_b[name] for name in count_b if count_b[name]}
    names_h = {name for w in wh for name in w["kernels"]}
    shared = min(_share(wb, names_h), _share(wh, set(weight)))
    if shared < MIN_SHARED:
        return {"shared": shared}
    sides = {}
    for label, works in (("base", wb), ("head", wh)):
        per_rank = [(sum(c * weight.get(n, 0.0) for n, (c, _) in w["kernels"].items()) / NS_PER_MS / max(w["steps"], 1),
                     w["span_ns"] / max(w["steps"], 1) / NS_PER_MS) for w in works]
        per_rank = [(u, span) for u, span in per_rank if u > 0]
        if not per_rank:
            return {"shared": shared}
        sides[f"{label}_units"] = float(median([u for u, _ in per_rank]))
        sides[f"{label}_unit_ms"] = float(median([span / u for u, span in per_rank]))
    return {**sides, "shared": shared}


def _share(works: list[dict[str, Any]], names: set[str]) -> float:
    total = sum(ns for w in works for _, ns in w["kernels"].values())
    inside = sum(ns for w in works for n, (_, ns) in w["kernels"].items() if n in names)
    return inside / total if total else 0.0


def is_total(key: str) -> bool:
    """Metrics that grow with the work done per step or window (so are divided by units of work)."""
    return key.endswith("_ms") or key.endswith("per_step") or key in ("ln.blocked_count", "moe.expert_gemm_launches")


def work_note(basis: Basis) -> str | None:
    """Between two step-based runs: a note when a step holds a different amount of work on each side."""
    b, h = basis.base_units, basis.head_units
    if b is None or h is None or max(b, h) <= 0 or abs(h - b) <= WORK_CHANGE * max(b, h):
        return None
    return (f"a step holds different work on each side ({b:,.1f} → {h:,.1f} {UNIT} per step): per-step totals "
            f"compare different amounts of work; time per unit of work {basis.base_unit_ms:,.4g} → "
            f"{basis.head_unit_ms:,.4g} ms")
