"""perfdoctor.quantiles gives numpy's median and percentile bit for bit, and an analysis no longer imports
numpy.ma (the reason the module exists: 9–10 ms of every command's start-up)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from perfdoctor.quantiles import median, percentile
from tests.paths import REAL_H100


def _same(a: object, b: object) -> bool:
    """Equal bit for bit, as the same type (NaN equal to NaN)."""
    return type(a) is type(b) and np.asarray(a).tobytes() == np.asarray(b).tobytes()


def _samples(rng: np.random.Generator) -> list[np.ndarray]:
    out = []
    for n in [*range(1, 12), 50, 51, 1000, 1001]:
        out += [rng.normal(size=n), rng.integers(-5, 5, size=n).astype(np.float64),  # ties
                rng.integers(0, 10**12, size=n).astype(np.float64), np.full(n, 7.25),
                rng.exponential(size=n) * 1e9, np.where(rng.random(n) < 0.2, -0.0, rng.random(n))]
        with_nan = rng.normal(size=n)
        with_nan[rng.integers(n)] = np.nan
        with_inf = rng.normal(size=n)
        with_inf[rng.integers(n)] = np.inf
        out += [with_nan, with_inf]
    return out


def test_median_is_numpys_bit_for_bit():
    rng = np.random.default_rng(7)
    for a in _samples(rng):
        assert _same(median(a), np.median(a)), a
        assert _same(median(a.tolist()), np.median(a.tolist()))
        mine, theirs = a.copy(), a.copy()
        assert _same(median(mine, overwrite_input=True), np.median(theirs, overwrite_input=True))
    for other in (np.arange(10), np.arange(9, dtype=np.int32), [3, 1, 2], np.ones((3, 4)), np.zeros(0, dtype=np.int64),
                  np.float32([1.5, 2.25, 3.0, 4.0])):  # handed to numpy
        assert _same(median(other), np.median(other))


@pytest.mark.parametrize("q", [0, 1, 10, 25, 50, 75, 90, 99, 100, 33.3, 66.7, 90.0])
def test_percentile_is_numpys_bit_for_bit(q):
    rng = np.random.default_rng(int(q * 10))
    for a in _samples(rng):
        assert _same(percentile(a, q), np.percentile(a, q)), (q, a)
    for other in (np.arange(10), [3.0, 1.0, 2.0], np.float32([1.5, 2.25, 3.0])):  # handed to numpy
        assert _same(percentile(other, q), np.percentile(other, q))


def test_an_analysis_leaves_numpy_ma_unimported():
    script = """
import sys
from perfdoctor import api
from perfdoctor.render.json import write_json
from perfdoctor.render.terminal import render_terminal
from rich.console import Console
report = api.analyze([sys.argv[1]])
write_json(report, lambda text: None)
render_terminal(report, Console(file=open("/dev/null", "w")))
print("numpy.ma" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", script, str(REAL_H100)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"]
