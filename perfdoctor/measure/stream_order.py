"""Order of kernels on their streams: a kernel cannot start before the one queued ahead of it on its
stream has finished, so "ready" times (LayerNorm blocking, TP overlap ordering) start from there."""

from __future__ import annotations

import numpy as np

from perfdoctor.table import distinct


def previous_on_stream(rows: np.ndarray, stream: np.ndarray) -> np.ndarray:
    """For each kernel row of ``rows``, the row of the kernel before it on its stream (−1: none).

    ``stream`` covers every kernel of the timeline. Kernels come sorted by start (the loader's
    contract), so a stream's rows in order are its kernels in order: one search per stream instead of
    sorting every kernel by (stream, start).
    """
    prev = np.full(rows.size, -1, dtype=np.int64)
    for s_id in distinct(stream[rows]):
        mine = np.flatnonzero(stream[rows] == s_id)
        on_stream = np.flatnonzero(stream == s_id)
        pos = np.searchsorted(on_stream, rows[mine]) - 1
        prev[mine] = np.where(pos >= 0, on_stream[np.maximum(pos, 0)], -1)
    return prev
