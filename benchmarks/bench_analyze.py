"""What the measurements cost on top of loading, on a realistic simulated trace.

Issue 4's budget: all measurements on a 1,000,000-kernel trace add at most 50 % to the load time.
Generates a clean_baseline-style trace with enough steps (perfdoctor.synth), then times
``load_run`` alone and ``api.analyze`` (load + classify + measure + diagnose, as `perfdoctor analyze` runs
it without --html) on it.
Run: ``python benchmarks/bench_analyze.py [--kernels N] [--trace FILE]``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's perfdoctor, not an installed one

from perfdoctor import api  # noqa: E402
from perfdoctor.load.run import load_run  # noqa: E402
from perfdoctor.synth import run_scenario  # noqa: E402

SCENARIO = Path(__file__).resolve().parents[1] / "perfdoctor" / "synth" / "scenarios" / "clean_baseline.yaml"
KERNELS_PER_STEP = 1_917 / 3  # of clean_baseline


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--trace", type=Path)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="print where analyze spends its time")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = args.trace
        if trace is None:
            sc = yaml.safe_load(SCENARIO.read_text())
            sc["run"]["steps"] = max(2, round(args.kernels / KERNELS_PER_STEP))
            sc["output"]["schema"] = "2026.2"
            t0 = time.perf_counter()
            (trace,) = run_scenario(sc, Path(tmp))
            print(f"generated in {time.perf_counter() - t0:.1f} s ({trace.stat().st_size / 2**20:.0f} MiB)")
        api.analyze([trace])  # warm caches and imports
        loads, fulls = [], []
        for i in range(args.repeat):  # paired and alternating: ratios survive a busy machine, minima do not
            for which in ((0, 1) if i % 2 == 0 else (1, 0)):
                if which == 0:
                    loads.append(_time(lambda: load_run([trace])))
                else:
                    fulls.append(_time(lambda: api.analyze([trace], timeline_excerpts=False)))
        load, full = statistics.median(loads), statistics.median(fulls)
        added = statistics.median(f / lo - 1 for f, lo in zip(fulls, loads))
        report = api.analyze([trace])
        kernels = sum(d.kernel_count for d in report.devices)
        print(f"kernels                {kernels:,} in {report.metrics['all'] and len(report.devices)} timeline(s)")
        print(f"load                   {load:.2f} s (median of {args.repeat})")
        print(f"load + classify + measure {full:.2f} s  (measurements add {100 * added:.0f} %, median of paired "
              "rounds; budget 50 %)")
        if args.profile:
            prof = cProfile.Profile()
            prof.runcall(api.analyze, [trace])
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
