"""The first slices of an export read while the command imports (perfdoctor.load.read_ahead): the loader takes
them instead of reading them again, what it never asks for is released, a file that is not an export is not
read at all, and the command's report is the one of a file read without them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from perfdoctor import api
from perfdoctor.errors import InputError
from perfdoctor.load import read_ahead, sqlite_export, sqlite_file
from perfdoctor.load.nsys import load_export
from perfdoctor.load.nsys_columns import RUNTIME_TABLE, api_columns
from perfdoctor.render.json import report_dict
from tests.paths import REAL_H100, SAMPLES


@pytest.fixture
def small_slices(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Tables of more than 100 rows read in slices of 300; every connectorx read, as (thread, SQL)."""
    monkeypatch.setattr(sqlite_file, "SMALL_TABLE_ROWS", 100)
    monkeypatch.setattr(sqlite_file, "SLICE_ROWS", 300)
    reads: list[tuple[str, str]] = []
    arrow = sqlite_file.SqliteFile.arrow

    def counted(self: sqlite_file.SqliteFile, sql: str):
        reads.append((threading.current_thread().name, sql))
        return arrow(self, sql)

    monkeypatch.setattr(sqlite_file.SqliteFile, "arrow", counted)
    yield reads
    assert not read_ahead._reads  # nothing left behind for the next test


def _tables(path):
    _, timelines = load_export(path, detail=False)
    return {(tl.global_pid, tl.device_id): (tl.kernels, tl.api) for tl in timelines}


def test_the_loader_takes_the_slices_read_ahead_and_reads_each_slice_once(small_slices):
    whole = _tables(REAL_H100)
    small_slices.clear()
    assert read_ahead.start(REAL_H100, 2) == 2
    ahead = _tables(REAL_H100)
    started = [sql for thread, sql in small_slices if thread == "perfdoctor-read-ahead"]
    assert len(started) == 2 and all("CUPTI_ACTIVITY_KIND_KERNEL" in sql for sql in started)
    assert len({sql for _, sql in small_slices}) == len(small_slices)  # no slice read twice
    assert read_ahead.rest(REAL_H100) == []
    assert ahead.keys() == whole.keys()
    for key, (kernels, calls) in whole.items():
        assert ahead[key][0].equals(kernels) and ahead[key][1].equals(calls)


def test_slices_nobody_asks_for_are_released_by_the_next_read_of_the_file(small_slices):
    assert read_ahead.start(REAL_H100, 3) == 3
    db = sqlite_export.SqliteExport(REAL_H100)
    try:
        calls = list(db.read_many([(RUNTIME_TABLE, api_columns(False))]))  # not the kernels
    finally:
        db.close()
    assert calls and read_ahead.rest(REAL_H100) == []
    assert sum(thread == "perfdoctor-read-ahead" for thread, _ in small_slices) == 3


@pytest.mark.parametrize("kind", ["missing", "folder", "not sqlite", "kineto json", "too small to slice"])
def test_nothing_is_read_ahead_of_a_file_the_loader_would_not_slice(kind, tmp_path, monkeypatch):
    reads = []
    monkeypatch.setattr(sqlite_file.SqliteFile, "arrow", lambda self, sql: reads.append(sql))
    path = {"missing": tmp_path / "gone.sqlite", "folder": tmp_path, "not sqlite": tmp_path / "x.sqlite",
            "kineto json": tmp_path / "trace.json", "too small to slice": REAL_H100}[kind]
    if kind == "not sqlite":
        path.write_bytes(b"not a database at all" * 100)
    if kind == "kineto json":
        path.write_text('{"traceEvents": []}')
    assert read_ahead.start(path, 2) == 0
    assert reads == [] and not read_ahead._reads


def test_a_slice_that_fails_ahead_fails_where_the_loader_asks_for_it(small_slices, tmp_path, monkeypatch):
    def broken(self, sql):
        raise InputError(f"{self.path}: corrupt or truncated SQLite file (database disk image is malformed)")

    monkeypatch.setattr(sqlite_file.SqliteFile, "arrow", broken)
    assert read_ahead.start(REAL_H100, 2) == 2
    with pytest.raises(InputError, match="corrupt or truncated"):
        load_export(REAL_H100, detail=False)
    assert read_ahead.rest(REAL_H100) == []


# The installed command, run as a user runs it (its own process: main()), on exports small enough to be
# read in slices only with the limits lowered: every read is counted, by the thread that made it.
_COMMAND = """
import atexit, sys, threading
from perfdoctor.load import read_ahead, sqlite_file
sqlite_file.SMALL_TABLE_ROWS, sqlite_file.SLICE_ROWS = 100, 300
arrow, reads = sqlite_file.SqliteFile.arrow, []
def counted(self, sql):
    reads.append((threading.current_thread().name, sql))
    return arrow(self, sql)
sqlite_file.SqliteFile.arrow = counted
atexit.register(lambda: sys.stderr.write(
    f"READS {len(reads)} {len({s for _, s in reads})} {sum(t == 'perfdoctor-read-ahead' for t, _ in reads)} "
    f"{len(read_ahead._reads)}\\n"))
from perfdoctor.cli import main
sys.argv = ["perfdoctor", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("path", [REAL_H100, SAMPLES / "per_node" / "per_node.node0.sqlite"], ids=lambda p: p.name)
def test_the_command_reads_ahead_and_reports_what_a_file_read_without_it_gives(path, tmp_path, monkeypatch):
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-c", _COMMAND, "analyze", str(path), "--format", "json", "-o", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"})
    assert done.returncode == 0, done.stderr
    reads, distinct, ahead, left = map(int, done.stderr.split("READS ")[1].split())
    assert reads == distinct and ahead >= 1 and left == 0
    monkeypatch.setattr(sqlite_file, "SMALL_TABLE_ROWS", 100)
    monkeypatch.setattr(sqlite_file, "SLICE_ROWS", 300)
    expected = report_dict(api.analyze([path], timeline_excerpts=False))
    assert json.loads(out.read_text()) == json.loads(json.dumps(expected))


def test_numpy_imported_for_an_analysis_starts_no_blas_threads_and_leaves_the_environment_as_it_was():
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("counts the process's threads in /proc")
    code = ("import os\nfrom perfdoctor.cores import one_blas_thread\nwith one_blas_thread():\n    import numpy\n"
            "print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'))")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.stdout.split() == ["1", "None"], done.stderr
