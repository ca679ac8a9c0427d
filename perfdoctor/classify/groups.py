"""Which parallel group (DP/TP/CP/PP/EP) each communication kernel belongs to.

Sources, strongest first (DESIGN §4): perfdoctor ``comm ... group=<g>`` NVTX ranges projected onto the
kernels they launched (``label_source`` "nvtx"); then facts of the kernel itself (``heuristic``):
Transformer Engine userbuffers kernels exist only for TP comm-GEMM overlap; then the name-only
fallback of ``group_heuristics`` (streams, launch-order neighbours, the run config). Every label has a
confidence (high | medium | low) so a guess is never presented as a fact; kernels no source can label
keep ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from perfdoctor.classify.group_heuristics import heuristic_groups
from perfdoctor.classify.projection import NO_RANGE, enclosing_range, launch_calls
from perfdoctor.classify.timeline import category_mask
from perfdoctor.load.labels import labelled, parse_label
from perfdoctor.model import Timeline

GROUPS = ("dp", "tp", "cp", "pp", "ep", "other")
# Megatron's finer groups fold into the report's groups: expert-TP is TP traffic, expert-DP is DP
# traffic; embedding and model-parallel (grad-norm, loss) reductions are small "other" traffic.
FOLD = {"etp": "tp", "edp": "dp", "embd": "other", "mp": "other"}


@dataclass(frozen=True)
class GroupLabels:
    """Per comm kernel (aligned with the kernels table; ``None`` for compute kernels or unknown)."""

    group: np.ndarray  # object: dp|tp|cp|pp|ep|other|None
    source: np.ndarray  # object: nvtx|heuristic|None
    confidence: np.ndarray  # object: high|medium|low|None

    @cached_property
    def codes(self) -> np.ndarray:
        """Group as an index into ``GROUPS`` (−1: not labelled): integer masks instead of object compares."""
        codes = np.full(self.group.size, -1, dtype=np.int8)
        for i, g in enumerate(GROUPS):
            codes[self.group == g] = i
        return codes

    @property
    def any_labelled(self) -> bool:
        return bool((self.codes >= 0).any())

    def summary(self, kernels: pd.DataFrame) -> dict[str, dict[str, Any]]:
        """How each group's labels were obtained, for the report (DESIGN §4): per group, its kernel
        count and time, and the kernels and ns per ``label_source`` and per confidence."""
        dur = (kernels["end"].to_numpy() - kernels["start"].to_numpy()) if len(kernels) else np.zeros(0)
        out: dict[str, dict[str, Any]] = {}
        for i, g in enumerate(GROUPS):
            mine = self.codes == i
            if not mine.any():
                continue
            out[g] = {"kernels": int(mine.sum()), "ns": int(dur[mine].sum()),
                      "label_source": _tally(self.source[mine], dur[mine]),
                      "confidence": _tally(self.confidence[mine], dur[mine])}
        return out


def label_groups(tl: Timeline, kcls: pd.DataFrame, config: dict[str, Any] | None = None) -> GroupLabels:
    """Label the comm kernels of one timeline (``kcls``: the taxonomy of ``tl.kernels``; ``config``: the
    run's parallel config, whose known group sizes rule groups in or out of the heuristics)."""
    n = len(tl.kernels)
    group = np.full(n, None, dtype=object)
    source = np.full(n, None, dtype=object)
    confidence = np.full(n, None, dtype=object)
    comm_idx = np.flatnonzero(category_mask(kcls, "comm"))
    if comm_idx.size:
        _from_nvtx(tl, comm_idx, group, source)
        confidence[source == "nvtx"] = "high"
        userbuffers = (kcls["library"].to_numpy(dtype=object) == "userbuffers") & (source == None)  # noqa: E711
        group[userbuffers] = "tp"
        source[userbuffers] = "heuristic"
        confidence[userbuffers] = "high"  # userbuffers kernels exist only for TP overlap: a fact
        guess, how_sure = heuristic_groups(tl.kernels, kcls, config or {}, group)
        guessed = guess != None  # noqa: E711
        group[guessed] = guess[guessed]
        source[guessed] = "heuristic"
        confidence[guessed] = how_sure[guessed]
    return GroupLabels(group, source, confidence)


def _tally(values: np.ndarray, dur: np.ndarray) -> dict[str, dict[str, int]]:
    """``{value: {"kernels": n, "ns": t}}`` over the distinct values."""
    inverse, keys = pd.factorize(values)
    counts = np.bincount(inverse, minlength=len(keys))
    ns = np.bincount(inverse, weights=dur.astype(np.float64), minlength=len(keys))
    return {str(k): {"kernels": int(c), "ns": int(t)} for k, c, t in zip(keys, counts, ns)}


def _from_nvtx(tl: Timeline, comm_idx: np.ndarray, group: np.ndarray, source: np.ndarray) -> None:
    ranges = labelled(tl.nvtx, "comm")
    ranges = ranges[ranges["end"].to_numpy() >= 0]
    if not len(ranges):
        return
    codes, texts = pd.factorize(ranges["text"].to_numpy(dtype=object))
    names = np.array([_group_of(t) for t in texts], dtype=object)[codes]  # each distinct message once
    c_start, c_end, c_tid = launch_calls(tl.kernels.iloc[comm_idx], tl.api)
    which = enclosing_range(c_start, c_end, c_tid, ranges)
    hit = which != NO_RANGE
    group[comm_idx[hit]] = names[which[hit]]
    source[comm_idx[hit]] = "nvtx"


def _group_of(text: str) -> str:
    g = parse_label(text)[1].get("group", "other").lower()
    g = FOLD.get(g, g)
    return g if g in GROUPS else "other"

