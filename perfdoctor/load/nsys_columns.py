"""Which tables and columns of an nsys export perfdoctor reads, by our names and the export's, without numpy:
the loader (:mod:`perfdoctor.load.nsys`) reads by them, and so does the read-ahead that starts before numpy
is imported (:mod:`perfdoctor.load.read_ahead`), so both ask SQLite for the very same slices."""

from __future__ import annotations

from perfdoctor.errors import InputError
from perfdoctor.load.sqlite_file import SqliteFile

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"
SYNC_TABLE = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
CUDA_TABLES = (KERNEL_TABLE, RUNTIME_TABLE, MEMCPY_TABLE, MEMSET_TABLE)

# Columns no analysis reads (launch geometry, the CUDA call's event class, NVTX range ids, categories and
# scalar payloads): read only with ``detail`` (the default, for API users and the loader tests), skipped by
# `perfdoctor analyze`, which saves about a third of the SQLite reading on kernel-heavy traces.
DETAIL_COLUMNS = {
    "kernels": ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"),
    "api": ("event_class",),
    "nvtx": ("range_id", "category", "int_value", "double_value"),
}
# Our name -> the export's, of the columns every device table (memcpy, memset, sync) has.
DEVICE_COLUMNS = {"start": "start", "end": "end", "device_id": "deviceId", "stream": "streamId",
                  "correlation_id": "correlationId", "global_pid": "globalPid"}


def kernel_columns(detail: bool) -> dict[str, str]:
    return without_detail({
        "start": "start", "end": "end", "device_id": "deviceId", "stream": "streamId",
        "correlation_id": "correlationId", "global_pid": "globalPid", "short_id": "shortName",
        "demangled_id": "demangledName", "launch_type": "launchType",
        "grid_x": "gridX", "grid_y": "gridY", "grid_z": "gridZ",
        "block_x": "blockX", "block_y": "blockY", "block_z": "blockZ",
    }, "kernels", detail)


def api_columns(detail: bool) -> dict[str, str]:
    return without_detail({"start": "start", "end": "end", "tid": "globalTid", "correlation_id": "correlationId",
                           "name_id": "nameId", "event_class": "eventClass"}, "api", detail)


def without_detail(wanted: dict[str, str], table: str, detail: bool) -> dict[str, str]:
    return wanted if detail else {k: v for k, v in wanted.items() if k not in DETAIL_COLUMNS[table]}


def routed_tables(detail: bool) -> dict[str, tuple[str, dict[str, str], str]]:
    """The large tables, read slice by slice and routed per process, in the order they are read: our name →
    (table, columns wanted, routing key). The kernels come first: their first slices are the ones read
    ahead."""
    return {"kernels": (KERNEL_TABLE, kernel_columns(detail), "global_pid"),
            "memcpy": (MEMCPY_TABLE, {**DEVICE_COLUMNS, "bytes": "bytes", "copy_kind": "copyKind"}, "global_pid"),
            "memset": (MEMSET_TABLE, {**DEVICE_COLUMNS, "bytes": "bytes"}, "global_pid"),
            "api": (RUNTIME_TABLE, api_columns(detail), "tid")}


def selected(db: SqliteFile, table: str, wanted: dict[str, str]) -> dict[str, str]:
    """Keep the requested columns that exist in this schema version (others become NULL); an event
    table without its start or end times cannot be read at all."""
    cols = db.columns(table)
    for required in ("start", "end"):
        if cols and wanted.get(required) and wanted[required] not in cols:
            raise InputError(f"{db.path}: table {table} has no {wanted[required]!r} column: not an nsys export "
                             "perfdoctor can read")
    return {out: (src if src in cols else "NULL") for out, src in wanted.items()}
