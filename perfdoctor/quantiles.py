"""``np.median`` and ``np.percentile`` of a 1-D array, numpy.ma left unimported.

numpy's median of floating-point values looks for NaNs through ``np.ma.isMaskedArray``, and its percentile
sorts through ``np.unique``, which asks ``np.ma.is_masked``: either imports numpy.ma on first use, 9–10 ms
of every `perfdoctor analyze` (about 3 % of the whole command on the bundled 2-GPU export, whose first
step time asked for it). These give what numpy gives, value for value: the same partition and ``np.mean``
of the one or two middle values for the median, numpy's own arithmetic of the ``linear`` method for the
percentile, NaN when a value is NaN. Other inputs (integers, which have no NaN check in the median; empty
or many-dimensional arrays) go to numpy itself.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def median(values: Any, overwrite_input: bool = False) -> Any:
    """``np.median(values, overwrite_input=overwrite_input)``."""
    a = np.asanyarray(values)
    if a.dtype.kind != "f" or a.ndim != 1 or not a.size or type(a) is not np.ndarray:
        return np.median(a, overwrite_input=overwrite_input)
    n = a.size
    middle = slice(n // 2 - 1, n // 2 + 1) if n % 2 == 0 else slice(n // 2, n // 2 + 1)
    kth = [middle.start, middle.stop - 1, -1] if n % 2 == 0 else [middle.start, -1]
    if overwrite_input:
        a.partition(kth)
        part = a
    else:
        part = np.partition(a, kth)
    last = part[-1]  # a NaN, if there is one, sorts last
    return last if np.isnan(last) else np.mean(part[middle], axis=0)


def percentile(values: Any, q: float) -> Any:
    """``np.percentile(values, q)`` for a number ``q`` in [0, 100] (the ``linear`` method: the value ``q`` %
    of the way from the smallest to the largest, interpolated between the two nearest)."""
    a = np.asanyarray(values)
    if a.dtype != np.float64 or a.ndim != 1 or not a.size or type(a) is not np.ndarray or not 0 <= q <= 100:
        return np.percentile(a, q)
    n = a.size
    virtual = (n - 1) * (q / 100)  # numpy: (n - 1) * quantile, in float64
    below = -1 if virtual >= n - 1 else math.floor(virtual)  # past the last: the last, as index -1
    above = -1 if below == -1 else below + 1
    part = np.partition(a, sorted({below % n, above % n, n - 1}))  # the two nearest, and the last for NaN
    if np.isnan(part[-1]):
        return part[-1]
    lo, hi = float(part[below]), float(part[above])
    gamma = virtual - below
    diff = hi - lo
    return np.float64(hi - diff * (1 - gamma) if gamma >= 0.5 else lo + diff * gamma)
