"""Open every reports/*.html in headless Chromium: no console messages, every plot drawn, a screenshot;
and the injection probe page runs none of its probes.

Needs Debian's ``chromium`` (.ci/run installs it). Without it the tests skip on a developer machine and
fail when ``CI`` is set. Screenshots go to ``$PERFDOCTOR_SCREENSHOTS`` (default: pytest's tmp dir).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from perfdoctor import api
from perfdoctor.render.html import render_html
from tests.conftest import in_ci
from tests.paths import REPO
from tests.xss import probe_trace

REPORTS = sorted((REPO / "reports").glob("*.html"))
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=8000", "--allow-file-access-from-files"]


@pytest.fixture(scope="module")
def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        message = "headless Chromium not found (Debian package `chromium`; .ci/run installs it)"
        if in_ci():
            pytest.fail(f"CI is set, so the browser tests must run: {message}")
        pytest.skip(message)
    return found


def _run(chromium: str, page: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([chromium, *FLAGS, *extra, page.resolve().as_uri()], capture_output=True, text=True,
                          timeout=120)


def _console(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@pytest.mark.slow
@pytest.mark.parametrize("page", REPORTS, ids=[p.name for p in REPORTS])
def test_report_renders_without_errors(chromium, page, tmp_path):
    done = _run(chromium, page, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    assert not _console(done.stderr), _console(done.stderr)
    figures = page.read_text(encoding="utf-8").count("data-figure=")  # none for a CPU-only capture
    drawn = len(re.findall(r'class="[^"]*\bjs-plotly-plot\b', done.stdout))
    assert drawn == figures and (not figures or 'class="main-svg"' in done.stdout), f"{drawn}/{figures} drawn"
    shots = Path(os.environ.get("PERFDOCTOR_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    shot = shots / f"{page.stem}.png"
    done = _run(chromium, page, "--window-size=1400,2600", f"--screenshot={shot}")
    assert done.returncode == 0 and shot.stat().st_size > 10_000


def test_injection_probes_do_not_run(chromium, tmp_path):
    report = api.analyze([probe_trace(tmp_path)])
    page = tmp_path / "probe.html"
    page.write_text(render_html(report, plotly_js="inline"), encoding="utf-8")
    done = _run(chromium, page, "--dump-dom")
    assert done.returncode == 0
    dom = done.stdout
    title = re.search(r"<title>(.*?)</title>", dom, re.S).group(1)
    assert title.startswith("perfdoctor") and "XSSED" not in title
    assert not re.search(r"<img[^>]*onerror", dom)  # no element was created from a kernel name or a path
    assert "&lt;script&gt;document.title='XSSED'&lt;/script&gt;" in dom  # shown as text instead
    assert not _console(done.stderr)
