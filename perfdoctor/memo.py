"""Compute-once results for the objects of one analysis (a timeline, its kernel table).

Several detectors need the same derived arrays — the distinct kernel names, each kernel's launch
call — and on a million-kernel trace each recomputation costs tens of milliseconds. ``per_object``
caches a one-argument function's result for as long as its argument lives, keyed by identity (tables
are not hashable, and two equal tables are still two inputs). Results are shared: callers must treat
them as read-only. ``fn.prime(obj, result)`` stores a result its producer computed anyway (the
kernel taxonomy knows its codes while it builds the table).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def per_object(fn: Callable[[Any], T]) -> Callable[[Any], T]:
    cache: dict[int, tuple[weakref.ref, T]] = {}

    def remember(obj: Any, result: T) -> T:
        key = id(obj)
        cache[key] = (weakref.ref(obj, lambda _ref, key=key: cache.pop(key, None)), result)
        return result

    @functools.wraps(fn)
    def cached(obj: Any) -> T:
        hit = cache.get(id(obj))
        if hit is not None and hit[0]() is obj:
            return hit[1]
        return remember(obj, fn(obj))

    cached.prime = remember  # type: ignore[attr-defined]  # a producer that already knows the result
    return cached
