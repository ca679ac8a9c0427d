"""Per-group reductions over integer codes (perfdoctor.measure.grouped) against a plain-Python group-by:
group order, ties, empty input, one row, wide and negative keys, keys too wide to pack at once."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from perfdoctor.measure import grouped


def _reference(keys: list[np.ndarray]) -> dict[tuple[int, ...], list[int]]:
    """Rows per key tuple, in sorted key order, each group's rows in row order."""
    out: dict[tuple[int, ...], list[int]] = {}
    for row, key in enumerate(zip(*(k.tolist() for k in keys))):
        out.setdefault(key, []).append(row)
    return dict(sorted(out.items()))


@pytest.mark.parametrize("seed", range(6))
def test_groups_and_reductions_match_a_plain_group_by(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    keys = [rng.integers(-3, 3, n).astype(np.int8),
            rng.choice(np.array([0, 2**63 + 5, 2**64 - 1, 7], dtype=np.uint64), n),  # NCCL ids: full uint64
            rng.integers(0, 2**40, n) * (seed % 2),  # wide (sorted by np.unique) or constant
            rng.integers(0, 4, n).astype(np.int32)]
    values = rng.integers(-5, 5, n) * 10**15  # many ties; large enough that float medians need care
    g = grouped.groups(*keys)
    ref = _reference(keys)
    assert g.n == len(ref)
    assert [g.rows(j).tolist() for j in range(g.n)] == list(ref.values())
    for k, key in enumerate(keys):
        assert g.first(key).tolist() == [t[k] for t in ref]
    rows = list(ref.values())
    assert g.size.tolist() == [len(r) for r in rows]
    assert g.sum(values).tolist() == [sum(values[r].tolist()) for r in rows]
    assert g.min(values).tolist() == [min(values[r].tolist()) for r in rows]
    assert g.median(values).tolist() == [float(np.median(values[r])) for r in rows]
    assert g.median(values).tolist() == pytest.approx([statistics.median(values[r].tolist()) for r in rows])
    extreme = np.where(values > 0, np.iinfo(np.int64).max - values, np.iinfo(np.int64).min - values)
    for other in (values / 7, values * 2**10, extreme):  # floats; integers too far apart to pack together
        assert g.median(other).tolist() == [float(np.median(other[r])) for r in rows]
    # The row of the largest value; on ties the first row, like pandas' idxmax.
    assert g.first_max(values).tolist() == [r[int(np.argmax(values[r]))] for r in rows]
    # Each row's place among its group's rows, in row order (pandas' cumcount).
    place = {row: i for r in rows for i, row in enumerate(r)}
    assert g.position().tolist() == [place[row] for row in range(n)]


def test_ties_pick_the_first_row() -> None:
    g = grouped.groups(np.array([1, 0, 1, 0, 1]))
    assert g.first_max(np.array([5, 2, 7, 2, 7])).tolist() == [1, 2]
    assert g.median(np.array([5, 2, 7, 2, 8])).tolist() == [2.0, 7.0]
    assert g.median(np.array([1, 2, 3, 4, 6])).tolist() == [3.0, 3.0]  # even: mean of the middle two


def test_empty_input_and_one_row() -> None:
    empty = grouped.groups(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint64))
    assert empty.n == 0 and empty.sum(np.zeros(0, dtype=np.int64)).size == 0
    assert empty.first_max(np.zeros(0, dtype=np.int64)).size == empty.median(np.zeros(0)).size == 0
    assert empty.position().size == 0
    one = grouped.groups(np.array([9]), np.array([2**64 - 1], dtype=np.uint64))
    assert one.n == 1 and one.first_max(np.array([3])).tolist() == [0] and one.median(np.array([3])).tolist() == [3.0]


def test_keys_too_wide_to_pack_together_are_renumbered_first() -> None:
    rng = np.random.default_rng(1)
    keys = [rng.integers(-2**62, 2**62, 50) // 2**40 * 2**40 for _ in range(5)]  # each key's span near 2**63
    keys = [np.concatenate([k, k[:10]]) for k in keys]  # and some repeated tuples
    g = grouped.groups(*keys)
    ref = _reference(keys)
    assert [g.rows(j).tolist() for j in range(g.n)] == list(ref.values())


def test_epoch_nanosecond_medians_round_like_numpy() -> None:
    """Session-clock ns (~1.7e18) are not exact in float64: the median must convert then average
    exactly as numpy does, so that clock offsets stay identical."""
    values = np.array([1_700_000_000_000_000_001, 1_700_000_000_000_000_300, 1_700_000_000_000_000_257,
                       1_700_000_000_000_000_999], dtype=np.int64)
    g = grouped.groups(np.zeros(4, dtype=np.int64))
    assert g.median(values)[0] == np.median(values)
