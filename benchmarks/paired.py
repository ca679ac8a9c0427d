"""Paired, alternating measurement of commands against their limit, for a machine shared with others.

Why this shape: on a busy machine an unpaired minimum swings by ±100 % between runs, so one run of
the limit (a C-level SQLite scan, ``python -c pass``, ``pickle.load`` …) is taken right next to each
run of perfdoctor, in alternating order (ABBA…), and the summary is the median of the per-pair ratios:
load that lasts seconds slows both sides of a pair alike and cancels in their ratio.

Every contender is a separate process (``os.wait4`` gives its own peak RSS), so start-up, imports and
memory count exactly as a user sees them.

What pairing does not cancel is a cost only one side pays. On a virtual machine that hands its free memory
back to its host (virtio-balloon free page reporting, as our CI machines do), a page nobody has touched for
a couple of seconds must be faulted in by the host again: the CLI takes about 1.3 GiB of fresh pages at 10M
kernels (its columns, their temporary files, its arrays; ``pgalloc_normal`` of /proc/vmstat), the C scan
about 10 MiB, so their ratio moves with how fast the host backs memory. On our CI machine the same code
measured 1.87× the scan in one full run and 2.00–2.15× in later ones, while 2 GiB of fresh numpy memory took
4.2–6.1 s to touch after a pause and 0.5 s right after the same amount was freed: the likeliest cause we found.
:func:`fresh_memory_rate` measures it, and run_all reports it beside the machine.
"""

from __future__ import annotations

import math
import mmap
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

ROOT = Path(__file__).resolve().parents[1]
CHILD_TIMEOUT_S = 3600  # a hung child is killed and reported as an error, not waited on for ever
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
MEMORY_FLOOR = 2 * 2**30  # a measured process tree is killed when the machine has less available (_tree_rss)


@dataclass
class Sample:
    """Wall times (s), peak resident set sizes (bytes) and, for a child that reports them (lines
    ``name=<seconds>`` at the end of its output, see benchmarks/timed.py), its own timings: one entry per
    repetition. ``work_s`` is the child's ``elapsed_s``, the work it timed after its imports."""

    argv: list[str]
    wall_s: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    reports: list[dict[str, float]] = field(default_factory=list)

    @property
    def work_s(self) -> list[float]:
        return [r["elapsed_s"] for r in self.reports if "elapsed_s" in r]

    @property
    def median_work_s(self) -> float:
        return statistics.median(self.work_s)

    @property
    def median_s(self) -> float:
        return statistics.median(self.wall_s)

    @property
    def median_rss(self) -> int:
        return int(statistics.median(self.rss))

    @property
    def max_rss(self) -> int:
        return max(self.rss)

    def median_report(self, name: str) -> float | None:
        """Median of the child's ``name=`` reports, None when it never made one."""
        xs = [r[name] for r in self.reports if name in r]
        return statistics.median(xs) if xs else None


def _tree_rss(pid: int, stop: threading.Event, seen: dict[str, int], every_s: float = 0.02) -> None:
    """Sample the summed RSS of ``pid`` and all its descendants until ``stop`` into ``seen["peak"]``:
    ``os.wait4`` gives one process's peak, and an analysis may run in a pool of worker processes. The sum
    counts pages a forked worker shares with its parent twice: an upper bound, the safe side for a memory
    limit. When the machine's available memory falls under MEMORY_FLOOR the tree is killed and
    ``seen["starved"]`` set: on a shared machine a run that outgrows it fails, instead of the kernel's
    out-of-memory killer picking some other user's process.

    The sampler shares the machine with what it measures: each sample reads only the tree's own entries of
    ``/proc`` (:func:`_tree`), not every process's as ``psutil``'s ``children()`` does (measured on a
    2-core machine with 66 processes: 10 % of a core at 50 samples a second, taken from a CLI that uses both
    cores while the C scan it is paired with runs unsampled; 2 % with these reads)."""
    import psutil  # only when a tree is measured

    try:
        root = psutil.Process(pid)
    except psutil.Error:
        return
    while not stop.is_set():
        tree = _tree(root)
        total = sum(_rss(proc) for proc in tree)
        seen["peak"] = max(seen["peak"], total)
        if _available() < MEMORY_FLOOR:
            seen["starved"] = 1
            for proc in reversed(tree):
                try:
                    proc.kill()
                except psutil.Error:
                    pass
            return
        stop.wait(every_s)


def _tree(root: psutil.Process) -> list[psutil.Process]:
    """``root`` and its descendants: from each of their threads' ``/proc/PID/task/TID/children`` (Linux with
    CONFIG_PROC_CHILDREN), else psutil's ``children()``, which reads every process's parent."""
    import psutil

    if not os.path.exists(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/children"):
        try:
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return [root]
    pids, todo = [], [root.pid]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:  # ended since its parent listed it
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children") as fh:
                    todo.extend(int(child) for child in fh.read().split())
            except OSError:
                pass
    tree = [root]
    for pid in pids[1:]:
        try:
            tree.append(psutil.Process(pid))
        except psutil.Error:
            pass
    return tree


def _rss(proc: psutil.Process) -> int:
    """A process's resident bytes (``/proc/PID/statm``, else psutil's); 0 once it has ended."""
    import psutil

    try:
        with open(f"/proc/{proc.pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        pass
    try:
        return proc.memory_info().rss
    except psutil.Error:
        return 0


def _available() -> int:
    """The machine's available memory (``MemAvailable`` of /proc/meminfo, else psutil's)."""
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import psutil

    return psutil.virtual_memory().available


def _reports(stdout_tail: bytes) -> dict[str, float]:
    """The ``name=<number>`` lines that end a child's output (benchmarks/timed.py)."""
    out: dict[str, float] = {}
    for line in reversed(stdout_tail.decode(errors="replace").strip().splitlines()):
        name, _, value = line.partition("=")
        try:
            out.setdefault(name.strip(), float(value))
        except ValueError:  # no "=", or not a number: the child's own output
            break
    return out


def run_once(argv: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None,
             tree: bool = False) -> tuple[float, int, dict[str, float]]:
    """Wall time, peak RSS and the child's own ``name=`` reports (see :func:`_reports`) of one child
    process; a failing command is an error, not a fast sample. ``tree``: the peak is that of the summed
    RSS of the process and its descendants, sampled every 20 ms (or the child's own peak when larger).
    Linux reports a child's peak RSS as the larger of its own and that of the copy of this process it
    was forked as (measured: ``python -c pass`` peaks at 27 MB from a small parent, at 313 MB from one
    holding 300 MB), so the measuring process must stay small: run_all writes its traces in a child."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:  # files: a chatty child cannot block
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err, env=env)
        killer = threading.Timer(CHILD_TIMEOUT_S, proc.kill)
        killer.start()
        stop, seen = threading.Event(), {"peak": 0, "starved": 0}
        sampler = threading.Thread(target=_tree_rss, args=(proc.pid, stop, seen), daemon=True) if tree else None
        if sampler:
            sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        killer.cancel()
        stop.set()
        if sampler:
            sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            tail = (err.read().decode(errors="replace").strip().splitlines() or ["no message"])[-1][-500:]
            why = (f"killed when the machine had under {MEMORY_FLOOR / 2**30:.0f} GiB available (its process tree "
                   f"at {seen['peak'] / 1e6:,.0f} MB)" if seen["starved"] else
                   f"killed after {CHILD_TIMEOUT_S} s" if wall >= CHILD_TIMEOUT_S else f"exited {proc.returncode}")
            raise RuntimeError(f"{' '.join(map(str, argv))} {why}: {tail}")
        out.seek(0, os.SEEK_END)
        out.seek(max(0, out.tell() - 1000))
        reports = _reports(out.read())
    return wall, max(usage.ru_maxrss * 1024, seen["peak"]), reports  # Linux reports ru_maxrss in KiB


def paired(contenders: dict[str, list[str]], reps: int = 5, warmup: int = 1,
           env: dict[str, str] | None = None, tree: Collection[str] = (),
           progress: bool = False) -> dict[str, Sample]:
    """Run every contender ``reps`` times, alternating the order each round (ABBA…), after ``warmup``
    unrecorded rounds that fill the page cache and the import caches for all of them alike; ``env``:
    the children's environment (default: this process's); ``tree``: the contenders whose peak RSS is
    their whole process tree's (:func:`run_once`); ``progress``: one line per run on stderr (long cases)."""
    samples = {name: Sample(argv) for name, argv in contenders.items()}
    names = list(contenders)
    for _ in range(warmup):
        for name in names:
            run_once(contenders[name], env=env)
    for i in range(reps):
        for name in (names if i % 2 == 0 else names[::-1]):
            wall, rss, reports = run_once(contenders[name], env=env, tree=name in tree)
            samples[name].wall_s.append(wall)
            samples[name].rss.append(rss)
            samples[name].reports.append(reports)
            if progress:
                print(f"  round {i + 1}/{reps} {name}: {wall:.2f} s, {rss / 1e6:,.0f} MB", file=sys.stderr, flush=True)
    return samples


def ratio(a: Sample, b: Sample, *, work: bool = False) -> float:
    """Median of the per-round ratios a/b (rounds are paired in time) of wall times, or with ``work``
    of the times the children reported."""
    xs, ys = (a.work_s, b.work_s) if work else (a.wall_s, b.wall_s)
    return statistics.median(x / y for x, y in zip(xs, ys))


def ratio_to_work(a: Sample, b: Sample) -> float:
    """Median of the per-round ratios of ``a``'s wall time to the work ``b`` timed (the whole CLI process
    against the C-level scan inside its process)."""
    return statistics.median(x / y for x, y in zip(a.wall_s, b.work_s))


def _differences(a: Sample, b: Sample) -> list[float]:
    """The per-round wall-time differences a - b in seconds, sorted."""
    return sorted(x - y for x, y in zip(a.wall_s, b.wall_s))


def difference(a: Sample, b: Sample) -> float:
    """Median of the per-round differences a - b in seconds."""
    return statistics.median(_differences(a, b))


def difference_interval(a: Sample, b: Sample, level: float = 0.95) -> tuple[float, float] | None:
    """A ``level`` confidence interval for the median of the per-round differences a - b: the order
    statistics k and n + 1 − k of the n differences, k the largest with P(Binomial(n, ½) < k) ≤ (1 − level)/2
    (distribution-free: it assumes only that rounds are independent). A difference is read against an
    absolute limit, and unlike a ratio it grows and shrinks with the machine's speed: the interval says how
    far the median itself could have landed within the run (not how a slower minute would move it). None
    when there are too few rounds for that level (fewer than 6 at 95 %)."""
    d = _differences(a, b)
    k = median_rank(len(d), level)
    return None if k is None else (d[k - 1], d[len(d) - k])


def median_rank(n: int, level: float) -> int | None:
    """The largest k ≥ 1 with 2 · P(Binomial(n, ½) ≤ k − 1) ≤ 1 − level (see :func:`difference_interval`)."""
    k, tail = None, 0.0
    for i in range(n // 2 + 1):
        tail += math.comb(n, i) / 2**n  # P(Binomial ≤ i)
        if 2 * tail > 1 - level:
            break
        k = i + 1
    return k


def perfdoctor(*args: str, bin_dir: Path) -> list[str]:
    """``perfdoctor ARGS``: the console script of the environment ``bin_dir`` (run_all's fresh install of
    this checkout's wheel)."""
    return [str(bin_dir / "perfdoctor"), *args]


FRESH_MEGABYTES, FRESH_SETTLE_S = 256, 3.0  # fresh_memory_rate's probe: its size and the quiet before it


def fresh_memory_rate(megabytes: int = FRESH_MEGABYTES, rounds: int = 3, settle_s: float = FRESH_SETTLE_S) -> float:
    """GB/s at which a process gets memory nobody has touched lately (module docstring): a fresh anonymous
    mapping of ``megabytes`` written one byte a page, after ``settle_s`` seconds of quiet (a guest's free
    pages go back to its host about 2 s after they are freed), the median of ``rounds``. On our 2-core CI
    machine: 0.9 GB/s settled against 2.0 GB/s with no pause, in the same minute.

    Measured in a child process: written here, the probe's pages would raise this process's peak RSS, which
    every child it starts later reports as its own (:func:`run`; the probe made a 53 MB start-up read 291 MB)."""
    here = str(Path(__file__).resolve().parent)
    code = (f"import sys; sys.path.insert(0, {here!r}); import paired; "
            f"print(paired.fresh_memory_rate_here({megabytes}, {rounds}, {settle_s}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=CHILD_TIMEOUT_S)
    return float(out.stdout)


def fresh_memory_rate_here(megabytes: int, rounds: int, settle_s: float) -> float:
    """:func:`fresh_memory_rate` measured in this process."""
    size, page = megabytes << 20, mmap.PAGESIZE
    rates = []
    for _ in range(rounds):
        time.sleep(settle_s)
        mapping = mmap.mmap(-1, size)
        try:
            began = time.perf_counter()
            mapping[::page] = b"x" * (size // page)
            rates.append(size / (time.perf_counter() - began) / 1e9)
        finally:
            mapping.close()
    return statistics.median(rates)


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
