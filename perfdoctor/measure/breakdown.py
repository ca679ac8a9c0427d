"""Where a device's time went: window, busy share, time by kernel category and collective, streams,
top kernels. The foundation numbers every later measurement refines (DESIGN §3 definitions)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfdoctor.measure import intervals as iv
from perfdoctor.measure.activity import Activity, gpu_activity
from perfdoctor.measure.steps import Steps
from perfdoctor.model import DeviceSummary, Timeline

TOP_KERNELS = 10


def summarize(tl: Timeline, kcls: pd.DataFrame, ccls: pd.DataFrame, act: Activity,
              steps: Steps | None) -> DeviceSummary:
    """Breakdown of one timeline; a CPU-only timeline gets its NVTX window and zero GPU numbers.

    ``kcls``/``ccls`` are the taxonomy of its kernels and copies (:mod:`perfdoctor.classify.timeline`).
    """
    k, cp, ms = tl.kernels, tl.memcpy, tl.memset
    k_dur = (k["end"] - k["start"]).to_numpy()
    c_dur = (cp["end"] - cp["start"]).to_numpy()

    window = activity_window(tl)

    k_comm, c_comm = act.comm_kernels, act.comm_copies

    category_ns = _sum_by(kcls["category"].to_numpy(dtype=object), k_dur)
    category_count = _count_by(kcls["category"].to_numpy(dtype=object))
    for name, dur in _sum_by(ccls["category"].to_numpy(dtype=object), c_dur).items():
        category_ns[name] = category_ns.get(name, 0) + dur
    for name, n in _count_by(ccls["category"].to_numpy(dtype=object)).items():
        category_count[name] = category_count.get(name, 0) + n
    if len(ms):
        category_ns["memset"] = category_ns.get("memset", 0) + int((ms["end"] - ms["start"]).sum())
        category_count["memset"] = category_count.get("memset", 0) + len(ms)

    coll = np.concatenate([kcls["collective"].to_numpy(dtype=object)[k_comm],
                           ccls["collective"].to_numpy(dtype=object)[c_comm]])
    coll_dur = np.concatenate([k_dur[k_comm], c_dur[c_comm]])
    coll_ns = _sum_by(coll, coll_dur)
    collectives = {c: {"count": n, "ns": coll_ns[c]} for c, n in _count_by(coll).items()}
    libraries = _count_by(np.concatenate([kcls["library"].to_numpy(dtype=object)[k_comm],
                                          ccls["library"].to_numpy(dtype=object)[c_comm]]))

    nvtx = tl.nvtx
    is_mark = nvtx["end"].to_numpy() < 0 if len(nvtx) else np.zeros(0, dtype=bool)
    domains = nvtx["domain"].fillna("(default)").to_numpy(dtype=object) if len(nvtx) else np.zeros(0, dtype=object)
    gpu = tl.gpu
    return DeviceSummary(
        rank=tl.rank if tl.rank is not None else -1,
        label=tl.label,
        pid=tl.pid,
        device_id=tl.device_id,
        process_name=tl.process_name,
        gpu_name=gpu.name if gpu else None,
        window=window,
        step_source=steps.source if steps else "window",
        step_ns=[int(d) for d in steps.durations] if steps else [],
        kernel_count=len(k),
        comm_kernel_count=int(k_comm.sum()),
        busy_ns=iv.measure(iv.clip(act.busy, *window)) if window else 0,
        compute_ns=iv.measure(act.compute),
        comm_ns=iv.measure(act.comm),
        category_ns=category_ns,
        category_count=category_count,
        collectives=collectives,
        comm_libraries=libraries,
        streams=_streams(k, k_dur, k_comm),
        top_kernels=_top_kernels(k, kcls, k_dur),
        memcpy_count=len(cp),
        memset_count=len(ms),
        cuda_api_calls=len(tl.api),
        nvtx_ranges=int((~is_mark).sum()),
        nvtx_marks=int(is_mark.sum()),
        nvtx_domains=_count_by(domains),
        osrt_calls=tl.osrt_calls,
    )


def activity_window(tl: Timeline) -> tuple[int, int] | None:
    """GPU activity window; for a process without GPU work, the span of its NVTX events."""
    starts, ends = gpu_activity(tl)
    if starts.size:
        return int(starts.min()), int(ends.max())
    if len(tl.nvtx):
        s = tl.nvtx["start"].to_numpy()
        e = np.maximum(tl.nvtx["end"].to_numpy(), s)
        return int(s.min()), int(e.max())
    return None


def _sum_by(keys: np.ndarray, values: np.ndarray) -> dict[str, int]:
    if not keys.size:
        return {}
    codes, uniques = pd.factorize(keys)
    sums = np.bincount(codes, weights=values.astype(np.float64), minlength=len(uniques))
    return {str(u): int(round(s)) for u, s in zip(uniques, sums)}


def _count_by(keys: np.ndarray) -> dict[str, int]:
    if not keys.size:
        return {}
    codes, uniques = pd.factorize(keys)
    counts = np.bincount(codes, minlength=len(uniques))
    return {str(u): int(c) for u, c in zip(uniques, counts)}


def _streams(k: pd.DataFrame, dur: np.ndarray, comm: np.ndarray) -> list[dict[str, int]]:
    if not len(k):
        return []
    frame = pd.DataFrame({"stream": k["stream"].to_numpy(), "ns": dur, "comm": comm,
                          "comm_ns": np.where(comm, dur, 0)})
    agg = frame.groupby("stream").agg(kernels=("ns", "size"), ns=("ns", "sum"), comm_kernels=("comm", "sum"),
                                      comm_ns=("comm_ns", "sum"))
    agg = agg.sort_values("ns", ascending=False)
    return [{"stream": int(s), **{c: int(v) for c, v in row.items()}} for s, row in agg.iterrows()]


def _top_kernels(k: pd.DataFrame, kcls: pd.DataFrame, dur: np.ndarray) -> list[dict]:
    if not len(k):
        return []
    codes = k["short_name"].cat.codes.to_numpy()
    names = k["short_name"].cat.categories
    totals = np.bincount(codes, weights=dur.astype(np.float64), minlength=len(names))
    counts = np.bincount(codes, minlength=len(names))
    category_of = np.empty(len(names), dtype=object)
    category_of[codes] = kcls["category"].to_numpy(dtype=object)
    order = np.argsort(-totals, kind="stable")[:TOP_KERNELS]
    return [{"name": str(names[i]), "category": category_of[i], "count": int(counts[i]), "ns": int(round(totals[i]))}
            for i in order if counts[i]]
