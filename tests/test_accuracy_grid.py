"""Accuracy grid (issue 4): every measurement against the simulator's truth over a grid of scenarios.

The grid is built from the shipped scenario YAMLs with overrides, shrunk to small models so the whole
grid simulates and analyses in seconds. It varies the parallel config (tp/pp/vpp/cp/dp/ep,
micro-batches), labels (perfdoctor and NCCL NVTX on or off, NCCL payloads with and without communicator
sizes), kernel name spellings, export schemas, file layouts and pathologies. Tolerances are those of
issue 4, per rank, on the median over steps:

- exposed comm per group within max(5 % relative, 0.2 ms);
- pipeline bubble fraction within 0.02 absolute;
- host gap ms by cause within 10 % (0.02 ms floor for causes that are zero in truth);
- LayerNorm blocked count within ±1 per step (exactly 0 when truth has none);
- on the truly clean scenarios no group exposes more than 1 % of the step.

"Clean" needs care: the simulator's healthy runs still expose comm by design. With overlapped DP the
first parameter all-gather bucket and the last gradient bucket are exposed, and NCCL TP (even on its
own stream) is serialised with the GEMMs it feeds, so the shipped ``clean_baseline`` exposes ~20 % DP
and ~8 % TP. The grid's clean variants are therefore built to be truly clean: no TP, DP=2 over NVLink,
bf16 grads and 16 micro-batches, so the exposed bucket tails are well under 1 % of the step.

Scenarios without perfdoctor labels have no step ranges and no group labels. For them the checks accept
``None`` (not measurable yet) and check accuracy once a value is reported: against the sum over steps
when the whole window was taken as one step; with steps found from the periodic structure (one step
per optimizer burst end) against the truth steps they stand for — the last ones, as the first
iteration has no burst before it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from perfdoctor import api
from perfdoctor.synth import run_scenario
from tests.paths import REPO

SCENARIOS = REPO / "perfdoctor" / "synth" / "scenarios"
GROUPS = ("dp", "tp", "cp", "pp", "ep")
CAUSES = ("launch_bound", "sync", "gc", "data")
SMALL: dict[str, Any] = {"model": {"layers": 2, "seq_length": 1024}, "run": {"steps": 2}}
CLEAN: dict[str, Any] = {
    "parallel": {"tp": 1, "dp": 2},
    "comm": {"dp_network": False, "grad_dtype_bytes": 2},
    "model": {"layers": 4, "num_microbatches": 16, "seq_length": 2048},
}

# (id, shipped scenario, overrides applied after SMALL, truly clean)
GRID: list[tuple[str, str, dict[str, Any], bool]] = [
    ("clean", "clean_baseline", {}, False),
    ("clean_true", "clean_baseline", CLEAN, True),
    ("clean_true_2026", "clean_baseline", {**CLEAN, "output": {"schema": "2026.2"}}, True),
    ("clean_true_2022_ascii", "clean_baseline", {**CLEAN, "output": {"schema": "2022.4"},
                                                 "labels": {"strings": "ascii"}}, True),
    ("tp4_dp2", "clean_baseline", {"parallel": {"tp": 4, "dp": 2}}, False),
    ("tp_sync", "clean_baseline", {"comm": {"tp_mode": "nccl_sync"}}, False),
    ("tp_userbuffers", "clean_baseline", {"comm": {"tp_mode": "userbuffers"}}, False),
    ("tp_overlap_conn8", "tp_overlap_connections", {}, False),
    ("tp_overlap_conn1", "tp_overlap_connections", {"comm": {"cuda_device_max_connections": 1}}, False),
    ("dp_no_overlap", "clean_baseline", {"comm": {"overlap_grad_reduce": False, "overlap_param_gather": False}},
     False),
    ("dp_allreduce", "clean_baseline", {"comm": {"distributed_optimizer": False}}, False),
    ("exposed_dp", "exposed_dp", {}, False),
    ("exposed_tp", "exposed_tp", {}, False),
    ("exposed_cp4", "exposed_cp", {}, False),
    ("cp2_dp2", "exposed_cp", {"parallel": {"cp": 2, "dp": 2}, "comm": {"cp_network": False}}, False),
    ("pp4_1f1b", "pp_1f1b", {"model": {"layers": 4}}, False),
    ("pp4_1f1b_m16", "pp_1f1b", {"model": {"layers": 4, "num_microbatches": 16}}, False),
    ("pp2_m2", "pp_1f1b", {"model": {"layers": 2, "num_microbatches": 2}, "parallel": {"pp": 2}}, False),
    ("pp4_vpp2", "pp_interleaved", {"model": {"layers": 8}}, False),
    ("pp2_vpp2_tp2", "pp_interleaved", {"model": {"layers": 4, "num_microbatches": 4},
                                        "parallel": {"pp": 2, "tp": 2, "dp": 1}}, False),
    ("per_node", "per_node", {}, False),
    ("per_node_tp2_dp2", "per_node", {"parallel": {"pp": 1}}, False),
    ("moe_ep4", "moe_ep", {}, False),
    ("moe_ep2_grouped", "moe_ep", {"parallel": {"ep": 2}, "model": {"grouped_gemm": True}}, False),
    ("ln_margin0", "ln_blocked", {}, False),
    ("ln_margin16", "ln_blocked", {"comm": {"layernorm_sm_margin": 16}}, False),
    ("ln_margin0_layernorm", "ln_blocked", {"kernels": {"norm": "layernorm", "te_norm_namespace": "layer_norm",
                                                        "nccl_version": "2.18"}}, False),
    ("host_bound", "host_bound", {}, False),
    ("host_sync_each_mb", "host_bound", {"host": {"sync_each_microbatch": True}}, False),
    ("gc_data", "gc_jitter", {}, False),
    ("data_stall_only", "gc_jitter", {"host": {"gc_every_steps": 0, "data_stall_every_steps": 1}}, False),
    ("gc_gen0", "gc_jitter", {"host": {"gc_gen": 0, "gc_ms": 5.0, "data_stall_every_steps": 0}}, False),
    ("xmma_cudnn_2027", "clean_baseline", {"kernels": {"gemm": "xmma", "attention": "cudnn",
                                                       "nccl_version": "2.27", "stream_base": 30}}, False),
    ("cutlass_unfused_2018", "clean_baseline", {"kernels": {"gemm": "cutlass", "attention": "unfused",
                                                            "nccl_version": "2.18", "stream_base": 1,
                                                            "fused_rope": False}}, False),
    ("fp8_b200", "clean_baseline", {"kernels": {"precision": "fp8"}, "gpu": {"name": "B200"}}, False),
    ("a100_mbs2", "clean_baseline", {"gpu": {"name": "A100"}, "model": {"micro_batch_size": 2}}, False),
    ("no_nccl_nvtx", "clean_baseline", {"labels": {"nccl": False}}, False),
    ("unlabeled", "unlabeled", {"run": {"steps": 3}}, False),
    ("unlabeled_nccl_nvtx", "unlabeled", {"labels": {"nccl": True}}, False),
    ("unlabeled_pp2", "pp_1f1b", {"model": {"layers": 2}, "parallel": {"pp": 2}, "run": {"steps": 3},
                                  "labels": {"perfdoctor": False, "nccl": False}}, False),
    ("unlabeled_nccl_payload", "unlabeled", {"run": {"steps": 3}, "output": {"schema": "2026.2"},
                                             "labels": {"nccl": True, "nccl_payload": True}}, False),
    ("unlabeled_pp2_payload_noinit", "pp_1f1b", {"model": {"layers": 2}, "parallel": {"pp": 2}, "run": {"steps": 3},
                                                 "output": {"schema": "2026.2"},
                                                 "labels": {"perfdoctor": False, "nccl": True, "nccl_payload": True,
                                                            "nccl_comm_init": False}}, False),
]


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _scenario(name: str, base: str, over: dict[str, Any]) -> dict[str, Any]:
    raw = _merge(_merge(yaml.safe_load((SCENARIOS / f"{base}.yaml").read_text()), SMALL), over)
    raw["name"] = name
    return raw


@pytest.fixture(scope="session")
def grid_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("grid")


@pytest.fixture(scope="module", params=GRID, ids=[g[0] for g in GRID])
def case(request: pytest.FixtureRequest, grid_root: Path) -> dict[str, Any]:
    name, base, over, clean = request.param
    out = grid_root / name
    run_scenario(_scenario(name, base, over), out)
    report = api.analyze([out])
    truth: dict[str, dict[str, Any]] = {}
    for f in sorted(out.glob("*.truth.json")):
        t = json.loads(f.read_text())
        for r, rank in t["ranks"].items():
            truth[r] = {**rank, "labels": t["labels"]}
    for d in report.devices:
        if str(d.rank) in truth:
            truth[str(d.rank)]["measured_steps"] = _matching_steps(truth[str(d.rank)]["steps"], d.step_source,
                                                                   len(d.step_ns))
    source = {str(d.rank): d.step_source for d in report.devices}
    return {"name": name, "clean": clean, "measured": report.metrics["ranks"], "truth": truth, "source": source}


def _matching_steps(steps: list[dict], source: str, count: int) -> list[dict]:
    """The truth steps the measured steps stand for (periodic steps start at the first optimizer burst)."""
    return steps[-count:] if source == "periodic" and 0 < count < len(steps) else steps


def _want(steps: list[dict], get, window: bool) -> float:
    values = [get(s) for s in steps]
    return float(np.sum(values)) if window else float(np.median(values))


def test_grid_is_large_enough() -> None:
    assert len(GRID) >= 30
    assert sum(clean for *_, clean in GRID) >= 1


def test_every_rank_is_analysed(case: dict[str, Any]) -> None:
    assert set(case["truth"]) <= set(case["measured"]), case["name"]


def test_step_time(case: dict[str, Any]) -> None:
    for r, t in case["truth"].items():
        if t["labels"]["perfdoctor"]:
            want = _want(t["steps"], lambda s: s["step_ms"], False)
            assert case["measured"][r]["step.time_ms"] == pytest.approx(want, rel=1e-3), f"{case['name']} rank {r}"


def test_exposed_comm_per_group(case: dict[str, Any]) -> None:
    for r, t in case["truth"].items():
        m, window = case["measured"][r], case["source"][r] == "window"
        for g in GROUPS:
            got = m[f"comm.{g}.exposed_ms"]
            if got is None:
                # Only acceptable where nothing labels the groups (no perfdoctor comm ranges).
                assert not t["labels"]["perfdoctor"], f"{case['name']} rank {r}: {g} not measured"
                continue
            want = _want(t["measured_steps"], lambda s, g=g: s["exposed_ms"][g], window)
            assert got == pytest.approx(want, abs=max(0.05 * want, 0.2)), f"{case['name']} rank {r} {g}"


def test_host_gaps_by_cause(case: dict[str, Any]) -> None:
    for r, t in case["truth"].items():
        if not t["labels"]["perfdoctor"]:
            continue  # GC and data ranges are perfdoctor labels: without them the causes cannot be told
        for cause in CAUSES:
            want = _want(t["steps"], lambda s, c=cause: s["host_gap_ms"][c], False)
            got = case["measured"][r][f"host.{cause}_ms"]
            assert got == pytest.approx(want, rel=0.10, abs=0.02), f"{case['name']} rank {r} {cause}"


def test_layernorm_blocked(case: dict[str, Any]) -> None:
    for r, t in case["truth"].items():
        window = case["source"][r] == "window"
        want = _want(t["measured_steps"], lambda s: s["ln_blocked_count"], window)
        got = case["measured"][r]["ln.blocked_count"]
        assert abs(got - want) <= (len(t["steps"]) if window else 1), f"{case['name']} rank {r}"
        if want == 0:
            assert got == 0, f"{case['name']} rank {r}: LN blocking reported where there is none"


def test_pipeline_bubbles(case: dict[str, Any]) -> None:
    for r, t in case["truth"].items():
        m = case["measured"][r]
        theory = t["steps"][0]["bubble_fraction_theory"]
        if theory == 0:
            assert m["pipeline.bubble_fraction"] is None, f"{case['name']} rank {r}"
            continue
        if m["pipeline.bubble_fraction_theory"] is None:
            # pp and the micro-batch count come from the perfdoctor config mark; unlabeled runs lack it.
            assert not t["labels"]["perfdoctor"], f"{case['name']} rank {r}: no bubble theory"
        else:
            assert m["pipeline.bubble_fraction_theory"] == pytest.approx(theory, abs=1e-6)
        got = m["pipeline.bubble_fraction"]
        if got is None:
            assert not t["labels"]["perfdoctor"], f"{case['name']} rank {r}: bubble not measured"
            continue
        if case["source"][r] == "window":
            steps = t["steps"]
            want = sum(s["bubble_ms"] for s in steps) / sum(s["step_ms"] for s in steps)
        else:
            want = _want(t["measured_steps"], lambda s: s["bubble_fraction"], False)
        assert got == pytest.approx(want, abs=0.02), f"{case['name']} rank {r}"


def test_truly_clean_scenarios_expose_under_one_percent(case: dict[str, Any]) -> None:
    if not case["clean"]:
        pytest.skip("not a truly clean scenario")
    for r, t in case["truth"].items():
        m = case["measured"][r]
        for g in (*GROUPS, "other"):
            assert m[f"comm.{g}.exposed_fraction"] <= 0.01, f"{case['name']} rank {r} {g}"
        assert m["comm.exposed_fraction"] <= 0.01
        assert m["ln.blocked_count"] == 0
        truth_worst = max(s["exposed_total_ms"] / s["step_ms"] for s in t["steps"])
        assert truth_worst <= 0.01, "the clean variant is not clean in the simulator's own truth"
