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
SLICE = 1 << 18  # kernels tallied at a time
# Stream numbers or (name, category) pairs spanning up to this many per kernel (plus the slack) are bincounted.
_DENSE_PER_ROW, _DENSE_SLACK = 4, 1024
NEVER = np.iinfo(np.int64).max  # perfdoctor.measure.windows: a window owning all time before or after


def summarize(tl: Timeline, kcls: Table, ccls: Table, steps: Steps | None,
              measured: tuple[int, int, int]) -> DeviceSummary:
    """Breakdown of one timeline; a CPU-only timeline gets its NVTX window and zero GPU numbers.

    ``kcls``/``ccls`` are the taxonomy of its kernels and copies (:mod:`perfdoctor.classify.timeline`);
    ``measured`` the ns its device was busy, computing and communicating (:func:`measured_ns`, summed over
    the timeline's windows).
    """
    k, cp, ms = tl.kernels, tl.memcpy, tl.memset
    c_dur = (cp["end"] - cp["start"]).astype(np.float64)

    window = activity_window(tl)

    k_comm, c_comm = comm_masks(kcls, ccls)

    kc, cc = class_codes(kcls), class_codes(ccls)
    tallies = _KernelTallies(k, kc, k_comm)
    category_ns, category_count = _merge_tallies(tallies.tally("category"), _tally(cc["category"], c_dur))
    if len(ms):
        category_ns["memset"] = category_ns.get("memset", 0) + int((ms["end"] - ms["start"]).sum())
        category_count["memset"] = category_count.get("memset", 0) + len(ms)

    coll_ns, coll_count = _merge_tallies(tallies.tally("collective"), _tally(cc["collective"], c_dur, c_comm))
    collectives = {c: {"count": n, "ns": coll_ns[c]} for c, n in coll_count.items()}
    _, libraries = _merge_tallies(tallies.tally("library"), _tally(cc["library"], c_dur, c_comm))

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
        streams=tallies.streams(),
        top_kernels=tallies.top_kernels(),
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
    return tuple(iv.measure_within(s, *owns) for s in (act.busy, act.compute, act.comm))


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


class _KernelTallies:
    """The kernels' counts and ns per taxonomy value (category over all kernels; collective and library over
    the comm kernels), per stream (all and comm) and per short name and category, summed a slice of kernels
    at a time (:data:`SLICE`): no column of every kernel's duration, and per-slice bincounts where the codes
    are dense (streams, name and category pairs), not a factorization of every kernel. The sums are of whole
    nanoseconds, exact in float64, so the slices' sums are the whole columns'."""

    def __init__(self, k: Table, kc: dict[str, Coded], comm: np.ndarray) -> None:
        self.k, self.n = k, len(k)
        self.categories = kc["category"][1]
        self.names = k["short_name"] if self.n else None
        self.values = {c: kc[c][1] for c in ("category", "collective", "library")}
        self.sums = {c: np.zeros(len(v)) for c, v in self.values.items()}
        self.counts = {c: np.zeros(len(v), dtype=np.int64) for c, v in self.values.items()}
        stream = k.col("stream") if self.n else np.zeros(0, dtype=np.int64)
        self.low = int(stream.min()) if self.n else 0
        span = int(stream.max()) - self.low + 1 if self.n else 0
        pairs = len(self.names.values) * len(self.categories) if self.n else 0
        dense = _DENSE_PER_ROW * self.n + _DENSE_SLACK
        self.by_stream = np.zeros((4, span)) if span <= dense else None  # kernels, ns, comm kernels, comm ns
        self.first = np.full(span if self.by_stream is not None else 0, -1, dtype=np.int64)  # first row per stream
        self.by_pair = np.zeros((2, pairs)) if pairs <= dense else None  # kernels, ns
        start, end = k.col("start") if self.n else None, k.col("end") if self.n else None
        # With the (name, category) pairs tallied, the categories' tally is theirs summed over the names (the
        # same whole nanoseconds): two bincounts of every kernel fewer.
        tallied = [c for c in self.values if c != "category" or self.by_pair is None]
        for lo in range(0, self.n, SLICE):
            hi = min(lo + SLICE, self.n)
            # as float64 once: every bincount weighted by it would convert it again
            dur = (end[lo:hi] - start[lo:hi]).astype(np.float64)
            mine = comm[lo:hi]
            comm_dur = dur[mine]
            for c in tallied:
                codes = kc[c][0][lo:hi]
                if c != "category":
                    codes, weights = codes[mine], comm_dur
                else:
                    weights = dur
                self.sums[c] += np.bincount(codes, weights=weights, minlength=len(self.values[c]))
                self.counts[c] += np.bincount(codes, minlength=len(self.values[c]))
            if self.by_stream is not None:
                self._streams(lo, stream[lo:hi].astype(np.int64) - self.low, dur, mine, comm_dur)
            if self.by_pair is not None:
                pair = self.names.codes[lo:hi].astype(np.int64) * len(self.categories) + kc["category"][0][lo:hi]
                self.by_pair[0] += np.bincount(pair, minlength=pairs)
                self.by_pair[1] += np.bincount(pair, weights=dur, minlength=pairs)
        if self.by_pair is not None and self.n:
            kernels, ns = self.by_pair.reshape(2, len(self.names.values), len(self.categories)).sum(axis=1)
            self.counts["category"], self.sums["category"] = kernels.astype(np.int64), ns
        self.kc, self.comm = kc, comm

    def _streams(self, lo: int, stream: np.ndarray, dur: np.ndarray, mine: np.ndarray, comm_dur: np.ndarray) -> None:
        span = self.first.size
        kernels = np.bincount(stream, minlength=span)
        for s in np.flatnonzero((kernels > 0) & (self.first < 0)):  # streams first seen here (a few)
            self.first[s] = lo + int(np.argmax(stream == s))
        self.by_stream[0] += kernels
        self.by_stream[1] += np.bincount(stream, weights=dur, minlength=span)
        self.by_stream[2] += np.bincount(stream[mine], minlength=span)
        self.by_stream[3] += np.bincount(stream[mine], weights=comm_dur, minlength=span)

    def tally(self, column: str) -> tuple[dict[str, int], dict[str, int]]:
        """ns and count per distinct value of a taxonomy column (as :func:`_tally`)."""
        values, sums, counts = self.values[column], self.sums[column], self.counts[column]
        present = np.flatnonzero(counts)
        return ({str(values[i]): int(round(sums[i])) for i in present},
                {str(values[i]): int(counts[i]) for i in present})

    def _durations(self) -> np.ndarray:
        """Every kernel's duration (float64), for the tallies whose codes are not dense."""
        return (self.k.col("end") - self.k.col("start")).astype(np.float64)

    def streams(self) -> list[dict[str, int]]:
        """Kernels and ns per stream (all and comm), busiest stream first (streams in order of first
        appearance before that)."""
        if not self.n:
            return []
        if self.by_stream is None:
            return _streams(self.k, self._durations(), self.comm)
        present = np.flatnonzero(self.first >= 0)
        present = present[np.argsort(self.first[present], kind="stable")]
        kernels, ns, comm_kernels, comm_ns = self.by_stream[:, present]
        return [{"stream": int(present[i]) + self.low, "kernels": int(kernels[i]), "ns": int(round(ns[i])),
                 "comm_kernels": int(comm_kernels[i]), "comm_ns": int(round(comm_ns[i]))}
                for i in np.argsort(-ns, kind="stable")]

    def top_kernels(self) -> list[dict]:
        """The kernels that take the most time, by short name and category (:func:`_top_kernels`)."""
        if not self.n:
            return []
        if self.by_pair is None:
            return _top_kernels(self.k, self.kc, self._durations())
        keys = np.flatnonzero(self.by_pair[0])
        counts, totals = self.by_pair[:, keys]
        return _top_rows(self.names.values, self.categories, keys, counts, totals)


def _streams(k: Table, dur: np.ndarray, comm: np.ndarray) -> list[dict[str, int]]:
    """Kernels and ns per stream (all and comm), busiest stream first: the whole columns' tally for streams
    whose numbers are too sparse for a bincount."""
    inverse, streams = factorize(k.col("stream"))
    kernels = np.bincount(inverse, minlength=len(streams))
    ns = np.bincount(inverse, weights=dur, minlength=len(streams))
    comm_kernels = np.bincount(inverse[comm], minlength=len(streams))
    comm_ns = np.bincount(inverse[comm], weights=dur[comm], minlength=len(streams))
    return [{"stream": int(streams[i]), "kernels": int(kernels[i]), "ns": int(round(ns[i])),
             "comm_kernels": int(comm_kernels[i]), "comm_ns": int(round(comm_ns[i]))}
            for i in np.argsort(-ns, kind="stable")]


def _top_kernels(k: Table, kc: dict[str, Coded], dur: np.ndarray) -> list[dict]:
    """The kernels that take the most time, by short name and category: a short name drops the template
    arguments that classify a kernel, so one name can hold several kinds (PyTorch's
    ``vectorized_elementwise_kernel`` runs both adds and ``fill_`` memsets) and gets one row per kind. The
    whole columns' tally, for more (name, category) pairs than a bincount should count."""
    category_codes, categories = kc["category"]
    pair = k["short_name"].codes.astype(np.int64) * len(categories) + category_codes
    inverse, keys = factorize(pair, sort=True)
    totals = np.bincount(inverse, weights=dur, minlength=len(keys))
    counts = np.bincount(inverse, minlength=len(keys))
    return _top_rows(k["short_name"].values, categories, keys, counts, totals)


def _top_rows(names: np.ndarray, categories: list, keys: np.ndarray, counts: np.ndarray,
              totals: np.ndarray) -> list[dict]:
    """The :data:`TOP_KERNELS` (name, category) pairs (``keys``: name code × categories + category code,
    ascending) with the most ns."""
    order = np.argsort(-totals, kind="stable")[:TOP_KERNELS]
    return [{"name": str(names[keys[i] // len(categories)]), "category": categories[keys[i] % len(categories)],
             "count": int(counts[i]),
             "ns": int(round(totals[i]))} for i in order if counts[i]]
