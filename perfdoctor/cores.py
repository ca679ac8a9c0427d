"""How many cores one task (one input file) may use, and work done beside it on a second one.

perfdoctor.execute runs one task per process on as many processes as ``--jobs`` allows; a task alone
(one file, or ``--jobs 1``) has every core of ``--jobs`` to itself, a task in a pool worker one.
:data:`PER_TASK` says which: the SQLite reader splits a large table into that many slices read at
once, and the analysis of a timeline runs its independent measurements beside each other
(:func:`beside`). numpy releases the GIL in its array loops, so two threads of array work overlap:
the critical path (perfdoctor.blame, the largest piece of a timeline's analysis) is computed beside the
other measurements (perfdoctor.api.analyze_timeline).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

T = TypeVar("T")

PER_TASK = 1  # set by perfdoctor.execute for the duration of a run
# A timeline whose event tables hold more than this is measured one measurement at a time even with a
# second core: side by side, their temporary arrays are alive at once. Measured on a 10M-kernel export
# (830 MB of tables; whole `perfdoctor analyze --format json` in-process, 2 cores, 4 alternating pairs on a
# busy machine): peak RSS 2,571-2,678 MiB side by side, 2,034-2,083 one at a time, for 3-22 % (median
# about 12 %) more wall time. Memory bounded first: the time is won back elsewhere, not by doubling peaks.
SIDE_BY_SIDE_MAX_BYTES = 256 << 20
# Mapped tables (perfdoctor.mapped) are not in memory, but each measurement still makes some arrays of a
# value per kernel (a few bytes each): side by side past this many bytes of tables, two such sets are alive
# at once. Measured on one GPU's 30M kernels (2 GB of tables): peak RSS 905 MB side by side, ~670 MB one at
# a time; on 10M kernels (700 MB) side by side took 0.81x the wall time for 506 MB.
SIDE_BY_SIDE_MAPPED_MAX_BYTES = 1 << 30
# A timeline whose tables hold less than this is measured one measurement at a time too: starting a thread
# and handing the interpreter lock back and forth cost more than the overlap wins on small arrays. Measured
# (whole analysis in-process, paired alternating runs, 2 busy cores): the 2-GPU real export (0.8 MB of
# tables) 14-25 ms faster one at a time, a 100k-kernel export (8 MB) 19-21 ms faster.
SIDE_BY_SIDE_MIN_BYTES = 16 << 20
_side_by_side = True
_UNSET: Any = object()
# How long a thread may hold the interpreter lock while another waits for it, in a whole `perfdoctor analyze`
# process (Python's default: 5 ms). The threads of an analysis (the slice readers, the work beside, the
# pager of mapped columns) release it in every large array operation, so one seldom waits long for it; the
# default also forces it over every 5 ms of a stretch of small operations, a context switch each way.
# Measured on a 10M-kernel export (the whole CLI, 2 cores, two runs of 5 and 6 alternating pairs): 50 ms
# took 2.1 % and 1.9 % less wall time, 1.2 % and 2.0 % less CPU.
SWITCH_INTERVAL_S = 0.05


class Later(Generic[T]):
    """``fn(*args)``, computed on a thread of its own from the start, or on demand; :meth:`result`
    gives its value or raises its exception. The thread is a daemon and ends with its work: nothing
    lingers to be joined at exit (Ctrl-C stays prompt) or to keep a later pool from forking."""

    def __init__(self, fn: Callable[..., T], args: tuple[Any, ...], start: bool) -> None:
        self._fn, self._args = fn, args
        self._value: Any = _UNSET
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # computed on demand once, whichever thread asks first
        if start:
            self._thread = threading.Thread(target=self._run, name="perfdoctor-beside", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._fn(*self._args)
        except BaseException as exc:  # handed to the caller of result()
            self._error = exc

    def result(self) -> T:
        if self._thread is not None:
            self._thread.join()
        else:
            with self._lock:
                if self._value is _UNSET and self._error is None:
                    self._run()
        if self._error is not None:
            raise self._error
        return self._value


def beside(fn: Callable[..., T], *args: Any) -> Later[T]:
    """``fn(*args)`` started on a second thread when this task has a second core (and the timeline is not
    too large for two measurements' arrays at once: :func:`sized_for`), else computed when its result is
    asked for. ``fn`` must not mutate what the caller goes on using."""
    return Later(fn, args, start=PER_TASK > 1 and _side_by_side)


def on_demand(fn: Callable[..., T], *args: Any) -> Later[T]:
    """``fn(*args)``, computed by the first thread that asks for its result (the others wait for it): work
    that one thread needs later and another, with time to spare, can do before it does."""
    return Later(fn, args, start=False)


@contextmanager
def sized_for(table_bytes: int, in_memory: int | None = None) -> Iterator[None]:
    """Within the block, :func:`beside` runs measurements on a second thread only when the timeline's
    tables hold at least :data:`SIDE_BY_SIDE_MIN_BYTES` (the thread pays for itself) and memory stays
    bounded by one measurement's arrays: the tables in memory (``in_memory``; all of them when not given)
    at most :data:`SIDE_BY_SIDE_MAX_BYTES`, all of them (mapped ones too: perfdoctor.mapped) at most
    :data:`SIDE_BY_SIDE_MAPPED_MAX_BYTES`."""
    global _side_by_side
    in_memory = table_bytes if in_memory is None else in_memory
    before, _side_by_side = _side_by_side, (SIDE_BY_SIDE_MIN_BYTES <= table_bytes <= SIDE_BY_SIDE_MAPPED_MAX_BYTES
                                            and in_memory <= SIDE_BY_SIDE_MAX_BYTES)
    try:
        yield
    finally:
        _side_by_side = before


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """numpy, when imported inside the block, with one BLAS thread. OpenBLAS (numpy's wheels) starts a thread
    per core as it loads, and each spins about 0.1 s waiting for work that an analysis never gives it (no
    measurement multiplies matrices): measured on 2 cores, `perfdoctor analyze` of a 1M-kernel export spent
    0.11 s less CPU with one thread, and that spin held the core the first slices are read on while the
    command imports (perfdoctor.load.read_ahead). OpenBLAS reads ``OPENBLAS_NUM_THREADS`` once, as it loads:
    the variable is set for the import only, so the processes the command starts inherit the environment
    as it was. A user's own setting, or a numpy already imported, is left alone."""
    import os
    import sys

    if "numpy" in sys.modules or "OPENBLAS_NUM_THREADS" in os.environ:
        yield
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        os.environ.pop("OPENBLAS_NUM_THREADS", None)
