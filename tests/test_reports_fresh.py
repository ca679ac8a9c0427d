"""reports/ must be what scripts/regen_reports.py makes from the current code and sample_traces/."""

from __future__ import annotations

import importlib.util

from tests.paths import REPO

FIX = "reports/ is stale: run `python scripts/regen_reports.py` and commit reports/"


def test_reports_are_fresh(tmp_path):
    spec = importlib.util.spec_from_file_location("regen_reports", REPO / "scripts" / "regen_reports.py")
    regen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(regen)
    fresh = {p.name: p for p in regen.regenerate(tmp_path)}
    committed = {p.name: p for p in (REPO / "reports").iterdir() if p.suffix in (".html", ".md", ".js")}
    assert sorted(fresh) == sorted(committed), FIX
    stale = [name for name, p in fresh.items() if p.read_bytes() != committed[name].read_bytes()]
    assert not stale, f"{FIX} (differs: {', '.join(sorted(stale))})"
