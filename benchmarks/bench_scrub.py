"""Scrubbing secrets from an export against copying it, in the same run.

capture scrubs every export before it gets its name (perfdoctor/capture/scrub.py): every text value
of every table goes through the redaction, then ``VACUUM INTO`` writes a fresh file. The floor is that
``VACUUM INTO`` alone (a copy SQLite cannot do faster). The export is the big benchmark trace plus one
NVTX text label per kernel (the hook's labels are text in real exports) and an environment block with
a secret. Runs alternate (floor, scrub, floor, ...); the ratio of medians is what we track (target
≤ 3×). Run: ``python benchmarks/bench_scrub.py [--kernels N]``.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from make_big_trace import write

from perfdoctor.capture.scrub import scrub_sqlite

LIMIT = 3.0
SECRET = "tok-bench-0123456789"


def make(path: Path, kernels: int) -> None:
    write(path, kernels)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE NVTX_EVENTS SET text = 'comm op=all_reduce group=dp bytes=' || (rowid * 64) || ' size=8'")
    n = conn.execute("SELECT count(*) FROM NVTX_EVENTS").fetchone()[0]
    conn.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, text) VALUES (?, ?, 59, 0, ?)",
                     ((i, i + 1, f"step n={i}") for i in range(max(0, kernels - n))))
    conn.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)",
                 (10**9, f"PATH=/usr/bin\0MY_API_TOKEN={SECRET}\0NCCL_ALGO=Ring"))
    conn.commit()
    conn.close()


def floor(source: Path, target: Path) -> float:
    target.unlink(missing_ok=True)
    t0 = time.perf_counter()
    conn = sqlite3.connect(source)
    conn.execute("VACUUM INTO ?", (str(target),))
    conn.close()
    return time.perf_counter() - t0


def scrub(source: Path, work: Path, target: Path) -> float:
    shutil.copyfile(source, work)  # scrub_sqlite changes its source: untimed fresh copy each run
    target.unlink(missing_ok=True)
    t0 = time.perf_counter()
    scrub_sqlite(work, target, [SECRET])
    elapsed = time.perf_counter() - t0
    assert SECRET.encode() not in target.read_bytes()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        source, work, target = Path(tmp) / "big.sqlite", Path(tmp) / "work.sqlite", Path(tmp) / "out.sqlite"
        make(source, args.kernels)
        texts = sqlite3.connect(source).execute("SELECT count(text) FROM NVTX_EVENTS").fetchone()[0]
        print(f"export: {source.stat().st_size / 2**20:.0f} MiB, {texts:,} NVTX text labels")
        floors, scrubs = [], []
        for _ in range(args.repeat):
            floors.append(floor(source, target))
            scrubs.append(scrub(source, work, target))
        ratio = statistics.median(scrubs) / statistics.median(floors)
        print(f"VACUUM INTO (floor): median {statistics.median(floors):.2f} s  {[round(x, 2) for x in floors]}")
        print(f"scrub_sqlite:        median {statistics.median(scrubs):.2f} s  {[round(x, 2) for x in scrubs]}")
        print(f"ratio scrub / floor: {ratio:.2f} (limit {LIMIT})")
        if ratio > LIMIT:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
