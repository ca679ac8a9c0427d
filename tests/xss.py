"""A trace whose user-controlled strings are HTML/JS injection probes (for the HTML and Markdown tests)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from tests.paths import SAMPLES

SCRIPT_PROBE = "<script>document.title='XSSED'</script>"
IMG_PROBE = "\"><img src=x onerror=\"document.title='XSSED'\">"
DIR_PROBE = "run<img src=x onerror=document.title=1>"  # a directory name (no slash)


def probe_trace(tmp: Path) -> Path:
    """A copy of the exposed-DP sample in a folder named like an injection, with its two most expensive
    kernel names replaced by the probes."""
    folder = tmp / DIR_PROBE
    folder.mkdir()
    trace = folder / "probe.sqlite"
    shutil.copy(next((SAMPLES / "exposed_dp").glob("*.sqlite")), trace)
    with sqlite3.connect(trace) as conn:
        ids = [row[0] for row in conn.execute(
            "SELECT shortName FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY shortName "
            "ORDER BY sum(end - start) DESC LIMIT 2")]
        for sid, probe in zip(ids, (SCRIPT_PROBE, IMG_PROBE)):
            conn.execute("UPDATE StringIds SET value = ? WHERE id = ?", (probe, sid))
    conn.close()
    return trace
