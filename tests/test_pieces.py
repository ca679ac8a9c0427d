"""A file read in pieces (perfdoctor.load.pieces): each process's rows routed while the tables are read in
slices, kept in memory or in unnamed temporary files, put together when its timeline is analysed. Whatever
the route, the timelines and the report are those of the file read whole."""

from __future__ import annotations

import json

import numpy as np
import pytest

from perfdoctor import api, mapped
from perfdoctor.load import pieces, sqlite_export, sqlite_file
from perfdoctor.load.nsys import load_export
from perfdoctor.load.pieces import Pieces, _by_process
from perfdoctor.render.json import report_dict
from perfdoctor.table import Table
from tests.paths import REAL_H100, SAMPLES

MANY_PROCESSES = [SAMPLES / "per_node" / "per_node.node0.sqlite", REAL_H100]
TABLES = ("kernels", "memcpy", "memset", "sync", "api", "nvtx")


@pytest.fixture
def small_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every table read through connectorx in slices of 300 rows, and every process's rows spilled."""
    monkeypatch.setattr(sqlite_file, "SMALL_TABLE_ROWS", 100)
    monkeypatch.setattr(sqlite_file, "SLICE_ROWS", 300)
    monkeypatch.setattr(pieces, "SPILL_ABOVE", 0)


def _tables(path):
    info, timelines = load_export(path, detail=False)
    return info, {(tl.global_pid, tl.device_id): {name: getattr(tl, name) for name in TABLES} for tl in timelines}


@pytest.mark.parametrize("path", MANY_PROCESSES, ids=lambda p: p.name)
def test_timelines_read_in_spilled_slices_equal_those_read_whole(path, monkeypatch, small_slices, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read again
    sliced_info, sliced = _tables(path)
    assert not list(tmp_path.iterdir())  # unnamed files: nothing left in TMPDIR, nothing beside the input
    monkeypatch.undo()
    whole_info, whole = _tables(path)
    assert sliced.keys() == whole.keys() and len(whole) > 1
    assert sliced_info.counts == whole_info.counts
    for key, tables in whole.items():
        for name, table in tables.items():
            assert sliced[key][name].equals(table), (key, name)
            assert sliced[key][name].columns == table.columns


@pytest.mark.parametrize("path", MANY_PROCESSES, ids=lambda p: p.name)
def test_report_of_a_file_read_in_pieces_is_the_same(path, small_slices):
    pieced = json.dumps(report_dict(api.analyze([path], timeline_excerpts=False)), sort_keys=True)
    pieces.SPILL_ABOVE = 1 << 40  # the fixture's monkeypatch restores it
    sqlite_file.SMALL_TABLE_ROWS = 1 << 40
    whole = json.dumps(report_dict(api.analyze([path], timeline_excerpts=False)), sort_keys=True)
    assert pieced == whole


def test_lazy_timelines_hold_no_rows_until_filled(small_slices):
    """What makes memory bounded per piece: a lazily loaded file's timelines are empty, the rows wait in
    temporary files, and filling one timeline reads only its process's rows."""
    _, timelines = load_export(SAMPLES / "per_node" / "per_node.node0.sqlite", detail=False, lazy=True)
    assert len({tl.global_pid for tl in timelines}) == 4
    assert all(len(tl.kernels) == 0 and len(tl.api) == 0 for tl in timelines)
    filler = timelines[0].pending
    assert filler.pieces.spilled
    first = timelines[0].filled()
    assert len(first.kernels) > 0 and len(first.api) > 0
    left = {gpid for _, gpid in filler.pieces._rows}
    assert first.global_pid not in left and left == {tl.global_pid for tl in timelines[1:]}
    assert not any(held.chunks for held in filler.pieces._rows.values())  # all on disk, none in memory


def test_rows_stay_in_memory_for_one_process_until_its_tables_are_large(monkeypatch):
    """A per-rank export (one process) is not written out while its rows are few enough to hold
    (mapped.MAP_ABOVE): routing it costs what reading it whole did. Past that they go to a temporary file
    and come back as mapped columns, so that its tables are never all in memory."""
    rows = Table({"global_pid": np.full(10, 7 << 24), "device_id": np.zeros(10, dtype=np.int64),
                  "start": np.arange(10)})
    for map_above, spilled in ((rows.nbytes * 3, False), (rows.nbytes * 2 - 1, True)):
        monkeypatch.setattr(mapped, "MAP_ABOVE", map_above)
        routed = Pieces(spill_above=0)
        for _ in range(3):
            routed.add("kernels", rows["global_pid"], rows)
        assert routed.spilled is (spilled and mapped.available()) and routed.pairs == {(7 << 24, 0)}
        start = routed.take("kernels", 7 << 24)["start"]
        assert start.tolist() == list(range(10)) * 3 and mapped.is_mapped(start) is routed.spilled


def test_rows_bound_to_be_mapped_go_to_disk_from_the_first_slice(monkeypatch):
    """A table said (Pieces.expect) to hold more rows than fit under mapped.MAP_ABOVE goes to its files
    from the spill threshold on, a slice at a time; its rows come back as they were added. A table expected
    small is held, as before."""
    if not mapped.available():
        pytest.skip("mapped columns need a temporary folder on disk")
    rows = Table({"global_pid": np.full(10, 7 << 24), "device_id": np.zeros(10, dtype=np.int64),
                  "start": np.arange(10)})
    monkeypatch.setattr(mapped, "MAP_ABOVE", rows.nbytes * 5)
    for expected, spilled in ((60, True), (40, False)):
        routed = Pieces(spill_above=0)
        routed.expect("kernels", expected)
        routed.add("kernels", rows["global_pid"], rows)
        assert routed.spilled is spilled
        routed.add("kernels", rows["global_pid"], rows)
        assert routed.take("kernels", 7 << 24)["start"].tolist() == list(range(10)) * 2


def test_rows_at_most_is_the_rowid_span_of_a_table():
    db = sqlite_export.SqliteExport(REAL_H100)
    try:
        rows = db.query("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0]
        assert db.rows_at_most("CUPTI_ACTIVITY_KIND_KERNEL") >= rows > 0
        assert db.rows_at_most("NO_SUCH_TABLE") == 0
    finally:
        db.close()


def test_rows_of_several_processes_keep_file_order_across_memory_and_disk():
    routed = Pieces(spill_above=200)
    key = np.array([1, 2, 1, 2, 1]) << 24
    for i in range(4):
        rows = Table({"global_pid": key, "device_id": np.array([0, 1, 0, 1, 0]),
                      "start": np.arange(5) + 10 * i})
        routed.add("kernels", key, rows)
    assert routed.spilled
    assert routed.take("kernels", 1 << 24)["start"].tolist() == [0, 2, 4, 10, 12, 14, 20, 22, 24, 30, 32, 34]
    assert routed.take("kernels", 2 << 24)["start"].tolist() == [1, 3, 11, 13, 21, 23, 31, 33]
    assert routed.take("kernels", 1 << 24) is None  # taken once
    assert routed.pairs == {(1 << 24, 0), (2 << 24, 1)}


def test_read_slices_gives_the_table_in_file_order(monkeypatch):
    monkeypatch.setattr(sqlite_file, "SMALL_TABLE_ROWS", 100)
    db = sqlite_export.SqliteExport(REAL_H100)
    try:
        whole = db.read("CUPTI_ACTIVITY_KIND_KERNEL", {"start": "start", "corr": "correlationId",
                                                       "missing": "NULL"})
        slices = list(db.read_slices("CUPTI_ACTIVITY_KIND_KERNEL", {"start": "start", "corr": "correlationId",
                                                                    "missing": "NULL"}, rows=333))
    finally:
        db.close()
    assert len(slices) == -(-len(whole) // 333) and max(len(s) for s in slices) <= 333
    assert max(len(s) for s in slices) - min(len(s) for s in slices) <= 1  # no short last slice
    assert Table.concat(slices).equals(whole)


@pytest.mark.parametrize("pattern", ["runs", "interleaved"])
def test_a_slice_splits_by_process_in_file_order(pattern):
    """Long runs of one process are cut into views; interleaved rows are reordered once, stably."""
    rng = np.random.default_rng(3)
    key = np.repeat([5, 9, 5, 7], 500) if pattern == "runs" else rng.choice([5, 7, 9], 2000)
    rows = Table({"key": key, "row": np.arange(key.size)})
    parts = _by_process(key, rows)
    got: dict[int, list[int]] = {}
    for process, part in parts:
        assert (part["key"] == process).all()
        got.setdefault(process, []).extend(part["row"].tolist())
    assert got == {k: np.flatnonzero(key == k).tolist() for k in (5, 7, 9)}
    assert len(parts) == (4 if pattern == "runs" else 3)


def test_a_temporary_folder_that_cannot_be_written_is_one_line(monkeypatch, tmp_path):
    import tempfile

    from perfdoctor.errors import InputError

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    routed = Pieces(spill_above=0)
    key = np.array([1, 2]) << 24
    with pytest.raises(InputError, match="TMPDIR"):
        routed.add("kernels", key, Table({"start": np.arange(2)}))


def test_spilled_chunks_of_two_widths_join_at_the_wider():
    """A column held at 32 bits in one slice and 64 in another (a value beyond int32) reads back whole."""
    routed = Pieces(spill_above=0)
    key = np.array([1, 2]) << 24
    routed.add("api", key, Table({"corr": np.array([5, 6], dtype=np.int32)}))
    routed.add("api", key, Table({"corr": np.array([7, 1 << 40], dtype=np.int64)}))
    got = routed.take("api", 2 << 24)["corr"]
    assert routed.spilled and got.dtype == np.int64 and got.tolist() == [6, 1 << 40]


def test_read_many_gives_each_table_in_file_order_with_slices_read_across_tables(monkeypatch):
    """Several tables through one queue of slices (read ahead across the tables' boundaries): each table's
    slices, in order, are its whole read; a small table (read directly) and a missing one keep their place."""
    from perfdoctor import cores

    monkeypatch.setattr(sqlite_file, "SMALL_TABLE_ROWS", 400)
    monkeypatch.setattr(cores, "PER_TASK", 3)
    requests = [("CUPTI_ACTIVITY_KIND_KERNEL", {"start": "start", "corr": "correlationId", "missing": "NULL"}),
                ("CUPTI_ACTIVITY_KIND_MEMSET", {"start": "start", "end": "end"}),
                ("NO_SUCH_TABLE", {"start": "start"}),
                ("CUPTI_ACTIVITY_KIND_RUNTIME", {"start": "start", "tid": "globalTid"}),
                ("CUPTI_ACTIVITY_KIND_MEMCPY", {"start": "start", "bytes": "bytes"})]
    db = sqlite_export.SqliteExport(REAL_H100)
    try:
        whole = [db.read(table, columns) for table, columns in requests]
        got = list(db.read_many(requests, rows=333))
    finally:
        db.close()
    order = [i for i, _ in got]
    assert order == sorted(order) and set(order) == {0, 1, 3, 4}  # the missing table gives no slice
    assert [i for i, _ in got].count(1) == 1  # the small table: one read
    for i, want in enumerate(whole):
        parts = [part for j, part in got if j == i]
        assert (Table.concat(parts).equals(want) if parts else not len(want))
        assert i == 1 or all(len(p) <= 333 for p in parts)


def test_one_process_columns_at_several_widths_are_joined_at_the_widest(monkeypatch):
    """A large process's rows go to a file per column, mapped as they are; a column whose slices came at
    different widths (a slice too wide to narrow) is copied into one of the widest."""
    monkeypatch.setattr(mapped, "MAP_ABOVE", 0)
    routed = Pieces(spill_above=0)
    for start in (np.arange(10, dtype=np.int32), np.arange(10, 20, dtype=np.int64) << 33):
        rows = Table({"global_pid": np.full(10, 7 << 24), "start": start, "end": start.astype(np.int64) + 1})
        routed.add("kernels", rows["global_pid"], rows)
    table = routed.take("kernels", 7 << 24)
    assert table["start"].dtype == np.int64
    assert table["start"].tolist() == [*range(10), *(v << 33 for v in range(10, 20))]
    assert table["end"].tolist() == [v + 1 for v in table["start"].tolist()]
    assert mapped.is_mapped(table["start"]) is mapped.is_mapped(table["end"]) is mapped.available()
