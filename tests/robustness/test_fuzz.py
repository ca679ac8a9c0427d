"""Seeded fuzzing of real and simulated nsys exports: byte flips, truncations, column values of the
wrong type and names that are not UTF-8, each analysed in a box (timeout, address-space limit). Every
case must end in exit 0 or a one-line exit 2: no traceback, no crash, no hang, no bomb, and the input
file never modified.

The run has a fixed budget (FUZZ_CASES cases or FUZZ_BUDGET_S seconds, whichever ends first) so CI
stays within minutes; the seed is fixed so a failure reproduces, and PERFDOCTOR_FUZZ_SEED explores
others (the case list then differs but keeps the same mix)."""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
import time
from pathlib import Path

from tests.paths import REAL_H100, SAMPLES, TRACES
from tests.robustness.harness import digest, perfdoctor

SEED = int(os.environ.get("PERFDOCTOR_FUZZ_SEED", "20261123"))
FUZZ_CASES = 60
FUZZ_BUDGET_S = 180
CASE_TIMEOUT_S = 120

SOURCES = [
    SAMPLES / "clean_baseline" / "clean_baseline.rank0.sqlite",  # simulated (perfdoctor synth)
    SAMPLES / "pp_1f1b",  # simulated run directory, several ranks
    SAMPLES / "real" / "cpu_nvtx_nsys2022.sqlite",  # real nsys 2022.4
    SAMPLES / "real_h100" / "h100_2gpu_fastvideo.sqlite",  # real H100 run
    TRACES / "nsys" / "pipit_saxpy_mpi.sqlite",  # real, other people's
    REAL_H100,
]
WRONG_VALUES = ["'abc'", "X'FF00FE'", "NULL", "-1", "0", "9223372036854775807", "-9223372036854775808", "1e308",
                "CAST(X'C328' AS TEXT)", "''"]


def _flip(path: Path, rng: random.Random) -> str:
    data = bytearray(path.read_bytes())
    n = rng.choice([1, 4, 32, 256])
    for _ in range(n):
        data[rng.randrange(100, len(data))] = rng.randrange(256)  # past the header: the reader, not the magic
    path.write_bytes(bytes(data))
    return f"{n} byte(s) flipped"


def _truncate(path: Path, rng: random.Random) -> str:
    data = path.read_bytes()
    cut = rng.randrange(len(data))
    path.write_bytes(data[:cut])
    return f"truncated to {cut} bytes"


def _retype(path: Path, rng: random.Random) -> str:
    with sqlite3.connect(path) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        metadata = [t for t in tables if t.startswith(("META_DATA", "TARGET_INFO"))]  # few rows, all read
        table = rng.choice(metadata if metadata and rng.random() < 0.5 else tables)
        columns = [r[1] for r in conn.execute(f"PRAGMA table_info([{table}])")]
        column, value = rng.choice(columns), rng.choice(WRONG_VALUES)
        share = rng.choice(["rowid = (SELECT min(rowid) FROM [{t}])", "rowid % 7 = 0", "1"]).format(t=table)
        try:
            conn.execute(f"UPDATE [{table}] SET [{column}] = {value} WHERE {share}")
        except sqlite3.DatabaseError:  # a NOT NULL or STRICT column refuses it: keep the value
            pass
    conn.close()
    return f"{table}.{column} = {value} where {share}"


def _undecodable_name(path: Path, rng: random.Random) -> str:
    """A table or column name that is not UTF-8 (SQLite stores names as bytes)."""
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA writable_schema = ON")
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        table = rng.choice(tables)
        if rng.random() < 0.5:
            conn.execute("UPDATE sqlite_master SET name = CAST(? AS TEXT), tbl_name = CAST(? AS TEXT) WHERE name = ?",
                         (table.encode()[:-1] + b"\xff", table.encode()[:-1] + b"\xff", table))
            what = f"table {table} renamed to invalid UTF-8"
        else:
            column = rng.choice([r[1] for r in conn.execute(f"PRAGMA table_info([{table}])")])
            conn.execute("UPDATE sqlite_master SET sql = replace(sql, ?, CAST(? AS TEXT)) WHERE name = ?",
                         (column, column.encode()[:-1] + b"\xff", table))
            what = f"column {table}.{column} renamed to invalid UTF-8"
    conn.close()
    return what


MUTATIONS = [_flip, _truncate, _retype, _retype, _undecodable_name]


def _cases() -> list[tuple[Path, int]]:
    rng = random.Random(SEED)
    sources = [s for s in SOURCES if s.exists()]
    return [(rng.choice(sources), rng.randrange(1 << 30)) for _ in range(FUZZ_CASES)]


def _copy(source: Path, tmp: Path, rng: random.Random) -> Path:
    """The export to mutate: a copy (the source is never touched), one rank of a run directory."""
    if source.is_dir():
        source = rng.choice(sorted(source.glob("*.sqlite")))
    target = tmp / source.name
    shutil.copy(source, target)
    return target


def test_fuzzed_exports_exit_0_or_one_line_2(tmp_path):
    began, failures, ran, codes = time.monotonic(), [], 0, {0: 0, 2: 0}
    sources_before = {s: digest(s) for s in SOURCES if s.is_file()}
    for i, (source, case_seed) in enumerate(_cases()):
        if time.monotonic() - began > FUZZ_BUDGET_S:
            break
        rng = random.Random(case_seed)
        case_dir = tmp_path / f"case{i}"
        case_dir.mkdir()
        trace = _copy(source, case_dir, rng)
        what = rng.choice(MUTATIONS)(trace, rng)
        before = digest(trace)
        try:
            result = perfdoctor("analyze", trace, "-f", "json", "-o", case_dir / "report.json",
                                "--markdown", case_dir / "report.md", timeout=CASE_TIMEOUT_S)
        except Exception as exc:  # subprocess.TimeoutExpired: a hang
            failures.append(f"case {i} ({source.name}: {what}): {type(exc).__name__}")
            continue
        ran += 1
        codes[result.code] = codes.get(result.code, 0) + 1
        lines = result.err.strip().splitlines()
        ok = result.code == 0 or (result.code == 2 and len(lines) == 1 and lines[0].startswith("perfdoctor: "))
        if not ok or "Traceback" in result.err:
            failures.append(f"case {i} ({source.name}: {what}): exit {result.code}: {result.err.strip()[-300:]}")
        if digest(trace) != before:
            failures.append(f"case {i} ({source.name}: {what}): the input was modified")
        shutil.rmtree(case_dir)
    print(f"fuzz seed {SEED}: {ran} cases in {time.monotonic() - began:.0f} s, exit codes {codes}")
    assert not failures, "\n".join(failures)
    assert ran >= min(20, FUZZ_CASES), f"only {ran} cases ran within {FUZZ_BUDGET_S} s"
    assert {s: digest(s) for s in sources_before} == sources_before
