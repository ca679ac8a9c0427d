"""Markdown report: findings first, details collapsed, user strings inert, always fits a PR comment."""

from __future__ import annotations

import re

from perfdoctor import api
from perfdoctor.render.markdown import MAX_CHARS, code_block, md, render_markdown
from tests.paths import SAMPLES
from tests.test_html import FINDING
from tests.xss import SCRIPT_PROBE, probe_trace


def test_findings_first_details_collapsed_and_escaped(tmp_path):
    report = api.analyze([probe_trace(tmp_path)])
    report.findings = [FINDING]
    text = render_markdown(report)
    assert text.index("### Findings") < text.index("<details>")
    assert "<summary>Step-time breakdown per rank</summary>" in text
    assert "cfg.ddp.overlap_grad_reduce = True" in text and "```python" in text
    outside_code = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))
    assert "<script" not in outside_code and "<img" not in outside_code  # GitHub shows code spans literally
    assert f"`{SCRIPT_PROBE}`" in text  # the kernel name itself, in a code span
    assert "&lt;script&gt;alert\\(1\\)&lt;/script&gt;" in text


def test_stays_under_the_pr_comment_limit_with_many_findings():
    report = api.analyze([SAMPLES / "per_node"])
    report.findings = [{**FINDING, "rule": f"rule-{i}", "summary": "x" * 400} for i in range(300)]
    text = render_markdown(report)
    assert len(text) < MAX_CHARS
    assert text.startswith("## perfdoctor")


def test_helpers_neutralise_markdown_and_html():
    assert md("a|b <img> *x* [l](u)") == "a\\|b &lt;img&gt; \\*x\\* \\[l\\]\\(u\\)"
    block = code_block("echo ``` done")
    assert block.startswith("````") and block.endswith("````")
