"""Columns in mapped temporary files (perfdoctor.mapped): the same values as ordinary arrays, pages let go
without losing data, and reports identical when every table of every input is mapped (thresholds forced to
zero), so that a capture of tens of millions of kernels, whose tables are mapped, is measured exactly as a
small one is."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from perfdoctor import api, mapped
from perfdoctor.errors import InputError
from perfdoctor.load import pieces
from perfdoctor.render.json import report_dict
from perfdoctor.table import Strings, Table
from tests.paths import DATA, REAL_H100, SAMPLES

pytestmark = pytest.mark.skipif(not mapped.available(), reason="the temporary folder is a RAM file system")


def _mapped(values: np.ndarray) -> np.ndarray:
    out = mapped.empty(values.size, values.dtype)
    out[:] = values
    return out


def _file_pages() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("RssFile:"))


@pytest.fixture
def small(monkeypatch):
    """Every take from a mapped column mapped, however small; made and written in many small pieces (sizes
    that are no multiple of a value's)."""
    monkeypatch.setattr(mapped, "MAP_TAKES_ABOVE", 0)
    monkeypatch.setattr(mapped, "SLICE_BYTES", 4100)
    monkeypatch.setattr(mapped, "WRITE_BYTES", 1001)


def test_a_mapped_column_holds_what_was_put_in_it(small):
    values = np.random.default_rng(0).integers(-5, 1 << 40, 100_003)
    column = _mapped(values)
    assert mapped.is_mapped(column) and mapped.is_mapped(column[10:20]) and not mapped.is_mapped(values)
    assert np.array_equal(column, values)
    mask = values % 3 == 0
    order = np.argsort(values % 1000, kind="stable")
    for rows in (mask, order, order[:17]):
        out = mapped.taken(column, rows, int(mask.sum()) if rows.dtype == bool else rows.size)
        assert mapped.is_mapped(out) and np.array_equal(out, values[rows])
    narrow = mapped.converted(_mapped(values % 100), np.int8)
    assert narrow.dtype == np.int8 and mapped.is_mapped(narrow) and np.array_equal(narrow, values % 100)
    lookup = np.arange(1000, dtype=np.int16) * 2  # a small table gathered by a mapped column of indices
    out = mapped.taken(lookup, _mapped(values % 1000), values.size)
    assert mapped.is_mapped(out) and np.array_equal(out, lookup[values % 1000])
    filled = mapped.like(values.size, np.int8, column, fill=-1)
    assert mapped.is_mapped(filled) and (filled == -1).all()
    assert not mapped.is_mapped(mapped.like(values.size, np.int8, values, fill=-1))


def test_a_column_written_short_of_its_rows_is_refused(small):
    with pytest.raises(ValueError, match="999 values written for a column of 1000"):
        mapped.written([np.arange(500), np.arange(499)], 1000, np.int64)
    assert np.array_equal(mapped.written(iter([np.arange(3), np.arange(2)]), 5, np.int16), [0, 1, 2, 0, 1])


def test_small_takes_and_ordinary_arrays_stay_ordinary():
    values = np.arange(1000)
    column = _mapped(values)
    assert not mapped.is_mapped(mapped.taken(column, values[::2], 500))  # under MAP_TAKES_ABOVE
    assert not mapped.is_mapped(mapped.taken(values, values[::2], 500))
    table = Table({"start": column, "name": Strings(_mapped(values % 7), np.array(list("abcdefg"), dtype=object))})
    even = table.take(values % 2 == 0)
    assert np.array_equal(even["start"], values[::2])
    assert even["name"].decode().tolist() == [chr(ord("a") + v % 7) for v in values[::2]]


def test_tables_joined_from_mapped_parts_are_mapped(small):
    names = np.array(["gemm", "nccl", None], dtype=object)
    parts = [Table({"start": _mapped(np.arange(n) + 10 * n),
                    "name": Strings(_mapped(np.arange(n) % 3), names[::k])}, rows=n)
             for n, k in ((5000, 1), (3000, -1))]
    whole = Table.concat(parts)
    assert mapped.is_mapped(whole["start"]) and mapped.is_mapped(whole["name"].codes)
    assert whole["start"].tolist() == [*range(50000, 55000), *range(30000, 33000)]
    assert whole["name"].decode().tolist() == [*names[np.arange(5000) % 3], *names[::-1][np.arange(3000) % 3]]


def test_released_pages_leave_this_process_and_keep_their_data():
    values = np.arange(16 << 20, dtype=np.int64)  # 128 MiB
    column = _mapped(values)
    mapped.release()
    before = _file_pages()
    assert int(column.sum()) == int(values.sum())  # every page read back
    assert _file_pages() - before > 64 << 20
    mapped.release()
    assert _file_pages() - before < 16 << 20
    assert np.array_equal(column[::4096], values[::4096])


def test_the_pager_keeps_mapped_pages_under_its_budget(monkeypatch):
    monkeypatch.setattr(mapped, "RESIDENT", 8 << 20)
    column = _mapped(np.arange(16 << 20, dtype=np.int64))
    mapped.release()
    before = _file_pages()
    highest = 0
    for lo in range(0, column.size, 1 << 17):  # 1 MiB at a time, as a slice loop reads
        column[lo:lo + (1 << 17)].sum()
        highest = max(highest, _file_pages() - before)
        time.sleep(mapped.PAGER_EVERY_S)
    assert highest < 64 << 20  # 128 MiB read; the pager keeps far less resident


def test_a_full_temporary_folder_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    with pytest.raises(InputError, match="TMPDIR"):
        mapped.empty(10, np.int64)


@pytest.mark.parametrize(("mounts", "folder", "disk"), [
    (["1 0 8:1 / / rw - ext4 /dev/sda1 rw"], "/tmp", True),
    (["1 0 8:1 / / rw - ext4 /dev/sda1 rw", "2 1 0:5 / /tmp rw - tmpfs tmpfs rw"], "/tmp/x", False),
    (["1 0 8:1 / / rw shared:1 - ext4 /dev/sda1 rw", "2 1 0:5 / /tmpfoo rw - tmpfs tmpfs rw"], "/tmp", True),
    ([], "/tmp", False),
])
def test_only_a_disk_takes_columns_out_of_memory(mounts, folder, disk):
    assert mapped.on_disk(folder, [line.split() for line in mounts]) is disk


def _report(run: Path) -> str:
    report = api.analyze([run], jobs=1, trace_excerpts=True)
    return json.dumps(report_dict(report), sort_keys=True, default=str)


# a pp run, host gaps, a per-node export (several processes), DeepEP all-to-all, the real exports
RUNS = [SAMPLES / name for name in ("pp_1f1b", "gc_jitter", "per_node", "deep_ep", "real_cs336")] + [
    REAL_H100, DATA / "traces" / "nsys" / "pipit_cloverleaf.sqlite"]


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_every_table_mapped_gives_the_same_report(run, monkeypatch):
    whole = _report(run)
    made = []
    of_file = mapped.of_file
    monkeypatch.setattr(mapped, "of_file", lambda fh, rows, dtype: made.append(rows) or of_file(fh, rows, dtype))
    for module, name in ((mapped, "MAP_ABOVE"), (mapped, "MAP_TAKES_ABOVE"), (pieces, "SPILL_ABOVE")):
        monkeypatch.setattr(module, name, 0)
    assert _report(run) == whole
    assert len(made) > 10  # the tables were mapped, and what was taken from them
