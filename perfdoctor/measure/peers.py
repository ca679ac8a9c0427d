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

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from perfdoctor.classify.groups import GROUPS
from perfdoctor.measure import intervals as iv
from perfdoctor.measure.collectives import Collectives
from perfdoctor.measure.host import CAUSES

NS_PER_MS = 1e6
# Below this share of a rank's instances of a group matched with every peer, its split is unknown.
MIN_MATCHED = 0.9
# Parallel dims in Megatron's default rank order (fastest first) and the group each one forms.
RANK_ORDER = ("tp", "cp", "dp", "pp")
# Parts of the interval before an arrival that can make a rank late (DESIGN §3 "Straggler").
CAUSE_PARTS = ("compute", *(f"host.{c}" for c in CAUSES), "other_comm")
CHAIN_MAX = 8


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


def match(cols: dict[int, Collectives], exposed_ms: dict[int, dict[str, float | None]],
          config: dict[str, Any], world: int | None) -> PeerWaits:
    """Match every rank's collective instances with its peers and split waits from transfers."""
    frame = _instances(cols, config, world)
    if frame.empty:
        return PeerWaits({}, {}, {}, None, None)
    matched = frame[frame["complete"]]
    offsets, residual = _align(matched, cols)
    frame["a_start"] = frame["start"] + frame["rank"].map(offsets).fillna(0).astype(np.int64)
    frame["a_end"] = frame["end"] + frame["rank"].map(offsets).fillna(0).astype(np.int64)
    keys = ["g", "c", "members", "stream", "seq"]
    done = frame[frame["complete"]].copy()
    last = done.groupby(keys)["a_start"].transform("max")
    done["wait"] = np.clip(np.minimum(done["a_end"], last) - done["a_start"], 0, None)
    winner = done.loc[done.groupby(keys)["a_start"].idxmax(), keys + ["rank"]].rename(columns={"rank": "late"})
    done = done.merge(winner, on=keys, how="left")

    metrics: dict[str, dict[str, float | None]] = {str(rank): {} for rank in cols}
    evidence: dict[str, dict[str, Any]] = {}
    totals = frame.groupby(["rank", "g"]).size()
    matched_rows = done.groupby(["rank", "g"]).indices
    for (rank, g), total in totals.items():
        c, name, out = cols[rank], GROUPS[g], metrics[str(rank)]
        ok = done.iloc[matched_rows.get((rank, g), [])]
        exposed = exposed_ms.get(rank, {}).get(name)
        if len(ok) / total < MIN_MATCHED or exposed is None:
            out[f"comm.{name}.exposed_wait_ms"] = out[f"comm.{name}.exposed_transfer_ms"] = None
            continue
        share = _wait_share(c, name, ok)
        out[f"comm.{name}.exposed_wait_ms"] = exposed * share
        out[f"comm.{name}.exposed_transfer_ms"] = exposed * (1 - share)
        waited = ok[ok["late"] != rank].groupby("late")["wait"].sum() / max(len(c.step_starts), 1) / NS_PER_MS
        evidence.setdefault(str(rank), {})[name] = {
            "exposed_wait_ms": out[f"comm.{name}.exposed_wait_ms"],
            "exposed_transfer_ms": out[f"comm.{name}.exposed_transfer_ms"],
            "waited_for_ms": {str(int(r)): round(float(ms), 3) for r, ms in waited.items() if ms > 0},
            "matched": len(ok), "instances": int(total)}
    late = _late_per_rank(done, cols)
    return PeerWaits(metrics, evidence, {str(r): v for r, v in late.items()},
                     None if residual is None else residual / 1e3, _straggler(done, cols, late))


def _instances(cols: dict[int, Collectives], config: dict[str, Any], world: int | None) -> pd.DataFrame:
    """All ranks' instances in one table, with each one's communicator members and whether every
    member's instance is present."""
    parts = []
    for rank, c in cols.items():
        if not len(c):
            continue
        shift = c.session_start_utc_ns or 0
        parts.append(pd.DataFrame({
            "rank": rank, "g": c.group, "c": c.comm, "stream": c.stream, "seq": c.seq,
            "start": c.start + shift, "end": c.end + shift, "i": np.arange(len(c))}))
    if not parts:
        return pd.DataFrame()
    frame = pd.concat(parts, ignore_index=True)
    with_group = {g: sorted(frame.loc[frame["g"] == g, "rank"].unique().tolist()) for g in frame["g"].unique()}
    member_ids: dict[tuple[int, ...], int] = {}
    sizes = {}
    pairs = frame[["rank", "g", "c"]].drop_duplicates().reset_index(drop=True)
    by_comm = pairs[pairs["c"] != 0].groupby("c")["rank"].apply(lambda s: tuple(sorted(s)))
    keys = []
    for rank, g, c in pairs.itertuples(index=False):
        members = by_comm[c] if c != 0 else _members(rank, GROUPS[g], config, world, with_group[g])
        keys.append(member_ids.setdefault(members, len(member_ids)))
        sizes[keys[-1]] = len(members)
    pairs["members"] = keys
    frame = frame.merge(pairs, on=["rank", "g", "c"], how="left")
    count = frame.groupby(["g", "c", "members", "stream", "seq"])["rank"].transform("size")
    # Pipeline sends and receives pair neighbouring stages, not the whole PP group: by order they match
    # only where the group is two stages.
    p2p_wide = (frame["g"] == GROUPS.index("pp")) & (frame["members"].map(sizes) > 2)
    frame["complete"] = (count == frame["members"].map(sizes)) & (count >= 2) & ~p2p_wide
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


def _align(matched: pd.DataFrame, cols: dict[int, Collectives]) -> tuple[dict[int, int], float | None]:
    """Per rank, the ns to add so matched collectives end together (median over its instances), and the
    median remaining distance of a member's end from its instance's median end."""
    offsets = {r: 0 for r in cols}
    if matched.empty:
        return offsets, None
    keys = ["g", "c", "members", "stream", "seq"]
    end = matched["end"].astype(np.int64)
    for _ in range(2):
        shifted = end + matched["rank"].map(offsets).astype(np.int64)
        target = shifted.groupby([matched[k] for k in keys]).transform("median")
        delta = (target - shifted).groupby(matched["rank"]).median()
        for r, d in delta.items():
            offsets[int(r)] += int(round(d))
    shifted = end + matched["rank"].map(offsets).astype(np.int64)
    target = shifted.groupby([matched[k] for k in keys]).transform("median")
    return offsets, float(np.median(np.abs(shifted - target)))


def _wait_share(c: Collectives, group: str, ok: pd.DataFrame) -> float:
    """Share of the rank's exposed comm of ``group`` (within its steps) that lies in its wait intervals."""
    exposed = c.exposed.get(group, iv.EMPTY)
    if not len(c.step_starts):
        return 0.0
    exposed = iv.clip(exposed, int(c.step_starts[0]), int(c.step_ends[-1]))
    total = iv.measure(exposed)
    if not total:
        return 0.0
    i = ok["i"].to_numpy()
    waits = iv.union(c.start[i], c.start[i] + ok["wait"].to_numpy(dtype=np.int64))
    return iv.measure(iv.intersect(exposed, waits)) / total


def _step_of(c: Collectives, t: np.ndarray) -> np.ndarray:
    return np.clip(np.searchsorted(c.step_starts, t, side="right") - 1, 0, max(len(c.step_starts) - 1, 0))


def _late_per_rank(done: pd.DataFrame, cols: dict[int, Collectives]) -> dict[int, float]:
    """Per rank, the median over its steps of the others' wait it caused (per instance, the median over
    the members that waited)."""
    keys = ["g", "c", "members", "stream", "seq"]
    waited = done[done["rank"] != done["late"]].groupby(keys)["wait"].median().rename("waited")
    own = done[done["rank"] == done["late"]].join(waited, on=keys)
    out = {}
    by_rank = own.groupby("rank").indices
    for rank, c in cols.items():
        n = len(c.step_starts)
        if not n:
            continue
        mine = own.iloc[by_rank.get(rank, [])]
        per_step = np.bincount(_step_of(c, c.start[mine["i"].to_numpy()]),
                               weights=mine["waited"].fillna(0).to_numpy(dtype=np.float64), minlength=n)
        out[rank] = float(np.median(per_step)) / NS_PER_MS
    return out


def _context(c: Collectives, i: np.ndarray) -> np.ndarray:
    """Per instance (rows), the parts of CAUSE_PARTS (columns) of the interval before the arrival, in ns."""
    return np.column_stack([c.before_compute[i], *(c.before_idle[x][i] for x in CAUSES), c.before_other_comm[i]])


def _straggler(done: pd.DataFrame, cols: dict[int, Collectives], late: dict[int, float]) -> Straggler | None:
    """The rank that caused the most wait, and why: its interval before each late arrival against the
    median of the members that waited for it, summed per step."""
    caused = done[(done["rank"] != done["late"]) & (done["wait"] > 0)]
    if caused.empty:
        return None
    # Waits at pipeline sends/receives are mostly the schedule's bubble: a straggler of the other groups
    # comes first; a pipeline stage is the straggler only when no other group waits.
    synchronous = caused[caused["g"] != GROUPS.index("pp")]
    caused = synchronous if not synchronous.empty else caused
    total = caused.groupby("late")["wait"].sum()
    rank = int(total.idxmax())
    keys = ["g", "c", "members", "stream", "seq"]
    late_rows = caused[caused["late"] == rank]
    group = GROUPS[int(late_rows.groupby("g")["wait"].sum().idxmax())]
    c = cols[rank]
    parts = [f"x{j}" for j in range(len(CAUSE_PARTS))]
    others = late_rows.copy()
    others[parts] = np.zeros((len(others), len(parts)))
    for r, rows in others.groupby("rank").groups.items():
        others.loc[rows, parts] = _context(cols[int(r)], others.loc[rows, "i"].to_numpy())
    median = others.groupby(keys)[parts].median()
    first = others.groupby(keys)["a_start"].min().rename("first")
    own = done[done["rank"] == rank].join(median, on=keys, how="inner").join(first, on=keys)
    i = own["i"].to_numpy()
    excess = (_context(c, i) - own[parts].to_numpy()).sum(axis=0)
    # What its CPU did while the others waited (first arrival → its own), on its own clock.
    shift = own["a_start"].to_numpy() - c.start[i]
    calls: dict[str, float] = {}
    for lo, hi in zip(own["first"].to_numpy() - shift, c.start[i]):
        for name, ns in _calls_in(c, int(lo), int(hi)).items():
            calls[name] = calls.get(name, 0.0) + ns
    steps = max(len(c.step_starts), 1)
    excess_ms = {p: round(float(v) / steps / NS_PER_MS, 3) for p, v in zip(CAUSE_PARTS, excess)}
    cause = max(excess_ms, key=excess_ms.get)
    call = max(calls, key=calls.get) if calls else None
    host_call = {"name": call, "ms_per_step": round(calls[call] / steps / NS_PER_MS, 3)} if call else None
    return Straggler(rank, late.get(rank, 0.0), group, cause, excess_ms, host_call,
                     _chain(done, rank, group) if cause == "other_comm" else [])


def _chain(done: pd.DataFrame, rank: int, group: str) -> list[int]:
    """Follow who ``rank`` itself waited for in groups other than ``group``, rank after rank."""
    chain: list[int] = []
    current, skip = rank, GROUPS.index(group)
    while len(chain) < CHAIN_MAX:
        waited = done[(done["rank"] == current) & (done["late"] != current) & (done["g"] != skip) & (done["wait"] > 0)]
        if waited.empty:
            break
        nxt = int(waited.groupby("late")["wait"].sum().idxmax())
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
