"""Reports that read well at 1,024 ranks: the terminal shows the run, the findings, then the ranks that
stand out; Markdown names the run (not every file) and fits a PR comment; HTML draws heatmaps of every
rank and bars/tables of the outliers only, with the colour scale's meaning stated."""

from __future__ import annotations

import copy
import io
import json
import re
from dataclasses import replace

import pytest
from rich.console import Console

from perfdoctor import api
from perfdoctor.render.html import render_html
from perfdoctor.render.markdown import render_markdown
from perfdoctor.render.terminal import render_terminal
from tests.paths import SAMPLES

RANKS = 1024
SLOW = 777


@pytest.fixture(scope="module")
def big() -> api.Report:
    """A real analysis of one rank, replicated to 1,024 ranks with a spread, rank 777 the straggler."""
    report = api.analyze([SAMPLES / "clean_baseline"], jobs=1)
    (trace,), device = report.run.traces, report.devices[0]
    base = report.metrics["ranks"][str(device.rank)]
    series = report.series[str(device.rank)]
    report.run.traces, report.run.timelines, report.devices = [], [], []
    report.metrics["ranks"], report.series, report.excerpts = {}, {}, []
    for r in range(RANKS):
        info = replace(trace, path=trace.path.with_name(f"job.rank{r:04d}.sqlite"))
        report.run.traces.append(info)
        d = copy.deepcopy(device)
        d.rank, d.label = r, f"rank {r}"
        report.devices.append(d)
        m = dict(base)
        slow = 1.2 if r == SLOW else 1.0 + (r % 7) / 200
        m["step.time_ms"] = base["step.time_ms"] * slow
        m["host.idle_fraction"] = (base["host.idle_fraction"] or 0.01) * slow
        report.metrics["ranks"][str(r)] = m
        report.series[str(r)] = {**series, "step.time_ms": [v * slow for v in series["step.time_ms"]]}
        report.excerpts.append(None)
    report.metrics["all"]["ranks.slowest"], report.metrics["all"]["ranks.late_ms"] = SLOW, 12.5
    return report


def test_terminal_shows_summary_findings_then_outliers(big) -> None:
    out = io.StringIO()
    render_terminal(big, Console(file=out, width=140, force_terminal=False))
    text = out.getvalue()
    assert len(text.splitlines()) < 400
    assert text.startswith("run clean_baseline (1024 traces, 1024 ranks)")
    assert text.index("ranks that stand out") > text.index("run ")
    assert len(text.splitlines()) < 200
    assert f"rank {SLOW}: the others wait 12.50 ms per step" in text
    assert "job.rank0001.sqlite" not in text


def test_markdown_names_the_run_and_fits_a_comment(big) -> None:
    text = render_markdown(big)
    assert len(text) < 65_536
    assert text.splitlines()[0] == r"## perfdoctor · clean\_baseline \(1024 traces, 1024 ranks\)"
    assert "job.rank0500.sqlite" not in text and "1008 more traces" in text
    assert re.search(rf"\| {SLOW} \|", text)


def test_html_uses_heatmaps_and_outliers(big) -> None:
    page = render_html(big, plotly_js="cdn")
    figures = [json.loads(m) for m in re.findall(r'<script type="application/json" id="[^"]+">(.*?)</script>', page)]
    heatmaps = [f for f in figures if f["data"] and f["data"][0]["type"] == "heatmap"]
    assert len(heatmaps) == 2 and all(len(f["data"][0]["y"]) == RANKS for f in heatmaps)
    assert all(f["layout"]["height"] <= 900 for f in figures)  # no 30,000 px bar charts
    bars = [f for f in figures
            if f["data"] and f["data"][0]["type"] == "bar" and f["data"][0].get("orientation") == "h"]
    assert bars and all(len(f["data"][0]["y"]) <= 16 for f in bars)
    assert f"rank {SLOW}" in bars[0]["data"][0]["y"]
    assert "red is worse than the median rank" in page and "<summary>all ranks: 1024 ranks</summary>" in page
    assert len(page) < 3_000_000
