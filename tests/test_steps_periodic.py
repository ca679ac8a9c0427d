"""Steps from the periodic structure of a trace: one optimizer burst ends every iteration.

Synthetic kernel tables pin the burst clustering (bursts of one kernel or many, gaps inside a burst,
a single burst); the ``unlabeled`` sample (no NVTX at all) checks the steps against the simulator's truth.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from perfdoctor import api
from perfdoctor.measure.steps import periodic_steps
from tests.paths import REAL_H100, SAMPLES

STEP = 100_000_000  # 100 ms iterations


def _trace(burst: list[tuple[int, int]], steps: int = 4, work: int = 400) -> tuple[np.ndarray, ...]:
    """``steps`` iterations of ``work`` compute kernels then an optimizer burst; ``burst`` holds the
    (offset from the burst start, duration) of each optimizer kernel. Returns start, end, optimizer."""
    starts, ends, opt = [], [], []
    for s in range(steps):
        t0 = s * STEP
        w = np.arange(work, dtype=np.int64) * (80 * STEP // 100 // work) + t0
        starts.append(w)
        ends.append(w + 50_000)
        opt.append(np.zeros(work, dtype=bool))
        b0 = t0 + 85 * STEP // 100
        starts.append(np.array([b0 + o for o, _ in burst], dtype=np.int64))
        ends.append(np.array([b0 + o + d for o, d in burst], dtype=np.int64))
        opt.append(np.ones(len(burst), dtype=bool))
    return np.concatenate(starts), np.concatenate(ends), np.concatenate(opt)


@pytest.mark.parametrize("burst", [
    [(0, 2_000_000)],  # one kernel per burst: no gap inside a burst
    [(i * 600_000, 500_000) for i in range(12)],  # many back-to-back kernels
    [(0, 10_000), (12_000, 10_000), (3_000_000, 10_000), (3_020_000, 10_000)],  # a host pause mid-burst
])
def test_bursts_delimit_steps(burst):
    start, end, opt = _trace(burst)
    steps = periodic_steps(start, end, opt)
    assert steps is not None and steps.source == "periodic"
    assert len(steps) == 3  # 4 bursts → 3 full steps
    burst_end = max(o + d for o, d in burst)
    assert np.all(steps.durations == STEP)
    assert steps.starts[0] == 85 * STEP // 100 + burst_end


def test_shuffled_rows_give_the_same_steps():
    start, end, opt = _trace([(i * 600_000, 500_000) for i in range(5)])
    order = np.random.default_rng(0).permutation(start.size)
    a = periodic_steps(start, end, opt)
    b = periodic_steps(start[order], end[order], opt[order])
    assert np.array_equal(a.starts, b.starts) and np.array_equal(a.ends, b.ends)


@pytest.mark.parametrize("burst", [[(0, 1_000)], [(i * 600_000, 500_000) for i in range(8)]])
def test_one_burst_is_not_periodic(burst):
    start, end, opt = _trace(burst, steps=1)
    assert periodic_steps(start, end, opt) is None


def test_no_optimizer_is_not_periodic():
    start, end, opt = _trace([(0, 1_000)])
    assert periodic_steps(start, end, np.zeros_like(opt)) is None


def test_unlabeled_sample_steps_match_truth():
    report = api.analyze([SAMPLES / "unlabeled"])
    truth = json.loads((SAMPLES / "unlabeled" / "unlabeled.rank0.truth.json").read_text())["ranks"]["0"]["steps"]
    (device,) = report.devices
    assert device.step_source == "periodic"
    assert len(device.step_ns) == len(truth) - 1
    want = [s["step_ms"] for s in truth]
    assert report.metrics["ranks"]["0"]["step.time_ms"] == pytest.approx(np.median(want), rel=0.01)
    # step i runs from the end of optimizer burst i to the end of burst i+1: truth step i+1
    assert np.asarray(device.step_ns) / 1e6 == pytest.approx(want[1:], rel=0.01)
    assert not any("no step markers" in w for w in report.warnings)


def test_real_trace_without_optimizer_is_one_window():
    report = api.analyze([REAL_H100])
    assert {d.step_source for d in report.devices} == {"window"}
