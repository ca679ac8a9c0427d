"""Write a large nsys-shaped SQLite export for the benchmarks (real 2024.2 DDL, bulk inserts).

Only the tables the loader reads in bulk are filled: kernels with their runtime launch calls, NVTX
ranges around groups of launches, StringIds, and the metadata. Content is random but linked
(correlation ids, globalTid/globalPid encoding, string ids), which is all a load benchmark needs; the
scenario simulator (perfdoctor.synth) makes realistic traces.
"""

from __future__ import annotations

import argparse
import sqlite3
from pathlib import Path

import numpy as np

DDL = Path(__file__).resolve().parents[1] / "perfdoctor" / "synth" / "ddl" / "2024.2.3.sql"


def create_tables(conn: sqlite3.Connection) -> None:
    """The 2024.2 tables the simulator writes (real DDL); the unused ones stay empty."""
    conn.executescript(DDL.read_text())


def write(path: Path, kernels: int, seed: int = 0, processes: int = 1) -> None:
    rng = np.random.default_rng(seed)
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute("PRAGMA synchronous = OFF")
    create_tables(conn)
    names = [f"kernel_{i}_sm90_xmma_gemm" for i in range(200)]
    names += ["ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "cudaLaunchKernel_v7000", "step"]
    conn.executemany("INSERT INTO StringIds VALUES (?, ?)", enumerate(names))
    conn.executemany("INSERT INTO META_DATA_EXPORT VALUES (?, ?)",
                     [("EXPORT_PRODUCT_VERSION", "2024.2.3.38"), ("EXPORT_SCHEMA_VERSION", "3.11.1")])
    conn.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1700000000000000000, 't', 't')")
    for process in range(processes):  # one process per GPU, as in a per-node export (its rows one after another)
        n = kernels // processes + (kernels % processes if process == 0 else 0)
        pid = 4242 + process
        gpid = (1 << 48) | (pid << 24)
        gtid = gpid | pid
        conn.execute("INSERT INTO PROCESSES VALUES (?, ?, 'python3')", (gpid, pid))
        dur = rng.integers(2_000, 60_000, n)
        start = np.cumsum(dur + rng.integers(0, 3_000, n)) + 1_000_000
        name = rng.integers(0, 201, n)
        corr = np.arange(1, n + 1)
        # One thread launches in order, each call before its kernel (the i-th smallest of start - lag is below
        # start[i]): a thread's CUDA calls are never out of order, and measurements rely on that fast path.
        api_start = np.sort(start - rng.integers(5_000, 50_000, n))
        zeros = np.zeros(n, dtype=np.int64)
        kernel_rows = zip(start.tolist(), (start + dur).tolist(), (zeros + process).tolist(), zeros.tolist(),
                          np.where(name == 200, 20, 7).tolist(), corr.tolist(), [gpid] * n, name.tolist(),
                          name.tolist(), [1] * n, [128] * n, [256] * n)
        conn.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId, "
            "globalPid, demangledName, shortName, launchType, gridX, blockX, gridY, gridZ, blockY, blockZ, "
            "registersPerThread, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, "
            "gridId) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,1,1,1,1,32,0,0,0,0,0)", kernel_rows)
        conn.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME "
            "(start, end, eventClass, globalTid, correlationId, nameId, returnValue) VALUES (?, ?, 0, ?, ?, 201, 0)",
            zip(api_start.tolist(), (api_start + 3_000).tolist(), [gtid] * n, corr.tolist()))
        steps = max(1, n // 10_000)
        edges = np.linspace(0, n - 1, steps + 1).astype(int)
        conn.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, textId, domainId) "
                         "VALUES (?, ?, 59, ?, 202, 0)",
                         [(int(api_start[a]), int(start[b]), gtid) for a, b in zip(edges[:-1], edges[1:])])
    conn.commit()
    conn.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--processes", type=int, default=1, help="GPUs (one process each) sharing the kernels")
    args = ap.parse_args()
    write(args.out, args.kernels, processes=args.processes)
