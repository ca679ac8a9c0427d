"""Compute-once results for the objects of one analysis (a timeline, its kernel table).

Several detectors need the same derived arrays — the distinct kernel names, each kernel's launch
call — and on a million-kernel trace each recomputation costs tens of milliseconds. ``per_object``
caches a one-argument function's result for as long as its argument lives, keyed by identity (tables
are not hashable, and two equal tables are still two inputs). Results are shared: callers must treat
them as read-only. ``fn.prime(obj, result)`` stores a result its producer computed anyway (the
kernel taxonomy knows its codes while it builds the table).

The critical path is computed on a second thread beside the other measurements (perfdoctor.cores.beside),
and both ask for some of these (the process's host pauses, the call lookup): a result being computed is
waited for, not computed again beside it. Measured on a 10M-kernel export: the host pauses were computed
by both threads at once, 0.36 s and 0.31 s.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def per_object(fn: Callable[[Any], T]) -> Callable[[Any], T]:
    cache: dict[int, tuple[weakref.ref, T]] = {}
    computing: dict[int, threading.RLock] = {}  # per object being computed: held by the thread computing it
    guard = threading.Lock()

    def remember(obj: Any, result: T) -> T:
        key = id(obj)
        cache[key] = (weakref.ref(obj, lambda _ref, key=key: cache.pop(key, None)), result)
        return result

    def hit(obj: Any) -> tuple[bool, Any]:
        found = cache.get(id(obj))
        return (True, found[1]) if found is not None and found[0]() is obj else (False, None)

    @functools.wraps(fn)
    def cached(obj: Any) -> T:
        known, result = hit(obj)
        if known:
            return result
        with guard:
            lock = computing.setdefault(id(obj), threading.RLock())
        with lock:  # another thread computing it: wait for its result
            known, result = hit(obj)
            try:
                return result if known else remember(obj, fn(obj))
            finally:
                with guard:
                    if computing.get(id(obj)) is lock:
                        del computing[id(obj)]

    cached.prime = remember  # type: ignore[attr-defined]  # a producer that already knows the result
    return cached
