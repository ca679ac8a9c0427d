"""How sure a finding is, and how severe the evidence allows it to be (DESIGN §5 ``confidence``).

A finding's numbers are estimates from a sample of device activity. Three things make them weaker:

- **Few kernels.** A share of the step estimated from n device events has a relative standard error of
  about 1/sqrt(n) (event counts are Poisson-like). Severity thresholds sit a factor ~3 apart (HIGH at 10 %,
  MEDIUM at 3 % of the step), so telling HIGH from MEDIUM needs the estimate within ±25 %: n >= 16;
  telling MEDIUM from LOW within ±50 %: n >= 4. Below those counts the severity is capped and the
  confidence lowered, whatever the ratio says (a 2-kernel trace is never a HIGH finding).
- **Few steps.** A per-step median over one or two steps is one or two samples of a quantity that varies
  step to step; with no step markers the whole capture window is one "step" whose edges are arbitrary.
- **Guessed labels.** A rule about one parallel group's communication is only as sure as the label of
  that group; a heuristic label (no NVTX, no NCCL payload) is a guess, and the finding says so.
"""

from __future__ import annotations

from typing import Any

from perfdoctor.diagnose.conditions import Context, names

HIGH_MIN_KERNELS = 16  # relative standard error 1/sqrt(16) = 25 %
MEDIUM_MIN_KERNELS = 4  # relative standard error 1/sqrt(4) = 50 %
MIN_STEPS = 3  # a median of fewer is a single sample or the mean of two
LEVELS = ("high", "medium", "low")
GROUPS = ("dp", "tp", "cp", "pp", "ep")


def device_quality(summary: Any) -> dict[str, Any]:
    """What a rank's evidence rests on, readable by rules as ``device.<field>``: kernels, steps and
    their source, and per parallel group the label source and confidence holding most of its time."""
    out: dict[str, Any] = {"kernel_count": summary.kernel_count, "steps": len(summary.step_ns),
                           "step_source": summary.step_source}
    for g, info in (summary.groups or {}).items():
        for field in ("label_source", "confidence"):
            shares = info.get(field) or {}
            if shares:
                out.setdefault(f"group_{field}", {})[g] = max(shares.items(), key=lambda kv: kv[1].get("ns", 0))[0]
    return out


def _groups_read(rule: Any) -> list[str]:
    spec = rule.spec
    read = [*names(spec["when"]), *spec.get("evidence", []), spec["impact"].get("metric") or ""]
    return sorted({n.split(".")[1] for n in read if n.startswith("comm.") and n.split(".")[1] in GROUPS})


def confidence(rule: Any, fired: list[Context]) -> tuple[str, list[str]]:
    """(high|medium|low, the reasons it is not high) for a finding that fired on these contexts."""
    worst, reasons = 0, []

    def lower(level: str, reason: str) -> None:
        nonlocal worst
        worst = max(worst, LEVELS.index(level))
        if reason not in reasons:
            reasons.append(reason)

    for ctx in fired:
        dev = ctx.device or {}
        kernels, steps, source = dev.get("kernel_count"), dev.get("steps"), dev.get("step_source")
        if kernels is not None and kernels < MEDIUM_MIN_KERNELS:
            lower("low", f"only {kernels} kernels in the trace")
        elif kernels is not None and kernels < HIGH_MIN_KERNELS:
            lower("medium", f"only {kernels} kernels in the trace")
        if source == "window":
            lower("low", "no step markers: the capture window is treated as one step")
        elif steps is not None and steps < MIN_STEPS:
            lower("medium", f"only {steps} step{'s' if steps != 1 else ''} captured")
        for g in _groups_read(rule):
            label = (dev.get("group_label_source") or {}).get(g)
            level = (dev.get("group_confidence") or {}).get(g)
            if label == "heuristic" or level == "low":
                lower("low", f"the {g.upper()} group label is a heuristic guess (heuristic, low confidence)")
            elif level == "medium":
                lower("medium", f"the {g.upper()} group label has medium confidence")
    return LEVELS[worst], reasons


def cap_severity(severity: str, fired: list[Context]) -> str:
    """The severity the evidence allows: at most medium below HIGH_MIN_KERNELS kernels, at most low below
    MEDIUM_MIN_KERNELS (the fewest kernels of the ranks the finding rests on)."""
    counts = [c.device.get("kernel_count") for c in fired if c.device and c.device.get("kernel_count") is not None]
    if not counts or severity in ("low", "info"):
        return severity
    fewest = min(counts)
    if fewest < MEDIUM_MIN_KERNELS:
        return "low"
    if fewest < HIGH_MIN_KERNELS and severity == "high":
        return "medium"
    return severity
