"""What reading and measuring a large CUDA memory snapshot costs, against plain ``pickle.load``.

Writes a Megatron-sized snapshot (the 100,000-entry history Megatron-LM and Megatron-Bridge record, each
entry with a Python stack drawn from a fixed set of call sites, so frames repeat as in a real training
loop), then times: ``pickle.load`` (unsafe, the floor), ``load_snapshot`` (restricted unpickling and
validation) and ``measure_memory`` (replay, sites, series).
Run: ``python benchmarks/bench_memory.py [--entries N] [--sites N] [--depth N]``.
"""

from __future__ import annotations

import argparse
import pickle
import random
import tempfile
import time
from pathlib import Path

from perfdoctor.load.memsnap import load_snapshot
from perfdoctor.measure.memory import measure_memory

MB = 1 << 20


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
                           "time_us": t, "frames": frames})
    blocks = [{"address": e["addr"], "size": e["size"], "requested_size": e["size"], "state": "active_allocated",
               "frames": e["frames"]} for e in live]
    total = sum(b["size"] for b in blocks)
    return {"segments": [{"device": 0, "address": 0, "total_size": total + 64 * MB,
                          "blocks": [*blocks, {"size": 64 * MB, "state": "inactive"}]}],
            "device_traces": [events]}


def best_of(repeat: int, fn) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--sites", type=int, default=300)
    ap.add_argument("--depth", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rank0.pickle"
        path.write_bytes(pickle.dumps(make_snapshot(args.entries, args.sites, args.depth)))
        print(f"snapshot: {args.entries:,} history entries x {args.depth} frames, "
              f"{path.stat().st_size / MB:,.1f} MiB")

        def plain() -> object:
            with path.open("rb") as fh:
                return pickle.load(fh)

        t_plain, _ = best_of(args.repeat, plain)
        t_load, snap = best_of(args.repeat, lambda: load_snapshot(path))
        t_measure, m = best_of(args.repeat, lambda: measure_memory(snap))
        print(f"pickle.load (unsafe floor) {t_plain:6.2f} s")
        print(f"load_snapshot              {t_load:6.2f} s  ({t_load / t_plain:.1f}x pickle.load)")
        print(f"measure_memory             {t_measure:6.2f} s  "
              f"(peak allocated {m.metrics['memory.peak_allocated_bytes'] / MB:,.0f} MiB)")


if __name__ == "__main__":
    main()
