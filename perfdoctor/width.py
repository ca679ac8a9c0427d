"""Integer columns at the width their values need.

What a rank's task sends back is held by the process that assembles the report until the cross-rank
join, for every rank at once: times within a step fit 32 bits as offsets from the step's first, codes
and indexes fit 8 or 16. :func:`narrow` picks the smallest integer type that holds a column's values
exactly; :func:`offsets` stores times as a base plus narrow offsets; reading them back (``astype``, or
base + offsets as int64) gives the very same values.
"""

from __future__ import annotations

import numpy as np

from perfdoctor.mapped import converted

KINDS = (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64)


def narrow(values: np.ndarray) -> np.ndarray:
    """``values`` (integers) in the smallest integer type that holds every one of them."""
    if not values.size:
        return values
    lo, hi = int(values.min()), int(values.max())
    for kind in KINDS:
        info = np.iinfo(kind)
        if info.min <= lo and hi <= info.max:
            return values.astype(kind)
    return values


def fits(values: np.ndarray, kind: type[np.integer]) -> bool:
    """Whether every one of ``values`` (integers) lies within ``kind``'s range (none does not matter)."""
    info = np.iinfo(kind)
    return not values.size or (info.min <= int(values.min()) and int(values.max()) <= info.max)


def fitted(values: np.ndarray, kind: type[np.integer]) -> np.ndarray:
    """``values`` (integers) as ``kind`` when every one of them fits it (no copy when they already are), else
    as they are: a column of small ids or flags at the width it needs."""
    return converted(values, kind) if fits(values, kind) else values


def code_type(distinct: int) -> type[np.integer]:
    """The narrowest signed integer type for codes into ``distinct`` values: int8 for a taxonomy's handful,
    int16 for a trace's kernel or call names, int32 beyond. Signed, so that −1 (missing) keeps its meaning;
    whoever does arithmetic on codes widens them first (``codes.astype(np.int64) * n``)."""
    for kind in (np.int8, np.int16, np.int32):
        if distinct <= np.iinfo(kind).max:
            return kind
    return np.int64


def offsets(times: np.ndarray) -> tuple[int, np.ndarray]:
    """``times`` (int64) as their minimum and the narrow offsets from it."""
    if not times.size:
        return 0, times
    base = int(times.min())
    return base, narrow(times - base)


def widened(base: int, rest: np.ndarray) -> np.ndarray:
    """The int64 times that :func:`offsets` gave ``base`` and ``rest`` for."""
    return rest.astype(np.int64) + base


def rows(columns: dict[str, np.ndarray]) -> np.ndarray:
    """Aligned columns as one structured array, each field of its column's type: one object and one
    buffer instead of a numpy array each (~100 bytes of header apiece, as much as a short column's data)."""
    out = np.empty(len(next(iter(columns.values()))) if columns else 0,
                   dtype=[(name, column.dtype) for name, column in columns.items()])
    for name, column in columns.items():
        out[name] = column
    return out
