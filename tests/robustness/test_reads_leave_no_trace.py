"""Reading never creates, changes or removes a file beside an input (issue 24): the input's directory
is listed (names, sizes, modification times, SHA-256) before and after every read path: an nsys
SQLite export (through sqlite3 and through connectorx), a PyTorch profiler trace, an ``.nsys-rep``
(exported into the cache, never beside it), a memory snapshot, saved JSON reports for ``diff``, and a
run directory holding all of them.

An export in SQLite's WAL journal mode is refused with one line saying how to convert a copy: opening
one, even ``mode=ro``, creates ``-wal`` and ``-shm`` files beside it, and connectorx (which opens
read-write) does so for as long as it reads (seen with a watcher thread, then removed on close).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

from perfdoctor.errors import InputError
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


def test_wal_mode_export_is_refused_with_how_to_convert_it(tmp_path):
    trace = _wal_copy(tmp_path)
    before = listing(tmp_path)
    result = perfdoctor("analyze", trace, "-f", "json")
    assert_bad_input(result, f"{trace}: SQLite file in WAL journal mode")
    assert "PRAGMA journal_mode=DELETE" in result.err
    assert listing(tmp_path) == before  # was: wal.sqlite-shm and wal.sqlite-wal left beside it


def test_converted_copy_analyses(tmp_path):
    """*control*: the conversion the message gives makes a file perfdoctor reads."""
    trace = _wal_copy(tmp_path)
    copy = tmp_path / "copy" / "export.sqlite"
    copy.parent.mkdir()
    shutil.copy(trace, copy)
    conn = sqlite3.connect(copy)
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.close()
    assert perfdoctor("analyze", copy, "-f", "json").code == 0


def test_connectorx_reads_leave_the_directory_unchanged(tmp_path, monkeypatch):
    """Every event table through connectorx (the path of large tables), sliced over threads."""
    from perfdoctor import cores
    from perfdoctor.load import nsys, sqlite_export

    monkeypatch.setattr(sqlite_export, "SMALL_TABLE_ROWS", 10)
    monkeypatch.setattr(cores, "PER_TASK", 2)
    trace = tmp_path / "export.sqlite"
    shutil.copy(EXPORT, trace)
    before = listing(tmp_path)
    _, timelines = nsys.load_export(trace)
    assert len(timelines[0].kernels) > 10
    assert listing(tmp_path) == before
    (tmp_path / "wal").mkdir()
    wal = _wal_copy(tmp_path / "wal")
    with pytest.raises(InputError, match="WAL journal mode"):
        nsys.load_export(wal)
    assert sorted(os.listdir(tmp_path / "wal")) == ["wal.sqlite"]
