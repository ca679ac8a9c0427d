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

Without allocation events in the history (an old bare list of segments, recording off, or a ring
buffer that kept only a ``snapshot`` marker) the peaks, OOM and segment counts stay ``None`` and the
evidence says "dump-time state only": the dump-time state is not a peak.

**Out of memory.** An ``oom`` event records the request and CUDA's free memory at that moment; the
replay gives what the allocator held then and :func:`top_sites` who held it.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # the snapshot reader is imported where a snapshot is measured: most analyses have none
    from perfdoctor.load.memsnap import Frame, MemorySnapshot, Segment, Trace
    from perfdoctor.model import DeviceSummary, Run

MEMORY_KEYS: tuple[str, ...] = (
    "memory.peak_allocated_bytes", "memory.peak_reserved_bytes", "memory.fragmentation_fraction",
    "memory.headroom_fraction", "memory.oom_count", "memory.segment_allocs", "memory.largest_free_block_bytes",
    "memory.oom_requested_bytes", "memory.oom_device_free_bytes", "memory.oom_allocated_bytes",
    "memory.oom_reserved_bytes",
)

SERIES_POINTS = 500  # at most this many points in the allocated/reserved series (for plots)
TOP_SITES = 10
OOM_DETAILS = 3  # OOM events that get their own top allocation sites
OOM_HOLDERS = 3  # top sites at the first OOM quoted by the finding
ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
BEFORE_HISTORY = "<allocated before history recording began>"
NO_STACK = "<no stack recorded>"

# A snapshot dumped by an out-of-memory handler: Megatron's snapshot_oom_rank-3.pickle, oom_dump.pickle
_OOM_NAME = re.compile(r"(^|[^a-z])oom([^a-z]|$)", re.IGNORECASE)
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

    ``device_total_bytes`` (from the trace's GPU info or ``--device-memory``) is what the headroom is
    measured against; ``env`` (the captured environment) tells allocator settings that old snapshots
    do not record. Without allocation events in the history the peaks are unknown (null): the
    dump-time state is reported as what it is, never as a peak.
    """
    metrics: dict[str, float | None] = dict.fromkeys(MEMORY_KEYS)
    dev = _pick_device(snap, device)
    if dev is None:
        return MemoryMeasurement(None, metrics, {"device": None},
                                 [f"{snap.path.name}: the snapshot holds no segments and no history"])
    segments = [s for s in snap.segments if s.device == dev]
    from perfdoctor.load.memsnap import empty_trace

    trace = snap.device_traces.get(dev) or empty_trace()
    warnings = list(snap.warnings)
    totals = replay(segments, trace)
    recorded = snap.has_history and trace.count(*_ALLOC_DELTA, *_RESERVE_DELTA, "oom") > 0
    if totals.allocated.min() < 0 or totals.reserved.min() < 0:
        warnings.append(f"{snap.path.name}: the history does not add up to the dump-time state on device {dev} "
                        "(bytes would go negative going back); the earliest points are unreliable")
    peak_a = int(totals.allocated.max())
    peak_r = int(totals.reserved.max())
    at_peak_r = totals.reserved == peak_r
    used_at_peak_r = int(totals.allocated[at_peak_r].max())
    oom_points = np.flatnonzero(trace.mask("oom"))
    if recorded:
        metrics["memory.peak_allocated_bytes"] = float(peak_a)
        metrics["memory.peak_reserved_bytes"] = float(peak_r)
        if peak_r > 0:
            metrics["memory.fragmentation_fraction"] = max(0.0, (peak_r - used_at_peak_r) / peak_r)
        if device_total_bytes:
            metrics["memory.headroom_fraction"] = 1.0 - peak_r / device_total_bytes
        metrics["memory.oom_count"] = float(len(oom_points))
        metrics["memory.segment_allocs"] = float(trace.count("segment_alloc", "segment_map"))
        if len(oom_points):
            first = int(oom_points[0])
            metrics["memory.oom_requested_bytes"] = float(trace.size[first])
            metrics["memory.oom_device_free_bytes"] = float(trace.addr[first])
            metrics["memory.oom_allocated_bytes"] = float(totals.allocated[first])
            metrics["memory.oom_reserved_bytes"] = float(totals.reserved[first])
    else:
        warnings.append(_dump_time_only(snap, len(trace)))
    free_blocks = [b.size for s in segments for b in s.blocks if b.state == "inactive"]
    if segments:
        metrics["memory.largest_free_block_bytes"] = float(max(free_blocks, default=0))

    peak_point = int(np.argmax(totals.allocated))
    conf, conf_source = _alloc_conf(snap, env or {})
    ooms = [_oom(segments, trace, totals, int(i), detailed=k < OOM_DETAILS)
            for k, i in enumerate(oom_points[:TOP_SITES])]
    evidence: dict[str, Any] = {
        "device": dev,
        "file": str(snap.path),
        "has_history": recorded,
        "state": "history" if recorded else "dump-time state only",
        "history_events": len(trace),
        "history_span_us": _span(totals.t_us),
        "history_start_us": int(totals.t_us[0]) if totals.t_us is not None and len(trace) else None,
        "allocated_at_start_bytes": int(totals.allocated[0]),
        "allocated_at_dump_bytes": int(totals.allocated[-1]),
        "reserved_at_dump_bytes": int(totals.reserved[-1]),
        "peak_allocated_at_us": _time_at(totals.t_us, peak_point) if recorded else None,
        "peak_reserved_at_us": _time_at(totals.t_us, int(np.argmax(at_peak_r))) if recorded else None,
        "allocated_at_peak_reserved_bytes": used_at_peak_r if recorded else None,
        "segment_count": len(segments),
        "segment_frees": trace.count("segment_free", "segment_unmap"),
        "ooms": ooms,
        "oom_holders": [_holder(site) for site in ooms[0]["top_sites"][:OOM_HOLDERS]] if ooms else None,
        "expandable_segments": _expandable(snap, segments, conf),
        "alloc_conf": conf,
        "alloc_conf_source": conf_source,
        "device_total_bytes": device_total_bytes,
        "top_sites": top_sites(segments, trace, peak_point if recorded else len(trace)),
        "top_sites_at": "peak allocated" if recorded else "dump time",
        "series": downsample(totals) if recorded else {},
    }
    return MemoryMeasurement(dev, metrics, evidence, warnings)


def _dump_time_only(snap: MemorySnapshot, events: int) -> str:
    """The warning for a snapshot whose history records no allocation (or none at all)."""
    what = (f"its history holds {events:,} event{'s' if events != 1 else ''} and no allocation" if events
            else "it has no allocation history")
    text = f"{snap.path.name}: {what}: dump-time state only (peaks, OOMs and segment allocations are not measured)"
    if _OOM_NAME.search(snap.path.stem):
        text += ("; its name says it was dumped at an out-of-memory error, but its history does not hold "
                 "the OOM (the request and the free memory at that moment are unknown)")
    return text


def _oom(segments: list[Segment], trace: Trace, totals: _Totals, i: int, detailed: bool) -> dict[str, Any]:
    """An out-of-memory event: what was asked, what the device had free (CUDA's count, which also
    excludes other processes and the CUDA context), what the allocator held, and who held it."""
    out: dict[str, Any] = {
        "time_us": int(trace.time_us[i]) if trace.time_us is not None else None,
        "requested_bytes": int(trace.size[i]),
        "device_free_bytes": int(trace.addr[i]),
        "allocated_bytes": int(totals.allocated[i]),
        "reserved_bytes": int(totals.reserved[i]),
        "site": _site_dict(trace.stacks[trace.stack[i]]),
    }
    if detailed:
        out["top_sites"] = top_sites(segments, trace, i)
    return out


def _holder(site: dict[str, Any]) -> str:
    """One top site as a line a finding can quote: ``model.py:399 forward: 12.3 GiB in 4 blocks``."""
    where = site["file"] + (f":{site['line']}" if site["line"] else "") + (f" {site['function']}" if site["function"]
                                                                           else "")
    return f"{where}: {site['bytes'] / 2**30:,.2f} GiB in {site['count']:,} block{'s' if site['count'] != 1 else ''}"


def _site_dict(frames: tuple[Frame, ...]) -> dict[str, Any] | None:
    site = allocation_site(frames)
    return {"file": site.filename, "line": site.line, "function": site.name} if site else None


def measure_run_memory(run: Run, devices: list[DeviceSummary], per_rank: dict[str, dict[str, Any]],
                       device_total_bytes: int | None = None) -> list[str]:
    """Measure the snapshot attached to each GPU timeline of ``run`` into its rank's metrics and its
    device's evidence; returns the warnings.

    The device memory the headroom rules compare with is the GPU table's (``TARGET_INFO_GPU``), or
    ``device_total_bytes`` (``--device-memory``) when given: it wins, since a MIG slice or a capped
    process has less than the GPU table says, and it also becomes ``device.total_memory_bytes`` for
    the rules. The timelines' GPU records are replaced (not mutated) to carry it.
    """
    from perfdoctor.measure.metrics import METRIC_KEYS  # it lists MEMORY_KEYS: imported here, not at the top
    from perfdoctor.model import GpuInfo

    warnings: list[str] = []
    for tl, device in zip(run.timelines, devices):
        if tl.device_id is None:
            continue
        gpu = tl.gpu
        total = gpu.total_memory if gpu is not None else None
        if device_total_bytes is not None:
            if total and abs(total - device_total_bytes) > 0.02 * total:
                warnings.append(f"{tl.label}: --device-memory {device_total_bytes / 2**30:,.1f} GiB used instead of "
                                f"the {total / 2**30:,.1f} GiB the trace's GPU table gives")
            total = device_total_bytes
            tl.trace.gpus[tl.device_id] = replace(gpu, total_memory=total) if gpu is not None else \
                GpuInfo(device_id=tl.device_id, total_memory=total)
        if tl.memory is not None:
            mem = measure_memory(tl.memory, tl.device_id, total, tl.trace.env)
            per_rank.setdefault(str(tl.rank), dict.fromkeys(METRIC_KEYS)).update(mem.metrics)
            device.evidence["memory"] = mem.evidence
            warnings.extend(mem.warnings)
    return warnings


def replay(segments: list[Segment], trace: Trace) -> _Totals:
    """Allocated and reserved bytes over the history, replayed backwards from the dump-time state."""
    sizes = trace.size
    a_sign = _sign_column(trace, _ALLOC_DELTA)
    r_sign = _sign_column(trace, _RESERVE_DELTA)
    final_a = sum(b.size for s in segments for b in s.blocks if b.state != "inactive")
    final_r = sum(s.total_size for s in segments)
    allocated = _backwards(final_a, sizes * a_sign)
    reserved = _backwards(final_r, sizes * r_sign)
    t_us = None
    if len(trace) and trace.time_us is not None:
        t_us = np.concatenate([trace.time_us[:1], trace.time_us])
    return _Totals(allocated, reserved, t_us)


def _sign_column(trace: Trace, deltas: dict[str, int]) -> np.ndarray:
    from perfdoctor.load.memsnap import TRACE_ACTIONS

    table = np.zeros(len(TRACE_ACTIONS), dtype=np.int64)
    for action, sign in deltas.items():
        table[TRACE_ACTIONS.index(action)] = sign
    return table[trace.action]


def _backwards(final: int, delta: np.ndarray) -> np.ndarray:
    """Value at points 0..n given the value at point n and the change each event made."""
    after = np.concatenate([[0], np.cumsum(delta)])  # change from point 0 to point k
    return final - (after[-1] - after)


def top_sites(segments: list[Segment], trace: Trace, point: int) -> list[dict[str, Any]]:
    """Allocation sites holding the most bytes at replay point ``point``, largest first.

    Allocations are paired with their frees by address, oldest first. A free without a recorded
    allocation was made before recording began (its site is unknown: the free's stack is not the
    allocation's); a block still allocated at dump time that was never allocated in the window keeps
    the stack the dump recorded for it. In bulk: the events that allocate or free are sorted by
    address (stable, so in time order per address), and each one's next event on the same address
    ends the span it starts.
    """
    sign = _sign_column(trace, _ALLOC_DELTA)
    idx = np.flatnonzero(sign)
    order = idx[np.argsort(trace.addr[idx], kind="stable")]
    addr, is_alloc = trace.addr[order], sign[order] > 0
    same_next = np.zeros(len(order), dtype=bool)
    same_next[:-1] = addr[1:] == addr[:-1]
    stop = np.full(len(order), len(trace) + 1, dtype=np.int64)  # span end point (exclusive)
    stop[:-1][same_next[:-1]] = order[1:][same_next[:-1]] + 1
    prev_alloc = np.zeros(len(order), dtype=bool)
    prev_alloc[1:] = same_next[:-1] & is_alloc[:-1]
    # allocations in the window: from the point after the event to the next event on the address
    held = is_alloc & (order + 1 <= point) & (stop > point)
    # frees of blocks allocated before recording began: from point 0 to the point after the free
    before = ~is_alloc & ~prev_alloc & (order + 1 > point)
    by_site: dict[tuple[str, int, str], list[int]] = defaultdict(lambda: [0, 0])
    for i in order[held].tolist():
        _add_site(by_site, trace.stacks[trace.stack[i]], int(trace.size[i]))
    for i in order[before].tolist():
        _add_site(by_site, None, int(trace.size[i]))
    live_at_end = set(addr[is_alloc & ~same_next].tolist())
    for seg in segments:
        for b in seg.blocks:
            if b.state != "inactive" and b.address not in live_at_end:
                _add_site(by_site, b.frames, b.size)
    ranked = sorted(by_site.items(), key=lambda kv: (-kv[1][0], -kv[1][1], kv[0]))[:TOP_SITES]
    return [{"file": f, "line": line, "function": fn, "bytes": b, "count": c}
            for (f, line, fn), (b, c) in ranked]


def _add_site(by_site: dict[tuple[str, int, str], list[int]], frames: tuple[Frame, ...] | None, size: int) -> None:
    acc = by_site[_site_key(frames)]
    acc[0] += size
    acc[1] += 1


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
    from perfdoctor.load.memsnap import Frame

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
        trace = snap.device_traces.get(d)
        return (sum(s.total_size for s in snap.segments if s.device == d), len(trace) if trace is not None else 0)

    return max(devices, key=weight)
