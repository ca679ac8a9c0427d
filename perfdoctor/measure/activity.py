"""What a device was doing, as interval sets computed once per timeline and shared by every measurement.

Compute is the union of non-communication kernels; communication is the union of comm kernels and
peer copies; busy is everything the device ran (kernels, copies, fills) — DESIGN §3.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from perfdoctor.classify.timeline import category_mask
from perfdoctor.measure import intervals as iv
from perfdoctor.model import Timeline
from perfdoctor.table import Table


@dataclass(frozen=True)
class Activity:
    comm_kernels: np.ndarray  # mask over tl.kernels
    comm_copies: np.ndarray  # mask over tl.memcpy (peer copies)
    busy: iv.Intervals
    compute: iv.Intervals
    comm: iv.Intervals

    @cached_property
    def exposed_comm(self) -> iv.Intervals:
        """Communication no compute hides (comm − compute), once: several measurements quote it."""
        return iv.subtract(self.comm, self.compute)


@dataclass(frozen=True)
class GroupComm:
    """Per parallel group (by index into ``perfdoctor.classify.groups.GROUPS``): the union of its
    labelled comm kernels, and the part of that no compute hides; empty for a group without kernels.
    Computed once per timeline (:func:`group_comm`): the metrics, the per-step series and the
    collectives each need every group's sets."""

    kernels: tuple[int, ...]  # labelled kernels per group
    busy: tuple[iv.Intervals, ...]
    exposed: tuple[iv.Intervals, ...]


def group_comm(kernels: Table, act: Activity, codes: np.ndarray, groups: int) -> GroupComm:
    """The sets of each of ``groups`` groups, from the kernels' group ``codes`` (−1: unlabelled)."""
    start, end = kernels.col("start"), kernels.col("end")
    counts = np.bincount(codes[codes >= 0].astype(np.int64), minlength=groups)
    busy, exposed = [], []
    for g in range(groups):
        if counts[g]:
            mine = codes == g
            busy.append(iv.union(start, end, mine))
            exposed.append(iv.subtract(busy[-1], act.compute))
        else:
            busy.append(iv.EMPTY)
            exposed.append(iv.EMPTY)
    return GroupComm(tuple(int(c) for c in counts), tuple(busy), tuple(exposed))


def gpu_activity(tl: Timeline) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends of everything the device ran: kernels, copies, fills."""
    parts = [p for p in (tl.kernels, tl.memcpy, tl.memset) if len(p)]
    if len(parts) == 1:  # kernels only (or copies only): their own columns, no copy of them
        return parts[0].col("start"), parts[0].col("end")
    return (np.concatenate([p.col("start") for p in parts] or [np.zeros(0, dtype=np.int64)]),
            np.concatenate([p.col("end") for p in parts] or [np.zeros(0, dtype=np.int64)]))


def comm_masks(kcls: Table, ccls: Table) -> tuple[np.ndarray, np.ndarray]:
    """The communication kernels and copies (peer copies), as masks over their tables."""
    return category_mask(kcls, "comm"), ccls["category"].mask("comm") if len(ccls) else np.zeros(0, dtype=bool)


def activity(tl: Timeline, kcls: Table, ccls: Table) -> Activity:
    k, cp = tl.kernels, tl.memcpy
    k_comm, c_comm = comm_masks(kcls, ccls)
    k_start, k_end = k.col("start"), k.col("end")
    comm = iv.union(np.concatenate([k_start[k_comm], cp.col("start")[c_comm]]),
                    np.concatenate([k_end[k_comm], cp.col("end")[c_comm]]))
    return Activity(k_comm, c_comm, iv.union(*gpu_activity(tl)), iv.union(k_start, k_end, ~k_comm), comm)
