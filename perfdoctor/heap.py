"""glibc's allocator set up for an analysis: many short-lived arrays of megabytes, freed and made again.

By default glibc serves each allocation above a threshold (128 kB, raised on the fly up to 32 MB) with
its own ``mmap`` and unmaps it when freed, and gives the top of its heap back to the kernel past a
trim threshold. An analysis of a million kernels makes hundreds of temporary arrays of 8 MB: under the
defaults most are fresh pages, each faulted in and zeroed by the kernel, and every unmap in a process
with reading threads costs a TLB shoot-down on every core. Fixing the mmap threshold at its ceiling
(32 MB: larger arrays are still mapped on their own) and trimming only past 1 GiB keeps freed arrays'
pages in the heap for the next ones. Measured on a 1M-kernel export (``perfdoctor analyze``'s work,
benchmarks/timed.py, medians of 11 alternating pairs on 2 cores): 0.61 s against 0.72-0.80 s, with
42k instead of 71k page faults and peak RSS 432 MB instead of 342 MB. Set by the commands that analyse
traces (and their pool workers), never by importing perfdoctor: a library must not retune its host
process's allocator.
"""

from __future__ import annotations

import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
TRIM_ABOVE = 1 << 30
MMAP_ABOVE = 32 << 20  # glibc's largest allowed mmap threshold on 64-bit (4 * 1024 * 1024 * sizeof(long))


def keep_freed_memory() -> bool:
    """Tune glibc's malloc as the module docstring says; whether it took (False off glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, TRIM_ABOVE)) & bool(mallopt(M_MMAP_THRESHOLD, MMAP_ABOVE))
