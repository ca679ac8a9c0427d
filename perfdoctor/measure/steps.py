"""Training steps: the unit every per-step metric is a median over (DESIGN §3).

Sources, in order: perfdoctor ``step n=..`` ranges; PyTorch profiler ``ProfilerStep#N`` ranges; a
framework's per-iteration ranges and then the run's own repeating ranges (:mod:`perfdoctor.measure.step_ranges`:
``train_step``, ``Forward`` + ``Backward``, iterations of a ``benchmark_loop``); the
periodic structure of the trace (every iteration ends with one burst of optimizer kernels, so the
interval between two burst ends is one iteration); else the whole capture window as one step, flagged
so the output can say that per-step numbers are really per-window numbers. Whatever ran before the
first step (model construction, weight upload, warm-up) is in no step: the report says how long it was
and, where the program named it, which ranges it was.

Megatron-Core's own NVTX ranges (research/kernel_taxonomy.md §5) name layers, sub-modules, p2p calls
and the warm-up/steady/cool-down phases of the pipeline schedule, but no range spans one iteration
(the optimizer step lies outside all of them), so they cannot define steps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from perfdoctor.classify.timeline import category_mask
from perfdoctor.load.labels import labelled, matching
from perfdoctor.measure.step_ranges import RangeSteps, framework_steps, repeating_steps
from perfdoctor.model import Timeline
from perfdoctor.quantiles import median
from perfdoctor.table import Table

PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")
# A natural break between intra-burst and inter-burst gaps: the sorted gaps must jump by this factor.
MIN_BREAK_RATIO = 4.0
# Every inter-burst gap holds one iteration of work: its kernel count is at least this share of the
# median inter-burst gap's (a gap between two halves of one optimizer burst holds almost none).
MIN_STEP_KERNEL_SHARE = 0.25
# Gaps between single-kernel bursts hold whole iterations, at least this share of all kernels.
MIN_STEPS_SHARE = 0.25


@dataclass(frozen=True)
class Steps:
    starts: np.ndarray  # int64 ns
    ends: np.ndarray
    source: str  # nvtx-step | profiler-step | framework-step | repeating-range | periodic | window
    label: str = ""  # the range name the steps come from (framework-step, repeating-range)
    excluded: tuple[str, ...] = ()  # named ranges before the first step (init, warm-up)

    @property
    def durations(self) -> np.ndarray:
        return self.ends - self.starts

    def __len__(self) -> int:
        return int(self.starts.size)


def step_at(step_starts: np.ndarray, times: np.ndarray) -> np.ndarray:
    """``np.searchsorted(step_starts, times, side="right") - 1``: per instant, the last step starting at or
    before it (−1 before the first). For sorted instants (kernel starts, gaps) the steps' places among the
    instants are found instead and each repeated over its run: a search per step, not one per kernel."""
    if step_starts.size and times.size > step_starts.size and np.all(step_starts[1:] >= step_starts[:-1]) \
            and np.all(times[1:] >= times[:-1]):
        at = np.searchsorted(times, step_starts, side="left")  # the instants before each step's start
        runs = np.diff(at, prepend=0, append=times.size)
        return np.repeat(np.arange(-1, step_starts.size, dtype=np.intp), runs)
    return np.searchsorted(step_starts, times, side="right") - 1


def find_steps(tl: Timeline, window: tuple[int, int], kcls: Table) -> Steps:
    """Step intervals of one timeline.

    ``window`` is the device's activity window, the last resort; ``kcls`` is the taxonomy of
    ``tl.kernels`` (its ``category`` column finds the optimizer kernels).
    """
    ours = labelled(tl.nvtx, "step")
    ours = ours[ours.col("end") >= 0]
    if len(ours):
        return _steps(ours, "nvtx-step")
    profiler = matching(tl.nvtx, PROFILER_STEP)
    profiler = profiler[profiler.col("end") >= 0]
    if len(profiler):
        return _steps(profiler, "profiler-step")
    for source, found in (("framework-step", framework_steps), ("repeating-range", repeating_steps)):
        ranged = found(tl.nvtx if source == "framework-step" else tl)
        if ranged is not None and len(ranged.starts):
            return _from_ranges(ranged, source)
    if len(kcls):
        periodic = periodic_steps(tl.kernels.col("start"), tl.kernels.col("end"),
                                  category_mask(kcls, "optimizer"))
        if periodic is not None:
            return periodic
    return Steps(np.array([window[0]], dtype=np.int64), np.array([window[1]], dtype=np.int64), "window")


def periodic_steps(start: np.ndarray, end: np.ndarray, optimizer: np.ndarray) -> Steps | None:
    """Steps between consecutive ends of optimizer bursts (n bursts → n−1 steps); None below 2 bursts.

    ``start``/``end`` cover all kernels of the timeline, ``optimizer`` marks the optimizer kernels.
    """
    opt = np.flatnonzero(optimizer)
    if opt.size < 2:
        return None
    opt = opt[np.argsort(start[opt], kind="stable")]
    o_start, o_end = start[opt], np.maximum.accumulate(end[opt])
    # Kernels of any kind that start inside each gap between consecutive optimizer kernels.
    all_starts = np.sort(start)
    between = (np.searchsorted(all_starts, o_start[1:], side="left")
               - np.searchsorted(all_starts, o_start[:-1], side="right"))
    breaks = burst_breaks(np.maximum(o_start[1:] - o_end[:-1], 0), between, all_starts.size)
    if not breaks.any():
        return None
    burst_end = o_end[np.append(np.flatnonzero(breaks), opt.size - 1)]
    return Steps(burst_end[:-1].astype(np.int64), burst_end[1:].astype(np.int64), "periodic")


def burst_breaks(gaps: np.ndarray, between: np.ndarray, total: int) -> np.ndarray:
    """Which gaps between consecutive optimizer kernels separate two bursts (one per iteration).

    The natural break is the largest jump in the sorted gaps (in ratio) whose upper side holds
    iterations of work: every gap above it must contain a comparable number of other kernels. When
    no gap jumps (all bursts one kernel, or a single burst), the gaps are either all inter-burst
    (together they hold a large share of the timeline's ``total`` kernels) or all intra-burst (an
    optimizer burst is a small part of an iteration).
    """
    order = np.sort(gaps).astype(np.float64)
    ratio = (order[1:] + 1.0) / (order[:-1] + 1.0)
    for j in np.argsort(-ratio, kind="stable"):
        if ratio[j] < MIN_BREAK_RATIO:
            break
        cut = np.sqrt((order[j] + 1.0) * (order[j + 1] + 1.0))
        upper = gaps > cut
        if between[upper].min() >= MIN_STEP_KERNEL_SHARE * median(between[upper]) \
                and between[~upper].max(initial=0) < between[upper].min():
            return upper
    if between.min() >= MIN_STEP_KERNEL_SHARE * median(between) and between.sum() >= MIN_STEPS_SHARE * total:
        return np.ones(gaps.size, dtype=bool)
    return np.zeros(gaps.size, dtype=bool)


def _steps(rows, source: str) -> Steps:
    order = np.argsort(rows.col("start"), kind="stable")
    return Steps(rows.col("start")[order], rows.col("end")[order], source)


def _from_ranges(found: RangeSteps, source: str) -> Steps:
    return Steps(found.starts.astype(np.int64), found.ends.astype(np.int64), source, found.label, found.excluded)
