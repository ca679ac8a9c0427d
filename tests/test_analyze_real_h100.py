"""`perfdoctor analyze` on a real 2×H100 nsys 2026.2 export that nobody on this project produced."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.paths import REAL_H100


@pytest.fixture(scope="module")
def report() -> dict:
    proc = subprocess.run([sys.executable, "-m", "perfdoctor", "analyze", str(REAL_H100), "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_inputs_and_devices(report):
    (inp,) = report["inputs"]
    assert inp["nsys_version"] == "2026.2"
    assert inp["schema_version"] == "3.25.0"
    assert inp["has_cuda"] is True
    assert report["run"]["devices"] == 2
    assert sum(d["kernel_count"] for d in report["devices"]) == 4010
    assert inp["counts"]["kernels"] == 4010


def test_comm_kernels_are_all_send_recv(report):
    comm = sum(d["comm_kernel_count"] for d in report["devices"])
    assert comm == 66
    for dev in report["devices"]:
        assert set(dev["collectives"]) == {"send_recv"}
        assert dev["collectives"]["send_recv"]["count"] == dev["comm_kernel_count"]
        assert dev["comm_libraries"] == {"nccl": dev["comm_kernel_count"]}


def test_every_kernel_is_classified_sensibly(report):
    for dev in report["devices"]:
        cats = dev["category_count"]
        assert cats.get("gemm", 0) > 0 and cats.get("attention", 0) > 0 and cats.get("norm", 0) > 0
        assert cats.get("other", 0) == 0, cats


def test_comm_on_the_compute_stream_is_exposed(report):
    """All kernels of each rank run on one stream, so every comm nanosecond is exposed."""
    for dev in report["devices"]:
        assert len(dev["streams"]) == 1
    for m in report["metrics"]["ranks"].values():
        assert m["comm.time_ms"] > 0
        assert m["comm.exposed_ms"] == pytest.approx(m["comm.time_ms"])
        assert 0 < m["gpu.busy_fraction"] <= 1


def test_no_step_markers_is_flagged(report):
    assert report["steps"] == {**report["steps"], "count": 1, "source": "window"}
    assert any("no step markers" in w for w in report["warnings"])
    assert report["metrics"]["all"]["step.time_ms"] == pytest.approx(300, abs=2)


def test_unknown_metrics_are_null_not_invented(report):
    m = report["metrics"]["all"]
    for key in ("pipeline.bubble_fraction", "mfu", "memory.peak_allocated_bytes"):
        assert key in m and m[key] is None
    assert report["schema_version"] == "1"
    assert set(report["metrics"]["ranks"]) == {"0", "1"}


def test_heuristic_group_labels_are_marked_as_guesses(report):
    """No NVTX labels in this trace: whatever group the SendRecvs get is a flagged heuristic guess."""
    for dev in report["devices"]:
        labelled = sum(g["kernels"] for g in dev["groups"].values())
        assert labelled <= dev["comm_kernel_count"]
        for info in dev["groups"].values():
            assert set(info["label_source"]) == {"heuristic"}
            assert "high" not in info["confidence"]


def test_stable_across_runs(report):
    again = subprocess.run([sys.executable, "-m", "perfdoctor", "analyze", str(REAL_H100), "--format", "json"],
                           capture_output=True, text=True, timeout=300)
    assert json.loads(again.stdout)["metrics"] == report["metrics"]


def test_report_validates_against_the_published_schema(report):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is a dev extra")
    from importlib.resources import files

    schema = json.loads(files("perfdoctor").joinpath("schema/report.schema.json").read_text())
    jsonschema.validate(report, schema)
    broken = {**report, "metrics": {"all": {}, "ranks": {}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)
