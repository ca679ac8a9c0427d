"""How many cores one task (one input file) may use, and work done beside it on a second one.

perfdoctor.execute runs one task per process on as many processes as ``--jobs`` allows; a task alone
(one file, or ``--jobs 1``) has every core of ``--jobs`` to itself, a task in a pool worker one.
:data:`PER_TASK` says which: the SQLite reader splits a large table into that many slices read at
once, and the analysis of a timeline runs its independent measurements beside each other
(:func:`beside`). numpy releases the GIL in its array loops, so two threads of array work overlap:
measured on a 1M-kernel timeline, host gaps and launch statistics beside group labelling and the
breakdown took 58 ms instead of 94 ms (medians of 5, 2 cores).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

T = TypeVar("T")

PER_TASK = 1  # set by perfdoctor.execute for the duration of a run


_UNSET: Any = object()


class Later(Generic[T]):
    """A result computed beside the caller (a Future), or on demand where there is no core to spare."""

    def __init__(self, fn: Callable[..., T], args: tuple[Any, ...], future: Future | None) -> None:
        self._fn, self._args, self._future, self._value = fn, args, future, _UNSET

    def result(self) -> T:
        if self._future is not None:
            return self._future.result()
        if self._value is _UNSET:
            self._value = self._fn(*self._args)
        return self._value


_pool: Any = None


def beside(fn: Callable[..., T], *args: Any) -> Later[T]:
    """``fn(*args)`` started on a second thread when this task has a second core, else computed when
    its result is asked for. ``fn`` must not mutate what the caller goes on using."""
    if PER_TASK < 2:
        return Later(fn, args, None)
    global _pool
    if _pool is None:
        from concurrent.futures import ThreadPoolExecutor

        _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="perfdoctor-beside")
    return Later(fn, args, _pool.submit(fn, *args))
