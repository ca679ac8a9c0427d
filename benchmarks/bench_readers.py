"""Which SQLite reader the loader uses, chosen by measurement: each candidate reads the columns
`perfdoctor analyze` needs from the kernel and runtime tables into numpy-ready columns, paired and
alternating with the C-level scan of the same columns (benchmarks/timed.py's limit).

Candidates: perfdoctor's own reader (perfdoctor.load.sqlite_export: connectorx reads in Rust, its Arrow
C structs are copied into numpy by perfdoctor.load.arrow_c, on one thread and in rowid slices on two);
connectorx's public ``read_sql(..., return_type="arrow")`` through pyarrow and ADBC's SQLite driver
(adbc-driver-sqlite, SQLite → Arrow in C), each when installed; and Python's sqlite3 with ``fetchmany``
into numpy. Run: ``python benchmarks/bench_readers.py FILE [--reps 5] [--json OUT]`` with the python
whose perfdoctor is to be measured (run_all: its fresh install of the wheel).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timed import NEEDED_COLUMNS  # noqa: E402

TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME")


def _queries() -> list[str]:
    return [f"SELECT {', '.join(NEEDED_COLUMNS[t])} FROM {t}" for t in TABLES]


def scan(path: Path) -> None:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    for t in TABLES:
        conn.execute(f"SELECT {', '.join(f'total({c})' for c in NEEDED_COLUMNS[t])} FROM {t}").fetchall()
    conn.close()


def perfdoctor_reader(threads: int):
    def read(path: Path) -> None:
        from perfdoctor import cores
        from perfdoctor.load import sqlite_export

        cores.PER_TASK = threads
        db = sqlite_export.SqliteExport(path)
        for t in TABLES:
            db.read(t, {c: c for c in NEEDED_COLUMNS[t]})
        db.close()
    return read


def connectorx_arrow(path: Path) -> None:
    import connectorx

    for q in _queries():
        table = connectorx.read_sql(f"sqlite://{path}", q, return_type="arrow")
        [table.column(i).to_numpy() for i in range(table.num_columns)]


def adbc_arrow(path: Path) -> None:
    import adbc_driver_sqlite.dbapi as adbc

    with adbc.connect(f"file:{path}?mode=ro") as conn, conn.cursor() as cur:
        for q in _queries():
            cur.execute(q)
            table = cur.fetch_arrow_table()
            [table.column(i).to_numpy() for i in range(table.num_columns)]


def sqlite3_fetchmany(path: Path) -> None:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    for q in _queries():
        cur = conn.execute(q)
        chunks = []
        while rows := cur.fetchmany(65_536):
            chunks.append(np.array(rows, dtype=np.int64))
        np.concatenate(chunks) if chunks else None
    conn.close()


def candidates() -> dict:
    out = {"perfdoctor (connectorx → Arrow C structs → numpy), 1 thread": perfdoctor_reader(1),
           "perfdoctor, rowid slices on 2 threads (what analyze uses on 2 cores)": perfdoctor_reader(2)}
    for name, module, reader in (("connectorx → pyarrow → numpy, 1 thread", "pyarrow", connectorx_arrow),
                                 ("ADBC sqlite → pyarrow → numpy, 1 thread", "adbc_driver_sqlite.dbapi", adbc_arrow)):
        try:
            __import__(module)
        except ImportError:
            continue
        out[name] = reader
    out["sqlite3 fetchmany → numpy, 1 thread"] = sqlite3_fetchmany
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", type=Path, help="write the result for benchmarks/run_all.py")
    args = ap.parse_args()
    readers = candidates()
    times: dict[str, list[float]] = {name: [] for name in ["scan", *readers]}
    order = list(times)
    for fn in [scan, *readers.values()]:  # warm-up: page cache and imports
        fn(args.trace)
    for i in range(args.reps):
        for name in (order if i % 2 == 0 else order[::-1]):
            fn = scan if name == "scan" else readers[name]
            t0 = time.perf_counter()
            fn(args.trace)
            times[name].append(time.perf_counter() - t0)
    rows = []
    for name in readers:
        r = statistics.median(x / y for x, y in zip(times[name], times["scan"]))
        rows.append([name, f"{statistics.median(times[name]):.3f} s", f"{statistics.median(times['scan']):.3f} s",
                     f"{r:.2f}×"])
        print(f"{name:28} {rows[-1][1]}  scan {rows[-1][2]}  ratio {rows[-1][3]}")
    if args.json:
        args.json.write_text(json.dumps({
            "title": "SQLite readers", "command": f"python benchmarks/bench_readers.py FILE --reps {args.reps}",
            "columns": ["reader", "read (median)", "C-level scan (median)", "ratio (median of pairs)"],
            "rows": rows,
            "notes": "Kernel and runtime tables, the columns listed above, read into numpy columns. The C-level "
                     "scan runs on one core; perfdoctor's loader reads a large table in rowid slices on as many "
                     "threads as the process has cores (perfdoctor/load/sqlite_export.py)."}))


if __name__ == "__main__":
    main()
