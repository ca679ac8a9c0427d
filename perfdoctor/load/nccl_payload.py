"""NCCL's NVTX extended payloads: which communicator each NCCL API call used, and its size.

Since NCCL 2.25 every collective and point-to-point range NCCL pushes (NVTX domain "NCCL") carries a
binary payload that starts with the communicator id (``comm->commHash``), followed by the message size
and an op-specific field; communicator creation ranges carry the communicator's number of ranks and
the caller's rank (research/nsys_schema.md §3.7, §6.3; research/kernel_taxonomy.md §1.4).

What an nsys 2026.x SQLite export holds (observed on ``sample_traces/real_h100/h100_2gpu_fastvideo.sqlite``,
an nsys 2026.2.1 export of an NCCL 2.2x run):

* ``NVTX_PAYLOAD_SCHEMAS`` / ``NVTX_PAYLOAD_SCHEMA_ENTRIES``: each schema's entries with name, NVTX
  entry type and byte offset (NULL for offset 0), keyed by (domainId, schemaId); the rows repeat once
  per process. Static NCCL schema ids are ``(1 << 24) + NVTX_SID_<Func>``.
* ``NVTX_EVENTS.binaryData``: the payload of each event — only when the report was exported with
  ``nsys export --include-blobs=true`` (``META_DATA_EXPORT`` ``EXPORT_PARAM_INCLUDE_BLOBS``); the
  sample export has it false and every ``binaryData`` NULL.

**Unverified:** the byte layout of a ``binaryData`` value. We read it as a 32-byte little-endian
header — domainId, schemaId, payloadSize, payloadOffset, each u64 — followed by the payload at
payloadOffset, as a BLOB or as hexadecimal text. That layout is what another open-source tool reads
from real exports (nsys-ai, ``nccl_communicator.py``); we have no export with blobs to check it
against. A value this reader cannot make sense of is skipped and counted, never guessed at.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from perfdoctor.table import Table

if TYPE_CHECKING:
    from perfdoctor.load.nsys import StringIds
    from perfdoctor.load.sqlite_export import SqliteExport

HEADER = struct.Struct("<4Q")  # domainId, schemaId, payloadSize, payloadOffset
# NVTX predefined payload entry types (nvToolsExtPayload.h NVTX_PAYLOAD_ENTRY_TYPE_*) → struct code.
ENTRY_TYPES = {1: "b", 2: "B", 3: "h", 4: "H", 5: "i", 6: "I", 7: "q", 8: "Q", 9: "q", 10: "Q", 11: "b",
               12: "B", 13: "h", 14: "H", 15: "i", 16: "I", 17: "q", 18: "Q", 22: "Q", 23: "Q"}
STATIC_SCHEMA_START = 1 << 24  # ids at or above: a registered schema, e.g. an enum (4 bytes, as C enums)
# The schema entries NCCL names, and the column each becomes.
FIELDS = {"NCCL communicator ID": "comm", "Message size [bytes]": "bytes", "No. of ranks": "nranks",
          "Rank": "rank"}
COLUMNS = ("start", "end", "tid", "name", "comm", "bytes", "nranks", "rank")


@dataclass(frozen=True)
class _Schema:
    """How to read one payload schema's fields of interest."""

    size: int
    fields: tuple[tuple[str, int, struct.Struct], ...]  # (column, offset, reader)


def read_payloads(db: SqliteExport, strings: StringIds) -> tuple[Table, int]:
    """Decoded NCCL payload events (columns ``COLUMNS``; ``comm`` is the unsigned id as ``uint64``,
    other unknown values −1) and how many payloads could not be decoded. Empty when the export has no
    payload blobs."""
    dtypes = {c: np.uint64 if c == "comm" else object if c == "name" else np.int64 for c in COLUMNS}
    empty = Table({c: np.zeros(0, dtype=dtypes[c]) for c in COLUMNS}, rows=0)
    if not (db.has("NVTX_EVENTS", "binaryData") and db.has("NVTX_PAYLOAD_SCHEMA_ENTRIES")) or _blobs_left_out(db):
        return empty, 0
    schemas = _schemas(db)
    if not schemas:
        return empty, 0
    text_id = "textId" if db.has("NVTX_EVENTS", "textId") else "NULL"
    rows = db.query(f'SELECT start, "end", globalTid, {text_id}, text, binaryData FROM NVTX_EVENTS '
                    "WHERE binaryData IS NOT NULL")
    out: dict[str, list] = {c: [] for c in COLUMNS}
    bad = 0
    for start, end, tid, tid_text, text, blob in rows:
        decoded = decode(blob, schemas)
        if decoded is None:
            bad += 1
            continue
        if "comm" not in decoded:
            continue  # a payload without a communicator (NCCL before 2.25, or another library)
        name = text if text is not None else strings.get(tid_text) if tid_text is not None else None
        for column, value in (("start", start), ("end", -1 if end is None else end), ("tid", tid),
                              ("name", name)):
            out[column].append(value)
        for column in ("comm", "bytes", "nranks", "rank"):
            out[column].append(decoded.get(column, -1))
    if not out["start"]:
        return empty, bad
    frame = Table({c: np.asarray(out[c], dtype=dtypes[c]) for c in COLUMNS})
    return frame.sorted_by("start"), bad


def _blobs_left_out(db: SqliteExport) -> bool:
    """The export says it was made without ``--include-blobs`` (then every ``binaryData`` is NULL and
    scanning the NVTX table for them is wasted)."""
    if not db.has("META_DATA_EXPORT"):
        return False
    rows = db.query("SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_PARAM_INCLUDE_BLOBS'")
    return bool(rows) and str(rows[0][0]).lower() == "false"


def decode(blob: bytes | str | None, schemas: dict[tuple[int, int], _Schema]) -> dict[str, int] | None:
    """The fields of one ``binaryData`` value, or None when it does not parse against a known schema."""
    raw = _bytes(blob)
    if raw is None or len(raw) < HEADER.size:
        return None
    domain, schema_id, size, offset = HEADER.unpack_from(raw)
    schema = schemas.get((domain, schema_id))
    if schema is None or offset < HEADER.size or offset + size > len(raw) or size < schema.size:
        return None
    return {column: reader.unpack_from(raw, offset + at)[0] for column, at, reader in schema.fields}


def _bytes(blob: bytes | str | None) -> bytes | None:
    if isinstance(blob, (bytes, bytearray, memoryview)):
        return bytes(blob)
    if isinstance(blob, str):
        try:
            return bytes.fromhex(blob)
        except ValueError:
            return None
    return None


def _schemas(db: SqliteExport) -> dict[tuple[int, int], _Schema]:
    """Readers for the schemas that name a field of ``FIELDS`` (the first definition of a (domain,
    schema) pair wins; the export repeats each once per process)."""
    entries = db.query("SELECT domainId, schemaId, idx, type, name, offset FROM NVTX_PAYLOAD_SCHEMA_ENTRIES "
                       "ORDER BY domainId, schemaId, idx")
    sizes = {(d, s): n for d, s, n in db.query("SELECT domainId, schemaId, payloadSize FROM NVTX_PAYLOAD_SCHEMAS")} \
        if db.has("NVTX_PAYLOAD_SCHEMAS") else {}
    fields: dict[tuple[int, int], dict[int, tuple[str, int, struct.Struct]]] = {}
    for domain, schema_id, idx, entry_type, name, offset in entries:
        column = FIELDS.get(name)
        code = ENTRY_TYPES.get(entry_type) or ("i" if (entry_type or 0) >= STATIC_SCHEMA_START else None)
        if column is None or code is None:
            continue
        fields.setdefault((domain, schema_id), {}).setdefault(idx, (column, offset or 0, struct.Struct("<" + code)))
    out = {}
    for key, by_idx in fields.items():
        chosen = tuple(by_idx.values())
        needed = max(at + reader.size for _, at, reader in chosen)
        out[key] = _Schema(needed, chosen)
        if sizes.get(key) is not None and sizes[key] < needed:
            del out[key]  # entries beyond the declared payload: not a layout we understand
    return out
