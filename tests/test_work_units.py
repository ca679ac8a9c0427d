"""The compute kernels' work per name (measure/work_units.py ``kernel_work``) against its definition, kernel
by kernel: a kernel counts when it is not communication and lies in the last step started at or before it,
before that step's end."""

from __future__ import annotations

import numpy as np
import pytest

from perfdoctor.classify.timeline import kernel_classes
from perfdoctor.measure import work_units
from perfdoctor.measure.steps import Steps
from perfdoctor.table import Strings, Table

NAMES = np.array(["sm90_xmma_gemm_bf16", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "vectorized_elementwise_kernel",
                  "flash_fwd_kernel"], dtype=object)


def _expected(start, end, names, comm, steps):
    counts, ns = {}, {}
    for s, e, name, is_comm in zip(start.tolist(), end.tolist(), names, comm.tolist()):
        i = int(np.searchsorted(steps.starts, s, side="right")) - 1
        if is_comm or i < 0 or s >= steps.ends[i]:
            continue
        counts[name] = counts.get(name, 0) + 1
        ns[name] = ns.get(name, 0) + e - s
    return counts, ns


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kernel_work_counts_each_kernel_of_the_latest_step_started(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    n = 5_000
    start = np.sort(rng.integers(0, 1_000_000, n))
    end = start + rng.integers(1, 3_000, n)
    codes = rng.integers(0, NAMES.size, n).astype(np.int8)
    kernels = Table({"start": start, "end": end, "short_name": Strings(codes, NAMES),
                     "demangled_name": Strings(np.full(n, -1, dtype=np.int8), NAMES)})
    # steps with gaps between them, kernels before the first and after the last, a step nested in the one
    # before it (its kernels belong to it while it lasts, then to no step) and one starting right at a kernel
    bounds = np.sort(rng.choice(np.arange(50_000, 950_000), 16, replace=False))
    starts, ends = bounds[0::2].copy(), bounds[1::2].copy()
    starts[3] = start[np.searchsorted(start, starts[3])]  # the first kernel in the step starts it
    assert starts[3] < ends[3]
    nested = (int(starts[5]), int(ends[5]))
    starts = np.insert(starts, 6, nested[0] + (nested[1] - nested[0]) // 3)
    ends = np.insert(ends, 6, nested[0] + (nested[1] - nested[0]) // 2)
    steps = Steps(starts.astype(np.int64), ends.astype(np.int64), "nvtx-step")
    kcls = kernel_classes(kernels)
    monkeypatch.setattr(work_units, "SLICE", 333)  # many slices, steps across their edges
    got = work_units.kernel_work(kernels, kcls, steps)
    comm = np.asarray([str(kcls["category"].values[c]) == "comm" for c in kcls["category"].codes])
    counts, ns = _expected(start, end, NAMES[codes].tolist(), comm, steps)
    assert comm.any() and counts
    assert got["kernels"] == {name: [counts[name], ns[name]] for name in got["kernels"]}
    assert set(got["kernels"]) == set(counts)
    assert got["steps"] == len(steps) and got["span_ns"] == int((ends - starts).sum())
