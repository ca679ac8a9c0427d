"""measure.steps.step_at: the step of each instant, as the per-instant search gives it."""

from __future__ import annotations

import numpy as np
import pytest

from perfdoctor.measure.steps import step_at


@pytest.mark.parametrize("seed", range(40))
def test_step_at_is_the_search(seed: int) -> None:
    """Sorted instants (the run-wise path), with ties on step starts, instants before the first step and
    after the last, repeated step starts; and unsorted instants (the search itself)."""
    rng = np.random.default_rng(seed)
    steps = np.sort(rng.integers(0, 1000, int(rng.integers(1, 12))))
    times = np.sort(np.concatenate([rng.integers(-50, 1100, int(rng.integers(0, 400))), steps[: seed % 3]]))
    want = np.searchsorted(steps, times, side="right") - 1
    got = step_at(steps, times)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    shuffled = rng.permutation(times)
    assert np.array_equal(step_at(steps, shuffled), np.searchsorted(steps, shuffled, side="right") - 1)


def test_step_at_without_steps_or_instants() -> None:
    none = np.zeros(0, dtype=np.int64)
    assert step_at(none, np.array([1, 2, 3])).tolist() == [-1, -1, -1]
    assert step_at(np.array([5]), none).size == 0
