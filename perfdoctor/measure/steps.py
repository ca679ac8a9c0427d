"""Training steps: the unit every per-step metric is a median over (DESIGN §3).

Sources, in order: perfdoctor ``step n=..`` ranges; PyTorch profiler ``ProfilerStep#N`` ranges; else
the whole capture window as one step, flagged so the output can say that per-step numbers are really
per-window numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from perfdoctor.load.labels import labelled
from perfdoctor.model import Timeline

PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")


@dataclass(frozen=True)
class Steps:
    starts: np.ndarray  # int64 ns
    ends: np.ndarray
    source: str  # nvtx-step | profiler-step | window

    @property
    def durations(self) -> np.ndarray:
        return self.ends - self.starts

    def __len__(self) -> int:
        return int(self.starts.size)


def find_steps(tl: Timeline, window: tuple[int, int]) -> Steps:
    """Step intervals of one timeline; ``window`` is the device's activity window used as fallback."""
    ranges = tl.nvtx[tl.nvtx["end"].to_numpy() >= 0] if len(tl.nvtx) else tl.nvtx
    ours = labelled(ranges, "step")
    if len(ours):
        return _steps(ours, "nvtx-step")
    if len(ranges):
        texts = ranges["text"].to_numpy(dtype=object)
        mask = np.array([isinstance(t, str) and bool(PROFILER_STEP.match(t)) for t in texts], dtype=bool)
        if mask.any():
            return _steps(ranges[mask], "profiler-step")
    return Steps(np.array([window[0]], dtype=np.int64), np.array([window[1]], dtype=np.int64), "window")


def _steps(rows, source: str) -> Steps:
    order = np.argsort(rows["start"].to_numpy(), kind="stable")
    return Steps(rows["start"].to_numpy()[order], rows["end"].to_numpy()[order], source)
