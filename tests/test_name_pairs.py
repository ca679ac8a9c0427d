"""Distinct (short, demangled) kernel names numbered a slice of kernels at a time (classify/timeline.py
``_dense_pairs``) are numbered as one ``factorize`` over every kernel numbers them: same codes, same pairs,
in order of first appearance, missing names (code −1) included."""

from __future__ import annotations

import numpy as np
import pytest

from perfdoctor.classify import timeline
from perfdoctor.table import Strings, Table, factorize
from perfdoctor.width import code_type


@pytest.mark.parametrize("shape", [(1, 1, 1), (50, 7, 5), (5_000, 40, 90), (40_000, 300, 2)])
def test_pairs_by_slice_are_factorize_of_all(shape, monkeypatch):
    n, shorts, demangleds = shape
    rng = np.random.default_rng(n)
    short = rng.integers(-1, shorts, n).astype(np.int16)
    demangled = rng.integers(-1, demangleds, n).astype(np.int16)
    width = demangleds + 1
    monkeypatch.setattr(timeline, "PAIR_SLICE", 97)  # many slices, a pair first seen in a later one
    inverse, pairs = timeline._dense_pairs(short, demangled, width)
    codes, distinct = factorize(short.astype(np.int64) * width + demangled)
    assert np.array_equal(inverse, codes) and np.array_equal(pairs, distinct)
    assert inverse.dtype == code_type(distinct.size)


def test_name_pairs_names_each_distinct_pair_once(monkeypatch):
    names = np.array(["gemm", "nccl", "softmax"], dtype=object)
    short = Strings(np.array([2, 0, 0, 1, 2, 0], dtype=np.int8), names)
    demangled = Strings(np.array([-1, 1, 1, 0, -1, 2], dtype=np.int8), names)
    kernels = Table({"short_name": short, "demangled_name": demangled})
    monkeypatch.setattr(timeline, "PAIR_SLICE", 2)
    inverse, shorts, demangleds = timeline.name_pairs(kernels)
    assert inverse.tolist() == [0, 1, 1, 2, 0, 3]
    assert shorts == ["softmax", "gemm", "nccl", "gemm"] and demangleds == [None, "nccl", "gemm", "softmax"]
