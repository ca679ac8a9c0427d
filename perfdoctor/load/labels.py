"""perfdoctor's own NVTX labels (DESIGN §4): parse ``kind key=value ...`` messages and capture marks.

Only ranges and marks in the ``perfdoctor`` domain count; anything else is somebody else's label.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import numpy as np

from perfdoctor.memo import per_object

if TYPE_CHECKING:
    import pandas as pd

    from perfdoctor.model import Timeline

DOMAIN = "perfdoctor"

def parse_label(text: str) -> tuple[str, dict[str, str]]:
    """``"comm op=all_reduce group=dp"`` → ``("comm", {"op": "all_reduce", "group": "dp"})``."""
    kind, _, rest = text.partition(" ")
    fields = {}
    for token in rest.split():
        key, eq, value = token.partition("=")
        if eq:
            fields[key] = value
    return kind, fields


def labelled(nvtx: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Rows of ``nvtx`` in the perfdoctor domain whose message starts with ``kind``.

    Messages repeat (every step, every layer), so each distinct message is tested once.
    """
    if not len(nvtx):
        return nvtx
    rows, codes, uniques = _our_messages(nvtx)
    prefix = kind + " "
    hit = np.array([isinstance(t, str) and (t == kind or t.startswith(prefix)) for t in uniques], dtype=bool)
    return nvtx.iloc[rows[(codes >= 0) & hit[np.maximum(codes, 0)]]]


def matching(nvtx: pd.DataFrame, pattern: re.Pattern[str]) -> pd.DataFrame:
    """Rows of ``nvtx`` (any domain) whose message matches ``pattern``; each distinct message tested once."""
    if not len(nvtx):
        return nvtx
    codes, uniques = _messages(nvtx)
    hit = np.array([isinstance(t, str) and bool(pattern.match(t)) for t in uniques], dtype=bool)
    return nvtx.iloc[np.flatnonzero((codes >= 0) & hit[np.maximum(codes, 0)])]


@per_object
def _messages(nvtx: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    import pandas as pd

    codes, uniques = pd.factorize(nvtx["text"].to_numpy(dtype=object))
    return codes, np.asarray(uniques, dtype=object)


@per_object
def _our_messages(nvtx: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of the perfdoctor domain and their distinct messages (codes into uniques), once per table."""
    import pandas as pd

    rows = np.flatnonzero(nvtx["domain"].to_numpy(dtype=object) == DOMAIN)
    codes, uniques = pd.factorize(nvtx["text"].to_numpy(dtype=object)[rows])
    return rows, codes, np.asarray(uniques, dtype=object)


def rank_mark(timeline: Timeline) -> dict[str, int] | None:
    """The ``rank r=.. local=.. world=..`` mark of a process, if the capture hook wrote one."""
    for text in labelled(timeline.nvtx, "rank")["text"]:
        _, fields = parse_label(text)
        try:
            return {k: int(v) for k, v in fields.items()}
        except ValueError:
            continue
    return None


def config_mark(timeline: Timeline) -> dict[str, Any]:
    """The ``config {json}`` mark of a process (parallel and model config known at capture time)."""
    for text in labelled(timeline.nvtx, "config")["text"]:
        try:
            value = json.loads(text.partition(" ")[2])
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return {}
