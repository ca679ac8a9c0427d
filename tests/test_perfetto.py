"""``--perfetto``: Chrome Trace Event Format JSON that Perfetto opens, checked against the format (required
fields per phase, matched B/E, ts monotonic per track, named processes and threads, properly nested slices,
flows that bind to slices) and against the report: every finding and every critical-path segment is drawn,
on the aligned clock, bounded for a 64-rank run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from perfdoctor import api
from perfdoctor.render.json import report_dict
from perfdoctor.render.perfetto import render_perfetto
from tests.paths import REAL_H100, REPO, SAMPLES

PHASES = {"X", "B", "E", "M", "s", "t", "f", "i", "I", "C"}
METADATA = {"process_name", "thread_name", "process_sort_index", "thread_sort_index"}
EPS = 1e-6  # µs: ts and dur are rounded to the ns


def check_trace(doc: dict[str, Any]) -> dict[str, Any]:
    """Assert ``doc`` is valid Chrome Trace Event Format JSON as Perfetto reads it; return its tracks:
    {"slices": {(pid, tid): [event]}, "threads": {(pid, tid): name}, "processes": {pid: name}}."""
    assert isinstance(doc["traceEvents"], list) and doc["traceEvents"]
    json.dumps(doc, allow_nan=False)  # no NaN / Infinity: strict JSON
    processes: dict[int, str] = {}
    threads: dict[tuple[int, int], str] = {}
    last_ts: dict[tuple[int, int], float] = {}
    open_b: dict[tuple[int, int], list[str]] = defaultdict(list)
    slices: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    flows: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
    for e in doc["traceEvents"]:
        assert e["ph"] in PHASES, e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        assert isinstance(e["name"], str), e
        track = (e["pid"], e["tid"])
        if e["ph"] == "M":
            assert e["name"] in METADATA and isinstance(e["args"], dict), e
            if e["name"] == "process_name":
                processes[e["pid"]] = e["args"]["name"]
            elif e["name"] == "thread_name":
                threads[track] = e["args"]["name"]
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        assert e["ts"] >= last_ts.get(track, 0.0) - EPS, f"ts goes back on track {threads.get(track)}: {e}"
        last_ts[track] = e["ts"]
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            assert isinstance(e.get("args", {}), dict)
            slices[track].append(e)
        elif e["ph"] == "B":
            open_b[track].append(e["name"])
        elif e["ph"] == "E":
            assert open_b[track], f"E without B: {e}"
            open_b[track].pop()
        elif e["ph"] in ("s", "f"):
            assert e["ph"] not in flows[e["id"]], f"two {e['ph']} for flow {e['id']}"
            flows[e["id"]][e["ph"]] = e
    assert not any(open_b.values()), "B without E"
    tracks = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] != "M"}
    assert {pid for pid, _ in tracks} <= processes.keys(), "a process without process_name"
    assert tracks <= threads.keys(), "a track without thread_name"
    for track, rows in slices.items():  # slices of one track nest: none crosses another
        ends: list[float] = []
        for e in rows:
            while ends and ends[-1] <= e["ts"] + EPS:
                ends.pop()
            assert not ends or e["ts"] + e["dur"] <= ends[-1] + EPS, f"slices cross on {threads[track]}: {e}"
            ends.append(e["ts"] + e["dur"])
    for fid, pair in flows.items():  # every flow starts and ends inside a slice of its track
        assert pair.keys() == {"s", "f"}, fid
        assert pair["f"].get("bp") == "e"
        for e in pair.values():
            assert any(x["ts"] - EPS <= e["ts"] <= x["ts"] + x["dur"] + EPS for x in slices[(e["pid"], e["tid"])]), e
    return {"slices": slices, "threads": threads, "processes": processes, "flows": flows}


def named(tracks: dict[str, Any], pid: int, prefix: str) -> list[dict[str, Any]]:
    """Slices of rank process ``pid`` on the tracks whose name starts with ``prefix`` (all lanes)."""
    return [e for (p, tid), rows in tracks["slices"].items() if p == pid
            and tracks["threads"][(p, tid)].startswith(prefix) for e in rows]


def pid_of(tracks: dict[str, Any], name: str) -> int:
    (pid,) = [p for p, n in tracks["processes"].items() if n == name]
    return pid


@cache
def analysed(sample: str) -> tuple[Any, dict[str, Any], str]:
    path = {"real_h100": REAL_H100, "kineto_h100": REPO / "tests" / "data" / "h100" / "gpt_eager.json.gz"}.get(
        sample, SAMPLES / sample)
    report = api.analyze([path], jobs=1, trace_excerpts=True)
    data = report_dict(report)
    return report, data, render_perfetto([("", data, report.run_trace)])


SAMPLE_RUNS = ["pp_1f1b", "per_node", "exposed_dp", "ln_blocked", "host_bound", "gc_jitter", "real_h100", "kineto_h100"]


@pytest.mark.parametrize("sample", SAMPLE_RUNS)
def test_sample_runs_are_valid_traces_with_every_finding(sample):
    report, data, text = analysed(sample)
    tracks = check_trace(json.loads(text))
    run = report.run_trace
    assert run is not None and run.excerpts
    for rank, ex in run.excerpts.items():
        pid = pid_of(tracks, f"rank {rank}")
        kernels = named(tracks, pid, "stream ")
        assert sum(e["args"].get("kernels", 0) for e in kernels) == ex.kernels.kernels  # merged, none lost
        assert all("category" in e["args"] for e in kernels)
        for e in kernels:
            if e["args"]["category"] == "comm" and report.run.config.get("tp"):
                assert e["args"].get("group"), e
        gaps = named(tracks, pid, f"{ex.thread_name or 'thread'} {ex.launch_tid} · host gaps")
        assert {e["args"]["cause"] for e in gaps} == {h["label"] for h in ex.kernels.highlights
                                                       if h["kind"] == "host_gap"}
        path = report.path.get(str(rank))  # the blocking path, else the measured stand-in
        assert len(named(tracks, pid, "critical path")) == (len(path) if path else sum(
            h["kind"] in ("exposed_comm", "bubble", "device_wait", "ln_blocked") for h in ex.kernels.highlights))
    for f in data["findings"]:
        for rank in f["ranks"] or run.excerpts:
            drawn = named(tracks, pid_of(tracks, f"rank {rank}"), f"finding: {f['rule']}")
            assert drawn and all(e["args"]["rule"] == f["rule"] for e in drawn), (f["rule"], rank)


def test_findings_span_the_time_they_explain():
    """exposed-dp-comm is drawn over the exposed DP comm of the step, not over the whole step (compared with
    the measured stand-in track, drawn when the report has no blocking path)."""
    report, data, _ = analysed("exposed_dp")
    tracks = check_trace(json.loads(render_perfetto([("", dict(data, path={}), report.run_trace)])))
    (rank,) = report.run_trace.excerpts
    pid = pid_of(tracks, f"rank {rank}")
    finding = named(tracks, pid, "finding: exposed-dp-comm")
    exposed = [e for e in named(tracks, pid, "critical path") if e["name"] == "exposed dp comm"]
    assert exposed and sorted((e["ts"], e["dur"]) for e in finding) == sorted((e["ts"], e["dur"]) for e in exposed)
    step = named(tracks, pid, "steps")[0]
    assert sum(e["dur"] for e in finding) < step["dur"]


def test_waits_point_to_the_peer_on_the_aligned_clock():
    report, data, text = analysed("per_node")
    doc = json.loads(text)
    tracks = check_trace(doc)
    run = report.run_trace
    assert run.waits and tracks["flows"]
    meta = doc["metadata"]["runs"][0]
    assert meta["clock_residual_us"] == data["metrics"]["all"]["ranks.clock_residual_us"]
    assert set(meta["clock"].values()) == {"collectives"}
    names = {pid: name for pid, name in tracks["processes"].items()}
    for pair in tracks["flows"].values():
        waiter = next(x for x in tracks["slices"][(pair["s"]["pid"], pair["s"]["tid"])]
                      if x["ts"] - EPS <= pair["s"]["ts"] <= x["ts"] + x["dur"] + EPS)
        assert waiter["name"].startswith("waiting for rank ")
        late = waiter["args"]["late_rank"]
        assert names[pair["f"]["pid"]] == f"rank {late}" and pair["f"]["pid"] != pair["s"]["pid"]
        # the peer arrived when the wait ended (nothing moves before the last member arrives)
        assert abs(pair["f"]["ts"] - (waiter["ts"] + waiter["dur"])) < 1.0


def test_every_path_segment_is_drawn_where_the_report_puts_it():
    """The report's blocking path (DESIGN §5 ``path``) replaces the measured stand-in; each segment is a
    slice of the rank's critical-path track at its time on the aligned clock, with its cause and what."""
    report, data, _ = analysed("per_node")
    data = dict(data)
    if not data.get("path"):  # until the blocking-path work lands: segments made from the drawn steps
        data["path"] = {str(r): [{"start_ns": ex.kernels.step_start_ns + i * 1000, "end_ns":
                                  ex.kernels.step_start_ns + (i + 1) * 1000, "rank": r, "cause": c, "what": w,
                                  "inferred": i % 2 == 1}
                                 for i, (c, w) in enumerate([("compute", "gemm"), ("waiting for rank 1", "dp"),
                                                             ("transfer dp", "all_reduce")])]
                         for r, ex in report.run_trace.excerpts.items()}
    doc = json.loads(render_perfetto([("", data, report.run_trace)]))
    tracks = check_trace(doc)
    origin = doc["metadata"]["runs"][0]["origin_utc_ns"]
    assert doc["metadata"]["runs"][0]["path"] == "report"
    for r, segments in data["path"].items():
        drawn = named(tracks, pid_of(tracks, f"rank {r}"), "critical path")
        assert len(drawn) == len(segments)
        clock = report.run_trace.clock_ns.get(int(r), 0)
        for seg, e in zip(sorted(segments, key=lambda s: s["start_ns"]), drawn):
            start = seg["start_ns"] + (clock if seg["start_ns"] < 10**17 else 0)
            assert abs(e["ts"] - (start - origin) / 1e3) < EPS
            assert (e["name"], e["args"]["what"], e["args"]["inferred"]) == (seg["cause"], seg["what"],
                                                                             bool(seg["inferred"]))


def test_a_saved_report_side_draws_its_path_and_findings_only():
    _, data, _ = analysed("exposed_dp")
    data = dict(data, path={"0": [{"start_ns": 5, "end_ns": 9, "rank": 0, "cause": "compute", "what": "gemm",
                                   "inferred": False}]})
    tracks = check_trace(json.loads(render_perfetto([("base", data, None)])))
    pid = pid_of(tracks, "base · rank 0")
    assert [e["name"] for e in named(tracks, pid, "critical path")] == ["compute"]
    assert named(tracks, pid, "finding: exposed-dp-comm")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "perfdoctor", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_diff_draws_both_runs_one_above_the_other(tmp_path):
    proc = _cli("diff", str(SAMPLES / "clean_baseline"), str(SAMPLES / "exposed_dp"), "--perfetto", "d.json",
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "d.json").read_text())
    tracks = check_trace(doc)
    base, head = pid_of(tracks, "base · rank 0"), pid_of(tracks, "head · rank 0")
    order = {e["pid"]: e["args"]["sort_index"] for e in doc["traceEvents"] if e["name"] == "process_sort_index"}
    assert order[base] < order[head]
    for pid, sample in ((base, "clean_baseline"), (head, "exposed_dp")):
        rules = {e["args"]["rule"] for e in named(tracks, pid, "finding: ")}
        assert rules == {f["rule"] for f in analysed(sample)[1]["findings"]}


def test_perfetto_output_never_replaces_an_input(tmp_path):
    trace = tmp_path / "run.sqlite"
    trace.write_bytes((SAMPLES / "exposed_dp" / "exposed_dp.rank0.sqlite").read_bytes())
    proc = _cli("analyze", str(trace), "--perfetto", str(trace), cwd=tmp_path)
    assert proc.returncode == 2 and "--perfetto" in proc.stderr and "Traceback" not in proc.stderr
    assert trace.read_bytes()[:15] == b"SQLite format 3"


@pytest.mark.slow
def test_64_ranks_stay_bounded_and_valid(tmp_path):
    """A simulated 64-rank run (TP=2, PP=2, DP=16; tests/data/scenarios/ranks64.yaml): every rank drawn,
    the file under the per-rank caps (docs/perfetto.md lists its measured size)."""
    proc = _cli("synth", str(REPO / "tests" / "data" / "scenarios" / "ranks64.yaml"), "-o", "run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = _cli("analyze", "run", "--perfetto", "run.json", "-j", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "run.json").read_text()
    doc = json.loads(text)
    tracks = check_trace(doc)
    assert sorted(tracks["processes"].values()) == sorted(f"rank {r}" for r in range(64))
    per_rank = defaultdict(int)
    for e in doc["traceEvents"]:
        per_rank[e["pid"]] += 1
    from perfdoctor.measure import excerpt, trace_excerpt

    cap = (trace_excerpt.MAX_RECTS + trace_excerpt.MAX_COPIES + trace_excerpt.MAX_CALLS + trace_excerpt.MAX_RANGES
           + excerpt.MAX_HIGHLIGHTS * 2 + trace_excerpt.MAX_WAITS * 4 + 200)
    assert max(per_rank.values()) < cap
    assert tracks["flows"]  # DP waits across nodes are drawn
    assert len(text) < 64 * cap * 400  # bytes: a few hundred per event at most
