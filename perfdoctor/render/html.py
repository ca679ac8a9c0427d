"""One self-contained HTML report: summary, breakdowns, a timeline excerpt, findings with snippets.

The page is a jinja2 template (``templates/report.html.j2``, autoescape on) plus plotly figures given
as JSON data blocks. Every user-controlled string (kernel names, NVTX text, paths, environment values)
reaches the page either through autoescaped template text or inside a figure, where it is HTML-escaped
before plotly sees it (plotly renders a subset of HTML in labels) and the JSON block itself has ``<``,
``>`` and ``&`` written as ``\\u`` escapes so it can never close its ``<script>`` element.
plotly.js is inlined by default (the file works offline); ``plotly_js="cdn"`` links it instead.
"""

from __future__ import annotations

import html
import json
from functools import lru_cache
from typing import Any

import jinja2
import numpy as np

from perfdoctor.model import Report
from perfdoctor.render import scale
from perfdoctor.render import summary as sm
from perfdoctor.render.snippets import knob_snippets

CATEGORY_COLORS = {"gemm": "#4C78A8", "attention": "#9D755D", "norm_persistent": "#B279A2", "norm": "#D6A5C9",
                   "comm": "#E45756", "elementwise": "#72B7B2", "optimizer": "#54A24B", "memcpy": "#EECA3B",
                   "memset": "#FF9DA6", "other": "#BAB0AC"}
HIGHLIGHT_COLORS = {"exposed_comm": "#D62728", "host_gap": "#FF7F0E", "device_wait": "#7F7F7F",
                    "bubble": "#9467BD", "ln_blocked": "#E377C2"}
# The critical path's row (perfdoctor.blame), one color per cause family.
PATH_COLORS = {"compute": "#4C78A8", "transfer": "#E45756", "wait": "#7F7F7F", "copy": "#EECA3B", "host": "#FF7F0E",
               "pipeline": "#9467BD"}
PART_COLORS = {"compute": "#4C78A8", "exposed DP": "#E45756", "exposed TP": "#F58518", "exposed CP": "#B279A2",
               "exposed PP": "#9467BD", "exposed EP": "#8C564B", "exposed OTHER": "#FF9DA6",
               "exposed comm (unlabelled)": "#D62728", "device idle": "#BAB0AC", "other": "#DDDDDD"}
MAX_TIMELINES = 8  # excerpts drawn; more ranks are listed, not drawn
TOP_RANKS = 16  # bars and tables of a run of many ranks show the ranks furthest from the median
HEATMAP_MAX_PX = 900  # a heatmap of 1,024 ranks stays one screen tall (hover names the rank)
PLOTLY_CDN = "https://cdn.plot.ly/plotly-{version}.min.js"


def render_html(report: Report, plotly_js: str = "inline") -> str:
    """The report page. ``plotly_js``: ``inline`` (offline, ~5 MB), ``cdn`` (small, needs network), or
    the relative URL of a plotly.min.js served beside the page (``reports/`` shares one copy)."""
    check_plotly_js(plotly_js)
    figures: list[tuple[str, dict[str, Any]]] = []

    def figure(fig: dict[str, Any] | None) -> str | None:
        if fig is None:
            return None
        fig_id = f"fig{len(figures)}"
        figures.append((fig_id, fig))
        return fig_id

    all_keys = sm.ranks(report)
    # A run of many ranks: bars, tables and evidence for the ranks that stand out; heatmaps for all.
    rows = scale.rank_rows(report, TOP_RANKS)
    bars = [row for row in rows if not row.spread]
    shown = {row.rank for row in rows if row.rank is not None}
    all_m = report.metrics.get("all", {})
    context = {
        "title": _title(report),
        "ranks_summarised": len(all_keys) if scale.many(report) else 0,
        "report": report,
        "all": all_m,
        "headline": _headline(all_m),
        "findings": [_finding_view(f) for f in sm.findings(report)],
        "breakdown_fig": figure(_breakdown_figure(bars)),
        "timelines": [{"label": _device_label(report, i), "excerpt": ex,
                       "fig": figure(_timeline_figure(ex, report.path.get(str(ex.rank), [])))}
                      for i, ex in enumerate(report.excerpts) if ex is not None][:MAX_TIMELINES],
        "timelines_omitted": max(0, sum(ex is not None for ex in report.excerpts) - MAX_TIMELINES),
        "comm_rows": _comm_rows(report, rows),
        "comm_evidence": [(r, e) for r, e in sm.evidence(report, "comm") if str(r) in shown],
        "pipeline_fig": figure(_pipeline_figure(report, _stage_ranks(report, bars) if scale.many(report)
                                                else all_keys)),
        "host_fig": figure(_host_figure(bars)),
        "ln_rows": _ln_rows(rows),
        "ln_evidence": [(r, e) for r, e in sm.evidence(report, "ln") if str(r) in shown],
        "mix_fig": figure(_mix_figure(report)),
        "top_kernels": _top_kernels(report),
        "memory_rows": _memory_rows(rows),
        "memory_fig": figure(_memory_figure(report)),
        "heatmap_fig": figure(_heatmap_figure(report, all_keys)) if len(all_keys) > 1 else None,
        "steps_fig": figure(_steps_figure(report, all_keys)) if len(all_keys) > 1 else None,
        "rank_groups": [(name, scale.metric_rows(report, ranks)) for name, ranks in scale.stage_groups(report).items()]
        if scale.many(report) else [],
        "rank_columns": [label for _, label, _ in sm.RANK_METRICS],
        "traces_shown": report.run.traces[:scale.MANY_RANKS] if scale.many(report) else report.run.traces,
        "fmt": sm.fmt,
        "framework": report.run.framework,
        "knobs_heading": sm.knobs_heading,
        "total_impact": sm.total_impact_ms(report),
        "plotly_inline": plotly_js_inline() if plotly_js == "inline" else None,
        "plotly_src": plotly_src(plotly_js),
    }
    context["figures"] = [(fig_id, script_json(fig)) for fig_id, fig in figures]
    return _template().render(**context)


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The template environment of the HTML pages: autoescape on for every template."""
    return jinja2.Environment(loader=jinja2.PackageLoader("perfdoctor.render", "templates"), autoescape=True,
                              trim_blocks=True, lstrip_blocks=True, undefined=jinja2.ChainableUndefined)


def _template() -> jinja2.Template:
    return environment().get_template("report.html.j2")


def check_plotly_js(plotly_js: str) -> None:
    if plotly_js not in ("inline", "cdn") and not (plotly_js.endswith(".js") and "://" not in plotly_js):
        raise ValueError(f"plotly_js must be 'inline', 'cdn' or a relative path to a .js file, not {plotly_js!r}")


def plotly_src(plotly_js: str) -> str | None:
    """The ``src`` of the plotly script element, or None when the library is inlined."""
    if plotly_js == "inline":
        return None
    return PLOTLY_CDN.format(version=plotly_version()) if plotly_js == "cdn" else plotly_js


@lru_cache(maxsize=1)
def plotly_js_inline() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().replace("</script", "<\\/script")


def plotly_version() -> str:
    from plotly.offline.offline import get_plotlyjs_version

    return get_plotlyjs_version()


def script_json(data: Any) -> str:
    """JSON that is safe inside ``<script type="application/json">``: no ``<``, ``>``, ``&`` at all."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, default=float)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _esc(text: Any) -> str:
    """A label for plotly: it renders some HTML tags in text, so user strings go in as entities."""
    return html.escape(str(text), quote=True)


def _title(report: Report) -> str:
    return scale.run_name(report)


def _device_label(report: Report, i: int) -> str:
    d = report.devices[i]
    return d.label + (f" · {d.gpu_name}" if d.gpu_name else "")


def _headline(m: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(label, value, note) cards of the summary."""
    cards = [("step time", sm.fmt(m.get("step.time_ms"), "ms"),
              f"p90 {sm.fmt(m.get('step.time_p90_ms'), 'ms')}" if m.get("step.time_p90_ms") else "median over steps"),
             ("MFU", sm.fmt(m.get("mfu"), "%"), "model FLOPs / peak" if m.get("mfu") is not None
              else "needs model config (--config)"),
             ("GPU busy", sm.fmt(m.get("gpu.busy_fraction"), "%"), "of the step"),
             ("exposed comm", sm.fmt(m.get("comm.exposed_ms"), "ms"),
              f"{sm.fmt(m.get('comm.exposed_fraction'), '%')} of the step"),
             ("device idle", sm.fmt(m.get("host.idle_fraction"), "%"), "of the step")]
    return cards


def _finding_view(f: dict[str, Any]) -> dict[str, Any]:
    knobs = [k for k in f.get("knobs") or [] if isinstance(k, dict)]
    url = f.get("guide_url")
    safe_url = url if isinstance(url, str) and url.startswith(("https://", "http://")) else None
    views = [{"knob": k, "label": sm.knob_label(k), "snippets": knob_snippets(k), "what_if": sm.what_if_text(k)}
             for k in knobs]
    fixes = [v for v in views if v["knob"].get("role") != "reference"]
    reference = [v for v in views if v["knob"].get("role") == "reference"]
    return {**f, "guide_url": safe_url, "knob_views": views, "fix_views": fixes, "reference_views": reference,
            "reference_what": sm.reference_what(f), "confidence_text": sm.confidence_text(f),
            "overlap_text": sm.overlap_text(f),
            "evidence_items": sorted((f.get("evidence") or {}).items()) if isinstance(f.get("evidence"), dict) else []}


def _bar_layout(title: str, **extra: Any) -> dict[str, Any]:
    layout = {"title": {"text": title, "font": {"size": 14}}, "barmode": "stack", "height": 320,
              "margin": {"l": 80, "r": 20, "t": 40, "b": 40}, "legend": {"orientation": "h", "y": -0.2},
}
    layout.update(extra)
    return layout


def _breakdown_figure(bars: list[scale.RankRow]) -> dict[str, Any] | None:
    parts_of = [dict(sm.breakdown(row.metrics)) for row in bars]
    parts = [p for p in PART_COLORS if any(p in row for row in parts_of)]
    if not parts:
        return None
    y = [row.label for row in bars]
    data = [{"type": "bar", "orientation": "h", "name": p, "y": y,
             "x": [round(row.get(p, 0.0), 3) for row in parts_of],
             "marker": {"color": PART_COLORS[p]}, "hovertemplate": "%{y}: %{x:.2f} ms<extra>" + p + "</extra>"}
            for p in parts]
    return {"data": data, "layout": _bar_layout("step time by part (ms per step, median over steps)",
                                               height=max(220, 60 + 28 * len(y)), xaxis={"title": {"text": "ms"}},
                                               yaxis={"autorange": "reversed"})}


def _timeline_figure(ex: Any, path: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Kernels per stream as horizontal bars (one trace per category), highlights as extra rows, and on top
    the step's critical path (the same median step: perfdoctor.blame), one bar per path entry."""
    rows: list[str] = [f"stream {s}" for s in ex.streams]
    data: list[dict[str, Any]] = _path_traces(ex, path or [])
    if data:
        rows.insert(0, "critical path")
    by_cat: dict[str, list[dict[str, Any]]] = {}
    for r in ex.rects:
        by_cat.setdefault(r["category"], []).append(r)
    for cat in sorted(by_cat):
        rs = by_cat[cat]
        data.append({"type": "bar", "orientation": "h", "name": cat, "legendgroup": "kernels",
                     "base": [r["start_us"] for r in rs], "x": [round(r["end_us"] - r["start_us"], 3) for r in rs],
                     "y": [f"stream {r['stream']}" for r in rs], "width": 0.8,
                     "marker": {"color": CATEGORY_COLORS.get(cat, "#BAB0AC"), "line": {"width": 0}},
                     "hovertext": [_esc(r["name"]) + (f" (+{r['count'] - 1} merged)" if r["count"] > 1 else "")
                                   for r in rs],
                     "hovertemplate": "%{hovertext}<br>%{base:.1f} µs + %{x:.1f} µs<extra>" + _esc(cat) + "</extra>"})
    hl: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for h in ex.highlights:
        hl.setdefault((h["kind"], h["label"] if h["kind"] != "ln_blocked" else "LN blocked"), []).append(h)
    for (kind, label), hs in sorted(hl.items()):
        row = {"exposed_comm": f"exposed {label.upper()}", "host_gap": f"host gap: {label}",
               "device_wait": "device wait", "bubble": "pipeline bubble", "ln_blocked": "LN blocked by NCCL"}[kind]
        rows.append(row)
        data.append({"type": "bar", "orientation": "h", "name": row, "legendgroup": "highlights",
                     "base": [h["start_us"] for h in hs], "x": [round(h["end_us"] - h["start_us"], 3) for h in hs],
                     "y": [row] * len(hs), "width": 0.6,
                     "marker": {"color": HIGHLIGHT_COLORS[kind], "line": {"width": 0}},
                     "hovertext": [_esc(h["label"]) for h in hs],
                     "hovertemplate": "%{hovertext}<br>%{base:.1f} µs + %{x:.1f} µs<extra></extra>"})
    title = (f"step {ex.step_index + 1} of {ex.step_count} (median duration, {ex.step_ms:,.2f} ms): "
             f"{ex.kernels:,} kernels drawn as {len(ex.rects):,} bars")
    return {"data": data, "layout": {
        "title": {"text": _esc(title), "font": {"size": 13}}, "barmode": "overlay",
        "height": max(300, 90 + 30 * len(rows)), "margin": {"l": 150, "r": 20, "t": 40, "b": 40},
        "xaxis": {"title": {"text": "µs from step start"}, "range": [0, round(ex.step_ms * 1e3, 3)]},
        "yaxis": {"categoryorder": "array", "categoryarray": rows[::-1], "type": "category"},
        "legend": {"tracegroupgap": 12}, "bargap": 0.1}}


def _path_traces(ex: Any, path: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The critical path as bars on its own row, one trace per cause family, µs from the step start; where
    it runs on another rank (this one waited for it) the bar says which."""
    by_family: dict[str, list[dict[str, Any]]] = {}
    for e in path:
        by_family.setdefault(e["cause"].split(".")[0], []).append(e)
    out = []
    for family in sorted(by_family):
        es = by_family[family]
        out.append({"type": "bar", "orientation": "h", "name": f"path: {family}", "legendgroup": "path",
                    "base": [round((e["start_ns"] - ex.step_start_ns) / 1e3, 3) for e in es],
                    "x": [round((e["end_ns"] - e["start_ns"]) / 1e3, 3) for e in es],
                    "y": ["critical path"] * len(es), "width": 0.8,
                    "marker": {"color": PATH_COLORS.get(family, "#BAB0AC"), "line": {"width": 0}},
                    "hovertext": [_esc((f"rank {e['rank']} · " if e["rank"] != ex.rank else "") +
                                       f"{e['cause']}: {e['what']}" + (" (inferred edge)" if e["inferred"] else ""))
                                  for e in es],
                    "hovertemplate": "%{hovertext}<br>%{base:.1f} µs + %{x:.1f} µs<extra>critical path</extra>"})
    return out


def _comm_rows(report: Report, rank_rows: list[scale.RankRow]) -> list[dict[str, Any]]:
    rows = []
    by_rank = {str(d.rank): d.groups for d in report.devices}
    for row in rank_rows:
        m = row.metrics
        groups = by_rank.get(row.rank or "", {})
        for g in sm.GROUPS:
            if not m.get(f"comm.{g}.time_ms"):
                continue
            info = groups.get(g) or {}
            if row.spread or row.key == "median":  # labelling of the group: the same on every rank's device
                info = next((gs[g] for gs in by_rank.values() if gs.get(g)), {}) | {"kernels": None}
            r = row.key
            src = max(info.get("label_source", {}).items(), key=lambda kv: kv[1]["ns"], default=("–", None))[0]
            conf = max(info.get("confidence", {}).items(), key=lambda kv: kv[1]["ns"], default=("–", None))[0]
            rows.append({"rank": r, "group": g.upper(), "time": m.get(f"comm.{g}.time_ms"),
                         "exposed": m.get(f"comm.{g}.exposed_ms"), "fraction": m.get(f"comm.{g}.exposed_fraction"),
                         "kernels": info.get("kernels"), "source": src, "confidence": conf})
    return rows


def _pipeline_figure(report: Report, rank_keys: list[str]) -> dict[str, Any] | None:
    ms = report.metrics["ranks"]
    have = [r for r in rank_keys if ms[r].get("pipeline.bubble_fraction") is not None]
    if not have:
        return None
    stages = {str(rank): ev.get("stage") for rank, ev in sm.evidence(report, "pipeline")}
    x = [f"rank {r}" + (f" (stage {stages[r]})" if stages.get(r) is not None else "") for r in have]
    data = [{"type": "bar", "name": "measured bubble", "x": x,
             "y": [round(100 * ms[r]["pipeline.bubble_fraction"], 2) for r in have], "marker": {"color": "#9467BD"}},
            {"type": "bar", "name": "warm-up + cool-down", "x": x,
             "y": [round(100 * (ms[r].get("pipeline.warmup_cooldown_ms") or 0) / ms[r]["step.time_ms"], 2)
                   for r in have], "marker": {"color": "#C5B0D5"}}]
    theory = [ms[r].get("pipeline.bubble_fraction_theory") for r in have]
    if any(t is not None for t in theory):
        data.append({"type": "scatter", "mode": "lines+markers", "name": "theory (p−1)/(v·m+p−1)", "x": x,
                     "y": [None if t is None else round(100 * t, 2) for t in theory], "line": {"color": "#000"}})
    return {"data": data, "layout": _bar_layout("pipeline bubble per stage (% of step)", barmode="group",
                                               yaxis={"title": {"text": "% of step"}})}


def _stage_ranks(report: Report, bars: list[scale.RankRow]) -> list[str]:
    """A run of many ranks: the first rank of each pipeline stage, then the ranks that stand out."""
    firsts = [ranks[0] for ranks in scale.stage_groups(report).values() if ranks]
    return list(dict.fromkeys(firsts + [row.rank for row in bars if row.rank is not None and row.key != "median"]))


def _host_figure(bars: list[scale.RankRow]) -> dict[str, Any] | None:
    causes = [(c, label) for c, label in sm.HOST_CAUSES if any(row.metrics.get(f"host.{c}_ms") for row in bars)]
    if not causes:
        return None
    y = [row.label for row in bars]
    data = [{"type": "bar", "orientation": "h", "name": label, "y": y,
             "x": [round(row.metrics.get(f"host.{c}_ms") or 0.0, 3) for row in bars]} for c, label in causes]
    return {"data": data, "layout": _bar_layout("device idle inside the step, by cause (ms per step)",
                                               height=max(220, 60 + 28 * len(y)), yaxis={"autorange": "reversed"})}


def _ln_rows(rows: list[scale.RankRow]) -> list[dict[str, Any]]:
    return [{"rank": row.key, "count": row.metrics.get("ln.blocked_count"), "ms": row.metrics.get("ln.blocked_ms")}
            for row in rows if row.metrics.get("ln.blocked_count")]


def _mix_figure(report: Report) -> dict[str, Any] | None:
    totals: dict[str, int] = {}
    for d in report.devices:
        for cat, ns in d.category_ns.items():
            totals[cat] = totals.get(cat, 0) + ns
    if not totals:
        return None
    cats = sorted(totals, key=lambda c: -totals[c])
    return {"data": [{"type": "bar", "x": cats, "y": [round(totals[c] / 1e6, 3) for c in cats],
                      "marker": {"color": [CATEGORY_COLORS.get(c, "#BAB0AC") for c in cats]},
                      "hovertemplate": "%{x}: %{y:.2f} ms<extra></extra>"}],
            "layout": _bar_layout("kernel time by category, all devices (ms, sum of kernel durations)",
                                  showlegend=False)}


def _top_kernels(report: Report) -> list[dict[str, Any]]:
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for d in report.devices:
        for k in d.top_kernels:
            row = merged.setdefault((k["name"], k["category"]), {"name": k["name"], "category": k["category"],
                                                                  "count": 0, "ns": 0})
            row["count"] += k["count"]
            row["ns"] += k["ns"]
    return sorted(merged.values(), key=lambda r: -r["ns"])[:15]


def _memory_rows(rows: list[scale.RankRow]) -> list[dict[str, Any]]:
    return [{"rank": row.key, "allocated": row.metrics.get("memory.peak_allocated_bytes"),
             "reserved": row.metrics.get("memory.peak_reserved_bytes")}
            for row in rows if row.metrics.get("memory.peak_reserved_bytes") is not None
            or row.metrics.get("memory.peak_allocated_bytes") is not None]


def _memory_figure(report: Report) -> dict[str, Any] | None:
    data = []
    for rank, ev in sm.evidence(report, "memory"):
        series = ev.get("series") if isinstance(ev.get("series"), dict) else None
        if not series or not series.get("t_us"):
            continue
        for key, dash in (("allocated", "solid"), ("reserved", "dot")):
            if series.get(key):
                start = ev.get("history_start_us") or series["t_us"][0]
                data.append({"type": "scatter", "mode": "lines", "name": f"rank {rank} {key}",
                             "x": [(t - start) / 1e6 for t in series["t_us"]], "y": [v / 2**30 for v in series[key]],
                             "line": {"dash": dash}})
    if not data:
        return None
    return {"data": data, "layout": _bar_layout("memory over the capture (GiB)",
                                                xaxis={"title": {"text": "s after the history starts"}})}


def _heatmap_figure(report: Report, rank_keys: list[str]) -> dict[str, Any] | None:
    """Ranks × metrics; colour = how much worse (red) or better (blue) than the median rank, text = the
    value (left out at many ranks, where the cells are too small to read)."""
    ms = report.metrics["ranks"]
    cols = [(k, label, unit) for k, label, unit in sm.RANK_METRICS if any(ms[r].get(k) is not None for r in rank_keys)]
    if not cols:
        return None
    z, text = [], []
    for r in rank_keys:
        z_row, t_row = [], []
        for k, _, unit in cols:
            dev = scale.deviation(report, r, k)
            z_row.append(None if dev is None else round(dev, 4))
            t_row.append(sm.fmt(ms[r].get(k), unit))
        z.append(z_row)
        text.append(t_row)
    many = scale.many(report)
    trace = {"type": "heatmap", "z": z, "text": text, "x": [c[1] for c in cols],
             "y": [f"rank {r}" for r in rank_keys], "colorscale": "RdBu", "reversescale": True,
             "zmid": 0, "colorbar": {"title": {"text": "worse ↑ vs median"}, "tickformat": ".0%"},
             "hovertemplate": "%{y} · %{x}: %{text}<extra></extra>"}
    if not many:
        trace["texttemplate"] = "%{text}"
    return {"data": [trace],
            "layout": {"title": {"text": "per-rank metrics (red: worse than the median rank, blue: better)",
                                 "font": {"size": 14}},
                       "height": min(HEATMAP_MAX_PX, max(240, 80 + 26 * len(rank_keys))),
                       "margin": {"l": 80, "r": 20, "t": 40, "b": 60}, "yaxis": {"autorange": "reversed"}}}


def _steps_figure(report: Report, rank_keys: list[str]) -> dict[str, Any] | None:
    """Ranks × steps of step time; colour = slower (red) or faster (blue) than the median rank in that step."""
    series = [report.series.get(r, {}).get("step.time_ms") or [] for r in rank_keys]
    steps = max((len(s) for s in series), default=0)
    if steps < 2:
        return None
    grid = np.full((len(rank_keys), steps), np.nan)
    for i, s in enumerate(series):
        grid[i, :len(s)] = s
    median = np.nanmedian(grid, axis=0)
    dev = (grid - median) / np.where(median > 0, median, np.nan)
    z = [[None if np.isnan(v) else round(float(v), 4) for v in row] for row in dev]
    text = [[None if np.isnan(v) else f"{v:.1f} ms" for v in row] for row in grid]
    return {"data": [{"type": "heatmap", "z": z, "text": text, "x": [f"step {i}" for i in range(steps)],
                      "y": [f"rank {r}" for r in rank_keys], "colorscale": "RdBu", "reversescale": True, "zmid": 0,
                      "colorbar": {"title": {"text": "slower ↑ vs median"}, "tickformat": ".0%"},
                      "hovertemplate": "%{y} · %{x}: %{text}<extra></extra>"}],
            "layout": {"title": {"text": "step time per rank and step (red: slower than the median rank in that "
                                         "step, blue: faster)", "font": {"size": 14}},
                       "height": min(HEATMAP_MAX_PX, max(240, 80 + 20 * len(rank_keys))),
                       "margin": {"l": 80, "r": 20, "t": 40, "b": 60}, "yaxis": {"autorange": "reversed"}}}
