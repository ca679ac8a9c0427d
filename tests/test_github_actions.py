"""docs/perfdoctor-pr-review.yml works as written: its shell steps (all but the GitHub API call) run on
the sample traces, tell findings (1) from bad input (2) and internal errors (3), and keep the PR comment
under GitHub's 65,536-character limit."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.paths import REPO, SAMPLES
from tests.test_docs_commands import _perfdoctor_on_path

WORKFLOW = yaml.safe_load((REPO / "docs" / "perfdoctor-pr-review.yml").read_text())
STEPS = WORKFLOW["jobs"]["perf-review"]["steps"]
RUN_URL = "https://github.com/example/repo/actions/runs/42"
COMMENT_LIMIT = 65536


def step(name_start: str) -> dict:
    (found,) = [s for s in STEPS if s.get("name", "").startswith(name_start)]
    return found


def run_step(s: dict, work: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """One `run:` step as the runner does it (`bash -e`), with GITHUB_OUTPUT and the job env."""
    return subprocess.run(["bash", "-e", "-c", s["run"]], cwd=work, env=env, capture_output=True, text=True,
                          timeout=600)


def outputs(work: Path) -> dict[str, str]:
    lines = (work / "github_output").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


@pytest.fixture()
def job(tmp_path):
    work = tmp_path / "job"
    (work / "traces").mkdir(parents=True)
    shutil.copytree(SAMPLES / "clean_baseline", work / "traces" / "nsys-base")
    shutil.copytree(SAMPLES / "exposed_dp", work / "traces" / "nsys-head")
    (work / "github_output").touch()
    env = _perfdoctor_on_path(tmp_path / "bin") | {"GITHUB_OUTPUT": str(work / "github_output"), "RUN_URL": RUN_URL}
    return work, env


def test_run_steps_use_no_expressions_and_install_from_the_checkout():
    """What the test runs is what GitHub runs: expressions only in env/with/if, never inside a script."""
    scripts = [s["run"] for s in STEPS if "run" in s]
    assert scripts and not any("${{" in text for text in scripts)
    assert step("Install perfdoctor")["run"] == "pip install ./perfdoctor-src"
    checkout = next(s for s in STEPS if s.get("uses", "").startswith("actions/checkout"))
    assert checkout["with"]["path"] == "perfdoctor-src" and "github.repository" in checkout["with"]["repository"]
    assert WORKFLOW["jobs"]["perf-review"]["env"]["RUN_URL"].startswith("${{ github.server_url }}")


def test_review_of_the_samples(job):
    work, env = job
    for name in ("Analyse head", "Analyse base", "Diff base", "Build the PR comment"):
        proc = run_step(step(name), work, env)
        assert proc.returncode == 0, f"{name}: {proc.stdout}{proc.stderr}"
    # exposed_dp has high-severity findings and is slower than clean_baseline: both flagged, the job goes on.
    assert outputs(work) == {"findings": "1", "regression": "1"}
    comment = (work / "comment.md").read_text(encoding="utf-8")
    assert comment.startswith((work / "diff.md").read_text(encoding="utf-8"))
    assert "exposed" in comment and len(comment) < COMMENT_LIMIT
    assert (work / "perfdoctor-head.html").is_file() and (work / "perfdoctor-diff.html").is_file()
    gate = step("Gate")
    assert gate["if"] == "steps.diff.outputs.regression == '1' || steps.head.outputs.findings == '1'"
    assert run_step(gate, work, env).returncode == 1


def test_bad_input_fails_the_step_with_2(job):
    work, env = job
    shutil.rmtree(work / "traces" / "nsys-head")
    (work / "traces" / "nsys-head").mkdir()
    (work / "traces" / "nsys-head" / "rank0.sqlite").write_text("version https://git-lfs.github.com/spec/v1\n")
    proc = run_step(step("Analyse head"), work, env)
    assert proc.returncode == 2
    assert "Git LFS pointer" in proc.stderr and "::error::perfdoctor: bad input" in proc.stdout
    assert outputs(work) == {}


def test_internal_error_fails_the_step_with_3(job, tmp_path):
    work, env = job
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "perfdoctor").write_text("#!/bin/sh\necho 'perfdoctor: internal error: boom' >&2\nexit 3\n")
    (broken / "perfdoctor").chmod(0o755)
    env = env | {"PATH": f"{broken}{os.pathsep}{env['PATH']}"}
    for name in ("Analyse head", "Analyse base", "Diff base"):
        proc = run_step(step(name), work, env)
        assert proc.returncode == 3, name
        assert "internal error (exit 3)" in proc.stdout


def test_long_comment_is_cut_below_the_limit_with_a_link(job):
    work, env = job
    (work / "diff.md").write_text("## diff\n" + "| a | b |\n" * 5000)
    (work / "head.md").write_text("## head\n" + ("| finding | " + "x" * 80 + " |\n") * 2000)
    proc = run_step(step("Build the PR comment"), work, env)
    assert proc.returncode == 0, proc.stderr
    comment = (work / "comment.md").read_text(encoding="utf-8")
    assert len(comment) < COMMENT_LIMIT
    assert comment.rstrip().endswith(f"perfdoctor-reports artifact of {RUN_URL}")
    assert comment.startswith("## diff\n")
