"""``perfdoctor diff`` of captures without steps: compared per unit of work, or said not comparable.

Simulated runs without any step marker are cut to a 40 ms window that starts 20 ms into the first
iteration (shorter than an iteration, so no optimizer burst and no periodic steps), as a fixed-length
``nsys --delay/--duration`` capture does. Ground truth: the head's GEMMs are planted slower by the ratio
of GEMM efficiencies, so the time per unit of work must grow by that ratio weighted by the GEMM share of
the base window's compute-kernel time, recomputed here from the base SQLite file.

The real 300 ms window of a 2×H100 training run (``sample_traces/real_h100/h100_2gpu_fastvideo.sqlite``) gives
the issue's own case: an "after" capture made by running every event 1/0.88 times slower and cutting it
to the same 300 ms holds 12 % fewer layers; its two halves are the same run.
"""

from __future__ import annotations

import copy
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from perfdoctor import api
from perfdoctor.diff import compare, diff_dict
from perfdoctor.render.diff_markdown import render_diff_markdown, verdict_line
from perfdoctor.synth import run_scenario
from perfdoctor.synth.window import EVENT_TABLES, cut_window
from tests.paths import REAL_H100, TRACES

BASE = {
    "name": "win",
    "model": {"layers": 4, "hidden": 2048, "heads": 16, "kv_heads": 4, "ffn_hidden": 8192, "seq_length": 4096,
              "vocab": 32000, "num_microbatches": 4},
    "parallel": {"tp": 1, "dp": 2},
    "labels": {"perfdoctor": False, "nccl": False},
    "output": {"schema": "2024.2", "window_ms": 40, "window_start_ms": 20},
    "run": {"steps": 2},
}
GEMM_EFFICIENCY = 0.72  # the simulated H100's default (synth/gpu.py)
SLOW_GEMM = 0.62


def _variant(**sections) -> dict:
    sc = copy.deepcopy(BASE)
    for section, values in sections.items():
        sc.setdefault(section, {}).update(values)
    return sc


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("window_runs")
    out = {}
    for name, sc, seed in (("base", BASE, 1), ("same", BASE, 2),
                           ("slow", _variant(gpu={"gemm_efficiency": SLOW_GEMM}), 1),
                           ("other_kernels", _variant(kernels={"gemm": "cutlass", "attention": "cudnn"}), 1),
                           ("marked", _variant(labels={"perfdoctor": True}, output={"window_ms": 0}), 1),
                           ("marked_more_work", _variant(labels={"perfdoctor": True}, output={"window_ms": 0},
                                                         model={"num_microbatches": 8}), 1)):
        run_scenario(sc, root / name, seed=seed)
        out[name] = root / name
    return out


def _window_kernel_ns(run: Path) -> tuple[float, float]:
    """GEMM and all compute-kernel ns of a window, straight from the SQLite file (independent of perfdoctor)."""
    (path,) = run.glob("*.sqlite")
    con = sqlite3.connect(path)
    rows = con.execute("SELECT s.value, k.end - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                       "JOIN StringIds s ON s.id = k.shortName").fetchall()
    con.close()
    compute = [(n, d) for n, d in rows if not n.startswith("nccl")]
    return sum(d for n, d in compute if n.startswith("nvjet")), sum(d for _, d in compute)


def test_window_only_captures_have_no_steps(runs):
    report = api.analyze([runs["base"]])
    assert {d.step_source for d in report.devices} == {"window"}
    truth = json.loads(next(runs["base"].glob("*.truth.json")).read_text())
    assert truth["window"]["end_ns"] - truth["window"]["start_ns"] == 40_000_000


def test_different_throughput_is_a_regression_per_unit_of_work(runs):
    d = api.diff(runs["base"], runs["slow"])
    assert d.basis.kind == "per unit of work"
    gemm_ns, compute_ns = _window_kernel_ns(runs["base"])
    want = 1 + (GEMM_EFFICIENCY / SLOW_GEMM - 1) * gemm_ns / compute_ns
    assert d.step.key == "work.unit_ms" and d.step.head / d.step.base == pytest.approx(want, rel=0.03)
    assert d.step.verdict == "worse" and d.step_regression_pct > 5
    assert d.basis.head_units < 0.95 * d.basis.base_units  # less work fitted into the head's window
    line = verdict_line(d)
    assert "No significant" not in line and "slower" in line and "unit of work" in line
    assert diff_dict(d)["basis"]["kind"] == "per unit of work"


def test_same_throughput_is_no_change_per_unit_of_work(runs):
    d = api.diff(runs["base"], runs["same"])
    assert d.basis.kind == "per unit of work"
    assert d.step.head / d.step.base == pytest.approx(1.0, abs=0.03)
    assert not d.step.significant and d.step_regression_pct == 0.0
    # totals are per unit of work: the busy compute time per unit is the same, not "better" or "worse"
    by_key = {m.key: m for m in d.metrics}
    assert by_key["compute.time_ms"].verdict in ("same", "changed") and not by_key["compute.time_ms"].significant


def test_different_kernels_are_not_comparable(runs, tmp_path):
    d = api.diff(runs["base"], runs["other_kernels"])
    assert d.basis.kind == "not comparable" and d.step is None
    assert verdict_line(d).startswith("Not comparable") and "different kernels" in d.basis.reason
    assert not any(m.key.endswith("_ms") or m.key.endswith("per_step") for m in d.metrics)
    assert "Not comparable" in render_diff_markdown(d)
    done = subprocess.run([sys.executable, "-m", "perfdoctor", "diff", str(runs["base"]), str(runs["other_kernels"]),
                           "--fail-on-regression", "5"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "not comparable" in done.stderr
    assert "no significant" not in done.stdout.lower()


def test_step_markers_compare_steps_and_say_when_work_per_step_differs(runs):
    same = api.diff(runs["marked"], runs["marked"])
    assert same.basis.kind == "steps" and not any("different work" in n for n in same.notes)
    more = api.diff(runs["marked"], runs["marked_more_work"])
    assert more.basis.kind == "steps" and more.step.key == "step.time_ms"
    assert more.basis.head_units == pytest.approx(2 * more.basis.base_units, rel=0.15)  # twice the microbatches
    assert any("different work" in n for n in more.notes)


def _report(source: str, metrics: dict, findings: list[dict]) -> dict:
    return {"steps": {"count": 5, "source": source}, "run": {"config": {}}, "metrics": {"all": metrics},
            "series": {}, "findings": findings}


def test_resolved_only_when_the_metric_behind_the_finding_improved():
    finding = {"rule": "host-launch-bound", "severity": "high", "summary": "x", "impact_ms_per_step": 20.0}
    base = _report("nvtx-step", {"step.time_ms": 100.0, "host.launch_bound_ms": 20.0}, [finding])
    fixed = _report("nvtx-step", {"step.time_ms": 82.0, "host.launch_bound_ms": 2.0}, [])
    idler = _report("nvtx-step", {"step.time_ms": 100.0, "host.launch_bound_ms": 19.5}, [])
    rules = {"host-launch-bound": "host.launch_bound_ms"}
    assert [f["rule"] for f in compare(base, fixed, impact_metrics=rules).resolved_findings] == ["host-launch-bound"]
    d = compare(base, idler, impact_metrics=rules)
    assert not d.resolved_findings and [f["rule"] for f, _ in d.gone_findings] == ["host-launch-bound"]
    assert "did not improve" in d.gone_findings[0][1]
    assert diff_dict(d)["findings"]["gone_unresolved"][0]["rule"] == "host-launch-bound"
    assert "not resolved" in render_diff_markdown(d)
    unknown = compare(base, idler)  # a rule outside the catalog: its metric is unknown, so never "resolved"
    assert not unknown.resolved_findings and "unknown" in unknown.gone_findings[0][1]


REAL = REAL_H100


def _real_copy(tmp: Path, name: str) -> tuple[Path, int, int]:
    (tmp / name).mkdir()
    path = tmp / name / "w.sqlite"
    shutil.copy(REAL, path)
    path.chmod(0o644)
    con = sqlite3.connect(path)
    lo, hi = con.execute("SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    con.close()
    return path, lo, hi


def _slow_down(path: Path, origin: int, factor: float) -> None:
    """Every event after ``origin`` runs ``factor`` times slower (starts and ends stretched from ``origin``)."""
    con = sqlite3.connect(path)
    present = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    with con:
        for table in (t for t in (*EVENT_TABLES, "NVTX_EVENTS") if t in present):
            con.execute(f"UPDATE {table} SET start = ?1 + CAST((start - ?1) * ?2 AS INTEGER), "
                        "end = CASE WHEN end IS NULL THEN NULL ELSE ?1 + CAST((end - ?1) * ?2 AS INTEGER) END "
                        "WHERE start >= ?1", (origin, factor))
    con.close()


def test_real_300ms_windows_with_fewer_layers_after_are_a_regression(tmp_path):
    slow, lo, hi = _real_copy(tmp_path, "after")
    _slow_down(slow, lo, 1 / 0.88)
    cut_window(slow, lo, hi)  # the same 300 ms capture: 12 % less work fits
    d = api.diff(REAL, slow.parent)
    assert d.basis.kind == "per unit of work"
    assert d.basis.head_units / d.basis.base_units == pytest.approx(0.88, abs=0.02)
    assert d.step.head / d.step.base == pytest.approx(1 / 0.88, rel=0.03) and d.step.verdict == "worse"
    assert "No significant" not in verdict_line(d)


def test_real_window_halves_are_the_same_run(tmp_path):
    first, lo, hi = _real_copy(tmp_path, "first")
    second, _, _ = _real_copy(tmp_path, "second")
    cut_window(first, lo, (lo + hi) // 2)
    cut_window(second, (lo + hi) // 2, hi)
    d = api.diff(first.parent, second.parent)
    assert d.basis.kind == "per unit of work" and d.basis.shared > 0.9
    assert not d.step.significant and d.step.head / d.step.base == pytest.approx(1.0, abs=0.06)
    other = api.diff(REAL, TRACES / "nsys" / "pipit_cloverleaf.sqlite")  # a CUDA mini-app, not this job
    assert other.basis.kind == "not comparable" and other.step is None
