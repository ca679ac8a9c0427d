"""Memory metrics of one rank from its CUDA caching-allocator snapshot (:mod:`perfdoctor.load.memsnap`).

**Replay direction.** The history is a ring buffer (Megatron and NeMo keep the newest 100k events), so
its beginning is usually lost while its end is exact; the dump-time state (the segments and their
blocks) is taken under the same allocator lock as the history. So the totals are replayed *backwards*
from the dump-time state: allocated bytes before an event = allocated after it − what the event
added. That is exact over the whole recorded window without knowing what existed when recording began
(which is what a forward replay would have to guess).

**What counts.** Allocated = bytes of blocks handed out by the allocator (block sizes, rounded as
``torch.cuda.memory_allocated`` rounds them), from ``alloc`` until ``free_completed`` (a block freed
on one stream but still used by another stays occupied until then), as PyTorch's memory viewer draws
it. Reserved = bytes of cudaMalloc'd segments (``segment_alloc``/``segment_free``) plus the mapped part
of expandable segments (``segment_map``/``segment_unmap``), as ``torch.cuda.memory_reserved``.

Without history (an old bare list of segments) every peak is the dump-time state, and the counts that
need history (OOMs, segment allocations) stay ``None``.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perfdoctor.load.memsnap import Frame, MemorySnapshot, Segment, TraceEntry

MEMORY_KEYS: tuple[str, ...] = (
    "memory.peak_allocated_bytes", "memory.peak_reserved_bytes", "memory.fragmentation_fraction",
    "memory.headroom_fraction", "memory.oom_count", "memory.segment_allocs", "memory.largest_free_block_bytes",
)

SERIES_POINTS = 500  # at most this many points in the allocated/reserved series (for plots)
TOP_SITES = 10
ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
BEFORE_HISTORY = "<allocated before history recording began>"
NO_STACK = "<no stack recorded>"

_ALLOC_DELTA = {"alloc": 1, "free_completed": -1, "free": -1}
_RESERVE_DELTA = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
# Frames that say nothing about who allocated: CPython and unwinder internals (PyTorch's memory viewer
# hides the same ones), and PyTorch's own Python code between the user's call and the allocator.
_NOISE_NAMES = ("unwind::unwind", "CapturedTraceback::gather", "gather_with_cpp", "_start", "__libc_start_main",
                "PyEval_", "PyObject_", "PyFunction_")
_TORCH_FILE = re.compile(r"(^|[/\\])torch[/\\]")
_PSEUDO_FILE = re.compile(r"^<[^>]*>$")  # <stdin>, <string>: Python code without a file
# Snapshots converted from the profiler (torch.cuda._memory_viz._profile_to_snapshot) put the whole
# frame in the name: filename "none", name "torch/nn/modules/linear.py(125): forward".
_PROFILER_NAME = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<name>.+)$")


@dataclass
class MemoryMeasurement:
    """Memory metrics (``MEMORY_KEYS``) and the evidence behind them for one device of one snapshot."""

    device: int | None
    metrics: dict[str, float | None]
    evidence: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    rank: int | None = None  # set by the caller that knows it


@dataclass
class _Totals:
    """Allocated and reserved bytes at each point of the recorded window: point 0 is before the first
    event, point i + 1 is right after event i."""

    allocated: np.ndarray
    reserved: np.ndarray
    t_us: np.ndarray | None


def measure_memory(snap: MemorySnapshot, device: int | None = None, device_total_bytes: int | None = None,
                   env: dict[str, str] | None = None) -> MemoryMeasurement:
    """Measure one device of ``snap`` (``device``, else the one holding the most memory).

    ``device_total_bytes`` (from the trace's GPU info) is what the headroom is measured against;
    ``env`` (the captured environment) tells allocator settings that old snapshots do not record.
    """
    metrics: dict[str, float | None] = dict.fromkeys(MEMORY_KEYS)
    dev = _pick_device(snap, device)
    if dev is None:
        return MemoryMeasurement(None, metrics, {"device": None},
                                 [f"{snap.path.name}: the snapshot holds no segments and no history"])
    segments = [s for s in snap.segments if s.device == dev]
    trace = snap.device_traces.get(dev, [])
    warnings = list(snap.warnings)
    totals = replay(segments, trace)
    if totals.allocated.min() < 0 or totals.reserved.min() < 0:
        warnings.append(f"{snap.path.name}: the history does not add up to the dump-time state on device {dev} "
                        "(bytes would go negative going back); the earliest points are unreliable")
    peak_a = int(totals.allocated.max())
    peak_r = int(totals.reserved.max())
    metrics["memory.peak_allocated_bytes"] = float(peak_a)
    metrics["memory.peak_reserved_bytes"] = float(peak_r)
    at_peak_r = totals.reserved == peak_r
    used_at_peak_r = int(totals.allocated[at_peak_r].max())
    if peak_r > 0:
        metrics["memory.fragmentation_fraction"] = max(0.0, (peak_r - used_at_peak_r) / peak_r)
    if device_total_bytes:
        metrics["memory.headroom_fraction"] = 1.0 - peak_r / device_total_bytes
    actions = [e.action for e in trace]
    if snap.has_history:
        metrics["memory.oom_count"] = float(actions.count("oom"))
        metrics["memory.segment_allocs"] = float(actions.count("segment_alloc") + actions.count("segment_map"))
    free_blocks = [b.size for s in segments for b in s.blocks if b.state == "inactive"]
    if segments:
        metrics["memory.largest_free_block_bytes"] = float(max(free_blocks, default=0))

    peak_point = int(np.argmax(totals.allocated))
    conf, conf_source = _alloc_conf(snap, env or {})
    evidence: dict[str, Any] = {
        "device": dev,
        "file": str(snap.path),
        "has_history": snap.has_history,
        "history_events": len(trace),
        "history_span_us": _span(totals.t_us),
        "allocated_at_start_bytes": int(totals.allocated[0]),
        "allocated_at_dump_bytes": int(totals.allocated[-1]),
        "reserved_at_dump_bytes": int(totals.reserved[-1]),
        "peak_allocated_at_us": _time_at(totals.t_us, peak_point),
        "peak_reserved_at_us": _time_at(totals.t_us, int(np.argmax(at_peak_r))),
        "allocated_at_peak_reserved_bytes": used_at_peak_r,
        "segment_count": len(segments),
        "segment_frees": actions.count("segment_free") + actions.count("segment_unmap"),
        "ooms": [{"time_us": e.time_us, "requested_bytes": e.size, "device_free_bytes": e.addr}
                 for e in trace if e.action == "oom"][:TOP_SITES],
        "expandable_segments": _expandable(snap, segments, conf),
        "alloc_conf": conf,
        "alloc_conf_source": conf_source,
        "device_total_bytes": device_total_bytes,
        "top_sites": top_sites(segments, trace, peak_point),
        "series": downsample(totals),
    }
    return MemoryMeasurement(dev, metrics, evidence, warnings)


def replay(segments: list[Segment], trace: list[TraceEntry]) -> _Totals:
    """Allocated and reserved bytes over the history, replayed backwards from the dump-time state."""
    n = len(trace)
    sizes = np.fromiter((e.size for e in trace), dtype=np.int64, count=n)
    a_sign = np.fromiter((_ALLOC_DELTA.get(e.action, 0) for e in trace), dtype=np.int64, count=n)
    r_sign = np.fromiter((_RESERVE_DELTA.get(e.action, 0) for e in trace), dtype=np.int64, count=n)
    final_a = sum(b.size for s in segments for b in s.blocks if b.state != "inactive")
    final_r = sum(s.total_size for s in segments)
    allocated = _backwards(final_a, sizes * a_sign)
    reserved = _backwards(final_r, sizes * r_sign)
    times = [e.time_us for e in trace]
    t_us = None
    if n and all(t is not None for t in times):
        t = np.asarray(times, dtype=np.int64)
        t_us = np.concatenate([t[:1], t])
    return _Totals(allocated, reserved, t_us)


def _backwards(final: int, delta: np.ndarray) -> np.ndarray:
    """Value at points 0..n given the value at point n and the change each event made."""
    after = np.concatenate([[0], np.cumsum(delta)])  # change from point 0 to point k
    return final - (after[-1] - after)


def top_sites(segments: list[Segment], trace: list[TraceEntry], point: int) -> list[dict[str, Any]]:
    """Allocation sites holding the most bytes at replay point ``point``, largest first.

    Allocations are paired with their frees by address, oldest first. A free without a recorded
    allocation was made before recording began (its site is unknown: the free's stack is not the
    allocation's); a block still allocated at dump time that was never allocated in the window keeps
    the stack the dump recorded for it.
    """
    live: dict[int, tuple[int, tuple[Frame, ...], int]] = {}  # addr → (size, frames, start point)
    spans: list[tuple[int, int, int, tuple[Frame, ...] | None]] = []  # (start, end, size, frames)
    for i, e in enumerate(trace):
        sign = _ALLOC_DELTA.get(e.action, 0)
        if sign > 0:
            if e.addr in live:
                size, frames, start = live.pop(e.addr)
                spans.append((start, i + 1, size, frames))
            live[e.addr] = (e.size, e.frames, i + 1)
        elif sign < 0:
            if e.addr in live:
                size, frames, start = live.pop(e.addr)
                spans.append((start, i + 1, size, frames))
            else:
                spans.append((0, i + 1, e.size, None))
    end = len(trace) + 1
    spans.extend((start, end, size, frames) for size, frames, start in live.values())
    for seg in segments:
        for b in seg.blocks:
            if b.state != "inactive" and b.address not in live:
                spans.append((0, end, b.size, b.frames))
    by_site: dict[tuple[str, int, str], list[int]] = defaultdict(lambda: [0, 0])
    for start, stop, size, frames in spans:
        if start <= point < stop:
            acc = by_site[_site_key(frames)]
            acc[0] += size
            acc[1] += 1
    ranked = sorted(by_site.items(), key=lambda kv: -kv[1][0])[:TOP_SITES]
    return [{"file": f, "line": line, "function": fn, "bytes": b, "count": c}
            for (f, line, fn), (b, c) in ranked]


def _site_key(frames: tuple[Frame, ...] | None) -> tuple[str, int, str]:
    if frames is None:
        return (BEFORE_HISTORY, 0, "")
    site = allocation_site(frames)
    return (site.filename, site.line, site.name) if site else (NO_STACK, 0, "")


def allocation_site(frames: tuple[Frame, ...]) -> Frame | None:
    """The innermost frame that names the caller: Python code outside PyTorch itself, else any Python
    frame, else any frame that is not interpreter or unwinder plumbing."""
    useful = [_profiler_frame(f) for f in frames if not any(n in f.name for n in _NOISE_NAMES)]
    python = [f for f in useful if f.filename.endswith(".py") or _PSEUDO_FILE.match(f.filename)]
    outside_torch = [f for f in python if not _TORCH_FILE.search(f.filename)]
    for candidates in (outside_torch, python, useful):
        if candidates:
            return candidates[0]
    return None


def _profiler_frame(frame: Frame) -> Frame:
    if frame.filename != "none" or not (m := _PROFILER_NAME.match(frame.name)):
        return frame
    return Frame(filename=m["file"], line=int(m["line"]), name=m["name"])


def downsample(totals: _Totals, points: int = SERIES_POINTS) -> dict[str, list[int]]:
    """The allocated/reserved series cut to at most ``points`` points for plotting.

    Each kept point is the maximum of its bucket, so peaks survive downsampling; the x value is the
    bucket's first time (``t_us``) or first replay point (``event``, when the history has no times).
    """
    n = len(totals.allocated)
    edges = np.linspace(0, n, min(points, n) + 1).astype(np.int64)
    starts = edges[:-1]
    x_name, x = ("t_us", totals.t_us) if totals.t_us is not None else ("event", np.arange(n))
    return {
        x_name: x[starts].tolist(),
        "allocated": np.maximum.reduceat(totals.allocated, starts).tolist(),
        "reserved": np.maximum.reduceat(totals.reserved, starts).tolist(),
    }


def _alloc_conf(snap: MemorySnapshot, env: dict[str, str]) -> tuple[str | None, str | None]:
    value = snap.allocator_settings.get("PYTORCH_CUDA_ALLOC_CONF")
    if isinstance(value, str):
        return value, "snapshot"
    for var in ALLOC_CONF_VARS:
        if var in env:
            return env[var], "env"
    return None, None


def _expandable(snap: MemorySnapshot, segments: list[Segment], conf: str | None) -> bool | None:
    """Whether expandable segments were on: the allocator's own setting, else a segment that is
    expandable, else the allocator config string (off unless it says so), else unknown."""
    setting = snap.allocator_settings.get("expandable_segments")
    if isinstance(setting, bool):
        return setting
    if any(s.is_expandable for s in segments):
        return True
    if conf is not None:
        options = dict(part.split(":", 1) for part in conf.replace(" ", "").split(",") if ":" in part)
        return options.get("expandable_segments", "False").lower() in ("true", "1")
    return None


def _span(t_us: np.ndarray | None) -> int | None:
    return int(t_us[-1] - t_us[0]) if t_us is not None and len(t_us) else None


def _time_at(t_us: np.ndarray | None, point: int) -> int | None:
    return int(t_us[point]) if t_us is not None else None


def _pick_device(snap: MemorySnapshot, device: int | None) -> int | None:
    devices = snap.devices
    if device is not None and device in devices:
        return device
    if not devices:
        return None

    def weight(d: int) -> tuple[int, int]:
        return (sum(s.total_size for s in snap.segments if s.device == d), len(snap.device_traces.get(d, [])))

    return max(devices, key=weight)
