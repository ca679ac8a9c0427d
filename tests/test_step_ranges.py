"""Steps from the ranges a program marks itself (perfdoctor.measure.step_ranges), on hand-built runs in
several naming styles: CS336-style phases, numbered step ranges, Forward + Backward pairs, a framework's
per-iteration range; and runs where no range is an iteration (the detector must decline)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from perfdoctor.measure.step_ranges import framework_steps, repeating_steps
from perfdoctor.measure.steps import find_steps
from perfdoctor.model import Timeline, TraceInfo
from perfdoctor.table import Strings, Table

US = 1_000
MAIN, LOADER = 11, 12


class Program:
    """A host thread that pushes ranges and launches device work; the device runs each op after its
    launch (on one stream, in order)."""

    def __init__(self) -> None:
        self.t = 0
        self.gpu = 0
        self.ranges: list[tuple[str, int, int, int]] = []
        self.ops: dict[str, list[tuple[int, int, int]]] = {"kernels": [], "memcpy": []}
        self.calls: list[tuple[int, int, int, int]] = []

    @contextmanager
    def range(self, name: str, tid: int = MAIN):
        start = self.t
        yield
        self.t += 2 * US
        self.ranges.append((name, start, self.t, tid))

    def launch(self, dur: int, kind: str = "kernels", n: int = 1) -> None:
        for _ in range(n):
            corr = len(self.calls) + 1
            self.calls.append((self.t, self.t + 5 * US, MAIN, corr))
            self.t += 6 * US
            begin = max(self.gpu, self.t)
            self.gpu = begin + dur
            self.ops[kind].append((begin, self.gpu, corr))

    def host(self, ns: int) -> None:
        self.t += ns

    def sync(self) -> None:
        self.t = max(self.t, self.gpu)

    def timeline(self) -> Timeline:
        def table(rows: list[tuple[int, int, int]], **extra) -> Table:
            arr = np.array(rows, dtype=np.int64).reshape(-1, 3)
            return Table({"start": arr[:, 0], "end": arr[:, 1], "correlation_id": arr[:, 2],
                          "stream": np.full(len(rows), 7, np.int64), **{k: v(len(rows)) for k, v in extra.items()}})

        names = Strings.encode(["sm90_xmma_gemm_bf16"] * len(self.ops["kernels"]))
        kernels = table(self.ops["kernels"])
        kernels["short_name"], kernels["demangled_name"] = names, names
        memcpy = table(self.ops["memcpy"], bytes=lambda n: np.full(n, 1 << 20, np.int64),
                       copy_kind=lambda n: np.ones(n, np.int64))
        calls = np.array(self.calls, dtype=np.int64).reshape(-1, 4)
        api = Table({"start": calls[:, 0], "end": calls[:, 1], "tid": calls[:, 2], "correlation_id": calls[:, 3],
                     "name": Strings.encode(["cudaLaunchKernel"] * len(self.calls))})
        rs = sorted(self.ranges, key=lambda r: r[1])
        nvtx = Table({"start": np.array([r[1] for r in rs], np.int64), "end": np.array([r[2] for r in rs], np.int64),
                      "event_type": np.full(len(rs), 59, np.int64), "tid": np.array([r[3] for r in rs], np.int64),
                      "end_tid": np.array([r[3] for r in rs], np.int64), "domain": np.full(len(rs), None, object),
                      "text": np.array([r[0] for r in rs], object)})
        trace = TraceInfo(Path("x.sqlite"), "nsys-sqlite", None, None, "META_DATA_EXPORT", None, True)
        empty = Table()
        return Timeline(trace, 1, 1, 0, kernels, memcpy, empty, empty, api, nvtx)


def _iteration(p: Program, style: str, i: int, work: int = 40) -> None:
    """One training iteration in a naming style; ``work`` kernels of 100 µs forward, twice that backward."""
    if style == "forward_backward":
        with p.range("Forward"):
            p.launch(100 * US, n=work)
        with p.range("Backward"):
            p.launch(100 * US, n=2 * work)
        p.launch(50 * US, n=4)  # optimizer, outside both ranges
        p.sync()
        return
    name = {"train_step": "train_step", "numbered": f"step_{i}", "cs336": "iteration"}[style]
    with p.range(name):
        with p.range("forward"):
            p.launch(100 * US, n=work)
        with p.range("backward"):
            p.launch(100 * US, n=2 * work)
        with p.range("optimizer_step"):
            p.launch(50 * US, n=4)
        p.sync()


def _run(style: str, steps: int = 6, warmup: int = 2, phases: bool = True) -> Program:
    p = Program()
    if phases:
        with p.range("init_model"):
            p.host(200 * US)
            p.launch(30_000 * US, "memcpy", n=10)  # weights: 300 ms of HtoD copies
            p.sync()
        with p.range("warmup"):
            for i in range(warmup):
                _iteration(p, style, i)
    with p.range("benchmark_loop") if phases else _nothing():
        for i in range(steps):
            p.host(300 * US)  # Python between iterations
            _iteration(p, style, i)
    return p


@contextmanager
def _nothing():
    yield


@pytest.mark.parametrize("style,label", [("cs336", "iteration"), ("train_step", "train_step"),
                                         ("numbered", "step_#"), ("forward_backward", "Forward")])
def test_iterations_inside_benchmark_loop(style: str, label: str) -> None:
    p = _run(style)
    tl = p.timeline()
    found = repeating_steps(tl)
    assert found is not None and found.label == label
    assert len(found.starts) == 6
    assert found.excluded == ("init_model", "warmup")
    # every step starts after the warm-up ended, and the weight upload lies before all of them
    warm_end = next(e for n, _, e, _ in p.ranges if n == "warmup")
    assert found.starts[0] >= warm_end
    upload_end = max(e for *_, e in [(s, e) for s, e, _ in p.ops["memcpy"]])
    assert upload_end <= found.starts[0]
    steps = find_steps(tl, (0, p.gpu), Table({"category": np.full(len(tl.kernels), 0)}))
    assert steps.source == "repeating-range" and steps.excluded == ("init_model", "warmup")
    period = np.diff(found.starts)
    assert period.max() <= 1.05 * period.min()


@pytest.mark.parametrize("style", ["train_step", "numbered", "forward_backward"])
def test_top_level_iterations_without_phases(style: str) -> None:
    found = repeating_steps(_run(style, steps=5, phases=False).timeline())
    assert found is not None and len(found.starts) == 5 and found.excluded == ()


def test_last_step_ends_with_its_last_range() -> None:
    """Forward + Backward: the last step has no next Forward; it ends where its Backward ends."""
    p = _run("forward_backward", steps=4, phases=False)
    found = repeating_steps(p.timeline())
    last_backward = max(e for n, _, e, _ in p.ranges if n == "Backward")
    assert found.ends[-1] == last_backward


def test_warmup_holding_most_work_is_still_left_out() -> None:
    p = _run("train_step", steps=3, warmup=8)
    found = repeating_steps(p.timeline())
    assert found is not None and len(found.starts) == 3 and "warmup" in found.excluded


def test_ranges_of_another_thread_do_not_define_steps() -> None:
    """A data-loader thread's repeating ranges: not the launching thread, no steps from them."""
    p = Program()
    for _ in range(6):
        with p.range("prefetch_batch", tid=LOADER):
            p.host(1_000 * US)
        p.launch(100 * US, n=30)
    assert repeating_steps(p.timeline()) is None


def test_irregular_repeats_are_not_steps() -> None:
    """A range repeated at irregular times (a checkpoint now and then) is not an iteration."""
    p = Program()
    for gap in (1, 9, 2, 30):
        p.launch(100 * US, n=10 * gap)
        with p.range("save_checkpoint"):
            p.host(500 * US)
    assert repeating_steps(p.timeline()) is None


def test_repeats_holding_little_work_are_not_steps() -> None:
    """A stable repeating range that holds a small part of the device work, with most of it after
    the last repeat: not the run's iterations."""
    p = Program()
    for _ in range(3):
        with p.range("log_metrics"):
            p.launch(100 * US, n=2)
        p.host(100 * US)
    p.launch(100 * US, n=400)
    assert repeating_steps(p.timeline()) is None


def test_framework_step_ranges() -> None:
    p = Program()
    for i in range(4):
        with p.range(f"megatron.bridge.training.train.train.training_step_{i + 10}"):
            p.launch(100 * US, n=20)
            p.sync()
    tl = p.timeline()
    found = framework_steps(tl.nvtx)
    assert found is not None and len(found.starts) == 4
    assert found.label.endswith("training_step_#")
    assert find_steps(tl, (0, p.gpu), Table({"category": np.full(len(tl.kernels), 0)})).source == "framework-step"


@pytest.mark.parametrize("domain", ["NCCL", "perfdoctor"])
def test_ranges_of_a_library_domain_are_not_the_programs_iterations(domain: str) -> None:
    """The same iterations, their ranges in NCCL's or perfdoctor's own domain: no steps from them; in
    another domain (or none) they are the program's."""
    tl = _run("train_step").timeline()
    assert repeating_steps(tl) is not None
    for value, found in ((domain, False), ("my_app", True), (None, True)):
        tl.nvtx["domain"] = np.full(len(tl.nvtx), value, object)
        assert (repeating_steps(tl) is not None) is found, value
