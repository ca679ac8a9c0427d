"""The loader reads back exactly the NVTX events a program emitted under real nsys.

programs/emit_nvtx.py runs under ``nsys profile -t osrt,nvtx`` (2022.4) and writes a manifest of
what it emitted; each test compares one aspect of the loader's output, for the export of every
available release (2022.4, and 2023.4 / 2024.2 re-exports of the same report).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from perfdoctor.model import Timeline
from perfdoctor.table import Table
from tests.nsys.conftest import ENV_MARKER, LoadedExport

pytestmark = pytest.mark.nsys

EVENT_TYPE = {"pushpop": 59, "startend": 60, "mark": 34}
SCHEMA_PREFIX = {"2022.4": "3.0.", "2023.4": "3.7.", "2024.2": "3.11."}
META_TABLE = {"2022.4": "EXPORT_META_DATA", "2023.4": "META_DATA_EXPORT", "2024.2": "META_DATA_EXPORT"}
TID_MASK = (1 << 24) - 1


def only_timeline(loaded: LoadedExport) -> Timeline:
    assert len(loaded.timelines) == 1, [tl.label for tl in loaded.timelines]
    return loaded.timelines[0]


def thread_of(loaded: LoadedExport, global_tid: int) -> str:
    """Manifest name ("main", "worker") of a globalTid, after checking it belongs to the program."""
    manifest = loaded.capture.manifest
    assert (global_tid >> 24) & TID_MASK == manifest["pid"]
    names = {tid: name for name, tid in manifest["tids"].items()}
    return names[global_tid & TID_MASK]


def emitted(loaded: LoadedExport) -> list[dict]:
    return loaded.capture.manifest["events"]


def test_trace_info(loaded: LoadedExport) -> None:
    info = loaded.info
    assert info.format == "nsys-sqlite"
    assert info.product_version is not None and info.product_version.startswith(loaded.release + ".")
    assert info.nsys_version == loaded.release
    assert info.schema_version is not None and info.schema_version.startswith(SCHEMA_PREFIX[loaded.release])
    assert info.meta_table == META_TABLE[loaded.release]
    assert info.has_cuda is False
    assert info.gpus == {}
    assert "NVTX_EVENTS" in info.tables
    assert info.counts["nvtx"] == len(emitted(loaded))
    before, after = loaded.capture.wall_ns
    assert info.session_start_utc_ns is not None and before <= info.session_start_utc_ns <= after


def test_one_cpu_timeline_for_the_program(loaded: LoadedExport) -> None:
    tl = only_timeline(loaded)
    manifest = loaded.capture.manifest
    assert tl.device_id is None and tl.gpu is None
    assert tl.pid == manifest["pid"]
    assert tl.global_pid & ~TID_MASK == tl.global_pid and (tl.global_pid >> 24) & TID_MASK == manifest["pid"]
    assert tl.process_name is not None and Path(tl.process_name).name == Path(loaded.capture.program).name
    assert tl.osrt_calls > 0  # captured with -t osrt,nvtx
    for frame in (tl.kernels, tl.memcpy, tl.memset, tl.sync, tl.api):
        assert len(frame) == 0
    main_tid = tl.global_pid | manifest["tids"]["main"]
    # the OS comm name; on a busy machine nsys may have read it before the exec, as its launcher's (seen once)
    assert tl.thread_names.get(main_tid) in (Path(loaded.capture.program).name[:15], "nsys-launcher")


def test_every_emitted_event_is_read_back_once(loaded: LoadedExport) -> None:
    nvtx = only_timeline(loaded).nvtx
    got = Counter(
        (row.text, row.domain, int(row.event_type), thread_of(loaded, row.tid)) for row in nvtx.rows()
    )
    want = Counter((e["text"], e["domain"], EVENT_TYPE[e["kind"]], e["thread"]) for e in emitted(loaded))
    assert got == want


def test_marks_have_no_end_and_ranges_are_ordered(loaded: LoadedExport) -> None:
    nvtx = only_timeline(loaded).nvtx
    marks = nvtx[nvtx["event_type"] == EVENT_TYPE["mark"]]
    ranges = nvtx[nvtx["event_type"] != EVENT_TYPE["mark"]]
    assert (marks["end"] == -1).all()
    assert (ranges["end"] >= ranges["start"]).all() and (ranges["start"] >= 0).all()
    assert (np.diff(nvtx["start"]) >= 0).all()


def test_nesting(loaded: LoadedExport) -> None:
    """Each event's innermost enclosing range on its thread is the one it was emitted inside."""
    nvtx = only_timeline(loaded).nvtx
    got = Counter((row.text, _innermost_parent(nvtx, row)) for row in nvtx.rows())
    want = Counter((e["text"], e["parent"]) for e in emitted(loaded))
    assert got == want


def test_steps_are_sequential_and_hold_their_phases(loaded: LoadedExport) -> None:
    nvtx = only_timeline(loaded).nvtx
    steps = nvtx[_starts(nvtx, "step n=")]
    assert list(steps["text"]) == [f"step n={n}" for n in range(len(steps))]
    assert (steps["start"][1:] >= steps["end"][:-1]).all()
    for step in steps.rows():
        inside = nvtx[(nvtx["tid"] == step.tid) & (nvtx["start"] >= step.start) & (nvtx["end"] <= step.end)]
        children = Counter(inside.col("text")) - Counter([step.text])
        assert children == Counter(e["text"] for e in emitted(loaded) if e["parent"] == step.text)


def test_start_end_range_ended_on_another_thread(loaded: LoadedExport) -> None:
    nvtx = only_timeline(loaded).nvtx
    crossing = {e["text"]: e["end_thread"] for e in emitted(loaded) if e["end_thread"]}
    assert crossing, "the program emits a range that ends on another thread"
    for row in nvtx.rows():
        if row.text in crossing:
            assert row.end_tid != -1 and thread_of(loaded, row.end_tid) == crossing[row.text]
        else:
            assert row.end_tid == -1, row.text  # nsys leaves endGlobalTid NULL on the same thread


def test_start_end_ranges_have_distinct_ids(loaded: LoadedExport) -> None:
    nvtx = only_timeline(loaded).nvtx
    ids = nvtx["range_id"][nvtx["event_type"] == EVENT_TYPE["startend"]]
    assert (ids > 0).all() and np.unique(ids).size == ids.size


def test_payload(loaded: LoadedExport) -> None:
    nvtx = only_timeline(loaded).nvtx
    payload = loaded.capture.manifest["payload"]
    text = nvtx.col("text", dtype=object)
    with_payload = nvtx[text == payload["text"]]
    assert len(with_payload) > 0 and (with_payload["int_value"] == payload["value"]).all()
    assert (nvtx["int_value"][text != payload["text"]] == -1).all()


def test_config_mark_is_json(loaded: LoadedExport) -> None:
    nvtx = only_timeline(loaded).nvtx
    (config,) = nvtx["text"][_starts(nvtx, "config ")]
    assert json.loads(config.removeprefix("config ")) == {
        "tp": 1,
        "pp": 1,
        "dp": 1,
        "num_microbatches": 2,
        "seq_length": 128,
        "gpu": "cpu",
    }


def test_captured_environment(loaded: LoadedExport) -> None:
    """Exporters from 2023.4 on write the program's environment (META_DATA_CAPTURE); 2022.4 does not."""
    env = loaded.info.env
    if loaded.release == "2022.4":
        assert env == {}
    else:
        assert env.get(ENV_MARKER[0]) == ENV_MARKER[1]


def _starts(nvtx: Table, prefix: str) -> np.ndarray:
    return np.array([isinstance(t, str) and t.startswith(prefix) for t in nvtx["text"]], dtype=bool)


def _innermost_parent(nvtx: Table, row: object) -> str | None:
    """Text of the latest-starting range on the same thread that contains ``row`` (not ``row`` itself)."""
    start, end = row.start, (row.end if row.end != -1 else row.start)
    text = nvtx.col("text", dtype=object)
    enclosing = nvtx[
        (nvtx["tid"] == row.tid)
        & (nvtx["event_type"] != EVENT_TYPE["mark"])
        & (nvtx["start"] <= start)
        & (nvtx["end"] >= end)
        & ~((nvtx["start"] == row.start) & (nvtx["end"] == row.end) & (text == row.text))
    ]
    if not len(enclosing):
        return None
    return enclosing.sorted_by("start")["text"][-1]
