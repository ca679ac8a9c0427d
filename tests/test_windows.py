"""A device measured a window of whole steps at a time (perfdoctor.measure.windows) gives the report one pass
over the whole timeline gives: windows are forced to one step each (WINDOW_KERNELS = 1) and everything a rank
sends back (metrics, evidence, device summary, step series, excerpts, collective instances) is compared
with the default, on repository traces and with steps shorter than the trace's own and overlapping, so that
kernels, copies and calls run across window boundaries. Each part of a window's rows is needed: without it,
some trace's report changes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from perfdoctor import api
from perfdoctor.classify.timeline import kernel_classes
from perfdoctor.load.run import load_trace
from perfdoctor.measure import windows
from perfdoctor.measure.breakdown import activity_window
from perfdoctor.measure.steps import Steps, find_steps
from perfdoctor.render.json import report_dict
from tests.paths import DATA, REAL_H100, SAMPLES

# several steps each: host gaps of every cause, pipeline bubbles (pp run), blocked norms, copies beside
# kernels, EP all-to-all, several devices of a per-node export, a real export (nsys 2022) and a Kineto trace
RUNS = [SAMPLES / name for name in ("pp_1f1b", "gc_jitter", "data_stall", "host_bound", "ln_blocked",
                                    "prefetch_overlap", "moe_ep", "per_node", "real_cs336")] \
    + [DATA / "h100" / "gpt_eager.json.gz"]
# timelines whose steps are cut 4x shorter (and overlapping): ops cross window boundaries
TIMELINES = [REAL_H100, SAMPLES / "exposed_cp" / "exposed_cp.rank0.sqlite",
             SAMPLES / "prefetch_overlap" / "prefetch_overlap.rank0.sqlite",
             SAMPLES / "gc_jitter" / "gc_jitter.rank0.sqlite"]


def _report(run: Path) -> str:
    report = api.analyze([run], jobs=1, trace_excerpts=True)
    return json.dumps([report_dict(report), _plain(report.run_trace)], sort_keys=True, default=str)


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_a_window_per_step_gives_the_same_report(run, monkeypatch):
    whole = _report(run)
    monkeypatch.setattr(windows, "WINDOW_KERNELS", 1)
    assert _report(run) == whole


def _step_sets(steps: Steps) -> list[Steps]:
    """The trace's own steps, 4x shorter ones back to back, and those overlapping by 5 %."""
    cuts = np.linspace(steps.starts[0], steps.ends[-1], 4 * len(steps) + 1).astype(np.int64)
    lap = np.concatenate(([0], (np.diff(cuts) // 20)[:-1]))
    return [steps, Steps(cuts[:-1], cuts[1:], "window"), Steps(cuts[:-1] - lap, cuts[1:], "window")]


def _plain(value):
    """A rank's result as comparable plain data (arrays as lists, dataclasses as dicts)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, float) and np.isnan(value):
        return "nan"
    return value


def _without_blame(fn, *args):
    """api.beside without the critical path (blame/window.py has its own tests); the rest computed when asked."""
    return SimpleNamespace(result=lambda: None if fn is api.blame else fn(*args))


def _results(trace: Path) -> list[list]:
    """Per step set, each device timeline's analysis (without its critical path: blame/window.py has its
    own tests) as plain data."""
    _, timelines = load_trace(trace, detail=False)
    out = []
    for tl in (t for t in timelines if t.device_id is not None and len(t.kernels)):
        for steps in _step_sets(find_steps(tl, activity_window(tl), kernel_classes(tl.kernels))):
            with pytest.MonkeyPatch.context() as m:
                m.setattr(api, "find_steps", lambda *_, s=steps: s)
                m.setattr(api, "beside", _without_blame)
                result = api.analyze_timeline(tl, {}, True, True)
            out.append(_plain({"metrics": result.metrics, "series": result.series, "device": result.device,
                               "excerpt": result.excerpt, "trace": result.trace_excerpt,
                               "collectives": result.collectives}))
    return out


@pytest.fixture(scope="module")
def wholes():
    return {trace: _results(trace) for trace in TIMELINES}


KINETO = DATA / "h100" / "gpt_eager.json.gz"  # device ops start after a step's last gap (not so in the above)


@pytest.fixture(scope="module")
def kineto_whole():
    return _report(KINETO)


@pytest.mark.parametrize("size", [1, 3000])
def test_windows_of_shorter_and_overlapping_steps_measure_what_the_whole_does(wholes, size, monkeypatch):
    monkeypatch.setattr(windows, "WINDOW_KERNELS", size)
    for trace, whole in wholes.items():
        windowed = _results(trace)
        for a, b in zip(windowed, whole):
            assert a == b, trace.name


def test_windows_cut_the_steps_and_own_the_time_once():
    tl = next(t for t in load_trace(REAL_H100, detail=False)[1] if t.device_id == 1)
    cuts = np.linspace(int(tl.kernels.col("start")[0]), int(tl.kernels.col("end").max()), 9).astype(np.int64)
    steps = Steps(cuts[:-1], cuts[1:], "window")
    cut = list(windows.windows(tl, steps, size=1))
    assert [w.first for w in cut] == list(range(len(cut))) and sum(len(w.steps) for w in cut) == len(steps)
    owns = [w.owns for w in cut]
    assert owns[0][0] == -windows.NEVER and owns[-1][1] == windows.NEVER
    assert all(a[1] == b[0] for a, b in zip(owns, owns[1:]))  # the owned times touch, never overlap
    start, end = tl.kernels.col("start"), tl.kernels.col("end")
    runs = 0
    for w in cut:  # every kernel reaching into the window's steps is among its rows
        lo, hi = int(w.steps.starts[0]), int(w.steps.ends.max())
        assert set(np.flatnonzero((end > lo) & (start < hi))) <= set(np.arange(len(start))[w.kernels].tolist())
        assert np.array_equal(w.tl.kernels.col("start"), start[w.kernels])
        # rows that are one run are a slice: the window's columns are views of the timeline's, not copies
        runs += isinstance(w.kernels, slice)
        assert isinstance(w.kernels, slice) == np.shares_memory(w.tl.kernels.col("start"), start)
    assert runs  # no kernel crosses some of the cuts
    assert len(list(windows.windows(tl, steps))) == 1  # by default: one window, the timeline itself


def test_rows_that_are_one_run_are_a_slice():
    assert windows._run(np.array([4, 5, 6, 7])) == slice(4, 8)
    for rows in ([4, 6, 7], [], [3, 4, 6]):
        assert isinstance(windows._run(np.array(rows, dtype=np.int64)), np.ndarray)
    assert windows._positions(slice(2, 5)).tolist() == [2, 3, 4]


@pytest.mark.parametrize("part", ["still_open", "first_after", "launch_calls", "next_start"])
def test_each_part_of_a_windows_rows_is_needed(wholes, kineto_whole, part, monkeypatch):
    """Without a part of a window's rows, the windowed analysis of some trace differs from the whole's (the
    comparison above would catch a window built without it)."""
    rows, results = windows._rows, []
    if part == "still_open":
        monkeypatch.setattr(windows, "_rows", lambda t, s, lo, hi, still_open, after=True: rows(t, s, lo, hi, None,
                                                                                               after))
    elif part == "first_after":
        monkeypatch.setattr(windows, "_rows", lambda t, s, lo, hi, still_open, after=True: rows(t, s, lo, hi,
                                                                                               still_open, False))
    elif part == "launch_calls":
        monkeypatch.setattr(windows, "rows_of", lambda api_table, corr: np.zeros(0, dtype=np.int64))
    else:
        real = windows.windows

        def without_next(*args, **kwargs):
            for w in real(*args, **kwargs):
                yield dataclasses.replace(w, next_start=int(w.steps.ends[-1]))
        monkeypatch.setattr(api, "windows", without_next)
    monkeypatch.setattr(windows, "WINDOW_KERNELS", 1)
    for trace, whole in wholes.items():
        results.append(_results(trace) == whole)
    results.append(_report(KINETO) == kineto_whole)
    assert not all(results)


def test_a_windows_calls_are_looked_up_in_a_table_of_their_own_span():
    """A window's CUDA calls are numbered millions in: their correlation-id table spans their ids only, and
    ids outside it (before, after, 0, negative) find no call."""
    from perfdoctor.classify.projection import _lookup_table, calls_of
    from perfdoctor.table import Table

    corr = np.array([5_000_003, 5_000_001, 5_000_002, 5_000_007], dtype=np.int32)
    api = Table({"start": np.arange(4, dtype=np.int64) * 10, "end": np.arange(4, dtype=np.int64) * 10 + 5,
                 "tid": np.full(4, 7, dtype=np.int64), "correlation_id": corr})
    table, base = _lookup_table(api)
    assert table.size == 8 and base == 5_000_000
    start, _, tid = calls_of(np.array([5_000_007, 5_000_001, 5_000_000, 5_000_008, 0, -3, 4]), api)
    assert start.tolist() == [30, 10, -1, -1, -1, -1, -1] and tid.tolist() == [7, 7, -1, -1, -1, -1, -1]
    start, _, _ = calls_of(np.array([5_000_002, 5_000_003]), api)  # all found: the gather alone
    assert start.tolist() == [20, 0]


def test_calls_and_copies_out_of_order_are_windowed_as_well(monkeypatch):
    """CUDA calls and copies that do not come sorted by start (another exporter's order) are found per window
    through their sorted starts: the same analysis as one window."""
    tl = next(t for t in load_trace(SAMPLES / "prefetch_overlap" / "prefetch_overlap.rank0.sqlite",
                                    detail=False)[1] if t.device_id is not None)
    rng = np.random.default_rng(0)
    tl = dataclasses.replace(tl, api=tl.api.take(rng.permutation(len(tl.api))),
                             memcpy=tl.memcpy.take(rng.permutation(len(tl.memcpy))))
    assert len(tl.memcpy) > 1
    steps = _step_sets(find_steps(tl, activity_window(tl), kernel_classes(tl.kernels)))[2]

    def analysed():
        with pytest.MonkeyPatch.context() as m:
            m.setattr(api, "find_steps", lambda *_: steps)
            m.setattr(api, "beside", _without_blame)
            r = api.analyze_timeline(tl, {}, True, True)
        return _plain({"metrics": r.metrics, "series": r.series, "device": r.device, "excerpt": r.excerpt,
                       "collectives": r.collectives})

    whole = analysed()
    monkeypatch.setattr(windows, "WINDOW_KERNELS", 1)
    assert len(list(windows.windows(tl, steps))) == len(steps)
    assert analysed() == whole
