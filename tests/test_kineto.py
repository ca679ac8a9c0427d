"""PyTorch profiler (Kineto) input: real traces of other people's runs, simulated twins of nsys exports,
and bad input.

Counts are checked against an independent reading of the same file with the standard library's json;
the simulated twins are the same simulated run written both ways, so every measurement must agree
except those that need what a Kineto trace does not hold (the model config behind MFU and the bubble
theory; Python GC, which the profiler does not record)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from perfdoctor import api
from perfdoctor.errors import InputError
from perfdoctor.load import kineto
from perfdoctor.load.kineto import load_kineto
from perfdoctor.render.json import report_dict
from perfdoctor.synth import run_scenario
from tests.paths import REPO, TRACES

KINETO = TRACES / "kineto"
REAL = [KINETO / "hta_nccl_data.json.gz", KINETO / "hta_ddp_v100_rank1.json.gz",
        *sorted((KINETO / "param_dlrm_8rank").glob("*.json.gz"))]
SCENARIOS = REPO / "perfdoctor" / "synth" / "scenarios"
# Measurements that need what a PyTorch profiler trace does not record (see the module docstring).
NOT_IN_KINETO = {"mfu", "mfu.fp8", "model.tflops_per_gpu", "pipeline.bubble_fraction_theory"}
# A stage's wait for its neighbours splits into the schedule's share and the rest only where the config
# names the schedule (a Kineto trace has no config marks): the family's sum agrees.
PIPELINE_WAIT = ("blocking.pipeline_theory_ms", "blocking.pipeline_imbalance_ms", "blocking.pipeline_wait_ms")
WAIT_WHATIF = ("whatif.pipeline_theory_ms", "whatif.pipeline_imbalance_ms", "whatif.pipeline_wait_ms")


def _plain(path: Path) -> dict:
    return json.load(gzip.open(path) if path.suffix == ".gz" else path.open())


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "perfdoctor", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_trace_loads_every_gpu_event(path: Path) -> None:
    """Every kernel, copy and fill of the file lands on a timeline with its exact duration."""
    data = _plain(path)
    events = data["traceEvents"]
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    copies = [e for e in events if e.get("ph") == "X" and e.get("cat") == "gpu_memcpy"]
    fills = [e for e in events if e.get("ph") == "X" and e.get("cat") == "gpu_memset"]
    info, timelines = load_kineto(path)
    assert info.format == "kineto-json"
    assert sum(len(t.kernels) for t in timelines) == len(kernels)
    assert sum(len(t.memcpy) for t in timelines) == len(copies)
    assert sum(len(t.memset) for t in timelines) == len(fills)
    got = np.sort(np.concatenate([(t.kernels["end"] - t.kernels["start"]) for t in timelines]))
    want = np.sort(np.rint(np.array([float(e["dur"]) for e in kernels]) * 1000).astype(np.int64))
    assert np.abs(got - want).max() <= 1
    assert info.rank == data["distributedInfo"]["rank"]
    nccl = sum(1 for e in kernels if e["name"].startswith("nccl"))
    assert sum(int(t.kernels["short_name"].where(lambda n: str(n).startswith("nccl")).sum()) for t in timelines) == nccl
    for t in timelines:  # the timeline's device and process: one value each, held once
        for table in (t.kernels, t.memcpy, t.memset):
            if len(table) > 1:
                assert table["device_id"].tolist() == [t.device_id] * len(table) and table["device_id"].strides == (0,)
                assert table["global_pid"].tolist() == [t.global_pid] * len(table)
                assert table["global_pid"].strides == (0,)


def test_real_nccl_trace_labels_groups_from_process_group_args() -> None:
    """hta_nccl_data: every NCCL kernel names process group '0' (default_pg, 2 ranks) and the trace has no
    Megatron group: plain DDP, so the world group is the DP group, from the args, not a guess by name."""
    report = report_dict(api.analyze([KINETO / "hta_nccl_data.json.gz"], timeline_excerpts=False))
    groups = report["devices"][0]["groups"]
    assert set(groups) == {"dp"}
    assert set(groups["dp"]["label_source"]) == {"kineto_pg"}
    assert report["devices"][0]["step_source"] == "profiler-step"
    assert report["inputs"][0]["session_start_utc_ns"] == _plain(KINETO / "hta_nccl_data.json.gz")[
        "baseTimeNanoseconds"]


def test_real_8_rank_set_is_one_run() -> None:
    """The DLRM set: eight files, ranks 0..7 from distributedInfo, one step each, breakdowns that add up."""
    report = report_dict(api.analyze([KINETO / "param_dlrm_8rank"], timeline_excerpts=False))
    assert [d["rank"] for d in report["devices"]] == list(range(8))
    assert sorted(report["metrics"]["ranks"]) == [str(r) for r in range(8)]
    for dev in report["devices"]:
        assert dev["step_source"] == "profiler-step"
        window = dev["window"][1] - dev["window"][0]
        assert 0 < dev["busy_ns"] <= window
        assert dev["compute_ns"] + dev["comm_ns"] >= dev["busy_ns"] - dev["comm_ns"]
        assert dev["comm_kernel_count"] == 8  # 5 all-to-all (SendRecv) + 3 all-reduce per rank, counted in the file


def _twins(tmp_path: Path, name: str) -> tuple[dict, dict]:
    scenario = SCENARIOS / f"{name}.yaml"
    sq = report_dict(api.analyze(run_scenario(scenario, tmp_path / "sqlite"), timeline_excerpts=False))
    kt = report_dict(api.analyze(run_scenario(scenario, tmp_path / "kineto", fmt="kineto"), timeline_excerpts=False))
    return sq, kt


@pytest.mark.parametrize("name", ["exposed_dp", "exposed_tp", "pp_1f1b", "moe_ep", "host_bound", "unlabeled"])
def test_simulated_twins_agree(tmp_path: Path, name: str) -> None:
    """The same simulated run as nsys export and as Kineto trace: the same measurements, per rank, and
    the same findings; group labels come from the process groups instead of NVTX."""
    sq, kt = _twins(tmp_path, name)
    assert sorted(sq["metrics"]["ranks"]) == sorted(kt["metrics"]["ranks"])
    for rank, want in sq["metrics"]["ranks"].items():
        got = kt["metrics"]["ranks"][rank]
        assert sum(got[k] or 0 for k in PIPELINE_WAIT) == pytest.approx(sum(want[k] or 0 for k in PIPELINE_WAIT))
        for key, value in want.items():
            if key in PIPELINE_WAIT or key in WAIT_WHATIF:
                continue
            if key.startswith("whatif.") and value is not None:
                # the nsys export records the stream waits, which keep an op behind data it needed in the
                # replay even where they never bound; Kineto records none: its replay saves as much or more
                assert got[key] is not None and got[key] >= value - 1e-6, (rank, key)
                continue
            if key in NOT_IN_KINETO:
                assert got[key] is None or value is None or got[key] == pytest.approx(value)
            elif isinstance(value, float):
                assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-9), (rank, key)
            else:
                assert got[key] == value, (rank, key)
    assert [f["rule"] for f in sq["findings"]] == [f["rule"] for f in kt["findings"]]
    for dev in kt["devices"]:
        for info in dev["groups"].values():
            assert set(info["label_source"]) == {"kineto_pg"}


def test_gc_is_invisible_to_the_profiler_and_said_so(tmp_path: Path) -> None:
    """gc_jitter: the nsys twin blames GC; the Kineto twin cannot, and its report says why."""
    sq, kt = _twins(tmp_path, "gc_jitter")
    assert sq["metrics"]["all"]["host.gc_ms"] > 0
    assert kt["metrics"]["all"]["host.gc_ms"] == 0
    # The same idle time, as host time outside profiled ops: a pause with no launch call in it is not
    # launch overhead, so launch-bound stays what the nsys twin says.
    assert kt["metrics"]["all"]["host.idle_fraction"] == pytest.approx(sq["metrics"]["all"]["host.idle_fraction"])
    assert kt["metrics"]["all"]["host.outside_ops_ms"] == pytest.approx(sq["metrics"]["all"]["host.gc_ms"], rel=0.02)
    assert kt["metrics"]["all"]["host.launch_bound_ms"] == pytest.approx(sq["metrics"]["all"]["host.launch_bound_ms"],
                                                                        rel=0.02)
    assert sq["metrics"]["all"]["host.outside_ops_ms"] < 0.01 * sq["metrics"]["all"]["host.gc_ms"]
    assert "gc-pause" in {f["rule"] for f in sq["findings"]}
    assert "host-launch-bound" not in {f["rule"] for f in kt["findings"]}
    assert any("garbage collection" in w for w in kt["warnings"])


def test_config_from_megatron_process_groups(tmp_path: Path) -> None:
    """distributedInfo.pg_config names Megatron's groups with their sizes: tp/dp come from the file."""
    files = run_scenario(SCENARIOS / "exposed_tp.yaml", tmp_path, fmt="kineto")
    report = report_dict(api.analyze(files, timeline_excerpts=False))
    sc = json.loads(next(tmp_path.glob("*.truth.json")).read_text())["config"]
    assert report["run"]["framework"]["name"] == "megatron-core"
    for key in ("tp", "dp"):
        if sc[key] > 1:
            assert report["run"]["config"][key] == sc[key]
            assert report["run"]["config_sources"][key] == "kineto-json:process-groups"


def test_streamed_and_whole_decodes_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny chunks (many cuts at event boundaries), one chunk, and the same trace re-serialised compactly
    (no PyTorch layout: decoded whole) give identical tables."""
    path = run_scenario(SCENARIOS / "exposed_dp.yaml", tmp_path, fmt="kineto")[0]
    compact = tmp_path / "compact.json"
    compact.write_text(json.dumps(_plain(path), separators=(",", ":")))
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 4096)
    _, small = load_kineto(path)
    _, whole = load_kineto(compact)
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 1 << 30)
    _, one = load_kineto(path)
    for a, b in ((small, one), (small, whole)):
        for table in ("kernels", "memcpy", "memset", "api", "nvtx"):
            left, right = getattr(a[0], table), getattr(b[0], table)
            assert left.equals(right), table


@pytest.mark.parametrize("content,expected", [
    (b'{"foo": 1}', "not a PyTorch profiler (Kineto) trace"),
    (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]}',
     "without GPU events"),
    (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": ',
     "invalid or truncated JSON"),
])
def test_bad_json_is_one_line_exit_2(tmp_path: Path, content: bytes, expected: str) -> None:
    path = tmp_path / "trace.json"
    path.write_bytes(content)
    proc = _cli("analyze", str(path))
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr and proc.stderr.count("\n") == 1
    assert path.read_bytes() == content  # never touched


def test_truncated_gzip_is_one_line_exit_2(tmp_path: Path) -> None:
    good = run_scenario(SCENARIOS / "exposed_dp.yaml", tmp_path / "run", fmt="kineto")[0]
    cut = tmp_path / "cut.pt.trace.json.gz"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    proc = _cli("analyze", str(cut))
    assert proc.returncode == 2 and "gzip" in proc.stderr and proc.stderr.count("\n") == 1


def test_mixed_run_directory_is_refused(tmp_path: Path) -> None:
    run_scenario(SCENARIOS / "exposed_dp.yaml", tmp_path, fmt="kineto")
    run_scenario(SCENARIOS / "exposed_dp.yaml", tmp_path)
    with pytest.raises(InputError, match="mixes nsys exports and PyTorch profiler traces"):
        api.analyze([tmp_path])


def test_run_directory_skips_json_that_is_not_a_trace(tmp_path: Path) -> None:
    run_scenario(SCENARIOS / "exposed_dp.yaml", tmp_path, fmt="kineto")
    (tmp_path / "manifest.json").write_text('{"command": ["torchrun"], "ranks": 1}')
    report = api.analyze([tmp_path], timeline_excerpts=False)
    assert [t.format for t in report.run.traces] == ["kineto-json"]


def test_cli_synth_writes_kineto(tmp_path: Path) -> None:
    proc = _cli("synth", str(SCENARIOS / "exposed_dp.yaml"), "-o", str(tmp_path), "--format", "kineto")
    assert proc.returncode == 0, proc.stderr
    written = [Path(line) for line in proc.stdout.split()]
    assert written and all(p.name.endswith(".pt.trace.json.gz") for p in written)
    assert "traceEvents" in _plain(written[0])


def test_memory_snapshot_attaches_to_a_kineto_rank(tmp_path: Path) -> None:
    """RUN_DIR/memory/rank0.pickle beside rank 0's profiler trace is that rank's snapshot, as for nsys runs."""
    run_scenario(SCENARIOS / "exposed_dp.yaml", tmp_path, fmt="kineto")
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "rank0.pickle").write_bytes((REPO / "tests" / "data" / "torch_profiler_snapshot.pickle")
                                                       .read_bytes())
    report = report_dict(api.analyze([tmp_path], timeline_excerpts=False))
    assert report["metrics"]["ranks"]["0"]["memory.peak_allocated_bytes"] is not None


def test_cross_rank_matching_on_kineto_ranks(tmp_path: Path) -> None:
    """A DP=4 run with one slow GPU written both ways: the Kineto ranks' collectives match across ranks
    by their process group, and wait, transfer and the straggler equal the nsys twin's."""
    scenario = {"name": "slow_gpu", "model": {"layers": 4, "hidden": 2048, "heads": 16, "kv_heads": 4,
                                              "ffn_hidden": 8192, "seq_length": 2048, "vocab": 32000,
                                              "num_microbatches": 4},
                "parallel": {"dp": 4}, "comm": {"overlap_grad_reduce": False, "overlap_param_gather": False},
                "straggler": {"rank": 2, "gemm_slowdown": 0.18}, "output": {"schema": "2024.2", "ranks": "all"},
                "run": {"steps": 3, "seed": 5}}
    sq = report_dict(api.analyze(run_scenario(scenario, tmp_path / "sqlite"), jobs=1, timeline_excerpts=False))
    kt = report_dict(api.analyze(run_scenario(scenario, tmp_path / "kineto", fmt="kineto"), jobs=1,
                                 timeline_excerpts=False))
    assert kt["metrics"]["all"]["ranks.slowest"] == sq["metrics"]["all"]["ranks.slowest"] == 2
    for rank, want in sq["metrics"]["ranks"].items():
        for key in ("comm.dp.exposed_wait_ms", "comm.dp.exposed_transfer_ms", "ranks.late_ms"):
            assert want[key] is not None or key == "ranks.late_ms"
            if want[key] is not None:
                assert kt["metrics"]["ranks"][rank][key] == pytest.approx(want[key], rel=1e-6, abs=1e-6), (rank, key)


def test_real_8_rank_collectives_match_across_ranks() -> None:
    """The DLRM set names no process group on its NCCL kernels (PyTorch < 2.3), but c10d's `nccl:<op>`
    ranges enclose each launch: its 3 all-reduces (DDP) and 5 all-to-alls (embedding exchange) per rank
    match on all 8 ranks, clocks align to microseconds, and the rank the others wait for is named."""
    report = report_dict(api.analyze([KINETO / "param_dlrm_8rank"], jobs=1, timeline_excerpts=False))
    for dev in report["devices"]:
        assert set(dev["groups"]) == {"dp", "other"}
        peers = dev["evidence"]["peers"]
        assert peers["dp"]["matched"] == peers["dp"]["instances"] == 3
        assert peers["other"]["matched"] == peers["other"]["instances"] == 5
    all_m = report["metrics"]["all"]
    assert all_m["ranks.clock_residual_us"] < 50  # NCCL collectives end together on every member
    slowest = all_m["ranks.slowest"]
    waited = [sum(d["evidence"]["peers"]["other"]["waited_for_ms"].get(str(slowest), 0) for d in report["devices"])]
    assert waited[0] > 0 and all_m["ranks.late_ms"] > 0
    for m in report["metrics"]["ranks"].values():
        total = m["comm.other.exposed_ms"]
        assert m["comm.other.exposed_wait_ms"] + m["comm.other.exposed_transfer_ms"] == pytest.approx(total)
