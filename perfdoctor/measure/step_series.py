"""Per-step series of the main metrics, so a comparison can tell a change from noise.

The report's metrics are medians over steps; how much those medians move between two runs of the same
configuration depends on how much the steps vary. ``perfdoctor diff`` estimates that noise from these
series (DESIGN §5 metrics keep their names: ``step.time_ms``, ``comm.exposed_ms``,
``comm.<g>.exposed_ms``, plus ``host.idle_ms``, the device-idle time inside the step).
"""

from __future__ import annotations

import numpy as np

from perfdoctor.classify.groups import GROUPS
from perfdoctor.measure.steps import Steps

NS_PER_MS = 1e6


def step_series(steps: Steps, quantities: dict[str, np.ndarray],
                whole: tuple[bool, tuple[int, ...]]) -> dict[str, list[float]]:
    """Per step (in step order), ms of step time, exposed comm (all and per labelled group) and device idle,
    from the per-step ns that :func:`perfdoctor.measure.metrics.step_quantities` measured for these steps
    (busy, exposed, ``<group>.exposed``). ``whole``: whether the timeline has kernels and its labelled
    kernels per group (for a window of its steps, perfdoctor.measure.windows: the whole timeline's), which say
    the series it has."""
    if not len(steps):
        return {}
    any_kernels, per_group = whole
    durations = steps.durations.astype(np.float64) / NS_PER_MS

    def ms(ns: np.ndarray) -> list[float]:
        return [round(float(x), 6) for x in ns / NS_PER_MS]

    out = {"step.time_ms": [round(float(x), 6) for x in durations]}
    if not any_kernels:
        return out
    out["comm.exposed_ms"] = ms(quantities["exposed"])
    busy = np.asarray(ms(quantities["busy"]))
    out["host.idle_ms"] = [round(float(x), 6) for x in np.maximum(durations - busy, 0.0)]
    for i, g in enumerate(GROUPS):
        if per_group[i]:
            out[f"comm.{g}.exposed_ms"] = ms(quantities[f"{g}.exposed"])
    return out
