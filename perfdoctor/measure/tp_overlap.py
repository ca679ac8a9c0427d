"""TP comm-GEMM overlap that did not overlap: the ``CUDA_DEVICE_MAX_CONNECTIONS`` ≠ 1 symptom.

Transformer Engine's userbuffers overlap (``--tp-comm-overlap``) splits a TP GEMM into chunks and issues
each chunk's communication on a side stream right after the GEMM chunk it should run under
(research/kernel_taxonomy.md §3.2). Megatron requires ``CUDA_DEVICE_MAX_CONNECTIONS=1`` so that all
streams feed one hardware queue and kernels are dispatched in launch order; with more connections the
GEMM chunk, already queued, takes every SM first and the communication kernel starts only when that
GEMM ends, so comm and GEMM run one after the other and the overlap is lost.

A TP overlap kernel (userbuffers) is *serialized* when, with ``g`` the GEMM on another stream launched
last before it by the same thread (the one it was issued to overlap with): (1) it was ready — its launch
call had returned and the previous kernel on its stream had ended — more than ``MIN_DELAY_NS`` before
``g`` ended, and (2) it started within ``START_SLACK_NS`` after ``g`` ended, not while ``g`` ran. The
overlap lost is the part of ``g`` that ran while the comm kernel was ready and waiting:
``g.end − max(ready, g.start)``. NCCL TP collectives are not this overlap (Megatron serialises them with
the GEMMs through events), so a run without userbuffers kernels has no value (``None``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfdoctor.classify.projection import kernel_launch_calls
from perfdoctor.classify.timeline import category_mask, class_mask
from perfdoctor.measure.steps import Steps
from perfdoctor.measure.stream_order import previous_on_stream
from perfdoctor.model import Timeline
from perfdoctor.table import Table, distinct

START_SLACK_NS = 5_000  # the comm kernel starts right after the GEMM ends
MIN_DELAY_NS = 2_000  # shorter waits are dispatch latency
CONNECTIONS_ENV = "CUDA_DEVICE_MAX_CONNECTIONS"


@dataclass(frozen=True)
class SerializedOverlap:
    index: np.ndarray  # rows of tl.kernels: the serialized comm kernels
    gemm: np.ndarray  # row of the GEMM each one waited for
    lost_ns: np.ndarray  # overlap lost per serialized kernel
    ms_per_step: np.ndarray | None  # None: no TP comm-GEMM overlap in this timeline
    comm_count: int  # TP overlap comm kernels seen
    connections: str | None  # CUDA_DEVICE_MAX_CONNECTIONS as captured (None = not set)


def serialized_overlap(tl: Timeline, kcls: Table, steps: Steps) -> SerializedOverlap:
    k = tl.kernels
    env = tl.trace.env.get(CONNECTIONS_ENV)
    empty = np.zeros(0, dtype=np.int64)
    overlap_comm = category_mask(kcls, "comm") & class_mask(kcls, "library", "userbuffers") \
        if len(k) else np.zeros(0, dtype=bool)
    if not overlap_comm.any():
        return SerializedOverlap(empty, empty, empty, None, 0, env)

    start, end, stream = k.col("start"), k.col("end"), k.col("stream")
    call_start, call_end, call_tid = kernel_launch_calls(tl)
    gemm = np.flatnonzero(category_mask(kcls, "gemm") & (call_start >= 0))
    comm = np.flatnonzero(overlap_comm & (call_start >= 0))
    paired = _last_gemm_launched_before(comm, gemm, call_start, call_tid, stream)
    ok = paired >= 0
    comm, g = comm[ok], paired[ok]
    prev = previous_on_stream(comm, stream)
    ready = np.maximum(call_end[comm], np.where(prev >= 0, end[prev], -1))
    waited = start[comm] - end[g]
    serialized = (ready < end[g] - MIN_DELAY_NS) & (waited >= 0) & (waited <= START_SLACK_NS)
    index, g = comm[serialized], g[serialized]
    lost = (end[g] - np.maximum(ready[serialized], start[g])).astype(np.int64)
    step_of = np.searchsorted(steps.starts, start[index], side="right") - 1
    inside = (step_of >= 0) & (start[index] < steps.ends[np.maximum(step_of, 0)])
    ns = np.bincount(step_of[inside], weights=lost[inside].astype(np.float64), minlength=len(steps))
    return SerializedOverlap(index, g, lost, ns / 1e6, int(overlap_comm.sum()), env)


def _last_gemm_launched_before(comm: np.ndarray, gemm: np.ndarray, call_start: np.ndarray, call_tid: np.ndarray,
                               stream: np.ndarray) -> np.ndarray:
    """Row of the GEMM whose launch call came last before each comm kernel's, by the same thread and
    on another stream; -1 where there is none."""
    out = np.full(comm.size, -1, dtype=np.int64)
    for tid in distinct(call_tid[comm]):
        mine = np.flatnonzero(call_tid[comm] == tid)
        theirs = gemm[call_tid[gemm] == tid]
        if not theirs.size:
            continue
        theirs = theirs[np.argsort(call_start[theirs], kind="stable")]
        pos = np.searchsorted(call_start[theirs], call_start[comm[mine]], side="left") - 1
        out[mine] = np.where(pos >= 0, theirs[np.maximum(pos, 0)], -1)
    other_stream = out >= 0
    out[other_stream] = np.where(stream[out[other_stream]] != stream[comm[other_stream]], out[other_stream], -1)
    return out
