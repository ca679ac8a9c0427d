"""Reading and measuring a large CUDA memory snapshot, paired with plain ``pickle.load`` of the same file.

Writes a Megatron-like snapshot (``--entries`` history events, each with a ``--depth``-frame Python stack
drawn from ``--sites`` call sites, new frame dicts per event as PyTorch writes them), then runs, alternating
and each in a fresh process that has imported the same modules: ``pickle.load`` of the file (unsafe:
the floor) and perfdoctor's ``load_snapshot`` + ``measure_memory`` (bounded child process, validation,
replay, sites). Reports the median wall time and peak RSS of each and their ratios over ``--repeat`` pairs.

Peak RSS of perfdoctor counts its reader child too: the parent's peak plus the child's peak above the
memory both had at the fork (pages shared at the fork are counted once; the two peaks are added even
though they do not coincide, so the figure errs high).

Run: ``python benchmarks/bench_memory.py [--entries N] [--repeat N] [--sites N] [--depth N] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent

# One measurement, in a fresh process: imports first (same for both sides), then the timed work.
_RUNNER = r"""
import json, os, pickle, resource, sys, time
import numpy
from perfdoctor.load.memsnap import load_snapshot
from perfdoctor.measure.memory import measure_memory

def rss(field="VmRSS"):  # this process's own (VmHWM: peak); ru_maxrss would include its parent's at exec
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(field + ":"))

path, mode = sys.argv[1], sys.argv[2]
base = rss()
start = time.perf_counter()
if mode == "pickle":
    with open(path, "rb") as fh:
        out = pickle.load(fh)
    note = len(out["device_traces"][0])
else:
    note = measure_memory(load_snapshot(path)).metrics["memory.peak_allocated_bytes"]
wall = time.perf_counter() - start
self_peak = rss("VmHWM")
child_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
peak = self_peak + max(0, child_peak - base)
print(json.dumps({"wall_s": wall, "peak_bytes": peak, "base_bytes": base, "note": note}))
"""


def make_snapshot(entries: int, sites: int, depth: int, seed: int = 0) -> dict:
    """Allocations and frees of activations, at most ~200 alive at once, from ``sites`` distinct stacks."""
    rng = random.Random(seed)
    stacks = [[{"filename": f"/opt/megatron/megatron/core/module{rng.randrange(40)}.py",
                "line": rng.randrange(1, 2000), "name": f"function{rng.randrange(400)}"} for _ in range(depth)]
              for _ in range(sites)]
    events, live, t = [], [], 0
    while len(events) < entries:
        t += rng.randrange(1, 50)
        frames = [dict(f) for f in rng.choice(stacks)]  # new dicts per entry, as PyTorch writes them
        e = {"action": "alloc", "addr": len(events) * 4096, "size": rng.randrange(1, 64) * MB // 8, "stream": 0,
             "time_us": t, "frames": frames}
        events.append(e)
        live.append(e)
        if len(live) > 200:
            gone = live.pop(rng.randrange(len(live)))
            events.append({"action": "free_completed", "addr": gone["addr"], "size": gone["size"], "stream": 0,
                           "time_us": t, "frames": [dict(f) for f in frames]})
    blocks = [{"address": e["addr"], "size": e["size"], "requested_size": e["size"], "state": "active_allocated",
               "frames": e["frames"]} for e in live]
    total = sum(b["size"] for b in blocks)
    return {"segments": [{"device": 0, "address": 0, "total_size": total + 64 * MB,
                          "blocks": [*blocks, {"size": 64 * MB, "state": "inactive"}]}],
            "device_traces": [events]}


def measure(path: Path, mode: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", _RUNNER, str(path), mode], capture_output=True, text=True,
                         env=env, cwd=ROOT, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--sites", type=int, default=300)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=5, help="pairs (>= 5 for a report)")
    ap.add_argument("--json", nargs="?", const="-", metavar="FILE",
                    help="the result as JSON: printed, or with FILE written as a docs/benchmarks.md section "
                         "(benchmarks/run_all.py)")
    ap.add_argument("--write", metavar="PATH", help=argparse.SUPPRESS)  # internal: only write the snapshot
    args = ap.parse_args()
    if args.write:
        with open(args.write, "wb") as fh:
            pickle.dump(make_snapshot(args.entries, args.sites, args.depth), fh, protocol=pickle.DEFAULT_PROTOCOL)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rank0.pickle"
        # written by another process: the snapshot in memory here would inflate every measurement's peak
        subprocess.run([sys.executable, __file__, "--write", str(path), "--entries", str(args.entries),
                        "--sites", str(args.sites), "--depth", str(args.depth)], check=True)
        size = path.stat().st_size
        runs: dict[str, list[dict]] = {"pickle": [], "perfdoctor": []}
        for i in range(args.repeat):
            order = ("pickle", "perfdoctor") if i % 2 == 0 else ("perfdoctor", "pickle")
            for mode in order:
                runs[mode].append(measure(path, mode))
    med = {mode: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "peak_bytes", "base_bytes")}
           for mode, rs in runs.items()}
    time_ratios = [b["wall_s"] / a["wall_s"] for a, b in zip(runs["pickle"], runs["perfdoctor"])]
    mem_ratios = [b["peak_bytes"] / a["peak_bytes"] for a, b in zip(runs["pickle"], runs["perfdoctor"])]
    result = {
        "case": f"{args.entries:,}-entry snapshot ({args.depth} frames per entry, {size / MB:,.1f} MiB pickle)",
        "repeat": args.repeat,
        "pickle_load": med["pickle"],
        "perfdoctor": med["perfdoctor"],
        "time_ratio_median": statistics.median(time_ratios),
        "memory_ratio_median": statistics.median(mem_ratios),
    }
    if args.json == "-":
        print(json.dumps(result, indent=2))
        return
    if args.json:
        pd_, pl = result["perfdoctor"], result["pickle_load"]
        Path(args.json).write_text(json.dumps({
            "title": "Memory snapshots", "command": "python benchmarks/bench_memory.py",
            "columns": ["case", "pickle.load", "perfdoctor load+measure", "time ratio", "peak RSS ratio"],
            "rows": [[result["case"], f"{pl['wall_s']:.2f} s, {pl['peak_bytes'] / MB:,.0f} MiB",
                      f"{pd_['wall_s']:.2f} s, {pd_['peak_bytes'] / MB:,.0f} MiB",
                      f"{result['time_ratio_median']:.2f}× (target ≤ 1.5×)",
                      f"{result['memory_ratio_median']:.2f}× (target ≤ 1.2×)"]],
            "notes": f"{args.repeat} alternating pairs in fresh processes, medians of per-pair ratios."}))
        return
    print(result["case"] + f", {args.repeat} alternating pairs, medians")
    for name, key in (("pickle.load (unsafe floor)", "pickle"), ("perfdoctor load+measure", "perfdoctor")):
        m = med[key]
        print(f"  {name:28s} {m['wall_s']:7.2f} s   peak RSS {m['peak_bytes'] / MB:8,.0f} MiB")
    print(f"  ratio (median of pairs)      {result['time_ratio_median']:7.2f} x time   "
          f"{result['memory_ratio_median']:.2f} x peak RSS")


if __name__ == "__main__":
    main()
