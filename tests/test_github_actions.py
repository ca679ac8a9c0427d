"""The composite action (.github/actions/perfdoctor/action.yml) works as written: its steps run here as the
runner runs them (``bash --noprofile --norc -eo pipefail``, inputs reaching the scripts through each step's
``env``, step outputs through GITHUB_OUTPUT, ``if:`` conditions evaluated), on the sample traces — all but
the installation (perfdoctor is on PATH already: the installed wheel under .ci/run), the artifact upload
(another action) and the GitHub API call. docs/perfdoctor-pr-review.yml uses the action from a checkout."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.paths import REPO, SAMPLES
from tests.test_docs_commands import _perfdoctor_on_path

ACTION_DIR = REPO / ".github" / "actions" / "perfdoctor"
ACTION = yaml.safe_load((ACTION_DIR / "action.yml").read_text())
STEPS = ACTION["runs"]["steps"]
WORKFLOW = yaml.safe_load((REPO / "docs" / "perfdoctor-pr-review.yml").read_text())
GITHUB = {"server_url": "https://github.com", "repository": "example/repo", "run_id": "42", "token": "t",
          "event_name": "pull_request", "event": {"pull_request": {"number": "7"}}}
RUN_URL = "https://github.com/example/repo/actions/runs/42"
ARTIFACT_URL = "https://github.com/example/repo/actions/runs/42/artifacts/9"
COMMENT_LIMIT = 65536
NOT_RUN = ("Install perfdoctor", "Post the PR comment")  # a pip install of the repository; the GitHub API


def _lookup(ctx: dict[str, Any], dotted: str) -> Any:
    value: Any = ctx
    for part in dotted.split("."):
        value = value.get(part, "") if isinstance(value, dict) else ""
    return value


def expand(text: str, ctx: dict[str, Any]) -> str:
    """``${{ a.b }}`` replaced by its value (only plain context look-ups are used in the action)."""
    return re.sub(r"\$\{\{\s*([\w.-]+)\s*\}\}", lambda m: str(_lookup(ctx, m.group(1))), text)


def condition(text: str, ctx: dict[str, Any]) -> bool:
    """An ``if:`` of look-ups compared with string literals, joined by && / ||."""
    py = re.sub(r"\b(inputs|steps|github)((?:\.[\w-]+)+)", lambda m: repr(_lookup(ctx, m.group(0))), text)
    py = py.replace("&&", " and ").replace("||", " or ")
    assert re.fullmatch(r"[\s'\w./:=!-]*", py.replace(" and ", " ").replace(" or ", " ")), text
    return bool(eval(py, {"__builtins__": {}}))  # noqa: S307 - literals and comparisons only (checked above)


def run_action(inputs: dict[str, str], work: Path, env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """Run the steps in order until one fails; the exit code (0: all passed) and the contexts."""
    given = {name: spec.get("default", "") for name, spec in ACTION["inputs"].items()} | inputs
    ctx: dict[str, Any] = {"inputs": given, "steps": {}, "github": GITHUB}
    summary = work / "step_summary.md"
    for i, step in enumerate(STEPS):
        if "if" in step and not condition(step["if"], ctx):
            continue
        if step["name"].startswith(NOT_RUN):
            continue
        outputs: dict[str, str] = {}
        if "uses" in step:  # the upload: its files exist, and it gives the artifact's URL
            paths = expand(step["with"]["path"], ctx).split()
            assert all(list(work.glob(p)) for p in paths), paths
            outputs = {"artifact-url": ARTIFACT_URL}
        else:
            out_file = work / f"github_output_{i}"
            out_file.touch()
            step_env = env | {k: expand(str(v), ctx) for k, v in (step.get("env") or {}).items()} | {
                "GITHUB_OUTPUT": str(out_file), "GITHUB_STEP_SUMMARY": str(summary),
                "GITHUB_ACTION_PATH": str(ACTION_DIR)}
            assert step["shell"] == "bash"
            proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=work,
                                  env=step_env, capture_output=True, text=True, timeout=600)
            ctx.setdefault("log", []).append(proc.stdout + proc.stderr)
            outputs = dict(line.split("=", 1) for line in out_file.read_text().splitlines() if "=" in line)
            if proc.returncode:
                ctx["steps"][step.get("id", step["name"])] = {"outputs": outputs}
                return proc.returncode, ctx
        ctx["steps"][step.get("id", step["name"])] = {"outputs": outputs}
    return 0, ctx


@pytest.fixture()
def job(tmp_path):
    work = tmp_path / "job"
    (work / "traces").mkdir(parents=True)
    shutil.copytree(SAMPLES / "clean_baseline", work / "traces" / "nsys-base")
    shutil.copytree(SAMPLES / "exposed_dp", work / "traces" / "nsys-head")
    return work, _perfdoctor_on_path(tmp_path / "bin")


def test_run_steps_use_no_expressions_and_install_from_the_actions_repository():
    """What the test runs is what GitHub runs: expressions only in env/with/if, never inside a script."""
    scripts = [s["run"] for s in STEPS if "run" in s]
    assert scripts and not any("${{" in text for text in scripts)
    install = next(s for s in STEPS if s["name"].startswith("Install perfdoctor"))
    assert install["run"] == 'python3 -m pip install --quiet "$GITHUB_ACTION_PATH/../../.."'
    assert (ACTION_DIR / "../../..").resolve() == REPO.resolve() and (REPO / "pyproject.toml").is_file()
    assert ACTION["runs"]["using"] == "composite"


def test_the_example_workflow_uses_the_action_from_a_checkout():
    steps = WORKFLOW["jobs"]["perf-review"]["steps"]
    checkout = next(s for s in steps if s.get("uses", "").startswith("actions/checkout"))
    assert checkout["with"]["path"] == "perfdoctor-src" and "github.repository" in checkout["with"]["repository"]
    (action,) = [s for s in steps if s.get("uses", "").endswith("/.github/actions/perfdoctor")]
    assert action["uses"] == "./perfdoctor-src/.github/actions/perfdoctor"
    assert set(action["with"]) <= set(ACTION["inputs"])
    assert {k for k, v in ACTION["inputs"].items() if v.get("required")} <= set(action["with"])


def test_review_of_the_samples(job):
    work, env = job
    before = sorted(p.name for p in (work / "traces").rglob("*"))
    rc, ctx = run_action({"traces": "traces/nsys-head", "base": "traces/nsys-base", "fail-on": "high",
                          "fail-on-regression": "5"}, work, env)
    # exposed_dp has high-severity findings and is slower than clean_baseline: both flagged, the summary and
    # the comment are written, then the gate fails the job
    assert rc == 1, ctx.get("log")
    assert ctx["steps"]["head"]["outputs"]["findings"] == "1"
    assert ctx["steps"]["diff"]["outputs"]["regression"] == "1"
    assert "Gate" in ctx["steps"]
    out = work / "perfdoctor-reports"
    comment = (out / "comment.md").read_text(encoding="utf-8")
    assert comment.startswith((out / "diff.md").read_text(encoding="utf-8"))
    assert "exposed" in comment and len(comment) < COMMENT_LIMIT
    assert comment.rstrip().endswith(f"HTML reports: [perfdoctor-reports]({ARTIFACT_URL}) (artifact of this run)")
    assert (work / "step_summary.md").read_text(encoding="utf-8") == comment
    assert ctx["steps"]["comment"]["outputs"]["file"] == str(Path("perfdoctor-reports") / "comment.md")
    for name in ("perfdoctor-head.html", "perfdoctor-diff.html", "perfdoctor-head.perfetto.json"):
        assert (out / name).is_file(), name
    assert sorted(p.name for p in (work / "traces").rglob("*")) == before  # nothing written beside the inputs


def test_analysis_only_passes_without_gates(job):
    work, env = job
    rc, ctx = run_action({"traces": "traces/nsys-base"}, work, env)
    assert rc == 0, ctx.get("log")
    assert "diff" not in ctx["steps"] and "Gate" not in ctx["steps"]
    comment = (work / "perfdoctor-reports" / "comment.md").read_text(encoding="utf-8")
    assert comment.startswith((work / "perfdoctor-reports" / "head.md").read_text(encoding="utf-8"))


def test_a_saved_base_report_is_diffed_as_it_is(job):
    work, env = job
    rc, ctx = run_action({"traces": "traces/nsys-base"}, work, env)
    assert rc == 0
    shutil.copyfile(work / "perfdoctor-reports" / "head.json", work / "main.json")
    rc, ctx = run_action({"traces": "traces/nsys-head", "base": "main.json", "fail-on-regression": "5"}, work, env)
    assert rc == 1 and ctx["steps"]["diff"]["outputs"]["regression"] == "1", ctx.get("log")


def test_bad_input_fails_the_step_with_2(job):
    work, env = job
    head = work / "traces" / "nsys-head"
    shutil.rmtree(head)
    head.mkdir()
    (head / "rank0.sqlite").write_text("version https://git-lfs.github.com/spec/v1\n")
    rc, ctx = run_action({"traces": "traces/nsys-head", "base": "traces/nsys-base"}, work, env)
    assert rc == 2
    assert "Git LFS pointer" in ctx["log"][-1] and "::error::perfdoctor: bad input" in ctx["log"][-1]
    assert "findings" not in ctx["steps"]["head"]["outputs"]


def test_internal_error_fails_the_step_with_3(job, tmp_path):
    work, env = job
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "perfdoctor").write_text("#!/bin/sh\necho 'perfdoctor: internal error: boom' >&2\nexit 3\n")
    (broken / "perfdoctor").chmod(0o755)
    env = env | {"PATH": f"{broken}{os.pathsep}{env['PATH']}"}
    rc, ctx = run_action({"traces": "traces/nsys-head"}, work, env)
    assert rc == 3 and "internal error (exit 3)" in ctx["log"][-1]


def test_long_comment_is_cut_below_the_limit_with_a_link(job):
    work, env = job
    out = work / "perfdoctor-reports"
    out.mkdir()
    (out / "diff.md").write_text("## diff\n" + "| a | b |\n" * 5000)
    (out / "head.md").write_text("## head\n" + ("| finding | " + "x" * 80 + " |\n") * 2000)
    (comment_step,) = [s for s in STEPS if s.get("id") == "comment"]
    ctx = {"inputs": {"output-dir": "perfdoctor-reports", "artifact-name": "perfdoctor-reports"},
           "steps": {"upload": {"outputs": {"artifact-url": ""}}}, "github": GITHUB}
    (work / "out").touch()
    step_env = env | {k: expand(str(v), ctx) for k, v in comment_step["env"].items()} | {
        "GITHUB_OUTPUT": str(work / "out")}
    proc = subprocess.run(["bash", "-eo", "pipefail", "-c", comment_step["run"]], cwd=work, env=step_env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    comment = (out / "comment.md").read_text(encoding="utf-8")
    assert len(comment) < COMMENT_LIMIT
    assert comment.rstrip().endswith(f"perfdoctor-reports artifact: {RUN_URL}")  # no artifact URL: the run page
    assert comment.startswith("## diff\n")
