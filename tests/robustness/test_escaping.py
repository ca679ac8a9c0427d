"""Threat 5, injection: user strings (kernel names, metric keys of saved reports, rule texts) stay inert
in Markdown (no live HTML, no escape from a code span or a table cell, no @mention) and on the
terminal (no escape sequence or control character reaches it; rich never reads them as markup)."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from perfdoctor.render.escape import code_span, md, terminal_text
from tests.paths import REPO, SAMPLES
from tests.robustness.harness import perfdoctor

# Window title (OSC), clear screen + cursor home (CSI), a C1 CSI, BEL, backspace, a bidi override.
TERMINAL_PROBE = "\x1b]0;pwned\x07\x1b[2J\x1b[H\x9b31m\x08\u202eevil"
MARKDOWN_PROBE = "a``b`|c @octocat <img src=x onerror=alert(1)> &amp; [x](javascript:alert(1))"
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def render_gfm(text: str) -> str:
    return MarkdownIt("commonmark").enable("table").render(text)


def assert_inert_html(html: str) -> None:
    assert "<img" not in html and "<script" not in html and 'href="javascript' not in html
    assert not re.search(r"@octocat\b", re.sub(r"<code>.*?</code>", "", html, flags=re.S)), "live mention"


def hostile_trace(tmp: Path) -> Path:
    """The exposed-TP sample with its three most expensive kernel names carrying the probes."""
    trace = tmp / "hostile.sqlite"
    shutil.copy(SAMPLES / "exposed_tp" / "exposed_tp.rank0.sqlite", trace)
    with sqlite3.connect(trace) as conn:
        ids = [row[0] for row in conn.execute("SELECT shortName FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY shortName "
                                              "ORDER BY sum(end - start) DESC LIMIT 3")]
        for sid, probe in zip(ids, (TERMINAL_PROBE, MARKDOWN_PROBE, "|".join(["x"] * 5))):
            conn.execute("UPDATE StringIds SET value = ? WHERE id = ?", (probe, sid))
    conn.close()
    return trace


def test_markdown_helpers():
    html = render_gfm(f"{md(MARKDOWN_PROBE)}\n\n| k | v |\n|---|---|\n| {code_span(MARKDOWN_PROBE)} | "
                      f"{md(MARKDOWN_PROBE)} |\n")
    assert_inert_html(html)
    assert html.count("<td>") == 2  # the pipes stayed inside their cells
    assert "<code>a``b`|c @octocat &lt;img" in html  # the code span shows the text as it is
    assert code_span("`x`") == "`` `x` ``" and code_span("plain") == "`plain`"
    assert terminal_text(TERMINAL_PROBE) == "]0;pwnedevil".replace("]0;pwned", "")


def test_analyze_markdown_and_terminal_keep_kernel_names_inert(tmp_path):
    trace = hostile_trace(tmp_path)
    result = perfdoctor("analyze", trace, "--markdown", tmp_path / "r.md")
    assert result.code == 0, result.err
    assert not CONTROL.search(result.out.replace("\n", "")), "control character on the terminal"
    assert "[2J" not in result.out and "pwned" not in result.out
    text = (tmp_path / "r.md").read_text()
    assert not CONTROL.search(text.replace("\n", ""))
    html = render_gfm(text)
    assert_inert_html(html)
    rows = re.findall(r"<tr>(.*?)</tr>", html, flags=re.S)
    kernel_rows = [r for r in rows if "x|x|x|x|x" in r]
    assert kernel_rows and all(r.count("<td") == 4 for r in kernel_rows)  # kernel | category | count | ms


def _report(path: Path, keys: dict[str, float], summary: str) -> Path:
    path.write_text(json.dumps({
        "schema_version": "1", "metrics": {"all": {"step.time_ms": 100.0, **keys}, "ranks": {}},
        "findings": [{"rule": "x`<b>@octocat", "severity": "high", "summary": summary}], "steps": {"count": 1}}))
    return path


def test_diff_markdown_keeps_metric_keys_inert(tmp_path):
    key = "k`<img src=x onerror=alert(1)>`|@octocat"
    base = _report(tmp_path / "a.json", {key: 1.0}, "ok")
    head = _report(tmp_path / "b.json", {key: 50.0}, MARKDOWN_PROBE + TERMINAL_PROBE)
    result = perfdoctor("diff", base, head, "-f", "markdown")
    assert result.code == 0, result.err
    html = render_gfm(result.out)
    assert_inert_html(html)
    rows = [r for r in re.findall(r"<tr>(.*?)</tr>", html, flags=re.S) if "<th" not in r]
    assert rows
    for row in rows:
        assert row.count("<td") == 6, row  # metric | base | head | delta | noise | verdict
    terminal = perfdoctor("diff", base, head)
    assert terminal.code == 0, terminal.err
    assert not CONTROL.search(terminal.out.replace("\n", "")) and "pwned" not in terminal.out


@pytest.mark.parametrize("title", ["[/bold] closes nothing", "[link=javascript:x]click[/link]",
                                   "title " + TERMINAL_PROBE])
def test_rule_texts_are_not_markup_nor_control_codes(tmp_path, title):
    rules = tmp_path / "rules"
    rules.mkdir()
    spec = (REPO / "rules" / "gc-pause.yaml").read_text().replace("id: gc-pause", "id: my-gc")
    spec = re.sub(r"^title: .*$", lambda _: "title: " + json.dumps(title), spec, count=1, flags=re.M)
    (rules / "my-gc.yaml").write_text(spec)
    result = perfdoctor("rules", "--rules", rules)
    assert result.code == 0, result.err
    assert not CONTROL.search(result.out.replace("\n", ""))
    shown = " ".join(result.out.split())
    assert terminal_text(title).split()[0] in shown
    explained = perfdoctor("explain", "my-gc", "--rules", rules)
    assert explained.code == 0, explained.err
    assert not CONTROL.search(explained.out.replace("\n", "")) and terminal_text(title) in explained.out
