"""Paired, alternating measurement of commands against their limit, for a machine shared with others.

Why this shape: on a busy machine an unpaired minimum swings by ±100 % between runs, so one run of
the limit (a C-level SQLite scan, ``python -c pass``, ``pickle.load`` …) is taken right next to each
run of perfdoctor, in alternating order (ABBA…), and the summary is the median of the per-pair ratios:
load that lasts seconds slows both sides of a pair alike and cancels in their ratio.

Every contender is a separate process (``os.wait4`` gives its own peak RSS), so start-up, imports and
memory count exactly as a user sees them.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Sample:
    """Wall times (s), peak resident set sizes (bytes) and, for a child that reports it (a line
    ``elapsed_s=<seconds>``, see benchmarks/timed.py), its own timing of the work: one entry per repetition."""

    argv: list[str]
    wall_s: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    work_s: list[float] = field(default_factory=list)

    @property
    def median_work_s(self) -> float:
        return statistics.median(self.work_s)

    @property
    def median_s(self) -> float:
        return statistics.median(self.wall_s)

    @property
    def median_rss(self) -> int:
        return int(statistics.median(self.rss))


def run_once(argv: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None) -> tuple[float, int, float | None]:
    """Wall time, peak RSS and the child's own ``elapsed_s=`` report (None without one) of one child
    process; a failing command is an error, not a fast sample. Linux reports a child's peak RSS as the
    larger of its own and that of the copy of this process it was forked as (measured: ``python -c pass``
    peaks at 27 MB from a small parent, at 313 MB from one holding 300 MB), so the measuring process
    must stay small: run_all writes its traces in a child."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:  # files: a chatty child cannot block
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace").strip()[-500:]
            raise RuntimeError(f"{' '.join(map(str, argv))} exited {proc.returncode}: {tail}")
        out.seek(0)
        tail = out.read()[-200:].decode(errors="replace").strip().splitlines()
    work = float(tail[-1].split("=", 1)[1]) if tail and tail[-1].startswith("elapsed_s=") else None
    return wall, usage.ru_maxrss * 1024, work  # Linux reports KiB


def paired(contenders: dict[str, list[str]], reps: int = 5, warmup: int = 1,
           env: dict[str, str] | None = None) -> dict[str, Sample]:
    """Run every contender ``reps`` times, alternating the order each round (ABBA…), after ``warmup``
    unrecorded rounds that fill the page cache and the import caches for all of them alike; ``env``:
    the children's environment (default: this process's)."""
    samples = {name: Sample(argv) for name, argv in contenders.items()}
    names = list(contenders)
    for _ in range(warmup):
        for name in names:
            run_once(contenders[name], env=env)
    for i in range(reps):
        for name in (names if i % 2 == 0 else names[::-1]):
            wall, rss, work = run_once(contenders[name], env=env)
            samples[name].wall_s.append(wall)
            samples[name].rss.append(rss)
            if work is not None:
                samples[name].work_s.append(work)
    return samples


def ratio(a: Sample, b: Sample, *, work: bool = False) -> float:
    """Median of the per-round ratios a/b (rounds are paired in time) of wall times, or with ``work``
    of the times the children reported."""
    xs, ys = (a.work_s, b.work_s) if work else (a.wall_s, b.wall_s)
    return statistics.median(x / y for x, y in zip(xs, ys))


def difference(a: Sample, b: Sample) -> float:
    """Median of the per-round differences a - b in seconds."""
    return statistics.median(x - y for x, y in zip(a.wall_s, b.wall_s))


def perfdoctor(*args: str, bin_dir: Path) -> list[str]:
    """``perfdoctor ARGS``: the console script of the environment ``bin_dir`` (run_all's fresh install of
    this checkout's wheel)."""
    return [str(bin_dir / "perfdoctor"), *args]


def machine() -> str:
    """One line that says where the numbers were taken."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kib / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    return (f"{cpu}, {os.cpu_count()} cores{mem}{load}; Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}")
