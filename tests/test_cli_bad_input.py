"""Bad input: one line on stderr, exit code 2, no traceback, and the input file untouched."""

from __future__ import annotations

import hashlib
import random
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from perfdoctor.cli import main
from tests.paths import REAL_H100


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    old = sys.argv
    sys.argv = ["perfdoctor", *args]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        sys.argv = old
    out, err = capsys.readouterr()
    return code, out, err


def fingerprint(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return hashlib.sha256(path.read_bytes()).hexdigest(), st.st_mtime_ns, st.st_mode


def assert_one_line_error(code: int, err: str, needle: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("perfdoctor: ")
    assert needle in lines[0]


def test_missing_path(capsys, tmp_path):
    code, _, err = run_cli(capsys, "analyze", str(tmp_path / "nope.sqlite"))
    assert_one_line_error(code, err, "no such file")


def test_directory_without_traces(capsys, tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    code, _, err = run_cli(capsys, "analyze", str(tmp_path))
    assert_one_line_error(code, err, "no nsys SQLite exports")


def test_directory_with_only_reports_says_export(capsys, tmp_path, monkeypatch):
    (tmp_path / "rank0.nsys-rep").write_bytes(b"x")
    monkeypatch.setenv("PATH", str(tmp_path / "no-nsys-here"))
    code, _, err = run_cli(capsys, "analyze", str(tmp_path))
    assert_one_line_error(code, err, "no `nsys` on PATH")
    assert "nsys export --type sqlite -o rank0.sqlite rank0.nsys-rep" in err


def test_not_sqlite(capsys, tmp_path):
    f = tmp_path / "trace.sqlite"
    f.write_text("this is not a database\n" * 10)
    before = fingerprint(f)
    code, _, err = run_cli(capsys, "analyze", str(f))
    assert_one_line_error(code, err, "not an SQLite file")
    assert fingerprint(f) == before


def test_sqlite_but_not_nsys(capsys, tmp_path):
    f = tmp_path / "other.sqlite"
    with sqlite3.connect(f) as c:
        c.execute("CREATE TABLE users (id INTEGER, name TEXT)")
        c.execute("INSERT INTO users VALUES (1, 'a')")
    c.close()
    before = fingerprint(f)
    code, _, err = run_cli(capsys, "analyze", str(f))
    assert_one_line_error(code, err, "not an Nsight Systems export")
    assert fingerprint(f) == before


@pytest.mark.parametrize("keep", [100_000, 1_500_000])
def test_truncated_export(capsys, tmp_path, keep):
    f = tmp_path / "trunc.sqlite"
    f.write_bytes(REAL_H100.read_bytes()[:keep])
    before = fingerprint(f)
    code, _, err = run_cli(capsys, "analyze", str(f))
    assert_one_line_error(code, err, "trunc.sqlite")
    assert fingerprint(f) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trunc.sqlite"]


@pytest.mark.parametrize(("lo", "hi"), [(40_000, 600_000), (1_200_000, 1_400_000), (2_000_000, 2_200_000)])
def test_corrupt_pages(capsys, tmp_path, lo, hi):
    """Garbage over schema pages or over event-table pages (header intact): a clear error, not a crash."""
    f = tmp_path / "corrupt.sqlite"
    data = bytearray(REAL_H100.read_bytes())
    data[lo:hi] = random.Random(lo).randbytes(hi - lo)
    f.write_bytes(bytes(data))
    code, _, err = run_cli(capsys, "analyze", str(f))
    assert_one_line_error(code, err, "corrupt.sqlite")


def test_hot_journal_is_refused_not_rolled_back(capsys, tmp_path):
    f = tmp_path / "t.sqlite"
    shutil.copy(REAL_H100, f)
    (tmp_path / "t.sqlite-journal").write_bytes(b"\x00" * 512)
    before = fingerprint(f)
    code, _, err = run_cli(capsys, "analyze", str(f))
    assert_one_line_error(code, err, "journal")
    assert fingerprint(f) == before


def test_future_schema_warns_and_reads(capsys, tmp_path):
    f = tmp_path / "future.sqlite"
    shutil.copy(REAL_H100, f)
    with sqlite3.connect(f) as c:
        c.execute("UPDATE META_DATA_EXPORT SET value = '4.2.0' WHERE name = 'EXPORT_SCHEMA_VERSION'")
    c.close()
    code, out, err = run_cli(capsys, "analyze", str(f), "--format", "json")
    assert code == 0, err
    assert "newer than the newest perfdoctor knows" in out


def test_valid_input_untouched_even_read_only(capsys, tmp_path):
    f = tmp_path / "ro.sqlite"
    shutil.copy(REAL_H100, f)
    f.chmod(0o444)
    before = fingerprint(f)
    code, _, err = run_cli(capsys, "analyze", str(f), "--format", "json")
    assert code == 0, err
    assert fingerprint(f) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ro.sqlite"]


def test_unwritable_output(capsys, tmp_path):
    code, _, err = run_cli(capsys, "analyze", str(REAL_H100), "-o", str(tmp_path / "no" / "such" / "dir.json"))
    assert_one_line_error(code, err, "cannot write")


def test_usage_error_is_one_line(capsys):
    code, _, err = run_cli(capsys, "analyze", "--no-such-option")
    assert_one_line_error(code, err, "No such option")


def test_console_entry_point_real_process(tmp_path):
    """The installed entry point, as a user runs it: one line, exit 2."""
    proc = subprocess.run([sys.executable, "-m", "perfdoctor", "analyze", str(tmp_path / "missing.sqlite")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"perfdoctor: {tmp_path / 'missing.sqlite'}: no such file or directory"]
