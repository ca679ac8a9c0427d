"""Run one task function over many inputs: in this process, in a process pool, or on a Dask cluster.

DESIGN §1 "Execution": the unit of work is one input file (one rank, or the ranks of one node), and
only small per-rank summaries come back, so peak memory is one file per worker whatever the executor.
Results come back in input order, so the report does not depend on which worker finished first.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from perfdoctor.errors import InputError

if TYPE_CHECKING:
    import multiprocessing.context

T = TypeVar("T")
R = TypeVar("R")
Progress = Callable[[int, int, str], None]


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def run_tasks(fn: Callable[[T], R], tasks: Sequence[T], jobs: int | None = None, dask: str | None = None,
              progress: Progress | None = None, what: str = "ranks", keep: Callable[[R], Any] | None = None
              ) -> list[Any]:
    """``[fn(t) for t in tasks]``, run by ``jobs`` processes (default: the cores) or on the Dask cluster
    ``dask`` ("local" starts a LocalCluster of ``jobs`` single-threaded workers; else a scheduler address).
    ``progress(done, total, what)`` is called as tasks finish. A task's exception is raised here.
    ``keep(result)``, in this process, is what is kept of each result as it arrives (so a thousand results
    are never all held as they came); the results themselves without it."""
    jobs = jobs or default_jobs()
    if jobs < 1:
        raise InputError(f"--jobs must be at least 1, not {jobs}")
    total = len(tasks)

    def report(done: int) -> None:
        if progress is not None:
            progress(done, total, f"{done}/{total} {what} analysed")

    report(0)
    keep = keep or (lambda result: result)
    if dask is not None:
        return [keep(result) for result in _on_dask(fn, tasks, jobs, dask, report)]
    if jobs == 1 or total <= 1:
        results = []
        with _cores_per_task(jobs):  # a task alone has every core of --jobs
            for task in tasks:
                results.append(keep(fn(task)))
                report(len(results))
        return results
    from concurrent.futures import ProcessPoolExecutor, as_completed  # a pool only for several tasks

    results: list[Any] = [None] * total
    with ProcessPoolExecutor(max_workers=min(jobs, total), mp_context=_context(), initializer=_one_core) as pool:
        futures = {pool.submit(fn, task): i for i, task in enumerate(tasks)}
        for done, future in enumerate(as_completed(futures), 1):
            results[futures.pop(future)] = keep(future.result())  # the future would hold the result as it came
            report(done)
    return results


@contextmanager
def _cores_per_task(count: int) -> Iterator[None]:
    """The cores one task may use (perfdoctor.cores.PER_TASK), for the duration of the block."""
    from perfdoctor import cores

    before, cores.PER_TASK = cores.PER_TASK, count
    try:
        yield
    finally:
        cores.PER_TASK = before


def _one_core() -> None:
    """Pool worker set-up: every core runs a worker, so a task uses one thread (measured on 64 ranks with
    2 workers: 4.8 s with a second reading thread, 5.0 s without, within the noise, and 407 against
    384 MiB)."""
    from perfdoctor import cores
    from perfdoctor.heap import keep_freed_memory

    cores.PER_TASK = 1
    keep_freed_memory()  # as the command that started the pool (a forked worker has it already)


def _context() -> multiprocessing.context.BaseContext:
    """Workers forked from this process while that is safe (it has imported the pipeline already, so they
    start at once: measured 1.68x on 2 cores for 64 ranks, against 1.52x through a fork server); otherwise
    from a clean server process that imports the pipeline once, safe where forking this one is not
    (threads of a progress bar, native threads of a reader already used, a test runner, Dask)."""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if main is not None and not os.path.exists(main):  # `python -` (<stdin>): a server could not re-import it
        return multiprocessing.get_context("fork")
    if threading.active_count() == 1 and "connectorx.connectorx" not in sys.modules:
        # No other Python thread can hold a lock, and the SQLite reader's native (Rust) thread pool, which
        # does not survive a fork, has not started: the CLI's case, whose workers do all the reading.
        return multiprocessing.get_context("fork")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["perfdoctor.api"])
    return ctx


def _on_dask(fn: Callable[[T], R], tasks: Sequence[T], jobs: int, address: str,
             report: Callable[[int], None]) -> list[R]:
    try:
        from distributed import Client, LocalCluster
        from distributed import as_completed as dask_completed
    except ImportError:
        raise InputError("--dask needs the distributed extra: pip install 'perfdoctor[distributed]'") from None
    if address == "local":
        cluster = LocalCluster(n_workers=min(jobs, max(len(tasks), 1)), threads_per_worker=1, processes=True,
                               dashboard_address=None)
    elif address.startswith(("tcp://", "tls://", "ucx://")):
        cluster = None
    else:
        raise InputError(f"--dask {address!r}: give `local` or a scheduler address such as tcp://HOST:8786")
    try:
        with Client(cluster if cluster is not None else address) as client:
            futures = client.map(fn, tasks, pure=False)
            for done, _ in enumerate(dask_completed(futures), 1):
                report(done)
            return client.gather(futures)
    except OSError as exc:
        raise InputError(f"--dask {address}: cannot reach the scheduler ({exc})") from None
    finally:
        if cluster is not None:
            cluster.close()
