"""One timed piece of work in its own process, for benchmarks/run_all.py: prints ``name=<seconds>`` lines,
the last one ``elapsed_s=<seconds>`` (benchmarks/paired.py reads them).

``python benchmarks/timed.py analyze FILE``: what `perfdoctor analyze FILE --format json -o /dev/null`
does, split: ``imports_s`` (perfdoctor's modules, from the first line of this script), ``load_s`` (the
reads of the file, perfdoctor.api.load_trace, when the analysis calls it in this process), ``analyze_s``
(the whole api.analyze, the load included), ``render_s`` (the JSON report written to /dev/null) and
``elapsed_s`` = analyze + render: the work on the file after the imports. The interpreter's own start
and exit are what the process's wall time has beyond these (run_all shows it).
``python benchmarks/timed.py scan FILE``: the limit, SQLite's C code summing every needed column
(``SELECT total(col), …``: each value is read once and no Python object is made per row).
Peak RSS is the whole process's either way (run_all reads it with ``os.wait4``). The perfdoctor timed is
the one the interpreter imports: run_all runs this with the python of its fresh install of the wheel,
the CI guard (tests/test_benchmark_guard.py) with the one the test suite imported.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import functools  # noqa: E402
import os  # noqa: E402
import sqlite3  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

# The columns `perfdoctor analyze` needs: timing, placement and identity of every kernel, CUDA call and
# NVTX event, and the string ids that name them (not grid/block sizes, payloads or per-row names).
NEEDED_COLUMNS = {
    "CUPTI_ACTIVITY_KIND_KERNEL": ("start", "end", "deviceId", "streamId", "correlationId", "globalPid",
                                   "shortName", "demangledName", "launchType"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "end", "globalTid", "correlationId", "nameId"),
    "NVTX_EVENTS": ("start", "end", "eventType", "globalTid", "textId", "domainId"),
}


def _summed(module: object, name: str, total: list[float]) -> None:
    """Add the time of every call of ``module.name`` to ``total[0]`` (a no-op where it does not exist)."""
    fn = getattr(module, name, None)
    if fn is None:
        return

    @functools.wraps(fn)
    def timed_call(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            total[0] += time.perf_counter() - t

    setattr(module, name, timed_call)


def analyze(path: Path) -> dict[str, float]:
    from perfdoctor import api
    from perfdoctor.heap import keep_freed_memory
    from perfdoctor.outputs import write_text
    from perfdoctor.render.json import render_json

    t1 = time.perf_counter()
    keep_freed_memory()  # as `perfdoctor analyze` does
    load = [0.0]
    _summed(api, "load_trace", load)
    report = api.analyze([path], timeline_excerpts=False)
    t2 = time.perf_counter()
    write_text(Path(os.devnull), render_json(report))
    t3 = time.perf_counter()
    out = {"imports_s": t1 - T0, "analyze_s": t2 - t1, "render_s": t3 - t2}
    if load[0]:
        out["load_s"] = load[0]
    return out | {"elapsed_s": t3 - t1}


def scan(path: Path) -> dict[str, float]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    t0 = time.perf_counter()
    for table, cols in NEEDED_COLUMNS.items():
        conn.execute(f"SELECT {', '.join(f'total({c})' for c in cols)} FROM {table}").fetchall()
    return {"elapsed_s": time.perf_counter() - t0}


if __name__ == "__main__":
    what, file = sys.argv[1], Path(sys.argv[2])
    for name, seconds in (analyze if what == "analyze" else scan)(file).items():
        print(f"{name}={seconds:.6f}")
