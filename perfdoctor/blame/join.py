"""The ranks' critical paths joined at the collective rendezvous (DESIGN §3 "Waiting for a peer").

A collective ends no earlier than its last member arrived plus its transfer: on a rank's path, the part of
a collective kernel before the last member arrived is ``wait.rank`` (``pipeline.wait`` for a pipeline
send/receive: waiting for the producing stage), the rest stays the group's transfer. The late member and
what it did before it arrived (compute, host time by cause, other groups' comm) name the wait. With the
schedule known (pp, micro-batches), a stage's pipeline wait splits into the schedule's own warm-up and
cool-down (``pipeline.theory``, at most (p−1)/(v·m+p−1) of the step) and the rest (``pipeline.imbalance``).

Then the per-rank ``blocking.*`` metrics (the representative step's causes, in ms, summing to it) and the
report's ``path`` (the representative step's segments, adjacent ones of one cause merged, the longest
:data:`MAX_PATH` kept in time order).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping
from functools import lru_cache
from itertools import accumulate
from typing import Any

import numpy as np

from perfdoctor.blame.causes import BLOCKING_KEYS, CAUSES, CODE, FOCUS, metric_key, whatif_key
from perfdoctor.blame.entries import PathEntries
from perfdoctor.blame.path import RankPath
from perfdoctor.classify.groups import GROUPS
from perfdoctor.measure.collectives import Collectives
from perfdoctor.measure.peers import CAUSE_PARTS, arrival_context
from perfdoctor.quantiles import median
from perfdoctor.width import widened

NS_PER_MS = 1e6
MAX_PATH = 64
# Ranks whose whole path join keeps at once while following waits across ranks (see join).
ACROSS_CACHE = 64
WAIT = CODE["wait.rank"]
P2P, PP_WAIT = CODE["pipeline.p2p"], CODE["pipeline.wait"]


def join(paths: Mapping[int, RankPath], cols: Mapping[int, Collectives], instances: dict[int, dict[str, np.ndarray]],
         theory: float | None, clock: dict[int, int] | None = None
         ) -> tuple[dict[str, dict[str, Any]], PathEntries]:
    """Per rank (str keys) its ``blocking.*`` metrics and its ``path`` entries (as columns); with the ranks' clocks
    (perfdoctor.measure.peers.PeerWaits.clock) a wait for a rank on the same step is followed onto it."""
    metrics: dict[str, dict[str, Any]] = {}
    shares: dict[int, float | None] = {}
    for rank, rp in paths.items():
        by_cause = rp.by_cause.copy()
        waits = _waits(rank, cols, instances)
        if waits is not None and rp.comm_step.size:
            wait_ns, start = waits[0], waits[1]
            ci = rp.comm_instance
            known = ci >= 0
            w = np.where(known, wait_ns[np.maximum(ci, 0)], 0)
            ks = np.where(known, start[np.maximum(ci, 0)], 0)
            moved = np.clip(np.minimum(rp.comm_end, ks + w) - np.maximum(rp.comm_start, ks), 0, None)
            cause = rp.comm_cause
            np.add.at(by_cause, (rp.comm_step, cause), -moved)
            np.add.at(by_cause, (rp.comm_step, np.where(cause == P2P, PP_WAIT, WAIT)), moved)
        share = None
        if theory is not None:
            pp_wait = by_cause[:, PP_WAIT].copy()
            expected = np.minimum(pp_wait, theory * rp.durations)
            by_cause[:, CODE["pipeline.theory"]] += expected
            by_cause[:, CODE["pipeline.imbalance"]] += pp_wait - expected
            by_cause[:, PP_WAIT] = 0
            if len(rp.durations) and pp_wait[rp.representative] > 0:
                share = float(expected[rp.representative] / pp_wait[rp.representative])
        blocking = _metrics(by_cause, rp)
        metrics[str(rank)] = blocking | _savings(by_cause[rp.representative], rp, blocking)
        shares[rank] = share

    # A rank's whole path (hundreds of entries before bounding) is built when needed and bounded at once:
    # holding every rank's for the walk across ranks grew the peak by ~120 MB at 1,024 ranks; the few
    # ranks others waited for are kept a while (ranks wait for the same late ones). Its waits are found
    # again then: held from the loop above, every rank's were ~4 KB a rank more at the peak.
    @lru_cache(maxsize=ACROSS_CACHE)
    def entries_of(rank: int) -> list[dict[str, Any]]:
        return _split_pipeline_wait(_entries(rank, paths[rank], cols, _waits(rank, cols, instances)), shares[rank])

    out = PathEntries()
    for rank in paths:
        out.add(str(rank), _bounded(_across(rank, entries_of(rank), entries_of, paths, clock) if clock
                                    else entries_of(rank)))
    return metrics, out


def _split_pipeline_wait(entries: list[dict[str, Any]], share: float | None) -> list[dict[str, Any]]:
    """With the schedule known, each ``pipeline.wait`` entry of the path becomes ``pipeline.theory`` (its
    first ``share``: the schedule's own warm-up and cool-down, in the proportion the step's metrics give
    them) and ``pipeline.imbalance`` (the rest), so the path names what the metrics name."""
    if share is None:
        return entries
    out = []
    for e in entries:
        if e["cause"] != "pipeline.wait":
            out.append(e)
            continue
        cut = e["start_ns"] + round(share * (e["end_ns"] - e["start_ns"]))
        if cut > e["start_ns"]:
            out.append(e | {"end_ns": cut, "cause": "pipeline.theory"})
        if e["end_ns"] > cut:
            out.append(e | {"start_ns": cut, "cause": "pipeline.imbalance"})
    return out


def _across(rank: int, entries: list[dict[str, Any]], entries_of: Callable[[int], list[dict[str, Any]]],
            paths: Mapping[int, RankPath], clock: dict[int, int]) -> list[dict[str, Any]]:
    """The path across ranks: while ``rank`` waited for rank R at a collective (on the same step), the
    critical path is R's — R's own entries in that interval, on ``rank``'s clock and marked with R (one
    level: where R itself waited, its entry names the rank it waited for); what R's path does not cover
    stays ``rank``'s wait."""
    out: list[dict[str, Any]] = []
    spans: dict[int, tuple[list[int], list[int], bool]] = {}
    for e in entries:
        late = e.get("late")
        if (late is None or late not in clock or rank not in clock or late not in paths
                or paths[late].representative != paths[rank].representative):
            out.append(e)
            continue
        theirs = entries_of(late)
        if late not in spans:  # to skip their entries that cannot overlap the wait without looking at each
            starts = [x["start_ns"] for x in theirs]
            ends_so_far = list(accumulate((x["end_ns"] for x in theirs), max))
            spans[late] = starts, ends_so_far, all(a <= b for a, b in zip(starts, starts[1:]))
        starts, ends_so_far, in_order = spans[late]
        shift = clock[rank] - clock[late]  # their time + clock[late] - clock[rank] is ours
        # before lo every entry ends by the wait's start; from hi on (starts in order) every one starts after its end
        lo = bisect_right(ends_so_far, e["start_ns"] + shift)
        hi = bisect_left(starts, e["end_ns"] + shift) if in_order else len(theirs)
        t = e["start_ns"]
        for x in theirs[lo:hi]:
            a, b = max(x["start_ns"] - shift, e["start_ns"]), min(x["end_ns"] - shift, e["end_ns"])
            if b <= a or x.get("rank") != late:
                continue
            if a > t:
                out.append(e | {"start_ns": t, "end_ns": a})
            out.append({k: v for k, v in x.items() if k != "late"} | {"start_ns": a, "end_ns": b})
            t = b
        if t < e["end_ns"]:
            out.append(e | {"start_ns": t})
    return out


def _bounded(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adjacent entries of one rank and cause merged, the longest MAX_PATH kept in time order, and the
    join's own bookkeeping dropped."""
    merged: list[dict[str, Any]] = []
    for entry in entries:
        entry = {k: v for k, v in entry.items() if k != "late"}
        last = merged[-1] if merged else None
        if (last is not None and last["cause"] == entry["cause"] and last["rank"] == entry["rank"]
                and last["end_ns"] == entry["start_ns"]):
            keep_what = (last["end_ns"] - last["start_ns"]) >= (entry["end_ns"] - entry["start_ns"])
            last.update(end_ns=entry["end_ns"], inferred=last["inferred"] or entry["inferred"],
                        what=last["what"] if keep_what else entry["what"])
        else:
            merged.append(dict(entry))
    if len(merged) > MAX_PATH:
        longest = sorted(range(len(merged)), key=lambda j: merged[j]["start_ns"] - merged[j]["end_ns"])[:MAX_PATH]
        merged = [merged[j] for j in sorted(longest)]
    return merged


def across(per_rank: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``all``: the median over ranks of each blocking metric (each its own median: they need not add up;
    every rank's do)."""
    out = {}
    for key in BLOCKING_KEYS:
        values = [m[key] for m in per_rank.values() if m.get(key) is not None]
        out[key] = float(median(values)) if values else None
    return out


def late_blocking(per_rank: dict[str, dict[str, Any]], slowest: int | None) -> float | None:
    """``ranks.late_blocking_ms``: the median over the ranks other than the slowest of their wait for a peer
    on the critical path (``blocking.wait_rank_ms``); None with one rank or no straggler named."""
    if slowest is None:
        return None
    values = [m["blocking.wait_rank_ms"] for r, m in per_rank.items()
              if r != str(slowest) and m.get("blocking.wait_rank_ms") is not None]
    return float(median(values)) if values else None


def _waits(rank: int, cols: Mapping[int, Collectives], instances: dict[int, dict[str, np.ndarray]]
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """Per collective instance of ``rank`` (index into its Collectives): the wait for the last member in
    ns (0 when it arrived last), its kernel start, the late rank and its own instance index (−1 when not
    known), and whether the wait is estimated. A pipeline send/receive that could not be matched with its
    peer (more than two stages: peers are neighbours, not the group) waited for as long as it lasted beyond
    the rank's shortest one (a transfer that did not wait); that estimate is marked inferred."""
    c, mine = cols.get(rank), instances.get(rank, {"i": np.zeros(0, dtype=np.int64)})
    if c is None or not len(c):
        return None
    n = len(c)
    wait, late, late_i = np.zeros(n, dtype=np.int64), np.full(n, -1), np.full(n, -1)
    estimated = np.zeros(n, dtype=bool)
    pp = np.flatnonzero(c.group == GROUPS.index("pp"))
    if pp.size:
        duration = c.end[pp] - c.start[pp]
        wait[pp] = duration - duration.min()
        estimated[pp] = True
    matched = mine["i"]
    wait[matched], estimated[matched] = 0, False
    others = mine["late"] != rank
    i = matched[others]
    wait[i], late[i], late_i[i] = mine["wait"][others], mine["late"][others], mine["late_i"][others]
    return wait, c.start, late, late_i, estimated


def _metrics(by_cause: np.ndarray, rp: RankPath) -> dict[str, Any]:
    """The causes of the median step in ms (every cause present, 0 when not on the path): of the middle
    step by duration, or the mean of the two middle ones, so they add up to ``step.time_ms`` (the median
    duration) but for the walk's own residual."""
    n = len(rp.durations)
    if not n:
        return {}
    middle = np.argsort(rp.durations, kind="stable")[(n - 1) // 2: n // 2 + 1]
    row = by_cause[middle].mean(axis=0)
    out: dict[str, Any] = {metric_key(c): round(float(row[j]) / NS_PER_MS, 6) for j, c in enumerate(CAUSES)}
    out["blocking.residual_ms"] = round((float(median(rp.durations)) - float(row.sum())) / NS_PER_MS, 6)
    focus = rp.focus[middle].mean(axis=0) if rp.focus.shape[0] == n else np.zeros(len(FOCUS))
    out |= {f"blocking.{f}_ms": round(float(focus[j]) / NS_PER_MS, 6) for j, f in enumerate(FOCUS)}
    return out


def _savings(row: np.ndarray, rp: RankPath, blocking: dict[str, Any]) -> dict[str, Any]:
    """``whatif.<cause>_ms``: ms the median step would lose without the cause, from the graph replayed
    (perfdoctor.blame.whatif), at most the cause's blocking time (in the replayed step and as reported);
    0 for a cause not on the path, None for one on less than WHATIF_SHARE of the step (not replayed)."""
    if not len(rp.durations):
        return {}
    out: dict[str, Any] = {}
    for j, cause in enumerate(CAUSES):
        if cause not in rp.saving:  # not replayed: nothing to save off the path, else unknown
            out[whatif_key(cause)] = 0.0 if row[j] <= 0 and not blocking[metric_key(cause)] else None
            continue
        saved = min(rp.saving[cause], max(float(row[j]), 0.0)) / NS_PER_MS
        out[whatif_key(cause)] = round(min(saved, blocking[metric_key(cause)]), 6)
    rep = rp.focus[rp.representative] if rp.focus.shape[0] == len(rp.durations) else np.zeros(len(FOCUS))
    for j, f in enumerate(FOCUS):  # the same for what the focus metrics weigh (perfdoctor.blame.focus)
        key = f"blocking.{f}_ms"
        if f not in rp.focus_saving:
            out[f"whatif.{f}_ms"] = 0.0 if rep[j] <= 0 and not blocking[key] else None
            continue
        saved = min(rp.focus_saving[f], float(rep[j])) / NS_PER_MS
        out[f"whatif.{f}_ms"] = round(min(saved, blocking[key]), 6)
    return out


def _entries(rank: int, rp: RankPath, cols: Mapping[int, Collectives], waits: tuple | None) -> list[dict[str, Any]]:
    """The representative step's path as report entries (see the module docstring)."""
    p = rp.path
    raw: list[dict[str, Any]] = []
    if not p:
        return raw
    names, r = p["names"], p["rows"]
    start = widened(p["base"], r["start"])
    end = start + r["length"]
    for s, e, code, what, inferred, ci in zip(start.tolist(), end.tolist(), r["cause"].tolist(),
                                              r["what"].tolist(), r["inferred"].tolist(), r["instance"].tolist()):
        cause = CAUSES[code]
        entry = {"start_ns": s, "end_ns": e, "rank": rank, "cause": cause, "what": names[what], "inferred": inferred}
        w = int(waits[0][ci]) if waits is not None and ci >= 0 and CODE[cause] in (P2P,) + _TRANSFER else 0
        if w > 0:
            ks = int(waits[1][ci])
            cut = min(max(ks + w, s), e)
            late, late_i = int(waits[2][ci]), int(waits[3][ci])
            waited = "pipeline.wait" if cause == "pipeline.p2p" else "wait.rank"
            who = f"rank {late}: {_doing(cols.get(late), late_i)}" if late >= 0 else "the neighbouring stage"
            if cut > s:
                raw.append(entry | {"end_ns": cut, "cause": waited, "what": who, "late": late if late >= 0 else None,
                                    "inferred": entry["inferred"] or bool(waits[4][ci])})
            if e > cut:
                raw.append(entry | {"start_ns": cut})
            continue
        raw.append(entry)
    return raw


_TRANSFER = tuple(CODE[c] for c in CAUSES if c.startswith("transfer."))


def _doing(c: Collectives | None, i: int) -> str:
    """What a late member did before it arrived: the largest part of CAUSE_PARTS."""
    if c is None or i < 0:
        return "arrived last"
    parts = arrival_context(c, np.array([i]))[0]
    part = CAUSE_PARTS[int(np.argmax(parts))]
    names = {"compute": "GPU compute", "other_comm": "communication of other groups"}
    return f"{names.get(part, part.replace('host.', 'host: '))} before it arrived"
