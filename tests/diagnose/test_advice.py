"""Advice follows evidence: confidence and severity from how much the trace holds, one verdict per job
(not per rank at a knife edge), overlapping findings never added, what-if estimates from the run, and
Megatron knobs as the fix only for Megatron."""

from __future__ import annotations

import pytest

from perfdoctor.diagnose import evaluate_rules, load_rules
from perfdoctor.diagnose.conditions import Context
from perfdoctor.diagnose.findings import combined_impact_ms

GEMM = {"kernels.gemm_fraction": 0.10, "compute.fraction": 0.85, "kernels.elementwise_fraction": 0.3,
        "step.time_ms": 300.0}


@pytest.fixture(scope="module")
def catalog():
    return {r.id: r for r in load_rules()}


def _dev(kernels: int = 5000, steps: int = 10, source: str = "nvtx", **extra) -> dict:
    return {"kernel_count": kernels, "steps": steps, "step_source": source, **extra}


def _by_rule(findings):
    return {f["rule"]: f for f in findings}


@pytest.mark.parametrize(("busy0", "busy1", "fires", "ranks"), [
    (0.913, 0.895, True, [0]),  # median 90.4 %: the job is judged once, the rank over the line is named
    (0.895, 0.913, True, [1]),  # the twin ordering gives the same verdict
    (0.905, 0.880, False, None),  # median 89.25 %: neither twin makes a finding
])
def test_rank_rules_are_judged_on_the_run(catalog, busy0, busy1, fires, ranks):
    contexts = {"0": Context(metrics={**GEMM, "gpu.busy_fraction": busy0}, device=_dev()),
                "1": Context(metrics={**GEMM, "gpu.busy_fraction": busy1}, device=_dev())}
    found = _by_rule(evaluate_rules([catalog["low-gemm-share"]], contexts, Context(metrics={})))
    assert ("low-gemm-share" in found) is fires
    if fires:
        assert found["low-gemm-share"]["ranks"] == ranks


@pytest.mark.parametrize(("kernels", "severity", "confidence"), [(2, "low", "low"), (5, "medium", "medium"),
                                                                  (15, "medium", "medium"), (5000, "high", "high")])
def test_severity_needs_evidence(catalog, kernels, severity, confidence):
    """Launch gaps of 40 % of the step: HIGH by ratio, but 2 or 5 kernels cannot carry a HIGH finding."""
    ctx = Context(metrics={"step.time_ms": 10.0, "host.launch_bound_ms": 4.0, "blocking.host_launch_ms": 4.0},
                  device=_dev(kernels=kernels))
    found = _by_rule(evaluate_rules([catalog["host-launch-bound"]], {"0": ctx}, Context(metrics={})))
    finding = found["host-launch-bound"]
    assert finding["severity"] == severity
    assert finding["confidence"] == confidence


def test_window_and_heuristic_labels_lower_confidence_and_say_so(catalog):
    ctx = Context(metrics={"step.time_ms": 300.0, "comm.cp.exposed_fraction": 0.06, "comm.cp.exposed_ms": 18.0,
                           "blocking.transfer_cp_ms": 18.0},
                  device=_dev(steps=1, source="window", group_label_source={"cp": "heuristic"},
                              group_confidence={"cp": "low"}))
    finding = _by_rule(evaluate_rules([catalog["exposed-cp-comm"]], {"0": ctx}, Context(metrics={})))["exposed-cp-comm"]
    assert finding["confidence"] == "low"
    assert "heuristic, low confidence" in finding["summary"]
    assert any("one step" in r for r in finding["confidence_reasons"])
    labelled = Context(metrics=ctx.metrics,
                       device=_dev(group_label_source={"cp": "nvtx"}, group_confidence={"cp": "high"}))
    found = _by_rule(evaluate_rules([catalog["exposed-cp-comm"]], {"0": labelled}, Context(metrics={})))
    finding = found["exposed-cp-comm"]
    assert finding["confidence"] == "high" and "heuristic" not in finding["summary"]


def test_overlapping_findings_name_each_other_and_are_not_added(catalog):
    ctx = Context(metrics={"step.time_ms": 100.0, "comm.dp.exposed_fraction": 0.4, "comm.dp.exposed_ms": 40.0,
                           "comm.dp.time_ms": 40.0, "comm.dp.fp32_fraction": 1.0, "host.gc_ms": 5.0,
                           "blocking.transfer_dp_ms": 40.0, "blocking.host_gc_ms": 5.0,
                           "whatif.transfer_dp_ms": 30.0},
                  device=_dev())
    rules = [catalog[r] for r in ("exposed-dp-comm", "dp-grad-reduce-fp32", "gc-pause")]
    findings = evaluate_rules(rules, {"0": ctx}, Context(metrics={}))
    by = _by_rule(findings)
    assert by["exposed-dp-comm"]["overlaps"] == ["dp-grad-reduce-fp32"]
    assert by["dp-grad-reduce-fp32"]["overlaps"] == ["exposed-dp-comm"]
    assert by["gc-pause"]["overlaps"] == []
    # the BF16 knob belongs to dp-grad-reduce-fp32 alone, with its own what-if: half the FP32 bytes
    assert not any(k["megatron_bridge"] == "mixed_precision.grad_reduce_in_fp32"
                   for k in by["exposed-dp-comm"]["knobs"])
    bf16 = by["dp-grad-reduce-fp32"]["knobs"][0]
    assert bf16["value"] is False and bf16["flag_value"] is True
    # the replay's saving without the DP transfers (30 ms), times half the FP32 share
    assert bf16["what_if"]["expected_ms_per_step_saved"] == 15.0
    assert by["dp-grad-reduce-fp32"]["impact_ms_per_step"] == 20.0
    # together: the DP group counts once (its largest, 40 ms) plus GC (5 ms), never more than the step
    assert combined_impact_ms(findings, 100.0) == 45.0
    assert combined_impact_ms(findings, 30.0) == 30.0


def test_pipeline_what_if_follows_bubble_theory(catalog):
    # 27 ms of waiting for the producing stage on the critical path, all within the schedule's theory
    ctx = Context(metrics={"step.time_ms": 100.0, "pipeline.bubble_fraction": 0.27, "pipeline.bubble_ms": 30.0,
                           "blocking.pipeline_theory_ms": 27.0, "blocking.pipeline_wait_ms": 0.0},
                  config={"pp": 4, "vpp": 1, "num_microbatches": 8, "num_layers": 32, "micro_batch_size": 1, "dp": 2},
                  device=_dev())
    finding = _by_rule(evaluate_rules([catalog["pipeline-bubble"]], {"0": ctx}, Context(metrics={})))["pipeline-bubble"]
    vpp, gbs = finding["knobs"][0], finding["knobs"][1]
    assert vpp["value"] == 2 and vpp["flag_value"] == 4
    # theory 3/11 at v=1, 3/19 at v=2: the bubble shrinks by 1 - 11/19
    assert vpp["what_if"]["expected_ms_per_step_saved"] == pytest.approx(27.0 * (1 - 11 / 19), abs=1e-3)
    assert gbs["value"] == 4 * 4 * 1 * 2  # 16 micro-batches of 1 on DP 2
    assert gbs["what_if"]["expected_ms_per_step_saved"] == pytest.approx(27.0 * (1 - 11 / 19), abs=1e-3)


def test_megatron_knobs_are_the_fix_only_for_megatron(catalog):
    ctx = Context(metrics={"step.time_ms": 100.0, "host.launch_bound_ms": 20.0, "blocking.host_launch_ms": 20.0,
                           "ln.blocked_count": 4.0, "blocking.ln_blocked_ms": 6.0,
                           "ln.blocked_ms": 6.0}, device=_dev())
    rules = [catalog["host-launch-bound"], catalog["ln-sm-margin"]]
    megatron = _by_rule(evaluate_rules(rules, {"0": ctx}, Context(metrics={}), "megatron-bridge"))
    assert megatron["host-launch-bound"]["knobs_role"] == "fix"
    assert all(k["role"] == "fix" for k in megatron["host-launch-bound"]["knobs"])
    torch_run = _by_rule(evaluate_rules(rules, {"0": ctx}, Context(metrics={}), "pytorch"))
    assert torch_run["host-launch-bound"]["knobs_role"] == "reference"
    assert all(k["role"] == "reference" for k in torch_run["host-launch-bound"]["knobs"])
    assert "CUDA graph" in torch_run["host-launch-bound"]["advice"]
    assert all(k["role"] == "fix" for k in torch_run["ln-sm-margin"]["knobs"])  # TE env vars apply to PyTorch+TE
    other = _by_rule(evaluate_rules(rules, {"0": ctx}, Context(metrics={}), "unknown"))
    assert other["host-launch-bound"]["knobs"] == []  # no Megatron setting for a program that is not PyTorch
    assert other["host-launch-bound"]["advice"]


def test_host_to_device_streaming_gets_copy_overlap_advice_not_nccl_knobs(catalog):
    """Weights streamed host-to-device with no offloading configured: the copies are the program's own."""
    ctx = Context(metrics={"step.time_ms": 300.0, "memcpy.exposed_ms": 285.0, "blocking.copy_ms": 285.0}, device=_dev())
    for framework in ("pytorch", "unknown", "megatron-core"):
        finding = _by_rule(evaluate_rules([catalog["cpu-offload-exposed"]], {"0": ctx}, Context(metrics={}),
                                          framework))["cpu-offload-exposed"]
        assert not any((k.get("env") or "").startswith("NCCL_") for k in finding["knobs"]), framework
        assert "pinned" in finding["advice"] and "asynchronous" in finding["advice"]
    offloading = Context(metrics=ctx.metrics, config={"cpu_offloading": True, "cpu_offloading_num_layers": 8},
                         device=_dev())
    finding = _by_rule(evaluate_rules([catalog["cpu-offload-exposed"]], {"0": offloading}, Context(metrics={})))
    knobs = {k["megatron_bridge"] or k["env"]: k["value"] for k in finding["cpu-offload-exposed"]["knobs"]}
    assert knobs["model.cpu_offloading_num_layers"] == 4 and knobs["NCCL_NET_GDR_LEVEL"] == "PHB"


def test_sync_stall_names_the_host_work_after_the_blocking_call(catalog):
    def finding(wait: float, host: float) -> dict:
        ctx = Context(metrics={"step.time_ms": 1000.0, "host.sync_ms": wait + host, "host.sync_wait_ms": wait,
                               "host.sync_host_ms": host, "blocking.host_sync_ms": wait,
                               "blocking.sync_stall_ms": wait + host}, device=_dev())
        return evaluate_rules([catalog["host-sync-stall"]], {"0": ctx}, Context(metrics={}), "unknown")[0]
    host_work = finding(0.4, 723.0)
    assert host_work["advice"].startswith("Host computation after each blocking call")
    assert "723.4" in host_work["summary"]  # the drain and the host work after it, on the critical path
    waiting = finding(300.0, 10.0)
    assert waiting["advice"].startswith("Stop synchronising")
