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
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Sample:
    """Wall times (s) and peak resident set sizes (bytes) of one contender, one entry per repetition."""

    argv: list[str]
    wall_s: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)

    @property
    def median_s(self) -> float:
        return statistics.median(self.wall_s)

    @property
    def median_rss(self) -> int:
        return int(statistics.median(self.rss))


def run_once(argv: list[str], cwd: Path = ROOT) -> tuple[float, int]:
    """Wall time and peak RSS of one child process; a failing command is an error, not a fast sample."""
    with tempfile.TemporaryFile() as err:  # a file, not a pipe: a chatty child cannot block on it
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace").strip()[-500:]
            raise RuntimeError(f"{' '.join(map(str, argv))} exited {proc.returncode}: {tail}")
    return wall, usage.ru_maxrss * 1024  # Linux reports KiB


def paired(contenders: dict[str, list[str]], reps: int = 5, warmup: int = 1) -> dict[str, Sample]:
    """Run every contender ``reps`` times, alternating the order each round (ABBA…), after ``warmup``
    unrecorded rounds that fill the page cache and the import caches for all of them alike."""
    samples = {name: Sample(argv) for name, argv in contenders.items()}
    names = list(contenders)
    for _ in range(warmup):
        for name in names:
            run_once(contenders[name])
    for i in range(reps):
        for name in (names if i % 2 == 0 else names[::-1]):
            wall, rss = run_once(contenders[name])
            samples[name].wall_s.append(wall)
            samples[name].rss.append(rss)
    return samples


def ratio(a: Sample, b: Sample) -> float:
    """Median of the per-round ratios a/b (rounds are paired in time)."""
    return statistics.median(x / y for x, y in zip(a.wall_s, b.wall_s))


def difference(a: Sample, b: Sample) -> float:
    """Median of the per-round differences a - b in seconds."""
    return statistics.median(x - y for x, y in zip(a.wall_s, b.wall_s))


def perfdoctor(*args: str) -> list[str]:
    """``perfdoctor ARGS`` from this checkout (``python -m`` from the repository root, as the tests run it)."""
    return [sys.executable, "-m", "perfdoctor", *args]


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
    load = ", load average {:.1f}".format(os.getloadavg()[0]) if hasattr(os, "getloadavg") else ""
    return (f"{cpu}, {os.cpu_count()} cores{mem}{load}; Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}")
