"""The planted cases of issue 23, in both trace formats the simulator writes (nsys SQLite and PyTorch
profiler JSON): each gets the right cause and the right advice.

- a DataLoader stall recorded only by PyTorch's own ranges → data loading, the data-loading advice, no
  CUDA graphs;
- one long host pause per step that nothing records (GC under torch.profiler) → host time outside
  profiled ops, no CUDA graphs;
- DeepEP dispatch/combine kernels on their own stream, no NCCL call → expert-parallel communication,
  labelled ep, and the EP finding.

Expected values come from the simulator's truth files (what it scheduled), never from perfdoctor.
"""

from __future__ import annotations

import json
import sqlite3
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from perfdoctor import api
from perfdoctor.classify.timeline import copy_classes, kernel_classes
from perfdoctor.load.run import load_trace
from perfdoctor.measure.activity import activity
from perfdoctor.measure.breakdown import activity_window
from perfdoctor.measure.host import CAUSES, DEVICE_WAIT, gap_causes, host_gaps
from perfdoctor.measure.steps import find_steps
from perfdoctor.synth import run_scenario
from tests.paths import SAMPLES

SCENARIOS = Path(str(resources.files("perfdoctor.synth").joinpath("scenarios")))
NO_LAUNCH_ADVICE = {"host-launch-bound", "cuda-graphs-candidate"}


@pytest.fixture(scope="module", params=["sqlite", "kineto"])
def fmt(request) -> str:
    return request.param


def _trace(name: str, fmt: str, tmp: Path) -> Path:
    if fmt == "sqlite":
        return SAMPLES / name
    run_scenario(SCENARIOS / f"{name}.yaml", tmp / name, fmt="kineto")
    return tmp / name


def _truth_steps(name: str) -> list[dict]:
    (truth,) = [json.loads(p.read_text()) for p in (SAMPLES / name).glob("*.truth.json")]
    (rank,) = truth["ranks"].values()
    return rank["steps"]


def _scenario(name: str) -> dict:
    from perfdoctor.synth.scenario import load_scenario

    sc = load_scenario(SCENARIOS / f"{name}.yaml")
    return {"host": sc.host}


def _median(name: str, get) -> float:
    return float(np.median([get(s) for s in _truth_steps(name)]))


def test_dataloader_stall_is_data_loading_not_launch_overhead(fmt, tmp_path):
    """As a plain PyTorch loop records it: ProfilerStep#N begins, the profiler's bookkeeping runs, then the
    fetch; the device went idle before the fetch began (the last step ended draining it), so what the host
    was doing at that instant says nothing — the fetch covers the gap's host window."""
    report = api.analyze([_trace("data_stall", fmt, tmp_path)])
    m = report.metrics["all"]
    host = _scenario("data_stall")["host"]
    want = host["data_stall_ms"] + host["data_ms"]  # planted: every step waits this long for its batch
    assert m["host.data_ms"] == pytest.approx(want, rel=0.01)
    assert m["host.launch_bound_ms"] < 0.01 * want
    rules = {f["rule"]: f for f in report.findings}
    assert "data-loading-stall" in rules and not rules.keys() & NO_LAUNCH_ADVICE
    finding = rules["data-loading-stall"]
    assert finding["severity"] == "high" and finding["impact_ms_per_step"] == pytest.approx(want, rel=0.01)
    assert any(k.get("megatron_lm") == "--num-workers" and k.get("value") == 8 for k in finding["knobs"])


def test_an_unrecorded_host_pause_is_outside_profiled_ops(fmt, tmp_path):
    report = api.analyze([_trace("gc_pause", fmt, tmp_path)])
    m = report.metrics["all"]
    # The simulator knows the pauses were GC; the trace does not record them (no perfdoctor marks).
    want = _median("gc_pause", lambda s: s["host_gap_ms"]["gc"])
    assert want > 30
    assert m["host.gc_ms"] == 0
    assert m["host.outside_ops_ms"] == pytest.approx(want, rel=0.05)
    assert m["host.launch_bound_ms"] < 0.05 * want
    rules = {f["rule"] for f in report.findings}
    assert "host-outside-ops" in rules and not rules & NO_LAUNCH_ADVICE


def test_deep_ep_kernels_are_expert_parallel_communication(fmt, tmp_path):
    report = api.analyze([_trace("deep_ep", fmt, tmp_path)])
    m = report.metrics["all"]
    steps = _truth_steps("deep_ep")
    assert m["comm.ep.time_ms"] == pytest.approx(float(np.median([s["comm_ms"]["ep"] for s in steps])), rel=0.05)
    assert m["comm.ep.exposed_ms"] == pytest.approx(float(np.median([s["exposed_ms"]["ep"] for s in steps])),
                                                    rel=0.05)
    assert m["compute.fraction"] == pytest.approx(float(np.median([s["compute_ms"] / s["step_ms"] for s in steps])),
                                                  rel=0.05)
    (device,) = report.devices
    assert device.comm_libraries["deep_ep"] > 0
    ep = device.groups["ep"]
    assert set(ep["confidence"]) == {"high"}
    assert "exposed-ep-comm" in {f["rule"] for f in report.findings}


def test_gap_causes_are_the_gaps_host_gaps_sums():
    """The per-gap causes (what the critical path blames host time with) add up to the per-step metrics."""
    (path,) = (SAMPLES / "data_stall").glob("*.sqlite")
    _, (tl,) = load_trace(path)
    kcls = kernel_classes(tl.kernels)
    act = activity(tl, kcls, copy_classes(tl.memcpy))
    steps = find_steps(tl, activity_window(tl), kcls)
    gaps = gap_causes(tl, steps, act.busy)
    assert np.all(gaps.start[1:] >= gaps.end[:-1]) and np.all(gaps.end > gaps.start)
    per_step = host_gaps(tl, steps, act.busy)
    for i, cause in enumerate(CAUSES):
        mine = gaps.cause == i
        assert np.bincount(gaps.step[mine], weights=gaps.end[mine] - gaps.start[mine], minlength=len(steps)) \
            == pytest.approx(per_step.by_cause[cause])
    assert set(gaps.names[gaps.cause == DEVICE_WAIT]) <= {"device_wait"}
    assert "data" in set(gaps.names)


def _kineto_event(name: str, cat: str, ts: float, dur: float, **args) -> dict:
    pid, tid = (0, args["stream"]) if cat == "kernel" else (1, 1)
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_deepseek_ep_kernels_are_communication_not_compute(tmp_path):
    """DeepSeek-V3 training as its published profile records it (deepseek-ai/profile-data train.json): the
    DeepEP kernels under DeepSeek's own namespace on their own stream are expert-parallel communication; the
    compute stream waits for each (dispatch/combine between two expert GEMMs), so it lies on the critical path
    and is the exposed-ep-comm finding (an EP kernel nothing waited for would not be one)."""
    gemm = "void dpsk::gemm::fp8_gemm_kernel<7168u, 2048u, 128u, 128u, 128u, 5u, 128u, 128u, 2u, " \
           "(dpsk::gemm::GemmType)0>(__nv_bfloat16*, float*, int*, unsigned int, unsigned int, CUtensorMap_st, " \
           "CUtensorMap_st, CUtensorMap_st, CUtensorMap_st)"
    ep = ["void dpsk::ep::internode::notify_dispatch<false, 4>(int const*, long*, int)",
          "void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*, float*, long*)",
          "void dpsk::ep::internode::cached_notify<false>(int, int, int, int, int*)",
          "void dpsk::ep::internode::combine<false, 4, __nv_bfloat16, 4, 4, 16, 24>(int4*, float*, bool const*)"]
    events, corr = [], 0
    for step in range(3):
        t0 = 8_100.0 * step  # the step ends when its last combine does
        events.append(_kineto_event(f"ProfilerStep#{step}", "user_annotation", t0, 8_100.0))
        for i in range(8):  # compute stream: GEMMs; the EP stream: dispatch/combine after each, the next GEMM waits
            corr += 1
            events.append(_kineto_event("cudaLaunchKernel", "cuda_runtime", t0 + 10 * i, 5, correlation=corr))
            events.append(_kineto_event(gemm, "kernel", t0 + 100 + 1000 * i, 600, stream=7, correlation=corr))
            corr += 1
            events.append(_kineto_event("cudaLaunchKernel", "cuda_runtime", t0 + 10 * i + 5, 3, correlation=corr))
            events.append(_kineto_event(ep[i % 4], "kernel", t0 + 700 + 1000 * i, 400, stream=27, correlation=corr))
    path = tmp_path / "dsv3.pt.trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}, indent=2))
    report = api.analyze([path])
    m = report.metrics["all"]
    assert m["comm.ep.time_ms"] == pytest.approx(3.2)  # 8 kernels of 0.4 ms per step
    assert m["comm.ep.exposed_ms"] == pytest.approx(3.2)  # between two GEMMs: no compute beside them
    assert m["blocking.transfer_ep_ms"] == pytest.approx(3.2, abs=0.05)  # and the next GEMM waits for each
    assert m["compute.fraction"] == pytest.approx(8 * 0.6 / 8.1)
    (device,) = report.devices
    assert device.comm_libraries == {"deep_ep": 24}
    assert set(device.groups) == {"ep"} and set(device.groups["ep"]["confidence"]) == {"high"}
    assert "exposed-ep-comm" in {f["rule"] for f in report.findings}


def test_prefetch_scenario_plants_a_side_stream_copy_beside_compute():
    """prefetch_overlap: one 128 MiB pinned host-to-device copy per step on a stream of its own (no kernel,
    no synchronisation on it), running while the compute kernels run."""
    (path,) = (SAMPLES / "prefetch_overlap").glob("*.sqlite")
    con = sqlite3.connect(path)
    big = con.execute("SELECT start, end, streamId FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE bytes = ? AND copyKind = 1",
                      (128 << 20,)).fetchall()
    steps = len(_truth_steps("prefetch_overlap"))
    assert len(big) == steps and len({s for _, _, s in big}) == 1
    stream = big[0][2]
    assert con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE streamId = ?",
                       (stream,)).fetchone()[0] == 0
    assert con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION WHERE streamId = ?",
                       (stream,)).fetchone()[0] == 0
    for start, end, _ in big:  # compute runs while it copies
        beside = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE start < ? AND end > ?",
                             (end, start)).fetchone()[0]
        assert beside > 0
    con.close()


def test_kineto_host_window_causes(tmp_path):
    """A PyTorch-profiler trace made by hand, each step: a launch loop (an operator and a launch every
    100 µs, 20 µs kernels), one 1.5 ms operator that launches at its end, a 1.5 ms stretch with no operator
    and no CUDA call, then an optimizer step whose operators launch three kernels. The loop's gaps and the
    long operator's are launch-bound (the host was running profiled ops: a stretch without CUDA calls is not
    a pause when an operator covers it), the stretch is outside profiled ops, the optimizer's gaps are the
    optimizer's — whatever the host was in at the instant the device went idle."""
    events, corr, step_us = [], 0, 7000.0

    def launch(at: float, op: str, op_us: float = 20.0, op_start: float | None = None) -> None:
        nonlocal corr
        corr += 1
        events.append(_kineto_event(op, "cpu_op", at - 10 if op_start is None else op_start, op_us))
        events.append(_kineto_event("cudaLaunchKernel", "cuda_runtime", at, 5, correlation=corr))
        events.append(_kineto_event("void at::native::vectorized_elementwise_kernel<4>(int)", "kernel", at + 10, 20,
                                    stream=7, correlation=corr))

    for step in range(3):
        t0 = step * step_us
        events.append(_kineto_event(f"ProfilerStep#{step}", "user_annotation", t0, step_us))
        for i in range(20):
            launch(t0 + 100 + 100 * i, "aten::mul")
        launch(t0 + 3580, "aten::nonzero", 1510, op_start=t0 + 2090)  # host work inside an operator
        launch(t0 + 5100, "aten::add")  # after 1.5 ms with nothing recorded
        events.append(_kineto_event("Optimizer.step#AdamW.step", "user_annotation", t0 + 5200, 1600))
        for at in (5310, 5810, 6310):
            launch(t0 + at, "aten::_foreach_add_", 400)
    path = tmp_path / "host.pt.trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}, indent=2))
    m = api.analyze([path]).metrics["ranks"]["0"]
    assert m["host.outside_ops_ms"] == pytest.approx((5110 - 3610) / 1e3)
    assert m["host.optimizer_ms"] == pytest.approx((5320 - 5130 + 5820 - 5340 + 6320 - 5840 + 7000 - 6340) / 1e3)
    assert m["host.launch_bound_ms"] == pytest.approx((19 * 80 + 110 + 3590 - 2030) / 1e3)
    assert m["host.data_ms"] == m["host.gc_ms"] == m["host.sync_ms"] == 0
