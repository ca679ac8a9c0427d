"""table.distinct gives exactly np.unique (values and dtype), whichever way it finds them."""

import numpy as np
import pytest

from perfdoctor.table import distinct


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64])
def test_small_and_wide_integer_ranges(dtype):
    rng = np.random.default_rng(3)
    info = np.iinfo(dtype)
    for _ in range(200):
        lo = int(rng.integers(max(info.min, -2**62), min(info.max, 2**62)))
        hi = min(info.max, lo + int(rng.integers(0, 3000)))
        values = rng.integers(lo, hi + 1, int(rng.integers(0, 400)), dtype=np.int64).astype(dtype)
        if values.size and rng.random() < 0.2:  # a range too wide to mark: sorted instead
            values[0], values[-1] = info.min, info.max
        got, want = distinct(values), np.unique(values)
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_signed_offsets_that_wrap_in_their_own_type():
    values = np.array([-106, 127, 0, -106], dtype=np.int8)  # 127 - (-106) does not fit an int8
    assert distinct(values).tolist() == [-106, 0, 127]


@pytest.mark.parametrize("values", [np.zeros(0, np.int32), np.zeros(0), np.array([1.5, np.nan, 1.5, np.nan, 0.5]),
                                    np.array([True, False, True]), np.array(["b", "a", "b"], dtype=object)])
def test_other_kinds_as_np_unique(values):
    got, want = distinct(values), np.unique(values)
    assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=values.dtype.kind == "f")
