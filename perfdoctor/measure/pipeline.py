"""Pipeline bubbles (PP > 1): time a stage has no compute because it waits on its neighbours.

Measured per step as the device-side idle time (gaps the CPU did not cause: the stage was waiting
for activations or gradients) plus the PP communication not hidden behind compute (DESIGN §3).
Theory for the schedule (Narayanan et al. 2021): bubble = (p−1)/(v·m) of ideal time, i.e.
(p−1)/(v·m+p−1) of the step. The warm-up / cool-down part is the bubble before the stage's first and
after its last compute kernel of the step; the rest is steady-state stalls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from perfdoctor.measure import intervals as iv
from perfdoctor.measure.steps import Steps


@dataclass(frozen=True)
class Bubbles:
    bubble_ns: np.ndarray  # per step
    edge_ns: np.ndarray  # warm-up + cool-down part, per step


def theory(config: dict[str, Any]) -> tuple[float | None, list[str]]:
    """Bubble fraction of the step for the schedule, or None with the names of the missing values."""
    p, m = config.get("pp"), config.get("num_microbatches")
    v = config.get("vpp") or 1
    missing = [name for name, value in (("pp", p), ("num_microbatches", m)) if not value]
    if missing:
        return None, missing
    p, v, m = int(p), int(v), int(m)
    return (p - 1) / (v * m + p - 1), []


def bubbles(steps: Steps, device_wait_ns: np.ndarray, pp_exposed: iv.Intervals, waits: iv.Intervals,
            compute: iv.Intervals) -> Bubbles:
    """Bubble per step from the device-wait gaps and the exposed PP comm (both as interval sets)."""
    per_step_pp = iv.overlap_per_interval(steps.starts, steps.ends, pp_exposed).astype(np.float64)
    bubble = device_wait_ns + per_step_pp
    stall = iv.union(np.concatenate([waits[0], pp_exposed[0]]), np.concatenate([waits[1], pp_exposed[1]]))
    edge = np.zeros(len(steps))
    for i, (lo, hi) in enumerate(zip(steps.starts, steps.ends)):
        c = iv.clip(compute, int(lo), int(hi))
        if not c[0].size:
            continue
        edge[i] = iv.measure(iv.clip(stall, int(lo), int(c[0][0]))) + iv.measure(iv.clip(stall, int(c[1][-1]), int(hi)))
    return Bubbles(bubble, edge)
