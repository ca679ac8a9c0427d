"""The device breakdown tallied a slice of kernels at a time, with bincounts over stream numbers and (name,
category) pairs, equals the whole columns' tally with factorized codes, number for number and in order."""

from __future__ import annotations

import dataclasses

import pytest

from perfdoctor.classify.timeline import copy_classes, kernel_classes
from perfdoctor.load.run import load_trace
from perfdoctor.measure import breakdown
from perfdoctor.measure.activity import activity
from perfdoctor.measure.steps import find_steps
from tests.paths import REAL_H100, REPO, SAMPLES

TRACES = {"real_h100": REAL_H100, "per_node": next((SAMPLES / "per_node").glob("*.sqlite")),
          "moe_ep": next((SAMPLES / "moe_ep").glob("*.sqlite")),
          "cudagraph": REPO / "tests/data/h100/gpt_cudagraph.json.gz"}


def _summaries(path) -> list[dict]:
    _, timelines = load_trace(path)
    out = []
    for tl in timelines:
        kcls, ccls = kernel_classes(tl.kernels), copy_classes(tl.memcpy)
        window = breakdown.activity_window(tl)
        steps = find_steps(tl, window, kcls) if window else None
        whole = (-breakdown.NEVER, breakdown.NEVER)
        measured = breakdown.measured_ns(activity(tl, kcls, ccls), whole)
        out.append(dataclasses.asdict(breakdown.summarize(tl, kcls, ccls, steps, measured)))
    return out


@pytest.mark.parametrize("name", list(TRACES))
def test_slices_and_bincounts_give_the_whole_tally(name, monkeypatch):
    path = TRACES[name]
    monkeypatch.setattr(breakdown, "_DENSE_PER_ROW", 0)
    monkeypatch.setattr(breakdown, "_DENSE_SLACK", 0)  # streams and pairs factorized, whole columns
    whole = _summaries(path)
    assert any(s["streams"] and s["top_kernels"] for s in whole)
    monkeypatch.undo()
    for size in (1, 3, 1 << 18):
        monkeypatch.setattr(breakdown, "SLICE", size)
        assert _summaries(path) == whole
