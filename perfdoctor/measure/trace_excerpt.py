"""A bounded excerpt of one rank for the Perfetto timeline (``perfdoctor analyze --perfetto``).

A Chrome-trace JSON of every event of a 64-rank run would be gigabytes that no viewer opens; what a reader
needs is one step of every rank, laid on one clock, with what the report says about it. Per rank this
holds one step: the kernels per stream (:mod:`perfdoctor.measure.excerpt`'s merged rectangles, with each
comm kernel's parallel group), its copies and fills, the launching thread's CUDA API calls (runs of the
same call narrower than the merge resolution as one slice) and NVTX ranges (the longest ones, at least
the resolution wide), and the excerpt's highlights: exposed communication per group, host gaps by cause,
device-side waits or pipeline bubbles, LayerNorms blocked behind NCCL.

The step drawn is the middle one by position, not the one of median duration the HTML report draws: the
ranks of a synchronous run step together, so the same position is the same iteration on every rank,
which is what a reader comparing ranks (and the arrows from a wait to the peer that caused it) needs.
The pipeline computes it only when a Perfetto file is asked for. Times are µs from the step start, as
in the HTML excerpt; the rank's file clock is ``step_start_ns`` + ``session_start_utc_ns``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perfdoctor.classify.groups import GROUPS, GroupLabels
from perfdoctor.classify.timeline import class_codes
from perfdoctor.measure.activity import Activity, GroupComm
from perfdoctor.measure.excerpt import Excerpt, excerpt, merge_runs
from perfdoctor.measure.host import HostContext
from perfdoctor.measure.peers import PeerWaits
from perfdoctor.measure.steps import Steps
from perfdoctor.model import Timeline
from perfdoctor.table import Table

MAX_RECTS = 2000  # per rank, kernels after merging (half the HTML excerpt's: 64 ranks in one file)
MAX_COPIES = 1000  # per rank, copies and fills after merging
MAX_CALLS = 2000  # per rank, launch-thread CUDA API slices after merging
MAX_RANGES = 1000  # per rank, NVTX ranges (the longest)
MAX_WAITS = 200  # per rank, waits for a peer drawn as arrows (the longest)
NS_PER_US = 1e3


@dataclass
class TraceExcerpt:
    """One step of one rank: the kernel excerpt plus copies, launch calls and NVTX ranges (µs from the
    step start, like :class:`Excerpt`)."""

    kernels: Excerpt
    session_start_utc_ns: int | None
    launch_tid: int  # the thread that launched most device work (−1: unknown)
    thread_name: str | None
    # one row per slice: stream, start_us, end_us, category, name, count
    copies: list[dict[str, Any]] = field(default_factory=list)
    # one row per slice: start_us, end_us, name, count
    calls: list[dict[str, Any]] = field(default_factory=list)
    # one row per range: start_us, end_us, text
    ranges: list[dict[str, Any]] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)  # events left out by the caps, per kind


@dataclass
class RunTrace:
    """The excerpts of all ranks on one clock: per rank, the ns to add to its excerpt's file-clock times
    (its session start, plus the shift that makes matched collectives end together), the residual of that
    alignment, and the waits for a peer that lie inside the drawn steps of both ranks."""

    excerpts: dict[int, TraceExcerpt]
    clock_ns: dict[int, int]
    clock_source: dict[int, str]  # per rank: "collectives" (aligned) or "session" (session start only)
    clock_residual_us: float | None
    # one row per wait: rank, group, start_ns, end_ns (its wait, aligned clock), late (rank), late_ns (its
    # arrival); the longest MAX_WAITS of each rank
    waits: list[dict[str, Any]] = field(default_factory=list)


def run_trace(excerpts: dict[int, TraceExcerpt], peers: PeerWaits) -> RunTrace:
    """Put the ranks' excerpts on the aligned clock and pick the waits both of whose ends are drawn."""
    clock = {r: peers.clock.get(r, int(ex.session_start_utc_ns or 0)) for r, ex in excerpts.items()}
    aligned = peers.clock_residual_us is not None  # else no collective matched: session clocks only
    source = {r: "collectives" if aligned and r in peers.clock else "session" for r in excerpts}
    out = RunTrace(excerpts, clock, source, peers.clock_residual_us)
    w = peers.waited
    if not excerpts or not w or not w["rank"].size:
        return out
    ranks = np.array(sorted(excerpts), dtype=np.int64)
    lo = np.array([excerpts[r].kernels.step_start_ns + clock[r] for r in ranks.tolist()], dtype=np.int64)
    hi = lo + np.array([round(excerpts[r].kernels.step_ms * 1e6) for r in ranks.tolist()], dtype=np.int64)

    def drawn(rank: np.ndarray, t: np.ndarray) -> np.ndarray:
        i = np.clip(np.searchsorted(ranks, rank), 0, ranks.size - 1)
        return (ranks[i] == rank) & (lo[i] <= t) & (t < hi[i])

    rows = np.flatnonzero(drawn(w["rank"], w["start"]) & drawn(w["late"], w["late_start"]))
    # the longest waits of each rank first, then in time order
    rows = rows[np.lexsort((-w["wait"][rows], w["rank"][rows]))]
    first = np.r_[True, w["rank"][rows][1:] != w["rank"][rows][:-1]]
    place = np.arange(rows.size) - np.maximum.accumulate(np.where(first, np.arange(rows.size), 0))
    rows = np.sort(rows[place < MAX_WAITS])
    out.waits = [{"rank": int(w["rank"][j]), "group": GROUPS[int(w["g"][j])], "start_ns": int(w["start"][j]),
                  "end_ns": int(w["start"][j] + w["wait"][j]), "late": int(w["late"][j]),
                  "late_ns": int(w["late_start"][j])} for j in rows.tolist()]
    return out


def middle_step(steps: Steps) -> int:
    """Position of the middle step (the lower middle for an even count)."""
    return (len(steps) - 1) // 2


def trace_excerpt(tl: Timeline, kcls: Table, ccls: Table, act: Activity, steps: Steps, groups: GroupLabels,
                  by_group: GroupComm, config: dict[str, Any], context: HostContext | None = None,
                  ) -> TraceExcerpt | None:
    """The Perfetto excerpt of one timeline, or None when it has no kernels or no steps. ``context``: the
    whole timeline's, when ``tl`` is a window of its steps (perfdoctor.measure.windows)."""
    context = context or HostContext(tl)
    ex = excerpt(tl, kcls, act, steps, groups, by_group, config, max_rects=MAX_RECTS,
                 step_index=middle_step(steps) if len(steps) else 0, with_groups=True, context=context)
    if ex is None:
        return None
    lo = ex.step_start_ns
    hi = int(steps.ends[ex.step_index])
    pixel = max(ex.pixel_us * NS_PER_US, 1.0)
    tid = context.main_thread()
    out = TraceExcerpt(kernels=ex, session_start_utc_ns=tl.trace.session_start_utc_ns, launch_tid=tid,
                       thread_name=tl.thread_names.get(tid))
    out.copies, out.dropped["copies"] = _copies(tl, ccls, lo, hi, pixel)
    out.calls, out.dropped["calls"] = _calls(tl, tid, lo, hi, pixel)
    out.ranges, out.dropped["ranges"] = _ranges(tl, tid, lo, hi, pixel)
    return out


def _inside(table: Table, lo: int, hi: int) -> np.ndarray:
    if not len(table):
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero((table.col("end") > lo) & (table.col("start") < hi))


def _rows(runs: dict[str, np.ndarray], lo: int, hi: int, cap: int, stream: bool) -> tuple[list[dict[str, Any]], int]:
    """Merged runs as rows, the longest ``cap`` of them (in time order), and how many were left out."""
    dur = runs["end"] - runs["start"]
    keep = np.sort(np.argsort(-dur, kind="stable")[:cap])
    rows = []
    for j in keep.tolist():
        row = {"start_us": _us(runs["start"][j], lo, hi), "end_us": _us(runs["end"][j], lo, hi),
               "name": str(runs["name"][j]), "count": int(runs["count"][j])}
        if stream:
            row = {"stream": int(runs["stream"][j]), "category": str(runs["category"][j]), **row}
        rows.append(row)
    return rows, int(dur.size - keep.size)


def _copies(tl: Timeline, ccls: Table, lo: int, hi: int, pixel: float) -> tuple[list[dict[str, Any]], int]:
    parts = []
    rows = _inside(tl.memcpy, lo, hi)
    if rows.size:
        codes, categories = class_codes(ccls)["category"]
        parts.append((tl.memcpy.take(rows), np.array(categories, dtype=object)[codes[rows]]))
    rows = _inside(tl.memset, lo, hi)
    if rows.size:
        parts.append((tl.memset.take(rows), np.full(rows.size, "memset", dtype=object)))
    if not parts:
        return [], 0
    start = np.concatenate([t.col("start") for t, _ in parts])
    end = np.concatenate([t.col("end") for t, _ in parts])
    stream = np.concatenate([t.col("stream") for t, _ in parts])
    category = np.concatenate([c for _, c in parts])
    return _rows(merge_runs(start, end, stream, category, category, pixel), lo, hi, MAX_COPIES, stream=True)


def _calls(tl: Timeline, tid: int, lo: int, hi: int, pixel: float) -> tuple[list[dict[str, Any]], int]:
    rows = _inside(tl.api, lo, hi)
    rows = rows[tl.api.col("tid")[rows] == tid] if rows.size else rows
    if not rows.size:
        return [], 0
    api = tl.api.take(rows)
    names = api["name"].decode()
    same = np.zeros(rows.size, dtype=np.int64)  # one "stream": runs of one call name are merged
    return _rows(merge_runs(api.col("start"), api.col("end"), same, names, names, pixel), lo, hi, MAX_CALLS,
                 stream=False)


def _ranges(tl: Timeline, tid: int, lo: int, hi: int, pixel: float) -> tuple[list[dict[str, Any]], int]:
    nvtx = tl.nvtx
    rows = _inside(nvtx, lo, hi)
    if not rows.size:
        return [], 0
    end, start = nvtx.col("end")[rows], nvtx.col("start")[rows]
    rows = rows[(end >= start) & (nvtx.col("tid")[rows] == tid) & (end - start >= pixel)]
    dur = nvtx.col("end")[rows] - nvtx.col("start")[rows]
    keep = np.sort(rows[np.argsort(-dur, kind="stable")[:MAX_RANGES]])
    text = nvtx.col("text", dtype=object)[keep]
    out = [{"start_us": _us(s, lo, hi), "end_us": _us(e, lo, hi), "text": str(t) if t is not None else "(no text)"}
           for s, e, t in zip(nvtx.col("start")[keep].tolist(), nvtx.col("end")[keep].tolist(), text)]
    return out, int(rows.size - keep.size)


def _us(t: int, lo: int, hi: int) -> float:
    return round((min(max(int(t), lo), hi) - lo) / NS_PER_US, 3)
