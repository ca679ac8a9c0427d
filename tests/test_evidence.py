"""Evidence and the metrics added with it, against what the simulator was told to do.

- per-group comm shape: the DP reduction data type follows ``comm.grad_dtype_bytes`` and the number
  of DP collectives per step follows the bucket size (and equals the DP ``comm`` ranges the capture
  labelled, counted independently from the NVTX table);
- LayerNorm evidence names the NCCL group that held the SMs and quotes the margin env values;
- pipeline stage imbalance matches the stages' compute time in the ground truth;
- straggler and spread metrics from per-rank metrics.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from perfdoctor import api
from perfdoctor.load.labels import labelled, parse_label
from perfdoctor.load.nsys import load_export
from perfdoctor.measure.comm_stats import dtype_of
from perfdoctor.measure.ranks import rank_metrics, stage_of, world_size
from perfdoctor.synth import run_scenario
from tests.paths import SAMPLES

SMALL = {"model": {"layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096, "seq_length": 1024,
                   "vocab": 32000, "num_microbatches": 2},
         "parallel": {"dp": 4}, "run": {"steps": 3, "seed": 5}}


def _scenario(name: str, **comm) -> dict:
    return {**SMALL, "name": name, "comm": comm}


@pytest.fixture(scope="module")
def dp_variants(tmp_path_factory):
    out = {}
    for name, comm in {"f32_big": {"grad_dtype_bytes": 4, "bucket_params": 40_000_000},
                       "bf16_big": {"grad_dtype_bytes": 2, "bucket_params": 40_000_000},
                       "f32_small": {"grad_dtype_bytes": 4, "bucket_params": 4_000_000}}.items():
        paths = run_scenario(_scenario(name, **comm), tmp_path_factory.mktemp(name))
        out[name] = (paths, api.analyze(paths))
    return out


@pytest.mark.parametrize(("name", "spelled"), [
    ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "f32"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float", "f32"),
    ("ncclKernel_ReduceScatter_RING_LL_Sum___nv_bfloat16", "bf16"),
    ("ncclSymkDevKernel_AllReduce_RSxLD_AGxST_bf16", "bf16"),
    ("ncclKernel_AllReduce_RING_LL_Sum_half", "f16"),
    ("ncclDevKernel_AllGather_RING_LL", None),
    ("ncclDevKernel_Generic_4", None),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "f32"),  # spelled, but callers only ask for reductions
])
def test_nccl_dtype_from_name(name: str, spelled: str | None) -> None:
    assert dtype_of(name) == spelled


def test_dp_reduction_dtype_follows_grad_dtype(dp_variants) -> None:
    f32 = dp_variants["f32_big"][1].metrics["all"]["comm.dp.fp32_fraction"]
    bf16 = dp_variants["bf16_big"][1].metrics["all"]["comm.dp.fp32_fraction"]
    assert f32 == pytest.approx(1.0) and bf16 == pytest.approx(0.0)
    evidence = dp_variants["bf16_big"][1].devices[0].evidence["comm"]["dp"]
    assert set(evidence["reduction_dtypes_ms"]) == {"bf16"}


def _labelled_dp_calls_per_step(path) -> float:
    """DP collectives per step as the capture labelled them (one ``comm`` range per call)."""
    _, (tl,) = load_export(path)
    comm = labelled(tl.nvtx, "comm")
    dp = comm[[parse_label(t)[1].get("group") == "dp" for t in comm["text"]]]
    steps = labelled(tl.nvtx, "step")
    starts, ends = np.sort(steps["start"]), np.sort(steps["end"])
    begins = np.sort(dp["start"])
    return float(np.median(np.searchsorted(begins, ends) - np.searchsorted(begins, starts)))


def test_dp_collectives_per_step_follow_the_bucket_size(dp_variants) -> None:
    big = dp_variants["f32_big"][1].metrics["all"]["comm.dp.kernels_per_step"]
    small = dp_variants["f32_small"][1].metrics["all"]["comm.dp.kernels_per_step"]
    assert small > big >= 2
    for name in ("f32_big", "f32_small"):
        paths, report = dp_variants[name]
        assert report.metrics["all"]["comm.dp.kernels_per_step"] == _labelled_dp_calls_per_step(paths[0])
        assert report.metrics["all"]["comm.dp.median_kernel_us"] > 0


def test_ln_evidence_names_the_blocking_group_and_the_margins() -> None:
    report = api.analyze([SAMPLES / "ln_blocked"])
    ln = report.devices[0].evidence["ln"]
    truth = json.loads(next((SAMPLES / "ln_blocked").glob("*.truth.json")).read_text())["ranks"]["0"]["steps"]
    assert sum(ln["by_group"].values()) == pytest.approx(sum(s["ln_blocked_count"] for s in truth), abs=len(truth))
    assert set(ln["by_group"]) <= {"dp", "tp", "cp", "pp", "ep", "other", "unlabelled"}
    assert ln["worst"] and all(w["nccl_kernel"].startswith("nccl") and w["delay_us"] > 0 for w in ln["worst"])
    assert ln["worst"][0]["delay_us"] >= ln["worst"][-1]["delay_us"]
    assert ln["env"] == {"NVTE_FWD_LAYERNORM_SM_MARGIN": "0", "NVTE_BWD_LAYERNORM_SM_MARGIN": "0"}
    clean = api.analyze([SAMPLES / "clean_baseline"]).devices[0].evidence["ln"]
    assert clean["worst"] == [] and clean["env"]["NVTE_FWD_LAYERNORM_SM_MARGIN"] == "16"


def test_tp_overlap_evidence_quotes_max_connections() -> None:
    evidence = api.analyze([SAMPLES / "tp_overlap_connections"]).devices[0].evidence["tp_overlap"]
    assert evidence["env"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "8"}
    assert 0 < evidence["serialized_kernels"] <= evidence["overlap_comm_kernels"]


@pytest.mark.parametrize("scenario", ["pp_1f1b", "pp_interleaved"])
def test_stage_imbalance_matches_truth(scenario: str) -> None:
    per_stage = {}
    for f in (SAMPLES / scenario).glob("*.truth.json"):
        for t in json.loads(f.read_text())["ranks"].values():
            per_stage[t["stage"]] = float(np.median([s["compute_ms"] for s in t["steps"]]))
    want = (max(per_stage.values()) - min(per_stage.values())) / max(per_stage.values())
    report = api.analyze([SAMPLES / scenario])
    assert report.metrics["all"]["pipeline.stage_imbalance_fraction"] == pytest.approx(want, abs=0.02)
    stages = sorted(d.evidence["pipeline"]["stage"] for d in report.devices)
    assert stages == sorted(per_stage)


def test_mfu_evidence_has_no_assumptions_when_the_mark_is_complete() -> None:
    evidence = api.analyze([SAMPLES / "clean_baseline"]).devices[0].evidence["mfu"]
    assert evidence["assumed"] == [] and evidence["peak_bf16_tflops"] == 989.0


def test_stage_of_follows_megatron_rank_order() -> None:
    config = {"tp": 2, "cp": 1, "dp": 2, "pp": 4}
    world = world_size(config, None)
    assert world == 16
    assert [stage_of(r, config, world) for r in (0, 3, 4, 15)] == [0, 0, 1, 3]
    assert stage_of(5, {"pp": 2}, None) is None  # world unknown: no guess
    assert world_size({"pp": 2, "tp": 2}, 8) == 8  # dp unknown: the capture's rank marks say 8


def test_straggler_and_spread_from_per_rank_metrics() -> None:
    per_rank = {str(r): {"step.time_ms": 100.0 + r, "compute.time_ms": c}
                for r, c in enumerate([60.0, 61.0, 80.0, 59.0])}
    out = rank_metrics(per_rank, dict.fromkeys(per_rank, 0))
    assert out["ranks.slowest"] == 2
    assert out["ranks.compute_spread_fraction"] == pytest.approx((80 - 60.5) / 60.5)
    assert out["ranks.step_time_spread_fraction"] == pytest.approx(3 / 101.5)
    assert out["pipeline.stage_imbalance_fraction"] is None  # one stage
    two = rank_metrics(per_rank, {"0": 0, "1": 0, "2": 1, "3": 1})
    assert two["pipeline.stage_imbalance_fraction"] == pytest.approx((69.5 - 60.5) / 69.5)
