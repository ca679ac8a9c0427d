"""perfdoctor on its own real H100 captures (tests/data/h100/README.md): a GPT decoder training loop
profiled eagerly, as one CUDA graph per step and under torch.compile(mode="reduce-overhead"), and a CUDA
memory snapshot of the same model.

Every expected value is read from the files themselves with the standard library, never from
perfdoctor: the GPU from ``deviceProperties``; steps from the ``ProfilerStep#N`` ranges; busy time as
the union of the GPU intervals inside each step; a kernel's true family from the PyTorch operator that
launched it (Kineto links each kernel to its launch by correlation id, and the launch lies inside the
``aten::mm`` / SDPA / layer-norm ``cpu_op`` that issued it); memory peaks by replaying the snapshot's
history backwards from the dump-time state.
"""

from __future__ import annotations

import gzip
import json
import pickle
import statistics
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from perfdoctor.classify.kernels import classify_kernel, short_kernel_name
from perfdoctor.load.kineto import load_kineto
from tests.paths import REPO

DATA = REPO / "tests" / "data" / "h100"
EAGER = DATA / "gpt_eager.json.gz"
GRAPH = DATA / "gpt_cudagraph.json.gz"
COMPILED = DATA / "gpt_compiled.json.gz"
TRACES = [("eager", EAGER), ("graph", GRAPH), ("compiled", COMPILED)]
SNAPSHOT = DATA / "gpt_memory.pickle"
DEVICE_CATEGORIES = ("kernel", "gpu_memset", "gpu_memcpy")
# The operators whose kernels are, by what they compute, one family (cpu_op names in the trace).
FAMILY_OF_OP = {"aten::mm": "gemm", "aten::scaled_dot_product_attention": "attention",
                "aten::_scaled_dot_product_cudnn_attention_backward": "attention",
                "aten::native_layer_norm": "norm", "aten::native_layer_norm_backward": "norm"}


def _perfdoctor(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "perfdoctor", *args, "--format", "json"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def eager() -> dict:
    return _perfdoctor("analyze", str(EAGER))


@pytest.fixture(scope="module")
def graph() -> dict:
    return _perfdoctor("analyze", str(GRAPH))


@pytest.fixture(scope="module")
def compiled() -> dict:
    return _perfdoctor("analyze", str(COMPILED))


def _trace(path: Path) -> dict:
    return json.load(gzip.open(path))


def _steps(events: list[dict]) -> list[tuple[float, float]]:
    """The host-side ProfilerStep#N ranges, in µs."""
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _covered(union: list[tuple[float, float]], lo: float, hi: float) -> float:
    return sum(max(0.0, min(hi, b) - max(lo, a)) for a, b in union)


def _share(events: list[dict], keep) -> float:
    """Median over steps of the union of the kept GPU events inside the step ÷ the step's duration."""
    union = _union([(e["ts"], e["ts"] + e["dur"]) for e in events if keep(e)])
    return statistics.median(_covered(union, a, b) / (b - a) for a, b in _steps(events))


def _busy(events: list[dict]) -> float:
    return _share(events, lambda e: e.get("cat") in DEVICE_CATEGORIES)


def _launching_ops(events: list[dict]) -> dict[int, list[str]]:
    """Kernel correlation id → names of the cpu_ops enclosing its launch call (outermost first): one sweep
    per host thread with a stack of open operators."""
    by_tid: dict[object, list[tuple[float, int, float, str, int]]] = defaultdict(list)
    for e in events:
        if e.get("ph") != "X":
            continue
        if e.get("cat") == "cpu_op":
            by_tid[e["tid"]].append((e["ts"], 0, -e["dur"], e["name"], -1))
        elif e.get("cat") in ("cuda_runtime", "cuda_driver"):
            by_tid[e["tid"]].append((e["ts"], 1, -e["dur"], e["name"], e["args"].get("correlation", -1)))
    out: dict[int, list[str]] = {}
    for rows in by_tid.values():
        stack: list[tuple[float, str]] = []
        for ts, is_launch, neg_dur, name, corr in sorted(rows):
            while stack and stack[-1][0] < ts:
                stack.pop()
            if is_launch:
                out[corr] = [n for _, n in stack]
            else:
                stack.append((ts - neg_dur, name))
    return out


def _true_families(events: list[dict]) -> dict[str, Counter]:
    """Kernel names per family, by the operator that launched them (FAMILY_OF_OP)."""
    ops = _launching_ops(events)
    out: dict[str, Counter] = defaultdict(Counter)
    for e in events:
        if e.get("cat") == "kernel":
            families = {FAMILY_OF_OP[n] for n in ops.get(e["args"]["correlation"], []) if n in FAMILY_OF_OP}
            if len(families) == 1:
                out[families.pop()][e["name"]] += 1
    return out


# --------------------------------------------------------------------------------------------
# The device and the steps


@pytest.mark.parametrize("path", [path for _, path in TRACES], ids=[which for which, _ in TRACES])
def test_gpu_is_the_h100_the_trace_names(path):
    (props,) = _trace(path)["deviceProperties"]
    info, (tl,) = load_kineto(path)
    gpu = info.gpus[tl.device_id]
    assert "H100" in props["name"] and gpu.name == props["name"]
    assert gpu.sm_count == props["numSms"] == 132
    assert gpu.compute_capability == f"{props['computeMajor']}.{props['computeMinor']}" == "9.0"
    assert gpu.total_memory == props["totalGlobalMem"]


@pytest.mark.parametrize("which, path", TRACES)
def test_steps_are_the_profiler_steps(which, path, request):
    report = request.getfixturevalue(which)
    steps = _steps(_trace(path)["traceEvents"])
    assert len(steps) == 3
    assert report["steps"]["count"] == len(steps) and report["steps"]["source"] == "profiler-step"
    (dev,) = report["devices"]
    assert dev["step_ns"] == pytest.approx([(b - a) * 1e3 for a, b in steps], abs=2)
    assert dev["gpu_name"] == _trace(path)["deviceProperties"][0]["name"]


@pytest.mark.parametrize("which, path", TRACES)
def test_busy_fraction_is_the_union_of_gpu_intervals_in_the_steps(which, path, request):
    busy = request.getfixturevalue(which)["metrics"]["all"]["gpu.busy_fraction"]
    expected = _busy(_trace(path)["traceEvents"])
    assert 0 < expected < 1
    assert busy == pytest.approx(expected, abs=1e-4)


# --------------------------------------------------------------------------------------------
# Kernel mix


def test_kernel_families_match_the_operators_that_launched_them(eager):
    """Every kernel launched by aten::mm (cuBLAS nvjet), by SDPA (cuDNN flash kernels and their helpers) and
    by layer norm lands in its family, and nothing else does."""
    events = _trace(EAGER)["traceEvents"]
    truth = _true_families(events)
    counts = eager["devices"][0]["category_count"]
    assert set(truth) == {"gemm", "attention", "norm"}
    for family, names in truth.items():
        assert counts.get(family, 0) == sum(names.values()), family
        for name in names:
            assert classify_kernel(short_kernel_name(name), name).category == family, name
    # 6 layers x forward and backward x 3 steps of SDPA, each with two cuDNN helpers in the backward
    assert sum(truth["attention"].values()) == 6 * 3 * 4
    assert eager["devices"][0]["evidence"]["attention"]["backend"] == "cudnn"


def test_gemm_and_attention_shares_match_an_independent_union(eager):
    events = _trace(EAGER)["traceEvents"]
    truth = _true_families(events)
    metrics = eager["metrics"]["all"]
    for family in ("gemm", "attention"):
        expected = _share(events, lambda e, f=family: e.get("cat") == "kernel" and e["name"] in truth[f])
        assert 0 < expected < 1
        assert metrics[f"kernels.{family}_fraction"] == pytest.approx(expected, abs=1e-4), family


def test_graph_replays_classify_the_same_kernels_as_eager(graph):
    """The graph replays the eager step's kernels: the families the eager trace's operators give their names
    hold in the graph trace too (where every kernel's launch is the one cudaGraphLaunch)."""
    truth = _true_families(_trace(EAGER)["traceEvents"])
    kernels = Counter(e["name"] for e in _trace(GRAPH)["traceEvents"] if e.get("cat") == "kernel")
    counts = graph["devices"][0]["category_count"]
    for family, names in truth.items():
        in_graph = sum(n for name, n in kernels.items() if name in names)
        assert in_graph == sum(names.values())  # same model, same kernels, same number of steps
        assert counts.get(family, 0) == in_graph, family


def test_compiled_run_keeps_its_gemms_and_attention_and_leaves_nothing_unknown(compiled):
    """torch.compile generates Triton kernels for everything but the matmuls and SDPA, which stay the eager
    trace's cuBLAS and cuDNN kernels: those counts carry over by name, and no kernel is left `other`."""
    truth = _true_families(_trace(EAGER)["traceEvents"])
    kernels = Counter(e["name"] for e in _trace(COMPILED)["traceEvents"] if e.get("cat") == "kernel")
    assert sum(n for name, n in kernels.items() if name.startswith("triton_")) > len(kernels)
    counts = compiled["devices"][0]["category_count"]
    for family in ("gemm", "attention"):
        assert counts[family] == sum(n for name, n in kernels.items() if name in truth[family]) \
            == sum(truth[family].values()), family
    assert "other" not in counts


def test_unfused_ops_go_away_under_torch_compile(eager, compiled):
    """The eager loop runs PyTorch's GELU functor and log-softmax + NLL kernels, found by name; but the GPU
    waits for the CPU's launches most of the step, so none of them holds it (they run while the host is
    still launching the next): unfused-ops stays silent and host-launch-bound is the finding. Under
    torch.compile Inductor fuses both, so their time must go, with the fused kernels still there."""
    events = _trace(EAGER)["traceEvents"]
    eager_names = {e["name"] for e in events if e.get("cat") == "kernel"}
    assert any("GeluCUDAKernelImpl" in n for n in eager_names) and any("nll_loss_forward" in n for n in eager_names)
    m = eager["metrics"]["all"]
    assert m["kernels.unfused.cross_entropy_ms"] > 0 and m["kernels.unfused.bias_activation_ms"] > 0
    assert m["blocking.host_launch_ms"] > 0.5 * m["step.time_ms"]
    assert m["blocking.unfused_ms"] < 0.03 * m["step.time_ms"]
    assert "unfused-ops" not in {f["rule"] for f in eager["findings"]}
    assert "host-launch-bound" in {f["rule"] for f in eager["findings"]}
    fused = {e["name"] for e in _trace(COMPILED)["traceEvents"] if e.get("cat") == "kernel"}
    assert any(n.startswith("triton_") and "nll_loss" in n for n in fused)
    assert any(n.startswith("triton_") and "gelu" in n for n in fused)
    assert "unfused-ops" not in {f["rule"] for f in compiled["findings"]}
    assert compiled["metrics"]["all"]["kernels.unfused_ms"] == 0


def test_top_kernels_keep_fills_apart_from_arithmetic(graph):
    """PyTorch's vectorized_elementwise_kernel runs adds, casts and GELUs but also fill_ (a memset): one short
    name, two categories, two rows, each with the count the trace gives."""
    names = [e["name"] for e in _trace(GRAPH)["traceEvents"] if e.get("cat") == "kernel"
             and short_kernel_name(e["name"]) == "vectorized_elementwise_kernel"]
    fills = sum("FillFunctor" in n for n in names)
    assert 0 < fills < len(names)
    rows = {(k["name"], k["category"]): k["count"] for k in graph["devices"][0]["top_kernels"]}
    assert len(rows) == len(graph["devices"][0]["top_kernels"])
    assert rows[("vectorized_elementwise_kernel", "elementwise")] == len(names) - fills
    assert rows.get(("vectorized_elementwise_kernel", "memset"), fills) == fills


# --------------------------------------------------------------------------------------------
# CUDA graphs


def test_graph_trace_is_recognised_as_graphed(graph, eager):
    events = _trace(GRAPH)["traceEvents"]
    launches = [e for e in events if e.get("cat") == "cuda_runtime" and e["name"].startswith("cudaGraphLaunch")]
    graph_corr = {e["args"]["correlation"] for e in launches}
    # Node-level records: each replayed kernel carries its cudaGraphLaunch's correlation id; the others are
    # the new batch's random_/copy kernels, launched eagerly inside the script's `data` range.
    data = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "user_annotation" and e["name"] == "data"]
    launch_ts = {e["args"]["correlation"]: e["ts"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    kernels = [e for e in events if e.get("cat") == "kernel"]
    eager_kernels = [e for e in kernels if e["args"]["correlation"] not in graph_corr]
    assert len(eager_kernels) < len(kernels) / 50
    assert all(any(a <= launch_ts[e["args"]["correlation"]] <= b for a, b in data) for e in eager_kernels)
    per_step = [sum(a <= e["ts"] < b for e in launches) for a, b in _steps(events)]
    assert graph["metrics"]["all"]["graphs.launches_per_step"] == statistics.median(per_step) == 1
    # The replays cover most of each step, though their kernels are visible one by one: each replay spans
    # from its first kernel's start to its last kernel's end.
    spans: dict[int, list[float]] = {}
    for e in kernels:
        if e["args"]["correlation"] in graph_corr:
            span = spans.setdefault(e["args"]["correlation"], [e["ts"], e["ts"] + e["dur"]])
            span[0], span[1] = min(span[0], e["ts"]), max(span[1], e["ts"] + e["dur"])
    replays = _union([tuple(v) for v in spans.values()])
    fraction = statistics.median(_covered(replays, a, b) / (b - a) for a, b in _steps(events))
    assert fraction > 0.5
    assert graph["metrics"]["all"]["graphs.replay_fraction"] == pytest.approx(fraction, rel=1e-3)
    assert eager["metrics"]["all"]["graphs.launches_per_step"] == 0
    rules = {f["rule"] for f in graph["findings"]}
    assert not rules & {"cuda-graphs-candidate", "host-launch-bound"}
    assert "host-launch-bound" in {f["rule"] for f in eager["findings"]}


def test_compiled_trace_is_recognised_as_graphed(compiled):
    """CUDA-graph trees replay the compiled forward and backward as two graphs per step."""
    events = _trace(COMPILED)["traceEvents"]
    launches = [e["ts"] for e in events if e.get("cat") == "cuda_runtime" and e["name"].startswith("cudaGraphLaunch")]
    per_step = [sum(a <= t < b for t in launches) for a, b in _steps(events)]
    assert compiled["metrics"]["all"]["graphs.launches_per_step"] == statistics.median(per_step) == 2
    findings = {f["rule"]: f for f in compiled["findings"]}
    assert "cuda-graphs-candidate" not in findings
    # What launch overhead is left on the path is outside the graphs: CUDA graphs are not advised again.
    launch = findings.get("host-launch-bound")
    assert launch is None or (launch["next_step"].startswith("CUDA graphs are already on") and not any(
        k.get("megatron_bridge") == "model.cuda_graph_impl" for k in launch["knobs"]))


def test_launch_bound_estimate_is_the_idle_time_graphs_removed(eager, graph):
    """The eager trace's launch-bound idle time is what replaying the step as a CUDA graph should remove: the
    graph trace of the same step shows how much device idle time it really removed."""
    def idle_ms(path: Path) -> float:
        events = _trace(path)["traceEvents"]
        union = _union([(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in DEVICE_CATEGORIES])
        return statistics.median((b - a) - _covered(union, a, b) for a, b in _steps(events)) / 1e3

    removed = idle_ms(EAGER) - idle_ms(GRAPH)
    assert removed > 0
    # The graph holds the optimizer step too: its host gaps (Optimizer.step#AdamW.step) went with the launch loop's.
    m = eager["metrics"]["all"]
    assert m["host.launch_bound_ms"] + m["host.optimizer_ms"] == pytest.approx(removed, rel=0.15)
    assert m["host.launch_bound_ms"] > 5 * m["host.optimizer_ms"] > 0


# --------------------------------------------------------------------------------------------
# Memory snapshot


def _replayed_peaks() -> tuple[int, int, int]:
    """Peak allocated and reserved bytes of device 0, replaying the history backwards from the dump-time
    segments (what was allocated before the history began stays counted), and the device's memory."""
    with SNAPSHOT.open("rb") as f:
        snap = pickle.load(f)  # noqa: S301 (the project's own capture, plain data)
    segments = [s for s in snap["segments"] if s["device"] == 0]
    allocated = sum(b["size"] for s in segments for b in s["blocks"] if b["state"].startswith("active"))
    reserved = sum(s["total_size"] for s in segments)
    sign = {"alloc": ("a", 1), "free_completed": ("a", -1), "segment_alloc": ("r", 1), "segment_free": ("r", -1)}
    deltas = [(sign[e["action"]], e["size"]) for e in snap["device_traces"][0] if e["action"] in sign]
    level = {"a": allocated - sum(s * n for (k, s), n in deltas if k == "a"),
             "r": reserved - sum(s * n for (k, s), n in deltas if k == "r")}
    peak = dict(level)
    for (kind, s), n in deltas:
        level[kind] += s * n
        peak[kind] = max(peak[kind], level[kind])
    total = _trace(EAGER)["deviceProperties"][0]["totalGlobalMem"]
    return peak["a"], peak["r"], total


def test_memory_peaks_match_a_replay_of_the_history():
    peak_allocated, peak_reserved, _ = _replayed_peaks()
    (snap,) = _perfdoctor("memory", str(SNAPSHOT))["snapshots"]
    assert snap["metrics"]["memory.peak_allocated_bytes"] == peak_allocated
    assert snap["metrics"]["memory.peak_reserved_bytes"] == peak_reserved
    assert 0 < peak_allocated <= peak_reserved


def test_analyze_with_the_snapshot_gives_the_same_peaks_and_the_headroom():
    peak_allocated, peak_reserved, total = _replayed_peaks()
    report = _perfdoctor("analyze", str(EAGER), str(SNAPSHOT))
    metrics = report["metrics"]["all"]
    assert metrics["memory.peak_allocated_bytes"] == peak_allocated
    assert metrics["memory.peak_reserved_bytes"] == peak_reserved
    assert metrics["memory.headroom_fraction"] == pytest.approx(1 - peak_reserved / total)
    assert not [w for w in report["warnings"] if "snapshot" in w]  # same session: no mismatch warning


@pytest.mark.parametrize("which, path", TRACES)
def test_launch_statistics_are_per_launch_call(which, path, request):
    """A cudaGraphLaunch starts every kernel its graph replays: launch statistics count each call once
    (median call duration, median interval between consecutive calls on a thread), recomputed here from
    the runtime events that launched the kernels. Counting per kernel gave a 0 µs interval on graphs."""
    report = request.getfixturevalue(which)
    events = _trace(path)["traceEvents"]
    calls = {e["args"]["correlation"]: e for e in events
             if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    launching = {(calls[c]["ts"], calls[c]["tid"], calls[c]["dur"]) for c in
                 {e["args"]["correlation"] for e in events if e.get("cat") == "kernel"} if c in calls}
    by_thread: dict = {}
    for ts, tid, _ in sorted(launching):
        by_thread.setdefault(tid, []).append(ts)
    intervals = [b - a for starts in by_thread.values() for a, b in zip(starts, starts[1:])]
    rank = next(iter(report["metrics"]["ranks"].values()))
    assert rank["host.launch_interval_us"] == pytest.approx(statistics.median(intervals), rel=1e-3, abs=2e-3)
    assert rank["host.launch_call_us"] == pytest.approx(statistics.median(d for *_, d in launching), rel=1e-3, abs=2e-3)
    assert rank["host.launch_interval_us"] > 0


def test_operators_and_annotations_are_told_apart():
    """cpu_op ranges (the operators every launch happens inside) and user annotations (record_function,
    ProfilerStep#N) keep their kind: host time outside any operator is measured against the operators."""
    from perfdoctor.load.kineto import ANNOTATION_CATEGORY, OP_CATEGORY

    events = _trace(EAGER)["traceEvents"]
    kinds = Counter(e["cat"] for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation"))
    _, (tl,) = load_kineto(EAGER)
    category = Counter(tl.nvtx.col("category").tolist())
    assert category == {OP_CATEGORY: kinds["cpu_op"], ANNOTATION_CATEGORY: kinds["user_annotation"]}


def test_eager_host_gaps_stay_launch_bound(eager):
    """The eager loop's idle time is the launch loop's: hardly any of it is a pause outside operators."""
    m = eager["metrics"]["all"]
    assert m["host.outside_ops_ms"] < 0.05 * m["host.launch_bound_ms"]
    assert m["host.gc_ms"] == 0
