"""What ``perfdoctor capture --profiler torch`` costs the training it profiles, on CPU.

tests/e2e/tiny_train.py (2 ranks, gloo) runs ``--iterations`` iterations plainly under torchrun, then
under ``perfdoctor capture --profiler torch --steps A-B``, alternating ``--rounds`` times; each rank
writes its per-iteration times (``TINY_TRAIN_TIMES``). Iterations are grouped as the hook sees them:

* before: iterations 0 .. A-2 (the hook is installed, nothing is profiled or labelled);
* start: iteration A-1, whose optimizer step ends with the profiler starting;
* window: iterations A .. B-1, profiled and labelled;
* end: iteration B, whose optimizer step ends with the profiler stopping and the trace export;
* after: iterations B+1 .. (nothing profiled again).

Odd iterations of tiny_train collect garbage (a full ``gc.collect()``, tens of ms with torch loaded)
and even ones do not, so iterations are compared index by index: per iteration, the median over ranks
and rounds; per group, the mean of those medians, with and without the capture, and their ratio. Both
the wall time and the rank's CPU time (``time.process_time``: what the profiler's own work adds, and
far less disturbed than the wall time by other jobs on a shared machine) are compared. The steps
outside the window must cost what they cost without it (ratio about 1, within the machine's noise).
Run: ``python benchmarks/bench_capture_overhead.py [--iterations 30 --steps 10-14 --rounds 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[1] / "tests" / "e2e" / "tiny_train.py"
GROUPS = ("before", "start", "window", "end", "after")


def run(iterations: int, steps: tuple[int, int] | None, work: Path, tag: str) -> list[list[list[float]]]:
    """Per rank, the ``[wall, cpu]`` times of each iteration of one run (captured when ``steps`` is given)."""
    times = work / f"{tag}.times"
    train = ["torchrun", "--nproc_per_node", "2", str(TRAIN), str(iterations)]
    if steps is None:
        argv = train
    else:
        argv = [sys.executable, "-m", "perfdoctor", "capture", "--profiler", "torch", "--out", str(work / tag),
                "--steps", f"{steps[0]}-{steps[1]}", "--", *train]
    env = {**os.environ, "TINY_TRAIN_TIMES": str(times)}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"{tag}: exit code {proc.returncode}: {proc.stderr[-2000:]}")
    return [json.loads(Path(f"{times}.{rank}").read_text()) for rank in (0, 1)]


def group_of(i: int, a: int, b: int) -> str:
    if i < a - 1:
        return "before"
    if i == a - 1:
        return "start"
    if i < b:
        return "window"
    return "end" if i == b else "after"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--steps", default="10-14")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    a, b = (int(v) for v in args.steps.split("-"))
    if not 1 <= a <= b < args.iterations - 1:
        raise SystemExit("--steps A-B needs 1 <= A <= B < iterations - 1")
    kinds = [f"{k} {clock}" for clock in ("wall", "cpu") for k in ("plain", "capture")]
    samples: dict[str, list[list[float]]] = {k: [[] for _ in range(args.iterations)] for k in kinds}
    with tempfile.TemporaryDirectory(prefix="perfdoctor-overhead-") as tmp:
        for r in range(args.rounds):
            for kind, steps in (("plain", None), ("capture", (a, b))):
                for times in run(args.iterations, steps, Path(tmp), f"{kind}{r}"):
                    for i, (wall, cpu) in enumerate(times):
                        samples[f"{kind} wall"][i].append(wall)
                        samples[f"{kind} cpu"][i].append(cpu)
    per_iteration = {k: [statistics.median(v) for v in samples[k]] for k in samples}
    grouped = {k: {g: [t for i, t in enumerate(per_iteration[k]) if i > 0 and group_of(i, a, b) == g]
                   for g in GROUPS} for k in per_iteration}  # iteration 0 warms up (allocator, gloo)
    print(f"tiny_train.py, 2 ranks (gloo, CPU), {args.iterations} iterations, --steps {a}-{b}, {args.rounds} "
          f"rounds; ms per iteration (mean over the group of each iteration's median over ranks and rounds)")
    print(f"{'iterations':<10} {'wall plain':>11} {'capture':>9} {'ratio':>6} {'CPU plain':>11} {'capture':>9} "
          f"{'ratio':>6}")
    for g in GROUPS:
        row = [g.ljust(10)]
        for clock in ("wall", "cpu"):
            plain = statistics.mean(grouped[f"plain {clock}"][g])
            captured = statistics.mean(grouped[f"capture {clock}"][g])
            row.append(f"{plain * 1e3:11.2f} {captured * 1e3:9.2f} {captured / plain:6.2f}")
        print(" ".join(row))


if __name__ == "__main__":
    main()
