"""`perfdoctor capture --profiler torch` pieces: the Kineto loader reading a capture's labels, marks and group
names (a hand-written GPU trace in the layout the hook writes), the scrubbing of Kineto traces, and the
fallback from a missing nsys. The real capture runs in tests/e2e/test_capture_torch_e2e.py."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from perfdoctor import api
from perfdoctor.capture import scrub
from perfdoctor.capture.hook import torch_profiler
from perfdoctor.capture.launcher import CaptureOptions, run_capture
from perfdoctor.errors import InputError
from perfdoctor.load.kineto import load_kineto
from perfdoctor.load.labels import config_mark, labelled, rank_mark
from perfdoctor.render.json import report_dict

PID, TID = 4242, 4242
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"


def _x(cat: str, name: str, ts: float, dur: float, args: dict | None = None, pid: int = PID, tid: int = TID) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args or {}}


def _launch(ts: float, corr: int) -> dict:
    return _x("cuda_runtime", "cudaLaunchKernel", ts, 4.0, {"correlation": corr})


def _kernel(name: str, ts: float, dur: float, corr: int, stream: int, pg: str | None = None) -> dict:
    args = {"device": 0, "stream": stream, "correlation": corr, "grid": [1, 1, 1], "block": [1, 1, 1]}
    if pg is not None:
        args.update({"Process Group Name": pg, "Process Group Description": "undefined", "Group size": 2})
    return _x("kernel", name, ts, dur, args, pid=0, tid=stream)


def captured_trace(path: Path, groups: dict[str, str] | None = None, cuda: bool = True) -> Path:
    """Two labelled steps of one rank as the hook writes them: a GEMM, an all-reduce launched inside a
    ``comm group=tp`` range, one launched outside any range on process group "3" (named pp by the hook),
    a GC pause and a data wait."""
    events = [{"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "ts": 0, "args": {"name": "python3"}}]
    for step, t0 in ((1, 1000.0), (2, 2000.0)):
        base = step * 10
        events += [_x("user_annotation", f"step n={step}", t0, 1000.0),
                   _x("user_annotation", "data", t0 + 5, 40.0),
                   _x("user_annotation", "gc gen=0", t0 + 60, 30.0),
                   _x("cpu_op", "aten::mm", t0 + 100, 20.0), _launch(t0 + 110, base + 1),
                   _x("user_annotation", "comm op=all_reduce group=tp bytes=4096 size=2", t0 + 200, 30.0),
                   _launch(t0 + 210, base + 2), _launch(t0 + 300, base + 3)]
        if cuda:
            events += [_kernel(GEMM, t0 + 120, 300.0, base + 1, 7),
                       _kernel(NCCL, t0 + 430, 100.0, base + 2, 20, pg="2"),
                       _kernel(NCCL, t0 + 540, 100.0, base + 3, 20, pg="3")]
    meta = {"version": 1, "rank": {"r": 1, "local": 1, "world": 2}, "config": {"tp": 2, "gpu": "NVIDIA H100"},
            "groups": groups if groups is not None else {"2": "tp", "3": "pp"}, "activities": ["cpu", "cuda"]}
    trace = {"schemaVersion": 1, "deviceProperties": [], "perfdoctor": meta,
             "distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 2}, "baseTimeNanoseconds": 10**18,
             "traceEvents": events}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps(trace, indent=2).encode()))
    return path


def test_the_capture_labels_are_perfdoctor_labels(tmp_path: Path) -> None:
    info, (tl,) = load_kineto(captured_trace(tmp_path / "rank1.pt.trace.json.gz"))
    assert sorted(labelled(tl.nvtx, "step")["text"]) == ["step n=1", "step n=2"]
    assert len(labelled(tl.nvtx, "gc")) == 2 and len(labelled(tl.nvtx, "data")) == 2
    assert len(labelled(tl.nvtx, "aten::mm")) == 0  # profiler ops stay in the default domain
    assert rank_mark(tl) == {"r": 1, "local": 1, "world": 2}
    assert config_mark(tl) == {"tp": 2, "gpu": "NVIDIA H100"}
    assert info.capture_groups == {"2": "tp", "3": "pp"}
    assert not any("garbage collection" in w for w in info.warnings)  # the hook records GC


def test_group_labels_come_from_the_capture(tmp_path: Path) -> None:
    """The all-reduce inside the comm range is tp by that range; the one outside any range is pp by the
    hook's name for its process group; without that name it falls to the later sources."""
    captured_trace(tmp_path / "run" / "rank1.pt.trace.json.gz")
    report = report_dict(api.analyze([tmp_path / "run"], timeline_excerpts=False))
    (dev,) = report["devices"]
    assert set(dev["groups"]) == {"tp", "pp"}
    for group in ("tp", "pp"):
        assert set(dev["groups"][group]["label_source"]) == {"capture"}
    assert report["steps"]["source"] == "nvtx-step" and report["steps"]["count"] == 2
    assert report["run"]["config_sources"]["tp"] == "nvtx-mark"

    captured_trace(tmp_path / "bare" / "rank1.pt.trace.json.gz", groups={})
    (dev,) = report_dict(api.analyze([tmp_path / "bare"], timeline_excerpts=False))["devices"]
    by_source: dict[str, int] = {}
    for info in dev["groups"].values():
        for source, tally in info["label_source"].items():
            by_source[source] = by_source.get(source, 0) + tally["kernels"]
    assert by_source["capture"] == 2 and sum(by_source.values()) == 4  # one in a comm range per step


def test_a_cpu_only_capture_is_a_host_timeline(tmp_path: Path) -> None:
    info, (tl,) = load_kineto(captured_trace(tmp_path / "rank1.pt.trace.json.gz", cuda=False))
    assert tl.device_id is None and not info.has_cuda and len(tl.kernels) == 0
    assert any("no CUDA data" in w for w in info.warnings)
    assert len(labelled(tl.nvtx, "step")) == 2


def test_a_foreign_cpu_only_trace_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": [_x("cpu_op", "aten::mm", 1.0, 2.0)]}))
    with pytest.raises(InputError, match="without GPU events"):
        load_kineto(path)


def test_metadata_strings_hold_no_quotes_or_backslashes() -> None:
    """Kineto turns backslashes in a metadata value into slashes: a quote escaped inside a string would
    end it early, so the hook's strings carry neither."""
    meta = torch_profiler.trace_metadata(["rank r=0 local=0 world=2", 'config {"gpu":"A\\\\B \\"x\\""}'],
                                         {"0": "dp"}, 0, ["cpu"])
    text = json.dumps(torch_profiler._plain(meta))
    assert "\\" not in text and meta["rank"] == {"r": 0, "local": 0, "world": 2}
    assert json.loads(text)["config"]["gpu"] == "A/B 'x'"


def test_kineto_traces_are_scrubbed_string_by_string(tmp_path: Path) -> None:
    secrets = {"tok-12345678", "pw-abcdefgh"}
    trace = {"schemaVersion": 1, "perfdoctor": {"version": 1, "note": "MY_API_TOKEN=tok-12345678"},
             "traceEvents": [_x("user_annotation", "run --password pw-abcdefgh now", 1.0, 2.0),
                             _x("cpu_op", "aten::mm", 3.0, 1.0, {"url": "https://bob:pw-abcdefgh@host/x"}),
                             _x("cpu_op", 'quoted "key" \\ back', 4.0, 1.0)]}
    raw = tmp_path / "raw.json"
    raw.write_text(json.dumps(trace, indent=2) + "\n")
    target = tmp_path / "clean.pt.trace.json.gz"
    assert scrub.scrub_kineto(raw, target, secrets) == 3
    data = gzip.decompress(target.read_bytes())
    assert not [s for s in secrets if s.encode() in data]
    clean = json.loads(data)
    assert clean["traceEvents"][0]["name"] == "run --password <redacted> now"
    assert clean["traceEvents"][1]["args"]["url"] == "https://<redacted>@host/x"
    assert clean["traceEvents"][2]["name"] == 'quoted "key" \\ back'  # nothing to hide: left as it was
    assert not list(tmp_path.glob(".*"))


def test_a_missing_nsys_falls_back_to_the_pytorch_profiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """auto: one line says why, then the command runs with the torch hook; --profiler nsys insists."""
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))  # python, but no nsys
    said: list[str] = []
    program = "import os; print(os.environ['PERFDOCTOR_PROFILER'])"
    result = run_capture(CaptureOptions(command=[sys.executable, "-c", program], out=tmp_path / "run"), said.append)
    assert result.exit_code == 0 and result.profiler == "torch"
    assert len([s for s in said if "PyTorch profiler instead" in s]) == 1 and "not found" in said[0]
    manifest = json.loads(result.manifest.read_text())
    assert manifest["profiler"] == "torch" and manifest["nsys"] is None
    assert any("no rank wrote a PyTorch profiler trace" in n for n in manifest["notes"])
    with pytest.raises(InputError, match="not found"):
        run_capture(CaptureOptions(command=[sys.executable, "-c", "pass"], out=tmp_path / "run2", profiler="nsys"))
    assert not (tmp_path / "run2").exists()


RANK_PROGRAM = """
import sys, tempfile, time
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    model(torch.ones(4)).sum().backward()
    dist.all_reduce(model.weight.grad)
    optimizer.step()
print("ready", flush=True)
time.sleep(120)
"""


def test_sigint_inside_the_window_still_leaves_a_scrubbed_trace(tmp_path: Path) -> None:
    """Ctrl-C while the window is open: passed to the rank, whose exit exports what it recorded; capture
    scrubs it, and the exit code is not 0."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "perfdoctor", "capture", "--profiler", "torch", "--out", str(run),
                             "--steps", "2-9", "--", sys.executable, "-c", RANK_PROGRAM],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "MY_API_TOKEN": "tok-sigint-12345"})
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0, err
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["interrupted_by"] == "SIGINT" and manifest["interrupted_during"] == "training"
    assert manifest["files"] == ["rank0.pt.trace.json.gz", "ranks/rank0.json"]
    assert not [p for p in run.iterdir() if p.name.startswith(".")]
    info, (tl,) = load_kineto(run / "rank0.pt.trace.json.gz")
    assert sorted(labelled(tl.nvtx, "step")["text"]) == ["step n=2", "step n=3", "step n=4"]  # 4: ends at exit
    assert labelled(tl.nvtx, "comm")["text"][0].startswith("comm op=all_reduce group=dp")


def test_a_training_python_without_torch_is_refused(tmp_path: Path) -> None:
    from perfdoctor.capture import preflight
    from perfdoctor.capture.command import parse_launch
    from perfdoctor.capture.launcher import PACKAGE_ROOT

    (tmp_path / "torch.py").write_text("raise ImportError('no torch in this environment')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    launch = parse_launch([sys.executable, "train.py"])
    with pytest.raises(InputError, match="cannot run in the training Python .*no torch in this environment"):
        preflight.check_torch_profiler(launch, env, PACKAGE_ROOT)
    assert "Kineto" in preflight.check_torch_profiler(launch, dict(os.environ), PACKAGE_ROOT)


def test_sigterm_while_scrubbing_deletes_what_is_not_scrubbed(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The export phase of --profiler torch: the trace being scrubbed is finished, the rest deleted unread."""
    from perfdoctor.capture import launcher
    from perfdoctor.capture.interrupts import Interrupts

    for rank in (0, 1):
        captured_trace(tmp_path / torch_profiler.unscrubbed_name(rank))
    real = scrub.scrub_kineto

    def scrub_then_sigterm(source: Path, target: Path, secrets: set[str]) -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        return real(source, target, secrets)

    monkeypatch.setattr(scrub, "scrub_kineto", scrub_then_sigterm)
    notes: list[str] = []
    with Interrupts(lambda line: None) as interrupts:
        traces = launcher._scrub_traces(tmp_path, set(), interrupts, notes, lambda line: None)
    assert [p.name for p in traces] == ["rank0.pt.trace.json.gz"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.pt.trace.json.gz"]
    assert notes == ["rank1.pt.trace.json.gz deleted unscrubbed (SIGTERM during the scrubbing)"]
    assert interrupts.exit_code(0) == 128 + signal.SIGTERM


def test_the_training_codes_own_profiler_is_left_alone(tmp_path: Path) -> None:
    """A PyTorch profiler already running when the window opens belongs to the training code: the hook
    starts none (which would take its session over), says so once, and records why."""
    program = f"""
import json, torch
from torch.profiler import profile, ProfilerActivity
from perfdoctor.capture.hook import runtime
hook = runtime.Hook({{runtime.ENV_RUN_DIR: {str(tmp_path)!r}, runtime.ENV_PROFILER: "torch"}})
hook.torch = torch
theirs = profile(activities=[ProfilerActivity.CPU])
theirs.start()
hook._start_kineto()
theirs.stop()
print(json.dumps({{"kineto": hook.kineto is not None, "by": hook.profiler["by"]}}))
"""
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {"kineto": False, "by": "training code"}
    assert "runs its own PyTorch profiler" in proc.stderr
