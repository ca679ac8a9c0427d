"""What the process that assembles the report holds per rank (issue 25: many ranks on two cores).

The JSON report is written piece by piece, byte for byte what ``json.dumps`` of the whole dict gives; the
ranks' collective instances and blame paths are held at their width and read back unchanged; and the
driver's memory grows with the ranks by less than the report's own text does per rank (it held eight times
that before: the results as unpickled dicts and ``json.dumps``'s indented chunks).
"""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import yaml

from perfdoctor import api, shared
from perfdoctor.blame import join as join_module
from perfdoctor.blame.entries import PathEntries
from perfdoctor.classify.groups import GROUPS
from perfdoctor.errors import InputError
from perfdoctor.measure import collectives as collectives_module
from perfdoctor.measure.collectives import Packed, Unpacked, pack, unpack
from perfdoctor.records import Loaded, Records
from perfdoctor.render.json import render_json, report_dict, write_json
from perfdoctor.synth import run_scenario
from perfdoctor.width import narrow, offsets, rows, widened
from tests.paths import REPO

SCENARIO = REPO / "perfdoctor" / "synth" / "scenarios" / "clean_baseline.yaml"


def _run(tmp: Path, ranks: int) -> Path:
    """One simulated DP rank copied to ``ranks`` files, each with its own rank mark (benchmarks/bench_ranks)."""
    sc = yaml.safe_load(SCENARIO.read_text())
    sc["parallel"] = {"tp": 1, "dp": ranks}
    sc["output"] = {"schema": "2024.2", "ranks": [0]}
    sc["run"]["steps"] = 3
    (first,) = run_scenario(sc, tmp / "sim")
    out = tmp / f"run{ranks}"
    out.mkdir()
    for r in range(ranks):
        path = out / f"rank{r:05d}.sqlite"
        shutil.copyfile(first, path)
        with sqlite3.connect(path) as db:
            for table, column in (("StringIds", "value"), ("NVTX_EVENTS", "text")):
                db.execute(f"UPDATE {table} SET {column} = ? WHERE {column} LIKE 'rank r=%'",
                           (f"rank r={r} local={r % 8} world={ranks}",))
    return out


def test_streamed_json_is_the_whole_string_and_comes_in_pieces(tmp_path: Path) -> None:
    report = api.analyze([_run(tmp_path, 6)], jobs=1, timeline_excerpts=False)
    assert isinstance(report.path, PathEntries) and len(report.path) == 6
    whole = json.dumps(report_dict(report), indent=2, sort_keys=False, default=str) + "\n"
    pieces: list[str] = []
    write_json(report, pieces.append)
    assert "".join(pieces) == whole == render_json(report)
    assert max(map(len, pieces)) < len(whole) / 6  # never the report, nor all ranks of a section, at once
    assert json.loads(whole)["path"] == {r: report.path[r] for r in report.path}


def test_streamed_json_of_odd_values() -> None:
    """Empty containers, non-string keys, tuples, objects that only ``default=str`` can write."""
    from perfdoctor.render.json import _write_value

    for value in ({}, [], {"a": {}, "b": [[], {}], "c": (1, 2.5, None, "x\ny")}, {1: "int key"},
                  {"deep": {"er": {"est": {"x": [1, {"y": Path("/p")}]}}}}, [{"k": [1, 2]}, "é"], float("nan")):
        buffer = io.StringIO()
        _write_value(value, 0, buffer.write)
        assert buffer.getvalue() == json.dumps(value, indent=2, default=str)


def test_collectives_pack_and_unpack_to_the_same_arrays(tmp_path: Path) -> None:
    result = api.analyze_file(api.FileTask(next(_run(tmp_path, 2).iterdir()), {}, False))
    (rank,) = result.ranks
    c = rank.collectives
    assert c is not None and len(c) > 0
    p = pack(c)
    back = unpack(p)
    for name in ("group", "comm", "stream", "seq", "start", "end", "bytes", "before_start", "before_compute",
                 "before_other_comm"):
        a, b = getattr(c, name), getattr(back, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert list(back.before_idle) == list(c.before_idle)
    assert all(np.array_equal(c.before_idle[k], back.before_idle[k]) and back.before_idle[k].dtype == np.int64
               for k in c.before_idle)
    held = p.rows.nbytes + p.comm_ids.nbytes
    sent = sum(getattr(c, n).nbytes for n in ("group", "comm", "stream", "seq", "start", "end", "bytes",
                                                "before_start", "before_compute", "before_other_comm"))
    assert held < (sent + sum(v.nbytes for v in c.before_idle.values())) / 2
    cols = Unpacked({0: p})
    assert np.array_equal(cols[0].start, c.start) and list(cols) == [0] and 1 not in cols


def test_the_driver_keeps_packed_shared_results(tmp_path: Path) -> None:
    run = _run(tmp_path, 3)
    seen: dict = {}
    store = Records()
    kept = [api._kept(api._stored(api.analyze_packed(api.FileTask(p, {}, False)), store), store, seen)
            for p in sorted(run.iterdir())]
    ranks = [r for f in kept for r in f.ranks]
    assert all(r.device is r.metrics is r.collectives is r.blame is None for r in ranks)  # in the store
    assert all(r.exposed is not None and set(r.exposed) == set(GROUPS) for r in ranks)
    assert kept[0].trace.tables is kept[2].trace.tables
    for r in ranks:
        r.load(store, seen)
    assert all(r.exposed == {g: r.metrics.get(f"comm.{g}.exposed_ms") for g in GROUPS} for r in ranks)
    keys = [list(r.metrics) for r in ranks]
    assert all(a is b for a, b in zip(keys[0], keys[2]))  # one copy of each metric name among ranks
    cols = Loaded(store, {i: r.stored[1] for i, r in enumerate(ranks)}, seen, 0)
    paths = Loaded(store, {i: r.stored[2] for i, r in enumerate(ranks)}, seen, 1)
    assert all(isinstance(cols[i], Packed) for i in range(3))
    assert paths[0].path["names"][0] is paths[2].path["names"][0]
    last = paths[1]
    assert paths[1] is last and paths[0] is not None and paths[1] is not last  # the last one loaded is kept


def test_records_read_back_what_was_written_and_load_only_what_is_asked_for(monkeypatch) -> None:
    store = Records()
    values = [b"", b"x" * 100_000, bytes(range(256)), b"\0", shared.dumps({"a": [1, "b"]})]
    numbers = [store.add(v) for v in values]
    assert numbers == list(range(len(values))) and [store[n] for n in reversed(numbers)] == values[::-1]
    loaded = Loaded(store, {7: 4}, {}, 0)
    calls = []
    monkeypatch.setattr(shared, "loads", lambda *a: calls.append(a) or "loaded")
    assert 7 in loaded and 8 not in loaded and list(loaded) == [7] and len(loaded) == 1 and not calls
    assert loaded[7] == "loaded" and len(calls) == 1
    store.close()


def test_records_without_a_writable_temporary_folder_say_so_in_one_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    with pytest.raises(InputError, match="temporary folder .*missing.*set TMPDIR"):
        Records().add(b"x")


def test_shared_pickle_loads_what_a_plain_pickle_does() -> None:
    value = {"a": [1, 2.5, "x", ("y", frozenset({"p", "q"}))], "b": np.arange(3), "c": None}
    seen: dict = {}
    first, second = shared.loads(shared.dumps(value), seen), shared.loads(shared.dumps(value), seen)
    assert first["a"] == second["a"] == value["a"] and np.array_equal(first["b"], value["b"])
    assert first["a"][2] is second["a"][2] and first["a"][3][1] is second["a"][3][1]
    assert first["b"].base is None  # arrays own their data (protocol 5 would load views of the bytes)


def test_width() -> None:
    assert narrow(np.array([0, 255])).dtype == np.uint8
    assert narrow(np.array([-1, 200])).dtype == np.int16
    assert narrow(np.array([0, 2**40])).dtype == np.int64
    t = np.array([10**18, 10**18 + 5, 10**18 + 3_000_000_000], dtype=np.int64)
    base, rest = offsets(t)
    assert rest.dtype == np.uint32 and np.array_equal(widened(base, rest), t)
    r = rows({"a": np.array([1, 2], dtype=np.int8), "b": np.array([3, 4], dtype=np.uint32)})
    assert r.dtype.itemsize == 5 and r["b"].tolist() == [3, 4]


def _driver_growth(run: Path) -> tuple[int, int]:
    """Peak traced memory of analysing ``run`` (the tasks in this process: their own peak does not grow
    with the ranks) and writing its JSON; and the JSON's length."""
    tracemalloc.start()
    try:
        report = api.analyze([run], jobs=1, timeline_excerpts=False)
        size = [0]

        def write(text: str) -> None:
            size[0] += len(text)
        write_json(report, write)
        return tracemalloc.get_traced_memory()[1], size[0]
    finally:
        tracemalloc.stop()


def test_driver_memory_per_rank_is_below_the_report_text_per_rank(tmp_path: Path, monkeypatch) -> None:
    # The join's caches hold up to 64 ranks (a constant at a thousand ranks): kept to 2 here, so that 16
    # ranks show the growth of 1,000.
    monkeypatch.setattr(join_module, "ACROSS_CACHE", 2)
    monkeypatch.setattr(collectives_module, "CACHE", 2)
    api.analyze([_run(tmp_path / "warm", 2)], jobs=1, timeline_excerpts=False)  # imports, caches
    few, many = 4, 16
    peak_few, text_few = _driver_growth(_run(tmp_path / "few", few))
    peak_many, text_many = _driver_growth(_run(tmp_path / "many", many))
    per_rank = (peak_many - peak_few) / (many - few)
    text_per_rank = (text_many - text_few) / (many - few)
    print(f"driver {per_rank:.0f} B a rank, report text {text_per_rank:.0f} B a rank")
    # Measured: 16-31 KB a rank against ~30 KB of text, by the tests run before (the ranks' content is loaded
    # after match and join, so their peaks and it do not add up); 60 KB with the content loaded before them,
    # 188 KB holding every rank's results as they came.
    assert per_rank < 1.5 * text_per_rank, (per_rank, text_per_rank)


def test_what_the_driver_holds_while_the_tasks_run_does_not_grow_with_the_ranks(tmp_path: Path, monkeypatch) -> None:
    """The process tree peaks while the pool's workers run beside the driver: what the driver holds of the
    results come back by then is in its temporary store (perfdoctor.records), a few integers a rank in
    memory, not the objects they load to (about twice the bytes a task sends)."""
    held: dict[int, int] = {}
    run_tasks = api.run_tasks

    def measured(fn, tasks, *args, **kwargs):
        before = tracemalloc.get_traced_memory()[0]
        out = run_tasks(fn, tasks, *args, **kwargs)
        held[len(tasks)] = tracemalloc.get_traced_memory()[0] - before
        return out

    monkeypatch.setattr(api, "run_tasks", measured)
    api.analyze([_run(tmp_path / "warm", 2)], jobs=2, timeline_excerpts=False)  # imports, caches
    few, many = 4, 16
    for count in (few, many):
        run = _run(tmp_path / str(count), count)
        tracemalloc.start()
        try:
            api.analyze([run], jobs=2, timeline_excerpts=False)  # the tasks in a pool, as the CLI runs them
        finally:
            tracemalloc.stop()
    head, parts = api.analyze_packed(api.FileTask(next(run.iterdir()), {}, False))
    sent = len(head) + sum(len(b or b"") for part in parts for b in part)
    per_rank = (held[many] - held[few]) / (many - few)
    print(f"held {per_rank:.0f} B a rank while the tasks run, sent {sent} B a rank")
    assert per_rank < sent / 20, (per_rank, sent)
