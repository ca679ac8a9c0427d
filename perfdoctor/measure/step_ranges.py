"""Steps from the ranges a program marks itself: framework step ranges, then the run's own repeating ranges.

Many runs carry neither perfdoctor ``step`` labels nor ``ProfilerStep#N``, yet mark each iteration:
Megatron-Bridge pushes ``…training_step_<n>`` (``nvtx_ranges=True``), Lightning (and NeMo on top of it)
records ``run_training_batch``, and hand-written benchmarks wrap each iteration in ``train_step``,
``step_<i>`` or a ``Forward`` + ``Backward`` pair, often inside ``init_model`` / ``warmup`` /
``benchmark_loop`` phases. Taking the whole window as one step there mixes model construction and
weight upload into "per-step" numbers.

The repeating unit is found top-down on the thread that launched the device work: at each nesting level,
a name (digits folded, so ``step_3`` and ``step_4`` are one name) that occurs at least twice with a
stable period, outside ranges the program labels as initialisation or warm-up, whose iterations hold
most of the level's GPU work, defines the steps (anchor start to next anchor start; the last one ends
where the last repeating range of the level ends). A level without one descends into its range with the
most GPU work. What lies before the first step (``init_model``, ``warmup``) is named, so the report can
say what it left out.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from perfdoctor.classify.projection import call_columns
from perfdoctor.load.labels import DOMAIN, any_message, message_codes
from perfdoctor.model import Timeline
from perfdoctor.quantiles import median
from perfdoctor.table import Table

# Framework ranges that span one iteration: Megatron-Bridge (nvtx_range_push(suffix=f"training_step_{step}"),
# text "<module>.<function>.training_step_<n>"), Lightning's profiler action (NeMo 1/2 train through it).
FRAMEWORK_STEP = re.compile(r"^(.*\.)?training_step_\d+$|^run_training_batch$")
# Names a program gives to work that is not an iteration: model construction, setup, warm-up.
NOT_ITERATION = re.compile(r"(?i)(^|[^a-z])(warm[-_ ]?up|init|setup|build_model|load_model|compile)")
# Operator ranges (emit_nvtx's "aten::mm, seq = 5, op_id = 9", Kineto's cpu_op "aten::mm"): the framework's
# calls, nested under whatever the program marks; a repeating operator is no iteration.
OP_RANGE = re.compile(r"^[\w.]+::|, (seq|op_id) = \d")
# Domains whose ranges are some library's, never the program's iteration structure.
FOREIGN_DOMAINS = {"NCCL", DOMAIN}
# A period is stable when every anchor-to-anchor interval lies within this factor of their median.
PERIOD_SPREAD = 2.0
# The iterations must hold at least this share of the level's GPU work (outside init / warm-up ranges).
MIN_WORK_SHARE = 0.5
MAX_LEVELS = 8
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True)
class RangeSteps:
    starts: np.ndarray
    ends: np.ndarray
    label: str  # the range name the steps come from (digits shown as #)
    excluded: tuple[str, ...]  # ranges before the first step (init, warm-up), in order


def framework_steps(nvtx: Table) -> RangeSteps | None:
    """Steps from a framework's per-iteration ranges (any thread; overlapping repeats dropped)."""
    if not len(nvtx) or not any_message(nvtx, FRAMEWORK_STEP):  # one scan of all messages rules most out
        return None
    codes, uniques = message_codes(nvtx)
    hit = np.array([isinstance(t, str) and bool(FRAMEWORK_STEP.match(t)) for t in uniques] + [False])
    rows = np.flatnonzero(hit[codes] & (nvtx.col("end") >= 0))
    if not rows.size:
        return None
    start, end = nvtx.col("start")[rows], nvtx.col("end")[rows]
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    keep = np.ones(start.size, dtype=bool)
    keep[1:] = start[1:] >= np.maximum.accumulate(end)[:-1]
    label = _DIGITS.sub("#", str(uniques[codes[rows[order[0]]]]))
    return RangeSteps(start[keep], end[keep], label, ())


def repeating_steps(tl: Timeline) -> RangeSteps | None:
    """Steps from the launching thread's own repeating ranges (module docstring); None when none qualify."""
    if not len(tl.nvtx):
        return None
    work_t, work_w, work_tid = _work(tl)
    ranges = _thread_ranges(tl, _launching_thread(work_tid))
    if ranges is None or not work_t.size:
        return None
    start, end, name = ranges
    cum = np.concatenate([[0.0], np.cumsum(work_w)])

    def work(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        return cum[np.searchsorted(work_t, hi, side="left")] - cum[np.searchsorted(work_t, lo, side="left")]

    names, inverse = np.unique(name, return_inverse=True)
    not_iter = np.array([bool(NOT_ITERATION.search(n)) for n in names], dtype=bool)[inverse]
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    excluded: list[str] = []
    for _ in range(MAX_LEVELS):
        level = _top_level(start, end, lo, hi)
        if not level.size:
            return None
        found = _repeating(start[level], end[level], name[level], not_iter[level], hi, work)
        if found is not None:
            s, e, label = found
            excluded += name[level][end[level] <= s[0]].tolist()
            return RangeSteps(s, e, label, tuple(dict.fromkeys(excluded)))
        useful = level[~not_iter[level]]
        if not useful.size:
            return None
        w = work(start[useful], end[useful])
        if w.max() <= 0:
            return None
        child = useful[int(np.argmax(w))]
        excluded += name[level][end[level] <= start[child]].tolist()
        lo, hi = start[child], end[child]
    return None


def _repeating(start: np.ndarray, end: np.ndarray, name: np.ndarray, not_iter: np.ndarray, hi: int,
               work: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> tuple[np.ndarray, np.ndarray, str] | None:
    """The steps one level's repeating names define, or None: candidates by count (most first), then by
    first occurrence; the first with a stable period whose steps hold most of the level's work wins.
    ``hi`` ends the enclosing range (the level's work runs up to it)."""
    names, first, counts = np.unique(name, return_index=True, return_counts=True)
    repeats = (counts >= 2) & ~np.array([bool(NOT_ITERATION.search(n)) for n in names], dtype=bool)
    if not repeats.any():
        return None
    iterating = np.isin(name, names[repeats])
    # The level's work: launched from its first range that is not init / warm-up to the end of the enclosing
    # range (between and after its ranges too), less what init / warm-up ranges in that span launched.
    lo = start[~not_iter].min()
    later = not_iter & (start >= lo)
    level_work = work(np.array([lo]), np.array([hi]))[0] - work(start[later], end[later]).sum()
    for j in sorted(np.flatnonzero(repeats), key=lambda j: (-counts[j], first[j])):
        anchor = np.flatnonzero(name == names[j])
        s = start[anchor]
        last_end = end[iterating & (start >= s[-1])].max()
        e = np.append(s[1:], last_end)
        period = np.diff(s) if s.size > 2 else e - s
        med = median(period)
        if med <= 0 or period.max() > PERIOD_SPREAD * med or period.min() < med / PERIOD_SPREAD:
            continue
        if level_work > 0 and work(s, e).sum() < MIN_WORK_SHARE * level_work:
            continue
        return s.astype(np.int64), e.astype(np.int64), str(names[j])
    return None


def _top_level(start: np.ndarray, end: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Positions of the ranges inside [lo, hi] that no other range inside it encloses (ranges sorted by
    start, longest first on ties), excluding the enclosing range itself."""
    inside = np.flatnonzero((start >= lo) & (end <= hi) & ~((start == lo) & (end == hi)))
    if not inside.size:
        return inside
    e = end[inside]
    top = np.ones(inside.size, dtype=bool)
    top[1:] = start[inside][1:] >= np.maximum.accumulate(e)[:-1]
    return inside[top]


def _thread_ranges(tl: Timeline, tid: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The program's ranges on thread ``tid`` (None: any), as start, end, folded name; sorted by start,
    longest first on ties."""
    nvtx = tl.nvtx
    if not len(nvtx):
        return None
    codes, uniques = message_codes(nvtx)
    program = np.array([isinstance(t, str) and not OP_RANGE.search(t) for t in uniques] + [False])
    ok = (nvtx.col("end") >= nvtx.col("start")) & program[codes]
    if "domain" in nvtx.columns:  # a domain is text or None: compared as it is, not made text row by row
        domain = nvtx.col("domain", dtype=object)
        for name in FOREIGN_DOMAINS:
            ok &= domain != name
    if tid is not None:
        ok &= nvtx.col("tid") == tid
    rows = np.flatnonzero(ok)
    if rows.size < 2:
        return None
    start, end = nvtx.col("start")[rows], nvtx.col("end")[rows]
    order = np.lexsort((-(end - start), start))
    # Only the program's own messages are folded: operator ranges are most distinct messages (one per seq).
    folded = np.full(len(uniques) + 1, "", dtype=object)
    mine = np.flatnonzero(program)
    folded[mine] = [_DIGITS.sub("#", uniques[j]) for j in mine.tolist()]
    return start[order], end[order], folded[codes[rows[order]]]


def _launching_thread(tids: np.ndarray) -> int | None:
    """The thread that launched the most device work (None when no launch call is known)."""
    tids = tids[tids >= 0]
    if not tids.size:
        return None
    values, counts = np.unique(tids, return_counts=True)
    return int(values[np.argmax(counts)])


def _work(tl: Timeline) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Device work (kernels, copies, fills) by the time its launch call began (the op's own start where no
    call is known), sorted by that time: times, durations (ns) and the launching threads (−1: unknown)."""
    times, weights, tids = [], [], []
    for table in (tl.kernels, tl.memcpy, tl.memset):
        if not len(table):
            continue
        call, tid = call_columns(table.col("correlation_id"), tl.api, ("start", "tid"))
        times.append(np.where(call >= 0, call, table.col("start")))
        weights.append((table.col("end") - table.col("start")).astype(np.float64))
        tids.append(tid)
    if not times:
        return np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64)
    t, w = np.concatenate(times), np.concatenate(weights)
    order = np.argsort(t, kind="stable")
    return t[order], w[order], np.concatenate(tids)
