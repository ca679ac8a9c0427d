"""perfdoctor diff: a regression is reported with its cause and fails CI; seed-to-seed jitter is not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from perfdoctor import api
from perfdoctor.diff import compare, diff_dict
from perfdoctor.synth import run_scenario
from tests.paths import REPO, SAMPLES

SCENARIOS = REPO / "perfdoctor" / "synth" / "scenarios"


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("diff_runs")
    out = {}
    for name, scenario, seed in (("clean_a", "clean_baseline", 11), ("clean_b", "clean_baseline", 12),
                                 ("dp", "exposed_dp", 11)):
        run_scenario(SCENARIOS / f"{scenario}.yaml", root / name, seed=seed)
        out[name] = root / name
    return out


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "perfdoctor", *args], capture_output=True, text=True, timeout=300)


def test_exposed_dp_is_a_regression_with_the_right_cause(runs):
    d = api.diff(runs["clean_a"], runs["dp"])
    by_key = {m.key: m for m in d.metrics}
    assert d.step.verdict == "worse" and d.step_regression_pct > 50
    assert by_key["comm.dp.exposed_ms"].verdict == "worse"
    assert by_key["comm.dp.exposed_ms"].delta > 0.5 * d.step.delta  # the step grew because DP comm is exposed
    if api.analyze([runs["dp"]]).findings:  # once the rule engine runs in analyze: new, or much larger
        grew = {h["rule"] for b, h in d.changed_findings if h["impact_ms_per_step"] > b["impact_ms_per_step"]}
        assert "exposed-dp-comm" in {f["rule"] for f in d.new_findings} | grew


def test_two_seeds_of_one_scenario_are_not_a_change(runs):
    d = api.diff(runs["clean_a"], runs["clean_b"])
    assert d.step.base != d.step.head  # the seeds do differ...
    assert d.step_regression_pct == 0.0 and not d.significant  # ...but only by noise
    assert not d.new_findings and not d.resolved_findings


def test_cli_fail_on_regression_and_outputs(runs, tmp_path):
    html, md = tmp_path / "d.html", tmp_path / "d.md"
    bad = _cli("diff", str(runs["clean_a"]), str(runs["dp"]), "--fail-on-regression", "5", "--format", "json",
               "--html", str(html), "--markdown", str(md), "--plotly-js", "cdn")
    assert bad.returncode == 1, bad.stderr
    assert "regressed" in bad.stderr
    out = json.loads(bad.stdout)
    assert out["step"]["verdict"] == "worse" and out["step_regression_pct"] > 5
    assert "Step time slower (regression)" in md.read_text() and "<h1>perfdoctor diff</h1>" in html.read_text()
    ok = _cli("diff", str(runs["clean_a"]), str(runs["clean_b"]), "--fail-on-regression", "5")
    assert ok.returncode == 0, ok.stderr
    assert "No significant step-time change" in ok.stdout.replace("\n", " ")


def test_json_reports_as_inputs(runs, tmp_path):
    paths = []
    for name in ("clean_a", "dp"):
        path = tmp_path / f"{name}.json"
        done = _cli("analyze", str(runs[name]), "--format", "json", "-o", str(path))
        assert done.returncode == 0, done.stderr
        paths.append(path)
    from_json = diff_dict(api.diff(*paths))
    from_traces = diff_dict(api.diff(runs["clean_a"], runs["dp"]))
    assert from_json["metrics"] == from_traces["metrics"]


def test_bad_inputs_are_one_line_errors(tmp_path):
    not_report = tmp_path / "x.json"
    not_report.write_text('{"hello": 1}')
    done = _cli("diff", str(not_report), str(SAMPLES / "exposed_dp"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "not a perfdoctor report" in done.stderr
    done = _cli("diff", str(SAMPLES / "exposed_dp"), str(SAMPLES / "exposed_dp"), "--fail-on-regression", "-1")
    assert done.returncode == 2


def test_noise_from_series_and_floors():
    def report(steps: list[float], exposed: list[float]) -> dict:
        med = sorted(steps)[len(steps) // 2]
        return {"steps": {"count": len(steps)}, "run": {"config": {}},
                "metrics": {"all": {"step.time_ms": med, "kernels.count_per_step": 100.0}},
                "series": {"0": {"step.time_ms": steps, "comm.exposed_ms": exposed}}, "findings": []}

    jittery = compare(report([100, 110, 90, 105, 95], [1] * 5), report([104, 114, 94, 109, 99], [1] * 5))
    assert jittery.step.noise > 2 and not jittery.step.significant  # 4 ms within 10 ms jitter
    steady = compare(report([100.0, 100.1, 99.9], [1] * 3), report([104.0, 104.1, 103.9], [1] * 3))
    assert steady.step.significant and steady.step.verdict == "worse"
    assert steady.step_regression_pct == pytest.approx(4.0)
