"""A capture that holds next to nothing (one kernel per rank: a profiler range that closed early) says so
in one line and raises no finding above info."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from perfdoctor import api
from perfdoctor.api import MIN_KERNELS_PER_RANK
from perfdoctor.render.json import report_dict
from tests.paths import REPO

ROCM = REPO / "tests" / "data" / "kineto_rocm" / "rocm_decode.json"


def _rank(tmp_path: Path, rank: int, kernels: int, stretch: float) -> Path:
    """The ROCm sample cut to its first ``kernels`` kernels (and their launches), durations × ``stretch``."""
    doc = json.loads(ROCM.read_text())
    events = doc["traceEvents"]
    keep = [e for e in events if e.get("cat") == "kernel"][:kernels]
    corr = {int(e["args"]["correlation"]) for e in keep}
    for e in keep:
        e["dur"] *= stretch
    doc["traceEvents"] = [e for e in events if e.get("ph") == "M" or e in keep
                          or (e.get("cat") == "hip_runtime" and int(e["args"]["correlation"]) in corr)]
    doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
    path = tmp_path / f"rank{rank}.json"
    path.write_text(json.dumps(doc))
    return path


def test_one_kernel_per_rank_is_too_little(tmp_path: Path) -> None:
    files = [_rank(tmp_path, 0, 1, 1.0), _rank(tmp_path, 1, 1, 2.6)]
    report = report_dict(api.analyze(files))
    assert report["warnings"][0].startswith("too little to analyse: at most 1 kernel per rank and no steps")
    assert report["findings"] and all(f["severity"] == "info" for f in report["findings"])
    proc = subprocess.run([sys.executable, "-m", "perfdoctor", "analyze", *map(str, files), "--fail-on", "low"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr  # nothing at or above low
    assert sum("too little to analyse" in line for line in proc.stdout.splitlines()) == 1


def test_enough_kernels_are_analysed(tmp_path: Path) -> None:
    report = report_dict(api.analyze([_rank(tmp_path, 0, MIN_KERNELS_PER_RANK, 1.0)]))
    assert not any(w.startswith("too little") for w in report["warnings"])
