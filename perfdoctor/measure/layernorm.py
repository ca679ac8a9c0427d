"""Persistent LayerNorm/RMSNorm kernels blocked behind NCCL (the missing SM-margin symptom).

Transformer Engine's tuned norms are cooperative launches that need all their SMs at once. While an
NCCL kernel on another stream holds SMs they cannot become resident, so they start only when it ends,
with the compute stream idle meanwhile. ``NVTE_FWD/BWD_LAYERNORM_SM_MARGIN`` leaves SMs free for
exactly this (DESIGN §3).

A norm counts as blocked when (1) it was *ready* — its launch call had returned and the previous
kernel on its stream had finished — while NCCL kernels on other streams were running, (2) that NCCL
activity (one kernel or a back-to-back chain) lasted without a break until within ``START_SLACK_NS``
of the norm's start, (3) it waited longer than
``MIN_DELAY_NS``, and (4) its thread issued no ``cudaStreamWaitEvent`` between the previous launch on
that stream and its own, which would make the wait a data dependency rather than SM contention.
The delay is start − ready.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfdoctor.classify.projection import kernel_launch_calls
from perfdoctor.classify.timeline import category_mask
from perfdoctor.measure import intervals as iv
from perfdoctor.measure.steps import Steps
from perfdoctor.measure.stream_order import previous_on_stream
from perfdoctor.model import Timeline
from perfdoctor.table import Table, distinct

START_SLACK_NS = 20_000  # the norm starts right after the NCCL kernel ends
MIN_DELAY_NS = 20_000  # shorter waits are launch latency, not blocking
STREAM_WAIT_API = ("cudaStreamWaitEvent", "cuStreamWaitEvent")


@dataclass(frozen=True)
class BlockedNorms:
    index: np.ndarray  # rows of tl.kernels that were blocked
    delay_ns: np.ndarray
    blocker: np.ndarray  # row of the NCCL kernel each waited for
    count_per_step: np.ndarray
    ms_per_step: np.ndarray


def blocked_norms(tl: Timeline, kcls: Table, steps: Steps) -> BlockedNorms:
    k = tl.kernels
    empty = np.zeros(0, dtype=np.int64)
    n_steps = len(steps)
    none = BlockedNorms(empty, empty, empty, np.zeros(n_steps), np.zeros(n_steps))
    cooperative = k.col("launch_type") >= 2
    persistent = category_mask(kcls, "norm_persistent") | (category_mask(kcls, "norm") & cooperative)
    comm = category_mask(kcls, "comm")
    if not persistent.any() or not comm.any():
        return none

    start, end, stream = k.col("start"), k.col("end"), k.col("stream")
    call_start, call_end, call_tid = kernel_launch_calls(tl)
    norms = np.flatnonzero(persistent & (call_end >= 0))
    prev = previous_on_stream(norms, stream)
    prev_end = np.where(prev >= 0, end[prev], -1)
    prev_call = np.where(prev >= 0, call_start[prev], -1)
    ready = np.maximum(call_end[norms], prev_end)
    waited = start[norms] - ready > MIN_DELAY_NS

    holds = np.zeros(norms.size, dtype=bool)
    blocker = np.full(norms.size, -1, dtype=np.int64)
    for s_id in distinct(stream[norms]):
        mine = np.flatnonzero(stream[norms] == s_id)
        others = np.flatnonzero(comm & (stream != s_id))
        if not others.size:
            continue
        holds[mine], blocker[mine] = _held_by(start[norms[mine]], ready[mine], start[others], end[others], others)
    dependency = _stream_wait_between(tl.api, call_tid[norms], prev_call, call_start[norms])
    hit = waited & holds & ~dependency
    index = norms[hit]
    delay = (start[index] - ready[hit]).astype(np.int64)
    step_of = np.searchsorted(steps.starts, start[index], side="right") - 1
    inside = (step_of >= 0) & (start[index] < steps.ends[np.maximum(step_of, 0)])
    count = np.bincount(step_of[inside], minlength=n_steps).astype(np.float64)
    ns = np.bincount(step_of[inside], weights=delay[inside].astype(np.float64), minlength=n_steps)
    return BlockedNorms(index, delay, blocker[hit], count, ns / 1e6)


def _held_by(norm_start: np.ndarray, ready: np.ndarray, c_start: np.ndarray, c_end: np.ndarray,
             c_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Whether NCCL activity covered [ready, start − slack] without a break and ended just before
    the norm started; and the row of the NCCL kernel that ended last before the norm."""
    cover = iv.union(c_start, c_end)
    if cover[0].size:
        k = np.searchsorted(cover[0], ready, side="right") - 1
        kk = np.maximum(k, 0)
        gap = norm_start - cover[1][kk]
        held = (k >= 0) & (ready < cover[1][kk]) & (gap >= 0) & (gap <= START_SLACK_NS)
    else:  # every NCCL kernel has zero length: nothing covers any wait
        held = np.zeros(norm_start.size, dtype=bool)
    by_end = np.argsort(c_end, kind="stable")
    last = np.searchsorted(c_end[by_end], norm_start, side="right") - 1
    return held, np.where(last >= 0, c_rows[by_end[np.maximum(last, 0)]], -1)


def _stream_wait_between(api: Table, tid: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Whether thread ``tid[i]`` called cudaStreamWaitEvent in ``(lo[i], hi[i])``."""
    result = np.zeros(tid.size, dtype=bool)
    if not len(api) or not tid.size:
        return result
    waits = api["name"].mask(*STREAM_WAIT_API)
    if not waits.any():
        return result
    w_tid, w_start = api.col("tid")[waits], api.col("start")[waits]
    for thread in distinct(tid):
        mine = np.flatnonzero(tid == thread)
        times = w_start[w_tid == thread]
        if not np.all(times[1:] >= times[:-1]):  # calls usually come in start order already
            times = np.sort(times)
        count = np.searchsorted(times, hi[mine], side="left") - np.searchsorted(times, lo[mine], side="right")
        result[mine] = count > 0
    return result

