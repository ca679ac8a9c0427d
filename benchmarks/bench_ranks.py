"""Cross-rank analysis at scale: the same run analysed with --jobs 1, --jobs 2 and --dask local.

Builds a run of R ranks × N kernels: one rank simulated (clean_baseline, DP over all R ranks) and copied
R times with each copy's capture-hook rank mark rewritten (so every rank is a distinct rank, and every
DP collective matches across all of them). Then runs `perfdoctor analyze RUN --format json` as a
subprocess per executor, alternating the executors in each round (paired: the machine is shared), and
samples the resident memory of the whole process tree (driver, pool or Dask workers, fork server).
A single rank's analysis is measured in the same rounds: peak memory should follow it, not R.

Then peak RSS against the number of ranks (``--rss-ranks``, small ranks of ``--rss-kernels`` kernels so
that a thousand fit): `perfdoctor analyze RUN --format json --jobs 2` on each count, the process tree's
peak and its growth per rank; and the cross-rank matching share at the largest count: the time of the
collective matching and the critical-path join (``perfdoctor.api.match`` and ``join``, timed in-process)
against the whole analysis.

Run: ``python benchmarks/bench_ranks.py --ranks 64 --kernels 100000 --repeat 5 --rss-ranks 128,512,1024``
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


def rss_sweep(tmp: Path, counts: list[int], kernels: int) -> list[dict]:
    """Wall time and peak RSS of the process tree of `perfdoctor analyze RUN --format json --jobs 2` for
    runs of each of ``counts`` ranks (hard links to one run of the largest count)."""
    files = build_run(tmp / "sweep", max(counts), kernels)
    out = []
    for count in counts:
        run = tmp / f"sweep{count}"
        run.mkdir()
        for f in files[:count]:
            os.link(f, run / f.name)
        wall, rss, cpu = measure([sys.executable, "-m", "perfdoctor", "analyze", "--format", "json", "--output",
                                  os.devnull, str(run), "--jobs", "2"])
        out.append({"ranks": count, "wall_s": round(wall, 2), "peak_rss_mib": round(rss / 2**20, 1),
                    "cpu_s": round(cpu, 2)})
        print(f"{count} ranks × {kernels:,} kernels: {wall:.1f} s, {rss / 2**20:.0f} MiB, {cpu:.1f} CPU s", flush=True)
    return out


def matching_share(run: Path) -> dict:
    """In-process (``--jobs 2``): seconds of the cross-rank matching (perfdoctor.api.match, join) and of
    the whole analysis."""
    from perfdoctor import api

    spent = {"match": 0.0, "join": 0.0}

    def timed(name: str):
        original = getattr(api, name)

        def run_timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t0
        return original, run_timed

    originals = {}
    for name in spent:
        originals[name], wrapped = timed(name)
        setattr(api, name, wrapped)
    try:
        t0 = time.perf_counter()
        api.analyze([run], jobs=2, timeline_excerpts=False)
        total = time.perf_counter() - t0
    finally:
        for name, original in originals.items():
            setattr(api, name, original)
    return {"match_s": round(spent["match"], 3), "join_s": round(spent["join"], 3), "analysis_s": round(total, 2),
            "share": round((spent["match"] + spent["join"]) / total, 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--kernels", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-dask", action="store_true")
    ap.add_argument("--rss-ranks", default="128,512,1024",
                    help="rank counts of the peak-RSS sweep, comma-separated (empty: no sweep)")
    ap.add_argument("--rss-kernels", type=int, default=5_000, help="kernels per rank in the peak-RSS sweep")
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
        notes = f"{args.ranks} ranks × {args.kernels:,} kernels, {os.cpu_count()} cores, medians of {args.repeat} " \
                f"rotating rounds."
        sweep, share = [], None
        counts = sorted({int(c) for c in args.rss_ranks.split(",") if c.strip()})
        if counts:
            sweep = rss_sweep(Path(tmp), counts, args.rss_kernels)
            share = matching_share(Path(tmp) / f"sweep{counts[-1]}")
            table = ["| ranks | wall s | peak RSS of the process tree MiB |", "|---|---|---|"]
            table += [f"| {r['ranks']:,} | {r['wall_s']:.1f} | {r['peak_rss_mib']:.0f} |" for r in sweep]
            growth = ((sweep[-1]["peak_rss_mib"] - sweep[0]["peak_rss_mib"]) * 1024
                      / max(counts[-1] - counts[0], 1))
            lines = [f"Peak RSS against the number of ranks ({args.rss_kernels:,} kernels each, `--jobs 2`, one "
                     f"run each): it grows by {growth:.1f} KiB a rank.", "", *table, "",
                     f"Cross-rank matching at {counts[-1]:,} ranks (in-process): collective matching "
                     f"{share['match_s']:.2f} s + critical-path join {share['join_s']:.2f} s of "
                     f"{share['analysis_s']:.1f} s, {100 * share['share']:.1f} % of the analysis."]
            print("\n" + "\n".join(lines))
            notes += "\n\n" + "\n".join(lines)
        if args.json:
            args.json.write_text(json.dumps({
                "title": "Cross-rank", "command": "python benchmarks/bench_ranks.py",
                "columns": ["executor", "wall s", "speed-up vs --jobs 1", "CPU s (process tree)",
                            "peak RSS of the process tree MiB"],
                "rows": rows, "notes": notes, "rss": sweep, "rss_kernels": args.rss_kernels,
                "matching": share}))

if __name__ == "__main__":
    main()
