"""A copy is blamed only when the compute waited for it (issue 23): a side-stream prefetch that overlaps
compute is exposed while the first kernels start late, but nothing waited for it, so it is not on the
critical path and the copy finding does not fire; the same copy waited for is."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from perfdoctor import api

STEP_US, COPY_US, KERNEL_US, PYTHON_US = 10_000.0, 3_000.0, 200.0, 1_000.0


def _trace(path: Path, waited: bool) -> Path:
    """Three profiler steps: a 128 MiB host-to-device copy on a side stream at the start of each, then
    kernels on the compute stream launched every 50 us after 1 ms of Python; with ``waited`` the first
    kernel waits for the copy (it starts as the copy ends, launched long before)."""
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": 100, "tid": 0, "args": {"name": "python3"}}]
    corr = 0

    def call(name: str, ts: float, dur: float) -> int:
        nonlocal corr
        corr += 1
        events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 100, "tid": 100, "ts": ts, "dur": dur,
                       "args": {"correlation": corr}})
        return corr

    def device(cat: str, name: str, ts: float, dur: float, stream: int, c: int, **args: object) -> None:
        events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                       "args": {"device": 0, "stream": stream, "correlation": c, **args}})

    for step in range(3):
        t0 = 1_000.0 + step * STEP_US
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 100, "tid": 100,
                       "ts": t0, "dur": STEP_US})
        c = call("cudaMemcpyAsync", t0 + 10, 8)
        device("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", t0 + 30, COPY_US, 20, c, bytes=128 << 20)
        t, free = t0 + PYTHON_US, 0.0
        first = True
        while True:
            c = call("cudaLaunchKernel", t, 6)
            start = max(t + 8, free)
            if first and waited:
                start = t0 + 30 + COPY_US + 2
            if start + KERNEL_US > t0 + STEP_US - 300:
                break
            device("kernel", "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn", start, KERNEL_US, 7, c,
                   grid=[132, 1, 1], block=[256, 1, 1])
            free, first = start + KERNEL_US, False
            t += 50 if t < free - 400 else KERNEL_US
        call("cudaDeviceSynchronize", t + 10, max(free - t - 10, 1) + 5)
    data = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}],
            "traceEvents": events}
    with gzip.open(path, "wt") as f:
        json.dump(data, f)
    return path


@pytest.mark.parametrize("waited", [False, True])
def test_a_prefetch_nothing_waited_for_is_not_blamed(tmp_path: Path, waited: bool) -> None:
    report = api.analyze([_trace(tmp_path / "prefetch.pt.trace.json.gz", waited)], jobs=1)
    m = report.metrics["ranks"]["0"]
    assert m["memcpy.exposed_ms"] > 0.03 * m["step.time_ms"]  # exposed either way: the old signal
    fired = {f["rule"] for f in report.findings}
    if waited:
        assert m["blocking.copy_ms"] == pytest.approx(COPY_US / 1e3, rel=0.05)
        assert "cpu-offload-exposed" in fired
    else:
        assert m["blocking.copy_ms"] == 0
        assert "cpu-offload-exposed" not in fired
