"""PyTorch-profiler traces from ROCm builds: HIP API categories and names, numbers written as strings,
optional fields missing; and the one-line error when a needed value is not a number."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from perfdoctor import api
from perfdoctor.errors import InputError
from perfdoctor.load import kineto
from perfdoctor.load.kineto import load_kineto
from perfdoctor.render.json import report_dict
from tests.paths import REPO

ROCM = REPO / "tests" / "data" / "kineto_rocm" / "rocm_decode.json"


def _plain() -> dict:
    return json.loads(ROCM.read_text())


def test_rocm_trace_loads_every_gpu_event() -> None:
    doc = _plain()
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    copies = [e for e in doc["traceEvents"] if e.get("cat") == "gpu_memcpy"]
    _, (tl,) = load_kineto(ROCM)
    assert len(tl.kernels) == len(kernels) and len(tl.memcpy) == len(copies) and len(tl.memset) > 0
    assert int(tl.memcpy.col("bytes").sum()) == sum(int(e["args"]["bytes"]) for e in copies)  # strings
    kinds = set(tl.memcpy.col("copy_kind").tolist())
    assert kinds == {1, 2}  # "Memcpy HtoD (...)" and roctracer's "CopyDeviceToHost"
    assert set(tl.api.col("name", dtype=object)) == {"hipLaunchKernel", "hipMemcpyAsync", "hipMemcpyWithStream"}
    # every kernel finds its launch call, also where the call's correlation id was written as a string
    corr = set(tl.api.col("correlation_id").tolist())
    assert all(c in corr for c in tl.kernels.col("correlation_id").tolist())


def test_rocm_trace_analysis() -> None:
    report = report_dict(api.analyze([ROCM]))
    steps = report["steps"]
    assert steps["source"] == "repeating-range" and steps["label"] == "execute_model" and steps["count"] == 5
    assert steps["excluded_ranges"] == ["load_model"] and steps["excluded_ms"] > 0
    rules = {f["rule"] for f in report["findings"]}
    assert "cpu-offload-exposed" not in rules  # the weight upload is before the first step
    dev = report["devices"][0]
    assert dev["category_ns"]["gemm"] > 0 and dev["category_ns"]["attention"] > 0
    assert report["run"]["gpu"] == "AMD Instinct MI300X"


def test_chunked_and_whole_decodes_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small chunks decode loosely one at a time (each holds strings where numbers are expected)."""
    _, (whole,) = load_kineto(ROCM)
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 2048)
    _, (chunked,) = load_kineto(ROCM)
    for table in ("kernels", "memcpy", "memset", "api", "nvtx"):
        a, b = getattr(whole, table), getattr(chunked, table)
        assert len(a) == len(b) and np.array_equal(a.col("start"), b.col("start")), table


def _with(tmp_path: Path, edit) -> Path:
    doc = _plain()
    edit(doc["traceEvents"])
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_time_that_is_not_a_number_names_event_and_field(tmp_path: Path) -> None:
    def bad_ts(events: list[dict]) -> None:
        k = next(i for i, e in enumerate(events) if e.get("cat") == "kernel")
        events[k]["ts"] = "soon"
    path = _with(tmp_path, bad_ts)
    with pytest.raises(InputError, match=r"event \d+ \(kernel 'Cijk_.*\): `ts` is not a number \('soon'\)"):
        load_kineto(path)
    proc = subprocess.run([sys.executable, "-m", "perfdoctor", "analyze", str(path)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "`ts`" in proc.stderr


def test_optional_values_that_are_not_numbers_are_unknown(tmp_path: Path) -> None:
    """A stream or byte count that is not a number is unknown (−1), not a refusal."""
    def odd(events: list[dict]) -> None:
        for e in events:
            if e.get("cat") == "gpu_memcpy":
                e["args"]["bytes"] = "n/a"
            if e.get("cat") == "kernel":
                e["args"]["stream"] = "hip stream"
                e["args"]["grid"] = "[304, 1, 1]"
    _, (tl,) = load_kineto(_with(tmp_path, odd))
    assert (tl.memcpy.col("bytes") == -1).all() and (tl.kernels.col("stream") == -1).all()
    assert len(tl.kernels) == 120
