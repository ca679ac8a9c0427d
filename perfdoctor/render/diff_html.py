"""``perfdoctor diff`` as one self-contained HTML page (same escaping rules as the report page).

The chart shows the median step of each side split into the same parts as the report's breakdown;
tables list finding changes and every compared metric with its noise and verdict.
"""

from __future__ import annotations

from typing import Any

from perfdoctor.diff import Diff
from perfdoctor.render import summary as sm
from perfdoctor.render.diff_markdown import basis_line, verdict_line
from perfdoctor.render.html import PART_COLORS, check_plotly_js, environment, plotly_js_inline, plotly_src, script_json


def render_diff_html(diff: Diff, plotly_js: str = "inline") -> str:
    check_plotly_js(plotly_js)
    fig = _breakdown(diff.base_all, diff.head_all)
    return environment().get_template("diff.html.j2").render(
        diff=diff, verdict=verdict_line(diff), basis=basis_line(diff),
        figures=[("fig0", script_json(fig))] if fig else [],
        breakdown_fig="fig0" if fig else None,
        plotly_inline=plotly_js_inline() if plotly_js == "inline" else None,
        plotly_src=plotly_src(plotly_js))


def _breakdown(base: dict[str, Any], head: dict[str, Any]) -> dict[str, Any] | None:
    sides = {"base": dict(sm.breakdown(base)), "head": dict(sm.breakdown(head))}
    parts = [p for p in PART_COLORS if any(p in s for s in sides.values())]
    if not parts:
        return None
    y = ["base", "head"]
    data = [{"type": "bar", "orientation": "h", "name": p, "y": y, "x": [round(sides[s].get(p, 0.0), 3) for s in y],
             "marker": {"color": PART_COLORS[p]}, "hovertemplate": "%{y}: %{x:.2f} ms<extra>" + p + "</extra>"}
            for p in parts]
    return {"data": data, "layout": {"title": {"text": "median step by part (ms), median over ranks",
                                               "font": {"size": 14}}, "barmode": "stack", "height": 260,
                                     "margin": {"l": 60, "r": 20, "t": 40, "b": 40},
                                     "yaxis": {"autorange": "reversed"}, "legend": {"orientation": "h", "y": -0.3}}}
