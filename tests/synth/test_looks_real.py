"""Synthetic and real exports must look alike to `perfdoctor analyze` (issue 3): the same event tables
populated, the same API name forms, so nothing in the pipeline can tell them apart by shape."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from perfdoctor.load.nsys import load_export

REAL_2026 = Path(__file__).resolve().parents[2] / "sample_traces" / "real_h100" / "h100_2gpu_fastvideo.sqlite"
MASK_SQL = -0x1000000  # globalTid -> globalPid as a signed 64-bit SQLite integer
pytestmark = pytest.mark.skipif(not REAL_2026.exists(), reason="real 2026 export not available")


def _non_empty(con: sqlite3.Connection) -> set[str]:
    names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    return {t for t in names if con.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone()}


def _issuing_calls(con: sqlite3.Connection) -> set[str]:
    """Runtime API names that issued a copy, a fill or a synchronization record."""
    out: set[str] = set()
    for table in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"):
        out |= {
            n
            for (n,) in con.execute(
                f"SELECT DISTINCT s.value FROM {table} t JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
                "ON r.correlationId = t.correlationId AND (r.globalTid & ?) = t.globalPid "
                "JOIN StringIds s ON s.id = r.nameId",
                (MASK_SQL,),
            )
        }
    return out


def _synthetic_2026(generated: dict) -> Path:
    for paths in generated.values():
        for p in paths:
            con = sqlite3.connect(p)
            version = con.execute("SELECT value FROM META_DATA_EXPORT WHERE name='EXPORT_PRODUCT_VERSION'").fetchone()
            con.close()
            if version and version[0].startswith("2026"):
                return p
    raise AssertionError("no 2026-style scenario")


def test_synthetic_populates_the_real_event_tables(generated: dict) -> None:
    real = sqlite3.connect(f"file:{REAL_2026}?mode=ro", uri=True)
    real_events = {t for t in _non_empty(real) if t.startswith("CUPTI_ACTIVITY_KIND_") or t == "NVTX_EVENTS"}
    assert {"CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"} <= (
        real_events
    )
    con = sqlite3.connect(_synthetic_2026(generated))
    assert _non_empty(con) >= real_events
    # the calls behind copies, fills and syncs are spelled as in the real export (name_vNNNN)
    assert _issuing_calls(con) <= _issuing_calls(real)
    con.close()
    real.close()


def test_loader_counts_copies_and_fills_in_both(generated: dict) -> None:
    for path in (REAL_2026, _synthetic_2026(generated)):
        info, timelines = load_export(path)
        assert info.counts["memcpy"] > 0 and info.counts["memset"] > 0 and info.counts["sync"] > 0, path.name
        assert any(len(tl.memcpy) and len(tl.memset) for tl in timelines), path.name
