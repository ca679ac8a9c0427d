"""Load time of a 1,000,000-kernel export against the SQLite floor, in the same run.

The floor is a C-level scan of the same columns (``SELECT total(col), ...`` over the kernel and
runtime tables, which touches every value without creating Python objects). The ratio load / floor is
what we track (target ≤ 2×). Run: ``python benchmarks/bench_load.py [--kernels N] [--trace FILE]``.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
import tracemalloc
from pathlib import Path

from make_big_trace import write

from perfdoctor.load.nsys import load_export

KERNEL_COLS = ("start", "end", "deviceId", "streamId", "correlationId", "globalPid", "shortName", "demangledName",
               "launchType", "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ")
RUNTIME_COLS = ("start", "end", "globalTid", "correlationId", "nameId", "eventClass")


def c_scan(path: Path) -> float:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    t0 = time.perf_counter()
    for table, cols in (("CUPTI_ACTIVITY_KIND_KERNEL", KERNEL_COLS), ("CUPTI_ACTIVITY_KIND_RUNTIME", RUNTIME_COLS),
                        ("NVTX_EVENTS", ("start", "end", "eventType", "globalTid", "textId", "domainId"))):
        conn.execute(f"SELECT {', '.join(f'total({c})' for c in cols)} FROM {table}").fetchall()
    elapsed = time.perf_counter() - t0
    conn.close()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--trace", type=Path, help="use this export instead of generating one")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.trace
        if path is None:
            path = Path(tmp) / "big.sqlite"
            t0 = time.perf_counter()
            write(path, args.kernels)
            print(f"generated {args.kernels:,} kernels in {time.perf_counter() - t0:.1f} s "
                  f"({path.stat().st_size / 2**20:.0f} MiB)")
        load_export(path)  # warm the page cache and imports for both contenders
        floor = min(c_scan(path) for _ in range(args.repeat))
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            info, timelines = load_export(path)
            times.append(time.perf_counter() - t0)
        tracemalloc.start()
        load_export(path)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        best = min(times)
        kernels = sum(len(t.kernels) for t in timelines)
        print(f"kernels loaded        {kernels:,}")
        print(f"C-level column scan   {floor:.3f} s")
        print(f"perfdoctor load       {best:.3f} s   (ratio {best / floor:.2f}x, target <= 2x)")
        print(f"peak Python memory    {peak / 2**20:.0f} MiB (tracemalloc; Arrow buffers excluded)")


if __name__ == "__main__":
    main()
