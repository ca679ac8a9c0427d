"""Memory metrics against ground truth: a small caching-allocator simulator writes snapshots whose
history is cut like PyTorch's ring buffer, and knows what every number must be."""

from __future__ import annotations

import copy
import json
import pickle
import random
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from perfdoctor.load.memsnap import Frame, load_snapshot
from perfdoctor.measure.memory import BEFORE_HISTORY, MEMORY_KEYS, allocation_site, measure_memory

MB = 1 << 20
SEGMENT = 2 * MB
DATA = Path(__file__).parent / "data"
SITES = ("attention_scores", "mlp_activation", "grad_buffer", "optimizer_state", "workspace")


def site_frames(site: str) -> list[dict]:
    """A stack as PyTorch records it: innermost first, PyTorch's own frames before the caller's."""
    return [{"filename": "/usr/lib/python3/site-packages/torch/nn/functional.py", "line": 2100, "name": "linear"},
            {"filename": f"/megatron/core/{site}.py", "line": 40 + SITES.index(site), "name": site},
            {"filename": "/megatron/training.py", "line": 900, "name": "train_step"}]


@dataclass
class Allocation:
    size: int
    site: str
    alloc_event: int
    free_event: int | None = None  # the free_completed event


@dataclass
class SimAllocator:
    """First-fit caching allocator: segments of whole 2 MiB units split into blocks; frees may be
    stream-deferred (``free_requested`` now, ``free_completed`` later); ``empty_cache`` returns fully
    free segments; an allocation that fits nowhere even after emptying the cache records an ``oom``."""

    capacity: int
    segments: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    points: list[tuple[int, int]] = field(default_factory=lambda: [(0, 0)])  # (allocated, reserved)
    allocations: dict[int, Allocation] = field(default_factory=dict)  # live, by address
    done: list[Allocation] = field(default_factory=list)
    allocated: int = 0
    reserved: int = 0
    next_address: int = 1 << 40

    def _emit(self, action: str, addr: int, size: int, frames: list | None = None) -> int:
        self.events.append({"action": action, "addr": addr, "size": size, "stream": 0,
                            "time_us": 1000 + 7 * len(self.events), "frames": frames or []})
        self.points.append((self.allocated, self.reserved))
        return len(self.events) - 1

    def alloc(self, size: int, site: str) -> int | None:
        size = -(-size // 512) * 512
        found = self._first_fit(size)
        if found is None:
            seg_size = -(-size // SEGMENT) * SEGMENT
            if self.reserved + seg_size > self.capacity:
                self.empty_cache()
            if self.reserved + seg_size > self.capacity:
                self._emit("oom", self.capacity - self.reserved, size)
                return None
            seg = {"address": self.next_address, "size": seg_size, "blocks": [[self.next_address, seg_size,
                                                                              "inactive", None]]}
            self.next_address += seg_size + SEGMENT
            self.segments.append(seg)
            self.reserved += seg_size
            self._emit("segment_alloc", seg["address"], seg_size)
            found = (seg, 0)
        seg, i = found
        addr, bsize, _, _ = seg["blocks"][i]
        seg["blocks"][i] = [addr, size, "active_allocated", site]
        if bsize > size:
            seg["blocks"].insert(i + 1, [addr + size, bsize - size, "inactive", None])
        self.allocated += size
        event = self._emit("alloc", addr, size, site_frames(site))
        self.allocations[addr] = Allocation(size, site, event)
        return addr

    def free(self, addr: int, deferred: bool = False) -> None:
        block = self._block(addr)
        self._emit("free_requested", addr, block[1])
        block[2] = "active_pending_free"
        if not deferred:
            self.complete(addr)

    def complete(self, addr: int) -> None:
        block = self._block(addr)
        block[2], block[3] = "inactive", None
        self.allocated -= block[1]
        a = self.allocations.pop(addr)
        a.free_event = self._emit("free_completed", addr, block[1])
        self.done.append(a)
        for seg in self.segments:  # merge neighbouring free blocks
            merged: list[list] = []
            for b in seg["blocks"]:
                if merged and merged[-1][2] == b[2] == "inactive":
                    merged[-1][1] += b[1]
                else:
                    merged.append(b)
            seg["blocks"] = merged

    def empty_cache(self) -> None:
        for seg in [s for s in self.segments if all(b[2] == "inactive" for b in s["blocks"])]:
            self.segments.remove(seg)
            self.reserved -= seg["size"]
            self._emit("segment_free", seg["address"], seg["size"])

    def _first_fit(self, size: int) -> tuple[dict, int] | None:
        for seg in self.segments:
            for i, b in enumerate(seg["blocks"]):
                if b[2] == "inactive" and b[1] >= size:
                    return seg, i
        return None

    def _block(self, addr: int) -> list:
        return next(b for s in self.segments for b in s["blocks"] if b[0] == addr)

    def snapshot(self, keep: int) -> dict:
        """The dump: final segments, and only the newest ``keep`` history entries (the ring buffer)."""
        segments = [{
            "device": 0, "address": s["address"], "total_size": s["size"], "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "is_expandable": False,
            "allocated_size": sum(b[1] for b in s["blocks"] if b[2] == "active_allocated"),
            "blocks": [{"address": a, "size": n, "requested_size": n if st != "inactive" else 0, "state": st,
                        "frames": site_frames(site) if site else []} for a, n, st, site in s["blocks"]],
        } for s in self.segments]
        return {"segments": segments, "device_traces": [self.events[len(self.events) - keep:]],
                "allocator_settings": {"expandable_segments": False, "PYTORCH_CUDA_ALLOC_CONF": ""}}


def simulate(seed: int) -> SimAllocator:
    """Weights and optimizer state once, then training steps whose activations pile up and drain."""
    rng = random.Random(seed)
    sim = SimAllocator(capacity=rng.choice([256, 384, 1024]) * MB)
    for _ in range(6):
        sim.alloc(rng.randint(1, 12) * MB + rng.randint(0, 4000), rng.choice(("grad_buffer", "optimizer_state")))
    for _step in range(rng.randint(4, 9)):
        stack = []
        for _ in range(rng.randint(5, 30)):
            addr = sim.alloc(rng.randint(1, 40) * MB // rng.choice((1, 4, 16)) + rng.randint(0, 9999),
                             rng.choice(("attention_scores", "mlp_activation", "workspace")))
            if addr is not None:
                stack.append(addr)
            if stack and rng.random() < 0.25:  # a temporary freed early, out of order
                sim.free(stack.pop(rng.randrange(len(stack))))
        pending = []
        while stack:
            addr = stack.pop()
            deferred = rng.random() < 0.2  # used on another stream: freed later
            sim.free(addr, deferred)
            if deferred:
                pending.append(addr)
            if pending and rng.random() < 0.5:
                sim.complete(pending.pop(0))
        if rng.random() < 0.7:
            for addr in pending:
                sim.complete(addr)
        if rng.random() < 0.3:
            sim.empty_cache()
    return sim


def truth(sim: SimAllocator, keep: int) -> dict:
    """What the metrics must be over the window the ring buffer kept, from the simulator's own books."""
    first = len(sim.events) - keep  # window = points first..n (point k is after event k - 1)
    alloc = np.array([p[0] for p in sim.points[first:]])
    reserved = np.array([p[1] for p in sim.points[first:]])
    peak_r = reserved.max()
    peak_point = first + int(np.argmax(alloc))
    by_site: dict[str, int] = defaultdict(int)
    for a in [*sim.done, *sim.allocations.values()]:
        end = a.free_event + 1 if a.free_event is not None else len(sim.points)
        if a.alloc_event + 1 <= peak_point < end:
            known = a.alloc_event >= first or a.free_event is None
            by_site[f"/megatron/core/{a.site}.py" if known else BEFORE_HISTORY] += a.size
    window = sim.events[first:]
    free_blocks = [b[1] for s in sim.segments for b in s["blocks"] if b[2] == "inactive"]
    return {
        "memory.peak_allocated_bytes": alloc.max(),
        "memory.peak_reserved_bytes": peak_r,
        "memory.fragmentation_fraction": (peak_r - alloc[reserved == peak_r].max()) / peak_r,
        "memory.oom_count": sum(e["action"] == "oom" for e in window),
        "memory.segment_allocs": sum(e["action"] == "segment_alloc" for e in window),
        "memory.largest_free_block_bytes": max(free_blocks, default=0),
        "sites": dict(by_site),
    }


def dump(tmp_path: Path, snap: object, name: str = "rank0.pickle") -> Path:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(snap))
    return path


@pytest.mark.parametrize("seed", range(12))
def test_simulated_allocator_with_cut_history(tmp_path, seed):
    sim = simulate(seed)
    n = len(sim.events)
    for keep in sorted({n, n * 2 // 3, n // 3, 1}):
        m = measure_memory(load_snapshot(dump(tmp_path, sim.snapshot(keep))), device_total_bytes=sim.capacity)
        want = truth(sim, keep)
        for key in MEMORY_KEYS:
            if key in want:
                assert m.metrics[key] == pytest.approx(want[key]), (seed, keep, key)
        assert m.metrics["memory.headroom_fraction"] == pytest.approx(1 - want["memory.peak_reserved_bytes"]
                                                                      / sim.capacity)
        got_sites = {s["file"]: s["bytes"] for s in m.evidence["top_sites"]}
        assert got_sites == want["sites"], (seed, keep)
        assert not m.warnings
        assert m.evidence["history_events"] == keep


def test_some_seeds_hit_oom_and_empty_cache():
    """The simulated workloads do exercise the OOM and segment-free paths the checks above cover."""
    events = [e["action"] for seed in range(12) for e in simulate(seed).events]
    assert "oom" in events and "segment_free" in events and "free_requested" in events


def test_hand_computed_example(tmp_path):
    """segment 20 MiB; alloc 4 MiB; alloc 10 MiB; free it on another stream (requested, then completed)."""
    base = 0x1000000
    frames = site_frames("workspace")
    snap = {
        "segments": [{"device": 0, "address": base, "total_size": 20 * MB, "stream": 0, "blocks": [
            {"address": base, "size": 4 * MB, "requested_size": 4 * MB, "state": "active_allocated",
             "frames": frames},
            {"address": base + 4 * MB, "size": 16 * MB, "requested_size": 0, "state": "inactive"}]}],
        "device_traces": [[
            {"action": "segment_alloc", "addr": base, "size": 20 * MB, "time_us": 100},
            {"action": "alloc", "addr": base, "size": 4 * MB, "time_us": 101, "frames": frames},
            {"action": "alloc", "addr": base + 4 * MB, "size": 10 * MB, "time_us": 102, "frames": frames},
            {"action": "free_requested", "addr": base + 4 * MB, "size": 10 * MB, "time_us": 103},
            {"action": "free_completed", "addr": base + 4 * MB, "size": 10 * MB, "time_us": 104}]],
    }
    m = measure_memory(load_snapshot(dump(tmp_path, snap)), device_total_bytes=80 * (1 << 30))
    assert m.metrics["memory.peak_allocated_bytes"] == 14 * MB
    assert m.metrics["memory.peak_reserved_bytes"] == 20 * MB
    assert m.metrics["memory.fragmentation_fraction"] == pytest.approx(6 / 20)
    assert m.metrics["memory.headroom_fraction"] == pytest.approx(1 - 20 / (80 * 1024))
    assert m.metrics["memory.largest_free_block_bytes"] == 16 * MB
    assert (m.metrics["memory.oom_count"], m.metrics["memory.segment_allocs"]) == (0, 1)
    ev = m.evidence
    assert (ev["peak_allocated_at_us"], ev["peak_reserved_at_us"]) == (102, 100)
    assert ev["series"] == {"t_us": [100, 100, 101, 102, 103, 104],
                            "allocated": [0, 0, 4 * MB, 14 * MB, 14 * MB, 4 * MB],
                            "reserved": [0, 20 * MB, 20 * MB, 20 * MB, 20 * MB, 20 * MB]}
    assert ev["top_sites"] == [{"file": "/megatron/core/workspace.py", "line": 44, "function": "workspace",
                                "bytes": 14 * MB, "count": 2}]
    assert ev["expandable_segments"] is None and ev["alloc_conf"] is None


@pytest.mark.parametrize("history", [None, [], [{"action": "snapshot", "addr": 0, "size": 11 * MB}]])
def test_no_history_is_dump_time_state_only(tmp_path, history):
    """Without allocation events nothing is a peak: peaks and counts are null, the dump-time state is
    evidence, and the warning says so (a bare list, recording off, or a lone ``snapshot`` marker)."""
    seg = {"device": 0, "address": 0, "total_size": 6 * MB, "blocks": [
        {"size": 2 * MB, "state": "active_allocated", "frames": [{"filename": "w.py", "line": 3, "name": "w"}]},
        {"size": MB, "state": "active_pending_free"}, {"size": 3 * MB, "state": "inactive"}]}
    raw = [seg] if history is None else {"segments": [seg], "device_traces": [history]}
    m = measure_memory(load_snapshot(dump(tmp_path, raw, "snapshot_oom_rank-0.pickle")), device_total_bytes=80 * MB)
    for key in ("memory.peak_allocated_bytes", "memory.peak_reserved_bytes", "memory.fragmentation_fraction",
                "memory.headroom_fraction", "memory.oom_count", "memory.segment_allocs"):
        assert m.metrics[key] is None, key
    assert m.metrics["memory.largest_free_block_bytes"] == 3 * MB  # a dump-time quantity by definition
    ev = m.evidence
    assert ev["state"] == "dump-time state only" and not ev["has_history"]
    assert ev["allocated_at_dump_bytes"] == 3 * MB and ev["reserved_at_dump_bytes"] == 6 * MB  # pending-free counts
    assert ev["top_sites_at"] == "dump time" and ev["top_sites"][0]["file"] == "w.py"
    assert any("dump-time state only" in w and "does not hold the OOM" in w for w in m.warnings)


def test_series_is_downsampled_without_losing_the_peak(tmp_path):
    events = []
    for i in range(3000):
        size = MB * (7 if i == 1234 else 1)
        events += [{"action": "alloc", "addr": i, "size": size, "time_us": 2 * i},
                   {"action": "free_completed", "addr": i, "size": size, "time_us": 2 * i + 1}]
    m = measure_memory(load_snapshot(dump(tmp_path, {"segments": [], "device_traces": [events]})))
    series = m.evidence["series"]
    assert len(series["t_us"]) == len(series["allocated"]) == len(series["reserved"]) <= 500
    assert max(series["allocated"]) == 7 * MB == m.metrics["memory.peak_allocated_bytes"]
    assert series["t_us"] == sorted(series["t_us"])


def test_inconsistent_history_is_flagged(tmp_path):
    """A free larger than anything the dump-time state can account for: replay goes negative."""
    snap = {"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": MB}]]}
    m = measure_memory(load_snapshot(dump(tmp_path, snap)))
    assert any("does not add up" in w for w in m.warnings)


def test_device_choice_and_empty_snapshot(tmp_path):
    seg = {"address": 0, "total_size": 4 * MB, "blocks": [{"size": 4 * MB, "state": "active_allocated"}]}
    snap = {"segments": [{**seg, "device": 1}, {**seg, "device": 3, "total_size": 8 * MB,
                                                "blocks": [{"size": 8 * MB, "state": "active_allocated"}]}],
            "device_traces": [[], [], [], []]}
    loaded = load_snapshot(dump(tmp_path, snap))
    assert measure_memory(loaded).device == 3  # the device holding the most
    assert measure_memory(loaded, device=1).evidence["reserved_at_dump_bytes"] == 4 * MB
    empty = measure_memory(load_snapshot(dump(tmp_path, {"segments": [], "device_traces": [[]]}, "e.pickle")))
    assert empty.device is None and all(v is None for v in empty.metrics.values()) and empty.warnings


@pytest.mark.parametrize("settings, env, segment_expandable, want", [
    ({"expandable_segments": True}, {}, False, True),
    ({}, {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64,expandable_segments:True"}, False, True),
    ({}, {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"}, False, False),
    ({}, {}, True, True),
    ({}, {}, False, None),
])
def test_expandable_segments(tmp_path, settings, env, segment_expandable, want):
    seg = {"device": 0, "address": 0, "total_size": MB, "is_expandable": segment_expandable,
           "blocks": [{"size": MB, "state": "inactive"}]}
    snap = {"segments": [seg], "device_traces": [[]], "allocator_settings": settings}
    m = measure_memory(load_snapshot(dump(tmp_path, snap)), env=env)
    assert m.evidence["expandable_segments"] is want


def test_allocation_site_skips_torch_and_interpreter_frames():
    torch_frame = Frame("/opt/conda/lib/python3.10/site-packages/torch/nn/modules/linear.py", 125, "forward")
    cpp = Frame("??", 0, "PyEval_EvalFrameDefault")
    user = Frame("/workspace/megatron/core/transformer/mlp.py", 120, "forward")
    assert allocation_site((cpp, torch_frame, user)) == user
    assert allocation_site((cpp, torch_frame)) == torch_frame
    assert allocation_site((Frame("none", 0, "megatron/core/fusions/fused_bias_swiglu.py(51): forward"),)) == \
        Frame("megatron/core/fusions/fused_bias_swiglu.py", 51, "forward")  # profiler-converted frames
    assert allocation_site((cpp,)) is None


def test_real_torch_profiler_snapshot_matches_profiler_truth():
    """Made by real PyTorch on CPU (tests/data/make_torch_snapshot.py); the truth is the profiler's
    own memory timeline, replayed forwards, not perfdoctor's backwards replay."""
    want = json.loads((DATA / "torch_profiler_snapshot.truth.json").read_text())
    m = measure_memory(load_snapshot(DATA / "torch_profiler_snapshot.pickle"))
    assert m.metrics["memory.peak_allocated_bytes"] == want["peak_allocated_bytes"]
    assert m.metrics["memory.peak_reserved_bytes"] == want["reserved_bytes"]
    assert m.evidence["allocated_at_dump_bytes"] == want["allocated_at_dump_bytes"]
    assert m.evidence["top_sites"][0]["function"] == want["largest_allocation_function"]
    assert not m.warnings


# --------------------------------------------------------------------------------------------
# Wired into `perfdoctor analyze` (run directories) and `perfdoctor memory` (snapshots alone)


def _run_dir(tmp_path: Path, snapshots: dict[str, object]) -> Path:
    """A run directory as the capture writes it: the real 2-GPU trace and memory/<name>.pickle."""
    import shutil

    from tests.paths import REAL_H100

    run = tmp_path / "run"
    (run / "memory").mkdir(parents=True)
    shutil.copy(REAL_H100, run / REAL_H100.name)
    for name, snap in snapshots.items():
        dump(run / "memory", snap, name)
    return run


def at_time(snap: dict, t0_us: int) -> dict:
    """The snapshot with its history moved to start at ``t0_us`` (µs since the epoch, as PyTorch records)."""
    snap = copy.deepcopy(snap)  # the simulator's events are shared between its snapshots
    for trace in snap["device_traces"]:
        for e in trace:
            e["time_us"] += t0_us
    return snap


H100_SESSION_US = 1779782330176752  # session start of the real 2-GPU trace (TARGET_INFO_SESSION_START_TIME)
SIM_SESSION_US = 1780000000022947  # and of the simulated sample traces


def test_analyze_attaches_snapshots_by_rank(tmp_path):
    from perfdoctor import api
    from perfdoctor.render.json import report_dict

    sim = simulate(3)
    keep = len(sim.events) // 2
    run = _run_dir(tmp_path, {"rank1.pickle": at_time(sim.snapshot(keep), H100_SESSION_US + 5_000_000),
                              "rank7.pickle": sim.snapshot(keep)})
    report = api.analyze([run])
    want = truth(sim, keep)
    r1, r0 = report.metrics["ranks"]["1"], report.metrics["ranks"]["0"]
    assert r1["memory.peak_allocated_bytes"] == want["memory.peak_allocated_bytes"]
    assert r1["memory.fragmentation_fraction"] == pytest.approx(want["memory.fragmentation_fraction"])
    assert r1["memory.headroom_fraction"] is None  # this scrubbed real trace has no GPU table: total unknown
    assert all(r0[k] is None for k in MEMORY_KEYS)  # rank 0 has no snapshot
    assert report.metrics["all"]["memory.peak_reserved_bytes"] == want["memory.peak_reserved_bytes"]
    dev1 = next(d for d in report.devices if d.rank == 1)
    assert dev1.evidence["memory"]["top_sites"][0]["bytes"] == max(want["sites"].values())
    assert any("rank7.pickle" in w and "no GPU timeline has rank 7" in w for w in report.warnings)
    jsonschema = pytest.importorskip("jsonschema")
    from importlib.resources import files

    schema = json.loads(files("perfdoctor").joinpath("schema/report.schema.json").read_text())
    jsonschema.validate(json.loads(json.dumps(report_dict(report), default=str)), schema)


def _cli(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "perfdoctor", *args], capture_output=True, text=True, timeout=300)


def test_cli_analyze_takes_a_snapshot_given_directly(tmp_path):
    from tests.paths import SAMPLES

    trace = SAMPLES / "exposed_tp" / "exposed_tp.rank0.sqlite"  # simulated H100 80GB: GPU table present
    sim = simulate(5)
    snap = dump(tmp_path, at_time(sim.snapshot(len(sim.events)), SIM_SESSION_US), "snapshot.pickle")  # no rank
    result = _cli("analyze", str(trace), str(snap), "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    metrics = doc["metrics"]["ranks"]["0"]
    want = truth(sim, len(sim.events))
    assert metrics["memory.peak_allocated_bytes"] == want["memory.peak_allocated_bytes"]
    assert metrics["memory.headroom_fraction"] == pytest.approx(1 - want["memory.peak_reserved_bytes"] / (80 << 30))
    assert doc["devices"][0]["evidence"]["memory"]["device_total_bytes"] == 80 << 30
    only = _cli("analyze", str(snap))
    assert only.returncode == 2 and "perfdoctor memory" in only.stderr and "Traceback" not in only.stderr


def test_snapshot_from_another_run_is_refused(tmp_path):
    """A history that ended months before the trace's session began (or began weeks after it ended) is
    not this run's: not attached, said so; one within the session, or shortly after it, is kept."""
    from perfdoctor import api

    sim = simulate(3)
    keep = len(sim.events)
    day_us = 86_400 * 10**6
    run = _run_dir(tmp_path, {"rank0.pickle": at_time(sim.snapshot(keep), H100_SESSION_US - 120 * day_us),
                              "rank1.pickle": at_time(sim.snapshot(keep), H100_SESSION_US + 30 * day_us)})
    report = api.analyze([run])
    for rank, words in (("0", "before the trace's session began"), ("1", "after the trace ends")):
        assert report.metrics["ranks"][rank]["memory.peak_allocated_bytes"] is None
        assert any(f"rank{rank}.pickle: memory snapshot not used" in w and words in w and "another run" in w
                   for w in report.warnings), report.warnings
    later = _run_dir(tmp_path / "later", {"rank1.pickle": at_time(sim.snapshot(keep), H100_SESSION_US + day_us)})
    assert api.analyze([later]).metrics["ranks"]["1"]["memory.peak_allocated_bytes"] is not None


def with_oom(snap: dict, request: int, free: int) -> dict:
    """An OOM event at the end of the history, as PyTorch records it (``device_free`` instead of ``addr``)."""
    snap = copy.deepcopy(snap)
    trace = snap["device_traces"][0]
    trace.append({"action": "oom", "device_free": free, "size": request, "stream": 0,
                  "time_us": trace[-1]["time_us"] + 1, "frames": site_frames(SITES[0])})
    return snap


def test_oom_in_every_rank_is_a_finding(tmp_path):
    """Simulated allocators on both ranks of the real 2-GPU trace run out of memory: one `oom` finding
    for both ranks with the request, the free memory, what the allocator held, and who held it."""
    from perfdoctor import api

    sims = {r: simulate(10 + r) for r in (0, 1)}
    snaps = {f"rank{r}.pickle": with_oom(at_time(sim.snapshot(len(sim.events)), H100_SESSION_US + 1_000_000),
                                         request=(3 + r) * MB, free=MB // 2) for r, sim in sims.items()}
    report = api.analyze([_run_dir(tmp_path, snaps)])
    (oom,) = [f for f in report.findings if f["rule"] == "oom"]
    assert oom["ranks"] == [0, 1] and oom["severity"] == "high"
    rank1 = report.metrics["ranks"]["1"]
    sim = sims[1]
    end = len(sim.points) - 1  # the OOM changes nothing: what was held then is what is held at the end
    held_truth: dict[str, int] = defaultdict(int)
    for a in [*sim.done, *sim.allocations.values()]:
        if a.alloc_event + 1 <= end < (a.free_event + 1 if a.free_event is not None else end + 1):
            held_truth[f"/megatron/core/{a.site}.py"] += a.size
    assert rank1["memory.oom_count"] == 1 and rank1["memory.oom_requested_bytes"] == 4 * MB
    assert rank1["memory.oom_device_free_bytes"] == MB // 2
    ev = next(d for d in report.devices if d.rank == 1).evidence["memory"]
    (event,) = ev["ooms"]
    assert event["allocated_bytes"] == sim.points[-1][0] == rank1["memory.oom_allocated_bytes"]
    assert event["reserved_bytes"] == sim.points[-1][1] == rank1["memory.oom_reserved_bytes"]
    assert {s["file"]: s["bytes"] for s in event["top_sites"]} == dict(held_truth)
    assert ev["oom_holders"] and "GiB in" in ev["oom_holders"][0]
    assert "Largest holders at that moment: /megatron/core/" in oom["summary"]
    knobs = {k["env"] or k["megatron_lm"] for k in oom["knobs"]}
    assert "--recompute-granularity" in knobs and "--use-distributed-optimizer" in knobs


def test_analyze_device_memory_feeds_the_headroom_rules(tmp_path):
    """The real 2-GPU trace has no GPU table: `memory-pressure` needs --device-memory to judge."""
    sim = simulate(3)
    run = _run_dir(tmp_path, {"rank1.pickle": at_time(sim.snapshot(len(sim.events)), H100_SESSION_US + 10**6)})
    peak = truth(sim, len(sim.events))["memory.peak_reserved_bytes"]
    rules = {}
    for gib in (None, peak / 0.95 / 2**30, peak / 0.5 / 2**30):
        args = ["analyze", str(run), "--format", "json"] + (["--device-memory", f"{gib:.6f}"] if gib else [])
        result = _cli(*args)
        assert result.returncode == 0, result.stderr
        doc = json.loads(result.stdout)
        rules[gib] = {f["rule"] for f in doc["findings"]}
        if gib:
            headroom = doc["metrics"]["ranks"]["1"]["memory.headroom_fraction"]
            assert headroom == pytest.approx(1 - peak / (gib * 2**30), abs=1e-4)
    assert "memory-pressure" not in rules[None]
    assert [("memory-pressure" in r) for r in list(rules.values())[1:]] == [True, False]
    bad = _cli("analyze", str(run), "--device-memory", "inf")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--device-memory" in bad.stderr


def test_real_oom_dump_without_the_oom_in_its_history():
    """FlexGen's OPT snapshot dumped after an OOM: its history is one `snapshot` marker. It must say
    dump-time state only and that the OOM is not in its history, with null peaks and OOM count."""
    from tests.paths import TRACES

    path = TRACES / "memory" / "flexgen_opt_oom_snapshot.pickle"
    result = _cli("memory", str(path), "--format", "json")
    assert result.returncode == 0, result.stderr
    (snap,) = json.loads(result.stdout)["snapshots"]
    assert snap["metrics"]["memory.peak_allocated_bytes"] is None and snap["metrics"]["memory.oom_count"] is None
    assert snap["evidence"]["state"] == "dump-time state only"
    assert snap["evidence"]["reserved_at_dump_bytes"] > 10 << 30  # 11 GiB held when it was dumped
    (warning,) = [w for w in json.loads(result.stdout)["warnings"] if "flexgen_opt_oom" in w]
    assert "dump-time state only" in warning and "does not hold the OOM" in warning
    text = _cli("memory", str(path))
    assert "dump-time state only" in text.stdout and "peak allocated" not in text.stdout


def test_real_snapshots_with_history_are_measured():
    """cs336's training-step snapshot (5,163 events with times): peaks measured, no OOM, no dump-only note."""
    from tests.paths import TRACES

    m = measure_memory(load_snapshot(TRACES / "memory" / "cs336_memory_snapshot.pickle"))
    assert m.evidence["state"] == "history" and m.evidence["history_events"] == 5163
    assert m.metrics["memory.oom_count"] == 0 and m.metrics["memory.peak_allocated_bytes"] > 0
    assert not any("dump-time" in w for w in m.warnings)


def test_cli_memory_command(tmp_path):
    sim = simulate(1)
    keep = len(sim.events) * 3 // 4
    run = tmp_path / "run"
    (run / "memory").mkdir(parents=True)
    dump(run / "memory", sim.snapshot(keep), "rank2.pickle")
    dump(run / "memory", sim.snapshot(len(sim.events)), "rank0.pickle")
    result = _cli("memory", str(run), "--format", "json", "--device-memory", "80")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [s["rank"] for s in doc["snapshots"]] == [0, 2]
    want = truth(sim, keep)
    got = doc["snapshots"][1]["metrics"]
    assert got["memory.peak_allocated_bytes"] == want["memory.peak_allocated_bytes"]
    assert got["memory.headroom_fraction"] == pytest.approx(1 - want["memory.peak_reserved_bytes"] / (80 << 30))
    assert len(doc["snapshots"][1]["evidence"]["series"]["allocated"]) <= 500
    text = _cli("memory", str(run / "memory" / "rank2.pickle"))
    assert text.returncode == 0, text.stderr
    assert "peak allocated" in text.stdout and "/megatron/core/" in text.stdout
    for bad in (["memory", str(tmp_path / "nope.pickle")], ["memory", str(run), "--device-memory", "-1"],
                ["memory", str(tmp_path / "empty_dir")]):
        (tmp_path / "empty_dir").mkdir(exist_ok=True)
        result = _cli(*bad)
        assert result.returncode == 2 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_site_names_are_not_markup(tmp_path):
    """Function names come from the snapshot: rich must print them, not interpret them."""
    from rich.console import Console

    from perfdoctor.render.memory import render_memory_terminal

    frames = [{"filename": "/x/[bold red]evil[/].py", "line": 1, "name": "[link=file:///etc/passwd]f[/link]"}]
    snap = {"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": MB, "frames": frames},
                                               {"action": "free_completed", "addr": 1, "size": MB}]]}
    m = measure_memory(load_snapshot(dump(tmp_path, snap)))
    console = Console(record=True, width=200)
    render_memory_terminal([m], console)
    out = console.export_text()
    assert "[bold red]evil[/].py:1" in out and "[link=file:///etc/passwd]f[/link]" in out


def test_times_are_relative_to_the_history_and_wall_clock(tmp_path):
    """Peak and OOM instants print as seconds after the history starts plus the UTC wall clock (the
    snapshot's times are Unix µs), never as raw epoch microseconds."""
    from datetime import datetime, timezone

    sim = simulate(10)
    snap = with_oom(at_time(sim.snapshot(len(sim.events)), H100_SESSION_US), request=3 * MB, free=MB // 2)
    dump(tmp_path, snap, "rank0.pickle")
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # piped: lines as wide as their content
    result = subprocess.run([sys.executable, "-m", "perfdoctor", "memory", str(tmp_path / "rank0.pickle")],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    doc = json.loads(_cli("memory", str(tmp_path / "rank0.pickle"), "--format", "json").stdout)
    ev = doc["snapshots"][0]["evidence"]
    peak = ev["peak_allocated_at_us"]
    relative = f"+{(peak - ev['history_start_us']) / 1e6:,.3f} s after the history starts"
    wall = datetime.fromtimestamp(peak / 1e6, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    peak_line = next(line for line in result.stdout.splitlines() if "peak allocated" in line)
    assert relative in peak_line and wall in peak_line
    oom = ev["ooms"][0]["time_us"]
    oom_line = next(line for line in result.stdout.splitlines() if "out of memory" in line)
    assert f"+{(oom - ev['history_start_us']) / 1e6:,.3f} s" in oom_line
    assert f"{peak:,}" not in result.stdout and f"{oom:,}" not in result.stdout
