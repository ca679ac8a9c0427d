"""Per-group shape of the communication: how many collectives, how long each, in which data type.

Two tuning-guide knobs are visible only here, not in the exposed time itself:
- many short DP collectives per step mean small gradient buckets (each pays NCCL launch and latency
  cost; Megatron's ``bucket_size``), and
- DP reductions in fp32 mean gradients are reduced in fp32 (``grad_reduce_in_fp32``): twice the bytes
  of a bf16 reduction.
NCCL spells the reduction's data type in its kernel names (``..._Sum_f32_RING_LL``,
``..._RING_LL_Sum_float``, ``..._Sum___nv_bfloat16``; research/kernel_taxonomy.md §2). Gathers and
send/recv move bytes (``int8_t``), so only reductions carry a meaningful type.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfdoctor.classify.groups import GROUPS, GroupLabels
from perfdoctor.classify.timeline import class_codes, name_pairs
from perfdoctor.measure.steps import Steps
from perfdoctor.quantiles import median
from perfdoctor.table import Table, distinct, factorize

REDUCTIONS = ("all_reduce", "reduce_scatter", "reduce")
_DTYPE = re.compile(
    r"(?<![A-Za-z0-9])(f32|float|f16|half|bf16|__nv_bfloat16|f64|double|f8e4m3|f8e5m2|__nv_fp8_e4m3|"
    r"__nv_fp8_e5m2|i8|int8_t|u8|uint8_t|i32|int32_t|u32|uint32_t|i64|int64_t|u64|uint64_t)(?![A-Za-z0-9])")
_CANON = {"float": "f32", "half": "f16", "__nv_bfloat16": "bf16", "double": "f64", "__nv_fp8_e4m3": "f8e4m3",
          "__nv_fp8_e5m2": "f8e5m2", "int8_t": "i8", "uint8_t": "u8", "int32_t": "i32", "uint32_t": "u32",
          "int64_t": "i64", "uint64_t": "u64"}


@dataclass(frozen=True)
class GroupCommStats:
    kernels_per_step: float  # median over steps of the group's comm kernels starting in the step
    median_kernel_us: float
    collectives: dict[str, int]  # collective -> kernels in the whole timeline
    reduction_dtypes: dict[str, float]  # data type of reductions -> ms in the whole timeline

    @property
    def fp32_fraction(self) -> float | None:
        """Share of the reduction time with a known type that ran in fp32 (None: no typed reductions)."""
        total = sum(self.reduction_dtypes.values())
        return self.reduction_dtypes.get("f32", 0.0) / total if total else None

    def as_evidence(self) -> dict[str, Any]:
        return {"kernels_per_step": self.kernels_per_step, "median_kernel_us": round(self.median_kernel_us, 2),
                "collectives": self.collectives,
                "reduction_dtypes_ms": {k: round(v, 3) for k, v in self.reduction_dtypes.items()},
                "fp32_fraction": self.fp32_fraction}


def dtype_of(name: str) -> str | None:
    """Data type spelled in an NCCL kernel name (canonical short form), or None."""
    m = _DTYPE.search(name)
    return _CANON.get(m.group(1), m.group(1)) if m else None


def comm_stats(kernels: Table, kcls: Table, groups: GroupLabels,
               steps: Steps) -> dict[str, GroupCommStats]:
    """Stats per labelled group (groups without kernels are absent). Works on the labelled comm
    kernels only, with data types read once per distinct name and collectives as integer codes."""
    labelled = np.flatnonzero(groups.codes >= 0)
    if not labelled.size:
        return {}
    inverse, shorts, demangleds = name_pairs(kernels)
    pairs, pair_of = np.unique(inverse[labelled], return_inverse=True)  # the names comm kernels use
    dtypes = [(demangleds[p] and dtype_of(demangleds[p])) or dtype_of(shorts[p]) for p in pairs]
    dtype_codes, dtype_names = factorize(np.array(dtypes, dtype=object))  # None → −1
    dtype = dtype_codes[pair_of]
    coll_codes, colls = class_codes(kcls)["collective"]
    collective = coll_codes[labelled]
    is_reduction = np.isin(collective, [i for i, c in enumerate(colls) if c in REDUCTIONS])
    start = kernels.col("start")[labelled]
    dur_ms = (kernels.col("end")[labelled] - start) / 1e6
    code = groups.codes[labelled]
    out: dict[str, GroupCommStats] = {}
    for i, g in enumerate(GROUPS):
        mine = np.flatnonzero(code == i)
        if not mine.size:
            continue
        begins = start[mine]  # kernels come sorted by start
        per_step = np.searchsorted(begins, steps.ends) - np.searchsorted(begins, steps.starts)
        counts = np.bincount(collective[mine], minlength=len(colls))
        typed = mine[is_reduction[mine] & (dtype[mine] >= 0)]
        ms = np.bincount(dtype[typed], weights=dur_ms[typed], minlength=len(dtype_names))
        out[g] = GroupCommStats(float(median(per_step)) if per_step.size else 0.0,
                                float(median(dur_ms[mine])) * 1e3,
                                dict(sorted((str(colls[c]), int(counts[c])) for c in np.flatnonzero(counts))),
                                dict(sorted((str(dtype_names[d]), float(ms[d])) for d in distinct(dtype[typed]))))
    return out
