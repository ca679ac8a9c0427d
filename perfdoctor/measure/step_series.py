"""Per-step series of the main metrics, so a comparison can tell a change from noise.

The report's metrics are medians over steps; how much those medians move between two runs of the same
configuration depends on how much the steps vary. ``perfdoctor diff`` estimates that noise from these
series (DESIGN §5 metrics keep their names: ``step.time_ms``, ``comm.exposed_ms``,
``comm.<g>.exposed_ms``, plus ``host.idle_ms``, the device-idle time inside the step).
"""

from __future__ import annotations

import numpy as np

from perfdoctor.classify.groups import GROUPS
from perfdoctor.measure import intervals as iv
from perfdoctor.measure.activity import Activity, GroupComm
from perfdoctor.measure.steps import Steps
from perfdoctor.table import Table

NS_PER_MS = 1e6


def step_series(kernels: Table, act: Activity, steps: Steps, by_group: GroupComm,
                whole: tuple[bool, tuple[int, ...]] | None = None) -> dict[str, list[float]]:
    """Per step (in step order), ms of step time, exposed comm (all and per labelled group, ``by_group``
    their sets) and device idle. ``whole``: for a window of a timeline's steps (perfdoctor.measure.windows),
    whether the timeline has kernels and its labelled kernels per group, which say the series it has."""
    if not len(steps):
        return {}
    any_kernels, per_group = whole if whole is not None else (bool(len(kernels)), by_group.kernels)

    def per_step(s: iv.Intervals) -> list[float]:
        ms = iv.overlap_per_interval(steps.starts, steps.ends, s).astype(np.float64) / NS_PER_MS
        return [round(float(x), 6) for x in ms]

    durations = steps.durations.astype(np.float64) / NS_PER_MS
    out = {"step.time_ms": [round(float(x), 6) for x in durations]}
    if not any_kernels:
        return out
    out["comm.exposed_ms"] = per_step(act.exposed_comm)
    busy = np.asarray(per_step(act.busy))
    out["host.idle_ms"] = [round(float(x), 6) for x in np.maximum(durations - busy, 0.0)]
    if any(per_group):
        for i, g in enumerate(GROUPS):
            if per_group[i]:
                out[f"comm.{g}.exposed_ms"] = per_step(by_group.exposed[i])
    return out
