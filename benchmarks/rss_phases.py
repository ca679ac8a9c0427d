"""Where the peak resident memory of `perfdoctor analyze FILE` is reached: RSS per pipeline phase.

A thread samples this process's RSS (``/proc/self/status``) every millisecond while the phases of
``api.analyze_file`` (the reads of each table in perfdoctor.load.nsys, then classify, measure …) run, each
wrapped to record the highest RSS seen while it ran and the RSS it left behind. Phases nest: a table read's
peak is also its loader's. For finding what to shrink; the CLI's own peak is bench_load/run_all's number.

Run: ``python benchmarks/rss_phases.py FILE [--cli]`` (``--cli``: the whole `perfdoctor analyze FILE --format
json` command in this process, its pool of one task included).
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's perfdoctor

MB = 1 << 20
_now = [0]
_stop = False


def rss() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:"))


def sample() -> None:
    while not _stop:
        _now[0] = max(_now[0], rss())
        time.sleep(0.001)


def wrap(module: object, name: str, rows: list, depth: list) -> None:
    fn = getattr(module, name)

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        outer, _now[0] = _now[0], rss()
        depth[0] += 1
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            depth[0] -= 1
            peak = max(_now[0], rss())
            rows.append((depth[0], name, time.perf_counter() - t0, peak, rss()))
            _now[0] = max(outer, peak)

    setattr(module, name, timed)


def main() -> None:
    from perfdoctor import api, cores
    from perfdoctor.execute import default_jobs
    from perfdoctor.heap import keep_freed_memory

    keep_freed_memory()  # as `perfdoctor analyze` does
    cores.PER_TASK = default_jobs()  # as a single file's task under `perfdoctor analyze`
    from perfdoctor.load import nsys, sqlite_export

    rows: list = []
    depth = [0]
    for name in ("_strings", "_kernels", "_device_table", "_api_calls", "_nvtx", "read_timelines"):
        wrap(nsys, name, rows, depth)
    wrap(nsys, "read_payloads", rows, depth)
    wrap(sqlite_export.SqliteExport, "read", rows, depth)
    for name in ("kernel_classes", "activity", "find_steps", "label_groups", "summarize", "group_comm",
                 "timeline_metrics", "step_series", "kernel_work", "host_gaps", "launch_stats", "collectives",
                 "graph_metrics", "load_trace", "analyze_timeline", "blame", "measure_windows", "step_quantities",
                 "excerpt", "host_gaps", "add_context"):
        wrap(api, name, rows, depth)
    threading.Thread(target=sample, daemon=True).start()
    base = rss()
    t0 = time.perf_counter()
    if sys.argv[2:] == ["--cli"]:  # the whole command in this process (report, rules, rendering too)
        from perfdoctor.cli import app as cli

        cli(["analyze", sys.argv[1], "--format", "json", "-o", "/dev/null"], standalone_mode=False)
    else:
        api.analyze_file(api.FileTask(Path(sys.argv[1]), {}, False))
    with open("/proc/self/status") as fh:
        hwm = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))
    print(f"start RSS {base / MB:.0f} MiB, {time.perf_counter() - t0:.2f} s, peak sampled "
          f"{max([_now[0], *(row[3] for row in rows)]) / MB:.0f} MiB, VmHWM {hwm / MB:.0f} MiB")
    for d, name, secs, peak, after in rows:
        print(f"{'  ' * d}{name:24s} {secs:6.2f} s  peak {peak / MB:7.0f} MiB  after {after / MB:7.0f} MiB")


if __name__ == "__main__":
    main()
