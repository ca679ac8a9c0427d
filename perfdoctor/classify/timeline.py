"""Attach the kernel taxonomy to a timeline's kernels and copies.

The taxonomy works on distinct names (a trace has hundreds, not millions): each distinct
(short, demangled) pair is classified once and the result is broadcast back with integer codes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfdoctor.classify.kernels import classify_memcpy, classify_names


def kernel_classes(kernels: pd.DataFrame) -> pd.DataFrame:
    """Columns ``category``, ``collective``, ``library`` (None where not applicable), aligned with ``kernels``."""
    if not len(kernels):
        return pd.DataFrame({"category": [], "collective": [], "library": []}, dtype=object)
    short = kernels["short_name"].cat
    demangled = kernels["demangled_name"].cat
    pair = short.codes.to_numpy().astype(np.int64) * (len(demangled.categories) + 1) + demangled.codes.to_numpy()
    _, first, inverse = np.unique(pair, return_index=True, return_inverse=True)
    shorts = kernels["short_name"].to_numpy(dtype=object)[first]
    demangleds = kernels["demangled_name"].to_numpy(dtype=object)[first]
    category, collective, library = classify_names(list(shorts), list(demangleds))
    return _frame(np.asarray(category, dtype=object)[inverse], np.asarray(collective, dtype=object)[inverse],
                  np.asarray(library, dtype=object)[inverse])


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
