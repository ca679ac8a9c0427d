"""Interval algebra against a brute-force model on a nanosecond grid."""

from __future__ import annotations

import numpy as np
import pytest

from perfdoctor.measure import intervals as iv

GRID = 400


def _random(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    starts = rng.integers(0, GRID - 1, n)
    return starts, starts + rng.integers(0, 40, n)  # zero-length intervals included on purpose


def _mask(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    m = np.zeros(GRID + 64, dtype=bool)
    for s, e in zip(starts, ends):
        m[s:e] = True
    return m


def _from_set(s: iv.Intervals) -> np.ndarray:
    return _mask(*s)


@pytest.mark.parametrize("seed", range(25))
def test_algebra_matches_bruteforce(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a_raw, b_raw = _random(rng, rng.integers(0, 30)), _random(rng, rng.integers(0, 30))
    a, b = iv.union(*a_raw), iv.union(*b_raw)
    ma, mb = _mask(*a_raw), _mask(*b_raw)
    assert np.array_equal(_from_set(a), ma)
    # normal form: sorted, disjoint, non-touching, non-empty
    assert np.all(a[1] > a[0]) and np.all(a[0][1:] > a[1][:-1])
    assert iv.measure(a) == ma.sum()
    assert np.array_equal(_from_set(iv.intersect(a, b)), ma & mb)
    assert np.array_equal(_from_set(iv.subtract(a, b)), ma & ~mb)
    lo, hi = 50, 300
    window = np.zeros_like(ma)
    window[lo:hi] = True
    assert np.array_equal(_from_set(iv.clip(a, lo, hi)), ma & window)
    assert np.array_equal(_from_set(iv.complement(a, lo, hi)), ~ma & window)
    q_starts, q_ends = _random(rng, 20)
    expected = [int((ma[s:e]).sum()) for s, e in zip(q_starts, q_ends)]
    assert iv.overlap_per_interval(q_starts, q_ends, a).tolist() == expected


def test_empty_inputs() -> None:
    empty = iv.union(np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    one = iv.union(np.array([5]), np.array([9]))
    assert iv.measure(empty) == 0
    assert iv.measure(iv.intersect(empty, one)) == 0
    assert iv.subtract(one, empty) == one
    assert iv.measure(iv.complement(empty, 0, 10)) == 10
    assert iv.overlap_per_interval(np.array([0]), np.array([10]), empty).tolist() == [0]


def test_touching_intervals_merge() -> None:
    s, e = iv.union(np.array([0, 10, 30]), np.array([10, 20, 40]))
    assert s.tolist() == [0, 30] and e.tolist() == [20, 40]
