"""One timed piece of work in its own process, for benchmarks/run_all.py: prints ``elapsed_s=<seconds>``.

``python benchmarks/timed.py analyze FILE``: what `perfdoctor analyze FILE` does after its imports
(load, classify, measure, diagnose, draw the terminal report), timed from after the imports, so the
number is the work on the file and start-up is measured separately (the start-up case).
``python benchmarks/timed.py scan FILE``: the limit, SQLite's C code summing every needed column
(``SELECT total(col), …``: each value is read once and no Python object is made per row).
Peak RSS is the whole process's either way (run_all reads it with ``os.wait4``). The perfdoctor timed is
the one the interpreter imports: run_all runs this with the python of its fresh install of the wheel,
the CI guard (tests/test_benchmark_guard.py) with the one the test suite imported.
"""

from __future__ import annotations

import io
import sqlite3
import sys
import time
from pathlib import Path

# The columns `perfdoctor analyze` needs: timing, placement and identity of every kernel, CUDA call and
# NVTX event, and the string ids that name them (not grid/block sizes, payloads or per-row names).
NEEDED_COLUMNS = {
    "CUPTI_ACTIVITY_KIND_KERNEL": ("start", "end", "deviceId", "streamId", "correlationId", "globalPid",
                                   "shortName", "demangledName", "launchType"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "end", "globalTid", "correlationId", "nameId"),
    "NVTX_EVENTS": ("start", "end", "eventType", "globalTid", "textId", "domainId"),
}


def analyze(path: Path) -> float:
    from rich.console import Console

    from perfdoctor import api
    from perfdoctor.heap import keep_freed_memory
    from perfdoctor.render.terminal import render_terminal

    keep_freed_memory()  # as `perfdoctor analyze` does
    t0 = time.perf_counter()
    report = api.analyze([path], timeline_excerpts=False)
    render_terminal(report, Console(file=io.StringIO(), width=120))
    return time.perf_counter() - t0


def scan(path: Path) -> float:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    t0 = time.perf_counter()
    for table, cols in NEEDED_COLUMNS.items():
        conn.execute(f"SELECT {', '.join(f'total({c})' for c in cols)} FROM {table}").fetchall()
    return time.perf_counter() - t0


if __name__ == "__main__":
    what, file = sys.argv[1], Path(sys.argv[2])
    print(f"elapsed_s={(analyze if what == 'analyze' else scan)(file):.6f}")
