"""Load time of a 1,000,000-kernel export against the SQLite floor, in the same run.

The floor is a C-level scan of the columns the analysis needs (benchmarks/timed.py: ``SELECT total(col), ...``
over the kernel, runtime and NVTX tables, which touches every value without creating Python objects); the
load is the one `perfdoctor analyze` does (``detail=False``). The ratio load / floor is
what we track (target ≤ 2×), as the median of paired, alternating rounds.
In-process (no start-up); benchmarks/run_all.py measures whole `perfdoctor analyze` processes.
Run: ``python benchmarks/bench_load.py [--kernels N] [--trace FILE]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from make_big_trace import write
from timed import scan as c_scan

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's perfdoctor, not an installed one

from perfdoctor.load.nsys import load_export  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--trace", type=Path, help="use this export instead of generating one")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.trace
        if path is None:
            path = Path(tmp) / "big.sqlite"
            t0 = time.perf_counter()
            write(path, args.kernels)
            print(f"generated {args.kernels:,} kernels in {time.perf_counter() - t0:.1f} s "
                  f"({path.stat().st_size / 2**20:.0f} MiB)")
        load_export(path, detail=False)  # warm the page cache and imports for both contenders
        floors, times = [], []
        for i in range(args.repeat):  # paired and alternating: load drifts on a shared machine, ratios do not
            for which in ((0, 1) if i % 2 == 0 else (1, 0)):
                if which == 0:
                    floors.append(c_scan(path))
                else:
                    t0 = time.perf_counter()
                    info, timelines = load_export(path, detail=False)
                    times.append(time.perf_counter() - t0)
        tracemalloc.start()
        load_export(path, detail=False)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        kernels = sum(len(t.kernels) for t in timelines)
        ratio = statistics.median(t / f for t, f in zip(times, floors))
        print(f"kernels loaded        {kernels:,}")
        print(f"C-level column scan   {statistics.median(floors):.3f} s (median of {args.repeat})")
        print(f"perfdoctor load       {statistics.median(times):.3f} s   (median paired ratio {ratio:.2f}x, "
              "target <= 2x)")
        print(f"peak Python memory    {peak / 2**20:.0f} MiB (tracemalloc; Arrow buffers excluded)")


if __name__ == "__main__":
    main()
