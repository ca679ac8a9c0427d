"""Attach the kernel taxonomy to a timeline's kernels and copies.

The taxonomy works on distinct names (a trace has hundreds, not millions): each distinct
(short, demangled) pair is classified once and the result is broadcast back with integer codes.
"""

from __future__ import annotations

import numpy as np

from perfdoctor.classify.kernels import classify_memcpy, classify_names
from perfdoctor.mapped import like, taken
from perfdoctor.memo import per_object
from perfdoctor.table import Strings, Table, factorize
from perfdoctor.width import code_type


@per_object
def name_pairs(kernels: Table) -> tuple[np.ndarray, list[str], list[str | None]]:
    """Distinct (short, demangled) kernel names: per kernel the index of its pair, and the pairs' names.

    Built from the dictionary codes in one linear pass (``factorize``); name rules then run once per
    distinct pair. Computed once per table (read-only result).
    """
    if not len(kernels):
        return np.zeros(0, dtype=np.int64), [], []
    short, demangled = kernels["short_name"], kernels["demangled_name"]
    width = len(demangled.values) + 1
    if (len(short.values) + 2) * width <= DENSE_PAIRS:
        inverse, pairs = _dense_pairs(short.codes, demangled.codes, width)
    else:
        inverse, pairs = factorize(short.codes.astype(np.int64) * width + demangled.codes)
        inverse = inverse.astype(code_type(pairs.size))  # kept for the timeline's life: as narrow as pairs are few
    # A key is short * width + demangled, the demangled code −1 where the name is missing: key + 1 splits
    # into the short code and demangled + 1.
    split = [divmod(int(p) + 1, width) for p in pairs]
    shorts = [str(short.values[s]) for s, _ in split]
    demangleds = [_text(demangled.values[d - 1]) if d else None for _, d in split]
    return inverse, shorts, demangleds


# Pairs of name codes up to this many (the product of the two dictionaries' sizes) are numbered through a
# table indexed by the pair, a slice of kernels at a time; more (a dictionary of millions of names): factorize.
DENSE_PAIRS = 1 << 24
PAIR_SLICE = 1 << 20


def _dense_pairs(short: np.ndarray, demangled: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``factorize`` of the pair keys ``short * width + demangled`` (codes in order of first appearance), a
    slice at a time through a table of every possible key: the per-kernel temporaries are a slice's, not the
    10M kernels' 80 MB int64 keys, shifts and codes at once."""
    base = width + 1  # codes are >= -1: keys >= -width - 1
    code_of = np.full((int(short.max(initial=0)) + 2) * width + 1, -1, dtype=np.int64)
    keys = []
    for lo in range(0, short.size, PAIR_SLICE):
        key = short[lo:lo + PAIR_SLICE].astype(np.int64) * width + demangled[lo:lo + PAIR_SLICE] + base
        new = key[code_of[key] < 0]
        if new.size:
            # in order of first appearance without sorting the slice: each new key's entry takes the least
            # (earliest) of its positions, as a value below −1; the positions that hold it are the firsts
            first = np.arange(new.size, dtype=np.int64) - (new.size + 1)
            np.minimum.at(code_of, new, first)
            distinct = new[code_of[new] == first]
            code_of[distinct] = np.arange(len(keys), len(keys) + distinct.size)
            keys.extend(distinct.tolist())
    inverse = like(short.size, code_type(len(keys)), short)
    for lo in range(0, short.size, PAIR_SLICE):
        key = short[lo:lo + PAIR_SLICE].astype(np.int64) * width + demangled[lo:lo + PAIR_SLICE] + base
        inverse[lo:lo + key.size] = code_of[key]
    return inverse, np.array(keys, dtype=np.int64) - base


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


CLASS_COLUMNS = ("category", "collective", "library")
Coded = tuple[np.ndarray, list]  # per row an index into the list of distinct values (None included)


def kernel_classes(kernels: Table) -> Table:
    """Columns ``category``, ``collective``, ``library`` (:class:`Strings`, None where not applicable),
    aligned with ``kernels``, their codes as narrow as their few values allow (int8: a byte per kernel and
    column). Measurements ask their questions through ``class_codes`` / ``class_mask``."""
    if not len(kernels):
        return _frame(*(np.zeros(0, dtype=object),) * 3)
    inverse, shorts, demangleds = name_pairs(kernels)
    columns = {}
    for column, values in zip(CLASS_COLUMNS, classify_names(shorts, demangleds)):
        pair_codes, distinct = factorize(np.asarray(values, dtype=object), keep_missing=True)
        columns[column] = Strings(taken(pair_codes.astype(code_type(distinct.size)), inverse, inverse.size), distinct)
    return Table(columns, rows=len(kernels))


def class_codes(cls: Table) -> dict[str, Coded]:
    """Per taxonomy column, integer codes and the distinct values: counts, sums and masks over a million
    rows become ``bincount`` and integer compares."""
    return {c: (cls[c].codes, list(cls[c].values)) for c in CLASS_COLUMNS}


def class_mask(cls: Table, column: str, *values: str | None) -> np.ndarray:
    """Boolean mask of the rows whose ``column`` is one of ``values``."""
    return cls[column].mask(*values)


def category_mask(cls: Table, *categories: str) -> np.ndarray:
    """Rows whose category is one of ``categories`` (the question most measurements ask)."""
    return class_mask(cls, "category", *categories)


def copy_classes(memcpy: Table) -> Table:
    """Taxonomy of memcpy rows from their copy kind: peer copies are communication."""
    if not len(memcpy):
        return _frame(*(np.zeros(0, dtype=object),) * 3)
    kinds, inverse = np.unique(memcpy.col("copy_kind"), return_inverse=True)
    classes = [classify_memcpy(int(k)) for k in kinds]
    return _frame(np.array([c.category for c in classes], dtype=object)[inverse],
                  np.array([c.collective for c in classes], dtype=object)[inverse],
                  np.array([c.library for c in classes], dtype=object)[inverse])


def _frame(category: np.ndarray, collective: np.ndarray, library: np.ndarray) -> Table:
    return Table({"category": Strings.encode(category), "collective": Strings.encode(collective),
                  "library": Strings.encode(library)})
