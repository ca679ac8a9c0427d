"""Every rule on simulator traces: fires with the right knob on its pathology, silent on a clean run
and when the knob is already set (next-step advice instead); `analyze` names the right top finding.

Pathologies that already ship in sample_traces/ are analysed from there; the rest are small variants
simulated once per session. Rules whose measurements the simulator cannot produce (memory, straggler,
small buckets, CPU offloading) are covered on synthetic metrics in test_rule_engine.py.
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from perfdoctor import api
from perfdoctor.diagnose.rules import PLACEHOLDER
from perfdoctor.synth import run_scenario
from tests.paths import REPO

SAMPLES = REPO / "sample_traces"
SCENARIOS = REPO / "perfdoctor" / "synth" / "scenarios"
SMALL = {"model": {"layers": 2, "seq_length": 1024}, "run": {"steps": 2}}
# Truly clean: no TP, DP=2 over NVLink, BF16 grads, many micro-batches (test_accuracy_grid's clean
# variant) and a small vocabulary: the simulator has no fused cross-entropy, so a large vocabulary
# makes unfused-ops (correctly) fire.
CLEAN = {"parallel": {"tp": 1, "dp": 2}, "comm": {"dp_network": False, "grad_dtype_bytes": 2},
         "model": {"layers": 4, "num_microbatches": 16, "seq_length": 2048, "vocab": 4096}, "run": {"steps": 2}}
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "clean": ("clean_baseline", CLEAN),
    "ln_margin_set": ("ln_blocked", {"comm": {"layernorm_sm_margin": 16}, "model": {"layers": 2}, "run": {"steps": 2}}),
    "conn1": ("tp_overlap_connections", {"comm": {"cuda_device_max_connections": 1}, **SMALL}),
    "moe_grouped": ("moe_ep", {"model": {"grouped_gemm": True, "layers": 2}, "run": {"steps": 2}}),
    "bf16_grads": ("exposed_dp", {"comm": {"grad_dtype_bytes": 2}, **SMALL}),
    "sync": ("clean_baseline", {**CLEAN, "host": {"sync_each_microbatch": True},
                                "model": {"layers": 2, "seq_length": 1024, "vocab": 4096}}),
    # launch overhead on 1-5 % of the critical path: a CUDA-graph candidate, not yet launch-bound
    "graphs": ("host_bound", {"host": {"python_us": 4.0, "launch_us": 3.0}, "parallel": {"dp": 1}}),
    "nvlink": ("clean_baseline", {"parallel": {"tp": 8, "dp": 1}, "gpu": {"gpus_per_node": 4}, **SMALL}),
    "nvlink_ok": ("clean_baseline", {"parallel": {"tp": 4, "dp": 1}, "gpu": {"gpus_per_node": 4}, **SMALL}),
    "low_gemm": ("clean_baseline", {**CLEAN, "model": {"layers": 2, "hidden": 256, "heads": 4, "kv_heads": 4,
                                                       "ffn_hidden": 512, "seq_length": 16384, "num_microbatches": 8}}),
}


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(a)
    for key, value in b.items():
        out[key] = _merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


@pytest.fixture(scope="session")
def variant_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("rule_variants")


@cache
def _report(source: str, root: str) -> Any:
    if source in VARIANTS:
        base, over = VARIANTS[source]
        raw = _merge(yaml.safe_load((SCENARIOS / f"{base}.yaml").read_text()), over)
        raw["name"] = source
        path = Path(root) / f"{source}.yaml"
        path.write_text(yaml.safe_dump(raw))
        run_scenario(path, Path(root) / source)
        return api.analyze([Path(root) / source])
    return api.analyze([SAMPLES / source])


@pytest.fixture
def report(variant_dir):
    return lambda source: _report(source, str(variant_dir))


def _by_rule(rep) -> dict[str, dict[str, Any]]:
    return {f["rule"]: f for f in rep.findings}


def _knob_text(finding: dict[str, Any]) -> str:
    return " ".join(str(v) for k in finding["knobs"] for v in k.values() if v)


# (source, rule, a string one of its knobs must name)
POSITIVE = [
    ("exposed_dp", "exposed-dp-comm", "overlap_grad_reduce"),
    ("exposed_dp", "dp-grad-reduce-fp32", "grad_reduce_in_fp32"),
    ("exposed_tp", "exposed-tp-comm", "tp_comm_overlap"),
    ("exposed_cp", "exposed-cp-comm", "cp_comm_type"),
    ("moe_ep", "exposed-ep-comm", "--overlap-moe-expert-parallel-comm"),
    ("moe_ep", "moe-ungrouped-gemm", "moe_grouped_gemm"),
    ("pp_1f1b", "pipeline-bubble", "virtual_pipeline_model_parallel_size"),
    ("per_node", "pipeline-stage-imbalance", "account_for_embedding_in_pipeline_split"),
    ("host_bound", "host-launch-bound", "cuda_graph_impl"),
    # host_bound's unfused kernels run while the GPU waits for launches: not on the critical path there
    ("graphs", "unfused-ops", "bias_dropout_fusion"),
    ("graphs", "attention-backend", "AttnBackend.flash"),
    ("gc_jitter", "gc-pause", "manual_gc_interval"),
    ("ln_blocked", "ln-sm-margin", "NVTE_FWD_LAYERNORM_SM_MARGIN"),
    ("tp_overlap_connections", "tp-overlap-max-connections", "CUDA_DEVICE_MAX_CONNECTIONS"),
    ("sync", "host-sync-stall", "--log-interval"),
    ("graphs", "cuda-graphs-candidate", "cuda_graph_impl"),
    ("nvlink", "nvlink-domain-crossing", "tensor_model_parallel_size"),
    ("low_gemm", "low-gemm-share", "gradient_accumulation_fusion"),
]

# (source, rule that must stay silent there)
NEGATIVE = [
    ("ln_margin_set", "ln-sm-margin"),
    ("conn1", "tp-overlap-max-connections"),
    ("moe_grouped", "moe-ungrouped-gemm"),
    ("bf16_grads", "dp-grad-reduce-fp32"),
    ("nvlink_ok", "nvlink-domain-crossing"),
    ("exposed_dp", "dp-small-buckets"),
    ("ln_blocked", "exposed-dp-comm"),  # folded into its root cause, ln-sm-margin
    ("tp_overlap_connections", "exposed-tp-comm"),  # folded into tp-overlap-max-connections
    ("host_bound", "cuda-graphs-candidate"),  # folded into host-launch-bound
    ("host_bound", "unfused-ops"),  # its unfused kernels wait for launches: none holds the step
]


@pytest.mark.parametrize(("source", "rule", "knob"), POSITIVE, ids=[f"{s}-{r}" for s, r, _ in POSITIVE])
def test_rule_fires_with_its_knob(report, source, rule, knob):
    findings = _by_rule(report(source))
    assert rule in findings, sorted(findings)
    finding = findings[rule]
    assert knob in _knob_text(finding)
    assert finding["ranks"] and finding["summary"] and not PLACEHOLDER.search(finding["summary"])
    assert finding["severity"] in ("high", "medium", "low", "info")


@pytest.mark.parametrize(("source", "rule"), NEGATIVE, ids=[f"{s}-{r}" for s, r in NEGATIVE])
def test_rule_silent_when_fixed(report, source, rule):
    assert rule not in _by_rule(report(source))


def test_clean_run_is_silent(report):
    assert report("clean").findings == []


def test_supersedes_records_what_it_explains(report):
    finding = _by_rule(report("ln_blocked"))["ln-sm-margin"]
    assert finding["evidence"]["explains"] == "exposed-dp-comm"


def test_overlap_already_in_effect_gives_next_step(report):
    """clean_baseline overlaps DP comm, but its tail buckets stay exposed: no overlap knob again."""
    finding = _by_rule(report("clean_baseline"))["exposed-dp-comm"]
    assert "ddp.overlap_grad_reduce" in finding["already_set"]
    assert "overlap_grad_reduce" not in _knob_text(finding)
    assert finding["next_step"] and "already" in finding["next_step"]
    assert "bucket_size" in _knob_text(finding)


def test_vpp_already_set_gives_next_step(report):
    finding = _by_rule(report("pp_interleaved"))["pipeline-bubble"]
    assert finding["already_set"] == {"vpp": 2}
    assert "virtual_pipeline_model_parallel_size" not in _knob_text(finding)
    assert finding["next_step"]


TOP = {
    "exposed_dp": "exposed-dp-comm",
    "exposed_tp": "exposed-tp-comm",
    "exposed_cp": "exposed-cp-comm",
    "ln_blocked": "ln-sm-margin",
    "tp_overlap_connections": "tp-overlap-max-connections",
    "host_bound": "host-launch-bound",
    "gc_jitter": "gc-pause",
    "pp_1f1b": "pipeline-bubble",
    "pp_interleaved": "pipeline-bubble",
    "per_node": "pipeline-bubble",
    "moe_ep": "exposed-ep-comm",
    "unlabeled": "exposed-dp-comm",
    "clean_baseline": "exposed-dp-comm",
}


@pytest.mark.parametrize("sample", sorted(TOP))
def test_sample_top_finding(report, sample):
    findings = report(sample).findings
    assert findings, "no findings"
    assert findings[0]["rule"] == TOP[sample], [(f["rule"], f["impact_ms_per_step"]) for f in findings]
    impacts = [f["impact_ms_per_step"] for f in findings if f["impact_ms_per_step"] is not None]
    assert impacts == sorted(impacts, reverse=True)
