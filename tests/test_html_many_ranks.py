"""At 64 ranks every section of the HTML page holds what it holds at 8, in aggregate (the median over ranks,
the minimum and maximum, the ranks that stand out), and never says "none" where the JSON has the data."""

from __future__ import annotations

import copy
import html
import json
import re
from dataclasses import replace

import pytest

from perfdoctor import api
from perfdoctor.render import summary as sm
from perfdoctor.render.html import render_html
from perfdoctor.render.json import report_dict
from tests.paths import SAMPLES

RANKS = 64


def _replicate(sample: str, spread: bool) -> api.Report:
    """A real analysis of one rank (DP and TP communication) as 64 ranks: identical ones (no rank stands
    out) or with a spread of step times."""
    report = api.analyze([SAMPLES / sample], jobs=1, timeline_excerpts=False)
    (trace,), device = report.run.traces, report.devices[0]
    base = report.metrics["ranks"][str(device.rank)]
    report.run.traces, report.devices, report.metrics["ranks"], report.series = [], [], {}, {}
    for r in range(RANKS):
        report.run.traces.append(replace(trace, path=trace.path.with_name(f"job.rank{r:03d}.sqlite")))
        d = copy.deepcopy(device)
        d.rank, d.label = r, f"rank {r}"
        report.devices.append(d)
        m = dict(base)
        if spread:
            m["step.time_ms"] = base["step.time_ms"] * (1 + (r % 5) / 100)
            m["comm.dp.exposed_ms"] = (base["comm.dp.exposed_ms"] or 0) * (1 + (r % 3) / 10)
        report.metrics["ranks"][str(r)] = m
    report.excerpts = [None] * RANKS
    return report


def _section(page: str, anchor: str) -> str:
    start = page.index(f'<section id="{anchor}">')
    return page[start:page.index("</section>", start)]


def _figures(page: str) -> dict[str, dict]:
    return {i: json.loads(m) for i, m in re.findall(r'<script type="application/json" id="([^"]+)">(.*?)</script>',
                                                    page)}


@pytest.mark.parametrize("spread", [False, True])
def test_every_section_holds_the_json_data(spread: bool) -> None:
    report = _replicate("clean_baseline", spread)
    doc = report_dict(report)
    all_m = doc["metrics"]["all"]
    page = render_html(report, plotly_js="cdn")
    figures = _figures(page)

    comm = html.unescape(_section(page, "comm"))
    groups = [g for g in sm.GROUPS if all_m.get(f"comm.{g}.time_ms")]
    assert groups == ["dp", "tp"] and "No communication labelled" not in comm
    for g in groups:
        median = re.search(rf"<tr><td>median</td><td>{g.upper()}</td><td class=\"num\">([^<]+)</td>", comm)
        assert median and median.group(1) == sm.fmt(all_m[f"comm.{g}.time_ms"], "ms")
        values = [m[f"comm.{g}.exposed_ms"] for m in doc["metrics"]["ranks"].values()]
        for key, value in (("min", min(values)), ("max", max(values))):
            row = re.search(rf"<tr><td>{key}</td><td>{g.upper()}</td><td class=\"num\">[^<]+</td>\s*"
                            r"<td class=\"num\">([^<]+)</td>", comm)
            assert row and row.group(1) == sm.fmt(value, "ms")

    breakdown = _section(page, "breakdown")
    assert "No per-step measurements" not in breakdown
    (fig_id,) = re.findall(r'data-figure="([^"]+)"', breakdown)
    bars = figures[fig_id]["data"]
    assert bars[0]["y"][0] == f"median of {RANKS} ranks"
    want = dict(sm.breakdown(all_m))
    assert {b["name"]: b["x"][0] for b in bars} == {p: round(v, 3) for p, v in want.items() if p in
                                                    {b["name"] for b in bars}}
    assert len(bars[0]["y"]) <= 16
    if spread:  # the slower ranks stand out by number
        assert any(label.startswith("rank ") for label in bars[0]["y"][1:])

    host = _section(page, "host")
    if any(all_m.get(f"host.{c}_ms") for c, _ in sm.HOST_CAUSES):
        assert "No device-idle time" not in host and "data-figure" in host
    assert "The 64 ranks are summarised" in breakdown
