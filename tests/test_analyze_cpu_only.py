"""A real CPU-only capture (Debian nsys 2022.4, `-t osrt,nvtx`): exit 0, the no-CUDA note, NVTX counted."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.paths import SAMPLES

CPU_ONLY = SAMPLES / "real" / "cpu_nvtx_nsys2022.sqlite"


def test_cpu_only_export_is_summarised():
    proc = subprocess.run([sys.executable, "-m", "perfdoctor", "analyze", str(CPU_ONLY), "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    (inp,) = report["inputs"]
    assert inp["has_cuda"] is False and inp["nsys_version"] == "2022.4" and inp["schema_version"] == "3.0.0"
    assert any("no CUDA data" in w and "-t cuda" in w for w in report["warnings"])
    (dev,) = report["devices"]
    assert dev["device_id"] is None and dev["kernel_count"] == 0
    assert dev["nvtx_ranges"] > 0 and dev["nvtx_marks"] == 2  # the rank and config marks
    assert dev["nvtx_domains"]["perfdoctor"] > 0 and dev["osrt_calls"] > 0
    assert report["steps"]["source"] == "nvtx-step" and report["steps"]["count"] == 8
    assert report["metrics"]["all"]["gpu.busy_fraction"] is None  # nothing ran on a GPU: unknown, not 0
    assert report["run"]["ranks"] == [0] and report["run"]["timelines"][0]["rank_source"] == "nvtx-mark"
