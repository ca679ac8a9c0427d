"""Cut a written trace down to a capture window, as ``nsys profile --delay D --duration L`` records it.

A time-windowed capture holds only the events that ran inside the window: no step that began before it,
often no optimizer step at all when the window is shorter than an iteration. Rows of every event table
that do not lie wholly inside ``[start, end]`` (file clock, ns) are deleted; NVTX domain creations (made
once per process, before any window) stay, as nsys keeps the domain names of the ranges it records.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from perfdoctor.synth.recorder import NVTX_DOMAIN_CREATE

EVENT_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
                "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
                "CUPTI_ACTIVITY_KIND_GRAPH_TRACE")


def cut_window(path: Path, start: int, end: int) -> None:
    """Delete, in place, every event of the SQLite export ``path`` outside ``[start, end]``."""
    con = sqlite3.connect(path)
    with con:
        present = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        for table in (t for t in EVENT_TABLES if t in present):
            con.execute(f"DELETE FROM {table} WHERE start < ? OR end > ?", (start, end))
        con.execute("DELETE FROM NVTX_EVENTS WHERE eventType != ? AND (start < ? OR coalesce(end, start) > ?)",
                    (NVTX_DOMAIN_CREATE, start, end))
    con.close()
