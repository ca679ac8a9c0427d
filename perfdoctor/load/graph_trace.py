"""CUDA graph replays traced as whole graphs (nsys' default ``--cuda-graph-trace=graph``, DESIGN §3).

In that mode nsys does not record the kernels of a replayed graph: each replay is one row of
``CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` (start, end, device, stream, graphId, graphExecId, and the
correlationId of the ``cudaGraphLaunch`` call that issued it; new in 2024.2, research/nsys_schema.md §3.5).
Ignoring the table reads a 99 %-busy graphed run as mostly idle and invents launch-bound gaps.

A replay joins the Timeline's ``kernels`` table as one kernel-like row: the device is busy for its
whole duration, host gaps cannot fall inside it, and its launch call is found through the correlation id
like any kernel's, so every interval measurement (busy, compute, exposed comm, host gaps, steps) stays
correct without a second code path. Its name, ``[CUDA graph <graphId> replay]`` (``GRAPH_REPLAY``),
matches no taxonomy row, so it counts as compute: the table does not say which kernels a graph holds,
and an NCCL kernel captured into a graph is counted as compute too. Measurements that need each
kernel's identity (kernel mix, GEMM share, launch statistics, LayerNorm blocking) are unknown while
replays hide kernels (perfdoctor.measure.graphs), and the loader warns how to capture them
(``--cuda-graph-trace=node``, where graph kernels are ordinary kernel rows sharing the launch's
correlation id).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np

from perfdoctor.table import Strings, Table
from perfdoctor.width import code_type, fitted

if TYPE_CHECKING:
    from perfdoctor.load.sqlite_export import SqliteExport

GRAPH_TABLE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
GRAPH_REPLAY = re.compile(r"^\[CUDA graph -?\d+ replay\]$")
NS_PER_MS = 1e6


def replay_name(graph_id: int) -> str:
    return f"[CUDA graph {graph_id} replay]"


def read_replays(db: SqliteExport, warnings: list[str]) -> Table | None:
    """The export's graph replays as kernel rows (start end device_id stream correlation_id global_pid and
    the replay's name as short_name and demangled_name), None when it has no graph trace. Appends the
    capture-mode warning."""
    wanted = {"start": "start", "end": "end", "device_id": "deviceId", "stream": "streamId",
              "correlation_id": "correlationId", "global_pid": "globalPid", "graph_id": "graphId"}
    if not db.has(GRAPH_TABLE) or any(not db.has(GRAPH_TABLE, col) for col in wanted.values()):
        return None
    raw = db.read(GRAPH_TABLE, wanted)
    if not len(raw):
        return None
    rows = {c: _filled(raw.col(c)) for c in wanted}
    graph_ids = rows.pop("graph_id")
    uniq, inverse = np.unique(graph_ids, return_inverse=True)
    names = Strings(inverse.reshape(-1).astype(code_type(uniq.size)),
                    np.array([replay_name(int(g)) for g in uniq], dtype=object))
    replays = Table(rows)
    replays["short_name"] = names
    replays["demangled_name"] = names
    total_ms = float((rows["end"] - rows["start"]).sum()) / NS_PER_MS
    warnings.append(
        f"{len(raw)} CUDA graph replays ({total_ms:,.1f} ms of GPU time, {uniq.size} graphs) were traced "
        "as whole graphs (nsys --cuda-graph-trace=graph, the default): they count as busy compute, but the kernels "
        "inside them were not captured, so kernel mix, GEMM share, launch statistics and LayerNorm blocking are "
        "unknown; capture with `nsys profile --cuda-graph-trace=node` to see each kernel")
    return replays


def with_replays(kernels: Table, replays: Table | None) -> Table:
    """``kernels`` plus the graph replays as rows (sorted by start, as the loader keeps kernels); the
    kernel columns a replay lacks (launch type, geometry) are -1. The merged columns keep the kernels'
    widths where the replays' values fit them."""
    if replays is None or not len(replays):
        return kernels
    if not len(kernels.columns):
        return replays
    rows = Table({c: _as_in(replays[c] if c in replays else np.full(len(replays), -1, dtype=np.int64), kernels[c])
                  for c in kernels.columns}, rows=len(replays))
    merged = Table.concat([kernels, rows]) if len(kernels) else rows
    return merged.sorted_by("start")


def _as_in(values: np.ndarray | Strings, column: np.ndarray | Strings) -> np.ndarray | Strings:
    """Integer ``values`` at the width of the kernels' ``column`` when they fit it."""
    if isinstance(values, Strings) or isinstance(column, Strings) or column.dtype.kind not in "iu":
        return values
    return fitted(values, column.dtype.type)


def _filled(values: np.ndarray) -> np.ndarray:
    """An integer column with NULLs (NaN from the reader) as -1."""
    if values.dtype.kind == "f":
        return np.where(np.isnan(values), -1, values).astype(np.int64)
    return values.astype(np.int64, copy=False)


def replay_mask(kernels: Table) -> np.ndarray:
    """Rows of ``kernels`` that are whole-graph replays (not kernels)."""
    names = kernels["short_name"]
    if not len(names):
        return np.zeros(0, dtype=bool)
    return names.where(lambda name: bool(GRAPH_REPLAY.match(str(name))))
