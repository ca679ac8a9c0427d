"""Cross-rank matching at scale: ``perfdoctor.measure.peers.match`` over R ranks × N collective instances.

It runs in the main process, after the per-rank workers, serially — so its cost adds to every multi-GPU
analysis. The run is built directly as numpy ``Collectives`` (TP groups with NCCL communicator ids,
DP over the rest without, one late rank, per-rank clock skew), then ``match`` is timed against its
limit in the same process, alternating: one ``np.sort`` of the instances' packed matching keys (the
least any matching by key must do). Reported: medians of the rounds and of the per-round ratios.

Run: ``python benchmarks/bench_peers.py --ranks 1024 --instances 4000 --repeat 5``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's perfdoctor

from perfdoctor.classify.groups import GROUPS  # noqa: E402
from perfdoctor.measure import intervals as iv  # noqa: E402
from perfdoctor.measure.collectives import Collectives  # noqa: E402
from perfdoctor.measure.host import CAUSES  # noqa: E402
from perfdoctor.measure.peers import match  # noqa: E402

TP = 8
STEPS = 4


def build(ranks: int, instances: int, seed: int = 0) -> dict[int, Collectives]:
    """``instances`` per rank, half TP (communicator id per TP group), half DP; rank 1 arrives late."""
    rng = np.random.default_rng(seed)
    half = instances // 2
    step_ns = 100_000_000
    t = np.sort(rng.integers(0, STEPS * step_ns, instances))
    group = np.r_[np.full(half, GROUPS.index("tp")), np.full(instances - half, GROUPS.index("dp"))]
    group = group[rng.permutation(instances)].astype(np.int8)
    seq = np.zeros(instances, dtype=np.int32)
    for g in np.unique(group):
        seq[group == g] = np.arange(int((group == g).sum()))
    cols = {}
    for r in range(ranks):
        arrive = t + rng.integers(0, 20_000, instances) + (300_000 if r == 1 else 0)
        end = t + 400_000 + rng.integers(0, 2_000, instances)
        skew = int(rng.integers(-10**6, 10**6))
        zeros = np.zeros(instances, dtype=np.int64)
        cols[r] = Collectives(
            group=group, comm=np.where(group == GROUPS.index("tp"), 1 + r // TP, 0).astype(np.uint64),
            stream=np.zeros(instances, dtype=np.int16), seq=seq, start=arrive + skew, end=end + skew,
            bytes=zeros - 1, before_start=zeros, before_compute=rng.integers(0, 10**5, instances),
            before_other_comm=zeros, before_idle={c: zeros for c in CAUSES},
            long_calls=(zeros[:0], zeros[:0], np.zeros(0, dtype=object)),
            step_starts=np.arange(STEPS) * step_ns + skew, step_ends=(np.arange(STEPS) + 1) * step_ns + skew,
            session_start_utc_ns=1_700_000_000 * 10**9,
            exposed={GROUPS[g]: iv.union((arrive + skew)[group == g], (end + skew)[group == g]) for g in (0, 1)})
    return cols


def limit(cols: dict[int, Collectives]) -> None:
    """One sort of the packed (group, communicator, stream, sequence) key of every instance."""
    key = np.concatenate([(c.group.astype(np.int64) << 56) | (c.comm.astype(np.int64) << 32) | c.seq
                          for c in cols.values()])
    np.sort(key)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--instances", type=int, default=4000, help="collective instances per rank")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path, metavar="FILE", help="also write the table (benchmarks/run_all.py)")
    args = ap.parse_args()
    cols = build(args.ranks, args.instances)
    exposed = {r: {"tp": 1.0, "dp": 1.0} for r in cols}
    config = {"tp": TP}
    times: dict[str, list[float]] = {"match": [], "limit": []}
    for i in range(args.repeat):
        for name in ("match", "limit") if i % 2 == 0 else ("limit", "match"):
            t0 = time.perf_counter()
            if name == "match":
                waits = match(cols, exposed, config, args.ranks)
            else:
                limit(cols)
            times[name].append(time.perf_counter() - t0)
        assert waits.straggler is not None and waits.straggler.rank == 1  # the planted late rank
        print(f"round {i + 1}: match {times['match'][-1]:.2f} s, limit {times['limit'][-1]:.3f} s", flush=True)
    ratio = statistics.median(m / s for m, s in zip(times["match"], times["limit"]))
    rows = [[f"{args.ranks:,} × {args.instances:,}", f"{statistics.median(times['match']):.2f}",
             f"{statistics.median(times['limit']):.3f}", f"{ratio:.0f}×"]]
    columns = ["ranks × instances", "match s", "limit s (one sort of the keys)", "ratio"]
    print(f"| {' | '.join(columns)} |\n|---|---|---|---|\n| {' | '.join(rows[0])} |")
    if args.json:
        args.json.write_text(json.dumps({
            "title": "Cross-rank matching", "command": "python benchmarks/bench_peers.py",
            "columns": columns, "rows": rows,
            "notes": f"medians of {args.repeat} alternating rounds, {os.cpu_count()} cores"}))


if __name__ == "__main__":
    main()
