"""The critical path walked a window of whole steps at a time (blame/window.py) is the whole graph's: same
causes per step, residuals, comm segments, focus, representative path and what-ifs. Windows are forced
small (WINDOW_OPS) so a trace is walked in one window per step; each part of the margin is needed (a window
without it walks other paths on some trace)."""

from __future__ import annotations

import numpy as np
import pytest

from perfdoctor.blame import path, window
from perfdoctor.blame.focus import kernel_marks, marks
from perfdoctor.blame.graph import Ops, OpSource, device_ops, edges
from perfdoctor.classify.groups import label_groups
from perfdoctor.classify.timeline import copy_classes, kernel_classes
from perfdoctor.load.run import load_trace
from perfdoctor.measure.breakdown import activity_window
from perfdoctor.measure.steps import Steps, find_steps
from tests.paths import REAL_H100, SAMPLES
from tests.test_blame_lift import _same

# cross-stream waits recorded by nsys (cp, ep, pp), copies beside kernels (prefetch), blocked norms, host-bound
# and GC-paused hosts, and the real 2xH100 export
TRACES = [SAMPLES / "exposed_cp" / "exposed_cp.rank0.sqlite", SAMPLES / "moe_ep" / "moe_ep.rank0.sqlite",
          SAMPLES / "pp_1f1b" / "pp_1f1b.rank2.sqlite", SAMPLES / "prefetch_overlap" / "prefetch_overlap.rank0.sqlite",
          SAMPLES / "ln_blocked" / "ln_blocked.rank0.sqlite", SAMPLES / "host_bound" / "host_bound.rank0.sqlite",
          SAMPLES / "gc_jitter" / "gc_jitter.rank0.sqlite", REAL_H100]


def _inputs(trace):
    _, timelines = load_trace(trace, detail=False)
    tl = next(t for t in timelines if t.device_id is not None and len(t.kernels))
    kcls, ccls = kernel_classes(tl.kernels), copy_classes(tl.memcpy)
    groups = label_groups(tl, kcls, {})
    return tl, kcls, ccls, groups, find_steps(tl, activity_window(tl), kcls)


def _step_sets(steps: Steps) -> list[Steps]:
    """The trace's own steps, 4x shorter ones back to back (more chains cross a step start), and those
    overlapping by 5 % (a CPU range's start and the device's end)."""
    cuts = np.linspace(steps.starts[0], steps.ends[-1], 4 * len(steps) + 1).astype(np.int64)
    lap = (np.diff(cuts) // 20)[:-1]
    return [steps, Steps(cuts[:-1], cuts[1:], "window"),
            Steps(cuts[:-1] - np.concatenate(([0], lap)), cuts[1:], "window")]


def _whole(tl, kcls, ccls, groups, steps) -> path.RankPath:
    ops = device_ops(tl, kcls, ccls, groups)
    return path.rank_path(tl, ops, edges(ops, tl.sync), steps, np.flatnonzero(groups.codes >= 0),
                          marks(tl, kcls, steps, ops))


def _windowed(tl, kcls, ccls, groups, steps) -> path.RankPath:
    return window.windowed_path(tl, OpSource(tl, kcls, ccls, groups), steps, np.flatnonzero(groups.codes >= 0),
                                lambda: kernel_marks(tl, kcls, steps))


@pytest.fixture(scope="module")
def cases():
    out = []
    for trace in TRACES:
        tl, kcls, ccls, groups, steps = _inputs(trace)
        for s in _step_sets(steps):
            out.append((trace.name, (tl, kcls, ccls, groups, s), _whole(tl, kcls, ccls, groups, s)))
    return out


@pytest.mark.parametrize("size", [1, 2000])
def test_windows_of_steps_walk_the_whole_graphs_paths(cases, size, monkeypatch):
    monkeypatch.setattr(window, "WINDOW_OPS", size)
    for name, args, whole in cases:
        _same(_windowed(*args), whole)
        if size == 1:  # one window per step
            assert len(window.windows(args[4], OpSource(*args[:4]))) == len(args[4]), name


def test_the_default_window_walks_the_whole_graphs_paths(cases):
    for _, args, whole in cases[:3]:
        _same(_windowed(*args), whole)


def _described(ops, e, rows) -> np.ndarray:
    """Per op in ``rows``: its binding edge (kind, ready, inferred) and its binding, stream, event and
    stream-wait sources as ops (their columns, not their index)."""
    key = [e.kind[rows], e.ready[rows], e.inferred[rows]]
    for src in (e.src[rows], e.stream_src[rows], e.event_src[rows], e.wait_src[rows]):
        key += [np.where(src >= 0, col[np.maximum(src, 0)], -1) for col in (ops.start, ops.end, ops.stream,
                                                                             ops.kernel)]
    return np.stack([np.asarray(k, dtype=np.int64) for k in key])


def _core_edges_differ(whole_ops, sync, windows) -> bool:
    """Whether some op that starts in a window (its core: from ``lo`` on) has other edges than in the whole
    graph; ``windows``: (lo, the window's ops)."""
    whole = edges(whole_ops, sync)
    for lo, ops in windows:
        core = np.flatnonzero(ops.start >= lo)
        first = int(np.searchsorted(whole_ops.start, lo, side="left"))
        if not np.array_equal(_described(ops, edges(ops, sync), core),
                              _described(whole_ops, whole, np.arange(first, first + core.size))):
            return True
    return False


def _graphs(source, steps, rep=-1):
    """(lo, ops) of each window, and of each part of a step larger than a window."""
    for _, _, lo, _, ops in window.window_ops(source, steps, rep):
        if isinstance(ops, window.Parts):
            for j, cut in enumerate(ops.cuts.tolist()):
                yield cut, ops.part(j)[0]
        else:
            yield lo, ops


def _trace_edges_differ(args) -> bool:
    tl, kcls, ccls, groups, steps = args
    return _core_edges_differ(device_ops(tl, kcls, ccls, groups), tl.sync,
                              _graphs(OpSource(tl, kcls, ccls, groups), steps))


def test_a_windows_core_ops_have_the_whole_graphs_edges(cases, monkeypatch):
    monkeypatch.setattr(window, "WINDOW_OPS", 1)
    for name, args, _ in cases:
        assert not _trace_edges_differ(args), name


def _overlapping_on_a_stream() -> tuple[Ops, int]:
    """Stream 1: a long op [0, 100) and a short one [10, 20) beside it (ops of one stream that overlap: no
    trace we read has them, nothing forbids them); stream 2: an op at 100 that waited for the long one.
    A window starting at 50: the long op is running, but neither its stream's last op nor one that ended."""
    cols = dict(start=[0, 10, 100], end=[100, 20, 110], stream=[1, 1, 2], cause=[0, 0, 0], kernel=[0, 1, 2],
                launch=[-1, -1, 5], tid=[7, 7, 7])
    return Ops(**{k: np.array(v, dtype=np.int16 if k == "cause" else np.int64) for k, v in cols.items()}), 50


def _without(part: str):
    def margin(ops, t):
        n, parts = window._margin_parts(ops, t)
        keep = np.zeros(n, dtype=bool)
        for name, rows in parts.items():
            keep[rows] |= name != part
        return np.flatnonzero(keep)
    return margin


@pytest.mark.parametrize("part", ["stream", "running", "ended"])
def test_each_part_of_the_margin_is_needed(cases, part, monkeypatch):
    """Without one part of the margin (the last op of each stream, the ops still running at the window's
    start, the ones that ended last before it), a window's core ops get other edges: the tests above fail.
    The ops running at a window's start are the last of their stream in every trace here; an op running
    beside a later one of its stream needs them."""
    monkeypatch.setattr(window, "WINDOW_OPS", 1)
    ops, lo = _overlapping_on_a_stream()
    first = int(np.searchsorted(ops.start, lo))
    after = ops.take(slice(first, None))
    no_sync = {}
    assert not _core_edges_differ(ops, no_sync, [(lo, after.after(ops.take(window._margin(ops, lo))))])
    monkeypatch.setattr(window, "_margin", _without(part))
    assert (any(_trace_edges_differ(args) for _, args, _ in cases)
            or _core_edges_differ(ops, no_sync, [(lo, after.after(ops.take(window._margin(ops, lo))))]))


@pytest.mark.parametrize("trace", [TRACES[5], TRACES[6], REAL_H100], ids=lambda p: p.name)
def test_window_calls_are_the_whole_threads_calls_inside_the_window(trace, monkeypatch):
    """The calls merged a window at a time (blame/calls.py): the same quiet threshold per thread (medians
    taken a slice at a time: slices of 7 calls here) and, inside each window, the same merged intervals."""
    from perfdoctor.blame import calls as window_calls
    from perfdoctor.blame.causes import HostRanges

    monkeypatch.setattr(window_calls, "SLICE", 7)
    tl, _, _, _, steps = _inputs(trace)
    whole = HostRanges(tl)
    calls = window_calls.WindowCalls(tl)
    assert calls.in_order or trace == REAL_H100  # (its calls are not in start order: merged whole)
    assert HostRanges(tl, calls).quiet == whole.quiet
    for s in _step_sets(steps)[1:2]:
        calls = window_calls.WindowCalls(tl)
        for lo, hi in zip(s.starts.tolist(), s.ends.tolist()):
            mine = calls.window(lo, hi)
            assert mine.keys() == whole.calls.keys()
            for tid, (a, b) in whole.calls.items():
                inside = (b >= lo) & (a <= hi)  # the merged calls that reach into the window
                m = mine[tid]
                mine_inside = (m[1] >= lo) & (m[0] <= hi)
                assert np.array_equal(np.maximum(m[0][mine_inside], lo), np.maximum(a[inside], lo))
                assert np.array_equal(np.minimum(m[1][mine_inside], hi), np.minimum(b[inside], hi))


@pytest.mark.parametrize("ids", [[7, 20, 7, 7, 3, 20], [7, 1 << 40, 7, -5, 1 << 40, 9]])
def test_last_of_each_stream(ids):
    """Small ids in one pass, wide ones by a sort: the same last positions."""
    values = np.array(ids, dtype=np.int64)
    expected = sorted(max(i for i, v in enumerate(ids) if v == u) for u in set(ids))
    assert sorted(window._last_of_each(values).tolist()) == expected


# A step larger than a window (a capture without step markers is one step: the activity window) is walked a
# part at a time (window.Parts). The representative step is cut only when it is not replayed (the replay
# reads its whole graph): these cases replay nothing (REPLAY_MAX_OPS 0, for the whole graph's walk too).
@pytest.fixture(scope="module")
def one_step():
    out = []
    with pytest.MonkeyPatch.context() as m:
        m.setattr(path, "REPLAY_MAX_OPS", 0)
        for trace in TRACES:
            tl, kcls, ccls, groups, steps = _inputs(trace)
            lo, hi = activity_window(tl)
            for s in (Steps(np.array([lo]), np.array([hi]), "window"), _step_sets(steps)[1]):
                out.append((trace.name, (tl, kcls, ccls, groups, s), _whole(tl, kcls, ccls, groups, s)))
    return out


def _parts(args, rep=-1) -> list[window.Parts]:
    tl, kcls, ccls, groups, steps = args
    return [ops for *_, ops in window.window_ops(OpSource(tl, kcls, ccls, groups), steps, rep)
            if isinstance(ops, window.Parts)]


@pytest.mark.parametrize("size", [1, 7, 64])
def test_a_step_walked_a_part_at_a_time_walks_the_whole_graphs_path(one_step, size, monkeypatch):
    """Parts of 1, 7 and 64 ops: one step (no step markers) and 4x shorter steps, each cut into parts."""
    monkeypatch.setattr(window, "WINDOW_OPS", size)
    monkeypatch.setattr(path, "REPLAY_MAX_OPS", 0)
    for name, args, whole in one_step:
        parts = _parts(args)
        assert any(p.cuts.size > 1 for p in parts), name
        _same(_windowed(*args), whole)
        assert not _trace_edges_differ(args), name


def test_a_replayed_representative_step_is_not_cut(one_step, monkeypatch):
    """The one step replayed (few ops) is walked on its whole graph; the same what-ifs."""
    monkeypatch.setattr(window, "WINDOW_OPS", 7)
    for name, (tl, kcls, ccls, groups, s), _ in one_step[:2]:
        if len(s) == 1:
            assert not _parts((tl, kcls, ccls, groups, s), rep=0), name
            whole = _whole(tl, kcls, ccls, groups, s)
            assert whole.saving, name
            _same(_windowed(tl, kcls, ccls, groups, s), whole)


def _dropped(what: str, monkeypatch) -> None:
    """Drop one piece of what a walk carries from a part to the part before it."""
    if what == "margin":  # the parts' margins: a part's ops get other edges
        monkeypatch.setattr(window, "_margin", lambda ops, t: np.zeros(0, dtype=np.intp))
        return
    if what == "stop":  # the walk does not stop at a margin op: it goes on along the margin's own edges
        walker = window._Walker
        monkeypatch.setattr(window, "_Walker", lambda *a, margin=0, cut=None: walker(*a, margin=0, cut=cut))
        return
    run = path._Walker.run

    def forgetting(self, w):  # the walk taken up again in a part before: its sums or segments lost
        if self.cut > window.LOWEST and w.seg._settled:
            if what == "sums":
                w.residual, w.after_sync = 0, 0
            else:
                w.seg._settled.clear()
                w.seg._chunks.clear()
        run(self, w)
    monkeypatch.setattr(path._Walker, "run", forgetting)


@pytest.mark.parametrize("what", ["margin", "stop", "sums", "segments"])
def test_what_a_walk_carries_between_parts_is_needed(one_step, what, monkeypatch):
    monkeypatch.setattr(window, "WINDOW_OPS", 7)
    monkeypatch.setattr(path, "REPLAY_MAX_OPS", 0)
    _dropped(what, monkeypatch)
    differ = 0
    for _, args, whole in one_step:
        try:
            _same(_windowed(*args), whole)
        except AssertionError:
            differ += 1
    assert differ


@pytest.mark.parametrize("trace", [TRACES[5], TRACES[6]], ids=lambda p: p.name)
def test_a_parts_calls_find_the_steps_next_call(trace, monkeypatch):
    """A part's walk of a one-thread host merges only the part's calls (blame/window.py Parts._hosts): after
    any time in the part, the thread's next merged call is the step's, found in the part or, past its
    end, in the parts after it (``later``; without it the host work after a blocking call that returned in
    one part and called again in a later one would be cut short)."""
    from perfdoctor.blame.calls import WindowCalls
    from perfdoctor.blame.causes import HostRanges

    monkeypatch.setattr(window, "WINDOW_OPS", 7)
    tl, kcls, ccls, groups, _ = _inputs(trace)
    lo, hi = activity_window(tl)
    (parts,) = _parts((tl, kcls, ccls, groups, Steps(np.array([lo]), np.array([hi]), "window")))
    hosts = parts._hosts(path.HostSide(tl, OpSource(tl, kcls, ccls, groups).threads(), WindowCalls(tl)))
    ((tid, (starts, _)),) = HostRanges(tl).calls.items()
    beyond = 0
    for j, (a, b) in enumerate(zip(parts.cuts.tolist(), [*parts.cuts[1:].tolist(), hi])):
        side = hosts(j)
        mine = side.ranges.calls[tid][0]
        for c1 in np.unique(np.linspace(a, b - 1, 5).astype(np.int64)).tolist():
            k = int(np.searchsorted(starts, c1, side="right"))
            expected = int(starts[k]) if k < starts.size else None
            at = int(np.searchsorted(mine, c1, side="right"))
            found = int(mine[at]) if at < mine.size else side.later(tid, c1, hi)
            assert found == expected, (j, c1)
            beyond += at == mine.size and expected is not None
    assert beyond  # some next calls lie in a later part


def test_latest_is_the_stable_sorts_last():
    """window._latest: the k largest as the last k of a stable argsort, ties to the later, a tail or not."""
    rng = np.random.default_rng(5)
    for trial in range(400):
        n = int(rng.integers(0, 3 * window.LATEST_TAIL))
        values = rng.integers(0, int(rng.integers(1, 50_000)), n)
        if trial % 3 == 0:
            values = np.sort(values)  # ends nearly sorted, as a margin's are
        if trial % 5 == 0 and n:
            values[rng.integers(0, n)] = 10**12  # one early op ending last
        for k in (1, 3):
            assert window._latest(values, k).tolist() == np.argsort(values, kind="stable")[-k:].tolist()
