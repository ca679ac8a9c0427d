"""labels.nccl_payload: NCCL's NVTX extended payloads in synthetic 2026.2 exports, read with plain sqlite3.

One MoE run with every kind of group (TP, CP, EP, DP, PP; two ranks each), all 16 ranks written as two
per-node files, one step. Each NCCL collective / point-to-point range carries a BLOB: a 32-byte header
(u64 domainId, schemaId, payloadSize, payloadOffset) and NCCL's payload struct, whose communicator id the
truth maps to a group kind and its member ranks.
"""

from __future__ import annotations

import bisect
import json
import sqlite3
import struct
from pathlib import Path
from typing import Any

import pytest
import yaml

from perfdoctor.errors import InputError
from perfdoctor.synth import run_scenario
from perfdoctor.synth.scenario import scenario_from_dict

from .conftest import scenario_paths

HEADER = struct.Struct("<4Q")
# NCCL's static schema ids: (1 << 24) + NVTX_SID_<func>
SID = {
    "ncclCommInitRank": 0,
    "ncclCommDestroy": 2,
    "ncclAllGather": 4,
    "ncclAllReduce": 5,
    "ncclBroadcast": 6,
    "ncclReduceScatter": 7,
    "ncclReduce": 8,
    "ncclSend": 9,
    "ncclRecv": 10,
    "ncclCommInitRankConfig": 11,
    "ncclCommFinalize": 14,
}
PAYLOAD_CALLS = {
    "ncclAllReduce",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclBroadcast",
    "ncclReduce",
    "ncclSend",
    "ncclRecv",
    "ncclCommInitRankConfig",
}
COLLECTIVES = {"ncclAllReduce", "ncclAllGather", "ncclReduceScatter"}
ENTRY_TYPES = {
    "NCCL communicator ID": 18,
    "Message size [bytes]": 22,
    "No. of ranks": 5,
    "Rank": 5,
    "CUDA device": 5,
    "Peer rank": 5,
    "Root": 5,
    "Reduction operation": 16777232,
}


def _raw(**labels: Any) -> dict[str, Any]:
    path = next(p for p in scenario_paths() if p.stem == "pp_1f1b")
    raw = yaml.safe_load(path.read_text())
    raw["name"] = "payload"
    raw["model"].update({"layers": 4, "num_microbatches": 2, "moe_experts": 4, "moe_ffn_hidden": 2048})
    raw["parallel"] = {"tp": 2, "cp": 2, "dp": 2, "ep": 2, "pp": 2}
    raw["gpu"] = {"gpus_per_node": 8}
    raw["output"] = {"schema": "2026.2", "layout": "per_node", "ranks": "all"}
    raw["run"]["steps"] = 1
    raw["labels"] = labels
    return raw


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    root = tmp_path_factory.mktemp("nccl_payload")
    cases = {"payload": {"nccl_payload": True}, "no_init": {"nccl_payload": True, "nccl_comm_init": False}, "plain": {}}
    return {name: run_scenario(_raw(**labels), root / name) for name, labels in cases.items()}


def _rows(con: sqlite3.Connection) -> list[tuple]:
    """NVTX rows as (globalTid, domain name, text, start, end, domainId, binaryData, typeof(binaryData))."""
    domains = {
        (tid, d): t
        for tid, d, t in con.execute("SELECT globalTid, domainId, text FROM NVTX_EVENTS WHERE eventType = 75")
    }
    rows = con.execute(
        'SELECT e.globalTid, e.domainId, COALESCE(e.text, s.value), e.start, e."end", e.binaryData, '
        "typeof(e.binaryData) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
        "WHERE e.eventType != 75 ORDER BY e.globalTid, e.start"
    )
    return [(tid, domains[(tid, d)], text, s, e, d, blob, typ) for tid, d, text, s, e, blob, typ in rows]


def _decode(blob: bytes, entries: dict[str, int]) -> dict[str, int]:
    fmt = {18: "<Q", 22: "<Q", 5: "<i", 16777232: "<i"}
    _, _, _, offset = HEADER.unpack_from(blob)
    return {name: struct.unpack_from(fmt[ENTRY_TYPES[name]], blob, offset + at)[0] for name, at in entries.items()}


def _truth(path: Path) -> dict[str, Any]:
    return json.loads(path.with_suffix(".truth.json").read_text())


def test_blobs_sit_exactly_on_nccl_api_ranges(runs: dict[str, list[Path]]) -> None:
    for path in runs["payload"]:
        con = sqlite3.connect(path)
        rows = _rows(con)
        with_blob = [r for r in rows if r[7] == "blob"]
        assert with_blob and all(r[7] in ("blob", "null") for r in rows)
        expected = [r for r in rows if r[1] == "NCCL" and r[2] in PAYLOAD_CALLS]
        assert with_blob == expected
        assert {r[2] for r in with_blob} == {
            "ncclCommInitRankConfig",
            *COLLECTIVES - {"ncclAllReduce"},
            "ncclSend",
            "ncclRecv",
        }
        assert {r[2] for r in rows if r[1] == "NCCL" and r[7] == "null"} == {"ncclGroupStart", "ncclGroupEnd"}
        meta = dict(con.execute("SELECT name, value FROM META_DATA_EXPORT"))
        assert meta["EXPORT_PARAM_INCLUDE_BLOBS"] == "true"
        con.close()


def test_headers_match_domain_and_schemas(runs: dict[str, list[Path]]) -> None:
    for path in runs["payload"]:
        con = sqlite3.connect(path)
        schemas = {
            (d, s): (n, size)
            for d, s, n, size in con.execute(
                "SELECT domainId, schemaId, numEntries, payloadSize FROM NVTX_PAYLOAD_SCHEMAS"
            )
        }
        procs = con.execute("SELECT COUNT(*) FROM PROCESSES").fetchone()[0]
        # one copy per process, like real exports; static schema, no name, flags or alignment
        assert con.execute("SELECT COUNT(*) FROM NVTX_PAYLOAD_SCHEMAS").fetchone()[0] == len(SID) * procs
        assert con.execute("SELECT DISTINCT name, type, flags, alignTo FROM NVTX_PAYLOAD_SCHEMAS").fetchall() == [
            (None, 1, None, None)
        ]
        entries: dict[tuple[int, int], dict[str, int]] = {}
        for d, s, idx, typ, name, offset in con.execute(
            "SELECT domainId, schemaId, idx, type, name, offset FROM NVTX_PAYLOAD_SCHEMA_ENTRIES "
            "ORDER BY domainId, schemaId, idx"
        ):
            assert typ == ENTRY_TYPES[name] and (offset is None) == (idx == 0)
            entries.setdefault((d, s), {})[name] = offset or 0
        assert {s - (1 << 24) for _, s in schemas} == set(SID.values())
        for (d, s), (n, size) in schemas.items():
            assert len(entries[(d, s)]) == n
            assert max(at + (8 if ENTRY_TYPES[e] in (18, 22) else 4) for e, at in entries[(d, s)].items()) <= size
        for _, dom, name, _, _, domain_id, blob, typ in _rows(con):
            if typ != "blob":
                continue
            d, s, size, offset = HEADER.unpack_from(blob)
            assert dom == "NCCL" and d == domain_id and offset == 32
            assert s == (1 << 24) + SID[name]
            assert (d, s) in schemas and schemas[(d, s)][1] == size == len(blob) - offset
        con.close()


def test_communicator_ids_group_ranges_like_the_truth(runs: dict[str, list[Path]]) -> None:
    seen: dict[int, set[int]] = {}  # comm id -> ranks that used it
    for path in runs["payload"]:
        con = sqlite3.connect(path)
        truth = _truth(path)
        rank_of_pid = {v["pid"]: int(r) for r, v in truth["ranks"].items()}
        entries: dict[int, dict[str, int]] = {}
        for s, name, offset in con.execute("SELECT schemaId, name, offset FROM NVTX_PAYLOAD_SCHEMA_ENTRIES"):
            entries.setdefault(s, {})[name] = offset or 0
        rows = _rows(con)
        comm_ranges: dict[int, list[tuple[int, int, str]]] = {}  # tid -> perfdoctor `comm` ranges
        for tid, dom, text, s, e, *_ in rows:
            if dom == "perfdoctor" and text.startswith("comm "):
                comm_ranges.setdefault(tid, []).append((s, e, text))
        step0 = min(s for _, dom, text, s, *_ in rows if dom == "perfdoctor" and text.startswith("step "))
        window = con.execute("SELECT startTime, stopTime FROM ANALYSIS_DETAILS").fetchone()
        for tid, _, name, s, e, _, blob, typ in rows:
            if typ != "blob":
                continue
            rank = rank_of_pid[(tid >> 24) & 0xFFFFFF]
            mine = truth["ranks"][str(rank)]
            fields = _decode(blob, entries[HEADER.unpack_from(blob)[1]])
            comm = mine["communicators"][str(fields["NCCL communicator ID"])]
            assert rank in comm["ranks"] and comm["size"] == len(comm["ranks"])
            seen.setdefault(fields["NCCL communicator ID"], set()).add(rank)
            if name == "ncclCommInitRankConfig":
                assert window[0] <= s and e <= step0
                assert fields["No. of ranks"] == comm["size"]
                assert fields["Rank"] == comm["ranks"].index(rank)
                assert fields["CUDA device"] == mine["device_id"]
                continue
            ranges = comm_ranges[tid]
            i = bisect.bisect_right(ranges, (s, float("inf"), "")) - 1
            label = dict(kv.split("=") for kv in ranges[i][2].split()[1:])
            assert ranges[i][0] <= s and e <= ranges[i][1]
            assert label["group"] == comm["group"] and int(label["size"]) == comm["size"]
            if name in COLLECTIVES:
                assert fields["Message size [bytes]"] == int(label["bytes"])
            else:
                assert 0 < fields["Message size [bytes]"] and 0 <= fields["Peer rank"] < comm["size"]
                assert fields["Peer rank"] != comm["ranks"].index(rank)
        con.close()
    # every rank of a group instance used the same id, and each id names one instance of one kind
    truth = {k: v for p in runs["payload"] for r in _truth(p)["ranks"].values() for k, v in r["communicators"].items()}
    assert {int(k) for k in truth} == set(seen)
    assert {(v["group"], tuple(v["ranks"])) for v in truth.values()} == {
        (truth[str(c)]["group"], tuple(sorted(r))) for c, r in seen.items()
    }
    assert {v["group"] for v in truth.values()} == {"tp", "cp", "ep", "dp", "pp"}
    assert len({tuple(v["ranks"]) for v in truth.values() if v["group"] == "tp"}) == 8
    assert any(c >= 1 << 63 for c in seen) and all(c < 1 << 64 for c in seen)


def test_comm_init_is_optional_and_payloads_leave_the_run_alone(runs: dict[str, list[Path]]) -> None:
    for with_init, without, plain in zip(runs["payload"], runs["no_init"], runs["plain"]):
        cons = [sqlite3.connect(p) for p in (with_init, without, plain)]
        names = [[r[2] for r in _rows(c) if r[1] == "NCCL"] for c in cons]
        assert "ncclCommInitRankConfig" in names[0]
        assert names[1] == names[2] == [n for n in names[0] if n != "ncclCommInitRankConfig"]
        kernels = [c.execute("SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall() for c in cons]
        assert kernels[0] == kernels[1] == kernels[2]
        assert any(r[7] == "blob" for r in _rows(cons[1]))
        tables = {n for (n,) in cons[2].execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert not {"NVTX_PAYLOAD_SCHEMAS", "NVTX_PAYLOAD_SCHEMA_ENTRIES"} & tables
        assert cons[2].execute("SELECT COUNT(binaryData) FROM NVTX_EVENTS").fetchone()[0] == 0
        assert "EXPORT_PARAM_INCLUDE_BLOBS" not in dict(cons[2].execute("SELECT name, value FROM META_DATA_EXPORT"))
        for c in cons:
            c.close()
    assert "nccl_payload" not in _truth(runs["plain"][0])["labels"]
    assert "communicators" not in _truth(runs["plain"][0])["ranks"]["0"]
    assert _truth(runs["no_init"][0])["labels"]["nccl_comm_init"] is False


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"output": {"schema": "2024.2"}}, "output.schema"),
        ({"labels": {"nccl_payload": True, "nccl": False}}, "labels.nccl"),
        ({"labels": {"nccl_payload": "yes"}}, "expected bool"),
        ({"labels": {"nccl_payload": True, "nccl_comm_init": 1}}, "labels.nccl_comm_init"),
    ],
)
def test_option_is_validated(changes: dict[str, Any], message: str) -> None:
    raw = {"name": "x", "labels": {"nccl_payload": True}, "output": {"schema": "2026.2"}}
    raw.update(changes)
    with pytest.raises(InputError, match="labels.nccl_") as err:
        scenario_from_dict(raw)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_schema_override_without_payload_tables_fails(tmp_path: Path) -> None:
    raw = {
        "name": "x",
        "labels": {"nccl_payload": True},
        "output": {"schema": "2026.2"},
        "run": {"steps": 1},
        "model": {"layers": 2, "hidden": 1024, "heads": 8, "ffn_hidden": 4096, "seq_length": 1024},
    }
    with pytest.raises(InputError, match="nccl_payload"):
        run_scenario(raw, tmp_path, schema="2024.2")
