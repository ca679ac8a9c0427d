"""The rule engine on its own: validation errors name file and field, conditions are data, knobs
already set give next steps, and the rules the simulator cannot exercise fire on synthetic metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from perfdoctor.diagnose import RuleError, evaluate_rules, load_rules
from perfdoctor.diagnose.conditions import Context, evaluate
from perfdoctor.diagnose.explain import explain_text
from perfdoctor.diagnose.findings import fill
from perfdoctor.diagnose.rules import load_rule
from tests.paths import REPO

REQUIRED = """exposed-dp-comm exposed-tp-comm exposed-cp-comm exposed-ep-comm pipeline-bubble
pipeline-stage-imbalance host-launch-bound host-sync-stall gc-pause ln-sm-margin tp-overlap-max-connections
dp-grad-reduce-fp32 dp-small-buckets low-gemm-share unfused-ops attention-backend moe-ungrouped-gemm
cpu-offload-exposed memory-fragmentation memory-headroom straggler-rank cuda-graphs-candidate
nvlink-domain-crossing""".split()

GOOD = {
    "id": "slow-steps", "title": "Steps are slow",
    "when": {"all": [{"metric": "step.time_ms", "op": "gt", "value": 10}]},
    "impact": {"metric": "step.time_ms", "scale": 0.1}, "severity": {"fixed": "low"},
    "summary": "Median step {step.time_ms} ms on {ranks}", "knobs": [],
    "guide": {"section": "Performance at Scale"},
    "explain": {"detects": "d", "why": "w", "fix": {"env": "# none"}, "verify": "v"},
}


@pytest.fixture(scope="module")
def catalog():
    return {r.id: r for r in load_rules()}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "perfdoctor", *args], capture_output=True, text=True)


def _write(d: Path, spec, name: str | None = None) -> Path:
    path = d / f"{name or spec['id']}.yaml"
    path.write_text(spec if isinstance(spec, str) else yaml.safe_dump(spec))
    return path


def test_catalog_has_every_contract_id(catalog):
    assert set(REQUIRED) <= set(catalog)
    for rule in catalog.values():
        assert rule.builtin and rule.source.name == f"{rule.id}.yaml"


@pytest.mark.parametrize(("change", "field", "problem"), [
    ({"when": None}, "<top>", "'when' is a required property"),
    ({"when": {"all": [{"metric": "step.time_ms", "op": "bigger", "value": 1}]}}, "when", ""),
    ({"when": {"all": [{"metric": "comm.dp.exposed_frac", "op": "gt", "value": 1}]}}, "when.all.0.metric",
     "unknown metric 'comm.dp.exposed_frac'"),
    ({"severity": {"high": 2, "medium": 0.1}}, "severity", ""),
    ({"id": "other-id"}, "id", "does not match the file name"),
    ({"summary": "{comm.nope_ms} ms"}, "summary", "placeholder {comm.nope_ms}"),
    ({"knobs": [{"megatron_bridge": "x"}]}, "knobs.0", "required property"),
    ({"supersedes": ["no-such-rule"]}, "supersedes.0", "unknown rule 'no-such-rule'"),
])
def test_malformed_rule_names_file_and_field(tmp_path, change, field, problem):
    spec = {**GOOD, **change}
    spec = {k: v for k, v in spec.items() if v is not None}
    path = _write(tmp_path, spec, "slow-steps")
    with pytest.raises(RuleError) as err:
        load_rules([tmp_path])
    message = str(err.value)
    assert message.startswith(f"{path}: {field}"), message
    assert problem in message
    assert "\n" not in message


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = _write(tmp_path, "id: broken\ntitle: [unclosed\n", "broken")
    with pytest.raises(RuleError, match=rf"^{path}: line \d+: not valid YAML"):
        load_rule(path)


def test_duplicate_and_missing_dirs(tmp_path):
    _write(tmp_path, {**GOOD, "id": "gc-pause"})
    with pytest.raises(RuleError, match="duplicate rule id 'gc-pause'"):
        load_rules([tmp_path])
    with pytest.raises(RuleError, match="rules directory not found"):
        load_rules([tmp_path / "nope"])


def test_cli_bad_rules_dir_is_exit_2_one_line(tmp_path):
    _write(tmp_path, {**GOOD, "when": {"all": [{"metric": "nope.metric", "op": "gt", "value": 1}]}}, "slow-steps")
    for args in (["rules", "--rules", str(tmp_path)],
                 ["analyze", str(REPO / "sample_traces" / "exposed_dp"), "--rules", str(tmp_path)]):
        proc = subprocess.run([sys.executable, "-m", "perfdoctor", *args], capture_output=True, text=True)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and "slow-steps.yaml: when.all.0.metric: unknown metric" in proc.stderr


def test_user_rule_end_to_end(tmp_path):
    _write(tmp_path, GOOD)
    proc = subprocess.run([sys.executable, "-m", "perfdoctor", "analyze", str(REPO / "sample_traces" / "exposed_dp"),
                           "--rules", str(tmp_path), "--format", "json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    mine = [f for f in report["findings"] if f["rule"] == "slow-steps"]
    assert len(mine) == 1
    step = report["metrics"]["ranks"]["0"]["step.time_ms"]
    assert mine[0]["impact_ms_per_step"] == pytest.approx(step * 0.1, abs=1e-3)
    assert mine[0]["summary"].startswith("Median step ") and mine[0]["summary"].endswith("on rank 0")
    listed = subprocess.run([sys.executable, "-m", "perfdoctor", "rules", "--rules", str(tmp_path), "--format", "json"],
                            capture_output=True, text=True)
    assert {"id": "slow-steps", "builtin": False}.items() <= next(
        r for r in json.loads(listed.stdout) if r["id"] == "slow-steps").items()


def test_explain_prints_every_section(catalog):
    for rule in catalog.values():
        text = explain_text(rule)
        for heading in ("## What it detects", "## Why it happens", "## How to fix it", "## How to verify", "## Guide"):
            assert heading in text, (rule.id, heading)
    proc = _cli("explain", "ln-sm-margin")
    assert proc.returncode == 0 and "NVTE_FWD_LAYERNORM_SM_MARGIN=16" in proc.stdout
    proc = _cli("explain", "no-such-rule")
    assert proc.returncode == 2 and "unknown rule" in proc.stderr


def test_conditions_are_data():
    ctx = Context(metrics={"a": 2.0, "b": None}, config={"tp": 4, "cp": 2}, env={"M": "16", "S": "x:1,y"},
                  evidence={"ln": {"by_group": {"dp": 3}}}, device={"total_memory_bytes": 80})
    assert evaluate(ctx, {"metric": "env.M", "op": "ge", "value": 16})          # env strings compare as numbers
    assert not evaluate(ctx, {"metric": "b", "op": "ne", "value": 1})           # missing: every comparison false
    assert evaluate(ctx, {"not": {"metric": "b", "op": "exists"}})
    assert evaluate(ctx, {"metric": ["config.tp", "config.cp"], "op": "eq", "value": 8})
    assert evaluate(ctx, {"metric": "a", "op": "lt", "value": {"metric": "device.total_memory_bytes", "scale": 0.05}})
    assert not evaluate(ctx, {"metric": "a", "op": "lt", "value": {"metric": "config.nope"}})
    assert evaluate(ctx, {"metric": "env.S", "op": "contains", "value": "x:1"})
    assert evaluate(ctx, {"metric": "evidence.ln.by_group.dp", "op": "in", "value": [1, 3]})
    assert evaluate(ctx, {"any": [{"metric": "b", "op": "gt", "value": 0}, {"metric": "a", "op": "eq", "value": 2}]})


def test_templates_never_reach_attributes():
    ctx = Context(metrics={"x_ms": 1.23456, "y_fraction": 0.5}, config={"tp": 2})
    assert fill("{x_ms} ms, {y_fraction}, {config.__class__} {config.tp.__class__}", ctx) == "1.23 ms, 50.0 %, n/a n/a"


def _ctx(**metrics) -> Context:
    return Context(metrics={"step.time_ms": 100.0, **metrics})


def _run(rules, contexts, run_ctx=None):
    return {f["rule"]: f for f in evaluate_rules(rules, contexts, run_ctx or Context(metrics={}))}


def test_margin_already_set_gives_next_step(catalog):
    ctx = Context(metrics={"step.time_ms": 100.0, "ln.blocked_count": 3.0, "ln.blocked_ms": 14.0,
                           "blocking.ln_blocked_ms": 12.0},
                  env={"NVTE_FWD_LAYERNORM_SM_MARGIN": "16", "NVTE_BWD_LAYERNORM_SM_MARGIN": "16"},
                  evidence={"ln": {"by_group": {"dp": 9}}})
    finding = _run([catalog["ln-sm-margin"]], {"0": ctx})["ln-sm-margin"]
    assert finding["already_set"] == {"NVTE_FWD_LAYERNORM_SM_MARGIN": "16", "NVTE_BWD_LAYERNORM_SM_MARGIN": "16"}
    assert all(k["value"] != "16" for k in finding["knobs"])
    assert {"NCCL_MAX_CTAS", None} <= {k["env"] for k in finding["knobs"]}
    assert "already set (fwd 16, bwd 16)" in finding["next_step"]
    assert finding["impact_ms_per_step"] == 12.0 and finding["severity"] == "high"


def test_median_impact_worst_rank_and_sorting(catalog):
    rules = [catalog["gc-pause"], catalog["exposed-dp-comm"]]
    contexts = {"0": _ctx(**{"blocking.host_gc_ms": 2.0}), "1": _ctx(**{"blocking.host_gc_ms": 6.0}),
                "2": _ctx(**{"blocking.host_gc_ms": 0.1}),
                "3": _ctx(**{"comm.dp.exposed_fraction": 0.3, "comm.dp.exposed_ms": 30.0, "comm.dp.time_ms": 30.0,
                             "blocking.transfer_dp_ms": 30.0})}
    findings = evaluate_rules(rules, contexts, Context(metrics={}))
    assert [f["rule"] for f in findings] == ["exposed-dp-comm", "gc-pause"]
    gc = findings[1]
    assert gc["ranks"] == [0, 1] and gc["impact_ms_per_step"] == 4.0 and gc["severity"] == "medium"
    assert gc["evidence"]["worst_rank"] == 1 and "ranks 0-1" in gc["summary"]


def test_rules_without_simulator_coverage(catalog):
    gib = 2**30
    device = {"total_memory_bytes": 80 * gib}
    cases = {
        "memory-pressure": Context(metrics={"memory.peak_reserved_bytes": 78 * gib,
                                            "memory.peak_allocated_bytes": 70 * gib},
                                   device=device, env={"NCCL_NVLS_ENABLE": "0"}),
        "memory-fragmentation": Context(metrics={"memory.peak_reserved_bytes": 60 * gib,
                                                 "memory.peak_allocated_bytes": 40 * gib}, device=device),
        "memory-headroom": Context(metrics={"memory.peak_reserved_bytes": 30 * gib}, device=device,
                                   config={"tp": 4, "recompute_granularity": "full"}),
        "cpu-offload-exposed": Context(metrics={"step.time_ms": 100.0, "memcpy.exposed_ms": 9.0,
                                                "blocking.copy_ms": 9.0},
                                       config={"cpu_offloading": True}),
        "dp-small-buckets": _ctx(**{"comm.dp.kernels_per_step": 64.0, "comm.dp.median_kernel_us": 120.0,
                                    "comm.dp.exposed_fraction": 0.08, "comm.dp.exposed_ms": 8.0,
                                    "blocking.transfer_dp_ms": 6.0}),
    }
    for rule_id, ctx in cases.items():
        finding = _run([catalog[rule_id]], {"0": ctx}).get(rule_id)
        assert finding is not None, rule_id
        assert finding["knobs"], rule_id
    pressure = _run([catalog["memory-pressure"]], {"0": cases["memory-pressure"]})["memory-pressure"]
    assert pressure["already_set"] == {"NCCL_NVLS_ENABLE": "0"}
    assert "NCCL_NVLS_ENABLE" not in {k["env"] for k in pressure["knobs"]}
    frag = _run([catalog["memory-fragmentation"]], {"0": Context(
        metrics=cases["memory-fragmentation"].metrics, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})})
    assert frag["memory-fragmentation"]["knobs"] == [] and frag["memory-fragmentation"]["next_step"]
    offload = _run([catalog["cpu-offload-exposed"]], {"0": cases["cpu-offload-exposed"]})["cpu-offload-exposed"]
    assert "cpu_offloading_num_layers" in str(offload["knobs"])
    # silent when the measurements say nothing is wrong
    assert not _run([catalog["memory-pressure"], catalog["memory-headroom"]],
                    {"0": Context(metrics={"memory.peak_reserved_bytes": 60 * gib}, device=device, config={"tp": 1})})


def test_straggler_is_run_scope_and_points_at_the_slowest_rank(catalog):
    run_ctx = Context(metrics={"step.time_ms": 100.0, "ranks.step_time_spread_fraction": 0.25, "ranks.slowest": 5.0,
                               "ranks.compute_spread_fraction": 0.02})
    finding = _run([catalog["straggler-rank"]], {}, run_ctx)["straggler-rank"]
    assert finding["ranks"] == [5] and finding["impact_ms_per_step"] == 25.0
    assert "slowest: rank 5" in finding["summary"]
    assert not _run([catalog["straggler-rank"]], {}, Context(metrics={"ranks.step_time_spread_fraction": 0.03}))
    # matched collectives: the others' wait on their critical paths, not the exposure or the spread
    matched = Context(metrics={"step.time_ms": 100.0, "ranks.step_time_spread_fraction": 0.25, "ranks.slowest": 5.0,
                               "ranks.late_ms": 9.0, "ranks.late_blocking_ms": 6.0})
    assert _run([catalog["straggler-rank"]], {}, matched)["straggler-rank"]["impact_ms_per_step"] == 6.0
    matched.metrics |= {"ranks.late_blocking_ms": 1.0, "ranks.step_time_spread_fraction": 0.05}
    assert not _run([catalog["straggler-rank"]], {}, matched)  # 1 % of the step on the path: not a finding


def test_nvlink_rule_silent_without_topology(catalog):
    ctx = Context(metrics={"comm.tp.time_ms": 5.0, "comm.exposed_ms": 4.0, "step.time_ms": 50.0,
                           "blocking.transfer_tp_ms": 3.0, "blocking.transfer_cp_ms": 0.0,
                           "blocking.transfer_ep_ms": 0.0}, config={"tp": 16})
    assert not _run([catalog["nvlink-domain-crossing"]], {}, ctx)
    ctx.env = {"LOCAL_WORLD_SIZE": "8"}
    finding = _run([catalog["nvlink-domain-crossing"]], {}, ctx)["nvlink-domain-crossing"]
    assert finding["impact_ms_per_step"] == 3.0  # the TP, CP and EP transfers on the critical path, added
    ctx.metrics["blocking.transfer_tp_ms"] = 0.0  # TP traffic that never holds the step: nothing to weigh
    assert not _run([catalog["nvlink-domain-crossing"]], {}, ctx)
