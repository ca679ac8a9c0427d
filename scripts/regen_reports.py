"""Regenerate reports/: an HTML and a Markdown report per sample_traces/ scenario, and one diff.

Run from anywhere: ``python scripts/regen_reports.py [--out DIR]``. The output is deterministic (inputs
are named relative to the repository, no timestamps), so tests/test_reports_fresh.py can regenerate
into a temporary folder and compare. The HTML pages share one ``plotly.min.js`` beside them instead of
inlining 5 MB each; ``perfdoctor analyze --html`` inlines it by default.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Every sample_traces/ folder is a scenario (or a real capture); the diff shows a regression.
DIFF = ("clean_baseline", "exposed_dp")
PLOTLY_FILE = "plotly.min.js"


def scenarios() -> list[str]:
    return sorted(p.name for p in (REPO / "sample_traces").iterdir() if p.is_dir() and any(p.glob("*.sqlite")))


def regenerate(out: Path) -> list[Path]:
    """Write every example report into ``out``; returns the files written."""
    sys.path.insert(0, str(REPO))
    from perfdoctor import api
    from perfdoctor.render.diff_html import render_diff_html
    from perfdoctor.render.diff_markdown import render_diff_markdown
    from perfdoctor.render.html import plotly_js_inline, render_html
    from perfdoctor.render.markdown import render_markdown

    out.mkdir(parents=True, exist_ok=True)
    written = []

    def write(name: str, text: str) -> None:
        path = out / name
        path.write_text(text, encoding="utf-8")
        written.append(path)

    cwd = Path.cwd()
    os.chdir(REPO)  # inputs are named relative to the repository in the reports
    try:
        write(PLOTLY_FILE, plotly_js_inline())
        for name in scenarios():
            report = api.analyze([Path("sample_traces") / name])
            write(f"{name}.html", render_html(report, plotly_js=PLOTLY_FILE))
            write(f"{name}.md", render_markdown(report, title=name))
        base, head = (Path("sample_traces") / n for n in DIFF)
        diff = api.diff(base, head)
        write(f"diff_{DIFF[0]}_vs_{DIFF[1]}.html", render_diff_html(diff, plotly_js=PLOTLY_FILE))
        write(f"diff_{DIFF[0]}_vs_{DIFF[1]}.md", render_diff_markdown(diff))
    finally:
        os.chdir(cwd)
    for old in out.iterdir():  # reports of scenarios that no longer exist
        if old.suffix in (".html", ".md") and old not in written:
            old.unlink()
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "reports", help="output folder (default: reports/)")
    args = parser.parse_args()
    for path in regenerate(args.out.resolve()):
        print(path)


if __name__ == "__main__":
    main()
