"""Which NCCL communicator launched each communication kernel, from NCCL's NVTX payloads.

NCCL launches a collective's kernel inside the API call's NVTX range (``ncclAllReduce``), or — for
calls grouped between ``ncclGroupStart`` and ``ncclGroupEnd`` (send/recv pairs, coalesced
collectives) — inside ``ncclGroupEnd``, after the grouped calls' ranges have closed. So a kernel
belongs to the payload range that encloses its launch call on the launching thread, or else to the
latest payload range that began since the thread's last ``ncclGroupStart``.

A communicator is one process group, so its kernels share one parallel-group label; how that label
is chosen is ``classify.groups``' business.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from perfdoctor.classify.projection import kernel_launch_calls
from perfdoctor.load.labels import matching
from perfdoctor.model import Timeline
from perfdoctor.table import Table, distinct, factorize

GROUP_START = re.compile(r"^ncclGroupStart$")


@dataclass(frozen=True)
class Communicators:
    """Per comm kernel asked about (aligned with the ``comm_idx`` given to :func:`communicators`) the index
    of its communicator in ``ids`` (−1: none known); per communicator its number of ranks (−1: its creation
    was not captured). Per comm kernel, not per kernel: at 10M kernels a few MB, not 40."""

    of: np.ndarray  # int32
    ids: np.ndarray  # uint64 communicator ids
    sizes: np.ndarray  # int64


def communicators(tl: Timeline, comm_idx: np.ndarray) -> Communicators:
    """Communicators of the comm kernels ``comm_idx`` of ``tl`` (others stay −1): from NCCL's NVTX
    payloads, or in a PyTorch profiler trace from the process group each NCCL kernel names."""
    if "pg_name" in tl.kernels.columns:
        return process_group_communicators(tl.kernels, comm_idx)
    none = Communicators(np.full(comm_idx.size, -1, dtype=np.int32), np.zeros(0, dtype=np.uint64),
                         np.zeros(0, dtype=np.int64))
    calls = tl.nccl
    if calls is None or not len(calls) or not comm_idx.size:
        return none
    codes, ids = factorize(calls.col("comm"))
    ids = np.asarray(ids, dtype=np.uint64)
    sizes = np.full(ids.size, -1, dtype=np.int64)
    nranks = calls.col("nranks")
    known = nranks > 0
    sizes[codes[known]] = nranks[known]  # creation ranges; every one of a communicator gives its size

    call_start, call_end, call_tid = kernel_launch_calls(tl, comm_idx)
    group_starts = matching(tl.nvtx, GROUP_START)
    r_start, r_end, r_tid = (calls[c] for c in ("start", "end", "tid"))
    of = none.of
    for thread in distinct(r_tid):
        mine = np.flatnonzero(call_tid == thread)
        if not mine.size:
            continue
        rows = np.flatnonzero(r_tid == thread)  # calls come sorted by start
        latest = np.searchsorted(r_start[rows], call_start[mine], side="right") - 1
        ok = latest >= 0
        row = rows[np.maximum(latest, 0)]
        encloses = ok & (r_end[row] >= call_end[mine])
        gs = np.sort(group_starts.col("start")[group_starts.col("tid") == thread])
        in_group = np.zeros(mine.size, dtype=bool)
        if gs.size:  # the latest call began after the thread's last ncclGroupStart: same group
            g = np.searchsorted(gs, call_start[mine], side="right") - 1
            in_group = ok & (g >= 0) & (r_start[row] >= gs[np.maximum(g, 0)])
        hit = encloses | in_group
        of[mine[hit]] = codes[row[hit]]
    return Communicators(of, ids, sizes)



def process_group_communicators(kernels: Table, comm_idx: np.ndarray) -> Communicators:
    """Communicators of a PyTorch profiler trace: every NCCL kernel names its process group
    (``pg_name``) and the group's size (``pg_size``), so each process group is one communicator."""
    of = np.full(comm_idx.size, -1, dtype=np.int32)
    names = kernels.col("pg_name")[comm_idx]
    has = np.array([isinstance(x, str) for x in names], dtype=bool)
    codes, uniques = factorize(np.asarray(names[has], dtype=object))
    of[has] = codes
    sizes = np.full(len(uniques), -1, dtype=np.int64)
    pg_size = kernels.col("pg_size")[comm_idx[has]]
    known = pg_size > 0
    sizes[codes[known]] = pg_size[known]
    # PyTorch names process groups the same on every member ("0", "1", ...), so a hash of the name is a
    # communicator id that matches across ranks (perfdoctor.measure.peers); 0 means unknown there.
    import hashlib  # Kineto input only: not on the start-up path of an nsys analysis

    ids = np.array([int.from_bytes(hashlib.blake2b(str(u).encode(), digest_size=8).digest(), "little") or 1
                    for u in uniques], dtype=np.uint64)
    return Communicators(of, ids, sizes)
