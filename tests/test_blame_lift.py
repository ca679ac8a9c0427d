"""The critical path's lifting tables stop each device chain at its op's step start (blame/path.py; the
earliest step's where steps overlap): a walk never goes further back, so the paths are those of chains
lifted across the whole capture, in a fraction of the tables."""

from __future__ import annotations

import numpy as np
import pytest

from perfdoctor.blame import path
from perfdoctor.blame.focus import marks
from perfdoctor.blame.graph import device_ops, edges
from perfdoctor.classify.groups import label_groups
from perfdoctor.classify.timeline import copy_classes, kernel_classes
from perfdoctor.load.run import load_trace
from perfdoctor.measure.breakdown import activity_window
from perfdoctor.measure.steps import Steps, find_steps
from tests.paths import REAL_H100, SAMPLES

TRACES = [SAMPLES / "clean_baseline" / "clean_baseline.rank0.sqlite",
          SAMPLES / "host_bound" / "host_bound.rank0.sqlite", SAMPLES / "pp_1f1b" / "pp_1f1b.rank2.sqlite", REAL_H100]


def _paths(tl, steps: Steps) -> tuple[path.RankPath, path._Walker]:
    kcls, ccls = kernel_classes(tl.kernels), copy_classes(tl.memcpy)
    groups = label_groups(tl, kcls, {})
    ops = device_ops(tl, kcls, ccls, groups)
    graph = edges(ops, tl.sync)
    found = path.rank_path(tl, ops, graph, steps, np.flatnonzero(groups.codes >= 0), marks(tl, kcls, steps, ops))
    return found, path._Walker(tl, ops, graph, steps)


def _same(a: path.RankPath, b: path.RankPath) -> None:
    assert np.array_equal(a.by_cause, b.by_cause) and np.array_equal(a.residual, b.residual)
    assert a.path.keys() == b.path.keys() and a.saving == b.saving and a.focus_saving == b.focus_saving
    for key, value in a.path.items():  # the representative step's path: base, names, rows (structured)
        assert np.array_equal(value, b.path[key]) if isinstance(value, np.ndarray) else value == b.path[key], key
    for name in ("comm_step", "comm_instance", "comm_start", "comm_end", "comm_cause", "focus"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name)
def test_chains_stopped_at_step_starts_walk_the_same_paths(trace, monkeypatch):
    _, timelines = load_trace(trace, detail=False)
    tl = next(t for t in timelines if t.device_id is not None and len(t.kernels))
    kcls = kernel_classes(tl.kernels)
    steps = find_steps(tl, activity_window(tl), kcls)
    # Shorter steps than the trace's own: more chains cross a step start.
    cuts = np.linspace(steps.starts[0], steps.ends[-1], 4 * len(steps) + 1).astype(np.int64)
    lap = np.concatenate(([0], (np.diff(cuts) // 20)[:-1]))  # and steps overlapping by 5 %
    for s in (steps, Steps(cuts[:-1], cuts[1:], "window"), Steps(cuts[:-1] - lap, cuts[1:], "window")):
        cut, cut_walker = _paths(tl, s)
        with monkeypatch.context() as m:
            m.setattr(path, "_step_floor", lambda start, steps: np.full(start.size, np.iinfo(np.int64).min))
            whole, whole_walker = _paths(tl, s)
        _same(cut, whole)
        assert len(cut_walker.lift) <= len(whole_walker.lift)


def test_overlapping_steps_cut_chains_at_the_earliest_step_an_op_is_in():
    start = np.array([5, 15, 25], dtype=np.int64)
    floor = path._step_floor(start, Steps(np.array([0, 10]), np.array([20, 30]), "window"))
    assert floor.tolist() == [0, 0, 10]  # the op at 15 is in both steps: a walk of the first passes it
    assert path._step_floor(start, Steps(np.array([0, 10]), np.array([10, 30]), "window")).tolist() == [0, 10, 10]
    # steps out of order: chains left whole
    unordered = path._step_floor(start, Steps(np.array([10, 0]), np.array([30, 20]), "window"))
    assert (unordered == np.iinfo(np.int64).min).all()


def test_step_floor_per_piece_is_the_floor_per_op():
    """The floor found once per piece between step starts and ends equals it found op by op (the earliest
    step that starts before the op and ends at or after it, else the last that starts before it)."""
    rng = np.random.default_rng(5)
    for _ in range(50):
        lows = np.sort(rng.integers(0, 100, rng.integers(1, 6)))
        highs = lows + rng.integers(-3, 40, lows.size)
        start = np.sort(rng.integers(-10, 150, 60))
        expected = []
        for s in start.tolist():
            before = [i for i in range(lows.size) if lows[i] < s]
            inside = [i for i in before if highs[: i + 1].max() >= s]
            expected.append(int(lows[inside[0]]) if inside else int(lows[before[-1]]) if before
                            else np.iinfo(np.int64).min)
        assert path._step_floor(start, Steps(lows, highs, "window")).tolist() == expected
