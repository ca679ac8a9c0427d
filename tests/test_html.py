"""HTML report: sections, escaping of every user string, findings with snippets, plotly modes, excerpt caps."""

from __future__ import annotations

import re

import numpy as np
import pytest

from perfdoctor import api
from perfdoctor.measure.excerpt import excerpt
from perfdoctor.render.html import render_html
from perfdoctor.render.snippets import knob_snippets
from tests.paths import SAMPLES
from tests.xss import DIR_PROBE, IMG_PROBE, SCRIPT_PROBE, probe_trace

FINDING = {
    "rule": "exposed-dp-comm", "severity": "high", "title": "DP communication is exposed",
    "summary": "DP comm exposes 41.2 ms per step <script>alert(1)</script>", "ranks": [0],
    "evidence": {"kernel": "<b>nccl</b>"}, "impact_ms_per_step": 41.2, "impact_fraction": 0.18,
    "knobs": [{"megatron_bridge": "ddp.overlap_grad_reduce", "nemo": "trainer.strategy.ddp.overlap_grad_reduce",
               "megatron_lm": "--overlap-grad-reduce", "env": None, "value": True,
               "note": "needs distributed optimizer"},
              {"megatron_bridge": None, "nemo": None, "megatron_lm": None, "env": "NVTE_FWD_LAYERNORM_SM_MARGIN",
               "value": "16 <x>"}],
    "guide": "Communication overlap", "guide_url": "javascript:alert(1)",
}


@pytest.fixture(scope="module")
def probe_html(tmp_path_factory):
    trace = probe_trace(tmp_path_factory.mktemp("xss"))
    report = api.analyze([trace])
    report.findings = [FINDING]
    return render_html(report, plotly_js="cdn")


def test_user_strings_are_escaped_everywhere(probe_html):
    for probe in (SCRIPT_PROBE, IMG_PROBE, DIR_PROBE, "<script>alert(1)</script>", "<b>nccl</b>", "16 <x>"):
        assert probe not in probe_html
    assert "&lt;script&gt;document.title=" in probe_html  # the kernel name is shown, as text
    assert "run&lt;img src=x onerror" in probe_html  # the path too
    for block in re.findall(r'<script type="application/json" id="fig\d+">(.*?)</script>', probe_html, re.S):
        assert "<" not in block and ">" not in block  # figure data cannot end its script element
    assert "javascript:" not in probe_html
    # the only script elements are the figure data blocks, the library and our loader
    scripts = re.findall(r"<script[^>]*>", probe_html)
    assert all(s.startswith('<script type="application/json"') or s in ("<script>",) or "cdn.plot.ly" in s
               for s in scripts), scripts


def test_sections_findings_and_snippets(probe_html):
    for section in ("summary", "findings", "breakdown", "timeline", "comm", "pipeline", "host", "ln", "kernels",
                    "memory", "inputs"):
        assert f'<section id="{section}">' in probe_html
    assert "cfg.ddp.overlap_grad_reduce = True" in probe_html
    assert "recipe.trainer.strategy.ddp.overlap_grad_reduce = True" in probe_html
    assert "--overlap-grad-reduce" in probe_html
    assert "export NVTE_FWD_LAYERNORM_SM_MARGIN=&#39;16 &lt;x&gt;&#39;" in probe_html
    assert probe_html.index("DP communication is exposed") < probe_html.index('<section id="breakdown">')


def test_plotly_inline_by_default_and_cdn_on_request():
    report = api.analyze([SAMPLES / "ln_blocked"])
    inline, cdn = render_html(report), render_html(report, plotly_js="cdn")
    assert not re.search(r"<script[^>]+src=", inline)
    assert len(inline) > 3_000_000  # plotly.js itself is in the page
    assert re.search(r'<script src="https://cdn\.plot\.ly/plotly-[\d.]+\.min\.js"', cdn) and len(cdn) < 500_000
    with pytest.raises(ValueError):
        render_html(report, plotly_js="https://evil.example/x.js")


def test_multi_rank_report_has_heatmap_and_pipeline_theory():
    html = render_html(api.analyze([SAMPLES / "pp_1f1b"]), plotly_js="cdn")
    assert '<section id="ranks">' in html and "\"name\":\"theory (p" in html
    assert html.count("data-figure=") >= 6


def test_excerpt_is_the_median_step_capped_and_complete():
    from perfdoctor.classify.groups import GROUPS, label_groups
    from perfdoctor.classify.timeline import copy_classes, kernel_classes
    from perfdoctor.load.run import load_run
    from perfdoctor.measure.activity import activity, group_comm
    from perfdoctor.measure.breakdown import activity_window
    from perfdoctor.measure.steps import find_steps

    run = load_run([SAMPLES / "host_bound"])
    tl = run.timelines[0]
    kcls, ccls = kernel_classes(tl.kernels), copy_classes(tl.memcpy)
    steps = find_steps(tl, activity_window(tl), kcls)
    act, groups = activity(tl, kcls, ccls), label_groups(tl, kcls, run.config)
    args = (tl, kcls, act, steps, groups, group_comm(tl.kernels, act, groups.codes, len(GROUPS)), run.config)
    full, capped = excerpt(*args), excerpt(*args, max_rects=40)
    durations = steps.durations
    assert durations[full.step_index] == np.sort(durations)[(len(durations) - 1) // 2]
    assert len(capped.rects) <= 40 < len(full.rects)
    assert sum(r["count"] for r in capped.rects) == capped.kernels == full.kernels
    assert capped.pixel_us > full.pixel_us
    assert all(0 <= r["start_us"] <= r["end_us"] <= full.step_ms * 1e3 + 1e-3 for r in full.rects)
    assert {h["kind"] for h in full.highlights} >= {"host_gap", "exposed_comm"}
    lb = [h for h in full.highlights if h["kind"] == "host_gap" and h["label"] == "launch_bound"]
    assert lb  # the host-bound scenario shows its launch-bound gaps


def test_snippets_per_framework():
    knob = {"megatron_bridge": "comm_overlap.tp_comm_overlap", "nemo": "recipe.model.config.tp_comm_overlap",
            "megatron_lm": "--tp-comm-overlap", "env": "CUDA_DEVICE_MAX_CONNECTIONS", "value": 1}
    codes = {s.framework: s.code for s in knob_snippets(knob)}
    assert codes == {"megatron_bridge": "cfg.comm_overlap.tp_comm_overlap = 1",
                     "nemo": "recipe.model.config.tp_comm_overlap = 1",
                     "megatron_lm": "--tp-comm-overlap 1", "env": "export CUDA_DEVICE_MAX_CONNECTIONS=1"}
    off = {s.framework: s.code for s in knob_snippets({"megatron_lm": "--overlap-grad-reduce", "value": False,
                                                       "megatron_bridge": "ddp.bucket_size", "env": "X; rm -rf /"})}
    assert "megatron_lm" not in off  # a switch set to False is an absent flag: nothing to paste
    assert off["megatron_bridge"] == "cfg.ddp.bucket_size = False"
    assert "env" not in off  # not a variable name: never shown as a statement
    assert knob_snippets({"env": "NCCL_ALGO", "value": "Ring; echo"})[0].code == "export NCCL_ALGO='Ring; echo'"


def test_timeline_draws_the_critical_path_of_the_drawn_step() -> None:
    """Each drawn rank's timeline has a critical-path row: the same median step's path, inside the step,
    crossing onto the peer rank where it waited for it."""
    from perfdoctor.render.html import _timeline_figure

    report = api.analyze([SAMPLES / "real_h100"], jobs=1)
    drawn = [ex for ex in report.excerpts if ex is not None]
    assert len(drawn) == 2
    for ex in drawn:
        fig = _timeline_figure(ex, report.path[str(ex.rank)])
        bars = [t for t in fig["data"] if t.get("legendgroup") == "path"]
        assert bars and fig["layout"]["yaxis"]["categoryarray"][-1] == "critical path"
        spans = [(b, b + x) for t in bars for b, x in zip(t["base"], t["x"])]
        assert all(-1 <= a < b <= ex.step_ms * 1e3 + 1 for a, b in spans)
        assert sum(b - a for a, b in spans) > 0.5 * ex.step_ms * 1e3
    # Where a rank waited for the other at the all-to-alls, its path runs on the other rank and says so.
    crossing = [h for ex in drawn for t in _timeline_figure(ex, report.path[str(ex.rank)])["data"]
                if t.get("legendgroup") == "path" for h in t["hovertext"] if h.startswith("rank ")]
    assert crossing
