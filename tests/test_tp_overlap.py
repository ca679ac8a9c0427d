"""TP comm-GEMM overlap lost to CUDA_DEVICE_MAX_CONNECTIONS != 1, against the simulator's model of it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from perfdoctor import api
from perfdoctor.classify.timeline import kernel_classes
from perfdoctor.load.run import load_run
from perfdoctor.measure.breakdown import activity_window
from perfdoctor.measure.steps import find_steps
from perfdoctor.measure.tp_overlap import serialized_overlap
from perfdoctor.synth import run_scenario
from tests.paths import REPO, SAMPLES


def _scenario(tmp: Path, connections: int, nvlink_gbps: float) -> Path:
    raw = yaml.safe_load((REPO / "perfdoctor/synth/scenarios/tp_overlap_connections.yaml").read_text())
    raw["name"] = f"tpo_{connections}_{int(nvlink_gbps)}"
    raw["comm"]["cuda_device_max_connections"] = connections
    raw["gpu"]["nvlink_gbps"] = nvlink_gbps
    raw["model"]["layers"] = 2
    raw["run"]["steps"] = 2
    out = tmp / raw["name"]
    run_scenario(raw, out)
    return out


def _measure(directory: Path):
    tl = load_run([directory]).timelines[0]
    kcls = kernel_classes(tl.kernels)
    return tl, kcls, serialized_overlap(tl, kcls, find_steps(tl, activity_window(tl), kcls))


def test_connections_8_serializes_the_overlap() -> None:
    tl, kcls, result = _measure(SAMPLES / "tp_overlap_connections")
    assert result.connections == "8"
    assert result.ms_per_step is not None and (result.ms_per_step > 0.1).all()
    assert result.index.size and (kcls.col("library")[result.index] == "userbuffers").all()
    assert (kcls.col("category")[result.gemm] == "gemm").all()
    start, end = tl.kernels["start"], tl.kernels["end"]
    gap = start[result.index] - end[result.gemm]
    assert ((gap >= 0) & (gap <= 5_000)).all()  # each starts as the GEMM it should overlap ends
    metric = api.analyze([SAMPLES / "tp_overlap_connections"]).metrics["ranks"]["0"]["tp.serialized_overlap_ms"]
    assert metric == pytest.approx(float(np.median(result.ms_per_step)))


@pytest.mark.parametrize("nvlink_gbps", [40.0, 400.0])  # comm-bound and GEMM-bound chunks
def test_connections_1_keeps_the_overlap(tmp_path: Path, nvlink_gbps: float) -> None:
    healthy = _measure(_scenario(tmp_path, 1, nvlink_gbps))[2]
    broken = _measure(_scenario(tmp_path, 8, nvlink_gbps))[2]
    assert healthy.connections == "1" and healthy.comm_count == broken.comm_count > 0
    assert healthy.index.size == 0 and (healthy.ms_per_step == 0).all()
    assert (broken.ms_per_step > 0.1).all()


@pytest.mark.parametrize("scenario", ["clean_baseline", "exposed_tp", "exposed_dp"])
def test_no_tp_overlap_means_no_value(scenario: str) -> None:
    """NCCL TP (on its own stream or the compute stream) is not comm-GEMM overlap: None, not 0."""
    assert api.analyze([SAMPLES / scenario]).metrics["ranks"]["0"]["tp.serialized_overlap_ms"] is None
