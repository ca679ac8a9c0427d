"""Which parallel group (DP/TP/CP/PP/EP) each communication kernel belongs to.

Sources, strongest first (DESIGN §4): perfdoctor ``comm ... group=<g>`` NVTX ranges projected onto the
kernels they launched (``label_source`` "nvtx"; ``capture`` for the same labels recorded as
``record_function`` ranges by ``perfdoctor capture --profiler torch``, together with the hook's name
for each process group, which labels the NCCL kernels launched outside those ranges); then facts of
the kernel itself (``heuristic``):
Transformer Engine userbuffers kernels exist only for TP comm-GEMM overlap, DeepEP / HybridEP dispatch and
combine only for expert parallelism; then NCCL's own NVTX
payloads (``nccl_payload``, nsys 2026.x exports with blobs): the kernels of one communicator are one
process group, named by the communicator's size against the run config or by the vote of its kernels'
guesses; in PyTorch profiler traces, the process group recorded on each NCCL kernel (``kineto_pg``:
Megatron's group descriptions name the group, other groups are communicators named like NCCL's); then
the name-only fallback of ``group_heuristics`` (streams, launch-order neighbours, the
run config). Every label has a confidence (high | medium | low) so a guess is never presented as a
fact; kernels no source can label stay unlabelled."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from perfdoctor.classify.communicators import Communicators, communicators
from perfdoctor.classify.group_heuristics import AGREEMENT, CANDIDATES, CONFIDENCE, group_sizes, heuristic_groups
from perfdoctor.classify.projection import NO_RANGE, enclosing_range, kernel_launch_calls
from perfdoctor.classify.timeline import category_mask
from perfdoctor.load.labels import labelled_rows, matching, message_codes, parse_label
from perfdoctor.mapped import like
from perfdoctor.model import Timeline
from perfdoctor.table import Table, distinct, factorize

GROUPS = (*CANDIDATES, "other")  # a candidate's index is its group code
SOURCES = ("nvtx", "nccl_payload", "heuristic", "kineto_pg", "capture")
# Megatron's finer groups fold into the report's groups: expert-TP is TP traffic, expert-DP is DP
# traffic; embedding and model-parallel (grad-norm, loss) reductions are small "other" traffic.
FOLD = {"etp": "tp", "edp": "dp", "embd": "other", "mp": "other"}
UNLABELLED = -1


@dataclass(frozen=True)
class GroupLabels:
    """Per kernel (aligned with the kernels table), small integer codes: the group (index into
    ``GROUPS``), how it was found (into ``SOURCES``) and how sure (into ``CONFIDENCE``); ``UNLABELLED``
    for compute kernels and comm kernels no source could label. Codes, not strings: every
    measurement selects kernels by group, and on a million kernels an integer compare is what pays."""

    codes: np.ndarray  # int8
    source_codes: np.ndarray  # int8
    confidence_codes: np.ndarray  # int8

    @cached_property
    def group(self) -> np.ndarray:
        """Group names (object array, ``None`` where unlabelled)."""
        return decode(self.codes, GROUPS)

    @cached_property
    def source(self) -> np.ndarray:
        return decode(self.source_codes, SOURCES)

    @cached_property
    def confidence(self) -> np.ndarray:
        return decode(self.confidence_codes, CONFIDENCE)

    @cached_property
    def any_labelled(self) -> bool:
        """Whether some kernel has a group (asked once per window of steps: a pass over every kernel)."""
        return bool((self.codes >= 0).any())

    def summary(self, kernels: Table) -> dict[str, dict[str, Any]]:
        """How each group's labels were obtained, for the report (DESIGN §4): per group, its kernel
        count and time, and the kernels and ns per ``label_source`` and per confidence."""
        labelled = np.flatnonzero(self.codes >= 0)
        dur = (kernels.col("end")[labelled] - kernels.col("start")[labelled]).astype(np.float64)
        codes = self.codes[labelled]
        out: dict[str, dict[str, Any]] = {}
        for i, g in enumerate(GROUPS):
            mine = codes == i
            if not mine.any():
                continue
            out[g] = {"kernels": int(mine.sum()), "ns": int(dur[mine].sum()),
                      "label_source": _tally(self.source_codes[labelled][mine], SOURCES, dur[mine]),
                      "confidence": _tally(self.confidence_codes[labelled][mine], CONFIDENCE, dur[mine])}
        return out


def _by_communicator(comms: Communicators, comm_idx: np.ndarray, known: np.ndarray, guess: np.ndarray,
                     kernels: Table, config: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """One group per NCCL communicator (a communicator is one process group), for its kernels: the
    NVTX label some of them carry; else the one group whose configured size equals the communicator's
    (high confidence); else the duration-weighted vote of the kernels' heuristic guesses among the
    groups of that size (medium when near unanimous, else low). Group and confidence codes per comm kernel
    (``known`` and ``guess`` too are aligned with ``comm_idx``)."""
    named = np.full(known.size, UNLABELLED, dtype=np.int8)
    sure = np.full(known.size, UNLABELLED, dtype=np.int8)
    sizes = group_sizes(config)
    start, end = kernels.col("start"), kernels.col("end")
    has = comms.of >= 0
    of = comms.of[has]
    order = np.argsort(of, kind="stable")
    by_comm = np.flatnonzero(has)[order]  # the comm kernels of each communicator, in row order
    bounds = np.searchsorted(of[order], np.arange(comms.ids.size + 1))
    for c in range(comms.ids.size):
        members = by_comm[bounds[c]:bounds[c + 1]]
        facts = known[members][known[members] >= 0]
        if facts.size:
            named[members], sure[members] = np.bincount(facts).argmax(), CONFIDENCE.index("high")
            continue
        allowed = np.array([sizes[g] is None or sizes[g] > 1 for g in CANDIDATES])
        if comms.sizes[c] > 0:
            fits = np.array([sizes[g] == comms.sizes[c] for g in CANDIDATES])
            if fits.sum() == 1:
                named[members], sure[members] = int(np.argmax(fits)), CONFIDENCE.index("high")
                continue
            if fits.any():
                allowed &= fits
        voters = members[(guess[members] >= 0)]
        dur = (end[comm_idx[voters]] - start[comm_idx[voters]]).astype(np.float64)
        votes = np.bincount(guess[voters], weights=dur + 1.0, minlength=len(CANDIDATES))
        votes[~allowed] = 0.0
        if votes.sum() > 0:
            named[members] = int(np.argmax(votes))
            sure[members] = CONFIDENCE.index("medium" if votes.max() >= AGREEMENT * votes.sum() else "low")
    return named, sure


def decode(codes: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
    """Names of ``codes`` (object array; ``None`` for negative codes)."""
    return np.array([*names, None], dtype=object)[np.where(codes >= 0, codes, len(names))]


def label_groups(tl: Timeline, kcls: Table, config: dict[str, Any] | None = None) -> GroupLabels:
    """Label the comm kernels of one timeline (``kcls``: the taxonomy of ``tl.kernels``; ``config``: the
    run's parallel config, whose known group sizes rule groups in or out of the heuristics)."""
    n = len(tl.kernels)
    start = tl.kernels["start"] if n else np.zeros(0, dtype=np.int64)
    group, source, confidence = (like(n, np.int8, start, fill=UNLABELLED) for _ in range(3))
    comm_idx = np.flatnonzero(category_mask(kcls, "comm"))
    if comm_idx.size:
        group[comm_idx], source[comm_idx], confidence[comm_idx] = _label_comm(tl, kcls, comm_idx, config or {})
    return GroupLabels(group, source, confidence)


def _label_comm(tl: Timeline, kcls: Table, comm_idx: np.ndarray,
                config: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group, source and confidence codes of the comm kernels ``comm_idx``, aligned with it: every source
    works on the comm kernels alone (at 10M kernels, a few MB per array instead of 10)."""
    m = comm_idx.size
    group = np.full(m, UNLABELLED, dtype=np.int8)
    source = np.full(m, UNLABELLED, dtype=np.int8)
    confidence = np.full(m, UNLABELLED, dtype=np.int8)
    _from_nvtx(tl, comm_idx, group)
    if tl.trace.capture_groups and "pg_name" in tl.kernels.columns:
        _from_capture_groups(tl, comm_idx, group)
    source[group >= 0] = SOURCES.index("capture" if tl.trace.format == "kineto-json" else "nvtx")
    confidence[group >= 0] = CONFIDENCE.index("high")
    named, sure = _from_process_groups(tl, comm_idx, group)
    pg = (named >= 0) & (group < 0)
    group[pg], source[pg], confidence[pg] = named[pg], SOURCES.index("kineto_pg"), sure[pg]
    named, sure = _from_c10d_ops(tl, comm_idx, group, config)
    op = (named >= 0) & (group < 0)
    group[op], source[op], confidence[op] = named[op], SOURCES.index("heuristic"), sure[op]
    for fact, g in _library_facts(kcls, comm_idx):
        mine = np.flatnonzero(fact & (group < 0))
        group[mine], source[mine], confidence[mine] = GROUPS.index(g), SOURCES.index("heuristic"), \
            CONFIDENCE.index("high")
    guess, how_sure = heuristic_groups(tl.kernels, kcls, config, comm_idx, group)
    comms = communicators(tl, comm_idx)
    if comms.ids.size:
        named, sure = _by_communicator(comms, comm_idx, group, guess, tl.kernels, config)
        payload = (named >= 0) & (group < 0)
        group[payload] = named[payload]
        source[payload] = SOURCES.index("nccl_payload" if "pg_name" not in tl.kernels.columns else "kineto_pg")
        confidence[payload] = sure[payload]
    guessed = (guess >= 0) & (group < 0)
    group[guessed] = guess[guessed]
    source[guessed] = SOURCES.index("heuristic")
    confidence[guessed] = how_sure[guessed]
    return group, source, confidence


def _library_facts(kcls: Table, comm_idx: np.ndarray) -> list[tuple[np.ndarray, str]]:
    """Comm kernels whose library fixes their group (masks over ``comm_idx``, with the group): Transformer
    Engine userbuffers exist only for TP comm-GEMM overlap; DeepEP-family dispatch/combine kernels only
    for expert parallelism (MoE token exchange), except DeepEP v2's pipeline send/recv."""
    library = kcls["library"][comm_idx]
    deep_ep = library.mask("deep_ep")
    p2p = kcls["collective"][comm_idx].mask("send_recv")
    return [(library.mask("userbuffers"), "tp"), (deep_ep & ~p2p, "ep"), (deep_ep & p2p, "pp")]


def _from_process_groups(tl: Timeline, comm_idx: np.ndarray, group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Groups named by the process group a Kineto trace records on each NCCL kernel: Megatron's group
    descriptions (``TENSOR_MODEL_PARALLEL_GROUP``) are facts (high confidence). Without any Megatron
    description in the trace there is no Megatron parallel state, and the default (world) group is the
    data-parallel group of plain DDP/FSDP training (medium: an inference from the program's shape).
    Other groups stay for the communicator vote below. Codes per comm kernel, as ``group``."""
    named = np.full(comm_idx.size, UNLABELLED, dtype=np.int8)
    sure = np.full(comm_idx.size, UNLABELLED, dtype=np.int8)
    if "pg_desc" not in tl.kernels.columns or not comm_idx.size:
        return named, sure
    from perfdoctor.capture.hook.groups import from_description  # the hook's parser: only for Kineto groups
    desc = tl.kernels.col("pg_desc")[comm_idx]
    codes, uniques = factorize(np.asarray(desc, dtype=object))
    groups = [from_description(d if isinstance(d, str) else None) for d in uniques]
    megatron = any(g is not None for g in groups)
    for i, (d, g) in enumerate(zip(uniques, groups)):
        if g is None and not megatron and d == "default_pg":
            g, how_sure = "dp", "medium"
        else:
            how_sure = "high"
        if g is None:
            continue
        g = FOLD.get(g, g)
        mine = (codes == i) & (group < 0)
        named[mine], sure[mine] = GROUPS.index(g), CONFIDENCE.index(how_sure)
    return named, sure


# PyTorch's c10d record_function names around each collective call (``nccl:all_reduce``), in a profiler
# trace without process-group args: what each op is in a program without model parallelism.
C10D_OP = re.compile(r"^nccl:(\w+)$")
DATA_PARALLEL_OPS = {"all_reduce", "allreduce", "allreduce_coalesced", "reduce_scatter", "_reduce_scatter_base",
                     "reduce_scatter_tensor_coalesced", "all_gather", "_allgather_base", "allgather",
                     "allgather_into_tensor_coalesced", "broadcast", "reduce"}


def _from_c10d_ops(tl: Timeline, comm_idx: np.ndarray, group: np.ndarray,
                   config: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Groups of a PyTorch profiler trace's NCCL kernels that name no process group (PyTorch < 2.3), from
    the c10d op range that encloses their launch, when the run has no model parallelism (no tp/cp/pp/ep
    above 1 known): reductions, gathers and broadcasts are data-parallel (DDP/FSDP); all-to-all and
    point-to-point exchanges are model-parallel traffic of the program's own ("other"). Medium
    confidence: an inference from the op and the absence of model parallelism, not a recorded group.
    Codes per comm kernel, as ``group``."""
    named = np.full(comm_idx.size, UNLABELLED, dtype=np.int8)
    sure = np.full(comm_idx.size, UNLABELLED, dtype=np.int8)
    if tl.trace.format != "kineto-json" or "pg_name" in tl.kernels.columns or not comm_idx.size:
        return named, sure
    if any((config.get(k) or 1) > 1 for k in ("tp", "cp", "pp", "ep")):
        return named, sure
    ranges = matching(tl.nvtx, C10D_OP)
    ranges = ranges[ranges.col("end") >= 0]
    if not len(ranges):
        return named, sure
    todo = np.flatnonzero(group < 0)
    c_start, c_end, c_tid = kernel_launch_calls(tl, comm_idx[todo])
    which = enclosing_range(c_start, c_end, c_tid, ranges)
    hit = which != NO_RANGE
    ops = ranges.col("text")[which[hit]]
    codes = np.array([GROUPS.index("dp" if C10D_OP.match(t).group(1) in DATA_PARALLEL_OPS else "other")
                      for t in ops], dtype=np.int8)
    named[todo[hit]], sure[todo[hit]] = codes, CONFIDENCE.index("medium")
    return named, sure


def _tally(codes: np.ndarray, names: tuple[str, ...], dur: np.ndarray) -> dict[str, dict[str, int]]:
    """``{name: {"kernels": n, "ns": t}}`` over the codes present."""
    counts = np.bincount(codes, minlength=len(names))
    ns = np.bincount(codes, weights=dur, minlength=len(names))
    return {names[i]: {"kernels": int(counts[i]), "ns": int(ns[i])} for i in np.flatnonzero(counts)}


def _from_nvtx(tl: Timeline, comm_idx: np.ndarray, group: np.ndarray) -> None:
    """Group codes of the comm kernels launched inside perfdoctor ``comm`` ranges (in place; ``group`` is
    aligned with ``comm_idx``)."""
    rows = labelled_rows(tl.nvtx, "comm")
    rows = rows[tl.nvtx["end"][rows] >= 0]
    if not rows.size:
        return
    ranges = tl.nvtx.take(rows)
    codes, messages = message_codes(tl.nvtx)
    mine = codes[rows]
    present = distinct(mine)
    group_of = np.zeros(messages.size, dtype=np.int8)
    group_of[present] = [GROUPS.index(_group_of(messages[m])) for m in present]  # each message once
    c_start, c_end, c_tid = kernel_launch_calls(tl, comm_idx)
    which = enclosing_range(c_start, c_end, c_tid, ranges)
    hit = which != NO_RANGE
    group[hit] = group_of[mine[which[hit]]]


def _from_capture_groups(tl: Timeline, comm_idx: np.ndarray, group: np.ndarray) -> None:
    """Group codes of unlabelled comm kernels whose process group the capture hook named (in place; ``group``
    is aligned with ``comm_idx``)."""
    todo = np.flatnonzero(group < 0)
    names = np.asarray(tl.kernels.col("pg_name")[comm_idx[todo]], dtype=object)
    codes, uniques = factorize(names)
    named = np.array([GROUPS.index(_group_of(f"comm group={tl.trace.capture_groups[u]}"))
                      if isinstance(u, str) and u in tl.trace.capture_groups else UNLABELLED for u in uniques]
                     + [UNLABELLED], dtype=np.int8)
    group[todo] = named[codes]


def _group_of(text: str) -> str:
    g = parse_label(text)[1].get("group", "other").lower()
    g = FOLD.get(g, g)
    return g if g in GROUPS else "other"

