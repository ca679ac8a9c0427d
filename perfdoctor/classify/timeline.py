"""Attach the kernel taxonomy to a timeline's kernels and copies.

The taxonomy works on distinct names (a trace has hundreds, not millions): each distinct
(short, demangled) pair is classified once and the result is broadcast back with integer codes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfdoctor.classify.kernels import classify_memcpy, classify_names
from perfdoctor.memo import per_object


@per_object
def name_pairs(kernels: pd.DataFrame) -> tuple[np.ndarray, list[str], list[str | None]]:
    """Distinct (short, demangled) kernel names: per kernel the index of its pair, and the pairs' names.

    Built from the categorical codes with a hash (``pd.factorize``), so a million kernels cost one
    linear pass; name rules then run once per distinct pair. Computed once per table (read-only result).
    """
    if not len(kernels):
        return np.zeros(0, dtype=np.int64), [], []
    short, demangled = kernels["short_name"].cat, kernels["demangled_name"].cat
    width = len(demangled.categories) + 1
    pair = short.codes.to_numpy().astype(np.int64) * width + demangled.codes.to_numpy()
    inverse, pairs = pd.factorize(pair)
    shorts = [str(short.categories[p // width]) for p in pairs]
    demangleds = [str(demangled.categories[p % width]) if p % width < width - 1 and p % width >= 0 else None
                  for p in pairs]
    return inverse, shorts, demangleds


CLASS_COLUMNS = ("category", "collective", "library")
Coded = tuple[np.ndarray, list]  # per row an index into the list of distinct values (None included)


def kernel_classes(kernels: pd.DataFrame) -> pd.DataFrame:
    """Columns ``category``, ``collective``, ``library`` (categoricals, missing where not applicable),
    aligned with ``kernels``. Measurements ask their questions through ``class_codes`` / ``class_mask``."""
    if not len(kernels):
        return pd.DataFrame({"category": [], "collective": [], "library": []}, dtype=object)
    inverse, shorts, demangleds = name_pairs(kernels)
    coded = {}
    for column, values in zip(CLASS_COLUMNS, classify_names(shorts, demangleds)):
        pair_codes, distinct = _factorize(np.asarray(values, dtype=object))
        coded[column] = (pair_codes[inverse], distinct)
    frame = pd.DataFrame({c: _categorical(*coded[c]) for c in CLASS_COLUMNS})
    class_codes.prime(frame, coded)
    return frame


@per_object
def class_codes(cls: pd.DataFrame) -> dict[str, Coded]:
    """Per taxonomy column, integer codes and the distinct values: counts, sums and masks over a million
    rows become ``bincount`` and integer compares. ``kernel_classes`` primes it; other tables factorise."""
    return {c: _factorize(cls[c].to_numpy(dtype=object)) for c in CLASS_COLUMNS}


def _categorical(codes: np.ndarray, distinct: list) -> pd.Categorical:
    """A categorical of coded values without materialising a million Python strings; None → missing."""
    present = [v for v in distinct if v is not None]
    remap = np.array([present.index(v) if v is not None else -1 for v in distinct], dtype=np.int64)
    return pd.Categorical.from_codes(remap[codes], categories=pd.Index(present, dtype=object))


def _factorize(values: np.ndarray) -> Coded:
    """``pd.factorize`` keeping None as a value of its own (pandas reports it as NaN)."""
    codes, distinct = pd.factorize(values, use_na_sentinel=False)
    return codes, [None if v is None or v != v else v for v in distinct]


def class_mask(cls: pd.DataFrame, column: str, *values: str | None) -> np.ndarray:
    """Boolean mask of the rows whose ``column`` is one of ``values``."""
    codes, distinct = class_codes(cls)[column]
    wanted = [i for i, v in enumerate(distinct) if v in values]
    return np.isin(codes, wanted) if len(wanted) > 1 else codes == (wanted[0] if wanted else -2)


def category_mask(cls: pd.DataFrame, *categories: str) -> np.ndarray:
    """Rows whose category is one of ``categories`` (the question most measurements ask)."""
    return class_mask(cls, "category", *categories)


def copy_classes(memcpy: pd.DataFrame) -> pd.DataFrame:
    """Taxonomy of memcpy rows from their copy kind: peer copies are communication."""
    if not len(memcpy):
        return pd.DataFrame({"category": [], "collective": [], "library": []}, dtype=object)
    kinds, inverse = np.unique(memcpy["copy_kind"].to_numpy(), return_inverse=True)
    classes = [classify_memcpy(int(k)) for k in kinds]
    return _frame(np.array([c.category for c in classes], dtype=object)[inverse],
                  np.array([c.collective for c in classes], dtype=object)[inverse],
                  np.array([c.library for c in classes], dtype=object)[inverse])


def _frame(category: np.ndarray, collective: np.ndarray, library: np.ndarray) -> pd.DataFrame:
    """Plain object columns: pandas would otherwise store Arrow strings, and every ``to_numpy`` of a
    measurement would rebuild millions of Python strings."""
    return pd.DataFrame({"category": pd.Series(category, dtype=object),
                         "collective": pd.Series(collective, dtype=object),
                         "library": pd.Series(library, dtype=object)})
