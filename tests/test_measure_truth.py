"""Every measurement against the simulator's ground truth, on the committed sample traces.

The truth files are computed by perfdoctor.synth from the intervals it wrote; the measurements
never see them. Tolerances are those of issue 4: exposed comm per group within max(5 %, 0.2 ms) per
step, host gap ms by cause within 10 %, LayerNorm blocked count within ±1 per step.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from perfdoctor import api
from tests.paths import SAMPLES

SCENARIOS = sorted(p.name for p in SAMPLES.iterdir() if any(p.glob("*.truth.json")))


def _truth_ranks(scenario: str) -> dict[str, dict]:
    ranks = {}
    for f in sorted((SAMPLES / scenario).glob("*.truth.json")):
        truth = json.loads(f.read_text())
        for r, t in truth["ranks"].items():
            ranks[r] = {**t, "labels": truth["labels"]}
    return ranks


def _median(steps: list[dict], get) -> float:
    return float(np.median([get(s) for s in steps]))


@pytest.fixture(scope="module", params=SCENARIOS)
def case(request):
    scenario = request.param
    report = api.analyze([SAMPLES / scenario])
    return scenario, report.metrics["ranks"], _truth_ranks(scenario)


def test_every_truth_rank_is_analysed(case):
    _, measured, truth = case
    assert set(truth) <= set(measured)


def test_step_time(case):
    scenario, measured, truth = case
    for r, t in truth.items():
        if not t["labels"]["perfdoctor"]:
            continue  # without step ranges the steps come from the structure of the trace (see below)
        assert measured[r]["step.time_ms"] == pytest.approx(_median(t["steps"], lambda s: s["step_ms"]), rel=1e-3)


def test_exposed_comm_per_group(case):
    scenario, measured, truth = case
    for r, t in truth.items():
        m = measured[r]
        for g in ("dp", "tp", "cp", "pp", "ep"):
            # without step ranges, steps run between optimizer bursts: truth steps 1.. (step 0 is cut)
            steps = t["steps"] if t["labels"]["perfdoctor"] else t["steps"][1:]
            want = _median(steps, lambda s, g=g: s["exposed_ms"][g])
            got = m[f"comm.{g}.exposed_ms"]
            assert got == pytest.approx(want, abs=max(0.05 * want, 0.2)), f"{scenario} rank {r} {g}"


def test_host_gaps_by_cause(case):
    scenario, measured, truth = case
    for r, t in truth.items():
        if not t["labels"]["perfdoctor"]:
            continue
        for cause in ("launch_bound", "sync", "gc", "data"):
            want = _median(t["steps"], lambda s, c=cause: s["host_gap_ms"][c])
            got = measured[r][f"host.{cause}_ms"]
            assert got == pytest.approx(want, rel=0.10, abs=0.02), f"{scenario} rank {r} {cause}"


def test_layernorm_blocked(case):
    scenario, measured, truth = case
    for r, t in truth.items():
        want = _median(t["steps"], lambda s: s["ln_blocked_count"])
        got = measured[r]["ln.blocked_count"]
        assert abs(got - want) <= 1, f"{scenario} rank {r}"
        if want == 0:
            assert got == 0, f"{scenario} rank {r}: LN blocking reported on a clean trace"
        else:
            want_ms = _median(t["steps"], lambda s: s["ln_blocked_ms"])
            assert measured[r]["ln.blocked_ms"] == pytest.approx(want_ms, rel=0.10)


def test_clean_baseline_is_clean():
    report = api.analyze([SAMPLES / "clean_baseline"])
    for m in report.metrics["ranks"].values():
        assert m["ln.blocked_count"] == 0
        for g in ("dp", "tp", "cp", "pp", "ep"):
            assert m[f"comm.{g}.exposed_fraction"] <= 0.25  # overlapped: only the tail is exposed


def test_pipeline_bubbles(case):
    scenario, measured, truth = case
    for r, t in truth.items():
        want = _median(t["steps"], lambda s: s["bubble_fraction"])
        theory = t["steps"][0]["bubble_fraction_theory"]
        m = measured[r]
        if theory == 0:  # pp == 1
            assert m["pipeline.bubble_fraction"] is None
            continue
        assert m["pipeline.bubble_fraction_theory"] == pytest.approx(theory, abs=1e-6)
        if t["labels"]["perfdoctor"]:
            assert m["pipeline.bubble_fraction"] == pytest.approx(want, abs=0.02), f"{scenario} rank {r}"


def test_missing_pipeline_config_is_named(tmp_path):
    """Without the config mark, pp > 1 from the command line alone cannot give the theory: say why."""
    report = api.analyze([SAMPLES / "clean_baseline"], {"pp": 4, "num_microbatches": None})
    assert any("num_microbatches" in w for w in report.warnings) or \
        report.run.config.get("num_microbatches") is not None


def test_launch_statistics_flag_the_host_bound_run():
    """Kernels shorter than the CPU's interval between launches: nearly all in the host-bound scenario,
    a minority when the GPU has work queued."""
    host_bound = api.analyze([SAMPLES / "host_bound"]).metrics["all"]
    clean = api.analyze([SAMPLES / "clean_baseline"]).metrics["all"]
    assert host_bound["host.short_kernel_fraction"] > 0.9 > 0.5 > clean["host.short_kernel_fraction"]
    assert host_bound["host.launch_interval_us"] > host_bound["kernels.median_us"]
    assert clean["host.launch_interval_us"] < clean["kernels.median_us"]
    assert host_bound["host.launch_bound_ms"] > 10 * clean["host.launch_bound_ms"]
