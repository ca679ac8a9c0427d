"""Collective instances of one rank: what the cross-rank analysis needs, and nothing else of the timeline.

Each comm kernel with a group label is one collective instance on this rank: its group, communicator
(NCCL payload id, 0 when unknown), the stream's place among the group's streams, its sequence number on
that (group, communicator, stream), its start (the rank *arrives*) and end (DESIGN §3 "Waiting for a
peer"). Matching across ranks uses (group, communicator, stream place, sequence): NCCL runs the
collectives of one communicator in the same order on every member, and the same program creates its
streams in the same order.

So that the straggler's cause can be found without the timeline (DESIGN §3 "Straggler"), each instance
also carries what this rank did in the interval before it arrived — from the end of its previous
collective of the same group (or its step start) to its start: GPU compute, device-idle time by host
cause, comm of other groups — and the rank keeps its long CUDA API calls, so the analysis can name what
its CPU was doing while the others waited for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from perfdoctor.classify.communicators import communicators
from perfdoctor.classify.groups import GROUPS, GroupLabels
from perfdoctor.measure import grouped
from perfdoctor.measure import intervals as iv
from perfdoctor.measure.activity import Activity, GroupComm
from perfdoctor.measure.host import CAUSES, HostGaps
from perfdoctor.measure.steps import Steps, step_at
from perfdoctor.model import Timeline
from perfdoctor.records import Lazy
from perfdoctor.table import Table, distinct
from perfdoctor.width import narrow, offsets, rows, widened

# CUDA API calls shorter than this are launch overhead, not "what the CPU was doing" before an arrival.
LONG_CALL_NS = 100_000
SLICE = 1 << 18  # API calls looked at a time


@dataclass
class Collectives:
    """Per collective instance of one rank (aligned arrays, in start order), plus the rank's steps and,
    per group, its exposed comm (comm of the group minus compute) — all integer ns on the rank's clock."""

    group: np.ndarray  # int8, index into GROUPS
    comm: np.ndarray  # uint64 communicator id (0: unknown)
    stream: np.ndarray  # int16, place of the kernel's stream among the group's streams
    seq: np.ndarray  # int32, order on (group, comm, stream)
    start: np.ndarray  # int64
    end: np.ndarray  # int64
    bytes: np.ndarray  # int64, −1 unknown
    before_start: np.ndarray  # int64, start of the interval before the arrival
    before_compute: np.ndarray  # int64 ns of compute in it
    before_other_comm: np.ndarray  # int64 ns of other groups' comm in it
    before_idle: dict[str, np.ndarray]  # cause → int64 ns of host-caused device idle in it
    long_calls: tuple[np.ndarray, np.ndarray, np.ndarray]  # CUDA API calls ≥ LONG_CALL_NS: start, end, name
    step_starts: np.ndarray
    step_ends: np.ndarray
    session_start_utc_ns: int | None
    exposed: dict[str, iv.Intervals] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.start.size)


def collectives(tl: Timeline, steps: Steps, groups: GroupLabels) -> Collectives:
    """The collective instances of ``tl`` (see the module docstring), their context still zero: each window
    of the timeline's steps adds it (:func:`add_context`), from its own interval sets."""
    k = tl.kernels
    k_start, k_end = k.col("start"), k.col("end")
    idx = np.flatnonzero(groups.codes >= 0)  # kernels are sorted by start, so instances are too
    group = groups.codes[idx].astype(np.int8)
    comms = communicators(tl, idx)
    of = comms.of
    comm = np.where(of >= 0, comms.ids[np.maximum(of, 0)] if comms.ids.size else 0, 0).astype(np.uint64)
    stream_ids = k.col("stream")[idx]
    # Per (group, communicator): each stream's place among its streams, and each kernel's sequence number
    # on its stream (groups come in the sorted order of their keys, so places are by stream id).
    pair = grouped.groups(group, comm)
    by_stream = grouped.groups(pair.codes, stream_ids)
    stream_place = (by_stream.codes - pair.min(by_stream.codes)[pair.codes]).astype(np.int16)
    seq = grouped.groups(pair.codes, stream_place).position().astype(np.int32)
    start, end = k_start[idx], k_end[idx]

    # The interval before each arrival: from the previous instance of the same group ends (or the step
    # starts, whichever is later) to this one's start.
    step_of = np.clip(step_at(steps.starts, start), 0, max(len(steps) - 1, 0))
    before = steps.starts[step_of] if len(steps) else start.copy()
    prev_end = np.full(start.size, np.iinfo(np.int64).min, dtype=np.int64)
    for g in distinct(group):
        mine = np.flatnonzero(group == g)
        prev_end[mine[1:]] = np.maximum.accumulate(end[mine[:-1]])
    before = np.minimum(np.maximum(before, prev_end), start)
    zero = np.zeros(start.size, dtype=np.int64)
    return Collectives(
        group=group, comm=comm, stream=stream_place, seq=seq, start=start, end=end,
        bytes=np.full(start.size, -1, dtype=np.int64), before_start=before,
        before_compute=zero, before_other_comm=zero.copy(), before_idle={c: zero.copy() for c in CAUSES},
        long_calls=_long_calls(tl.api), step_starts=steps.starts, step_ends=steps.ends,
        session_start_utc_ns=tl.trace.session_start_utc_ns,
        exposed={GROUPS[g]: ([], []) for g in distinct(group)},  # the windows' parts, joined by finish()
    )


def add_context(c: Collectives, owns: tuple[int, int], act: Activity, by_group: GroupComm, gaps: HostGaps) -> None:
    """What the rank did before each arrival in ``owns`` (a window's own time: perfdoctor.measure.windows),
    from the window's interval sets, and the window's part of each group's exposed comm. The interval
    before an arrival lies in the arrival's step, inside the window's span."""
    a, b = np.searchsorted(c.start, owns, side="left")
    group, before, start = c.group[a:b], c.before_start[a:b], c.start[a:b]
    for g in distinct(group):
        mine = np.flatnonzero(group == g)
        rest = iv.subtract(act.comm, by_group.busy[g])
        c.before_other_comm[a + mine] = iv.overlap_per_interval(before[mine], start[mine], rest)
    c.before_compute[a:b] = iv.overlap_per_interval(before, start, act.compute)
    # The gaps of a cause are separate already (they touch only where a step boundary split one), which is
    # all the overlaps need: no merged copy of them.
    for cause in gaps.spans:
        c.before_idle[cause][a:b] = iv.overlap_per_interval(before, start, _separate(gaps.spans[cause]))
    whole = owns[0] <= np.iinfo(np.int64).min + 1 and owns[1] >= np.iinfo(np.int64).max
    for name, (starts, ends) in c.exposed.items():
        part = by_group.exposed[GROUPS.index(name)]
        part = part if whole else iv.clip(part, *owns)
        starts.append(part[0])
        ends.append(part[1])


def finish(c: Collectives) -> Collectives:
    """``c`` with each group's exposed comm joined from its windows' parts (touching parts merged, as one
    union over the whole timeline has them)."""
    for name, (starts, ends) in c.exposed.items():
        c.exposed[name] = (starts[0], ends[0]) if len(starts) == 1 else iv.union(np.concatenate(starts),
                                                                                   np.concatenate(ends))
    return c


def _separate(spans: iv.Intervals) -> iv.Intervals:
    """``spans`` when they are :func:`iv.separate`, else their union."""
    return spans if iv.separate(spans) else iv.union(*spans)


def _long_calls(api: Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The CUDA API calls long enough to be what a late rank's CPU was doing (few: kept whole)."""
    if not len(api):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=object)
    s, e = api.col("start"), api.col("end")
    long = np.concatenate([np.flatnonzero(e[lo:lo + SLICE] - s[lo:lo + SLICE] >= LONG_CALL_NS) + lo
                           for lo in range(0, s.size, SLICE)])  # a slice at a time: no duration of every call
    return s[long], e[long], api["name"][long].decode().astype(str).astype(object)



@dataclass
class Packed:
    """A rank's :class:`Collectives` at the width their values need (perfdoctor.width): what the process
    that assembles the report holds for every rank until the cross-rank join (~3 of 14 KB a rank at 80
    instances). One row per instance: times as offsets (starts from the first; ends and the intervals
    before arrivals from each start), communicators as codes into the rank's few ids, the host causes'
    idle as fields ``idle.<cause>``. :func:`unpack` gives the same arrays."""

    start_base: int
    rows: np.ndarray  # structured, narrow fields
    comm_ids: np.ndarray  # uint64
    idle: tuple[str, ...]  # the before_idle causes, in order
    rest: dict[str, object]  # long_calls, step_starts, step_ends, session_start_utc_ns, exposed: as they were


def pack(c: Collectives) -> Packed:
    """``c`` at its width (see :class:`Packed`)."""
    base, start = offsets(c.start)
    comm_ids, comm = np.unique(c.comm, return_inverse=True)
    columns = {"group": c.group, "comm": narrow(comm.reshape(-1)), "stream": narrow(c.stream),
               "seq": narrow(c.seq), "start": start, "length": narrow(c.end - c.start), "bytes": narrow(c.bytes),
               "before": narrow(c.start - c.before_start), "before_compute": narrow(c.before_compute),
               "before_other_comm": narrow(c.before_other_comm)}
    columns |= {f"idle.{cause}": narrow(v) for cause, v in c.before_idle.items()}
    rest = {"long_calls": c.long_calls, "step_starts": c.step_starts, "step_ends": c.step_ends,
            "session_start_utc_ns": c.session_start_utc_ns, "exposed": c.exposed}
    return Packed(base, rows(columns), comm_ids, tuple(c.before_idle), rest)


def unpack(p: Packed) -> Collectives:
    """The :class:`Collectives` that :func:`pack` gave ``p`` for: the same values and types."""
    r = p.rows
    start = widened(p.start_base, r["start"])
    return Collectives(
        group=r["group"].astype(np.int8), comm=p.comm_ids[r["comm"]].astype(np.uint64),
        stream=r["stream"].astype(np.int16), seq=r["seq"].astype(np.int32), start=start, end=start + r["length"],
        bytes=r["bytes"].astype(np.int64), before_start=start - r["before"],
        before_compute=r["before_compute"].astype(np.int64), before_other_comm=r["before_other_comm"].astype(np.int64),
        before_idle={cause: r[f"idle.{cause}"].astype(np.int64) for cause in p.idle}, **p.rest)  # type: ignore[arg-type]


class Unpacked(Lazy[int, Collectives]):
    """Rank → its Collectives, unpacked from the packed ones as the cross-rank analysis asks for them; the
    last :data:`CACHE` are kept (the join asks for the same late ranks again and again)."""

    def __init__(self, packed: Mapping[int, Packed]) -> None:
        super().__init__(packed, lambda rank: unpack(packed[rank]), CACHE)


CACHE = 64
