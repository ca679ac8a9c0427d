"""Cross-rank analysis at scale: the same run analysed with --jobs 1, --jobs 2 and --dask local.

Builds a run of R ranks × N kernels: one rank simulated (clean_baseline, DP over all R ranks) and copied
R times with each copy's capture-hook rank mark rewritten (so every rank is a distinct rank, and every
DP collective matches across all of them). Then runs `perfdoctor analyze RUN --format json` as a
subprocess per executor, alternating the executors in each round (paired: the machine is shared), and
samples the resident memory of the whole process tree (driver, pool or Dask workers, fork server).
A single rank's analysis is measured in the same rounds: peak memory should follow it, not R.

Run: ``python benchmarks/bench_ranks.py --ranks 64 --kernels 100000 --repeat 5``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml

from perfdoctor.synth import run_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "perfdoctor" / "synth" / "scenarios" / "clean_baseline.yaml"


def build_run(out: Path, ranks: int, kernels: int) -> list[Path]:
    """One simulated rank of about ``kernels`` kernels, copied to ``ranks`` files with their own rank."""
    sc = yaml.safe_load(SCENARIO.read_text())
    sc["parallel"] = {"tp": 1, "dp": ranks}
    sc["output"] = {"schema": "2024.2", "ranks": [0]}
    sc["run"]["steps"] = 2
    per_step = _kernels(run_scenario(sc, out / "calibrate")[0]) / 2
    sc["run"]["steps"] = max(2, round(kernels / per_step))
    (first,) = run_scenario(sc, out / "sim")
    files = []
    for r in range(ranks):
        path = out / "run" / f"rank{r:05d}.sqlite"
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(first, path)
        with sqlite3.connect(path) as db:
            for table, column in (("StringIds", "value"), ("NVTX_EVENTS", "text")):
                db.execute(f"UPDATE {table} SET {column} = ? WHERE {column} LIKE 'rank r=%'",
                           (f"rank r={r} local={r % 8} world={ranks}",))
        files.append(path)
    return files


def _kernels(path: Path) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]


def measure(cmd: list[str]) -> tuple[float, int, float]:
    """Wall seconds, peak summed RSS (bytes) and CPU seconds of the process tree of ``cmd`` (each
    process's last sampled user + system time: on a shared machine, the work done whatever the wall)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    peak = [0]
    cpu: dict[int, float] = {}

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                tree = [root, *root.children(recursive=True)]
                peak[0] = max(peak[0], sum(p.memory_info().rss for p in tree if p.is_running()))
                for p in tree:
                    times = p.cpu_times()
                    cpu[p.pid] = times.user + times.system
            except psutil.Error:
                pass
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - t0
    sampler.join()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed: {err.decode()[-2000:]}")
    return wall, peak[0], sum(cpu.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--kernels", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-dask", action="store_true")
    ap.add_argument("--json", type=Path, metavar="FILE",
                    help="also write the table as a docs/benchmarks.md section (benchmarks/run_all.py)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        files = build_run(Path(tmp), args.ranks, args.kernels)
        print(f"built {args.ranks} ranks × {_kernels(files[0]):,} kernels in {time.perf_counter() - t0:.0f} s "
              f"({files[0].stat().st_size / 2**20:.0f} MiB each)", flush=True)
        base = [sys.executable, "-m", "perfdoctor", "analyze", "--format", "json", "--output", os.devnull]
        modes = {"one rank (--jobs 1)": [*base, str(files[0]), "--jobs", "1"],
                 "--jobs 1": [*base, str(files[0].parent), "--jobs", "1"],
                 "--jobs 2": [*base, str(files[0].parent), "--jobs", "2"]}
        if not args.no_dask:
            modes["--dask local (2 workers)"] = [*base, str(files[0].parent), "--dask", "local", "--jobs", "2"]
        results: dict[str, list[tuple[float, int, float]]] = {m: [] for m in modes}
        names = list(modes)
        for i in range(args.repeat):
            for name in names[i % len(names):] + names[:i % len(names)]:  # rotate the order each round
                results[name].append(measure(modes[name]))
                wall, rss, cpu = results[name][-1]
                print(f"round {i + 1} {name}: {wall:.1f} s, {rss / 2**20:.0f} MiB, {cpu:.1f} CPU s", flush=True)
        one = statistics.median(r[0] for r in results["--jobs 1"])
        print(f"\n{args.ranks} ranks × {args.kernels:,} kernels, {os.cpu_count()} cores, medians of {args.repeat}")
        print("| executor | wall s | speed-up vs --jobs 1 | CPU s (process tree) | peak RSS of the process tree MiB |")
        print("|---|---|---|---|---|")
        rows = []
        for name, runs in results.items():
            wall = statistics.median(r[0] for r in runs)
            rss = statistics.median(r[1] for r in runs) / 2**20
            cpu = statistics.median(r[2] for r in runs)
            rows.append([name, f"{wall:.1f}", f"{one / wall:.2f}×", f"{cpu:.1f}", f"{rss:.0f}"])
            print(f"| {' | '.join(rows[-1])} |")
        if args.json:
            args.json.write_text(json.dumps({
                "title": "Cross-rank", "command": "python benchmarks/bench_ranks.py",
                "columns": ["executor", "wall s", "speed-up vs --jobs 1", "CPU s (process tree)",
                            "peak RSS of the process tree MiB"],
                "rows": rows, "notes": f"{args.ranks} ranks × {args.kernels:,} kernels, {os.cpu_count()} cores, "
                                       f"medians of {args.repeat} rotating rounds."}))

if __name__ == "__main__":
    main()
