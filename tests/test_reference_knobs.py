"""Knobs that are only a reference (the run is not recognised as Megatron's) are folded: one line in the
terminal, a closed <details> in HTML and Markdown; a recognised run shows its knobs as the fix, in full."""

from __future__ import annotations

import io
import re

import pytest

from perfdoctor import api
from perfdoctor.render.escape import safe_console
from perfdoctor.render.html import render_html
from perfdoctor.render.markdown import render_markdown
from perfdoctor.render.terminal import render_terminal
from tests.paths import REAL_H100, SAMPLES


def _terminal(report) -> str:
    buffer = io.StringIO()
    render_terminal(report, safe_console(file=buffer, fit_content=True, no_color=True))
    return buffer.getvalue()


@pytest.fixture(scope="module")
def real():
    return api.analyze([REAL_H100], timeline_excerpts=False)


def test_reference_knobs_are_folded(real) -> None:
    with_reference = [f for f in real.findings if any(k.get("role") == "reference" for k in f["knobs"])]
    assert with_reference and real.run.framework["name"] != "megatron-lm"
    text = _terminal(real)
    html = render_html(real, plotly_js="cdn")
    markdown = render_markdown(real)
    for f in with_reference:
        line = f"settings for reference: `perfdoctor explain {f['rule']}`"
        assert sum(line in row for row in text.splitlines()) == 1
        flags = [k["megatron_lm"] for k in f["knobs"] if k.get("role") == "reference" and k.get("megatron_lm")]
        block = html[html.index(f'id="finding-{f["rule"]}"'):]
        block = block[:block.index('<div class="finding"', 1)] if '<div class="finding"' in block[1:] else block
        folded = re.search(r'<details class="reference"><summary>(.*?)</summary>(.*?)</details>', block, re.S)
        assert folded is not None and "<details class=\"reference\" open" not in block
        assert folded.group(1) == f"Megatron settings for reference: <code>perfdoctor explain {f['rule']}</code>"
        for flag in flags:
            assert flag not in text  # the terminal shows the one line, not the snippets
            assert flag in folded.group(2) and flag not in block.replace(folded.group(0), "")
    summaries = [row for row in markdown.splitlines() if row.startswith("<summary>") and "for reference" in row]
    assert len(summaries) == len(with_reference)  # one collapsed block per finding


def test_recognised_megatron_run_shows_knobs_in_full() -> None:
    report = api.analyze([SAMPLES / "exposed_dp"], timeline_excerpts=False)
    assert report.run.framework["name"] in ("megatron-lm", "megatron-core", "megatron-bridge", "nemo2")
    f = next(f for f in report.findings if f["knobs"])
    assert all(k.get("role") == "fix" for k in f["knobs"])
    text = _terminal(report)
    assert "settings for reference" not in text and "knobs (the fix)" in text
    assert '<details class="reference">' not in render_html(report, plotly_js="cdn")
