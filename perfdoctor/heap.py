"""glibc's allocator set up for an analysis: many short-lived arrays of megabytes, freed and made again.

By default glibc serves each allocation above a threshold (128 kB, raised on the fly up to 32 MB) with
its own ``mmap`` and unmaps it when freed, gives the top of its heap back to the kernel past a trim
threshold, and gives each new thread an arena of its own. An analysis of a million kernels makes
hundreds of temporary arrays of 8 MB, and the SQLite reading threads fill Arrow buffers that are freed
as soon as they are copied out: under the defaults most arrays are fresh pages, each faulted in and
zeroed by the kernel, while the memory the reading threads freed sits in their arenas, out of the main
thread's reach. So: the mmap threshold is fixed at its ceiling (32 MB; larger arrays are still mapped
on their own), the heap is trimmed only past 1 GiB, and every thread shares one arena. Measured on a
1M-kernel export (``perfdoctor analyze``'s work, benchmarks/timed.py, medians of 11 alternating pairs on
2 cores): the thresholds took 0.72-0.80 s to 0.61 s (71k page faults to 42k; peak RSS 342 to 432 MB),
one arena a further 7-12 % (34k page faults).

numpy also asks the kernel for huge pages (``madvise(MADV_HUGEPAGE)``) on every array of 4 MB or more. For
an array the heap serves (below the mmap threshold) that buys nothing: its pages are reused, not faulted
again, while each advice splits the heap's mapping under the process's memory lock (the other thread's page
faults wait) and a fault there may first compact memory to find 2 MB free (``defrag=madvise``, the kernel's
default). So the advice is off (:func:`keep_freed_memory`) except while arrays past the mmap threshold are
made (:func:`huge_pages_for`: a 10M-kernel timeline's columns), which are fresh pages every time and where
2 MB pages mean 512 times fewer faults. Measured on the 1M-kernel export (numpy's advice on vs off, the
whole installed CLI, 8 alternating pairs twice, busy 2-core machine): off took 0.09-0.17 s less wall time
and 0.06-0.14 s less CPU per run (in-process: -0.29 s analysis, -0.07 s loading); on the 10M one, off
everywhere took 1.9 s more CPU (4.2M page faults instead of 0.3M). Set by the commands that analyse traces
(and their pool workers), never by importing perfdoctor: a library must not retune its host process's
allocator.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
TRIM_ABOVE = 1 << 30
MMAP_ABOVE = 32 << 20  # glibc's largest allowed mmap threshold on 64-bit (4 * 1024 * 1024 * sizeof(long))


def keep_freed_memory() -> bool:
    """Tune glibc's malloc and numpy's huge-page advice as the module docstring says; whether malloc's
    tuning took (False off glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    global _managed
    _managed = True
    _huge_page_advice(False)
    return tune_malloc()


def tune_malloc() -> bool:
    """glibc's part of :func:`keep_freed_memory`, without importing numpy: for a command that starts threads
    before numpy is imported (:mod:`perfdoctor.load.read_ahead`), whose first allocation would otherwise
    give each its own arena. Whether it took."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all([mallopt(M_TRIM_THRESHOLD, TRIM_ABOVE), mallopt(M_MMAP_THRESHOLD, MMAP_ABOVE), mallopt(M_ARENA_MAX, 1)])


_managed = False  # whether this process's allocator was set up (keep_freed_memory): only then is the advice ours


def _huge_page_advice(on: bool) -> bool | None:
    """Set numpy's ``MADV_HUGEPAGE`` advice for the arrays made from now on; the setting it replaces, or None
    where this numpy has no switch (private since numpy 1.20, as ``NUMPY_MADVISE_HUGEPAGE``: such a numpy
    keeps its default)."""
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:
        try:
            from numpy.core.multiarray import _set_madvise_hugepage
        except ImportError:
            return None
    return bool(_set_madvise_hugepage(on))


@contextmanager
def huge_pages_for(array_bytes: int) -> Iterator[None]:
    """Within the block numpy advises huge pages when arrays of ``array_bytes`` are mapped on their own
    (at least :data:`MMAP_ABOVE`), else not (module docstring); the setting before is restored after. A no-op
    in a process whose allocator perfdoctor did not set up (a library caller's)."""
    if not _managed:
        yield
        return
    before = _huge_page_advice(array_bytes >= MMAP_ABOVE)
    try:
        yield
    finally:
        if before is not None:
            _huge_page_advice(before)


def give_back_freed(copied_bytes: int) -> bool:
    """Hand the heap's free pages back to the kernel after a table of ``copied_bytes`` was copied out of the
    SQLite reader's Arrow chunks; whether it did.

    The reader fills many small chunks (heap memory) and frees them once copied into numpy; columns of at
    least :data:`MMAP_ABOVE` bytes are mapped on their own, so nothing later reuses those freed chunks and
    they stay resident: measured on a 10M-kernel export, 600 MB of the 1.3 GB held after reading the kernels.
    Below that size later arrays reuse the freed chunks (what :func:`keep_freed_memory` is for), so the heap
    is left as it is."""
    return copied_bytes >= MMAP_ABOVE and give_back()


def give_back() -> bool:
    """Hand the heap's free pages back to the kernel (``malloc_trim``); whether it did (False off glibc).
    For the end of a phase whose temporaries later phases do not reuse. It only returns whole free pages;
    it never moves or frees live data."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes, malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(malloc_trim(0))
