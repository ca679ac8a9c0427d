"""perfdoctor.table: the numpy tables every measurement reads, checked against plain Python."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perfdoctor.table import Strings, Table, factorize, is_repeated, repeated, stable_order, starts_in_order
from perfdoctor.width import code_type, fitted


def _reference(values: list, sort: bool, keep_missing: bool) -> tuple[list[int], list]:
    """pandas.factorize's contract in plain Python: first appearance (or sorted), missing → −1."""
    def missing(v: object) -> bool:
        return v is None or (isinstance(v, float) and math.isnan(v))

    def key(v: object) -> object:
        return "<nan>" if isinstance(v, float) and math.isnan(v) else v

    distinct: list = []
    seen: dict = {}
    for v in values:
        if (keep_missing or not missing(v)) and key(v) not in seen:
            seen[key(v)] = v
            distinct.append(v)
    if sort:
        distinct.sort(key=lambda v: (missing(v), v if not missing(v) else 0))
    position = {key(v): i for i, v in enumerate(distinct)}
    return [position.get(key(v), -1) if keep_missing or not missing(v) else -1 for v in values], distinct


CASES = {
    "dense ints": lambda rng: rng.integers(0, 50, 2000),
    "sparse ints": lambda rng: rng.integers(-(2**62), 2**62, 500),
    "uint64 near the top": lambda rng: (np.uint64(2**64 - 1) - rng.integers(0, 40, 300).astype(np.uint64)),
    "int8 over its whole range": lambda rng: rng.integers(-128, 128, 900).astype(np.int8),
    "int8 over part of its range": lambda rng: rng.integers(-100, 101, 900).astype(np.int8),  # a shift wraps
    "int16 codes with -1": lambda rng: rng.integers(-1, 32767, 900).astype(np.int16),
    "negative int32": lambda rng: rng.integers(-70, -3, 500).astype(np.int32),
    "bools": lambda rng: rng.integers(0, 2, 100).astype(bool),
    "floats with NaN": lambda rng: np.where(rng.random(400) < 0.2, np.nan, rng.integers(0, 9, 400).astype(float)),
    "text with None": lambda rng: np.array([None if x == 0 else f"m{x}" for x in rng.integers(0, 12, 700)],
                                           dtype=object),
    "text with NaN": lambda rng: np.array([float("nan") if x == 0 else f"m{x}" for x in rng.integers(0, 5, 90)],
                                          dtype=object),
    "empty": lambda rng: np.zeros(0, dtype=np.int64),
}


@pytest.mark.parametrize("case, sort, keep_missing", [
    (case, sort, keep) for case in CASES for sort in (False, True) for keep in (False, True)
    if not (sort and keep and case == "text with None")])  # None has no order among strings
def test_factorize_matches_the_reference(case: str, sort: bool, keep_missing: bool) -> None:
    values = CASES[case](np.random.default_rng(7))
    codes, distinct = factorize(values, sort=sort, keep_missing=keep_missing)
    want_codes, want = _reference(values.tolist(), sort, keep_missing)
    assert codes.tolist() == want_codes
    got = distinct.tolist()
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (isinstance(g, float) and math.isnan(g) and math.isnan(w)) or g == w
    if values.dtype.kind in "iub":  # the values' own type, even near its limits
        assert distinct.dtype == values.dtype


def test_strings_decode_mask_where_map_and_concat() -> None:
    s = Strings.encode(["gemm", "nccl", None, "gemm"])
    assert s.decode().tolist() == ["gemm", "nccl", None, "gemm"]
    assert len(s) == 4 and s[1] == "nccl" and s[np.array([3, 0])].decode().tolist() == ["gemm", "gemm"]
    assert s.mask("gemm", None).tolist() == [True, False, True, True]
    assert s.where(lambda v: isinstance(v, str) and v.startswith("n")).tolist() == [False, True, False, False]
    assert s.map(lambda v: len(v or ""), dtype=np.int64).tolist() == [4, 4, 0, 4]
    both = Strings.concat([s, Strings.encode(["nccl", "ln"])])
    assert both.decode().tolist() == ["gemm", "nccl", None, "gemm", "nccl", "ln"]
    assert len(set(map(repr, both.values.tolist()))) == both.values.size  # merged: each value once
    empty = Strings(np.zeros(0, dtype=np.int32), np.zeros(0, dtype=object))
    assert empty.decode().size == 0 and empty.mask("x").size == 0


@pytest.mark.parametrize("kind", [np.int8, np.int16, np.int32, np.int64, np.uint8])
def test_strings_masks_equal_the_gather_of_hit_values_for_every_code(kind: type[np.integer]) -> None:
    """Masks of few hit values compare codes instead of gathering: the same rows, a negative code (−1:
    missing) reading the value it indexes from the end, as the gather did, with any number of hits."""
    rng = np.random.default_rng(7)
    for n in (1, 2, 5, 100, 127):
        values = np.array([f"v{i}" for i in range(n)], dtype=object)
        low = 0 if np.dtype(kind).kind == "u" else -n
        codes = rng.integers(low, n, 1000).astype(kind)
        strings = Strings(codes, values)
        for hits in range(min(n, 7) + 1):
            wanted = tuple(rng.choice(values, hits, replace=False)) + ("absent",)
            expected = np.isin(values, wanted)[codes]
            assert np.array_equal(strings.mask(*wanted), expected), (kind, n, hits)
            assert np.array_equal(strings.where(lambda v, w=wanted: v in w), expected), (kind, n, hits)
    assert Strings(np.zeros(3, dtype=np.int8), np.zeros(0, dtype=object)).mask("a").tolist() == [False] * 3


def test_starts_in_order_sorts_only_rows_out_of_order_and_keeps_ties_in_row_order() -> None:
    in_order = Table({"start": np.array([1, 2, 2, 5])})
    start, order = starts_in_order(in_order)
    assert order is None and start is in_order.col("start")  # the table's own column, no copy
    start, order = starts_in_order(Table({"start": np.array([5, 2, 9, 2, 1])}))
    assert start.tolist() == [1, 2, 2, 5, 9] and order.tolist() == [4, 1, 3, 0, 2]  # the tie at 2: row 1 first
    start, order = starts_in_order(Table.empty(["start"]))
    assert start.size == 0 and order is None
    assert stable_order(np.array([3, 3, 4])) is None and stable_order(np.array([7])) is None
    assert stable_order(np.array([2, 1, 2, 0])).tolist() == [3, 1, 0, 2]


def test_table_rows_by_position_mask_and_slice_keep_columns_aligned() -> None:
    t = Table({"start": np.array([30, 10, 20]), "name": Strings.encode(["c", "a", "b"])})
    assert len(t) == 3 and t.columns == ["start", "name"] and "name" in t and "end" not in t
    assert t[np.array([2, 0])].col("name").tolist() == ["b", "c"]
    assert t[t["start"] > 15].col("start").tolist() == [30, 20]
    assert t[1:].col("name").tolist() == ["a", "b"]
    ordered = t.sorted_by("start")
    assert ordered.col("start").tolist() == [10, 20, 30] and ordered.col("name").tolist() == ["a", "b", "c"]
    assert ordered.sorted_by("start") is ordered  # already in order: no copy
    assert [r.name for r in ordered.rows()] == ["a", "b", "c"]
    assert Table.concat([t, t]).col("name").tolist() == ["c", "a", "b"] * 2
    assert t.equals(Table({"start": np.array([30, 10, 20]), "name": Strings.encode(["c", "a", "b"])}))
    assert not t.equals(ordered)
    assert len(Table.empty(["a", "b"])) == 0 and len(t.select(["name"]).columns) == 1
    with pytest.raises(ValueError, match="rows"):
        t["extra"] = np.arange(4)


def test_a_table_without_columns_still_counts_rows() -> None:
    t = Table(rows=5)
    assert len(t) == 5 and len(t[np.array([True, False, True, False, False])]) == 2 and len(t[1:4]) == 3


def test_factorize_objects_without_floats_matches_the_value_by_value_path() -> None:
    """Object columns without a float skip the NaN test and build their distinct values without a Python
    loop (table.factorize); the codes and values are those the NaN-aware path gives."""
    import random

    rng = random.Random(3)
    pool = ["a", "b", "aten::mm", None, 1, (1, 2), b"x", True, ""]
    for _ in range(300):
        values = np.empty(rng.randint(1, 12), dtype=object)
        values[:] = [rng.choice(pool) for _ in range(values.size)]
        for keep_missing in (False, True):
            codes, distinct = factorize(values, keep_missing=keep_missing)
            with_nan = np.append(values, math.nan)  # a NaN last: the value-by-value path, same codes before it
            codes2, distinct2 = factorize(with_nan, keep_missing=keep_missing)
            assert codes.tolist() == codes2[:-1].tolist()
            assert distinct.tolist() == (distinct2[:-1] if keep_missing else distinct2).tolist()


def test_a_repeated_column_stays_one_value_through_take() -> None:
    """A timeline's process and device columns are one value broadcast: taking rows must not copy it per
    row, and must give the rows a plain column would."""
    t = Table({"start": np.array([30, 10, 20, 40]), "pid": repeated(np.array([7], dtype=np.int64), 4)})
    assert is_repeated(t["pid"]) and not is_repeated(t["start"])
    for rows in (np.array([2, 0, 0]), t["start"] > 15, slice(1, None), slice(None, None, -2), np.zeros(0, np.int64)):
        taken = t.take(rows)
        assert taken.col("pid").tolist() == [7] * len(taken) and len(taken) == t["start"][rows].size
        assert taken["pid"].dtype == np.int64 and (len(taken) < 2 or is_repeated(taken["pid"]))
    assert t.sorted_by("start").col("pid").tolist() == [7] * 4 and t.sorted_by("start")["pid"].strides == (0,)
    with pytest.raises(IndexError):
        t.take(np.array([True, False]))


def test_codes_are_as_narrow_as_their_distinct_values_allow() -> None:
    assert [code_type(n) for n in (0, 127, 128, 32767, 32768)] == [np.int8, np.int8, np.int16, np.int16, np.int32]
    assert Strings.encode(["a", "b", None]).codes.dtype == np.int8
    many = Strings.encode([f"k{i}" for i in range(300)])
    assert many.codes.dtype == np.int16 and many.decode().tolist() == [f"k{i}" for i in range(300)]
    both = Strings.concat([Strings.encode(["a"]), many])
    assert both.codes.dtype == np.int16 and both.decode().tolist() == ["a", *(f"k{i}" for i in range(300))]
    assert fitted(np.array([0, 2]), np.int8).dtype == np.int8
    assert fitted(np.array([0, 200]), np.int8).tolist() == [0, 200]  # does not fit: kept exact
