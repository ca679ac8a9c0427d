"""sample_traces/real_cs336: a CS336-style benchmark (real nsys capture of its NVTX ranges, synthetic GPU
rows). Steps are the benchmark iterations, the weight upload in `init_model` and the warm-up are left out
and named, no copy finding, the findings are about the iterations."""

from __future__ import annotations

import numpy as np

from perfdoctor import api
from perfdoctor.load.nsys import load_export
from perfdoctor.render.json import report_dict
from tests.nsys.make_cs336_sample import DEFAULT_OUTPUT, STEPS, WARMUP
from tests.nsys.make_real_sample import MAX_BYTES, scan

SAMPLE = DEFAULT_OUTPUT


def _ranges(tl, name: str) -> tuple[np.ndarray, np.ndarray]:
    rows = tl.nvtx.col("text", dtype=object) == name
    return tl.nvtx.col("start")[rows], tl.nvtx.col("end")[rows]


def test_sample_is_what_its_readme_says() -> None:
    assert SAMPLE.stat().st_size < MAX_BYTES and scan(SAMPLE) == []
    info, (tl,) = load_export(SAMPLE)
    assert info.product_version.startswith("2022.4.")
    assert info.counts["nvtx"] > 0 and len(tl.kernels) > 0 and len(tl.memcpy) > 0
    for name, count in (("init_model", 1), ("warmup", 1), ("benchmark_loop", 1), ("forward", WARMUP + STEPS),
                        ("backward", WARMUP + STEPS), ("optimizer_step", WARMUP + STEPS)):
        assert len(_ranges(tl, name)[0]) == count, name
    init = _ranges(tl, "init_model")
    assert (tl.memcpy.col("start") >= init[0][0]).all() and (tl.memcpy.col("end") <= init[1][0]).all()


def test_steps_are_the_benchmark_iterations() -> None:
    report = report_dict(api.analyze([SAMPLE], timeline_excerpts=False))
    _, (tl,) = load_export(SAMPLE)
    steps = report["steps"]
    assert steps["source"] == "repeating-range" and steps["count"] == STEPS
    assert steps["excluded_ranges"] == ["init_model", "warmup"]
    loop_start, loop_end = (v[0] for v in _ranges(tl, "benchmark_loop"))
    forward = _ranges(tl, "forward")[0]
    assert forward[WARMUP] >= loop_start  # the first step is the first timed iteration
    dev = report["devices"][0]
    first_step_ns = forward[WARMUP]
    assert steps["excluded_ms"] == round((first_step_ns - dev["window"][0]) / 1e6, 3)
    (warning,) = [w for w in report["warnings"] if "before the first step" in w]
    assert "`init_model`" in warning and "`warmup`" in warning
    # the weight upload is in no step: no copy finding, no exposed copy time per step
    assert report["metrics"]["all"]["memcpy.exposed_ms"] == 0
    rules = {f["rule"] for f in report["findings"]}
    assert "cpu-offload-exposed" not in rules and "host-launch-bound" in rules
    launch = next(f for f in report["findings"] if f["rule"] == "host-launch-bound")
    assert launch["impact_ms_per_step"] < steps["median_ms"]  # per iteration, not per window
