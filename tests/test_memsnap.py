"""The snapshot loader: hostile pickles never run, broken files give one-line errors, old formats load."""

from __future__ import annotations

import copyreg
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from perfdoctor.errors import InputError
from perfdoctor.load import memsnap
from perfdoctor.load.memsnap import load_snapshot, rank_from_name
from tests.paths import REAL_H100

MB = 1 << 20


def _frames(*names: str) -> list[dict]:
    return [{"filename": f"/code/{n}.py", "line": i + 1, "name": n} for i, n in enumerate(names)]


def small_snapshot() -> dict:
    """One segment of 8 MiB: a 2 MiB allocated block, then 6 MiB cached; its history."""
    base = 0x7F0000000000
    return {
        "segments": [{
            "device": 0, "address": base, "total_size": 8 * MB, "allocated_size": 2 * MB, "active_size": 2 * MB,
            "requested_size": 2 * MB - 100, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": _frames("seg"),
            "blocks": [
                {"address": base, "size": 2 * MB, "requested_size": 2 * MB - 100, "state": "active_allocated",
                 "frames": _frames("weights", "train")},
                {"address": base + 2 * MB, "size": 6 * MB, "requested_size": 0, "state": "inactive", "frames": []},
            ],
        }],
        "device_traces": [[
            {"action": "segment_alloc", "addr": base, "size": 8 * MB, "stream": 0, "time_us": 10, "frames": []},
            {"action": "alloc", "addr": base, "size": 2 * MB, "stream": 0, "time_us": 11,
             "frames": _frames("weights", "train")},
        ]],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128", "expandable_segments": False},
        "external_annotations": [],
    }


def write(tmp_path: Path, obj: object, name: str = "rank0.pickle") -> Path:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(obj))
    return path


# --------------------------------------------------------------------------------------------
# Hostile pickles: the payload would create a file; it must not exist afterwards.


class _OsSystem:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Eval:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"open({str(self.marker)!r}, 'w').close()",))


class _Popen:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (subprocess.Popen, (["touch", str(self.marker)],))


@pytest.mark.parametrize("payload, named", [(_OsSystem, "system"), (_Eval, "eval"),
                                            (_Popen, "Popen")])
@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_hostile_pickle_is_refused_by_name_and_never_runs(tmp_path, payload, named, protocol):
    marker = tmp_path / "pwned"
    snap = small_snapshot()
    snap["device_traces"][0][1]["frames"] = payload(marker)  # hidden deep inside a real-looking snapshot
    path = tmp_path / "rank0.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=protocol))
    with pytest.raises(InputError) as err:
        load_snapshot(path)
    assert named in str(err.value) and "refusing" in str(err.value)
    assert "\n" not in str(err.value)
    assert not marker.exists()


def test_extension_registry_opcode_is_refused(tmp_path):
    """EXT1 names a global through copyreg's registry: the unpickler still has to ask find_class."""
    marker = tmp_path / "pwned"
    copyreg.add_extension(os.system.__module__, "system", 0xF0)
    try:
        path = tmp_path / "ext.pickle"
        path.write_bytes(pickle.dumps(_OsSystem(marker), protocol=2))
        assert b"\x82\xf0" in path.read_bytes()  # EXT1 0xF0, not a GLOBAL opcode
        with pytest.raises(InputError, match="refusing"):
            load_snapshot(path)
    finally:
        copyreg.remove_extension(os.system.__module__, "system", 0xF0)
    assert not marker.exists()


def test_persistent_id_is_refused(tmp_path):
    class P(pickle.Pickler):
        def persistent_id(self, obj):
            return "x" if obj == "secret" else None

    path = tmp_path / "pid.pickle"
    with path.open("wb") as fh:
        P(fh).dump({"segments": ["secret"]})
    with pytest.raises(InputError, match="persistent"):
        load_snapshot(path)


# --------------------------------------------------------------------------------------------
# Broken inputs


def test_not_a_pickle(tmp_path):
    text = tmp_path / "notes.pickle"
    text.write_text("hello, this is not a pickle\n")
    with pytest.raises(InputError, match="not a PyTorch memory snapshot"):
        load_snapshot(text)
    with pytest.raises(InputError, match="not a PyTorch memory snapshot"):
        load_snapshot(REAL_H100)  # an SQLite file


def test_empty_missing_and_gzip(tmp_path):
    (tmp_path / "empty.pickle").write_bytes(b"")
    with pytest.raises(InputError, match="empty"):
        load_snapshot(tmp_path / "empty.pickle")
    with pytest.raises(InputError, match="no such file"):
        load_snapshot(tmp_path / "missing.pickle")
    (tmp_path / "z.pickle").write_bytes(b"\x1f\x8b\x08\x00rest")
    with pytest.raises(InputError, match="gzip"):
        load_snapshot(tmp_path / "z.pickle")


@pytest.mark.parametrize("cut", [1, 10, 100, 0.5])
def test_truncated(tmp_path, cut):
    data = pickle.dumps(small_snapshot())
    keep = int(len(data) * cut) if isinstance(cut, float) else len(data) - cut
    path = tmp_path / "cut.pickle"
    path.write_bytes(data[:keep])
    with pytest.raises(InputError, match="truncated|not a PyTorch"):
        load_snapshot(path)


@pytest.mark.parametrize("mutate, message", [
    (lambda s: [1, 2, 3], r"segments\[0\]: expected a dict"),
    (lambda s: {"device_traces": []}, "no 'segments' key"),
    (lambda s: "a string", "expected a dict"),
    (lambda s: {**s, "device_traces": {"0": []}}, "device_traces: expected a list"),
    (lambda s: {**s, "segments": [{**s["segments"][0], "blocks": [{"size": "2MB", "state": "inactive"}]}]},
     r"blocks\[0\]\.size: expected an integer, found str"),
    (lambda s: {**s, "segments": [{**s["segments"][0], "blocks": [{"size": -5, "state": "inactive"}]}]},
     "negative"),
    (lambda s: {**s, "segments": [{**s["segments"][0], "blocks": [{"size": 5, "state": "free"}]}]},
     "is not one of"),
    (lambda s: {**s, "device_traces": [[{"action": "rm -rf", "addr": 0, "size": 0}]]}, "not an allocator action"),
    (lambda s: {**s, "device_traces": [[{"action": "alloc", "addr": 0, "size": 1, "frames": [{"line": "x"}]}]]},
     r"frames\[0\]\.line: expected an integer"),
])
def test_wrong_shape_names_the_place(tmp_path, mutate, message):
    path = write(tmp_path, mutate(small_snapshot()))
    with pytest.raises(InputError, match=message):
        load_snapshot(path)


def test_limits_stop_reference_bombs(tmp_path, monkeypatch):
    """A pickle can repeat one big list by reference; limits count entries, not bytes of file."""
    monkeypatch.setattr(memsnap, "MAX_TRACE_ENTRIES", 1000)
    entries = [{"action": "snapshot", "addr": 0, "size": 0}] * 100
    snap = {"segments": [], "device_traces": [entries] * 11}
    with pytest.raises(InputError, match="more than 1,000 history entries"):
        load_snapshot(write(tmp_path, snap))
    monkeypatch.setattr(memsnap, "MAX_FILE_BYTES", 100)
    with pytest.raises(InputError, match="more than the 100 a memory snapshot may have"):
        load_snapshot(write(tmp_path, small_snapshot()))


def test_deep_stacks_are_cut_and_shared_stacks_converted_once(tmp_path):
    deep = _frames(*[f"f{i}" for i in range(memsnap.MAX_FRAMES + 50)])
    snap = small_snapshot()
    snap["device_traces"][0] = [{"action": "snapshot", "addr": 0, "size": 0, "frames": deep}] * 3
    loaded = load_snapshot(write(tmp_path, snap))
    stacks = [e.frames for e in loaded.device_traces[0]]
    assert len(stacks[0]) == memsnap.MAX_FRAMES and stacks[0] is stacks[1] is stacks[2]
    assert any("cut" in w for w in loaded.warnings)


# --------------------------------------------------------------------------------------------
# Formats that load


def test_current_format_round_trip(tmp_path):
    snap = load_snapshot(write(tmp_path, small_snapshot()))
    assert snap.devices == [0] and snap.has_history
    seg = snap.segments[0]
    assert (seg.total_size, seg.pool_id, seg.segment_type, seg.is_expandable) == (8 * MB, (0, 0), "large", False)
    assert [b.state for b in seg.blocks] == ["active_allocated", "inactive"]
    assert seg.blocks[0].frames[0] == memsnap.Frame("/code/weights.py", 1, "weights")
    assert [e.action for e in snap.device_traces[0]] == ["segment_alloc", "alloc"]
    assert snap.device_traces[0][1].time_us == 11
    assert snap.allocator_settings["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"


def test_old_formats(tmp_path):
    """PyTorch <= 2.0 blocks carry ``history``; torch.cuda.memory_snapshot() is a bare list of segments;
    profiler-converted blocks have no address; old traces have no time_us; OOM entries carry device_free."""
    base = 4096
    seg = {"device": 1, "address": base, "total_size": 3 * MB, "stream": 7, "blocks": [
        {"size": MB, "state": "active_allocated",
         "history": [{"addr": base, "real_size": MB - 8, "frames": _frames("old")}]},
        {"size": 2 * MB, "state": "active_awaiting_free"},
    ]}
    bare = load_snapshot(write(tmp_path, [seg], "bare.pickle"))
    assert not bare.has_history and bare.device_traces == {} and bare.devices == [1]
    b0, b1 = bare.segments[0].blocks
    assert (b0.address, b0.requested_size, b0.frames[0].name) == (base, MB - 8, "old")
    assert (b1.address, b1.state) == (base + MB, "active_pending_free")  # address from the sizes before it
    old = {"segments": [seg], "device_traces": [[], [{"action": "oom", "device_free": 123, "size": 5 * MB,
                                                      "stream": 0}]]}
    loaded = load_snapshot(write(tmp_path, old, "old.pickle"))
    (oom,) = loaded.device_traces[1]
    assert (oom.action, oom.addr, oom.size, oom.time_us) == ("oom", 123, 5 * MB, None)


def test_real_torch_profiler_snapshot_loads():
    """Made by real PyTorch (tests/data/make_torch_snapshot.py): torch's own snapshot converter."""
    snap = load_snapshot(Path(__file__).parent / "data" / "torch_profiler_snapshot.pickle")
    assert snap.has_history and snap.devices == [0]
    actions = {e.action for e in snap.device_traces[0]}
    assert actions <= {"alloc", "free_requested", "free_completed"} and "alloc" in actions
    assert all(b.address >= snap.segments[0].address for b in snap.segments[0].blocks)


def test_rank_from_name():
    assert rank_from_name(Path("memory/rank3.pickle")) == 3
    assert rank_from_name(Path("memory_snapshot-rank12.pickle")) == 12  # NeMo
    assert rank_from_name(Path("snapshot_5.pickle")) == 5  # Megatron-LM / Bridge
    assert rank_from_name(Path("snapshot_oom_rank-2.pickle")) == 2
    assert rank_from_name(Path("snapshot.pickle")) is None


# --------------------------------------------------------------------------------------------
# Through the CLI: one line on stderr, exit 2, nothing run


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "perfdoctor", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("kind", ["hostile", "text", "truncated", "shape", "missing"])
def test_cli_bad_snapshot(tmp_path, kind):
    marker = tmp_path / "pwned"
    path = tmp_path / "rank0.pickle"
    if kind == "hostile":
        path.write_bytes(pickle.dumps({"segments": [_OsSystem(marker)]}))
    elif kind == "text":
        path.write_text("segments: []\n")
    elif kind == "truncated":
        path.write_bytes(pickle.dumps(small_snapshot())[:-40])
    elif kind == "shape":
        path.write_bytes(pickle.dumps({"segments": {"not": "a list"}}))
    for args in (["memory", str(path)], ["analyze", str(REAL_H100), str(path)]):
        result = _cli(*args)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("perfdoctor: ") and result.stderr.count("\n") == 1, result.stderr
        assert "Traceback" not in result.stderr
    assert not marker.exists()


@pytest.mark.parametrize("payload", [_OsSystem, _Eval])
def test_control_the_payloads_do_run_under_plain_pickle(tmp_path, payload):
    """The hostile pickles above are real: the standard unpickler runs them."""
    marker = tmp_path / "pwned"
    pickle.loads(pickle.dumps(payload(marker)))
    assert marker.exists()


def test_deeply_nested_pickle_is_a_shape_error_not_a_crash(tmp_path):
    """A million nested lists, written opcode by opcode: no recursion limit hit, no crash on free."""
    depth = 1_000_000
    data = b"\x80\x04}" + b"\x8c\x08segments" + b"]" * depth + b"a" * (depth - 1) + b"s."
    path = tmp_path / "deep.pickle"
    path.write_bytes(data)
    with pytest.raises(InputError, match=r"segments\[0\]: expected a dict, found list"):
        load_snapshot(path)


def test_frames_with_unhashable_fields_are_a_shape_error(tmp_path):
    snap = small_snapshot()
    snap["device_traces"][0][1]["frames"] = [{"filename": ["a"], "line": 1, "name": "f"}]
    with pytest.raises(InputError, match=r"filename: expected a string, found list"):
        load_snapshot(write(tmp_path, snap))


# --------------------------------------------------------------------------------------------
# Columns and budgets


def test_history_columns_and_interned_stacks(tmp_path):
    snap = small_snapshot()
    trace = snap["device_traces"][0]
    trace += [{"action": "alloc", "addr": (1 << 64) - 1, "size": MB, "stream": -5, "time_us": 12,
               "frames": _frames("weights", "train")},  # the same stack as event 1, other dict objects
              {"action": "oom", "device_free": 7 * MB, "size": 9 * MB, "stream": 0, "time_us": 13}]
    loaded = load_snapshot(write(tmp_path, snap)).device_traces[0]
    assert loaded.addr.dtype == np.uint64 and int(loaded.addr[2]) == (1 << 64) - 1
    assert loaded.stream[2] == -5 and loaded.time_us.tolist() == [10, 11, 12, 13]
    assert loaded.stack[1] == loaded.stack[2] != 0 and loaded[1].frames is loaded[2].frames
    assert loaded[3] == memsnap.TraceEntry("oom", 7 * MB, 9 * MB, 0, 13, ())
    assert loaded.count("alloc") == 2 and loaded.count("oom", "segment_alloc") == 2


@pytest.mark.parametrize("field, value, message", [
    ("addr", True, "addr: expected an integer, found bool"),
    ("size", 1 << 63, "does not fit in 63 bits"),
    ("size", -1, "size: negative"),
    ("addr", 1 << 70, "does not fit in 64 bits"),
    ("stream", "0", "stream: expected an integer, found str"),
    ("action", ("alloc",), "action: a tuple is not an allocator action"),
])
def test_bad_history_fields_name_the_event(tmp_path, field, value, message):
    snap = small_snapshot()
    snap["device_traces"][0][1][field] = value
    with pytest.raises(InputError, match=re.escape(message)) as err:
        load_snapshot(write(tmp_path, snap))
    assert "device_traces[0][1]" in str(err.value)


def test_over_budget_is_one_line(tmp_path, monkeypatch):
    """The budgets are enforced by the kernel on the reader child: memory (RLIMIT_AS) and CPU time."""
    memo = tmp_path / "memo.pickle"  # LONG_BINPUT 2**32 - 1: a memo of four billion entries, whatever the heap has free
    memo.write_bytes(b"\x80\x04Nr\xff\xff\xff\xff.")
    with pytest.raises(InputError, match="memory budget"):
        load_snapshot(memo)
    monkeypatch.undo()
    bomb = tmp_path / "bomb.pickle"  # a dict keyed by a 2**40-element shared tuple: hashing never ends
    bomb.write_bytes(b"\x80\x02})" + b"".join(b"q" + bytes([i]) + b"h" + bytes([i]) + b"\x86" for i in range(40))
                     + b"Ns.")
    monkeypatch.setattr(memsnap, "BUDGET_BASE_S", 1.0)
    with pytest.raises(InputError, match="CPU budget|time budget"):  # CPU limit, or wall clock on a busy machine
        load_snapshot(bomb)
