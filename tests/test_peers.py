"""Who made me wait (DESIGN §3): collectives matched across ranks split each rank's exposed comm into
wait and transfer, and the straggler is named with its cause — on simulated runs with a planted
straggler (ground truth from the simulator's rendezvous) and on the real 2×H100 trace."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from perfdoctor import api
from perfdoctor.measure.peers import _members
from perfdoctor.synth import run_scenario
from tests.paths import REAL_H100

REAL_2GPU = REAL_H100
MODEL = {"layers": 4, "hidden": 2048, "heads": 16, "kv_heads": 4, "ffn_hidden": 8192, "seq_length": 2048,
         "vocab": 32000, "num_microbatches": 4}
DP_NO_OVERLAP = {"overlap_grad_reduce": False, "overlap_param_gather": False}
SCENARIOS = {
    "slow_gpu": {"parallel": {"dp": 4}, "comm": DP_NO_OVERLAP, "straggler": {"rank": 2, "gemm_slowdown": 0.18}},
    "slow_host": {"parallel": {"dp": 4}, "comm": DP_NO_OVERLAP, "straggler": {"rank": 1, "python_us": 60.0}},
    "slow_stage": {"parallel": {"pp": 2, "dp": 2}, "straggler": {"rank": 2, "gemm_slowdown": 0.5, "whole_stage": True}},
}


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[Path], api.Report]]:
    root = tmp_path_factory.mktemp("stragglers")
    out = {}
    for name, extra in SCENARIOS.items():
        scenario = {"name": name, "model": MODEL, "output": {"schema": "2024.2", "ranks": "all"},
                    "run": {"steps": 3, "seed": 5}, **extra}
        paths = run_scenario(scenario, root / name)
        out[name] = (paths, api.analyze(paths, jobs=1))
    return out


def _truth(path: Path) -> dict:
    return json.loads(path.with_suffix(".truth.json").read_text())


@pytest.mark.parametrize("name", ["slow_gpu", "slow_host"])
def test_exposed_dp_comm_splits_into_wait_and_transfer_as_simulated(planted, name: str) -> None:
    paths, report = planted[name]
    for path in paths:
        for rank, truth in _truth(path)["ranks"].items():
            metrics = report.metrics["ranks"][rank]
            want_wait = np.median([s["exposed_wait_ms"] for s in truth["dp_waits"]])
            want_transfer = np.median([s["exposed_transfer_ms"] for s in truth["dp_waits"]])
            assert metrics["comm.dp.exposed_wait_ms"] == pytest.approx(want_wait, abs=0.05 + 0.02 * want_wait)
            assert metrics["comm.dp.exposed_transfer_ms"] == pytest.approx(want_transfer, rel=0.02)
            assert metrics["comm.dp.exposed_wait_ms"] + metrics["comm.dp.exposed_transfer_ms"] == \
                pytest.approx(metrics["comm.dp.exposed_ms"])


@pytest.mark.parametrize(("name", "cause"), [("slow_gpu", "more GPU compute"),
                                             ("slow_host", "host gaps: launch-bound (Python/launch overhead)"),
                                             ("slow_stage", "more GPU compute")])
def test_straggler_and_its_cause_are_named(planted, name: str, cause: str) -> None:
    paths, report = planted[name]
    planted_rank = _truth(paths[0])["straggler"]["rank"]
    everyone = report.metrics["all"]
    assert everyone["ranks.slowest"] == planted_rank
    assert everyone["step.time_ms"] > everyone["ranks.late_ms"] > 0
    assert everyone["ranks.step_time_spread_fraction"] < 0.02  # synchronous: step time cannot tell
    evidence = next(d for d in report.devices if d.rank == planted_rank).evidence["straggler"]
    assert evidence["cause"] == cause
    if cause == "more GPU compute":
        assert evidence["kernels"] and evidence["kernels"][0]["name"].startswith("nvjet")  # the GEMMs
    rules = [f["rule"] for f in report.findings]
    if evidence["group"] == "pp":  # a slow stage is the pipeline rules' finding, not a synchronous straggler
        assert "pipeline-stage-imbalance" in rules and "straggler-rank" not in rules
    else:
        finding = report.findings[rules.index("straggler-rank")]
        assert finding["ranks"] == [planted_rank] and cause in finding["summary"]
        assert finding["impact_ms_per_step"] <= everyone["step.time_ms"]
    others = [r for r in report.metrics["ranks"] if int(r) != planted_rank]
    waited = [report.metrics["ranks"][r][f"comm.{evidence['group']}.exposed_wait_ms"] for r in others]
    assert max(waited) > 0


def test_slow_stage_names_every_rank_of_the_stage(planted) -> None:
    _, report = planted["slow_stage"]
    evidence = next(d for d in report.devices if "straggler" in d.evidence).evidence["straggler"]
    assert evidence["group"] == "pp" and evidence["like_ranks"] == [3]  # stage 1 = ranks 2 and 3


def test_real_2gpu_trace_rank0_mostly_waits_for_rank1() -> None:
    report = api.analyze([REAL_2GPU], jobs=1)
    r0 = report.metrics["ranks"]["0"]
    group = next(g for g in ("cp", "pp", "dp", "tp", "ep", "other") if r0.get(f"comm.{g}.exposed_wait_ms"))
    wait, transfer = r0[f"comm.{group}.exposed_wait_ms"], r0[f"comm.{group}.exposed_transfer_ms"]
    assert wait + transfer == pytest.approx(r0[f"comm.{group}.exposed_ms"])
    assert 9.0 < wait < 13.0 and 4.0 < transfer < 8.0  # pairing by order: ~11 ms wait, ~6 ms transfer
    assert report.metrics["all"]["ranks.slowest"] == 1
    assert report.metrics["all"]["ranks.clock_residual_us"] < 25  # the pairs end within ~20 µs
    straggler = report.devices[1].evidence["straggler"]
    assert straggler["cause"].startswith("host gaps")  # rank 1's device idled waiting for its CPU
    assert straggler["host_call"]["name"].startswith("cuda")
    assert report.devices[0].evidence["peers"][group]["waited_for_ms"]["1"] == pytest.approx(wait, rel=0.05)


def test_members_follow_megatron_rank_order() -> None:
    config = {"tp": 2, "cp": 1, "dp": 2, "pp": 2}
    assert _members(5, "tp", config, 8, []) == (4, 5)
    assert _members(5, "dp", config, 8, []) == (5, 7)
    assert _members(5, "pp", config, 8, []) == (1, 5)
    assert _members(1, "dp", {"tp": 1, "cp": 2, "dp": 2}, 4, []) == (0, 1, 2, 3)  # DP with CP
    assert _members(3, "dp", {}, None, [0, 3]) == (0, 3)  # config unknown: every rank that has the group


def test_critical_stage_is_the_stage_with_most_compute() -> None:
    from tests.paths import SAMPLES

    per_stage = {}
    for f in (SAMPLES / "pp_1f1b").glob("*.truth.json"):
        for t in json.loads(f.read_text())["ranks"].values():
            per_stage[t["stage"]] = float(np.median([s["compute_ms"] for s in t["steps"]]))
    report = api.analyze([SAMPLES / "pp_1f1b"], jobs=1)
    assert report.metrics["all"]["pipeline.critical_stage"] == max(per_stage, key=per_stage.get)
    for d in report.devices:
        ev = d.evidence["pipeline"]
        assert ev["critical"] == (ev["stage"] == max(per_stage, key=per_stage.get))
        assert ev["bubble_above_theory"] == pytest.approx(ev["bubble_fraction"] - ev["bubble_fraction_theory"])
