"""Host gaps attributed a window of whole steps at a time equal the whole trace's in one pass, bit for bit:
a gap at a window's edge, a step's sums and the order of the intervals do not depend on where windows end."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from perfdoctor.classify.timeline import copy_classes, kernel_classes
from perfdoctor.load.run import load_trace
from perfdoctor.measure import host
from perfdoctor.measure.activity import activity
from perfdoctor.measure.breakdown import activity_window
from perfdoctor.measure.steps import find_steps
from tests.paths import REAL_H100, REPO, SAMPLES

TRACES = ["gc_pause", "data_stall", "host_bound", "gc_jitter", "pp_1f1b"]


def _path(name: str):
    return REAL_H100 if name == "real_h100" else next((SAMPLES / name).glob("*.sqlite"))


def _same(a, b) -> None:
    if isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            _same(a[key], b[key])
    elif isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a.dtype == b.dtype and np.array_equal(a, b)


@pytest.mark.parametrize("name", [*TRACES, "real_h100"])
def test_windows_give_the_whole_pass(name, monkeypatch):
    _, timelines = load_trace(_path(name))
    causes = set()
    windowed = 0
    for tl in timelines:
        kcls = kernel_classes(tl.kernels)
        if (window := activity_window(tl)) is None:
            continue
        steps = find_steps(tl, window, kcls)
        if len(steps) < 2:  # one step (the real export): cut its window in eight to have windows to compare
            edges = np.linspace(window[0], window[1], 9).astype(np.int64)
            steps = host.Steps(edges[:-1], edges[1:], "periodic")
        busy = activity(tl, kcls, copy_classes(tl.memcpy)).busy
        monkeypatch.setattr(host, "WINDOW_OPS", 1 << 60)
        whole, whole_sums = host.gap_causes(tl, steps, busy), host.host_gaps(tl, steps, busy)
        causes |= set(whole.names)
        for size in (1, 3, 50):
            monkeypatch.setattr(host, "WINDOW_OPS", size)
            windowed += len(host.window_bounds(steps, busy, size)) > 2
            _same(dataclasses.asdict(host.gap_causes(tl, steps, busy)), dataclasses.asdict(whole))
            _same(dataclasses.asdict(host.host_gaps(tl, steps, busy)), dataclasses.asdict(whole_sums))
            with monkeypatch.context() as mapped:  # the gaps written into columns as long as their bound
                mapped.setattr(host.iv, "MMAP_ABOVE", 0)
                _same(dataclasses.asdict(host.host_gaps(tl, steps, busy)), dataclasses.asdict(whole_sums))
    assert windowed  # the small sizes did cut the steps into several windows
    assert len(causes) >= 2


def test_the_traces_hold_every_cause(monkeypatch):
    """The traces above, together, have host gaps of every cause but ``other`` (so every branch is windowed)."""
    seen = set()
    for name in TRACES:
        _, timelines = load_trace(_path(name))
        for tl in timelines:
            kcls = kernel_classes(tl.kernels)
            steps = find_steps(tl, activity_window(tl), kcls)
            seen |= set(host.gap_causes(tl, steps, activity(tl, kcls, copy_classes(tl.memcpy)).busy).names)
    assert seen >= {"launch_bound", "sync", "gc", "data", "outside_ops", "device_wait"}, seen


def test_window_bounds_cut_between_steps():
    steps = host.Steps(np.array([0, 10, 20, 30]), np.array([10, 20, 30, 40]), "window")
    busy = (np.arange(0, 40, 2), np.arange(1, 41, 2))  # 5 busy intervals a step
    assert host.window_bounds(steps, busy, 10).tolist() == [0, 2, 4]
    assert host.window_bounds(steps, busy, 1).tolist() == [0, 1, 2, 3, 4]
    assert host.window_bounds(steps, busy, 100).tolist() == [0, 4]
    shuffled = host.Steps(np.array([10, 0]), np.array([20, 10]), "window")
    assert host.window_bounds(shuffled, busy, 1).tolist() == [0, 2]


def _pauses_of_union(start, end):
    """host_pauses as one union of every call (what the slices must give)."""
    s, e = host.iv.union(start, end)
    if s.size < 2:
        return host.iv.EMPTY
    length = s[1:] - e[:-1]
    long = length > host.PAUSE_FACTOR * float(np.median(length))
    return e[:-1][long], s[1:][long]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("size", [1, 2, 7, 1 << 18])
def test_pauses_by_slices_are_the_union_s(seed, size, monkeypatch):
    """Calls that overlap, touch, nest and are empty, cut into slices anywhere: the same pauses."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 60))
    start = np.sort(rng.integers(0, 400, n))
    end = start + rng.choice([0, 1, 3, 40, 200], n) * (rng.random(n) < 0.9)
    monkeypatch.setattr(host, "WINDOW_OPS", size)
    _same(host._sorted_pauses(start, end), _pauses_of_union(start, end))


@pytest.mark.parametrize("name", [*TRACES, "real_h100"])
def test_pauses_by_slices_on_traces(name, monkeypatch):
    monkeypatch.setattr(host, "WINDOW_OPS", 5)
    _, timelines = load_trace(_path(name))
    for tl in timelines:
        start, end = tl.api.col("start"), tl.api.col("end")
        if np.all(start[1:] >= start[:-1]):
            _same(host._sorted_pauses(start, end), _pauses_of_union(start, end))


@pytest.mark.parametrize("name", [*TRACES, "real_h100", "cudagraph"])
def test_launch_stats_by_slices(name, monkeypatch):
    """The launch statistics compare kernels and intervals a slice at a time: any slice size, the same
    numbers (a CUDA-graph capture, many kernels to a call, included)."""
    path = REPO / "tests/data/h100/gpt_cudagraph.json.gz" if name == "cudagraph" else _path(name)
    _, timelines = load_trace(path)
    for tl in timelines:
        if not len(tl.kernels):
            continue
        monkeypatch.setattr(host, "WINDOW_OPS", 1 << 60)
        whole = host._launch_stats(tl)  # from whole columns
        assert host.launch_stats(tl) == whole
        for size in (1, 2, 7):
            monkeypatch.setattr(host, "WINDOW_OPS", size)
            assert host.launch_stats(tl) == whole
            assert host._launch_stats(tl) == whole


@pytest.mark.parametrize("name", ["exposed_dp", "per_node", "real_cs336", "host_bound", "real_h100"])
def test_eager_launch_stats_by_slices(name, monkeypatch):
    """Kernels with a launch call each, on one thread: the statistics made a slice at a time without the
    whole launch columns are the whole columns' (that path is taken: these traces are eager programs)."""
    _, timelines = load_trace(_path(name))
    taken = 0
    for tl in timelines:
        if len(tl.kernels) < 2:
            continue
        whole = host._launch_stats(tl)
        for size in (1, 2, 7, 1 << 60):
            monkeypatch.setattr(host, "WINDOW_OPS", size)
            eager = host._eager_launch_stats(tl)
            assert eager is None or eager == whole
            taken += eager is not None
    assert taken or name in ("host_bound", "real_h100")  # kernels in start order, not launch order; calls missing


@pytest.mark.parametrize("seed", range(3))
def test_eager_launch_stats_calls_of_several_kernels(seed, monkeypatch):
    """Calls that each start a run of kernels (a graph): their spans, at any slice size, are the whole
    columns' (a slice never splits a call's kernels; a call longer than a slice leaves it to the columns)."""
    _, timelines = load_trace(_path("exposed_dp"))
    tl = next(t for t in timelines if len(t.kernels) > 1)
    start, end, tid = (a.copy() for a in host.kernel_launch_calls(tl))
    for i in np.flatnonzero(np.random.default_rng(seed).random(start.size - 1) < 0.3):
        start[i + 1], end[i + 1] = start[i], end[i]  # the next kernel is launched by the same call
    monkeypatch.setattr(host, "kernel_launch_calls",
                        lambda tl, rows=None: tuple(a if rows is None else a[rows] for a in (start, end, tid)))
    whole = host._launch_stats(tl)
    assert whole.kernel_us is not None
    for size in (1, 2, 3, 7, 50, 1 << 60):
        monkeypatch.setattr(host, "WINDOW_OPS", size)
        eager = host._eager_launch_stats(tl)
        assert eager == whole or (eager is None and size <= 7)
        assert host.launch_stats(tl) == whole


@pytest.mark.parametrize("shape", ["counted", "long", "mixed", "negative", "one", "empty_slices"])
@pytest.mark.parametrize("count", [1, 2, 7, 1000, 1001])
def test_counted_median_is_numpys(shape, count):
    """Integers counted a slice at a time (those from 0 to 1 ms) and kept (the others) give np.median's value,
    for odd and even counts, the middle falling among counted, kept long or negative values."""
    rng = np.random.default_rng(count)
    counted = host._Median.COUNTED
    values = {"counted": rng.integers(0, counted, count), "long": rng.integers(counted, 2**40, count),
              "mixed": rng.choice([3, counted - 1, counted, 2**35], count),
              "negative": rng.integers(-5, 5, count) * (counted // 3), "one": np.full(count, 42),
              "empty_slices": rng.integers(0, 100, count)}[shape].astype(np.int64)
    median = host._Median()
    for part in np.array_split(values, 5):  # some slices empty when the values are fewer
        median.add(part.astype(np.int32) if shape == "counted" else part)
    assert median.size == values.size and median.median() == float(np.median(values))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name", ["host_bound", "real_h100"])
def test_windows_at_any_step_edges(name, seed, monkeypatch):
    """Steps cut anywhere (inside kernels and gaps, some empty, some ending past the next one's start)."""
    rng = np.random.default_rng(seed)
    _, timelines = load_trace(_path(name))
    for tl in timelines:
        kcls = kernel_classes(tl.kernels)
        lo, hi = activity_window(tl)
        starts = np.sort(rng.integers(lo, hi, 12))
        starts[3] = starts[4]  # an empty step
        ends = np.minimum(starts + rng.integers(0, (hi - lo) // 4, 12), hi)
        steps = host.Steps(starts, ends, "periodic")
        busy = activity(tl, kcls, copy_classes(tl.memcpy)).busy
        monkeypatch.setattr(host, "WINDOW_OPS", 1 << 60)
        whole, whole_sums = host.gap_causes(tl, steps, busy), host.host_gaps(tl, steps, busy)
        assert whole.start.size
        for size in (1, 4):
            monkeypatch.setattr(host, "WINDOW_OPS", size)
            assert len(host.window_bounds(steps, busy, size)) > 3
            _same(dataclasses.asdict(host.gap_causes(tl, steps, busy)), dataclasses.asdict(whole))
            _same(dataclasses.asdict(host.host_gaps(tl, steps, busy)), dataclasses.asdict(whole_sums))
