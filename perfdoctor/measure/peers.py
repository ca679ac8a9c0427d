"""Who made whom wait: collective instances matched across ranks (DESIGN §3 "Waiting for a peer vs
transfer" and "Straggler").

An instance is matched across the members of its communicator by (group, communicator, stream place,
sequence number) — see :mod:`perfdoctor.measure.collectives`. Members come from the NCCL communicator
id when the trace has NCCL payloads, else from the parallel config and Megatron's rank order
tp-cp-dp-pp, else every analysed rank that has the group is assumed to be one communicator.

Clocks: each rank's times are put on the UTC session clock of its file, then shifted by the median
offset that makes its matched collectives end together with the other members (NCCL collectives end
within microseconds on every member); what remains is reported as the residual.

Then nothing moves before the last member arrives: the part of each member's kernel before the last
arrival is *wait* (caused by the late rank), the rest *transfer*. A rank's exposed comm of a group
splits in the same proportion as its exposed time inside and outside its wait intervals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perfdoctor.classify.groups import GROUPS
from perfdoctor.measure import grouped
from perfdoctor.measure import intervals as iv
from perfdoctor.measure.collectives import Collectives
from perfdoctor.measure.host import CAUSES
from perfdoctor.quantiles import median
from perfdoctor.table import distinct

NS_PER_MS = 1e6
# Below this share of a rank's instances of a group matched with every peer, its split is unknown.
MIN_MATCHED = 0.9
# Parallel dims in Megatron's default rank order (fastest first) and the group each one forms.
RANK_ORDER = ("tp", "cp", "dp", "pp")
# Parts of the interval before an arrival that can make a rank late (DESIGN §3 "Straggler").
CAUSE_PARTS = ("compute", *(f"host.{c}" for c in CAUSES), "other_comm")
CHAIN_MAX = 8
# An instance: the same collective on every member of its communicator (module docstring).
KEYS = ("g", "c", "members", "stream", "seq")


@dataclass
class Straggler:
    """The rank the others wait for, how long, and why (compared with the median member)."""

    rank: int
    late_ms: float  # median per step of the others' wait it caused
    group: str  # the group whose members waited most
    cause: str  # one of CAUSE_PARTS
    excess_ms: dict[str, float]  # per cause part: ms per step more than the median member, before late arrivals
    host_call: dict[str, Any] | None  # longest CUDA API call in those intervals: {"name", "ms_per_step"}
    waits_on: list[int] = field(default_factory=list)  # chain of ranks it itself waited for (other groups)


@dataclass
class PeerWaits:
    """Per rank (str keys, as in the report's metrics) and group: exposed wait/transfer ms per step
    (None when peers are missing); who waited for whom; the clock alignment; the straggler."""

    metrics: dict[str, dict[str, float | None]]
    evidence: dict[str, dict[str, Any]]
    late_ms: dict[str, float]  # per rank: median per step of the others' wait it caused
    clock_residual_us: float | None
    straggler: Straggler | None
    # Per rank, its matched instances: ``i`` (index into its Collectives), ``wait`` (ns from its kernel's
    # start until the last member arrived), ``late`` (that member) and ``late_i`` (the instance's index in
    # the late member's Collectives) — what the critical path's join needs (perfdoctor.blame.join).
    instances: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    # Per rank, the ns that put its own clock on the run's aligned one: its file's session start plus the
    # alignment offset (a time t of rank r is t + clock[r] there).
    clock: dict[int, int] = field(default_factory=dict)
    # Every wait of a rank for a later member (columns: rank, g, start = its arrival, wait ns, late rank,
    # late_start = the late member's arrival), on the aligned clock: the Perfetto timeline's arrows.
    waited: dict[str, np.ndarray] = field(default_factory=dict)


def match(cols: Mapping[int, Collectives], exposed_ms: dict[int, dict[str, float | None]],
          config: dict[str, Any], world: int | None) -> PeerWaits:
    """Match every rank's collective instances with its peers and split waits from transfers."""
    frame = _instances(cols, config, world)
    if frame is None:
        return PeerWaits({}, {}, {}, None, None)
    # Of the complete instances, the columns read from here on; of all, those the totals need: the rest of
    # the table is not held beside them.
    done = {k: frame[k][frame["complete"]] for k in ("rank", "g", "i", "instance", "start", "end")}
    frame = {k: frame[k] for k in ("rank", "g", "complete")}
    instances = grouped.groups(done["instance"])  # a whole instance is complete or not
    done["instance"] = instances.codes
    offsets, residual = _align(done, instances, cols)
    shift = _of_rank(offsets, done["rank"])
    done["a_start"], done["a_end"] = done["start"] + shift, done["end"] + shift
    winner = instances.first_max(done["a_start"])  # the last to arrive; on ties the first in frame order
    last = done["a_start"][winner][instances.codes]
    done["wait"] = np.clip(np.minimum(done["a_end"], last) - done["a_start"], 0, None)
    done["late"] = done["rank"][winner][instances.codes]
    done["late_i"] = done["i"][winner][instances.codes]

    metrics: dict[str, dict[str, float | None]] = {str(rank): {} for rank in cols}
    evidence: dict[str, dict[str, Any]] = {}
    totals = grouped.groups(frame["rank"], frame["g"])
    matched = grouped.Groups(totals.codes[frame["complete"]], totals.n)  # may be empty: only rows() used
    # Per (rank, group, late rank) the wait it caused, each (rank, group)'s late ranks together.
    others = np.flatnonzero(done["late"] != done["rank"])
    by_late = grouped.groups(matched.codes[others], done["late"][others])
    waited_sum, waited_for = by_late.sum(done["wait"][others]), by_late.first(done["late"][others])
    bounds = np.searchsorted(by_late.first(matched.codes[others]), np.arange(totals.n + 1))
    for j, (rank, g, total) in enumerate(zip(totals.first(frame["rank"]).tolist(),
                                             totals.first(frame["g"]).tolist(), totals.size.tolist())):
        c, name, out = cols[rank], GROUPS[g], metrics[str(rank)]
        ok = matched.rows(j)
        exposed = exposed_ms.get(rank, {}).get(name)
        if len(ok) / total < MIN_MATCHED or exposed is None:
            out[f"comm.{name}.exposed_wait_ms"] = out[f"comm.{name}.exposed_transfer_ms"] = None
            continue
        share = _wait_share(c, name, done["i"][ok], done["wait"][ok])
        out[f"comm.{name}.exposed_wait_ms"] = exposed * share
        out[f"comm.{name}.exposed_transfer_ms"] = exposed * (1 - share)
        mine = slice(bounds[j], bounds[j + 1])
        waited = waited_sum[mine] / max(len(c.step_starts), 1) / NS_PER_MS
        evidence.setdefault(str(rank), {})[name] = {
            "exposed_wait_ms": out[f"comm.{name}.exposed_wait_ms"],
            "exposed_transfer_ms": out[f"comm.{name}.exposed_transfer_ms"],
            "waited_for_ms": {str(r): round(ms, 3) for r, ms in zip(waited_for[mine].tolist(), waited.tolist())
                              if ms > 0},
            "matched": len(ok), "instances": total}
    late = _late_per_rank(done, cols)
    per_rank = {rank: {k: done[k][done["rank"] == rank] for k in ("i", "wait", "late", "late_i")} for rank in cols}
    clock = {rank: (c.session_start_utc_ns or 0) + offsets.get(rank, 0) for rank, c in cols.items()}
    rows = np.flatnonzero((done["late"] != done["rank"]) & (done["wait"] > 0))
    waited = {"rank": done["rank"][rows], "g": done["g"][rows], "start": done["a_start"][rows],
              "wait": done["wait"][rows], "late": done["late"][rows], "late_start": last[rows]}
    return PeerWaits(metrics, evidence, {str(r): v for r, v in late.items()},
                     None if residual is None else residual / 1e3, _straggler(done, cols, late),
                     instances=per_rank, clock=clock, waited=waited)


def _of_rank(per_rank: dict[int, int], ranks: np.ndarray) -> np.ndarray:
    """``per_rank`` looked up for every row's rank (every rank is a key)."""
    keys = np.array(sorted(per_rank), dtype=np.int64)
    values = np.array([per_rank[k] for k in keys.tolist()], dtype=np.int64)
    return values[np.searchsorted(keys, ranks)]


def _instances(cols: Mapping[int, Collectives], config: dict[str, Any],
               world: int | None) -> dict[str, np.ndarray] | None:
    """All ranks' instances in one table (column → array; ranks in ``cols`` order, each rank's in its
    order), with each one's communicator members, instance (group code of the matching key) and whether
    every member's instance is present; None when no rank has one."""
    # Only the matching columns of each rank, one rank at a time (``cols`` may unpack them on demand:
    # perfdoctor.measure.collectives.Unpacked).
    ranks, parts = [], []
    for rank, c in cols.items():
        if len(c):
            ranks.append(rank)
            session = c.session_start_utc_ns or 0
            parts.append((c.group, c.comm, c.stream, c.seq, c.start + session, c.end + session))
    if not parts:
        return None
    group, comm, stream, seq, start, end = (list(column) for column in zip(*parts))
    del parts
    # Communicators as codes in the order of their ids (few per rank: no sort of every instance's id).
    comm_ids = distinct(np.concatenate([distinct(c) for c in comm]))
    frame = {"rank": np.repeat(np.array(ranks, dtype=np.int64), [len(g) for g in group]),
             "g": np.concatenate(group), "c": np.concatenate([np.searchsorted(comm_ids, c) for c in comm]),
             "stream": np.concatenate(stream), "seq": np.concatenate(seq), "start": np.concatenate(start),
             "end": np.concatenate(end), "i": np.concatenate([np.arange(len(g)) for g in group])}
    del group, comm, stream, seq, start, end  # each rank's copy, not held beside the whole table
    # The (rank, group, communicator) pairs, in order of first appearance.
    by_pair = grouped.groups(frame["rank"], frame["g"], frame["c"])
    appearance = np.argsort(by_pair.order[by_pair.starts], kind="stable")
    pairs = list(zip(by_pair.first(frame["rank"])[appearance].tolist(), by_pair.first(frame["g"])[appearance].tolist(),
                     comm_ids[by_pair.first(frame["c"])[appearance]].tolist()))
    with_group: dict[int, set[int]] = {}
    by_comm: dict[int, list[int]] = {}
    for rank, g, comm in pairs:
        with_group.setdefault(g, set()).add(rank)
        if comm != 0:
            by_comm.setdefault(comm, []).append(rank)
    member_ids: dict[tuple[int, ...], int] = {}
    of_pair = np.zeros(by_pair.n, dtype=np.int64)
    for j, (rank, g, comm) in zip(appearance.tolist(), pairs):
        members = tuple(sorted(by_comm[comm])) if comm != 0 else \
            _members(rank, GROUPS[g], config, world, sorted(with_group[g]))
        of_pair[j] = member_ids.setdefault(members, len(member_ids))
    frame["members"] = of_pair[by_pair.codes]
    size = np.array([len(m) for m in member_ids], dtype=np.int64)[frame["members"]]
    instances = grouped.groups(*(frame[k] for k in KEYS))
    frame["instance"] = instances.codes
    count = instances.size[instances.codes]
    # Pipeline sends and receives pair neighbouring stages, not the whole PP group: by order they match
    # only where the group is two stages.
    p2p_wide = (frame["g"] == GROUPS.index("pp")) & (size > 2)
    frame["complete"] = (count == size) & (count >= 2) & ~p2p_wide
    return frame


def _members(rank: int, group: str, config: dict[str, Any], world: int | None,
             with_group: list[int]) -> tuple[int, ...]:
    """Ranks of ``rank``'s communicator of ``group`` in Megatron's rank order; every analysed rank with
    that group when the config does not say."""
    sizes = {d: config.get(d) or (1 if d in ("tp", "cp", "pp") else None) for d in RANK_ORDER}
    if sizes["dp"] is None and world:
        rest = sizes["tp"] * sizes["cp"] * sizes["pp"]
        sizes["dp"] = world // rest if world % rest == 0 else None
    if group not in RANK_ORDER or sizes["dp"] is None:
        return tuple(with_group)
    # Gradients reduce over data and context parallel ranks together (Megatron's DP-with-CP group).
    first = "cp" if group == "dp" else group
    stride = int(np.prod([sizes[d] for d in RANK_ORDER[:RANK_ORDER.index(first)]]))
    size = sizes["cp"] * sizes["dp"] if group == "dp" else sizes[group]
    base = rank - ((rank // stride) % size) * stride
    return tuple(base + i * stride for i in range(size))


def _align(matched: dict[str, np.ndarray], instances: grouped.Groups,
           cols: Mapping[int, Collectives]) -> tuple[dict[int, int], float | None]:
    """Per rank, the ns to add so matched collectives end together (median over its instances), and the
    median remaining distance of a member's end from its instance's median end."""
    offsets = {r: 0 for r in cols}
    if not matched["rank"].size:
        return offsets, None
    by_rank = grouped.groups(matched["rank"])
    # Relative to the earliest end: medians are taken in float64, which on UTC nanoseconds (~1.7e18)
    # would round every offset and the residual to 256 ns.
    end = matched["end"].astype(np.int64)
    end = end - end.min()
    for _ in range(2):
        shifted = end + _of_rank(offsets, matched["rank"])
        target = instances.median(shifted)[instances.codes]
        delta = by_rank.median(target - shifted)
        for r, d in zip(by_rank.first(matched["rank"]).tolist(), delta.tolist()):
            offsets[r] += int(round(d))
    shifted = end + _of_rank(offsets, matched["rank"])
    target = instances.median(shifted)[instances.codes]
    return offsets, float(median(np.abs(shifted - target)))


def _wait_share(c: Collectives, group: str, i: np.ndarray, wait: np.ndarray) -> float:
    """Share of the rank's exposed comm of ``group`` (within its steps) that lies in its wait intervals
    (instances ``i`` of the rank, each waiting ``wait`` ns from its start)."""
    exposed = c.exposed.get(group, iv.EMPTY)
    if not len(c.step_starts):
        return 0.0
    exposed = iv.clip(exposed, int(c.step_starts[0]), int(c.step_ends[-1]))
    total = iv.measure(exposed)
    if not total:
        return 0.0
    waits = iv.union(c.start[i], c.start[i] + wait.astype(np.int64))
    return iv.measure(iv.intersect(exposed, waits)) / total


def _step_of(c: Collectives, t: np.ndarray) -> np.ndarray:
    return np.clip(np.searchsorted(c.step_starts, t, side="right") - 1, 0, max(len(c.step_starts) - 1, 0))


def _late_per_rank(done: dict[str, np.ndarray], cols: Mapping[int, Collectives]) -> dict[int, float]:
    """Per rank, the median over its steps of the others' wait it caused (per instance, the median over
    the members that waited)."""
    others = np.flatnonzero(done["rank"] != done["late"])
    by_instance = grouped.groups(done["instance"][others])
    middle = by_instance.median(done["wait"][others])
    # Per row, the median wait of its instance's waiting members (0 for an instance where none waited).
    waited = np.append(middle, 0.0)[_find(by_instance.first(done["instance"][others]), done["instance"])]
    own = np.flatnonzero(done["rank"] == done["late"])
    by_rank = grouped.groups(done["rank"][own])
    rows = dict(zip(by_rank.first(done["rank"][own]).tolist(), range(by_rank.n)))
    out = {}
    for rank, c in cols.items():
        n = len(c.step_starts)
        if not n:
            continue
        mine = own[by_rank.rows(rows[rank])] if rank in rows else own[:0]
        per_step = np.bincount(_step_of(c, c.start[done["i"][mine]]), weights=waited[mine], minlength=n)
        out[rank] = float(median(per_step)) / NS_PER_MS
    return out


def _find(keys: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Position of each of ``at`` in the sorted unique ``keys``; −1 where it is not there."""
    pos = np.searchsorted(keys, at)
    hit = pos < keys.size
    hit[hit] = keys[pos[hit]] == at[hit]
    return np.where(hit, pos, -1)


def arrival_context(c: Collectives, i: np.ndarray) -> np.ndarray:
    """Per instance (rows), the parts of CAUSE_PARTS (columns) of the interval before the arrival, in ns."""
    return np.column_stack([c.before_compute[i], *(c.before_idle[x][i] for x in CAUSES), c.before_other_comm[i]])


def _straggler(done: dict[str, np.ndarray], cols: Mapping[int, Collectives],
               late: dict[int, float]) -> Straggler | None:
    """The rank that caused the most wait, and why: its interval before each late arrival against the
    median of the members that waited for it, summed per step."""
    caused = (done["rank"] != done["late"]) & (done["wait"] > 0)
    if not caused.any():
        return None
    # Waits at pipeline sends/receives are mostly the schedule's bubble: a straggler of the other groups
    # comes first; a pipeline stage is the straggler only when no other group waits.
    synchronous = caused & (done["g"] != GROUPS.index("pp"))
    caused = np.flatnonzero(synchronous if synchronous.any() else caused)
    rank = _most_waited_for(done, caused)
    late_rows = caused[done["late"][caused] == rank]
    by_group = grouped.groups(done["g"][late_rows])
    group = GROUPS[int(by_group.first(done["g"][late_rows])[np.argmax(by_group.sum(done["wait"][late_rows]))])]
    c = cols[rank]
    context = np.zeros((late_rows.size, len(CAUSE_PARTS)), dtype=np.int64)
    by_rank = grouped.groups(done["rank"][late_rows])
    for j, r in enumerate(by_rank.first(done["rank"][late_rows]).tolist()):
        rows = by_rank.rows(j)
        context[rows] = arrival_context(cols[r], done["i"][late_rows[rows]])
    by_instance = grouped.groups(done["instance"][late_rows])
    instances = by_instance.first(done["instance"][late_rows])
    middle = np.column_stack([by_instance.median(context[:, k]) for k in range(len(CAUSE_PARTS))])
    first = by_instance.min(done["a_start"][late_rows])
    own = np.flatnonzero(done["rank"] == rank)
    pos = _find(instances, done["instance"][own])  # its own rows of the instances where others waited
    own, pos = own[pos >= 0], pos[pos >= 0]
    i = done["i"][own]
    excess = (arrival_context(c, i) - middle[pos]).sum(axis=0)
    # What its CPU did while the others waited (first arrival → its own), on its own clock.
    shift = done["a_start"][own] - c.start[i]
    calls: dict[str, float] = {}
    for lo, hi in zip(first[pos] - shift, c.start[i]):
        for name, ns in _calls_in(c, int(lo), int(hi)).items():
            calls[name] = calls.get(name, 0.0) + ns
    steps = max(len(c.step_starts), 1)
    excess_ms = {p: round(float(v) / steps / NS_PER_MS, 3) for p, v in zip(CAUSE_PARTS, excess)}
    cause = max(excess_ms, key=excess_ms.get)
    call = max(calls, key=calls.get) if calls else None
    host_call = {"name": call, "ms_per_step": round(calls[call] / steps / NS_PER_MS, 3)} if call else None
    return Straggler(rank, late.get(rank, 0.0), group, cause, excess_ms, host_call,
                     _chain(done, rank, group) if cause == "other_comm" else [])


def _most_waited_for(done: dict[str, np.ndarray], rows: np.ndarray) -> int:
    """The rank the ``rows`` waited longest for in total (the lowest rank on ties)."""
    by_late = grouped.groups(done["late"][rows])
    return int(by_late.first(done["late"][rows])[np.argmax(by_late.sum(done["wait"][rows]))])


def _chain(done: dict[str, np.ndarray], rank: int, group: str) -> list[int]:
    """Follow who ``rank`` itself waited for in groups other than ``group``, rank after rank."""
    chain: list[int] = []
    current, skip = rank, GROUPS.index(group)
    while len(chain) < CHAIN_MAX:
        waited = np.flatnonzero((done["rank"] == current) & (done["late"] != current) & (done["g"] != skip)
                                & (done["wait"] > 0))
        if not waited.size:
            break
        nxt = _most_waited_for(done, waited)
        if nxt in chain or nxt == rank:
            break
        chain.append(nxt)
        current = nxt
    return chain


def _calls_in(c: Collectives, lo: int, hi: int) -> dict[str, float]:
    """ns of each long CUDA API call name inside [lo, hi)."""
    s, e, names = c.long_calls
    overlap = np.minimum(e, hi) - np.maximum(s, lo)
    out: dict[str, float] = {}
    for j in np.flatnonzero(overlap > 0):
        out[names[j]] = out.get(names[j], 0.0) + float(overlap[j])
    return out
