"""Parallel group of communication kernels no label names: the name-only fallback of
research/kernel_taxonomy.md §6.3, from the evidence a plain nsys capture still holds.

- **Position in launch order.** Correlation ids order every kernel as the CPU launched it, whatever
  stream it ran on, so each comm kernel has compute neighbours even on its own stream. Megatron's
  fingerprints (§6.2) are positions: a TP all-gather feeds the GEMM launched next and a TP
  reduce-scatter / all-reduce consumes the GEMM launched before; CP exchanges sit inside or right
  beside the attention kernels; EP all-to-alls (SendRecv) wrap the expert GEMMs next to the MoE
  permute kernels; DP buckets sit between the last GEMM of the backward and the optimizer, or between
  the optimizer and the first GEMM; a SendRecv with none of these neighbours is a pipeline transfer
  at a micro-batch boundary.
- **Streams.** A stream that runs (almost) only comm kernels is one process group's NCCL stream: its
  kernels share one label, the duration-weighted vote of the per-kernel evidence. Comm kernels on the
  compute stream (synchronous collectives, p2p) are judged one by one.
- **Config.** A group whose known size is 1 has no traffic and is never chosen; a group the config
  confirms raises the confidence.

Every label carries a confidence (high | medium | low): positions and streams are evidence, not facts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from perfdoctor.classify.kernels import classify_kernel
from perfdoctor.table import Strings, Table, distinct

CANDIDATES = ("dp", "tp", "cp", "pp", "ep")
CONFIDENCE = ("low", "medium", "high")
# A stream whose kernels are at least this share comm is a process group's own NCCL stream.
COMM_STREAM_SHARE = 0.9
# Compute kernels between a comm kernel and an attention / MoE kernel for them to count as neighbours.
NEAR = 2
# A comm stream (or NCCL communicator) whose kernels agree on one group by at least this share of their
# time: medium confidence.
AGREEMENT = 0.9
# On a stream where at least this share of the SendRecv kernels sit beside attention, the SendRecvs are
# context-parallel all-to-alls before and after attention (Ulysses), not pipeline transfers.
ULYSSES_SHARE = 0.25

# Compute-kernel codes in launch order. Casts and FP8 scaling are transparent: they run between a
# collective and the GEMM it feeds.
OTHER, GEMM, ATTENTION, OPTIMIZER, MOE = 0, 1, 2, 3, 4
COMM, TRANSPARENT = -1, -2
_KIND_CODES = {"moe": MOE, "cast_transpose": TRANSPARENT, "fp8_scaling": TRANSPARENT}
_CATEGORY_CODES = {"gemm": GEMM, "attention": ATTENTION, "optimizer": OPTIMIZER, "comm": COMM}
_NONE = np.iinfo(np.int64).max // 4  # distance to a neighbour that does not exist

SLICE = 1 << 18  # kernels counted at a time

# Evidence scores (higher wins); a baseline is what a collective type is when nothing else is known.
STRONG = 2.0


def heuristic_groups(kernels: Table, kcls: Table, config: dict[str, Any], idx: np.ndarray,
                     known: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group (index into ``CANDIDATES``) and confidence (index into ``CONFIDENCE``), int8 arrays aligned
    with the comm kernels ``idx`` (every comm kernel of ``kernels``, in row order), for those whose
    ``known`` group code is negative; −1 elsewhere, and where the config rules out every candidate group.
    ``known``: group codes found by other means, aligned with ``idx``."""
    group = np.full(idx.size, -1, dtype=np.int8)
    confidence = np.full(idx.size, -1, dtype=np.int8)
    todo = known < 0
    if not todo.any():
        return group, confidence
    codes = _codes(kernels, kcls)
    collective = kcls["collective"][idx]  # dictionary-encoded: a mask per collective type is a lookup
    scores = _scores(_neighbours(kernels, codes, idx), collective)
    sizes = group_sizes(config)
    ruled_out = np.array([sizes[g] is not None and sizes[g] <= 1 for g in CANDIDATES])
    scores[:, ruled_out] = -np.inf
    best = np.argmax(scores, axis=1)
    winner = np.where(np.isfinite(scores.max(axis=1)), best, -1)
    strong = scores.max(axis=1) >= STRONG
    _ulysses(kernels.col("stream")[idx], collective, winner, strong, ruled_out)
    conf = np.zeros(idx.size, dtype=np.int64)  # index into CONFIDENCE
    _per_stream(kernels, idx, known, winner, conf)
    confirmed = np.array([sizes[g] is not None and sizes[g] > 1 for g in CANDIDATES])
    bump = (winner >= 0) & confirmed[np.maximum(winner, 0)]
    conf = np.minimum(conf + bump, len(CONFIDENCE) - 1)
    mine = todo & (winner >= 0)
    group[mine] = winner[mine]
    confidence[mine] = conf[mine]
    return group, confidence


def group_sizes(config: dict[str, Any]) -> dict[str, int | None]:
    """Size of each candidate group's traffic as far as ``config`` knows it (``None``: unknown).

    Megatron reduces gradients over DP×CP (§6.2), so a run with dp=1 still has DP traffic when cp > 1.
    """
    sizes = {g: config.get(g) for g in CANDIDATES}
    dp, cp = sizes["dp"], sizes["cp"]
    if dp is not None and (dp > 1 or cp is not None):
        sizes["dp"] = dp * (cp or 1)
    elif dp == 1:
        sizes["dp"] = None
    return sizes


def _codes(kernels: Table, kcls: Table) -> np.ndarray:
    """Compute-kernel code of every kernel; the taxonomy's ``kind`` is looked up once per distinct name."""
    category = kcls["category"]  # a code per distinct category, then one lookup per kernel
    # int8: a handful of codes, one byte per kernel (these are the heuristics' per-kernel temporaries)
    by_category = np.array([_CATEGORY_CODES.get(v, OTHER) for v in category.values] + [OTHER], dtype=np.int8)
    names = kernels["short_name"]  # each distinct name classified once: no work per million kernels
    kind_code = np.array([_KIND_CODES.get(classify_kernel(str(s)).kind, OTHER) for s in names.values]
                         + [OTHER], dtype=np.int8)
    codes = np.empty(category.codes.size, dtype=np.int8)
    for lo in range(0, codes.size, SLICE):  # the lookups a slice at a time: one array of the kernels' size
        part = by_category[category.codes[lo:lo + SLICE]]
        np.copyto(codes[lo:lo + SLICE], np.where(part == OTHER, kind_code[names.codes[lo:lo + SLICE]], part))
    return codes


def _launch_order(kernels: Table) -> np.ndarray | None:
    """Kernel rows in the order the CPU launched them: by correlation id when every kernel has one;
    None when the rows already are in that order."""
    corr = kernels.col("correlation_id")
    start = kernels.col("start")
    if len(corr) and (corr > 0).all():
        if np.all(corr[1:] > corr[:-1]):
            return None
        return np.lexsort((start, corr))
    return np.argsort(start, kind="stable")


def _neighbours(kernels: Table, codes: np.ndarray, idx: np.ndarray) -> dict[str, np.ndarray]:
    """Per comm kernel ``idx``: how many compute kernels lie between it and the nearest compute kernel
    of each code, before (``*_prev``) and after (``*_next``) it in launch order; and whether an
    optimizer kernel is nearer than any GEMM or attention kernel (``near_optimizer``)."""
    order = _launch_order(kernels)
    if order is None:  # rows in launch order: a row is its launch position (no per-kernel copies)
        position, seq = idx, codes
    else:
        rank = np.empty(order.size, dtype=np.int64)
        rank[order] = np.arange(order.size)
        position, seq = rank[idx], codes[order]
    nxt = _computes_before(seq, position)  # index (among the compute kernels) of the next compute kernel
    prv = nxt - 1
    out: dict[str, np.ndarray] = {}
    kinds = {"gemm": (GEMM,), "attention": (ATTENTION,), "moe": (MOE,), "optimizer": (OPTIMIZER,),
             "layer": (GEMM, ATTENTION)}
    for name, at in _compute_index(seq, kinds).items():
        out[f"{name}_next"] = _distance_next(at, nxt)
        out[f"{name}_prev"] = _distance_prev(at, prv)
    out["near_optimizer"] = (out["optimizer_next"] < out["layer_next"]) | (out["optimizer_prev"] < out["layer_prev"])
    return out


def _computes_before(seq: np.ndarray, position: np.ndarray) -> np.ndarray:
    """How many compute kernels (codes >= 0 in the launch-order ``seq``) come before each launch position,
    counted a slice at a time: no array of every compute kernel's position."""
    out = np.empty(position.size, dtype=np.int64)
    slice_of = position // SLICE
    base = 0
    for s, lo in enumerate(range(0, seq.size, SLICE)):
        compute = seq[lo:lo + SLICE] >= 0
        if (mine := np.flatnonzero(slice_of == s)).size:
            before = np.concatenate(([0], np.cumsum(compute, dtype=np.int64)))
            out[mine] = before[position[mine] - lo] + base
        base += int(np.count_nonzero(compute))
    return out


def _compute_index(seq: np.ndarray, kinds: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Per kind (a name and its codes): the index among the compute kernels (codes >= 0 in the launch-order
    ``seq``) of each kernel of one of its codes, ascending; int32 while the kernels are fewer than 2**31, made a
    slice at a time (at 10M kernels a few MB at once, not the 80 MB of every compute kernel's position), the
    slice's compute kernels taken once for every kind (the kinds' codes are compute codes, >= 0)."""
    dtype = np.int32 if seq.size < np.iinfo(np.int32).max else np.int64
    out: dict[str, list[np.ndarray]] = {name: [] for name in kinds}
    base = 0
    for lo in range(0, seq.size, SLICE):
        part = seq[lo:lo + SLICE]
        compute = part[part >= 0]  # the slice's compute kernels in order: a kernel's place is its index
        for name, codes in kinds.items():
            want = compute == codes[0]
            for code in codes[1:]:
                want |= compute == code
            out[name].append((np.flatnonzero(want) + base).astype(dtype))
        base += compute.size
    return {name: np.concatenate(parts) if parts else np.zeros(0, dtype=dtype) for name, parts in out.items()}


def _distance_next(at: np.ndarray, i: np.ndarray) -> np.ndarray:
    """Compute kernels from position ``i`` to the first of ``at`` at or after it (``_NONE`` if none)."""
    j = np.searchsorted(at, i)
    ok = j < at.size
    return np.where(ok, at[np.minimum(j, max(at.size - 1, 0))] - i if at.size else 0, _NONE)


def _distance_prev(at: np.ndarray, i: np.ndarray) -> np.ndarray:
    """Compute kernels from the last of ``at`` at or before position ``i`` to ``i`` (``_NONE`` if none)."""
    j = np.searchsorted(at, i, side="right") - 1
    ok = (j >= 0) & (i >= 0)
    return np.where(ok, i - at[np.maximum(j, 0)] if at.size else 0, _NONE)


def _scores(nb: dict[str, np.ndarray], collective: Strings) -> np.ndarray:
    """Evidence per comm kernel (rows) for each group of ``CANDIDATES`` (columns); §6.3 as numbers."""
    p2p = collective.mask("send_recv", "all_to_all")
    inside_attention = (nb["attention_prev"] == 0) & (nb["attention_next"] == 0)
    near_attention = (nb["attention_prev"] <= NEAR) | (nb["attention_next"] <= NEAR)
    near_moe = (nb["moe_prev"] <= NEAR) | (nb["moe_next"] <= NEAR)
    feeds_gemm = np.where(collective.mask("all_gather"), nb["gemm_next"] == 0,
                          collective.mask("reduce_scatter", "all_reduce") & (nb["gemm_prev"] == 0))
    beside_gemm = (nb["gemm_prev"] == 0) | (nb["gemm_next"] == 0)
    s = np.zeros((len(collective), len(CANDIDATES)))
    dp, tp, cp, pp, ep = (CANDIDATES.index(g) for g in ("dp", "tp", "cp", "pp", "ep"))
    # Collectives: TP when they feed or drain a GEMM, CP between attention kernels, DP beside the
    # optimizer, and DP by default (buckets launched as gradients become ready).
    s[:, tp] = np.where(~p2p & feeds_gemm, 3.0, 0.0)
    s[:, cp] = np.where(inside_attention, 2.5, np.where(near_attention, 2.0, 0.0))
    s[:, dp] = np.where(~p2p, np.where(nb["near_optimizer"], 2.5, 1.0), -np.inf)
    # SendRecv: CP beside attention, EP beside the MoE permutes or the expert GEMMs, else PP.
    s[:, ep] = np.where(p2p, np.where(near_moe, 2.5, np.where(beside_gemm, 1.5, 0.0)), -np.inf)
    s[:, pp] = np.where(p2p, 1.0, -np.inf)
    s[:, tp] = np.where(p2p, -np.inf, s[:, tp])
    return s


def _ulysses(stream: np.ndarray, collective: Strings, winner: np.ndarray, strong: np.ndarray,
             ruled_out: np.ndarray) -> None:
    """SendRecvs without neighbours on a stream whose SendRecvs often sit beside attention are the
    other half of an all-to-all pair around attention (CP), not pipeline transfers; in place."""
    cp, pp = CANDIDATES.index("cp"), CANDIDATES.index("pp")
    if ruled_out[cp]:
        return
    p2p = collective.mask("send_recv", "all_to_all")
    for s in distinct(stream[p2p]):
        mine = p2p & (stream == s)
        if np.mean((winner[mine] == cp) & strong[mine]) >= ULYSSES_SHARE:
            winner[mine & (winner == pp) & ~strong] = cp


def _per_stream(kernels: Table, idx: np.ndarray, known: np.ndarray,
                winner: np.ndarray, conf: np.ndarray) -> None:
    """One label per process-group stream (in place): the NVTX label its other kernels carry, else
    the duration-weighted vote of its kernels; medium confidence when the vote is near unanimous.
    ``known``, ``winner`` and ``conf`` are aligned with the comm kernels ``idx``."""
    stream = kernels.col("stream")
    streams, of_comm = np.unique(stream[idx], return_inverse=True)  # the stream of each comm kernel
    share = np.bincount(of_comm, minlength=streams.size) / _kernels_on(stream, streams)
    dur = (kernels.col("end")[idx] - kernels.col("start")[idx]).astype(np.float64)
    for k in np.flatnonzero(share >= COMM_STREAM_SHARE):
        mine = of_comm == k
        labelled = [int(g) for g in distinct(known[mine]) if 0 <= g < len(CANDIDATES)]
        if len(labelled) == 1:
            winner[mine] = labelled[0]
            conf[mine] = CONFIDENCE.index("high")
            continue
        ok = mine & (winner >= 0)
        if not ok.any():
            continue
        votes = np.bincount(winner[ok], weights=dur[ok] + 1.0, minlength=len(CANDIDATES))
        winner[ok] = int(np.argmax(votes))
        conf[ok] = CONFIDENCE.index("medium" if votes.max() >= AGREEMENT * votes.sum() else "low")


def _kernels_on(stream: np.ndarray, streams: np.ndarray) -> np.ndarray:
    """How many kernels run on each of ``streams`` (sorted), counted a slice at a time: a bincount of the
    stream numbers when they are dense, else a search among ``streams`` (no code per kernel held whole)."""
    counts = np.zeros(streams.size, dtype=np.int64)
    if not stream.size:
        return counts
    low, high = int(streams[0]), int(streams[-1])
    for lo in range(0, stream.size, SLICE):
        part = stream[lo:lo + SLICE]
        part = part[(part >= low) & (part <= high)]
        if high - low <= SLICE:
            counts += np.bincount(part.astype(np.int64) - low, minlength=high - low + 1)[streams - low]
        else:
            at = np.searchsorted(streams, part)
            counts += np.bincount(at[streams[np.minimum(at, streams.size - 1)] == part], minlength=streams.size)
    return counts
