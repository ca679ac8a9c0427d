"""Host-gap attribution with zero-length ranges: a GC mark of 0 ms covers no instant (and used to index
an empty union: IndexError)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from perfdoctor import api
from perfdoctor.measure.host import _by_thread, _inside
from perfdoctor.synth import run_scenario
from perfdoctor.table import Table
from tests.paths import REPO


def test_zero_length_spans_cover_nothing():
    spans = Table({"start": np.array([100, 300], dtype=np.int64), "end": np.array([100, 300], dtype=np.int64),
                   "tid": np.array([7, 7], dtype=np.int64)})
    t = np.array([100, 200, 300], dtype=np.int64)
    assert not _inside(t, np.full(3, 7, dtype=np.int64), _by_thread(spans)).any()
    # a real span beside them on another thread still counts
    spans = Table({"start": np.array([100, 150], dtype=np.int64), "end": np.array([100, 250], dtype=np.int64),
                   "tid": np.array([7, 8], dtype=np.int64)})
    assert _inside(t, np.array([7, 8, 8], dtype=np.int64), _by_thread(spans)).tolist() == [False, True, False]


def test_scenario_with_zero_ms_gc_analyses(tmp_path: Path):
    raw = yaml.safe_load((REPO / "perfdoctor" / "synth" / "scenarios" / "gc_jitter.yaml").read_text())
    raw["host"] = {"gc_every_steps": 1, "gc_ms": 0}
    raw["model"] |= {"layers": 2}
    raw["run"] = {"steps": 2, "seed": 18}
    raw["name"] = "gc_zero"
    path = tmp_path / "gc_zero.yaml"
    path.write_text(yaml.safe_dump(raw))
    run_scenario(path, tmp_path / "gc_zero")
    report = api.analyze([tmp_path / "gc_zero"])
    assert report.metrics["all"]["host.gc_ms"] == 0
    assert "gc-pause" not in {f["rule"] for f in report.findings}
