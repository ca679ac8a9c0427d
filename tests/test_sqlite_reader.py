"""The SQLite reader against Python's sqlite3, value by value: a small table (read through sqlite3) and
a large one (connectorx in rowid slices on threads, its Arrow chunks copied out through
perfdoctor.load.arrow_c), with NULLs, text, blobs, floats and sparse rowids."""

from __future__ import annotations

import math
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from perfdoctor import cores
from perfdoctor.errors import InputError
from perfdoctor.load.sqlite_export import SqliteExport
from perfdoctor.load.sqlite_file import SMALL_TABLE_ROWS

COLUMNS = {"start": "start", "dur": "dur", "tid": "tid", "ratio": "ratio", "label": "label", "blob": "blob"}


def _make(path: Path, rows: int, gap: int = 1) -> None:
    """A table whose every column has something to get wrong: NULLs in integers, text and blobs (and
    whole NULL stretches longer than one Arrow batch), non-ASCII text, floats, rowids with gaps."""
    rng = np.random.default_rng(rows)
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE events (start INTEGER NOT NULL, dur INTEGER, tid INTEGER, ratio REAL, "
                     "label TEXT, blob BLOB)")
        data = []
        for i in range(rows):
            tid = None if 20_000 <= i < 45_000 or rng.random() < 0.05 else int(rng.integers(0, 2**40))
            data.append((i * gap + 1, int(rng.integers(1, 10**6)), tid,
                         None if i % 7 == 0 else float(rng.random()),
                         None if i % 5 == 0 else f"kernel-{i % 13}-µ",
                         None if i % 3 else bytes([i % 256, 0, 255])))
        conn.executemany("INSERT INTO events (rowid, start, dur, tid, ratio, label, blob) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?)", [(r[0], *r) for r in data])


def _same(got: np.ndarray, want: list) -> bool:
    for g, w in zip(got.tolist(), want):
        if w is None:
            if not (g is None or (isinstance(g, float) and math.isnan(g))):
                return False
        elif g != w:
            return False
    return len(got) == len(want)


@pytest.mark.parametrize("rows, gap, threads", [
    (1_000, 1, 2),  # small: sqlite3
    (SMALL_TABLE_ROWS + 10_001, 1, 1),  # large, one slice
    (SMALL_TABLE_ROWS * 3 + 7, 1, 3),  # large, three slices on three threads
    (SMALL_TABLE_ROWS + 5, 3, 2),  # sparse rowids
])
def test_reader_gives_every_value_as_sqlite3(tmp_path, monkeypatch, rows, gap, threads) -> None:
    path = tmp_path / "t.sqlite"
    _make(path, rows, gap)
    monkeypatch.setattr(cores, "PER_TASK", threads)
    db = SqliteExport(path)
    try:
        table = db.read("events", COLUMNS)
    finally:
        db.close()
    with sqlite3.connect(path) as conn:
        want = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM events").fetchall()
    assert len(table) == rows
    for i, name in enumerate(COLUMNS):
        assert _same(table[name], [row[i] for row in want]), name
    assert table["start"].dtype == np.int64 and table["dur"].dtype == np.int64  # no NULLs: still integers
    assert table["tid"].dtype == np.float64  # NULLs: NaN
    assert table["label"].dtype == object


def test_large_read_needs_neither_pyarrow_nor_pandas(tmp_path) -> None:
    path = tmp_path / "t.sqlite"
    _make(path, SMALL_TABLE_ROWS + 100)
    code = ("import sys; from pathlib import Path; from perfdoctor.load.sqlite_export import SqliteExport; "
            f"t = SqliteExport(Path({str(path)!r})).read('events', {COLUMNS!r}); "
            "assert len(t) > 50000; print(sorted(m for m in ('pyarrow', 'pandas') if m in sys.modules))")
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_large_read_that_fails_is_one_input_error(tmp_path, monkeypatch) -> None:
    path = tmp_path / "t.sqlite"
    _make(path, SMALL_TABLE_ROWS + 100)
    monkeypatch.setattr(cores, "PER_TASK", 2)
    db = SqliteExport(path)
    try:
        with pytest.raises(InputError, match="without the column nope"):
            db.read("events", {"start": "start", "x": "nope"})
    finally:
        db.close()


def test_each_column_s_arrow_chunks_are_freed_before_the_next_is_copied(tmp_path, monkeypatch) -> None:
    """Peak memory of a read is one numpy copy of the table plus what is left of the Arrow one, not both
    whole: when a column is copied, every earlier column's chunks are already released."""
    from perfdoctor.load import arrow_c

    path = tmp_path / "t.sqlite"
    _make(path, SMALL_TABLE_ROWS * 2 + 3)
    monkeypatch.setattr(cores, "PER_TASK", 2)
    join, seen, still_held = arrow_c._join, [], []

    def watched(arrays, formats, narrow=None):
        still_held.extend(bool(a.release) for earlier in seen for a in earlier)
        seen.append(arrays)
        return join(arrays, formats, narrow)

    monkeypatch.setattr(arrow_c, "_join", watched)
    db = SqliteExport(path)
    try:
        table = db.read("events", COLUMNS)
    finally:
        db.close()
    assert len(table) == SMALL_TABLE_ROWS * 2 + 3 and len(seen) == len(COLUMNS) and len(seen[0]) >= 2
    assert still_held and not any(still_held)


def test_a_value_past_the_narrow_type_in_a_later_chunk_keeps_the_column_as_read(tmp_path) -> None:
    """A slice comes as several Arrow chunks (65,536 rows each), each checked as it is cast into the narrow
    column: a value past int32 in the third chunk, after two chunks were already cast, gives the column as
    read (int64), every value intact."""
    path = tmp_path / "t.sqlite"
    rows = 3 * 65_536 + 10
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE events (start INTEGER NOT NULL, dur INTEGER NOT NULL)")
        conn.executemany("INSERT INTO events VALUES (?, ?)", ((i, i % 1000) for i in range(rows)))
        conn.execute("UPDATE events SET dur = ? WHERE rowid = ?", (-(2**31) - 1, 2 * 65_536 + 7))
    db = SqliteExport(path)
    try:
        parts = [part for _, part in db.read_many([("events", {"start": "start", "dur": "dur"})], rows=rows,
                                                  narrow={"events": {"start": np.int32, "dur": np.int32}})]
    finally:
        db.close()
    assert len(parts) == 1 and len(parts[0]) == rows
    assert str(parts[0]["start"].dtype) == "int32" and str(parts[0]["dur"].dtype) == "int64"
    want = np.arange(rows) % 1000
    want[2 * 65_536 + 6] = -(2**31) - 1
    assert np.array_equal(parts[0]["start"], np.arange(rows)) and np.array_equal(parts[0]["dur"], want)


def test_connectorx_reader_is_loaded_without_its_package_and_the_package_takes_it_after():
    """The reader is connectorx's compiled module on its own (its package's __init__ looks up its version
    through importlib.metadata: 11 ms); a later import of the package uses that module, not a second one."""
    code = ("import sys\n"
            "from perfdoctor.load.sqlite_file import connectorx_read_sql\n"
            "read_sql = connectorx_read_sql()\n"
            "print(sorted(m for m in sys.modules if m.startswith('connectorx') or m == 'importlib.metadata'))\n"
            "import connectorx\n"
            "print(connectorx._read_sql is read_sql is connectorx_read_sql())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["['connectorx.connectorx']", "True"]


def test_slices_give_integer_columns_narrow_where_every_value_fits(tmp_path, monkeypatch) -> None:
    """``narrow``: a column copied out of its Arrow chunks as int32 when its values fit and none is NULL (the
    same values); one with a value beyond, or with NULLs, as it was read."""
    path = tmp_path / "t.sqlite"
    _make(path, SMALL_TABLE_ROWS * 2 + 3)
    with sqlite3.connect(path) as conn:  # start fits; dur gets one value past int32 in the second slice
        conn.execute("UPDATE events SET dur = ? WHERE rowid = ?", (2**31, SMALL_TABLE_ROWS * 2))
    monkeypatch.setattr(cores, "PER_TASK", 2)
    kinds = {"start": np.int32, "dur": np.int32, "tid": np.int32}
    db = SqliteExport(path)
    try:
        parts = [part for _, part in db.read_many([("events", COLUMNS)], rows=SMALL_TABLE_ROWS + 2,
                                                  narrow={"events": kinds})]
    finally:
        db.close()
    with sqlite3.connect(path) as conn:
        want = conn.execute("SELECT start, dur, tid FROM events").fetchall()
    assert [str(p["start"].dtype) for p in parts] == ["int32", "int32"]
    assert [str(p["dur"].dtype) for p in parts] == ["int32", "int64"]  # the value past int32 is in the second
    assert [str(p["tid"].dtype) for p in parts] == ["float64", "float64"]  # NULLs (and values past int32)
    for i, name in enumerate(("start", "dur", "tid")):
        assert _same(np.concatenate([p[name] for p in parts]), [row[i] for row in want]), name
