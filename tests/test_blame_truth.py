"""What blocked the step (DESIGN §3 "Exposed is not blocking"): on simulated runs the causes blamed along
the critical path match the simulator's own critical path (synth/truth_path.py, from the dependencies it
scheduled) within 2 % of the step, and add up to the step within the reported residual."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from perfdoctor import api
from perfdoctor.blame.causes import CAUSES, metric_key
from perfdoctor.synth import run_scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "perfdoctor" / "synth" / "scenarios"
MODEL = {"layers": 4, "hidden": 2048, "heads": 16, "kv_heads": 4, "ffn_hidden": 8192, "seq_length": 2048,
         "vocab": 32000, "num_microbatches": 4}
DP_NO_OVERLAP = {"overlap_grad_reduce": False, "overlap_param_gather": False}
PLANTED = {
    "slow_gpu": {"parallel": {"dp": 4}, "comm": DP_NO_OVERLAP, "straggler": {"rank": 2, "gemm_slowdown": 0.18}},
    "slow_host": {"parallel": {"dp": 4}, "comm": DP_NO_OVERLAP, "straggler": {"rank": 1, "python_us": 60.0}},
    "slow_stage": {"parallel": {"pp": 2, "dp": 2},
                   "straggler": {"rank": 2, "gemm_slowdown": 0.5, "whole_stage": True}},
}
# The pipeline's wait splits into the schedule's share and the rest only where the schedule is known; the
# simulator's truth names the wait itself.
PIPELINE_WAIT = ("pipeline.theory", "pipeline.imbalance", "pipeline.wait")


def _family(causes: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for cause, ms in causes.items():
        key = "pipeline.wait" if cause in PIPELINE_WAIT else cause
        out[key] = out.get(key, 0.0) + ms
    return out


def _median_step(steps: list[dict]) -> tuple[float, dict[str, float]]:
    """The truth's median step time and its causes (the mean of the two middle steps for an even count,
    as the report's blocking metrics)."""
    ms = np.array([s["step_ms"] for s in steps])
    middle = np.argsort(ms, kind="stable")[(ms.size - 1) // 2: ms.size // 2 + 1]
    causes: dict[str, float] = {}
    for i in middle.tolist():
        for cause, v in steps[i]["blocking"].items():
            causes[cause] = causes.get(cause, 0.0) + v / middle.size
    return float(np.median(ms)), causes


def _analyse(paths: list[Path]) -> tuple[api.Report, dict[str, dict]]:
    truths: dict[str, dict] = {}
    for path in {p.parent / (p.name.split(".")[0] + "." + p.name.split(".")[1] + ".truth.json") for p in paths}:
        truths.update(json.loads(path.read_text())["ranks"])
    return api.analyze(paths, jobs=1), truths


def _check(report: api.Report, truths: dict[str, dict]) -> None:
    for rank, truth in truths.items():
        m = report.metrics["ranks"][rank]
        step, want = _median_step(truth["blocking_steps"])
        got = {c: m[metric_key(c)] for c in CAUSES}
        assert sum(got.values()) + m["blocking.residual_ms"] == pytest.approx(m["step.time_ms"], abs=1e-3)
        assert abs(m["blocking.residual_ms"]) <= max(0.5, 0.01 * m["step.time_ms"])
        assert "unexplained" not in want
        got, want = _family(got), _family(want)
        for cause in set(got) | set(want):
            assert got.get(cause, 0.0) == pytest.approx(want.get(cause, 0.0), abs=0.02 * step), (rank, cause)


@pytest.mark.parametrize("name", ["clean_baseline", "host_bound", "gc_jitter", "exposed_dp", "exposed_tp",
                                  "ln_blocked", "moe_ep", "pp_1f1b"])
def test_blame_matches_the_simulated_critical_path(tmp_path: Path, name: str) -> None:
    report, truths = _analyse(run_scenario(SCENARIOS / f"{name}.yaml", tmp_path))
    _check(report, truths)


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_waits_for_a_straggler_are_blamed_on_it(tmp_path: Path, name: str) -> None:
    """A slow rank or stage: the others' critical paths wait for it (wait.rank for a DP collective,
    pipeline wait for a stage), as much as the simulator made them wait."""
    scenario = {"name": name, "model": MODEL, "output": {"schema": "2024.2", "ranks": "all"},
                "run": {"steps": 3, "seed": 5}, **PLANTED[name]}
    report, truths = _analyse(run_scenario(scenario, tmp_path))
    _check(report, truths)
    slow = PLANTED[name]["straggler"]["rank"]
    waiting = [m for r, m in report.metrics["ranks"].items() if int(r) != slow]
    if name != "slow_stage":
        assert all(m["blocking.wait_rank_ms"] > 0.02 * m["step.time_ms"] for m in waiting)
        # The path crosses onto the slow rank while the others wait for it, and says why it was slow.
        why = "compute.gemm" if name == "slow_gpu" else "host.launch"
        for r, path in report.path.items():
            if int(r) == slow:
                continue
            theirs: dict[str, int] = {}
            for e in path:
                assert e["rank"] in (int(r), slow)
                if e["rank"] == slow:
                    theirs[e["cause"]] = theirs.get(e["cause"], 0) + e["end_ns"] - e["start_ns"]
            assert theirs and max(theirs, key=theirs.get) == why


def test_path_entries_are_ordered_and_named(tmp_path: Path) -> None:
    report, _ = _analyse(run_scenario(SCENARIOS / "exposed_tp.yaml", tmp_path))
    for rank, path in report.path.items():
        assert path and len(path) <= 64
        assert all(e["start_ns"] < e["end_ns"] for e in path)
        assert all(a["end_ns"] <= b["start_ns"] for a, b in zip(path, path[1:]))
        assert {e["rank"] for e in path} == {int(rank)}
        assert all(e["cause"] in CAUSES and e["what"] for e in path)


@pytest.mark.parametrize(("name", "host", "cause"), [
    ("host_bound", {"python_us": 0.001, "launch_us": 0.001}, "host_launch"),
    ("gc_jitter", {"gc_every_steps": 1, "gc_ms": 0.001, "data_stall_every_steps": 2, "data_stall_ms": 20.0},
     "host_gc"),
])
def test_what_if_matches_the_run_without_the_cause(tmp_path: Path, name: str, host: dict, cause: str) -> None:
    """The graph replayed without a cause (blame/whatif.py) predicts what simulating the run without it
    saves, within 10 % of the step, where the blocking time alone overstates it."""
    import yaml

    scenario = yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text())
    before = api.analyze(run_scenario(scenario, tmp_path / "before"), jobs=1).metrics["ranks"]["0"]
    after = api.analyze(run_scenario(scenario | {"host": host}, tmp_path / "after"), jobs=1).metrics["ranks"]["0"]
    saved = before["step.time_ms"] - after["step.time_ms"]
    predicted = before[f"whatif.{cause}_ms"]
    assert predicted == pytest.approx(saved, abs=0.1 * before["step.time_ms"])
    assert predicted <= before[f"blocking.{cause}_ms"]
    assert abs(predicted - saved) < abs(before[f"blocking.{cause}_ms"] - saved)


def test_straggler_chain_across_dp_and_pp(tmp_path: Path) -> None:
    """A slow rank in the first pipeline stage (PP 2, DP 2): its DP peer waits for it at the gradient
    reduction, the second stage then gets its activations late (and its own DP pair waits for the member
    downstream of the slow rank). The simulator plays the slow rank's data-parallel lane on its own, meeting
    the other lane at the DP collectives (synth/simulate.py); blame matches its critical path within 2 % of
    the step on every rank, the slow rank's DP peer's path crosses onto it (its GEMMs), and the whole run,
    the second stage included, is slower than without the slow rank."""
    base = {"name": "chain", "model": MODEL, "output": {"schema": "2024.2", "ranks": "all"},
            "run": {"steps": 3, "seed": 5}, "parallel": {"pp": 2, "dp": 2}, "comm": DP_NO_OVERLAP}
    slow = 1  # stage 0, DP index 1; rank 0 is its DP peer, ranks 2 and 3 the second stage
    report, truths = _analyse(run_scenario(base | {"straggler": {"rank": slow, "gemm_slowdown": 1.0}},
                                           tmp_path / "slow"))
    clean, _ = _analyse(run_scenario(base, tmp_path / "clean"))
    _check(report, truths)
    ranks = report.metrics["ranks"]
    peer = ranks["0"]
    assert peer["blocking.wait_rank_ms"] > 0.02 * peer["step.time_ms"]
    assert ranks[str(slow)]["blocking.wait_rank_ms"] < 0.005 * peer["step.time_ms"]  # it waits for nobody
    theirs: dict[str, int] = {}
    for e in report.path["0"]:
        if e["rank"] == slow:
            theirs[e["cause"]] = theirs.get(e["cause"], 0) + e["end_ns"] - e["start_ns"]
    assert theirs and max(theirs, key=theirs.get) == "compute.gemm"
    for r in ("2", "3"):  # the second stage: slower, and waiting for the first more than without the slow rank
        waits = ("blocking.pipeline_theory_ms", "blocking.pipeline_imbalance_ms", "blocking.wait_rank_ms")
        assert ranks[r]["step.time_ms"] > clean.metrics["ranks"][r]["step.time_ms"] + 0.02 * ranks[r]["step.time_ms"]
        assert sum(ranks[r][k] for k in waits) > sum(clean.metrics["ranks"][r][k] for k in waits)
    # the truth has the chain too: the peer's wait for the slow rank, the second stage's waits
    assert _median_step(truths["0"]["blocking_steps"])[1]["wait.rank"] > 0.02 * peer["step.time_ms"]


@pytest.mark.parametrize(("over", "why"), [
    ({"comm": {"overlap_grad_reduce": True}}, "overlap_grad_reduce: false"),
    ({"parallel": {"pp": 2, "dp": 2, "tp": 2}, "comm": DP_NO_OVERLAP}, "tp: 1"),
    ({"parallel": {"pp": 2, "dp": 2}, "comm": {"overlap_grad_reduce": False, "overlap_param_gather": True}},
     "overlap_param_gather: false"),
])
def test_slow_rank_needs_a_rendezvous_the_step_waits_for(over: dict, why: str) -> None:
    from perfdoctor.errors import InputError
    from perfdoctor.synth.scenario import scenario_from_dict

    raw = {"name": "bad", "model": MODEL, "parallel": {"dp": 2}, "straggler": {"rank": 1, "gemm_slowdown": 0.5},
           **over}
    with pytest.raises(InputError, match=why):
        scenario_from_dict(raw)
