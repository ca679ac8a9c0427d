"""The committed synthetic sample traces are exactly what `scripts/regen_samples.py` produces."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from perfdoctor.synth import run_scenario

from .conftest import scenario_paths

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def _dump(path: Path) -> dict[str, list[tuple]]:
    con = sqlite3.connect(path)
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
    out = {t: con.execute(f"SELECT * FROM {t}").fetchall() for t in tables}
    con.close()
    return out


@pytest.mark.parametrize(
    "scenario",
    [p for p in scenario_paths() if p.stem in {"pp_interleaved", "per_node", "exposed_tp"}],
    ids=lambda p: p.stem,
)
def test_committed_samples_match_regeneration(tmp_path: Path, scenario: Path) -> None:
    committed = SAMPLES / scenario.stem
    if not committed.exists():
        pytest.skip("sample_traces not present")
    fresh = run_scenario(scenario, tmp_path)
    assert sorted(p.name for p in fresh) == sorted(p.name for p in committed.glob("*.sqlite"))
    for p in fresh:
        assert _dump(p) == _dump(committed / p.name), p.name
        t = p.with_suffix(".truth.json")
        assert json.loads(t.read_text()) == json.loads((committed / t.name).read_text())


def test_every_scenario_has_committed_samples() -> None:
    if not SAMPLES.exists():
        pytest.skip("sample_traces not present")
    for p in scenario_paths():
        files = list((SAMPLES / p.stem).glob("*.sqlite"))
        assert files, p.stem
        assert all(f.stat().st_size < 3 * 2**20 for f in files)
    total = sum(f.stat().st_size for f in SAMPLES.rglob("*") if f.is_file())
    assert total < 25 * 2**20
