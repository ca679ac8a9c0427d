"""CI guard against a gross speed regression: a small paired measurement, never an absolute threshold.

What ``perfdoctor analyze`` does with a 100,000-kernel export (benchmarks/timed.py, after the imports) is
timed against the C-level scan of the same file, alternating, 5 rounds; the median per-round ratio must stay
within twice the ratio that ``benchmarks/run_all.py`` recorded in benchmarks/recorded.json. Noise on a
shared machine moves the ratio by tens of percent; a 2× jump means the code got slower (e.g. an O(n log n)
step became O(n²), or a heavy import crept into start-up).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import perfdoctor
from tests.paths import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

from make_big_trace import write  # noqa: E402
from paired import paired, ratio  # noqa: E402
from run_all import RECORDED, timed  # noqa: E402


@pytest.mark.slow
def test_analyze_ratio_at_100k_kernels_within_twice_the_recorded_one(tmp_path):
    recorded = json.loads(RECORDED.read_text())
    trace = tmp_path / "guard.sqlite"
    write(trace, recorded["kernels"])
    # The child imports the perfdoctor this suite imported: the installed wheel in CI, else the checkout.
    env = {**os.environ, "PYTHONPATH": str(Path(perfdoctor.__file__).resolve().parents[1])}
    s = paired({"analyze": timed("analyze", trace), "scan": timed("scan", trace)}, reps=5, env=env)
    measured = ratio(s["analyze"], s["scan"], work=True)
    assert measured <= 2 * recorded["ratio_to_scan"], (
        f"analyze / C-level scan at {recorded['kernels']:,} kernels: {measured:.1f}x, recorded "
        f"{recorded['ratio_to_scan']:.1f}x (medians of 5 paired rounds): a gross regression")
