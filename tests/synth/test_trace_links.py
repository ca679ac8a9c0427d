"""Synthetic exports must be well-formed nsys exports: real DDL, valid cross-table links, real name forms."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from tests.paths import REAL_H100 as REAL_2026

MASK = 0xFFFFFFFFFF000000
MASK_SQL = -0x1000000  # the same mask as a signed 64-bit SQLite integer


def _all(generated: dict) -> list[Path]:
    return [p for paths in generated.values() for p in paths]


def _version(con: sqlite3.Connection) -> str:
    table = "META_DATA_EXPORT" if _tables(con) >= {"META_DATA_EXPORT"} else "EXPORT_META_DATA"
    return con.execute(f"SELECT value FROM {table} WHERE name='EXPORT_PRODUCT_VERSION'").fetchone()[0]


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def test_every_kernel_has_its_launch_call(generated: dict) -> None:
    for path in _all(generated):
        con = sqlite3.connect(path)
        orphans = con.execute(
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
            "ON r.correlationId = k.correlationId AND (r.globalTid & ?) = k.globalPid WHERE r.start IS NULL",
            (MASK_SQL,),
        ).fetchone()[0]
        assert orphans == 0, path.name
        late = con.execute(
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
            "ON r.correlationId = k.correlationId AND (r.globalTid & ?) = k.globalPid WHERE k.start < r.end",
            (MASK_SQL,),
        ).fetchone()[0]
        assert late == 0, path.name
        api = {
            n
            for (n,) in con.execute(
                "SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN "
                "CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId=k.correlationId AND "
                "(r.globalTid & ?) = k.globalPid JOIN StringIds s ON s.id=r.nameId",
                (MASK_SQL,),
            )
        }
        assert api <= {
            "cudaLaunchKernel_v7000",
            "cudaLaunchKernelExC_v11060",
            "cudaLaunchCooperativeKernel_v9000",
            "cuLaunchKernelEx",
        }
        con.close()


@pytest.mark.parametrize(
    ("table", "api"),
    [("CUPTI_ACTIVITY_KIND_MEMCPY", "cudaMemcpyAsync_v3020"), ("CUPTI_ACTIVITY_KIND_MEMSET", "cudaMemsetAsync_v3020")],
)
def test_every_copy_and_fill_has_its_call(generated: dict, table: str, api: str) -> None:
    """Copies and fills link to an async call of the same process (per-process correlationIds) and run
    after it returned; copies use the real enums (pinned HtoD inputs, pageable DtoH scalars; middle
    pipeline stages load no batch, so they only read back the scalar)."""
    for path in _all(generated):
        con = sqlite3.connect(path)
        rows = con.execute(
            f"SELECT s.value, t.start >= r.end FROM {table} t LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
            "ON r.correlationId = t.correlationId AND (r.globalTid & ?) = t.globalPid "
            "LEFT JOIN StringIds s ON s.id = r.nameId",
            (MASK_SQL,),
        ).fetchall()
        assert rows, (path.name, table)
        assert {name for name, _ in rows} == {api}, path.name
        assert all(after for _, after in rows), path.name
        if table == "CUPTI_ACTIVITY_KIND_MEMCPY":
            kinds = set(con.execute("SELECT DISTINCT copyKind, srcKind, dstKind FROM CUPTI_ACTIVITY_KIND_MEMCPY"))
            assert (2, 2, 0) in kinds and kinds <= {(1, 1, 2), (2, 2, 0)}, path.name
        con.close()


def test_sync_records_link_to_their_calls(generated: dict) -> None:
    """Stream syncs (syncType 3) belong to cudaStreamSynchronize calls and stream waits (2) to
    cudaStreamWaitEvent calls, one record each, lying inside the call; no such call lacks its record."""
    expected = {3: "cudaStreamSynchronize_v3020", 2: "cudaStreamWaitEvent_v3020"}
    for path in _all(generated):
        con = sqlite3.connect(path)
        rows = con.execute(
            "SELECT y.syncType, s.value, r.start <= y.start AND y.end <= r.end AND y.start <= y.end "
            "FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION y LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
            "ON r.correlationId = y.correlationId AND (r.globalTid & ?) = y.globalPid "
            "LEFT JOIN StringIds s ON s.id = r.nameId",
            (MASK_SQL,),
        ).fetchall()
        assert {t for t, _, _ in rows} >= {3}, path.name
        assert all(name == expected[t] and inside for t, name, inside in rows), path.name
        calls = con.execute(
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
            "WHERE s.value IN (?, ?)",
            tuple(expected.values()),
        ).fetchone()[0]
        assert calls == len(rows), path.name
        con.close()


def test_every_string_reference_resolves(generated: dict) -> None:
    refs = [("CUPTI_ACTIVITY_KIND_KERNEL", c) for c in ("shortName", "demangledName", "mangledName")] + [
        ("CUPTI_ACTIVITY_KIND_RUNTIME", "nameId"),
        ("NVTX_EVENTS", "textId"),
        ("ThreadNames", "nameId"),
    ]
    for path in _all(generated):
        con = sqlite3.connect(path)
        for table, col in refs:
            missing = con.execute(
                f"SELECT count(*) FROM {table} t LEFT JOIN StringIds s ON s.id = t.{col} "
                f"WHERE t.{col} IS NOT NULL AND s.id IS NULL"
            ).fetchone()[0]
            assert missing == 0, (path.name, table, col)
        con.close()


def test_global_ids_and_processes(generated: dict) -> None:
    for path in _all(generated):
        con = sqlite3.connect(path)
        procs = {gp for (gp,) in con.execute("SELECT globalPid FROM PROCESSES")}
        for (gp,) in con.execute("SELECT DISTINCT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL"):
            assert gp in procs and gp & 0xFFFFFF == 0 and (gp >> 48) & 0xFF == 1
        for (gt,) in con.execute(
            "SELECT DISTINCT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME UNION "
            "SELECT DISTINCT globalTid FROM NVTX_EVENTS"
        ):
            assert gt & MASK in procs
        devices = {d for (d,) in con.execute("SELECT id FROM TARGET_INFO_GPU")}
        assert {d for (d,) in con.execute("SELECT DISTINCT deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL")} <= devices
        coop = con.execute(
            "SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id=k.shortName "
            "WHERE k.launchType = 2"
        ).fetchall()
        assert all(re.search(r"(ln|rmsnorm)_(fwd|bwd)_tuned_kernel", n) for (n,) in coop)
        con.close()


def test_schema_styles(generated: dict) -> None:
    seen = set()
    for path in _all(generated):
        con = sqlite3.connect(path)
        tables = _tables(con)
        version = _version(con)
        seen.add(version[:6])
        if version.startswith("2022.4"):
            assert "EXPORT_META_DATA" in tables and "META_DATA_CAPTURE" not in tables
        else:
            assert {"META_DATA_EXPORT", "META_DATA_CAPTURE"} <= tables
            env = dict(
                v.split("=", 1)
                for (v,) in con.execute(
                    "SELECT value FROM META_DATA_CAPTURE WHERE name LIKE 'PROCESS_%:ENVIRONMENT_VARIABLE'"
                )
            )
            assert {"CUDA_DEVICE_MAX_CONNECTIONS", "NVTE_FWD_LAYERNORM_SM_MARGIN", "NCCL_VERSION"} <= set(env)
            assert ("RANK" in env) == (".rank" in path.name)
        assert ("TARGET_INFO_CUDA_DEVICE" in tables) == version.startswith("2026")
        assert "greenContextId" in {
            r[1] for r in con.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")
        } or version.startswith("2022.4")
        assert con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0] > 10**18
        con.close()
    assert seen == {"2022.4", "2024.2", "2026.2"}


def test_2026_tables_match_real_export(generated: dict) -> None:
    """Tables we share with a real 2026.2 export have exactly its columns."""
    real = sqlite3.connect(f"file:{REAL_2026}?mode=ro", uri=True)
    real_cols = {t: [r[1] for r in real.execute(f"PRAGMA table_info({t})")] for t in _tables(real)}
    path = next(p for p in _all(generated) if _version(sqlite3.connect(p)).startswith("2026"))
    con = sqlite3.connect(path)
    shared = _tables(con) & set(real_cols)
    assert {
        "CUPTI_ACTIVITY_KIND_KERNEL",
        "CUPTI_ACTIVITY_KIND_RUNTIME",
        "CUPTI_ACTIVITY_KIND_MEMCPY",
        "CUPTI_ACTIVITY_KIND_MEMSET",
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
        "NVTX_EVENTS",
        "StringIds",
        "META_DATA_CAPTURE",
    } <= shared
    for t in shared:
        assert [r[1] for r in con.execute(f"PRAGMA table_info({t})")] == real_cols[t], t


def test_nvtx_labels_enclose_their_launches(generated: dict) -> None:
    """Every NCCL kernel's launch call lies inside a perfdoctor `comm` range and an NCCL-domain range
    on the same thread (labelled scenarios); unlabelled traces have no NVTX at all, and traces with only
    PyTorch's own ranges (labels.pytorch) have them in the default domain (id 0, never created)."""
    for name, paths in generated.items():
        for path in paths:
            con = sqlite3.connect(path)
            doms = {
                (gt & MASK, d): t
                for gt, d, t in con.execute("SELECT globalTid, domainId, text FROM NVTX_EVENTS WHERE eventType = 75")
            }
            if name == "unlabeled":
                assert con.execute("SELECT count(*) FROM NVTX_EVENTS").fetchone()[0] == 0
                continue
            labels = json.loads(path.with_suffix(".truth.json").read_text())["labels"]
            if not labels["perfdoctor"]:
                assert labels.get("pytorch")
                default = {t for (t,) in con.execute("SELECT coalesce(n.text, s.value) FROM NVTX_EVENTS n LEFT JOIN "
                                                     "StringIds s ON s.id = n.textId WHERE n.domainId = 0")}
                assert any(t.startswith("ProfilerStep#") for t in default)
                assert any(t.startswith("enumerate(DataLoader)#") for t in default)
                assert "perfdoctor" not in set(doms.values())
                continue
            ranges = {}
            for s, e, gt, d, text, tid in con.execute(
                "SELECT n.start, n.end, n.globalTid, n.domainId, n.text, s.value FROM NVTX_EVENTS n "
                "LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType = 59"
            ):
                ranges.setdefault((gt, doms[(gt & MASK, d)]), []).append((s, e, tid if tid is not None else text))
            launches = con.execute(
                "SELECT r.start, r.end, r.globalTid FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                "JOIN StringIds s ON s.id = k.shortName JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
                "ON r.correlationId = k.correlationId AND (r.globalTid & ?) = k.globalPid "
                "WHERE s.value LIKE 'nccl%'",
                (MASK_SQL,),
            ).fetchall()
            if name != "tp_overlap_connections":  # userbuffers only: TP comm without NCCL kernels
                assert launches, name
            for a, b, gt in launches:
                pd = [t for s, e, t in ranges[(gt, "perfdoctor")] if s <= a and b <= e]
                assert any(re.fullmatch(r"comm op=\w+ group=(dp|tp|cp|pp|ep) bytes=\d+ size=\d+", t) for t in pd)
                assert any(t.startswith("nccl") for s, e, t in ranges[(gt, "NCCL")] if s <= a and b <= e)
            marks = [
                t
                for (t,) in con.execute(
                    "SELECT coalesce(n.text, s.value) FROM NVTX_EVENTS n LEFT JOIN StringIds s "
                    "ON s.id = n.textId WHERE n.eventType = 34"
                )
            ]
            assert any(re.fullmatch(r"rank r=\d+ local=\d+ world=\d+", m) for m in marks)
            assert any(m.startswith("config {") for m in marks)
            con.close()
