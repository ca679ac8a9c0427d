"""Reading never creates, changes or removes a file beside an input (issue 24): the input's directory
is listed (names, sizes, modification times, SHA-256) before and after every read path: an nsys
SQLite export (through sqlite3 and through connectorx), a PyTorch profiler trace, an ``.nsys-rep``
(exported into the cache, never beside it), a memory snapshot, saved JSON reports for ``diff``, and a
run directory holding all of them.

An export in SQLite's WAL journal mode is read like any other: both readers open the file as the URI
``file:PATH?mode=ro&immutable=1``. Before, the ``mode=ro`` open left ``-wal`` and ``-shm`` files beside
it, and connectorx (which opened the plain path read-write) created them for as long as it read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.paths import REPO, SAMPLES
from tests.robustness.harness import assert_bad_input, perfdoctor

EXPORT = SAMPLES / "pp_1f1b" / "pp_1f1b.rank0.sqlite"
KINETO = REPO / "tests" / "data" / "h100" / "gpt_eager.json.gz"
SNAPSHOT = REPO / "tests" / "data" / "torch_profiler_snapshot.pickle"


def listing(folder: Path) -> dict[str, tuple[int, int, str]]:
    """Every file below ``folder``: relative path → (size, mtime ns, SHA-256)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        st = path.lstat()
        data = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
        out[str(path.relative_to(folder))] = (st.st_size, st.st_mtime_ns, data)
    return out


def _inputs(tmp_path: Path) -> Path:
    """A run directory: an export, a profiler trace, a snapshot (and, by the tests, reports)."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(EXPORT, run / "pp_1f1b.rank0.sqlite")
    shutil.copy(SNAPSHOT, run / "rank0.pickle")
    return run


def _fake_nsys(tmp_path: Path) -> Path:
    """An ``nsys`` whose ``export --output=X REPORT`` copies a real export to X (REPORT is only read)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nsys"
    exe.write_text(f"#!/bin/sh\nfor a; do case $a in --output=*) out=${{a#--output=}};; esac; done\n"
                   f"exec {sys.executable} -c 'import shutil, sys; shutil.copy(sys.argv[1], sys.argv[2])' "
                   f"{EXPORT} \"$out\"\n")
    exe.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("kind", ["sqlite", "kineto", "nsys-rep", "memory", "diff", "run-dir"])
def test_every_read_path_leaves_the_input_directory_unchanged(tmp_path, kind):
    run = _inputs(tmp_path)
    env = None
    if kind == "sqlite":
        args = ["analyze", run / "pp_1f1b.rank0.sqlite", "-f", "json"]
    elif kind == "kineto":
        shutil.copy(KINETO, run / KINETO.name)
        args = ["analyze", run / KINETO.name, "-f", "json"]
    elif kind == "nsys-rep":
        (run / "node0.nsys-rep").write_bytes(b"a report nsys exports")
        env = {"PATH": f"{_fake_nsys(tmp_path)}{os.pathsep}{os.environ['PATH']}",
               "XDG_CACHE_HOME": str(tmp_path / "cache")}
        args = ["analyze", run / "node0.nsys-rep", "-f", "json"]
    elif kind == "memory":
        args = ["memory", run / "rank0.pickle", "-f", "json"]
    elif kind == "diff":
        saved = perfdoctor("analyze", EXPORT, "-f", "json", "-o", run / "base.json")
        assert saved.code == 0, saved.err
        shutil.copy(run / "base.json", run / "head.json")
        args = ["diff", run / "base.json", run / "head.json", "-f", "json"]
    else:
        args = ["analyze", run, "-f", "json"]
    before = listing(run)
    result = perfdoctor(*args, env=env)
    assert result.code == 0, result.err
    assert listing(run) == before
    if kind == "nsys-rep":  # the export went to the cache
        assert list((tmp_path / "cache" / "perfdoctor" / "exports").glob("node0-*.sqlite"))


def _wal_copy(tmp_path: Path) -> Path:
    trace = tmp_path / "wal.sqlite"
    shutil.copy(EXPORT, trace)
    conn = sqlite3.connect(trace)
    assert conn.execute("PRAGMA journal_mode=WAL").fetchone() == ("wal",)
    conn.close()  # the last connection removes -wal and -shm
    assert sorted(os.listdir(tmp_path)) == ["wal.sqlite"]
    return trace


def test_wal_mode_export_is_read_without_files_beside_it(tmp_path):
    trace = _wal_copy(tmp_path)
    before = listing(tmp_path)
    result = perfdoctor("analyze", trace, "-f", "json")
    assert result.code == 0, result.err
    assert listing(tmp_path) == before  # was: wal.sqlite-shm and wal.sqlite-wal left beside it
    assert json.loads(result.out)["steps"]["count"] > 0


def test_wal_file_beside_an_export_is_refused(tmp_path):
    """*control*: changes still in a -wal file would be ignored by an immutable read: refused, as before."""
    trace = _wal_copy(tmp_path)
    (tmp_path / "wal.sqlite-wal").write_bytes(b"uncommitted pages")
    before = listing(tmp_path)
    assert_bad_input(perfdoctor("analyze", trace, "-f", "json"), "a wal file lies beside it")
    assert listing(tmp_path) == before


class Watcher:
    """Every name that appears in a folder while it runs (a -wal or -shm lives only as long as a read)."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.seen, self._stop = folder, set(os.listdir(folder)), threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.seen.update(os.listdir(self.folder))
            time.sleep(0.0002)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.parametrize("journal", ["delete", "wal", "odd name"])
def test_connectorx_reads_create_nothing_beside_the_export(tmp_path, monkeypatch, journal):
    """Every event table through connectorx (the path of large tables), sliced over threads, watched while
    it reads: connectorx opened the plain path read-write, and a WAL-mode file then got -wal and -shm for
    as long as it read. The URI survives a name with URL and URI punctuation."""
    from perfdoctor import cores
    from perfdoctor.load import nsys, sqlite_file

    monkeypatch.setattr(sqlite_file, "SMALL_TABLE_ROWS", 10)
    monkeypatch.setattr(cores, "PER_TASK", 2)
    if journal == "odd name":
        tmp_path = tmp_path / "a b?c#d%20e&f=1 é"
        tmp_path.mkdir()
    trace = _wal_copy(tmp_path) if journal == "wal" else Path(shutil.copy(EXPORT, tmp_path / "x?mode=rw.sqlite"))
    before = listing(tmp_path)
    with Watcher(tmp_path) as watcher:
        for _ in range(3):
            _, timelines = nsys.load_export(trace)
    assert len(timelines[0].kernels) > 10
    assert watcher.seen == {trace.name}
    assert listing(tmp_path) == before


def test_a_missing_export_is_not_created(tmp_path):
    """The read-only URI both readers open: a file that vanished is an error, never a new empty database."""
    from perfdoctor.load.sqlite_file import read_only_uri

    with pytest.raises(sqlite3.OperationalError):
        sqlite3.connect(read_only_uri(tmp_path / "gone.sqlite"), uri=True).execute("SELECT 1 FROM sqlite_master")
    assert os.listdir(tmp_path) == []
