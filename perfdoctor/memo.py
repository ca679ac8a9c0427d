"""Compute-once results for the objects of one analysis (a timeline, its kernel table).

Several detectors need the same derived arrays — the distinct kernel names, each kernel's launch
call — and on a million-kernel trace each recomputation costs tens of milliseconds. ``per_object``
caches a one-argument function's result for as long as its argument lives, keyed by identity (tables
are not hashable, and two equal tables are still two inputs). Results are shared: callers must treat
them as read-only.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def per_object(fn: Callable[[Any], T]) -> Callable[[Any], T]:
    cache: dict[int, tuple[weakref.ref, T]] = {}

    @functools.wraps(fn)
    def cached(obj: Any) -> T:
        key = id(obj)
        hit = cache.get(key)
        if hit is not None and hit[0]() is obj:
            return hit[1]
        result = fn(obj)
        cache[key] = (weakref.ref(obj, lambda _ref, key=key: cache.pop(key, None)), result)
        return result

    return cached
