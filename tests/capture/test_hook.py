"""The per-rank hook: labels in DESIGN §4 format, step logic, group names, memory snapshots, sitecustomize."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from perfdoctor.capture import snapshot
from perfdoctor.capture.hook import runtime
from perfdoctor.capture.hook.groups import from_description
from perfdoctor.capture.launcher import HOOK_PATH
from perfdoctor.load.labels import parse_label

HERE = Path(__file__).resolve().parent
HEAVY = ("pandas", "numpy", "pyarrow", "connectorx", "plotly", "torch")


class Recorder(runtime.Emitter):
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def start(self, message):
        self.events.append(("start", message))
        return message

    def end(self, handle):
        self.events.append(("end", handle))

    def mark(self, message):
        self.events.append(("mark", message))


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder()
    monkeypatch.setattr(runtime, "make_emitter", lambda warn: rec)
    return rec


def test_megatron_group_descriptions() -> None:
    assert from_description("TENSOR_MODEL_PARALLEL_GROUP") == "tp"
    assert from_description("DATA_PARALLEL_GROUP_WITH_CP_GLOO") == "dp"
    assert from_description("INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP") == "dp"
    assert from_description("TENSOR_AND_CONTEXT_PARALLEL_GROUP") == "tp"
    assert from_description("EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP") == "ep"
    assert from_description("EXPERT_DATA_PARALLEL_GROUP_AG") == "edp"
    assert from_description("HIERARCHICAL_CONTEXT_PARALLEL_GROUP_L1") == "cp"
    assert from_description("POSITION_EMBEDDING_GROUP") == "embd"
    assert from_description("undefined") is None and from_description("my_group") is None


def test_steps_follow_the_last_optimizer_of_each_iteration(tmp_path: Path, recorder: Recorder) -> None:
    """Two optimizers per iteration (Megatron's chained optimizer): iteration k ends with the second."""
    hook = runtime.Hook({runtime.ENV_RUN_DIR: str(tmp_path), runtime.ENV_STEPS: "2-3"})
    first, second = object(), object()
    for k in range(6):
        for opt in (first, second):
            recorder.events.append(("optimizer", k, "first" if opt is first else "second"))
            hook.on_optimizer_step(opt, (), {})
    events = recorder.events
    assert [e for e in events if e[0] == "start"] == [("start", "step n=2"), ("start", "step n=3")]
    opened = events.index(("start", "step n=2"))
    assert events[opened - 2] == ("optimizer", 1, "second")  # step 2 opens when iteration 1 is done
    closed = events.index(("end", "step n=2"))
    assert events[closed - 1] == ("optimizer", 2, "second")
    marks = [e[1] for e in events if e[0] == "mark"]
    assert marks[0] == "rank r=0 local=0 world=1" and marks[1].startswith("config {")
    assert events.index(("mark", marks[0])) < opened  # inside the window: after the profiler would start
    assert not any(e == ("start", "step n=4") for e in events) and hook._window_done
    record = json.loads((tmp_path / "ranks" / "rank0.json").read_text())
    assert record["steps_done"] == 4 and record["window"] == [2, 3]


def test_labels_round_trip_through_the_reader(tmp_path: Path) -> None:
    hook = runtime.Hook({runtime.ENV_RUN_DIR: str(tmp_path)})
    hook.torch = type("T", (), {"distributed": None})
    kind, fields = parse_label(hook._label("reduce_scatter", None, 4096))
    assert kind == "comm" and fields == {"op": "reduce_scatter", "group": "dp", "bytes": "4096", "size": "-1"}


def test_hook_in_a_real_torch_process(tmp_path: Path) -> None:
    """gloo with one rank, fake Megatron modules: every label the hook makes, in order."""
    pytest.importorskip("torch")
    env = {**os.environ, runtime.ENV_RUN_DIR: str(tmp_path), runtime.ENV_STEPS: "1-3",
           "PYTHONPATH": str(HERE.parents[1])}
    proc = subprocess.run([sys.executable, str(HERE / "hook_program.py"), str(HERE / "fake_megatron")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["rank_file"]
    events = out["events"]
    labels = [e[1] for e in events if e[0] in ("start", "push")]
    starts = [events.index(["test", f"iteration {k}"]) for k in range(5)] + [len(events)]
    per_iteration = [[e[1] for e in events[a:b] if e[0] in ("start", "push") and not e[1].startswith("step")]
                     for a, b in zip(starts, starts[1:])]
    # Outside the window 1-3 nothing is labelled; the collection after optimizer step 0 is already in step 1.
    assert per_iteration[0] == ["gc gen=2"] and per_iteration[4] == []
    assert all(len(per_iteration[k]) >= 7 for k in (1, 2, 3))
    assert [x for x in labels if x.startswith("step")] == ["step n=1", "step n=2", "step n=3"]
    assert labels.count("comm op=all_reduce group=other bytes=64 size=1") == 3  # world group, Megatron present
    assert labels.count("comm op=all_gather group=tp bytes=32 size=1") == 3  # group_desc
    assert labels.count("comm op=broadcast group=pp bytes=8 size=1") == 3  # Megatron getter identity
    assert labels.count("comm op=all_reduce group=tp bytes=12 size=1") == 6  # the op, and the coalesced exit
    assert labels.count("fwd mb=0") == 3 and labels.count("bwd mb=0") == 3
    assert sum(x.startswith("gc gen=") for x in labels) >= 3
    marks = [e[1] for e in events if e[0] == "mark"]
    assert marks[0] == "rank r=0 local=0 world=1"
    config = json.loads(marks[1].partition(" ")[2])
    assert config == {"tp": 1, "pp": 1, "dp": 1}
    for text in labels:
        kind, fields = parse_label(text)
        assert kind in ("step", "comm", "fwd", "bwd", "gc") and all(v and " " not in v for v in fields.values())


FAKE_STATE = {
    "segments": [{"device": 0, "address": 1 << 20, "total_size": 2 << 20, "allocated_size": 1 << 20,
                  "active_size": 1 << 20, "requested_size": 1000, "stream": 0, "segment_type": "large",
                  "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
                  "blocks": [{"address": 1 << 20, "size": 1 << 20, "requested_size": 1000, "state": "active_allocated",
                              "frames": [{"filename": "train.py", "line": 3, "name": "step"}]},
                             {"address": 2 << 20, "size": 1 << 20, "requested_size": 0, "state": "inactive",
                              "frames": []}]}],
    "device_traces": [[{"action": "alloc", "addr": 1 << 20, "size": 1 << 20, "stream": 0, "time_us": 5,
                        "frames": [{"filename": "train.py", "line": 3, "name": "step"}]}]],
}


def test_memory_history_with_a_fake_allocator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             recorder: Recorder) -> None:
    torch = pytest.importorskip("torch")
    calls: list[dict] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _d=None: "Fake GPU")
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda **kw: calls.append(kw))
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda *a, **k: FAKE_STATE)
    hook = runtime.Hook({runtime.ENV_RUN_DIR: str(tmp_path), runtime.ENV_STEPS: "0-1",
                         runtime.ENV_MAX_ENTRIES: "5000"})
    hook.torch = torch
    hook.activate("set_device")
    assert calls == [{"enabled": "all", "context": "all", "stacks": "python", "max_entries": 5000}]
    for _ in range(3):
        hook.on_optimizer_step(hook, (), {})
    path = tmp_path / "memory" / "rank0.pickle"
    assert pickle.loads(path.read_bytes()) == FAKE_STATE
    assert calls[-1] == {"enabled": None} and hook.memory["status"] == "dumped" and hook.memory["at_step"] == 2
    from perfdoctor.load.memsnap import load_snapshot

    loaded = load_snapshot(path)
    assert loaded.segments[0].blocks[0].frames[0].filename == "train.py" and len(loaded.device_traces[0]) == 1
    assert not list(path.parent.glob(".*partial"))


def test_no_cuda_means_no_memory_history_and_a_reason(tmp_path: Path, recorder: Recorder) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    hook = runtime.Hook({runtime.ENV_RUN_DIR: str(tmp_path)})
    hook.torch = torch
    hook.activate("init_process_group")
    hook.finish()
    record = json.loads((tmp_path / "ranks" / "rank0.json").read_text())
    assert record["memory"] == {"status": "skipped", "reason": "no CUDA device (torch.cuda.is_available() is False)"}
    assert snapshot.unavailable_reason(torch) == record["memory"]["reason"]


def _site_run(tmp_path: Path, other_site: str, **env: str) -> subprocess.CompletedProcess:
    other = tmp_path / "other"
    other.mkdir(exist_ok=True)
    (other / "sitecustomize.py").write_text(other_site)
    code = "import sys; print('perfdoctor.capture.hook.runtime' in sys.modules, 'torch' in sys.modules)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("PERFDOCTOR_")},
                               "PYTHONPATH": f"{HOOK_PATH}{os.pathsep}{other}", **env})


def test_sitecustomize_chains_and_is_a_no_op_without_the_launcher(tmp_path: Path) -> None:
    proc = _site_run(tmp_path, "print('their sitecustomize ran')")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["their sitecustomize ran", "False False"]
    proc = _site_run(tmp_path, "print('their sitecustomize ran')", PERFDOCTOR_RUN_DIR=str(tmp_path / "run"))
    assert proc.stdout.splitlines() == ["their sitecustomize ran", "True False"]  # armed, torch not imported


def test_a_broken_sitecustomize_or_hook_never_stops_the_program(tmp_path: Path) -> None:
    proc = _site_run(tmp_path, "raise RuntimeError('boom')", PERFDOCTOR_RUN_DIR=str(tmp_path / "run"))
    assert proc.returncode == 0
    assert proc.stdout.strip() == "True False"
    assert "perfdoctor capture hook: _chain_shadowed failed (RuntimeError: boom)" in proc.stderr


def test_capture_modules_import_without_heavy_libraries() -> None:
    code = ("import sys, perfdoctor.capture.launcher, perfdoctor.capture.hook.runtime, perfdoctor.capture.manifest\n"
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
