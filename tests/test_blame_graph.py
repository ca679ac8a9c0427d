"""The dependency graph of one rank (perfdoctor.blame.graph), one dependency kind at a time, on simulated
traces whose scheduler is known (synth/recorder.py): a kernel after its launch call, after its stream's
previous op, after another stream's op it waited for (nsys records the stream wait: not inferred; the
Kineto twin does not: inferred)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from perfdoctor.blame.graph import EVENT, LAUNCH, NONE, STREAM, device_ops, edges
from perfdoctor.classify.groups import label_groups
from perfdoctor.classify.timeline import copy_classes, kernel_classes
from perfdoctor.load.run import load_trace
from perfdoctor.synth import run_scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "perfdoctor" / "synth" / "scenarios"


def _graph(path: Path):
    _, timelines = load_trace(path, detail=False)
    tl = next(t for t in timelines if t.device_id is not None)
    kcls = kernel_classes(tl.kernels)
    ops = device_ops(tl, kcls, copy_classes(tl.memcpy), label_groups(tl, kcls, {}))
    return ops, edges(ops, tl.sync)


@pytest.mark.parametrize("fmt", ["sqlite", "kineto"])
def test_each_dependency_kind_binds_where_the_simulator_made_it(tmp_path: Path, fmt: str) -> None:
    ops, e = _graph(run_scenario(SCENARIOS / "exposed_cp.yaml", tmp_path, fmt=fmt)[0])
    bound = e.kind != NONE
    kind = e.kind[bound]
    assert {LAUNCH, STREAM, EVENT} <= set(kind.tolist())
    # A binding edge was satisfied no later than the op started, and its source ended by then; an op without
    # an edge is ready when it starts, and a launch edge's source is the host.
    assert (e.ready[bound] <= ops.start[bound]).all() and (e.ready[~bound] == ops.start[~bound]).all()
    assert (e.src[e.kind == LAUNCH] == NONE).all() and (e.src[e.kind > LAUNCH] >= 0).all()
    dev = e.src[bound]
    assert (ops.end[dev[dev >= 0]] <= ops.start[bound][dev >= 0]).all()
    # Event edges join different streams; stream edges the same one.
    ev = np.flatnonzero(e.kind == EVENT)
    st = np.flatnonzero(e.kind == STREAM)
    assert (ops.stream[e.src[ev]] != ops.stream[ev]).all()
    assert (ops.stream[e.src[st]] == ops.stream[st]).all()
    assert not e.inferred[e.kind != EVENT].any()
    recorded = ~e.inferred[ev]
    if fmt == "sqlite":  # cudaStreamWaitEvent left a synchronization record
        assert recorded.mean() > 0.5
    else:
        assert not recorded.any()


@pytest.mark.parametrize("slice_size", [1, 3, 1 << 18])
def test_ends_seen_by_each_start_are_a_search(slice_size, monkeypatch):
    """graph._ended_by merges sorted runs a slice of starts at a time: it is searchsorted(ends, starts,
    "right"), ties (an end equal to a start counts) and slices that reach no end included."""
    from perfdoctor.blame import graph

    monkeypatch.setattr(graph, "ENDED_SLICE", slice_size)
    rng = np.random.default_rng(3)
    starts = np.sort(rng.integers(0, 50, 40))
    ends = np.sort(np.concatenate([starts[::3], rng.integers(0, 60, 30)]))
    assert graph._ended_by(ends, starts).tolist() == np.searchsorted(ends, starts, side="right").tolist()
    assert graph._ended_by(ends, np.zeros(0, dtype=np.int64)).size == 0
