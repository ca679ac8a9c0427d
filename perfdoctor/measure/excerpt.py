"""A timeline excerpt for the HTML report: one representative step, drawn per stream.

A browser cannot draw millions of rectangles, and nobody can read them. The excerpt takes the step of
median duration (the one that looks like the run, not an outlier) and turns its kernels into at most
``max_rects`` rectangles per timeline: on each stream, consecutive kernels of the same category that
are each narrower than one pixel at ``width_px`` are merged into one rectangle (with their count), and
while the cap is exceeded the pixel is doubled. Highlights are the intervals a reader should see:
exposed communication per group, host gaps by cause, device-side waits (pipeline bubbles when PP>1),
and LayerNorm kernels blocked behind NCCL (from ready to start). Times are µs from the step start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perfdoctor.classify.groups import GROUPS, GroupLabels
from perfdoctor.classify.timeline import class_codes
from perfdoctor.measure import intervals as iv
from perfdoctor.measure.activity import Activity, GroupComm
from perfdoctor.measure.host import CAUSES, HostContext, host_gaps
from perfdoctor.measure.layernorm import blocked_norms
from perfdoctor.measure.steps import Steps
from perfdoctor.model import Timeline
from perfdoctor.table import Table, distinct

WIDTH_PX = 1600  # the plot's drawing width the merge threshold is computed for
MAX_RECTS = 4000  # per timeline, kernels after merging
MAX_HIGHLIGHTS = 1500  # per timeline, all kinds together
NS_PER_US = 1e3
GROUP_SEP = "\x1f"  # joins category and group into one merge key (never in a category name)


@dataclass
class Excerpt:
    """Rectangles and highlights of one step of one timeline (µs from ``step_start_ns``)."""

    rank: int
    step_index: int  # position of the step among the timeline's steps
    step_count: int
    step_start_ns: int
    step_ms: float
    kernels: int  # kernels of the step before merging
    pixel_us: float  # merge threshold that was used
    streams: list[int] = field(default_factory=list)
    # one row per rectangle: stream, start_us, end_us, category, name (longest kernel), count
    rects: list[dict[str, Any]] = field(default_factory=list)
    # one row per highlight: kind (exposed_comm|host_gap|device_wait|bubble|ln_blocked), label, start_us,
    # end_us, stream (None: the whole device)
    highlights: list[dict[str, Any]] = field(default_factory=list)


def representative_step(steps: Steps) -> int:
    """Index of the step of median duration (the lower median for an even count)."""
    order = np.argsort(steps.durations, kind="stable")
    return int(order[(len(order) - 1) // 2])


def excerpt(tl: Timeline, kcls: Table, act: Activity, steps: Steps, groups: GroupLabels, by_group: GroupComm,
            config: dict[str, Any], width_px: int = WIDTH_PX, max_rects: int = MAX_RECTS,
            step_index: int | None = None, with_groups: bool = False,
            context: HostContext | None = None) -> Excerpt | None:
    """The excerpt of one timeline, or None when it has no kernels or no steps. ``step_index``: draw that
    step instead of the representative one; ``with_groups``: kernels of different parallel groups are never
    merged, and each rectangle names its group (``None`` for compute). ``context``: the whole timeline's, when
    ``tl`` is a window of its steps (perfdoctor.measure.windows)."""
    if tl.device_id is None or not len(steps) or not len(tl.kernels):
        return None
    i = representative_step(steps) if step_index is None else step_index
    lo, hi = int(steps.starts[i]), int(steps.ends[i])
    one = Steps(np.array([lo], dtype=np.int64), np.array([hi], dtype=np.int64), steps.source)
    k = tl.kernels
    start, end = k.col("start"), k.col("end")
    inside = np.flatnonzero((end > lo) & (start < hi))
    out = Excerpt(rank=int(tl.rank or 0), step_index=i, step_count=len(steps), step_start_ns=lo,
                  step_ms=(hi - lo) / 1e6, kernels=int(inside.size), pixel_us=0.0)
    category_codes, categories = class_codes(kcls)["category"]
    category = np.array(categories, dtype=object)[category_codes[inside]]
    if with_groups:  # merged by category and group together (one label per pair), split again below
        labels = np.array([c if g is None else f"{c}{GROUP_SEP}{g}" for c in categories for g in (None, *GROUPS)],
                          dtype=object)
        category = labels[category_codes[inside].astype(np.int64) * (len(GROUPS) + 1)
                          + groups.codes[inside].astype(np.int64) + 1]
    names = k["short_name"][inside].decode()  # only the step's kernels are named
    # Widen the pixel until the cap holds; if alternating categories still exceed it when a pixel is the
    # whole step, merge narrow kernels across categories too (drawn as "mixed").
    for mixed in (False, True):
        pixel = max((hi - lo) / width_px, 1.0)
        while True:
            rects = merge_runs(start[inside], end[inside], k.col("stream")[inside], category,
                           names, pixel, mixed)
            if len(rects["start"]) <= max_rects or pixel > hi - lo:
                break
            pixel *= 2
        if len(rects["start"]) <= max_rects:
            break
    out.pixel_us = pixel / NS_PER_US
    out.streams = sorted({int(s) for s in rects["stream"]})
    out.rects = [{"stream": int(s), "start_us": _us(a, lo, hi), "end_us": _us(b, lo, hi), "category": str(c),
                  "name": str(n), "count": int(m)}
                 for s, a, b, c, n, m in zip(rects["stream"], rects["start"], rects["end"], rects["category"],
                                             rects["name"], rects["count"])]
    if with_groups:
        for rect in out.rects:
            rect["category"], _, g = rect["category"].partition(GROUP_SEP)
            rect["group"] = g or None
    out.highlights = highlights(tl, kcls, act, one, groups, by_group, config, pixel, context)[:MAX_HIGHLIGHTS]
    return out


def merge_runs(start: np.ndarray, end: np.ndarray, stream: np.ndarray, category: np.ndarray, name: np.ndarray,
           pixel: float, mixed: bool = False) -> dict[str, np.ndarray]:
    """Merge runs of narrow kernels on a stream whose gaps are below one pixel: of the same category,
    or of any category when ``mixed`` (a run of several categories is then called "mixed")."""
    order = np.lexsort((start, stream))
    start, end, stream, category, name = start[order], end[order], stream[order], category[order], name[order]
    n = start.size
    if not n:
        return {"stream": stream, "start": start, "end": end, "category": category, "name": name,
                "count": np.zeros(0, dtype=np.int64)}
    narrow = (end - start) < pixel
    new = np.ones(n, dtype=bool)
    same_cat = category[1:] == category[:-1]
    new[1:] = ~((stream[1:] == stream[:-1]) & (same_cat | mixed) & narrow[1:] & narrow[:-1]
                & (start[1:] - end[:-1] < pixel))  # kernels of one stream run one after another
    first = np.flatnonzero(new)
    group = np.cumsum(new) - 1
    ends = np.maximum.reduceat(end, first)
    dur = end - start
    # the longest kernel of each run names it
    longest = np.lexsort((-dur, group))
    head = longest[np.flatnonzero(np.r_[True, group[longest][1:] != group[longest][:-1]])]
    run_category = category[first].copy()
    if mixed:
        changes = np.flatnonzero(~new[1:] & ~same_cat) + 1  # continuations that switch category
        run_category[distinct(group[changes])] = "mixed"
    return {"stream": stream[first], "start": start[first], "end": ends, "category": run_category,
            "name": name[head], "count": np.diff(np.append(first, n))}


def highlights(tl: Timeline, kcls: Table, act: Activity, one: Steps, groups: GroupLabels, by_group: GroupComm,
                config: dict[str, Any], pixel: float, context: HostContext | None = None) -> list[dict[str, Any]]:
    lo, hi = int(one.starts[0]), int(one.ends[0])
    k = tl.kernels
    start = k.col("start")
    rows: list[dict[str, Any]] = []

    def add(kind: str, label: str, spans: iv.Intervals, stream: int | None = None) -> None:
        s, e = _coarsen(iv.clip(spans, lo, hi), pixel)
        rows.extend({"kind": kind, "label": label, "start_us": _us(a, lo, hi), "end_us": _us(b, lo, hi),
                     "stream": stream} for a, b in zip(s, e))

    # The timeline's exposed sets, computed once for every measurement; ``add`` clips them to the step.
    if groups.any_labelled:
        for i, g in enumerate(GROUPS):
            if by_group.kernels[i]:
                add("exposed_comm", g, by_group.exposed[i])
    else:
        add("exposed_comm", "unlabelled", act.exposed_comm)
    gaps = host_gaps(tl, one, act.busy, context)
    for cause in CAUSES:
        spans = gaps.spans.get(cause, iv.EMPTY)
        add("host_gap", cause, spans)
    pp = (config.get("pp") or 1) > 1
    add("bubble" if pp else "device_wait", "waiting on other ranks" if pp else "dependency / other rank",
        gaps.wait_intervals)
    ln = blocked_norms(tl, kcls, one)
    for row, delay in zip(ln.index, ln.delay_ns):
        s = np.array([start[row] - delay], dtype=np.int64)
        add("ln_blocked", str(k["short_name"][int(row)]), (s, start[row:row + 1]), int(k["stream"][row]))
    return rows


def _coarsen(spans: iv.Intervals, pixel: float) -> iv.Intervals:
    """Join intervals closer than one pixel, so a highlight is drawn as few rectangles as it looks."""
    s, e = spans
    if s.size < 2:
        return s, e
    pad = int(pixel)
    joined_s, joined_e = iv.union(s, e + pad)
    return joined_s, joined_e - pad


def _us(t: int, lo: int, hi: int) -> float:
    return round((min(max(int(t), lo), hi) - lo) / NS_PER_US, 3)
