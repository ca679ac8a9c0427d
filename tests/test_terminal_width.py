"""The terminal report's width: a pipe or a file gets lines as wide as their content (CI logs, ``| less``,
``> file``), ``COLUMNS`` is honoured, and no finding line is ever broken across lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.paths import REAL_H100


def _analyze(*args: str, columns: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns:
        env["COLUMNS"] = columns
    out = subprocess.run([sys.executable, "-m", "perfdoctor", "analyze", str(REAL_H100), *args],
                         capture_output=True, text=True, env=env, timeout=300, check=False)
    assert out.returncode in (0, 1), out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def findings() -> list[dict]:
    return json.loads(_analyze("--format", "json"))["findings"]


def test_piped_report_breaks_no_finding_line(findings: list[dict]) -> None:
    text = _analyze()
    lines = text.splitlines()
    assert findings
    for f in findings:
        for part in (f"{f['rule']}  {f['title']}", f["summary"], f"fix: {f['advice']}"):
            assert any(part in line for line in lines), f"{part!r} is broken across lines"
    assert "warnings" in text and not any(line.startswith("  !") and line.endswith(" ") for line in lines)
    # as wide as the content: lines are not padded out to one fixed width
    widths = {len(line) for line in lines}
    assert len(widths) > 3 and max(widths) > 80


def test_columns_is_honoured() -> None:
    lines = _analyze(columns="100").splitlines()
    assert max(len(line) for line in lines) <= 100
