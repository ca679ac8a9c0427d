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


def _separate(rng: np.random.Generator, n: int, touch: float) -> iv.Intervals:
    """``n`` sorted, non-empty, non-overlapping intervals; about ``touch`` of them end where the next begins."""
    cuts = np.sort(rng.choice(np.arange(1, 40 * n + 2), size=2 * n, replace=False))
    starts, ends = cuts[0::2].copy(), cuts[1::2].copy()
    joined = rng.random(n - 1) < touch if n > 1 else np.zeros(0, dtype=bool)
    ends[:-1][joined] = starts[1:][joined]  # steps touch; unions never do
    return starts.astype(np.int64), ends.astype(np.int64)


@pytest.mark.parametrize("seed", range(60))
def test_intersect_of_separate_sets_is_the_pairwise_sweep(seed: int) -> None:
    """The run-wise intersection (both sets sorted and separate) gives the pairwise sweep's arrays exactly:
    the same pieces in the same order, the same dtype, whichever side is the smaller."""
    rng = np.random.default_rng(seed)
    a = _separate(rng, int(rng.integers(1, 300)), touch=float(rng.choice([0.0, 0.3, 1.0])))
    b = _separate(rng, int(rng.integers(1, 12)) if seed % 2 else int(rng.integers(1, 300)), touch=0.5)
    for x, y in ((a, b), (b, a), (a, a)):
        got, want = iv.intersect(x, y), iv._intersect_pairs(x, y)
        assert got[0].dtype == want[0].dtype and got[1].dtype == want[1].dtype
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_intersect_of_sets_that_overlap_themselves_keeps_the_sweep() -> None:
    """Overlapping or empty intervals are not separate: the pairwise sweep answers for them."""
    a = (np.array([0, 5, 20]), np.array([10, 8, 30]))  # 5..8 lies inside 0..10
    b = (np.array([4, 25]), np.array([6, 26]))
    assert not iv.separate(a) and iv.separate(b)
    got, want = iv.intersect(a, b), iv._intersect_pairs(a, b)
    assert got[0].tolist() == want[0].tolist() == [4, 5, 25] and got[1].tolist() == want[1].tolist() == [6, 6, 26]
    assert not iv.separate((np.array([0, 3]), np.array([0, 9])))  # an empty interval


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("size", [1, 2, 5, 64])
def test_union_by_slices_is_the_whole_union(seed: int, size: int, monkeypatch) -> None:
    """Sorted starts merged a slice at a time (the reach carried across: an interval reaching over many
    slices, touching ones at a slice edge, slices left empty by the mask or by empty intervals) give the
    whole columns' set, with and without a mask; unsorted ones are left to the whole columns' sort."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 120))
    starts = np.sort(rng.integers(0, GRID, n))
    ends = starts + rng.choice([0, 0, 1, 3, 30, 300], n)
    where = rng.random(n) < rng.choice([0.0, 0.5, 1.0])
    whole = iv._union(starts, ends), iv._union(starts[where], ends[where])
    monkeypatch.setattr(iv, "SLICE", size)
    monkeypatch.setattr(iv, "MMAP_ABOVE", [0, 1 << 30][seed % 2])  # views of the written part, or copies
    for got, want in zip((iv.union(starts, ends), iv.union(starts, ends, where)), whole):
        assert got[0].dtype == got[1].dtype == np.int64
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    if n > 1:
        shuffled = rng.permutation(n)
        assert iv._union_sorted(starts[shuffled], ends[shuffled], None) is None or \
            np.all(starts[shuffled][1:] >= starts[shuffled][:-1])
        got = iv.union(starts[shuffled], ends[shuffled], where[shuffled])
        assert np.array_equal(got[0], whole[1][0]) and np.array_equal(got[1], whole[1][1])


@pytest.mark.parametrize("seed", range(40))
def test_subtract_of_a_small_set_takes_the_big_sets_overlaps(seed: int, monkeypatch) -> None:
    """``a − b`` made from the intervals of ``b`` that overlap ``a`` is the one made from all of ``b``
    (b's intervals touching a's edges, spanning several of a's, or overlapping none of them)."""
    rng = np.random.default_rng(seed)
    a = iv.union(*_random(rng, int(rng.integers(1, 6))))
    b = iv.union(*_random(rng, int(rng.integers(1, 60))))
    monkeypatch.setattr(iv, "NEAR_FACTOR", 1 << 30)  # never: the whole complement
    whole = iv.subtract(a, b)
    monkeypatch.setattr(iv, "NEAR_FACTOR", 0)  # always
    near = iv.subtract(a, b)
    assert np.array_equal(near[0], whole[0]) and np.array_equal(near[1], whole[1])
    assert np.array_equal(_from_set(near), _from_set(a) & ~_from_set(b))


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("size", [1, 3, 1 << 18])
def test_overlap_of_a_few_intervals_without_prefix_sums(seed: int, size: int, monkeypatch) -> None:
    """A few intervals' overlaps with a large set summed a slice at a time are the prefix sums' numbers."""
    rng = np.random.default_rng(seed)
    big = iv.union(*_random(rng, int(rng.integers(0, 80))))
    q_starts, q_ends = _random(rng, int(rng.integers(0, 6)))
    monkeypatch.setattr(iv, "NEAR_FACTOR", 1 << 30)  # prefix sums of the whole set
    whole = iv.overlap_per_interval(q_starts, q_ends, big)
    monkeypatch.setattr(iv, "NEAR_FACTOR", 0)
    monkeypatch.setattr(iv, "SLICE", size)
    assert iv.overlap_per_interval(q_starts, q_ends, big).tolist() == whole.tolist()


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("size", [1, 3, 1 << 18])
def test_measure_within_is_the_clipped_measure(seed: int, size: int, monkeypatch) -> None:
    rng = np.random.default_rng(seed)
    a = iv.union(*_random(rng, int(rng.integers(0, 40))))
    lo = int(rng.integers(-10, GRID))
    hi = lo + int(rng.integers(0, GRID))
    monkeypatch.setattr(iv, "SLICE", size)
    clipped = iv.clip(a, lo, hi)
    assert iv.measure_within(a, lo, hi) == iv.measure(clipped) == int((clipped[1] - clipped[0]).sum())


@pytest.mark.parametrize("seed", range(20))
def test_overlap_with_a_separate_set_is_its_unions(seed: int, monkeypatch) -> None:
    """Sorted, disjoint intervals that touch (gaps split at step boundaries) overlap an interval by the
    ns their union does, by the prefix sums of either set or by slices."""
    rng = np.random.default_rng(seed)
    spans = _separate(rng, int(rng.integers(1, 80)), touch=0.5)
    assert iv.separate(spans)
    q_starts, q_ends = _random(rng, int(rng.integers(0, 30)))
    for factor in (0, 1 << 30):
        monkeypatch.setattr(iv, "NEAR_FACTOR", factor)
        assert iv.overlap_per_interval(q_starts, q_ends, spans).tolist() == \
            iv.overlap_per_interval(q_starts, q_ends, iv.union(*spans)).tolist()


@pytest.mark.parametrize("mapped", [0, 1 << 40])
@pytest.mark.parametrize("bound", [0, 1, 5, 100])
def test_column_of_pieces(mapped: int, bound: int, monkeypatch) -> None:
    """A column written piece by piece into one array (growing past its bound) or joined from its pieces:
    the pieces in order, int64, empty ones included."""
    monkeypatch.setattr(iv, "MMAP_ABOVE", mapped)
    pieces = [np.arange(k, dtype=np.int64) + 10 * k for k in (3, 0, 7, 1, 0)]
    col = iv.Column(bound)
    for p in pieces:
        col.add(p)
    got = col.done()
    assert got.dtype == np.int64 and got.tolist() == np.concatenate(pieces).tolist()
    empty = iv.Column(bound).done()
    assert empty.dtype == np.int64 and empty.size == 0
