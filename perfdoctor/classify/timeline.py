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


def kernel_classes(kernels: pd.DataFrame) -> pd.DataFrame:
    """Columns ``category``, ``collective``, ``library`` (None where not applicable), aligned with ``kernels``."""
    if not len(kernels):
        return pd.DataFrame({"category": [], "collective": [], "library": []}, dtype=object)
    inverse, shorts, demangleds = name_pairs(kernels)
    category, collective, library = classify_names(shorts, demangleds)
    return _frame(np.asarray(category, dtype=object)[inverse], np.asarray(collective, dtype=object)[inverse],
                  np.asarray(library, dtype=object)[inverse])


def category_mask(kcls: pd.DataFrame, *categories: str) -> np.ndarray:
    """Boolean mask of the rows whose category is one of ``categories`` (integer compares on codes
    factorised once per table, instead of a string compare over millions of rows per question)."""
    codes, names = _category_codes(kcls)
    wanted = [i for i, name in enumerate(names) if name in categories]
    return np.isin(codes, wanted) if len(wanted) > 1 else codes == (wanted[0] if wanted else -2)


@per_object
def _category_codes(kcls: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    if not len(kcls):
        return np.zeros(0, dtype=np.int64), []
    codes, names = pd.factorize(kcls["category"].to_numpy(dtype=object))
    return codes, [str(n) for n in names]


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
