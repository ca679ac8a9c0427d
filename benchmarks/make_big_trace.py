"""Write a large nsys-shaped SQLite export for the benchmarks (real 2024.2 DDL, bulk inserts).

Only the tables the loader reads in bulk are filled: kernels with their runtime launch calls, NVTX
step ranges (``ProfilerStep#N``, one per 10,000 kernels), StringIds, and the metadata. Content is random but linked
(correlation ids, globalTid/globalPid encoding, string ids), which is all a load benchmark needs; the
scenario simulator (perfdoctor.synth) makes realistic traces.

Run: ``python benchmarks/make_big_trace.py OUT.sqlite --kernels N [--seed S] [--processes P]`` (``P``
processes on ``P`` GPUs sharing the kernels, as in a per-node export), or
``python benchmarks/make_big_trace.py --cached --kernels N`` to print the path of a cached copy, written
first when missing (see :func:`cached`).

Speed: the columns are drawn with numpy for the whole trace (the same draws, in the same order, for any
size of insert batch, so a seed gives the same file however it is written), then inserted in batches of
``BATCH`` rows, binding only the values that vary (constants are SQL literals): Python objects exist for
one batch at a time. Peak memory grows by about 55 MB per million kernels (227 MB at 1M, 337 MB at 3M),
where the unbatched version held a dozen Python lists of the whole trace; 30M kernels (3.3 GB) took 67 s.
The file for a seed is byte for byte the one the unbatched version wrote.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sqlite3
import sys
from collections.abc import Iterator
from itertools import chain
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
DDL = HERE.parents[1] / "perfdoctor" / "synth" / "ddl" / "2024.2.3.sql"
BATCH = 1_000_000
PID = 4242
KERNELS_PER_STEP = 10_000  # a training step of a large model launches thousands of kernels
STEP_TEXT = 202  # the string id of the first step's range text


def create_tables(conn: sqlite3.Connection) -> None:
    """The 2024.2 tables the simulator writes (real DDL); the unused ones stay empty."""
    conn.executescript(DDL.read_text())


def batches(columns: list[np.ndarray], size: int = BATCH) -> Iterator[tuple]:
    """Rows of ``columns`` as tuples of Python ints, built ``size`` rows at a time (executemany's input
    without a trace's worth of Python objects)."""
    return chain.from_iterable(zip(*(c[lo:lo + size].tolist() for c in columns))
                               for lo in range(0, len(columns[0]), size))


def insert_kernels(conn: sqlite3.Connection, start: np.ndarray, end: np.ndarray, stream: np.ndarray,
                   corr: np.ndarray, name: np.ndarray, device: int, gpid: int) -> None:
    """Kernel rows binding only the per-row values (the name id is bound once for both name columns)."""
    conn.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId, "
        "globalPid, demangledName, shortName, launchType, gridX, blockX, gridY, gridZ, blockY, blockZ, "
        "registersPerThread, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, "
        f"gridId) VALUES (?1, ?2, {device:d}, 0, ?3, ?4, {gpid:d}, ?5, ?5, 1, 128, 256, 1, 1, 1, 1, 32, 0, 0, 0, 0, 0)",
        batches([start, end, stream, corr, name]))


def insert_runtime(conn: sqlite3.Connection, start: np.ndarray, corr: np.ndarray, gtid: int) -> None:
    """cudaLaunchKernel rows of 3 µs each, binding only start and correlation id."""
    conn.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, "
                     f"nameId, returnValue) VALUES (?1, ?1 + 3000, 0, {gtid:d}, ?2, 201, 0)", batches([start, corr]))


def write_process(conn: sqlite3.Connection, rng: np.random.Generator, kernels: int, pid: int = PID,
                  device: int = 0) -> None:
    """One process's kernels on one GPU, its thread's CUDA launch calls and NVTX step ranges
    (``ProfilerStep#N``, one per ``KERNELS_PER_STEP`` kernels: perfdoctor reads them as the steps)."""
    gpid = (1 << 48) | (pid << 24)
    gtid = gpid | pid
    conn.execute("INSERT INTO PROCESSES VALUES (?, ?, 'python3')", (gpid, pid))
    dur = rng.integers(2_000, 60_000, kernels)
    start = np.cumsum(dur + rng.integers(0, 3_000, kernels)) + 1_000_000
    name = rng.integers(0, 201, kernels)
    corr = np.arange(1, kernels + 1)
    # One thread launches in order, each call before its kernel (the i-th smallest of start - lag is below
    # start[i]): a thread's CUDA calls are never out of order, and measurements rely on that fast path.
    api_start = np.sort(start - rng.integers(5_000, 50_000, kernels))
    insert_kernels(conn, start, start + dur, np.where(name == 200, 20, 7), corr, name, device, gpid)
    del dur, name
    insert_runtime(conn, api_start, corr, gtid)
    steps = max(1, kernels // KERNELS_PER_STEP)
    edges = np.linspace(0, kernels - 1, steps + 1).astype(int)
    conn.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, textId, domainId) "
                     "VALUES (?, ?, 59, ?, ?, 0)",
                     [(int(api_start[a]), int(start[b]), gtid, STEP_TEXT + i)
                      for i, (a, b) in enumerate(zip(edges[:-1], edges[1:]))])


def write(path: Path, kernels: int, seed: int = 0, processes: int = 1) -> None:
    rng = np.random.default_rng(seed)
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute("PRAGMA synchronous = OFF")
    create_tables(conn)
    names = [f"kernel_{i}_sm90_xmma_gemm" for i in range(200)]
    names += ["ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "cudaLaunchKernel_v7000"]
    names += [f"ProfilerStep#{i}" for i in range(max(1, kernels // KERNELS_PER_STEP))]  # as torch.profiler marks them
    conn.executemany("INSERT INTO StringIds VALUES (?, ?)", enumerate(names))
    conn.executemany("INSERT INTO META_DATA_EXPORT VALUES (?, ?)",
                     [("EXPORT_PRODUCT_VERSION", "2024.2.3.38"), ("EXPORT_SCHEMA_VERSION", "3.11.1")])
    conn.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1700000000000000000, 't', 't')")
    for process in range(processes):  # one process per GPU, as in a per-node export (its rows one after another)
        n = kernels // processes + (kernels % processes if process == 0 else 0)
        write_process(conn, rng, n, pid=PID + process, device=process)
    conn.commit()
    conn.close()


def generator_hash() -> str:
    """What the files depend on besides size and seed: this script and the DDL it writes (12 hex digits)."""
    h = hashlib.sha256(HERE.read_bytes())
    h.update(DDL.read_bytes())
    return h.hexdigest()[:12]


def cache_dir() -> Path:
    """``$PERFDOCTOR_BENCH_CACHE``, else ``~/.cache/perfdoctor-bench``."""
    env = os.environ.get("PERFDOCTOR_BENCH_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "perfdoctor-bench"


def cached(kernels: int, seed: int = 0, folder: Path | None = None, processes: int = 1) -> Path:
    """The trace of ``kernels`` and ``seed`` in the cache, written first when missing. The name carries the
    generator's hash, so an edit to this script or the DDL makes a new file; the older files of the same
    size and seed are removed then (a 30M-kernel trace is 3.3 GB). Written under a temporary name and
    renamed: an interrupted run leaves no half-written trace behind a valid name."""
    folder = folder or cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    key = f"kernels_{kernels}" + (f"_p{processes}" if processes > 1 else "") + f"_seed{seed}"
    path = folder / f"{key}_{generator_hash()}.sqlite"
    if path.exists():
        return path
    for stale in folder.glob(f"{key}_*.sqlite*"):
        stale.unlink()
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    write(tmp, kernels, seed, processes)
    tmp.replace(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, nargs="?", help="file to write (not with --cached)")
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--processes", type=int, default=1, help="GPUs (one process each) sharing the kernels")
    ap.add_argument("--cached", action="store_true",
                    help="print the path of the cached trace of this size and seed, writing it first when missing "
                         "(folder: $PERFDOCTOR_BENCH_CACHE, else ~/.cache/perfdoctor-bench)")
    args = ap.parse_args()
    if args.kernels < 1 or args.processes < 1 or (args.out is None) == (not args.cached):
        print("make_big_trace: give OUT or --cached (one of them), --kernels >= 1 and --processes >= 1",
              file=sys.stderr)
        sys.exit(2)
    if args.cached:
        print(cached(args.kernels, args.seed, processes=args.processes))
    else:
        write(args.out, args.kernels, args.seed, args.processes)


if __name__ == "__main__":
    main()
