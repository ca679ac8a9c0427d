"""Write simulated ranks as an nsys SQLite export, using the real DDL of the chosen nsys version.

Only the tables a lazy export of a CUDA+NVTX capture holds are created, with the exact CREATE statements
nsys uses (`ddl/*.sql`). Rows follow the conventions real files show (research/nsys_schema.md):
globalTid = VM 1 << 48 | pid << 24 | tid, globalPid = globalTid with tid 0; kernel names, API names and
registered NVTX strings are StringIds; correlationIds are unique per process and shared between a launch
call and its kernel (or copy, or fill); synchronization records carry the correlationId of their
cudaStreamSynchronize / cudaStreamWaitEvent call; NVTX domains are created per process with eventType 75 rows.

NCCL payloads (labels.nccl_payload, 2026.2 only), as `nsys export --include-blobs=true` writes them:
`NVTX_EVENTS.binaryData` of each NCCL collective / point-to-point range is a BLOB — a 32-byte header of
little-endian u64 domainId, schemaId, payloadSize, payloadOffset (32), then NCCL's payload struct — and
`NVTX_PAYLOAD_SCHEMAS` / `NVTX_PAYLOAD_SCHEMA_ENTRIES` describe NCCL's static schemas once per process,
keyed by that process's NCCL domainId, with the NULLs a real export leaves (entry offset 0 is NULL).
"""

from __future__ import annotations

import itertools
import sqlite3
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from perfdoctor.errors import InputError
from perfdoctor.synth.gpu import GpuModel
from perfdoctor.synth.kernels import KernelTable
from perfdoctor.synth.recorder import MEM_DEVICE, NVTX_DOMAIN_CREATE, NVTX_MARK, RankRecorder
from perfdoctor.synth.scenario import Communicator

SCHEMAS = {
    "2022.4": ("2022.4.2.sql", "2022.4.2.1", "3.0.0", "2022.4"),
    "2024.2": ("2024.2.3.sql", "2024.2.3.38", "3.11.1", "2024.2"),
    "2026.2": ("2026.2.1.sql", "2026.2.1.210", "3.25.0", "2026.2"),
}
# Release -> DDL file of CUPTI_ACTIVITY_KIND_GRAPH_TRACE (new in 2024.2; research/nsys_schema.md §3.5).
GRAPH_TRACE_DDL = {"2024.2": "graph_trace_2024.2.3.sql"}
VM_BITS = 1 << 48
SESSION_UTC_NS = 1_780_000_000_000_000_000
# Start of the DDL's NCCL payload tables: created only for traces with payloads, so the table set of the
# others stays what it was before payloads existed.
_PAYLOAD_DDL = "-- NCCL payload tables"

# NCCL's static payload schemas (NCCL's nvtx_payload_schemas.h): id (1 << 24) + NVTX_SID_<func>, size,
# entries (name, NVTX entry type, offset). Entry types: 18 uint64, 22 size_t, 5 int32, and NCCL's
# reduction-op enum (itself a schema, (1 << 24) + 16), stored as a 4-byte C enum.
_SCHEMA_BASE = 1 << 24
_UINT64, _SIZE_T, _INT32, _REDOP = 18, 22, 5, _SCHEMA_BASE + 16
_ENTRY_FORMAT = {_UINT64: "<Q", _SIZE_T: "<Q", _INT32: "<i", _REDOP: "<i"}
_COMM = ("NCCL communicator ID", _UINT64, 0)
_BYTES = ("Message size [bytes]", _SIZE_T, 8)
_MEMBER = (_COMM, ("No. of ranks", _INT32, 8), ("Rank", _INT32, 12), ("CUDA device", _INT32, 16))
NCCL_SCHEMAS: dict[str, tuple[int, int, tuple[tuple[str, int, int], ...]]] = {
    "ncclCommInitRank": (_SCHEMA_BASE + 0, 24, _MEMBER),
    "ncclCommDestroy": (_SCHEMA_BASE + 2, 24, _MEMBER),
    "ncclAllGather": (_SCHEMA_BASE + 4, 16, (_COMM, _BYTES)),
    "ncclAllReduce": (_SCHEMA_BASE + 5, 24, (_COMM, _BYTES, ("Reduction operation", _REDOP, 16))),
    "ncclBroadcast": (_SCHEMA_BASE + 6, 24, (_COMM, _BYTES, ("Root", _INT32, 16))),
    "ncclReduceScatter": (_SCHEMA_BASE + 7, 24, (_COMM, _BYTES, ("Reduction operation", _REDOP, 16))),
    "ncclReduce": (_SCHEMA_BASE + 8, 24, (_COMM, _BYTES, ("Reduction operation", _REDOP, 16))),
    "ncclSend": (_SCHEMA_BASE + 9, 24, (_COMM, _BYTES, ("Peer rank", _INT32, 16))),
    "ncclRecv": (_SCHEMA_BASE + 10, 24, (_COMM, _BYTES, ("Peer rank", _INT32, 16))),
    "ncclCommInitRankConfig": (_SCHEMA_BASE + 11, 24, _MEMBER),
    "ncclCommFinalize": (_SCHEMA_BASE + 14, 8, (_COMM,)),
}
_PAYLOAD_HEADER = struct.Struct("<4Q")  # domainId, schemaId, payloadSize, payloadOffset
_REDOP_SUM = 0  # ncclSum


@dataclass
class ProcessOut:
    """One process (rank) to write: its recorder, device, pid and the clock offset of this file."""

    rank: int
    local_rank: int
    pid: int
    recorder: RankRecorder
    rank_mark: str | None  # `rank r=.. local=.. world=..` when perfdoctor labels are on


def global_pid(pid: int) -> int:
    return VM_BITS | (pid << 24)


def global_tid(pid: int, tid: int) -> int:
    return VM_BITS | (pid << 24) | tid


class _Strings:
    """StringIds, interned in first-use order so ids are deterministic."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, value: str) -> int:
        sid = self.ids.get(value)
        if sid is None:
            sid = self.ids[value] = len(self.ids) + 1
        return sid


def _ddl(schema: str, payloads: bool) -> str:
    text = resources.files("perfdoctor.synth").joinpath("ddl", SCHEMAS[schema][0]).read_text()
    return text if payloads else text.partition(_PAYLOAD_DDL)[0]


def _insert(con: sqlite3.Connection, table: str, n: int, values: dict[str, Any]) -> None:
    """Insert `n` rows; `values` maps column -> sequence or scalar. Absent NOT NULL columns get 0/''."""
    info = con.execute(f"PRAGMA table_info({table})").fetchall()
    cols, seqs = [], []
    for _, name, typ, notnull, _, _ in info:
        if name in values:
            v = values[name]
        elif notnull:
            v = "" if typ.upper() == "TEXT" else 0
        else:
            v = None
        cols.append(name)
        seqs.append(v if isinstance(v, (list, np.ndarray, range)) else itertools.repeat(v, n))
    rows: Iterable[tuple] = zip(*seqs)
    con.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", rows)


def _has(con: sqlite3.Connection, table: str) -> bool:
    return con.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (table,)).fetchone() is not None


def write_trace(
    path: Path,
    schema: str,
    procs: list[ProcessOut],
    table: KernelTable,
    gpu: GpuModel,
    offset_ns: int,
    nvtx_ascii: bool,
    node: int,
    capture_command: tuple[str, list[str], dict[str, str]],
    graph_trace: str = "node",
) -> None:
    """Write one SQLite export holding `procs`; all their timestamps are shifted by `-offset_ns`. NCCL
    payloads are written when the recorders carry communicators (labels.nccl_payload). Kernels replayed
    from CUDA graphs are written as nsys' `--cuda-graph-trace` mode records them: `node`, as kernel rows
    with their graphNodeId; `graph`, as one CUPTI_ACTIVITY_KIND_GRAPH_TRACE row per replay instead."""
    payloads = any(p.recorder.communicators is not None for p in procs)
    if payloads and _PAYLOAD_DDL not in _ddl(schema, True):
        raise InputError(f"labels.nccl_payload needs schema 2026.2; schema {schema} has no NVTX payload tables")
    graphs = graph_trace == "graph" and any(p.recorder.graph_ids for p in procs)
    if graphs and schema not in GRAPH_TRACE_DDL:
        raise InputError(f"host.cuda_graph_trace graph needs schema {', '.join(GRAPH_TRACE_DDL)} (the release whose "
                         f"export DDL of CUPTI_ACTIVITY_KIND_GRAPH_TRACE we hold); schema {schema} has none")
    if path.exists():
        path.unlink()
    con = sqlite3.connect(path)
    con.executescript(_ddl(schema, payloads))
    if graphs:
        con.executescript(resources.files("perfdoctor.synth").joinpath("ddl", GRAPH_TRACE_DDL[schema]).read_text())
    sid = _Strings()
    spec_names = [(sid(s.short), sid(s.demangled), sid(s.mangled)) for s in table.specs]
    spec_arr = np.asarray(spec_names, dtype=np.int64).reshape(-1, 3)
    launch_type = np.asarray([s.launch_type for s in table.specs], dtype=np.int64)
    grid = np.asarray([s.grid for s in table.specs], dtype=np.int64).reshape(-1, 3)
    block = np.asarray([s.block for s in table.specs], dtype=np.int64).reshape(-1, 3)
    regs = np.asarray([s.registers for s in table.specs], dtype=np.int64)
    t_min, t_max = None, None
    with con:
        for proc in procs:
            rec = proc.recorder
            gp = global_pid(proc.pid)
            main = global_tid(proc.pid, proc.pid)
            k = rec.kernel_arrays()
            ops = rec.op_arrays()
            if graphs:
                _write_graph_trace(con, k, proc.local_rank, gp, offset_ns)
                k = {col: v[k["graph"] == 0] for col, v in k.items()}
            spec = k["spec"]
            n = len(spec)
            start = k["start"] - offset_ns
            end = k["end"] - offset_ns
            order = np.argsort(start, kind="stable")
            kv = {
                "start": start[order].tolist(),
                "end": end[order].tolist(),
                "deviceId": proc.local_rank,
                "contextId": 1,
                "greenContextId": 0,
                "streamId": k["stream"][order].tolist(),
                "correlationId": k["corr"][order].tolist(),
                "globalPid": gp,
                "shortName": spec_arr[spec[order], 0].tolist(),
                "demangledName": spec_arr[spec[order], 1].tolist(),
                "mangledName": spec_arr[spec[order], 2].tolist(),
                "launchType": launch_type[spec[order]].tolist(),
                "cacheConfig": 0,
                "registersPerThread": regs[spec[order]].tolist(),
                "gridX": grid[spec[order], 0].tolist(),
                "gridY": 1,
                "gridZ": 1,
                "blockX": block[spec[order], 0].tolist(),
                "blockY": 1,
                "blockZ": 1,
                "staticSharedMemory": 0,
                "dynamicSharedMemory": 0,
                "localMemoryPerThread": 0,
                "localMemoryTotal": 250_871_808,
                "gridId": list(range(1, n + 1)),
                "sharedMemoryExecuted": 32768,
                "sharedMemoryLimitConfig": 0,
                "clusterX": 0,
                "clusterY": 0,
                "clusterZ": 0,
                "clusterSchedulingPolicy": 1,
                "maxPotentialClusterSize": 0,
                "maxActiveClusters": 0,
                "tensorSizeMinusOneElements": "[]",
                "graphNodeId": [None if x == 0 else int(x) for x in k["node"][order]],
            }
            _insert(con, "CUPTI_ACTIVITY_KIND_KERNEL", n, kv)
            names = [sid(x) for x in rec.r_name]
            rs = np.asarray(rec.r_start, dtype=np.int64) - offset_ns
            _insert(
                con,
                "CUPTI_ACTIVITY_KIND_RUNTIME",
                len(names),
                {
                    "start": rs.tolist(),
                    "end": (np.asarray(rec.r_end, dtype=np.int64) - offset_ns).tolist(),
                    "eventClass": [1 if x.startswith("cu") and not x.startswith("cuda") else 0 for x in rec.r_name],
                    "globalTid": main,
                    "correlationId": rec.r_corr,
                    "nameId": names,
                    "returnValue": 0,
                },
            )
            _write_memory_ops(con, rec, proc.local_rank, gp, offset_ns)
            _write_nvtx(con, rec, main, sid, offset_ns, nvtx_ascii, proc)
            threads = [
                (main, "python3"),
                (main + 3, "pt_nccl_watchdg"),
                (main + 4, "pt_nccl_heartbt"),
                (main + 1, "[NSys]"),
                (main + 2, "[NSys Comms]"),
            ]
            _insert(
                con,
                "ThreadNames",
                len(threads),
                {"nameId": [sid(t[1]) for t in threads], "priority": 20, "globalTid": [t[0] for t in threads]},
            )
            _insert(con, "PROCESSES", 1, {"globalPid": gp, "pid": proc.pid, "name": "python3"})
            streams = sorted(set(k["stream"].tolist()))
            _insert(
                con,
                "TARGET_INFO_CUDA_STREAM",
                len(streams),
                {
                    "streamId": streams,
                    "hwId": 0,
                    "vmId": 1,
                    "processId": proc.pid,
                    "contextId": 1,
                    "priority": [0 if s == rec.compute_stream else -1 for s in streams],
                    "flag": 2,
                },
            )
            lo = min(int(ops["start"].min()) - offset_ns if len(ops["start"]) else 0, int(rs.min()) if len(rs) else 0)
            hi = max(int(ops["end"].max()) - offset_ns if len(ops["end"]) else 0, int(rs.max()) if len(rs) else 0)
            t_min = lo if t_min is None else min(t_min, lo)
            t_max = hi if t_max is None else max(t_max, hi)
        _write_gpus(con, schema, procs, gpu, node)
        _write_meta(con, schema, procs, gpu, offset_ns, t_min or 0, t_max or 0, capture_command, node, payloads)
        _insert(con, "StringIds", len(sid.ids), {"id": list(sid.ids.values()), "value": list(sid.ids.keys())})
    con.close()


def _write_graph_trace(con: sqlite3.Connection, k: dict[str, np.ndarray], device: int, gp: int, offset_ns: int) -> None:
    """One CUPTI_ACTIVITY_KIND_GRAPH_TRACE row per graph replay (the kernels sharing a graph launch's
    correlationId): from its first node's start to its last node's end, on the stream it was launched to."""
    mine = k["graph"] > 0
    corr, first = np.unique(k["corr"][mine], return_index=True)
    inverse = np.unique(k["corr"][mine], return_inverse=True)[1]
    start = np.full(corr.size, np.iinfo(np.int64).max)
    end = np.zeros(corr.size, dtype=np.int64)
    np.minimum.at(start, inverse, k["start"][mine])
    np.maximum.at(end, inverse, k["end"][mine])
    order = np.argsort(start, kind="stable")
    graph = k["graph"][mine][first]
    _insert(con, "CUPTI_ACTIVITY_KIND_GRAPH_TRACE", corr.size, {
        "start": (start[order] - offset_ns).tolist(),
        "end": (end[order] - offset_ns).tolist(),
        "deviceId": device,
        "contextId": 1,
        "greenContextId": 0,
        "streamId": k["stream"][mine][first][order].tolist(),
        "correlationId": corr[order].tolist(),
        "globalPid": gp,
        "graphId": graph[order].tolist(),
        "graphExecId": graph[order].tolist(),
    })


def _write_memory_ops(con: sqlite3.Connection, rec: RankRecorder, device: int, gp: int, offset_ns: int) -> None:
    """MEMCPY, MEMSET and SYNCHRONIZATION rows in time order, with the NULLs real exports leave (no peer
    device ids, no virtual address; sync records have no green context and only 2026 has eventSyncId)."""
    common = {"deviceId": device, "contextId": 1, "greenContextId": 0, "globalPid": gp, "graphNodeId": None}
    cs = np.asarray(rec.c_start, dtype=np.int64) - offset_ns
    co = np.argsort(cs, kind="stable")
    _insert(
        con,
        "CUPTI_ACTIVITY_KIND_MEMCPY",
        len(co),
        {
            **common,
            "start": cs[co].tolist(),
            "end": (np.asarray(rec.c_end, dtype=np.int64)[co] - offset_ns).tolist(),
            "streamId": np.asarray(rec.c_stream, dtype=np.int64)[co].tolist(),
            "correlationId": np.asarray(rec.c_corr, dtype=np.int64)[co].tolist(),
            "bytes": np.asarray(rec.c_bytes, dtype=np.int64)[co].tolist(),
            "copyKind": np.asarray(rec.c_kind, dtype=np.int64)[co].tolist(),
            "srcKind": np.asarray(rec.c_src, dtype=np.int64)[co].tolist(),
            "dstKind": np.asarray(rec.c_dst, dtype=np.int64)[co].tolist(),
            "copyCount": 1,
        },
    )
    fs = np.asarray(rec.f_start, dtype=np.int64) - offset_ns
    fo = np.argsort(fs, kind="stable")
    _insert(
        con,
        "CUPTI_ACTIVITY_KIND_MEMSET",
        len(fo),
        {
            **common,
            "start": fs[fo].tolist(),
            "end": (np.asarray(rec.f_end, dtype=np.int64)[fo] - offset_ns).tolist(),
            "streamId": np.asarray(rec.f_stream, dtype=np.int64)[fo].tolist(),
            "correlationId": np.asarray(rec.f_corr, dtype=np.int64)[fo].tolist(),
            "value": 0,
            "bytes": np.asarray(rec.f_bytes, dtype=np.int64)[fo].tolist(),
            "memKind": MEM_DEVICE,
        },
    )
    y = np.asarray(rec.syncs, dtype=np.int64).reshape(-1, 7)
    y = y[np.argsort(y[:, 0], kind="stable")]
    _insert(
        con,
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
        len(y),
        {
            **common,
            "greenContextId": None,
            "start": (y[:, 0] - offset_ns).tolist(),
            "end": (y[:, 1] - offset_ns).tolist(),
            "streamId": y[:, 2].tolist(),
            "correlationId": y[:, 3].tolist(),
            "syncType": y[:, 4].tolist(),
            "eventId": y[:, 5].tolist(),
            "eventSyncId": y[:, 6].tolist(),
        },
    )


def _write_nvtx(
    con: sqlite3.Connection,
    rec: RankRecorder,
    tid: int,
    sid: _Strings,
    offset_ns: int,
    ascii_text: bool,
    proc: ProcessOut,
) -> None:
    """NVTX rows: domain creation, then ranges/marks. NCCL's strings are registered (textId); ours follow
    the scenario (registered like Python `nvtx`, or plain text like C `nvtxRangePushA`). With payloads,
    NCCL's API ranges carry `proc`'s binaryData and the process's payload schemas are written."""
    if not rec.nvtx:
        return
    rank_mark = proc.rank_mark
    first = min(r[0] for r in rec.nvtx)
    rows = ([(first, None, NVTX_MARK, rank_mark, "perfdoctor")] if rank_mark else []) + rec.nvtx
    first -= offset_ns
    domains: dict[str, int] = {"": 0}  # the default domain ("" here) has id 0 and no creation row
    for *_, dom in rows:
        if dom not in domains:
            domains[dom] = len(domains)
    starts, ends, etypes, texts, text_ids, dom_ids = [], [], [], [], [], []
    for dom, did in domains.items():
        if not did:
            continue
        starts.append(first - 10_000 + did)
        ends.append(None)
        etypes.append(NVTX_DOMAIN_CREATE)
        texts.append(dom)
        text_ids.append(None)
        dom_ids.append(did)
    for s, e, etype, text, dom in rows:
        starts.append(s - offset_ns)
        ends.append(None if e is None else e - offset_ns)
        etypes.append(etype)
        registered = dom == "NCCL" or not ascii_text
        texts.append(None if registered else text)
        text_ids.append(sid(text) if registered else None)
        dom_ids.append(domains[dom])
    values: dict[str, Any] = {
        "start": starts,
        "end": ends,
        "eventType": etypes,
        "text": texts,
        "textId": text_ids,
        "domainId": dom_ids,
        "globalTid": tid,
    }
    if rec.communicators is not None and "NCCL" in domains:
        nccl = domains["NCCL"]
        comms = rec.communicators[proc.rank]
        blobs = [
            None if i not in rec.nccl_calls else _payload(nccl, rec.nvtx[i][3], rec.nccl_calls[i], comms, proc)
            for i in range(len(rec.nvtx))
        ]
        values["binaryData"] = [None] * (len(starts) - len(blobs)) + blobs
        _write_payload_schemas(con, nccl)
    _insert(con, "NVTX_EVENTS", len(starts), values)


def _payload(
    domain: int, name: str, call: tuple[str, int, int], comms: dict[str, Communicator], proc: ProcessOut
) -> bytes:
    """binaryData of one NCCL API range of `proc`: header, then the payload struct of `name`'s schema."""
    group, nbytes, peer = call
    comm = comms[group]
    me = comm.rank_in_group(proc.rank)
    fields = {
        "NCCL communicator ID": comm.id,
        "Message size [bytes]": nbytes,
        "Reduction operation": _REDOP_SUM,
        "Root": 0,
        "Peer rank": (me + peer) % len(comm.ranks),
        "No. of ranks": len(comm.ranks),
        "Rank": me,
        "CUDA device": proc.local_rank,
    }
    schema_id, size, entries = NCCL_SCHEMAS[name]
    out = bytearray(_PAYLOAD_HEADER.size + size)
    _PAYLOAD_HEADER.pack_into(out, 0, domain, schema_id, size, _PAYLOAD_HEADER.size)
    for entry, etype, offset in entries:
        struct.pack_into(_ENTRY_FORMAT[etype], out, _PAYLOAD_HEADER.size + offset, fields[entry])
    return bytes(out)


def _write_payload_schemas(con: sqlite3.Connection, domain: int) -> None:
    """NCCL's schemas under one process's NCCL domainId (real exports repeat them per process)."""
    schemas = sorted(NCCL_SCHEMAS.values())
    _insert(
        con,
        "NVTX_PAYLOAD_SCHEMAS",
        len(schemas),
        {
            "domainId": domain,
            "schemaId": [s[0] for s in schemas],
            "type": 1,  # static schema
            "numEntries": [len(s[2]) for s in schemas],
            "payloadSize": [s[1] for s in schemas],
        },
    )
    rows = [(sid_, idx, e) for sid_, _, entries in schemas for idx, e in enumerate(entries)]
    _insert(
        con,
        "NVTX_PAYLOAD_SCHEMA_ENTRIES",
        len(rows),
        {
            "domainId": domain,
            "schemaId": [r[0] for r in rows],
            "idx": [r[1] for r in rows],
            "type": [r[2][1] for r in rows],
            "name": [r[2][0] for r in rows],
            "offset": [r[2][2] or None for r in rows],
        },
    )


def _write_gpus(con: sqlite3.Connection, schema: str, procs: list[ProcessOut], gpu: GpuModel, node: int) -> None:
    devs = [p.local_rank for p in procs]
    uuids = [f"GPU-{node:08x}-5ca1-4e0d-9a3b-{d:012x}" for d in devs]
    _insert(
        con,
        "TARGET_INFO_GPU",
        len(devs),
        {
            "vmId": 0,
            "id": devs,
            "name": gpu.name,
            "busLocation": [f"0000:{0x18 + 0x10 * d:02x}:00.0" for d in devs],
            "isDiscrete": 1,
            "l2CacheSize": 52_428_800,
            "totalMemory": gpu.total_memory,
            "memoryBandwidth": int(gpu.hbm_gbps * 1e9),
            "clockRate": gpu.clock_rate_hz,
            "smCount": gpu.sm_count,
            "uuid": uuids,
            "chipName": gpu.chip,
            "cuDevice": devs,
            "computeMajor": gpu.compute_major,
            "computeMinor": gpu.compute_minor,
            "smMajor": gpu.compute_major,
            "smMinor": gpu.compute_minor,
            "threadsPerWarp": 32,
            "maxThreadsPerBlock": 1024,
            "maxWarpsPerSm": 64,
            "maxBlocksPerSm": 32,
        },
    )
    if _has(con, "TARGET_INFO_CUDA_DEVICE"):
        _insert(
            con,
            "TARGET_INFO_CUDA_DEVICE",
            len(devs),
            {
                "gpuId": devs,
                "cudaId": devs,
                "pid": [p.pid for p in procs],
                "uuid": uuids,
                "numMultiprocessors": gpu.sm_count,
            },
        )


def _write_meta(
    con: sqlite3.Connection,
    schema: str,
    procs: list[ProcessOut],
    gpu: GpuModel,
    offset_ns: int,
    t_min: int,
    t_max: int,
    capture: tuple[str, list[str], dict[str, str]],
    node: int,
    blobs: bool,
) -> None:
    _, product, schema_version, date = SCHEMAS[schema]
    major, minor, micro = schema_version.split(".")
    utc = SESSION_UTC_NS + offset_ns
    secs = utc // 1_000_000_000
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
    meta = [
        ("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"),
        ("EXPORT_PRODUCT_VERSION", product),
        ("EXPORT_PRODUCT_DATE", date),
        ("EXPORT_SCHEMA_VERSION", schema_version),
        ("EXPORT_SCHEMA_VERSION_MAJOR", major),
        ("EXPORT_SCHEMA_VERSION_MINOR", minor),
        ("EXPORT_SCHEMA_VERSION_MICRO", micro),
        ("EXPORT_PLATFORM", "linux-desktop"),
        ("EXPORT_ARCH", "x64"),
        ("EXPORT_HOST", f"node{node:03d}"),
    ]
    if _has(con, "META_DATA_EXPORT"):
        meta += [("EXPORT_PARAM_LAZY", "true")]
        meta += [("EXPORT_PARAM_INCLUDE_BLOBS", "true")] if blobs else []  # where real exports list it
        meta += [
            ("EXPORT_PARAM_TIME_NORMALIZE", "false"),
            ("EXPORT_PARAM_TIME_SHIFT", "0"),
        ]
        _insert(con, "META_DATA_EXPORT", len(meta), {"name": [m[0] for m in meta], "value": [m[1] for m in meta]})
    else:
        meta += [("EXPORT_LAZY", "true")]
        _insert(con, "EXPORT_META_DATA", len(meta), {"name": [m[0] for m in meta], "value": [m[1] for m in meta]})
    if _has(con, "META_DATA_CAPTURE"):
        command, args, env = capture
        rows = [
            ("DEVICE_ID", "Local (CLI)"),
            ("CAPTURE_EVENT_TYPE", "NvtxEvents"),
            ("CAPTURE_EVENT_TYPE", "Cuda"),
            ("START_TRIGGER", "Immediate"),
            ("PROCESS_0:HOW_TO_ATTACH", "LaunchAnother"),
            ("PROCESS_0:COMMAND", command),
        ]
        rows += [(f"PROCESS_0:ARGUMENT_{i}", a) for i, a in enumerate(args)]
        rows += [
            ("PROCESS_0:WORKING_DIR", "/workspace/megatron"),
            ("PROCESS_0:COLLECT_NVTX_TRACE", "true"),
            ("PROCESS_0:COLLECT_CUDA_TRACE", "true"),
        ]
        rows += [("PROCESS_0:ENVIRONMENT_VARIABLE", f'{k}="{v}"') for k, v in env.items()]
        rows += [("RUN_DURATION_MS", str((t_max - t_min) // 1_000_000))]
        _insert(con, "META_DATA_CAPTURE", len(rows), {"name": [r[0] for r in rows], "value": [r[1] for r in rows]})
    _insert(
        con,
        "TARGET_INFO_SESSION_START_TIME",
        1,
        {"utcEpochNs": utc, "utcTime": stamp, "localTime": stamp, "systemClockNs": 28_254_349_605},
    )
    env_rows = [
        ("CpuCores", 1, "112"),
        ("Hostname", 619, f"node{node:03d}"),
        ("NvDriverVersion", 205, "570.124.06"),
        ("CudaDriverVersion", 611, "12080"),
        ("OsDescription", 605, "Ubuntu 22.04.5 LTS"),
    ]
    _insert(
        con,
        "TARGET_INFO_SYSTEM_ENV",
        len(env_rows),
        {
            "globalVid": VM_BITS,
            "devStateName": "Local (CLI)",
            "name": [r[0] for r in env_rows],
            "nameEnum": [r[1] for r in env_rows],
            "value": [r[2] for r in env_rows],
        },
    )
    _insert(
        con,
        "ANALYSIS_DETAILS",
        1,
        {
            "globalVid": VM_BITS,
            "duration": t_max - t_min + 1_000_000,
            "startTime": max(0, t_min - 500_000),
            "stopTime": t_max + 500_000,
        },
    )
