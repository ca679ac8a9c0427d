"""Where a device's time went: window, busy share, time by kernel category and collective, streams,
top kernels. The foundation numbers every later measurement refines (DESIGN §3 definitions)."""

from __future__ import annotations

import numpy as np

from perfdoctor.classify.timeline import Coded, class_codes
from perfdoctor.measure import intervals as iv
from perfdoctor.measure.activity import Activity, comm_masks, gpu_activity
from perfdoctor.measure.steps import Steps
from perfdoctor.model import DeviceSummary, Timeline
from perfdoctor.table import Table, factorize

TOP_KERNELS = 10
NEVER = np.iinfo(np.int64).max  # perfdoctor.measure.windows: a window owning all time before or after


def summarize(tl: Timeline, kcls: Table, ccls: Table, steps: Steps | None,
              measured: tuple[int, int, int]) -> DeviceSummary:
    """Breakdown of one timeline; a CPU-only timeline gets its NVTX window and zero GPU numbers.

    ``kcls``/``ccls`` are the taxonomy of its kernels and copies (:mod:`perfdoctor.classify.timeline`);
    ``measured`` the ns its device was busy, computing and communicating (:func:`measured_ns`, summed over
    the timeline's windows).
    """
    k, cp, ms = tl.kernels, tl.memcpy, tl.memset
    k_dur = (k["end"] - k["start"]).astype(np.float64)  # once: every tally weighs by it
    c_dur = (cp["end"] - cp["start"]).astype(np.float64)

    window = activity_window(tl)

    k_comm, c_comm = comm_masks(kcls, ccls)

    kc, cc = class_codes(kcls), class_codes(ccls)
    category_ns, category_count = _merge_tallies(_tally(kc["category"], k_dur), _tally(cc["category"], c_dur))
    if len(ms):
        category_ns["memset"] = category_ns.get("memset", 0) + int((ms["end"] - ms["start"]).sum())
        category_count["memset"] = category_count.get("memset", 0) + len(ms)

    coll_ns, coll_count = _merge_tallies(_tally(kc["collective"], k_dur, k_comm),
                                         _tally(cc["collective"], c_dur, c_comm))
    collectives = {c: {"count": n, "ns": coll_ns[c]} for c, n in coll_count.items()}
    _, libraries = _merge_tallies(_tally(kc["library"], k_dur, k_comm), _tally(cc["library"], c_dur, c_comm))

    nvtx = tl.nvtx
    is_mark = nvtx.col("end") < 0 if len(nvtx) else np.zeros(0, dtype=bool)
    domains = np.array(["(default)" if d is None else d for d in nvtx.col("domain", dtype=object)], dtype=object) \
        if len(nvtx) else np.zeros(0, dtype=object)
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
        busy_ns=measured[0] if window else 0,
        compute_ns=measured[1],
        comm_ns=measured[2],
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
        step_label=steps.label if steps else "",
        excluded_ns=int(max(0, steps.starts[0] - window[0])) if steps and len(steps) and window else 0,
        excluded_ranges=list(steps.excluded) if steps else [],
    )


def measured_ns(act: Activity, owns: tuple[int, int]) -> tuple[int, int, int]:
    """The ns of ``owns`` (a window's own time: perfdoctor.measure.windows) the device was busy, computing
    and communicating; the windows' sums are the whole timeline's measures."""
    sets = (act.busy, act.compute, act.comm)
    if owns[0] == -NEVER and owns[1] == NEVER:  # the whole timeline
        return tuple(iv.measure(s) for s in sets)
    return tuple(iv.measure(iv.clip(s, *owns)) for s in sets)


def activity_window(tl: Timeline) -> tuple[int, int] | None:
    """GPU activity window; for a process without GPU work, the span of its NVTX events."""
    starts, ends = gpu_activity(tl)
    if starts.size:
        return int(starts.min()), int(ends.max())
    if len(tl.nvtx):
        s = tl.nvtx.col("start")
        e = np.maximum(tl.nvtx.col("end"), s)
        return int(s.min()), int(e.max())
    return None


def _tally(coded: Coded, dur: np.ndarray, rows: np.ndarray | None = None) -> tuple[dict[str, int], dict[str, int]]:
    """ns and count per distinct value of a taxonomy column (over ``rows``, a mask, when given)."""
    codes, values = coded
    if rows is not None:
        codes, dur = codes[rows], dur[rows]
    if not codes.size:
        return {}, {}
    sums = np.bincount(codes, weights=dur, minlength=len(values))
    counts = np.bincount(codes, minlength=len(values))
    present = np.flatnonzero(counts)
    return ({str(values[i]): int(round(sums[i])) for i in present}, {str(values[i]): int(counts[i]) for i in present})


def _merge_tallies(*tallies: tuple[dict[str, int], dict[str, int]]) -> tuple[dict[str, int], dict[str, int]]:
    """Sum of several (ns, count) tallies, key by key."""
    ns: dict[str, int] = {}
    count: dict[str, int] = {}
    for t_ns, t_count in tallies:
        for key in t_count:
            ns[key] = ns.get(key, 0) + t_ns[key]
            count[key] = count.get(key, 0) + t_count[key]
    return ns, count


def _count_by(keys: np.ndarray) -> dict[str, int]:
    if not keys.size:
        return {}
    codes, uniques = factorize(keys)
    counts = np.bincount(codes, minlength=len(uniques))
    return {str(u): int(c) for u, c in zip(uniques, counts)}


def _streams(k: Table, dur: np.ndarray, comm: np.ndarray) -> list[dict[str, int]]:
    """Kernels and ns per stream (all and comm), busiest stream first."""
    if not len(k):
        return []
    inverse, streams = factorize(k.col("stream"))
    kernels = np.bincount(inverse, minlength=len(streams))
    ns = np.bincount(inverse, weights=dur, minlength=len(streams))
    comm_kernels = np.bincount(inverse[comm], minlength=len(streams))
    comm_ns = np.bincount(inverse[comm], weights=dur[comm], minlength=len(streams))
    return [{"stream": int(streams[i]), "kernels": int(kernels[i]), "ns": int(round(ns[i])),
             "comm_kernels": int(comm_kernels[i]), "comm_ns": int(round(comm_ns[i]))}
            for i in np.argsort(-ns, kind="stable")]


def _top_kernels(k: Table, kcls: Table, dur: np.ndarray) -> list[dict]:
    """The kernels that take the most time, by short name and category: a short name drops the template
    arguments that classify a kernel, so one name can hold several kinds (PyTorch's
    ``vectorized_elementwise_kernel`` runs both adds and ``fill_`` memsets) and gets one row per kind."""
    if not len(k):
        return []
    names = k["short_name"].values
    category_codes, categories = class_codes(kcls)["category"]
    pair = k["short_name"].codes.astype(np.int64) * len(categories) + category_codes
    inverse, keys = factorize(pair, sort=True)
    totals = np.bincount(inverse, weights=dur, minlength=len(keys))
    counts = np.bincount(inverse, minlength=len(keys))
    order = np.argsort(-totals, kind="stable")[:TOP_KERNELS]
    return [{"name": str(names[keys[i] // len(categories)]), "category": categories[keys[i] % len(categories)],
             "count": int(counts[i]),
             "ns": int(round(totals[i]))} for i in order if counts[i]]
