"""Simulated runs without perfdoctor labels or ProfilerStep, marked only by the program's own ranges in
several naming styles (train_step, step_<n>, Forward + Backward, Lightning's run_training_batch), inside
CS336-style `init_model` (weight upload) / `warmup` / `benchmark_loop` phases: the steps are the
benchmark iterations (checked against the simulator's truth), the weight upload is in none of them, and
the report names what it left out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from perfdoctor import api
from perfdoctor.render.json import report_dict
from perfdoctor.synth import run_scenario
from tests.paths import REPO

STEPS, WARMUP = 4, 1


def _run(tmp_path: Path, style: str, fmt: str) -> tuple[dict, dict]:
    raw = yaml.safe_load((REPO / "perfdoctor/synth/scenarios/clean_baseline.yaml").read_text())
    raw["model"]["layers"] = 2
    raw["labels"] = {"perfdoctor": False, "user_steps": style, "user_phases": True, "user_warmup": WARMUP}
    raw["run"]["steps"] = STEPS
    (trace,) = run_scenario(raw, tmp_path, fmt=fmt)[:1]
    truth = json.loads(next(tmp_path.glob("*.truth.json")).read_text())["ranks"]["0"]["steps"]
    return report_dict(api.analyze([trace], timeline_excerpts=False)), truth


@pytest.mark.parametrize("style,source,label", [
    ("train_step", "repeating-range", "train_step"), ("step_n", "repeating-range", "step_#"),
    ("forward_backward", "repeating-range", "Forward"), ("lightning", "framework-step", "run_training_batch")])
@pytest.mark.parametrize("fmt", ["sqlite", "kineto"])
def test_benchmark_iterations_are_the_steps(tmp_path: Path, style: str, source: str, label: str, fmt: str) -> None:
    report, truth = _run(tmp_path, style, fmt)
    steps = report["steps"]
    assert steps["source"] == source and steps["label"] == label
    if source == "framework-step":  # a framework's ranges: every iteration, warm-up included
        assert steps["count"] == STEPS
    else:
        assert steps["count"] == STEPS - WARMUP
        assert steps["excluded_ranges"] == ["init_model", "warmup"]
        assert any("init_model" in w and "left out" in w for w in report["warnings"])
    assert steps["excluded_ms"] > 0
    measured = steps["median_ms"]
    true_ms = sorted(s["step_ms"] for s in truth[STEPS - steps["count"]:])
    assert true_ms[0] * 0.9 <= measured <= true_ms[-1] * 1.1  # host-side boundaries: within 10 %
    rules = {f["rule"] for f in report["findings"]}
    assert "cpu-offload-exposed" not in rules  # the weight upload lies before the first step


def test_the_weight_upload_alone_would_raise_a_copy_finding(tmp_path: Path) -> None:
    """The upload is large enough that, counted in a step (the whole window as one step), it would be the
    `cpu-offload-exposed` finding (exposed copies >= 3 % of the step): the test above can fail."""
    report, _ = _run(tmp_path, "train_step", "sqlite")
    dev = report["devices"][0]
    window_ms = (dev["window"][1] - dev["window"][0]) / 1e6
    assert dev["category_ns"]["memcpy"] / 1e6 >= 0.03 * window_ms
