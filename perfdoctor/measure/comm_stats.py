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
import pandas as pd

from perfdoctor.classify.groups import GROUPS, GroupLabels
from perfdoctor.measure.steps import Steps

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


def comm_stats(kernels: pd.DataFrame, kcls: pd.DataFrame, groups: GroupLabels,
               steps: Steps) -> dict[str, GroupCommStats]:
    """Stats per labelled group (groups without kernels are absent). Works on the labelled comm
    kernels only, with names looked up per category code (a trace has few distinct names)."""
    labelled = np.flatnonzero(groups.codes >= 0)
    if not labelled.size:
        return {}
    names = kernels["demangled_name"].cat
    dtypes = np.array([dtype_of(str(n)) for n in names.categories] + [None], dtype=object)
    dtype = dtypes[names.codes.to_numpy()[labelled]]  # code −1 (no demangled name) → None
    short = kernels["short_name"].cat
    short_dtypes = np.array([dtype_of(str(n)) for n in short.categories] + [None], dtype=object)
    dtype = np.where(dtype == None, short_dtypes[short.codes.to_numpy()[labelled]], dtype)  # noqa: E711
    start = kernels["start"].to_numpy()[labelled]
    dur_ms = (kernels["end"].to_numpy()[labelled] - start) / 1e6
    collective = kcls["collective"].to_numpy(dtype=object)[labelled].astype(str)
    code = groups.codes[labelled]
    out: dict[str, GroupCommStats] = {}
    for i, g in enumerate(GROUPS):
        mine = np.flatnonzero(code == i)
        if not mine.size:
            continue
        begins = np.sort(start[mine])
        per_step = np.searchsorted(begins, steps.ends) - np.searchsorted(begins, steps.starts)
        ops, counts = np.unique(collective[mine], return_counts=True)
        reduction = mine[np.isin(collective[mine], REDUCTIONS) & (dtype[mine] != None)]  # noqa: E711
        typed = pd.Series(dur_ms[reduction]).groupby(dtype[reduction].astype(str)).sum()
        out[g] = GroupCommStats(float(np.median(per_step)) if per_step.size else 0.0,
                                float(np.median(dur_ms[mine])) * 1e3,
                                {str(o): int(c) for o, c in zip(ops, counts)},
                                {str(k): float(v) for k, v in typed.items()})
    return out
