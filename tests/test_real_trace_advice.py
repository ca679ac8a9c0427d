"""The advice a performance engineer would accept on real traces of other people's runs (tests/data/traces).

These traces are not ground truth for thresholds (the simulator is): they check that advice follows the
evidence — no Megatron knob as the fix for an HPC code, no HIGH finding from a handful of kernels, host
work named as host work, every finding saying how sure it is, and impacts that add up to no more than
the step."""

from __future__ import annotations

from functools import cache

import pytest

from perfdoctor import api
from perfdoctor.render import summary as sm
from tests.paths import REAL_H100, TRACES

NSYS = TRACES / "nsys"
MEGATRON_FIELDS = ("megatron_bridge", "nemo", "megatron_lm")


@cache
def _report(name: str):
    path = REAL_H100 if name == "real_h100" else NSYS / f"{name}.sqlite"
    return api.analyze([path], timeline_excerpts=False)


def _common(report) -> None:
    step = report.metrics["all"]["step.time_ms"]
    for f in report.findings:
        assert f["confidence"] in ("high", "medium", "low")
        assert f["advice"], f["rule"]
        assert f["impact_ms_per_step"] is None or f["impact_ms_per_step"] <= step
        for knob in f["knobs"]:
            assert not isinstance(knob["value"], str) or " " not in knob["value"], knob  # never prose
    total = sm.total_impact_ms(report)
    assert total is None or total <= step


@pytest.mark.parametrize("name", ["pipit_saxpy_mpi", "pipit_cloverleaf"])
def test_hpc_codes_get_no_megatron_fix(name):
    report = _report(name)
    _common(report)
    assert report.run.framework["name"] == "unknown"
    for f in report.findings:
        assert f["knobs_role"] == "reference"
        assert not any(knob.get(field) for knob in f["knobs"] for field in MEGATRON_FIELDS), f["rule"]
        assert not any((knob.get("env") or "").startswith("NCCL_") for knob in f["knobs"]), f["rule"]
        # one capture window, no step markers: nothing here is sure
        assert f["confidence"] == "low"


def test_saxpy_five_kernels_make_no_high_finding_and_host_work_is_named():
    report = _report("pipit_saxpy_mpi")
    assert all(f["severity"] != "high" for f in report.findings)
    stall = next(f for f in report.findings if f["rule"] == "host-sync-stall")
    m = report.metrics["all"]
    # ~180 ms of host computation after each blocking copy: the stall is host work, not waiting
    assert m["host.sync_host_ms"] > 10 * m["host.sync_wait_ms"]
    assert stall["advice"].startswith("Host computation after each blocking call")
    assert any("kernels in the trace" in r for r in stall["confidence_reasons"])
    copies = next((f for f in report.findings if f["rule"] == "cpu-offload-exposed"), None)
    if copies is not None:
        assert "asynchronous" in copies["advice"] and copies["knobs"] == []


@pytest.mark.parametrize("name", ["real_h100"])
def test_pytorch_training_gets_megatron_knobs_only_as_reference(name):
    report = _report(name)
    _common(report)
    assert report.run.framework["name"] == "pytorch"
    assert report.findings
    for f in report.findings:
        assert f["knobs_role"] == "reference"
        for knob in f["knobs"]:
            if any(knob.get(field) for field in MEGATRON_FIELDS):
                assert knob["role"] == "reference"
        assert f["confidence"] == "low"  # a 300 ms window treated as one step
        assert any("one step" in r for r in f["confidence_reasons"])


@pytest.mark.parametrize("name", ["real_h100"])
def test_twin_ranks_get_one_verdict(name):
    """Both GPUs run the same job: a rank-scope rule fires for the run or not at all, and a finding that
    fired names exactly the ranks over its threshold."""
    report = _report(name)
    ranks = sorted(int(r) for r in report.metrics["ranks"])
    for f in report.findings:
        assert f["ranks"] and set(f["ranks"]) <= set(ranks)
    gemm = next((f for f in report.findings if f["rule"] == "low-gemm-share"), None)
    busy = {int(r): m["gpu.busy_fraction"] for r, m in report.metrics["ranks"].items()}
    median_busy = report.metrics["all"]["gpu.busy_fraction"]
    m = report.metrics["all"]
    assert (gemm is not None) == (median_busy >= 0.9 and m["kernels.gemm_fraction"] < 0.35
                                  and m["compute.fraction"] >= 0.7)
    if gemm is not None:
        assert gemm["ranks"] == sorted(r for r, b in busy.items() if b >= 0.9) or gemm["ranks"] == ranks
