"""Load an Nsight Systems SQLite export into Timelines, one per (process, device).

Version-aware by construction: the exporter (``EXPORT_META_DATA`` up to 2022.4, ``META_DATA_EXPORT``
from 2023.4) and schema version are recorded, and every read asks which tables and columns exist
instead of relying on positions (research/nsys_schema.md §5). Missing tables mean "no data of that
kind" because nsys creates tables lazily.

The file is only ever read: see :mod:`perfdoctor.load.sqlite_export`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np

from perfdoctor.cores import beside, sized_for
from perfdoctor.errors import InputError, shown
from perfdoctor.heap import huge_pages_for
from perfdoctor.load.graph_trace import read_replays, with_replays
from perfdoctor.load.nccl_payload import read_payloads
from perfdoctor.load.nsys_columns import (
    CUDA_TABLES,
    DETAIL_COLUMNS,
    DEVICE_COLUMNS,
    SYNC_TABLE,
    api_columns,
    kernel_columns,
    routed_tables,
    selected,
)
from perfdoctor.load.pieces import Pieces
from perfdoctor.load.sqlite_export import SqliteExport
from perfdoctor.mapped import taken
from perfdoctor.model import GpuInfo, Timeline, TraceInfo
from perfdoctor.table import Strings, Table, distinct, factorize, repeated
from perfdoctor.width import code_type, fitted

# Newest export schema we have seen documented (nsys 2026.5); newer ones are read with a warning.
KNOWN_SCHEMA = (3, 30)

# NVTX event types (ENUM_NSYS_EVENT_TYPE; identical from 2022.4 to 2026.x).
NVTX_MARK = 34
NVTX_THREAD_NAME = 39
NVTX_PUSH_POP = 59
NVTX_START_END = 60
NVTXT_PUSH_POP = 70
NVTXT_START_END = 71
NVTX_DOMAIN_CREATE = 75
NVTX_KEPT_TYPES = (NVTX_MARK, NVTX_PUSH_POP, NVTX_START_END, NVTXT_PUSH_POP, NVTXT_START_END)

# Event class of OS runtime calls in OSRT_API (31/32 are zero-length "profiling started/finished" markers).
OSRT_CALL_CLASS = 27

INT64_LIMIT = 2**63
TID_BITS = 24
PID_MASK = ~((1 << TID_BITS) - 1)  # globalTid → globalPid
ID_MASK = (1 << TID_BITS) - 1  # the 24-bit pid or tid field


NAME_COLUMNS = ("short_name", "demangled_name", "name")  # dictionary-encoded text (table.Strings)
# String ids up to this span (per row, plus a constant) are mapped through a lookup table sized by the
# largest id; beyond it (sparse ids, or a damaged one near 2**63) they are sorted instead.
_DENSE_IDS_PER_ROW = 4
_DENSE_IDS = 1 << 22
# Kernel (and, for the correlation id, CUDA call) columns stored narrow when their values fit: CUPTI's
# 32-bit fields, so they always do in nsys' exports; the launch type is one of three values.
NARROW_COLUMNS = {"device_id": np.int32, "stream": np.int32, "launch_type": np.int8, "correlation_id": np.int32}
_API_VERSION_SUFFIX = re.compile(r"_v\d+$")
_ENV_ROW = re.compile(r"^PROCESS_\d+:ENVIRONMENT_VARIABLE$")


class BadValue(ValueError):
    """A value of the wrong type or range in a column of the export; the reader of the table names it
    (:func:`_values_of`)."""

    def __init__(self, table: str | None, column: str, value: object, expected: str) -> None:
        super().__init__(column)
        self.table, self.column, self.value, self.expected = table, column, value, expected

    def __str__(self) -> str:
        return f"table {self.table}, column {_export_column(self.column)}: {shown(self.value)} is not {self.expected}"


@contextmanager
def _values_of(table: str) -> Iterator[None]:
    """Name ``table`` in the :class:`BadValue` of a column read inside."""
    try:
        yield
    except BadValue as exc:
        exc.table = exc.table or table
        raise


def pid_of(global_id: int) -> int:
    """The OS process id inside a globalTid/globalPid (bits 24-47)."""
    return (int(global_id) >> TID_BITS) & ID_MASK


def load_export(path: str | Path, *, detail: bool = True, lazy: bool = False) -> tuple[TraceInfo, list[Timeline]]:
    """Read one nsys SQLite export. Raises :class:`InputError` for anything that is not one.

    ``detail=False`` leaves out the :data:`DETAIL_COLUMNS` that no measurement uses. ``lazy``: the
    timelines come back without their large tables, each put together by :meth:`Timeline.filled` when it
    is analysed (:func:`read_timelines`), so that one process's rows are held at a time."""
    db = SqliteExport(Path(path))
    try:
        with _bad_input(path):
            info = read_trace_info(db)
            timelines = read_timelines(db, info, detail=detail)
            if not lazy:
                timelines = [tl.filled() for tl in timelines]
    finally:
        db.close()
    return info, timelines


@contextmanager
def _bad_input(path: str | Path) -> Iterator[None]:
    """Damaged values read as bad input: one line naming the file, never a traceback."""
    try:
        yield
    except BadValue as exc:
        raise InputError(f"{path}: {exc}") from None
    except (TypeError, ValueError, AttributeError, OverflowError, KeyError, IndexError) as exc:
        # The readers trust the column types nsys writes; an edited or damaged export (text where an
        # integer belongs, a blob for a name, a key missing) is bad input, not a perfdoctor bug.
        raise InputError(f"{path}: unexpected values in the export ({type(exc).__name__}: {exc})") from None


# --------------------------------------------------------------------------------------------
# File-level information


def read_trace_info(db: SqliteExport) -> TraceInfo:
    """Exporter, schema version, session start, captured environment, GPUs; validates the file."""
    meta_table = next((t for t in ("META_DATA_EXPORT", "EXPORT_META_DATA") if t in db.tables), None)
    event_tables = {"NVTX_EVENTS", "OSRT_API", "StringIds", *CUDA_TABLES}
    if meta_table is None and not (db.tables & event_tables):
        raise InputError(f"{db.path}: SQLite file, but not an Nsight Systems export (no nsys tables)")
    meta = dict(db.query(f"SELECT name, value FROM [{meta_table}]")) if meta_table else {}
    warnings: list[str] = []
    schema = meta.get("EXPORT_SCHEMA_VERSION")
    if meta_table is None:
        warnings.append("no export metadata table: exporter and schema version unknown; reading anyway")
    elif _schema_tuple(schema) > KNOWN_SCHEMA:
        warnings.append(
            f"export schema {schema} (nsys {meta.get('EXPORT_PRODUCT_VERSION', '?')}) is newer than the "
            f"newest perfdoctor knows ({KNOWN_SCHEMA[0]}.{KNOWN_SCHEMA[1]}); reading it anyway"
        )
    has_cuda = any(_has_rows(db, t) for t in CUDA_TABLES)
    if meta.get("EXPORT_PARAM_TIME_NORMALIZE", "false").lower() == "true":
        warnings.append("timestamps were exported with --ts-normalize (absolute UTC); aligned as such")
    return TraceInfo(
        path=db.path,
        format="nsys-sqlite",
        product_version=meta.get("EXPORT_PRODUCT_VERSION"),
        schema_version=schema,
        meta_table=meta_table or "",
        session_start_utc_ns=_session_start(db, meta),
        has_cuda=has_cuda,
        env=_captured_env(db),
        hostname=_system_value(db, "Hostname"),
        gpus=_gpus(db),
        tables=db.tables,
        warnings=warnings,
    )


def _schema_tuple(version: str | None) -> tuple[int, int]:
    parts = (version or "").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def _has_rows(db: SqliteExport, table: str) -> bool:
    return table in db.tables and bool(db.query(f"SELECT 1 FROM [{table}] LIMIT 1"))


def _session_start(db: SqliteExport, meta: dict[str, str]) -> int | None:
    """UTC epoch ns of timestamp 0 of this file (0 when the export already holds absolute times)."""
    if meta.get("EXPORT_PARAM_TIME_NORMALIZE", "false").lower() == "true":
        return 0
    if not db.has("TARGET_INFO_SESSION_START_TIME", "utcEpochNs"):
        return None
    rows = db.query("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1")
    if not rows or rows[0][0] is None:
        return None
    return int(rows[0][0]) + int(meta.get("EXPORT_PARAM_TIME_SHIFT") or 0)


def _captured_env(db: SqliteExport) -> dict[str, str]:
    """Environment of the launched process from ``META_DATA_CAPTURE`` (exporter ≥ 2023.4).

    Rows look like ``PROCESS_0:ENVIRONMENT_VARIABLE`` → ``NAME="value"``.
    """
    if not db.has("META_DATA_CAPTURE", "value"):
        return {}
    env: dict[str, str] = {}
    for name, value in db.query("SELECT name, value FROM META_DATA_CAPTURE"):
        if not name or not value or not _ENV_ROW.match(name) or "=" not in value:
            continue
        key, _, val = value.partition("=")
        if len(val) >= 2 and val[0] == val[-1] == '"':
            val = val[1:-1]
        env.setdefault(key, val)
    return env


def _system_value(db: SqliteExport, name: str) -> str | None:
    if not db.has("TARGET_INFO_SYSTEM_ENV", "value"):
        return None
    rows = db.query("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = ? LIMIT 1", (name,))
    return rows[0][0] if rows else None


def _gpus(db: SqliteExport) -> dict[int, GpuInfo]:
    """Device properties: ``TARGET_INFO_GPU`` (≤ 2024.2 and some 2026 exports), else ``TARGET_INFO_CUDA_DEVICE``."""
    gpus: dict[int, GpuInfo] = {}
    if db.has("TARGET_INFO_GPU", "id"):
        wanted = ["id", "name", "smCount", "totalMemory", "clockRate", "memoryBandwidth",
                  "computeMajor", "computeMinor", "busLocation", "uuid"]
        cols = [c for c in wanted if db.has("TARGET_INFO_GPU", c)]
        for row in db.query(f"SELECT {', '.join(cols)} FROM TARGET_INFO_GPU"):
            r = dict(zip(cols, row))
            cc = (f"{r['computeMajor']}.{r['computeMinor']}"
                  if r.get("computeMajor") is not None and r.get("computeMinor") is not None else None)
            gpus[int(r["id"])] = GpuInfo(
                device_id=int(r["id"]), name=r.get("name"), sm_count=r.get("smCount"),
                total_memory=r.get("totalMemory"), clock_rate_hz=r.get("clockRate"),
                memory_bandwidth=r.get("memoryBandwidth"), compute_capability=cc,
                bus_location=r.get("busLocation"), uuid=r.get("uuid"),
            )
    elif db.has("TARGET_INFO_CUDA_DEVICE", "gpuId"):
        cols = [c for c in ("gpuId", "numMultiprocessors", "uuid") if db.has("TARGET_INFO_CUDA_DEVICE", c)]
        for row in db.query(f"SELECT DISTINCT {', '.join(cols)} FROM TARGET_INFO_CUDA_DEVICE"):
            r = dict(zip(cols, row))
            gpus[int(r["gpuId"])] = GpuInfo(device_id=int(r["gpuId"]), sm_count=r.get("numMultiprocessors"),
                                            uuid=r.get("uuid"))
    return gpus


# --------------------------------------------------------------------------------------------
# Event tables


def read_timelines(db: SqliteExport, info: TraceInfo, *, detail: bool = True) -> list[Timeline]:
    """Split the file's events into one Timeline per (process, device).

    The large tables (kernels, CUDA calls, copies) are read slice by slice and routed per process
    (:mod:`perfdoctor.load.pieces`); a Timeline comes back without them, and :meth:`Timeline.filled` puts
    its process's rows together: ``perfdoctor analyze`` holds one process's rows at a time."""
    with _values_of("StringIds"):
        strings = _strings(db)
    pieces = Pieces()
    big = routed_tables(detail)
    _route(db, pieces, [(name, table, wanted, key) for name, (table, wanted, key) in big.items()])
    replays = read_replays(db, info.warnings)  # graph-mode CUDA graphs as kernel rows
    with _values_of(SYNC_TABLE):
        sync = _device_table(db, SYNC_TABLE, {"sync_type": "syncType"})
    with _values_of("NVTX_EVENTS"):
        nvtx, thread_names_nvtx = _nvtx(db, strings, detail)
    nccl, undecoded = read_payloads(db, strings)
    if undecoded:
        info.warnings.append(f"{undecoded} NVTX payload blob(s) could not be decoded (binaryData layout not "
                             "understood): the NCCL communicators of those calls are unknown")
    os_thread_names = _thread_names(db, strings)
    thread_names = {**os_thread_names, **thread_names_nvtx}
    processes = _process_names(db, os_thread_names)
    osrt = _osrt_counts(db)
    info.counts = {"kernels": pieces.counts.get("kernels", 0) + (len(replays) if replays is not None else 0),
                   "memcpy": pieces.counts.get("memcpy", 0), "memset": pieces.counts.get("memset", 0),
                   "sync": len(sync), "cuda_api": pieces.counts.get("api", 0), "nvtx": len(nvtx),
                   "osrt": sum(osrt.values())}

    # Which (process, device) pairs ran GPU work.
    keys = sorted(set(pieces.pairs) | set(_pairs(replays) if replays is not None else []))
    if not keys:
        # CPU-only capture: one timeline per process that wrote NVTX ranges.
        gpids = sorted({int(g) for g in distinct(nvtx["tid"] & PID_MASK)}) if len(nvtx) else []
        keys = [(g, None) for g in gpids]
        if not info.has_cuda:
            info.warnings.append(
                "no CUDA data in this trace: it was captured without `-t cuda` (or the program ran no GPU "
                "work); only NVTX and OS-runtime activity can be summarised"
            )
    pieces.keep({gpid for gpid, _ in keys})
    by_pid = {name: _group_by_pid(table, by_tid=name in ("nvtx", "nccl"))
              for name, table in (("sync", sync), ("nvtx", nvtx), ("nccl", nccl))}
    empty = {"sync": sync, "nvtx": nvtx, "nccl": nccl}
    fill = _Filler(pieces, strings, replays, detail, [gpid for gpid, _ in keys],
                   {name: [c for c in wanted if c not in ("short_id", "demangled_id")]
                    + (["short_name", "demangled_name"] if name == "kernels" else [])
                    for name, (_, wanted, _) in big.items()})
    timelines = []
    for gpid, dev in keys:
        parts = {name: _part(by_pid[name].get(gpid, frame.take(slice(0, 0))), dev, gpid)
                 for name, frame in empty.items()}
        timelines.append(Timeline(
            trace=info, pid=pid_of(gpid), global_pid=gpid, device_id=dev, **parts, **fill.placeholders,
            thread_names={t: n for t, n in thread_names.items() if (t & PID_MASK) == gpid},
            process_name=processes.get(gpid), osrt_calls=osrt.get(gpid, 0), pending=fill,
        ))
    return timelines


# Routed columns held narrow where their values fit (CUPTI's 32-bit fields and string ids): what waits
# for its timeline is a third smaller. A row's globalPid is its process: not held at all.
ROUTED_NARROW = {"kernels": {**NARROW_COLUMNS, "short_id": np.int32, "demangled_id": np.int32},
                 "api": {"correlation_id": np.int32, "name_id": np.int32}}


def _route(db: SqliteExport, pieces: Pieces, specs: list[tuple[str, str, dict[str, str], str]]) -> None:
    """Read the large tables (name, table, columns, routing key) slice by slice, one after the other, their
    integer columns checked and NULLs filled, each slice's rows routed to their process (a CUDA call's by
    its thread's globalTid)."""
    for name, table, _, _ in specs:
        pieces.expect(name, db.rows_at_most(table))
    narrow = {table: ROUTED_NARROW.get(name, {}) for name, table, _, _ in specs}
    for i, raw in db.read_many([(table, selected(db, table, wanted)) for _, table, wanted, _ in specs],
                               narrow=narrow):
        name, table, wanted, key = specs[i]
        kinds = narrow[table]
        with _values_of(table):
            as_read = {c for c, kind in kinds.items() if c in raw and raw[c].dtype == kind}  # narrowed by the read
            rows = _integers(raw, [c for c in wanted if c not in as_read])
            process = rows[key] & PID_MASK if key == "tid" else rows[key]
            kept = {c: raw[c] if c in as_read else _narrow(rows[c], kinds[c]) if c in kinds else rows[c]
                    for c in wanted if c != "global_pid"}
            pieces.add(name, process, Table(kept, rows=len(raw)))


class _Filler:
    """Puts a timeline's kernels, CUDA calls and copies together from its process's routed rows, as the
    whole-table readers gave them: kernels narrowed, named and sorted by start with the graph replays among
    them, CUDA calls named without their version suffix. A process's rows are built once and kept until its
    last timeline (one per device it used) is filled."""

    def __init__(self, pieces: Pieces, strings: StringIds, replays: Table | None, detail: bool,
                 gpids: list[int], columns: dict[str, list[str]]) -> None:
        self.pieces, self.strings, self.detail = pieces, strings, detail
        self.replays = _group_by_pid(replays, by_tid=False) if replays is not None else {}
        self.left = {gpid: gpids.count(gpid) for gpid in gpids}
        self.columns = columns
        self.built: dict[int, dict[str, Table]] = {}
        self.placeholders = {name: self._build(name, None, None).take(slice(0, 0))
                             for name in ("kernels", "memcpy", "memset", "api")}

    def __call__(self, tl: Timeline) -> Timeline:
        gpid = tl.global_pid
        if gpid not in self.built:
            with _bad_input(tl.trace.path), huge_pages_for(8 * self.pieces.most_rows(gpid)):
                # Taken one after the other (the first take decides whether the process's rows are mapped,
                # over all its tables), then built: the CUDA calls beside the kernels where the task has a
                # second core (their names and narrowing are a quarter of the work at 10M kernels).
                rows = {name: self.pieces.take(name, gpid) if self.pieces.counts.get(name) else None
                        for name in ("kernels", "memcpy", "memset", "api")}
                held = [t for t in rows.values() if t is not None]
                with sized_for(sum(t.nbytes for t in held), sum(t.nbytes_in_memory for t in held)):
                    calls = beside(self._build, "api", gpid, rows.pop("api"))
                    built = {name: self._build(name, gpid, table) for name, table in rows.items()}
                    self.built[gpid] = {**built, "api": calls.result()}
        rows = self.built[gpid]
        self.left[gpid] -= 1
        if not self.left[gpid]:
            del self.built[gpid]
        return replace(tl, pending=None, **{name: _part(table, tl.device_id, gpid) for name, table in rows.items()})

    def _build(self, name: str, gpid: int | None, rows: Table | None) -> Table:
        """One process's rows of a table, as the pieces gave them (no process, or none: the table's empty
        shape)."""
        if not self.pieces.counts.get(name):
            table = {"kernels": _no_kernels, "api": _no_api_calls, "memcpy": _no_memcpy,
                     "memset": _no_memset}[name](self.detail)
        else:
            rows = _one_device(rows) if rows is not None else self.pieces.shape(name)
            table = (_kernels(rows, self.strings) if name == "kernels" else
                     _api_calls(rows, self.strings) if name == "api" else rows)
            if name != "api":  # the process's own id, as every row had it (the key it was routed by)
                table = _with_process(table, gpid, self.columns[name])
        return with_replays(table, self.replays.get(gpid)) if name == "kernels" else table


def _pairs(table: Table) -> list[tuple[int, int]]:
    """Distinct (globalPid, device) of a table: one pass over an int64 key (globalPid's low 24 bits
    are clear, so ``globalPid | device`` is one), instead of distinct rows of two columns."""
    if not len(table):
        return []
    device = table["device_id"]
    if device.min() < 0 or device.max() > ID_MASK:  # never in nsys' data: keep the pair exact anyway
        return list({(int(p), int(d)) for p, d in zip(table["global_pid"], device)})
    key = table["global_pid"] | device
    keys = key[:1] if key.min() == key.max() else distinct(key)
    return [(int(k) & PID_MASK, int(k) & ID_MASK) for k in keys]


def _part(rows: Table, device: int | None, gpid: int) -> Table:
    """A process's rows of one table, restricted to one device where the table has devices. Its
    ``global_pid`` and ``device_id`` columns are then one value repeated: each held as a read-only
    broadcast of it (8 bytes instead of 80 and 40 MB per 10M kernels, for the timeline's life; no
    measurement reads them, the Timeline says both)."""
    if device is not None and "device_id" in rows:
        keep = rows["device_id"] == device
        if not keep.all():  # one device per process (the usual case): no copy
            rows = rows.take(keep)
    if len(rows) and ("global_pid" in rows or "device_id" in rows):
        columns = {name: rows[name] for name in rows.columns}
        if "global_pid" in rows:
            columns["global_pid"] = np.broadcast_to(np.int64(gpid), len(rows))
        if device is not None and "device_id" in rows:
            columns["device_id"] = repeated(rows["device_id"], len(rows))
        rows = Table(columns, rows=len(rows))
    return rows


def _one_device(rows: Table) -> Table:
    """A process's routed rows with its device column held once when it used one device (the usual case):
    not copied when the rows are sorted (:meth:`Table.take` keeps a broadcast one)."""
    device = rows.get("device_id")
    if device is None or len(rows) < 2 or device.min() != device.max():
        return rows
    return Table({c: repeated(device, len(rows)) if c == "device_id" else rows[c] for c in rows.columns},
                 rows=len(rows))


def _group_by_pid(table: Table, *, by_tid: bool) -> dict[int, Table]:
    """Split a table by globalPid once (not once per timeline), each part in the table's row order."""
    if not len(table):
        return {}
    key = (table["tid"] & PID_MASK) if by_tid else table["global_pid"]
    if key.min() == key.max():  # one process per file (the usual case): no split, no copy
        return {int(key[0]): table}
    codes, keys = factorize(key)
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(keys.size + 1))
    return {int(k): table.take(order[bounds[i]:bounds[i + 1]]) for i, k in enumerate(keys)}


class StringIds:
    """``StringIds``: the text of each string id (ids sorted once; a lookup is a binary search, since
    ids can be sparse: 126 strings with ids up to 3.4 million in a real 2024 export)."""

    def __init__(self, ids: np.ndarray, values: np.ndarray) -> None:
        order = np.argsort(ids, kind="stable")
        self._ids = ids.astype(np.int64, copy=False)[order]
        self._text = np.asarray(values, dtype=object)[order]

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """The text of each id (None for an id the table does not hold)."""
        ids = np.asarray(ids, dtype=np.int64)
        at = np.minimum(np.searchsorted(self._ids, ids), max(self._ids.size - 1, 0))
        out = np.full(ids.size, None, dtype=object)
        if self._ids.size:
            found = self._ids[at] == ids
            out[found] = self._text[at[found]]
        return out

    def get(self, string_id: int | None, default: str | None = None) -> str | None:
        if string_id is None:
            return default
        text = self.lookup(np.array([int(string_id)]))[0]
        return default if text is None else text


def _strings(db: SqliteExport) -> StringIds:
    if not db.has("StringIds"):
        return StringIds(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=object))
    frame = db.read("StringIds", {"id": "id", "value": "value"})
    values = frame.col("value", dtype=object)
    _check_text(values, "StringIds", "value")
    return StringIds(_int(frame, "id"), values)


def _check_text(values: np.ndarray, table: str, column: str) -> None:
    """Text columns hold text (or NULL); a blob or a number there is a damaged export. One pass over the
    values' types, then a search only when a wrong one is present."""
    types = set(map(type, values))
    if types <= {str, type(None)}:
        return
    bad = next((v for v in values if not (v is None or type(v) is str or (type(v) is float and v != v))), None)
    if bad is not None:  # NaN is how the Arrow reader gives a NULL
        raise BadValue(table, column, bad, "text")


def _names(ids: np.ndarray, strings: StringIds, clean: re.Pattern[str] | None = None) -> Strings:
    """Resolve string ids to dictionary-encoded text: each distinct id is looked up (and cleaned) once.

    String ids are small dense integers, so a lookup table maps them to codes in O(n) without sorting.
    """
    if ids.size and ids.min() < 0:
        ids = np.where(ids < 0, 0, ids)
    if int(ids.max(initial=0)) > _DENSE_IDS_PER_ROW * ids.size + _DENSE_IDS:  # sparse (or damaged) ids: sort
        uniq, id_codes = np.unique(ids, return_inverse=True)
    else:
        present = np.zeros(int(ids.max(initial=0)) + 1, dtype=bool)
        present[ids] = True
        uniq = np.flatnonzero(present)
        id_codes = None
    values = strings.lookup(uniq)
    values = np.array([f"<string {u}>" if not isinstance(v, str) else (clean.sub("", v) if clean else v)
                       for u, v in zip(uniq, values)], dtype=object)
    # Cleaning can merge names (cudaLaunchKernel_v7000 / _v11000): categories must stay unique.
    cats, remap = np.unique(values, return_inverse=True)
    if id_codes is not None:
        return Strings(remap.astype(code_type(cats.size))[id_codes], cats)
    code_of_id = np.zeros(int(uniq[-1]) + 1 if uniq.size else 1, dtype=code_type(cats.size))
    code_of_id[uniq] = remap
    return Strings(taken(code_of_id, ids, ids.size), cats)


def _int(frame: Table, column: str, fill: int = -1) -> np.ndarray:
    """An integer column with NULLs replaced (the readers give nullable integers as float with NaN); a
    value that is not a 64-bit integer (a real beyond its range, text, a blob) is :class:`BadValue`."""
    col = frame[column]
    if col.dtype.kind in "iu":
        return col.astype(np.int64, copy=False)
    if col.dtype.kind == "f":
        filled = np.where(np.isnan(col), fill, col)
        outside = ~(np.abs(filled) < INT64_LIMIT)
        if outside.any():
            raise BadValue(None, column, float(filled[np.argmax(outside)]), "a 64-bit integer")
        return filled.astype(np.int64)
    values = [fill if v is None or (type(v) is float and v != v) else v for v in col]
    try:
        return np.array(values, dtype=np.int64)
    except (OverflowError, ValueError, TypeError):
        bad = next(v for v in values if not _is_int64(v))
        raise BadValue(None, column, bad, "a 64-bit integer") from None


def _is_int64(value: object) -> bool:
    return (isinstance(value, (int, np.integer)) and -INT64_LIMIT <= value < INT64_LIMIT) or (
        isinstance(value, float) and abs(value) < INT64_LIMIT)


def _narrow(column: np.ndarray, kind: type[np.integer] = np.int32) -> np.ndarray:
    """A small-valued integer column (device, stream, launch type: CUPTI's 32-bit fields) as ``kind`` when
    every value fits: 40 (int32) or 10 (int8) instead of 80 MB per column at 10M kernels."""
    return fitted(column, kind)


def _integers(raw: Table, columns: list[str]) -> Table:
    """The integer columns of a freshly read table, NULLs filled, without copying intact columns."""
    return Table({c: _int(raw, c) for c in columns}, rows=len(raw))


# Our name -> the export's, of the columns of NVTX_EVENTS.
NVTX_COLUMNS = {"start": "start", "end": "end", "event_type": "eventType", "tid": "globalTid",
                "end_tid": "endGlobalTid", "domain_id": "domainId", "text": "text", "text_id": "textId",
                "range_id": "rangeId", "category": "category", "int64": "int64Value", "uint64": "uint64Value",
                "int32": "int32Value", "uint32": "uint32Value", "double_value": "doubleValue",
                "float_value": "floatValue"}


def _export_column(name: str) -> str:
    """The export's name of a column the readers renamed (for messages about its values)."""
    names = {**DEVICE_COLUMNS, "copy_kind": "copyKind", "sync_type": "syncType", **kernel_columns(True),
             **api_columns(True), **NVTX_COLUMNS}
    return names.get(name, name)


def _with_process(rows: Table, gpid: int | None, columns: list[str]) -> Table:
    """Routed rows with their ``global_pid`` column back in its place: one value repeated, held as a
    read-only broadcast (:func:`_part`)."""
    process = np.broadcast_to(np.int64(gpid if gpid is not None else 0), len(rows))
    return Table({c: process if c == "global_pid" else rows[c] for c in columns}, rows=len(rows))


def _no_kernels(detail: bool) -> Table:
    wanted = kernel_columns(detail)
    return _empty([c for c in wanted if not c.endswith("_id") or c in ("device_id", "correlation_id")]
                  + ["short_name", "demangled_name"])


def _kernels(rows: Table, strings: StringIds) -> Table:
    """One process's kernel rows (integers, NULLs filled): narrowed, named, sorted by start once here, so
    no measurement has to sort again. The demangled names are resolved beside the rest where the task has
    a second core (:func:`perfdoctor.cores.beside`): at 10M kernels the kernels took 0.2 s on one thread
    while the CUDA calls, built beside them, took 0.07 s on the other."""
    demangled = beside(_names, rows["demangled_id"], strings)
    out = Table({c: rows[c] for c in rows.columns if c not in ("short_id", "demangled_id")}, rows=len(rows))
    for column, kind in NARROW_COLUMNS.items():
        out[column] = _narrow(out[column], kind)
    out["short_name"] = _names(rows["short_id"], strings)
    out["demangled_name"] = demangled.result()
    return out.sorted_by("start")


def _no_memcpy(detail: bool) -> Table:
    return _empty([*DEVICE_COLUMNS, "bytes", "copy_kind"])


def _no_memset(detail: bool) -> Table:
    return _empty([*DEVICE_COLUMNS, "bytes"])


def _device_table(db: SqliteExport, table: str, extra: dict[str, str]) -> Table:
    wanted = {**DEVICE_COLUMNS, **extra}
    raw = db.read(table, selected(db, table, wanted))
    if not len(raw):
        return _empty(list(wanted))
    return _integers(raw, list(wanted))


def _no_api_calls(detail: bool) -> Table:
    return _empty(["start", "end", "tid", "correlation_id", "name"] + (["event_class"] if detail else []))


def _api_calls(rows: Table, strings: StringIds) -> Table:
    """One process's CUDA runtime and driver calls, names without the ``_vNNNN`` version suffix."""
    out = Table({c: rows[c] for c in rows.columns if c != "name_id"}, rows=len(rows))
    out["correlation_id"] = _narrow(out["correlation_id"])
    out["name"] = _names(rows["name_id"], strings, clean=_API_VERSION_SUFFIX)
    return out


def _nvtx(db: SqliteExport, strings: StringIds, detail: bool = True) -> tuple[Table, dict[int, str]]:
    """NVTX ranges and marks with their text and domain name resolved; plus NVTX thread names.

    Text is ``text`` (ASCII messages) or ``StringIds[textId]`` (registered strings, e.g. Python nvtx).
    Domain ids are per process, so domain names are resolved per (process, domainId).
    """

    columns = [c for c in ("start", "end", "event_type", "tid", "end_tid", "domain", "text", "range_id", "category",
                           "int_value", "double_value") if detail or c not in DETAIL_COLUMNS["nvtx"]]
    table = "NVTX_EVENTS"
    if table not in db.tables:
        return _empty(columns), {}
    wanted = NVTX_COLUMNS
    if not detail:  # the sources of DETAIL_COLUMNS["nvtx"]
        wanted = {k: v for k, v in wanted.items() if k not in ("range_id", "category", "int64", "uint64", "int32",
                                                               "uint32", "double_value", "float_value")}
    raw = db.read(table, selected(db, table, wanted))
    if not len(raw):
        return _empty(columns), {}
    event_type = _int(raw, "event_type")
    text_ids = _int(raw, "text_id")
    text = raw.col("text", dtype=object)
    _check_text(text, "NVTX_EVENTS", "text")
    # registered strings: only the rows with a text id are looked at (a few hundred of ~20k here)
    with_id = np.flatnonzero(text_ids >= 0)
    missing = with_id[np.array([v is None or v != v for v in text[with_id]], dtype=bool)]
    if missing.size:
        text = text.copy()
        text[missing] = strings.lookup(text_ids[missing])
    tid = _int(raw, "tid", 0)
    gpid = tid & PID_MASK
    domain_id = _int(raw, "domain_id", 0)

    domain = _domain_names(gpid, domain_id, text, event_type == NVTX_DOMAIN_CREATE)

    naming = event_type == NVTX_THREAD_NAME
    thread_names = {int(t): str(n) for t, n in zip(tid[naming], text[naming]) if isinstance(n, str)}

    keep = np.isin(event_type, NVTX_KEPT_TYPES)
    out = Table({
        "start": _int(raw, "start")[keep],
        "end": _int(raw, "end")[keep],
        "event_type": event_type[keep],
        "tid": tid[keep],
        "end_tid": _int(raw, "end_tid")[keep],
        # object arrays: None is the default domain, an unnamed range.
        "domain": domain[keep],
        "text": _nan_as_none(text[keep]),
    })
    if detail:
        out["range_id"] = _int(raw, "range_id")[keep]
        out["category"] = _int(raw, "category")[keep]
        out["int_value"] = _first_present(raw, ("int64", "uint64", "int32", "uint32"))[keep]
        out["double_value"] = _first_present(raw, ("double_value", "float_value"), integer=False)[keep]
    return out.sorted_by("start"), thread_names


def _nan_as_none(text: np.ndarray) -> np.ndarray:
    """Checked text (:func:`_check_text`: text, None, or the Arrow reader's NaN for a NULL) with None for
    every NULL, in place: the NaNs are the values unequal to themselves, found in one comparison in C."""
    nan = np.not_equal(text, text)
    if nan.any():
        text[nan] = None
    return text


def _domain_names(gpid: np.ndarray, domain_id: np.ndarray, text: np.ndarray, creates: np.ndarray) -> np.ndarray:
    """Domain name of each NVTX row: ids are per process, named by that process's create rows.

    Resolved per distinct (process, domain id) pair; the default domain (id 0) is ``None`` and a domain
    whose create row is outside the capture is ``domain#<id>``.
    """
    domain = np.full(gpid.size, None, dtype=object)
    named = domain_id != 0
    if not named.any():
        return domain
    names = {(int(p), int(d)): str(t) for p, d, t in zip(gpid[creates], domain_id[creates], text[creates])}
    # globalPid has its low 24 bits clear, so globalPid | domainId is one int64 key per pair.
    codes, keys = factorize(gpid[named] | domain_id[named])
    per_pair = np.array([names.get((int(k) & PID_MASK, int(k) & ID_MASK), f"domain#{int(k) & ID_MASK}")
                         for k in keys], dtype=object)
    domain[named] = per_pair[codes]
    return domain


def _first_present(raw: Table, cols: tuple[str, ...], *, integer: bool = True) -> np.ndarray:
    """Merge NVTX's scalar payload union (only one of its columns is set per row)."""
    result = np.full(len(raw), np.nan)
    for c in cols:
        v = raw.col(c, dtype=float)
        take = np.isnan(result) & ~np.isnan(v)
        result[take] = v[take]
    if integer:
        return np.where(np.isnan(result), -1, result).astype(np.int64)
    return result


def _thread_names(db: SqliteExport, strings: StringIds) -> dict[int, str]:
    if not db.has("ThreadNames", "nameId"):
        return {}
    rows = db.query("SELECT globalTid, nameId FROM ThreadNames")
    return {int(t): str(strings.get(n, f"<string {n}>")) for t, n in rows if t is not None}


def _process_names(db: SqliteExport, threads: dict[int, str]) -> dict[int, str]:
    """Each process's name. nsys names a process by what it saw first: on a busy machine that is its own
    launcher (``nsys-launcher``), before the exec of the program; the main thread's OS name (its tid is the
    pid) then names the program."""
    if not db.has("PROCESSES", "globalPid"):
        return {}
    names = {int(g): n for g, n in db.query("SELECT globalPid, name FROM PROCESSES") if g is not None}
    for gpid, name in names.items():
        main = threads.get(gpid | ((gpid >> TID_BITS) & ((1 << TID_BITS) - 1)))
        if isinstance(name, str) and name.rsplit("/", 1)[-1] == "nsys-launcher" and main:
            names[gpid] = main
    return names


def _osrt_counts(db: SqliteExport) -> dict[int, int]:
    """OS-runtime calls per process (only a count: enough to say what a CPU-only capture holds)."""
    if not db.has("OSRT_API", "globalTid"):
        return {}
    rows = db.query(f"SELECT globalTid & {PID_MASK}, count(*) FROM OSRT_API WHERE eventClass = ? GROUP BY 1",
                    (OSRT_CALL_CLASS,))
    return {int(g): int(n) for g, n in rows}


def _empty(columns: list[str]) -> Table:
    """An empty table: integer columns, and the name columns as (empty) strings."""
    table = Table.empty(c for c in columns if c not in NAME_COLUMNS)
    for c in columns:
        if c in NAME_COLUMNS:
            table[c] = Strings(np.zeros(0, dtype=code_type(0)), np.zeros(0, dtype=object))
    return Table({c: table[c] for c in columns}, rows=0)
