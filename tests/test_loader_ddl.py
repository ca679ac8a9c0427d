"""The loader against the exact table definitions of three nsys releases, with hand-made rows.

tests/nsys/ddl/ holds the full DDL that ``nsys export --lazy=false`` writes in 2022.4.2 (schema
3.0.0), 2023.4.4 (3.7.2) and 2024.2.3 (3.11.1) -- every table, mostly left empty here, as in a
non-lazy export. Each test builds a file from one dump, inserts a small, consistent trace (two
processes, two GPUs, kernels launched by runtime calls with matching correlation ids, memcpy, memset,
NVTX ranges and marks in per-process domains, GPU and session info, the export's meta table) and
checks what the loader makes of it. Real captures of these schemas are tested in tests/nsys/.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from perfdoctor.errors import InputError
from perfdoctor.load.nsys import load_export
from perfdoctor.model import Timeline, TraceInfo

DDL = Path(__file__).resolve().parent / "nsys" / "ddl"


@dataclass(frozen=True)
class Release:
    ddl: str
    product: str
    schema: str
    meta_table: str

    @property
    def captures_env(self) -> bool:
        """Exporters from 2023.4 on write META_DATA_CAPTURE (one row per environment variable)."""
        return self.meta_table == "META_DATA_EXPORT"


RELEASES = [
    Release("schema_2022.4.2.sql", "2022.4.2.1", "3.0.0", "EXPORT_META_DATA"),
    Release("schema_2023.4.4.sql", "2023.4.4.54", "3.7.2", "META_DATA_EXPORT"),
    Release("schema_2024.2.3.sql", "2024.2.3.38", "3.11.1", "META_DATA_EXPORT"),
]

VM = 1 << 48  # nsys sets the VM byte of global ids to 1 on a plain Linux host
PID_A, PID_B, PID_IDLE = 1000, 2000, 3000
A_MAIN, A_COMM, B_MAIN = 1000, 1005, 2000
SESSION_START = 1_700_000_000_123_456_789
GEMM = "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn"
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
H100 = "NVIDIA H100 80GB HBM3"


def gpid(pid: int) -> int:
    return VM | (pid << 24)


def gtid(pid: int, tid: int) -> int:
    return gpid(pid) | tid


class Builder:
    """Inserts rows into a DDL-created file, filling NOT NULL columns the test does not care about."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.strings: dict[str, int] = {}

    def string(self, value: str) -> int:
        if value not in self.strings:
            self.strings[value] = len(self.strings) + 1
            self.conn.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (self.strings[value], value))
        return self.strings[value]

    def insert(self, table: str, **values: object) -> None:
        columns = {r[1]: (r[2].upper(), bool(r[3])) for r in self.conn.execute(f"PRAGMA table_info([{table}])")}
        assert columns, f"{table} is not in this schema"
        unknown = set(values) - set(columns)
        assert not unknown, f"{table} has no column {unknown} in this schema"
        row = {
            name: (0 if "INT" in kind or "REAL" in kind else "")
            for name, (kind, notnull) in columns.items()
            if notnull and name not in values
        }
        row.update(values)
        names = ", ".join(f"[{c}]" for c in row)
        self.conn.execute(f"INSERT INTO [{table}] ({names}) VALUES ({', '.join('?' * len(row))})", list(row.values()))


def build(path: Path, release: Release) -> None:
    conn = sqlite3.connect(path)
    conn.executescript((DDL / release.ddl).read_text())
    b = Builder(conn)
    meta = {
        "EXPORT_PRODUCT_NAME": "NVIDIA Nsight Systems",
        "EXPORT_PRODUCT_VERSION": release.product,
        "EXPORT_SCHEMA_VERSION": release.schema,
    }
    for name, value in meta.items():
        b.insert(release.meta_table, name=name, value=value)
    if release.captures_env:
        b.insert("META_DATA_CAPTURE", name="PROCESS_0:COMMAND", value="python train.py")
        b.insert("META_DATA_CAPTURE", name="PROCESS_0:ENVIRONMENT_VARIABLE", value='RANK="0"')
        b.insert("META_DATA_CAPTURE", name="PROCESS_0:ENVIRONMENT_VARIABLE", value='NCCL_ALGO="Ring"')
    b.insert(
        "TARGET_INFO_SESSION_START_TIME",
        utcEpochNs=SESSION_START,
        utcTime="2023-11-14T22:13:20",
        localTime="2023-11-14T22:13:20",
    )
    b.insert(
        "TARGET_INFO_SYSTEM_ENV", globalVid=VM, devStateName="Local (CLI)", name="Hostname", nameEnum=21, value="node-a"
    )
    for dev in (0, 1):
        b.insert(
            "TARGET_INFO_GPU",
            vmId=0,
            id=dev,
            name=H100,
            busLocation=f"0000:{0x19 + dev:02x}:00.0",
            totalMemory=85_899_345_920,
            clockRate=1_980_000_000,
            memoryBandwidth=3_352_320_000_000,
            smCount=132,
            computeMajor=9,
            computeMinor=0,
            uuid=f"GPU-0000000{dev}",
        )
    for pid, name in ((PID_A, "python3"), (PID_B, "python3"), (PID_IDLE, "bash")):
        b.insert("PROCESSES", globalPid=gpid(pid), pid=pid, name=name)
    b.insert("ThreadNames", nameId=b.string("python3"), priority=0, globalTid=gtid(PID_A, A_MAIN))
    b.insert("ThreadNames", nameId=b.string("python3"), priority=0, globalTid=gtid(PID_B, B_MAIN))

    # CUDA: each kernel/memcpy/memset has a runtime call with the same correlationId in its process.
    # correlationIds are per process: B reuses 11.
    launch, memcpy_api, memset_api = (
        b.string(n) for n in ("cudaLaunchKernel_v7000", "cudaMemcpyAsync_v3020", "cudaMemsetAsync_v3020")
    )
    gemm = (b.string(GEMM), b.string(f"void {GEMM}<(int)128>(Params)"))
    nccl = (b.string(NCCL), b.string(f"{NCCL}(ncclDevComm *, unsigned long, ncclWork *)"))
    for pid, tid, corr, name, start, end in (
        (PID_A, A_MAIN, 11, launch, 900, 950),
        (PID_A, A_COMM, 12, launch, 1400, 1450),
        (PID_A, A_MAIN, 13, launch, 1150, 1190),
        (PID_A, A_MAIN, 14, memcpy_api, 2000, 2050),
        (PID_B, B_MAIN, 11, launch, 1000, 1050),
        (PID_B, B_MAIN, 15, memset_api, 1060, 1070),
    ):
        b.insert(
            "CUPTI_ACTIVITY_KIND_RUNTIME",
            start=start,
            end=end,
            eventClass=0,
            globalTid=gtid(pid, tid),
            correlationId=corr,
            nameId=name,
            returnValue=0,
        )
    for pid, dev, stream, corr, (short, demangled), start, end, grid in (
        (PID_A, 0, 7, 11, gemm, 1000, 2000, 132),
        (PID_A, 0, 20, 12, nccl, 1500, 3000, 24),
        (PID_A, 1, 7, 13, gemm, 1200, 1800, 66),
        (PID_B, 1, 7, 11, gemm, 1100, 1900, 33),
    ):
        b.insert(
            "CUPTI_ACTIVITY_KIND_KERNEL",
            start=start,
            end=end,
            deviceId=dev,
            contextId=1,
            streamId=stream,
            correlationId=corr,
            globalPid=gpid(pid),
            demangledName=demangled,
            shortName=short,
            launchType=1,
            gridX=grid,
            gridY=1,
            gridZ=1,
            blockX=256,
            blockY=1,
            blockZ=1,
        )
    b.insert(
        "CUPTI_ACTIVITY_KIND_MEMCPY",
        start=2100,
        end=2200,
        deviceId=0,
        contextId=1,
        streamId=7,
        correlationId=14,
        globalPid=gpid(PID_A),
        bytes=4096,
        copyKind=1,
        srcKind=1,
        dstKind=2,
    )
    b.insert(
        "CUPTI_ACTIVITY_KIND_MEMSET",
        start=1080,
        end=1090,
        deviceId=1,
        contextId=1,
        streamId=7,
        correlationId=15,
        globalPid=gpid(PID_B),
        value=0,
        bytes=512,
    )

    # NVTX: domain ids are per process (1 is "perfdoctor" in A, "NCCL" in B). Registered strings
    # (textId) as Python nvtx sends them, ASCII text as C code does.
    for pid, tid, domain in ((PID_A, A_MAIN, "perfdoctor"), (PID_B, B_MAIN, "NCCL")):
        b.insert("NVTX_EVENTS", start=10, eventType=75, globalTid=gtid(pid, tid), domainId=1, text=domain)
    b.insert(
        "NVTX_EVENTS",
        start=20,
        eventType=34,
        globalTid=gtid(PID_A, A_MAIN),
        domainId=1,
        textId=b.string("rank r=0 local=0 world=2"),
    )
    b.insert(
        "NVTX_EVENTS",
        start=800,
        end=3500,
        eventType=59,
        globalTid=gtid(PID_A, A_MAIN),
        domainId=1,
        textId=b.string("step n=0"),
    )
    b.insert(
        "NVTX_EVENTS", start=850, end=1300, eventType=59, globalTid=gtid(PID_A, A_MAIN), domainId=0, text="forward"
    )
    b.insert(
        "NVTX_EVENTS",
        start=1350,
        end=1460,
        eventType=60,
        rangeId=1,
        globalTid=gtid(PID_A, A_COMM),
        domainId=1,
        text="comm op=all_reduce group=dp bytes=1048576 size=2",
        int64Value=1_048_576,
    )
    b.insert("NVTX_EVENTS", start=30, eventType=39, globalTid=gtid(PID_A, A_COMM), text="pd-comm")
    b.insert(
        "NVTX_EVENTS",
        start=1000,
        end=1060,
        eventType=59,
        globalTid=gtid(PID_B, B_MAIN),
        domainId=1,
        textId=b.string("ncclAllReduce"),
    )
    b.insert("NVTX_EVENTS", start=4000, eventType=76, globalTid=gtid(PID_A, A_MAIN), domainId=1)

    osrt = b.string("pthread_cond_wait")
    for pid, tid, event_class in ((PID_A, A_MAIN, 27), (PID_A, A_COMM, 27), (PID_A, A_MAIN, 31), (PID_B, B_MAIN, 27)):
        b.insert(
            "OSRT_API",
            start=500,
            end=600,
            eventClass=event_class,
            globalTid=gtid(pid, tid),
            nameId=osrt,
            returnValue=0,
            nestingLevel=0,
            callchainId=0,
        )
    conn.commit()
    conn.close()


@pytest.fixture(scope="module", params=RELEASES, ids=[r.product[:6] for r in RELEASES])
def loaded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Release, TraceInfo, list[Timeline]]]:
    release: Release = request.param
    path = tmp_path_factory.mktemp("ddl") / f"{release.product}.sqlite"
    build(path, release)
    info, timelines = load_export(path)
    yield release, info, timelines


def by_key(timelines: list[Timeline]) -> dict[tuple[int, int | None], Timeline]:
    return {(tl.pid, tl.device_id): tl for tl in timelines}


def test_trace_info(loaded: tuple[Release, TraceInfo, list[Timeline]]) -> None:
    release, info, _ = loaded
    assert info.format == "nsys-sqlite"
    assert info.product_version == release.product
    assert info.nsys_version == release.product[:6]
    assert info.schema_version == release.schema
    assert info.meta_table == release.meta_table
    assert info.session_start_utc_ns == SESSION_START
    assert info.has_cuda is True
    assert info.hostname == "node-a"
    assert info.env == ({"RANK": "0", "NCCL_ALGO": "Ring"} if release.captures_env else {})
    assert "CUPTI_ACTIVITY_KIND_KERNEL" in info.tables and "NVTX_EVENTS" in info.tables


def test_gpus(loaded: tuple[Release, TraceInfo, list[Timeline]]) -> None:
    _, info, _ = loaded
    assert sorted(info.gpus) == [0, 1]
    gpu = info.gpus[1]
    assert (gpu.device_id, gpu.name, gpu.sm_count, gpu.compute_capability) == (1, H100, 132, "9.0")
    assert (gpu.total_memory, gpu.clock_rate_hz, gpu.memory_bandwidth) == (
        85_899_345_920,
        1_980_000_000,
        3_352_320_000_000,
    )
    assert (gpu.bus_location, gpu.uuid) == ("0000:1a:00.0", "GPU-00000001")


def test_one_timeline_per_process_and_device(loaded: tuple[Release, TraceInfo, list[Timeline]]) -> None:
    _, info, timelines = loaded
    assert sorted(by_key(timelines)) == [(PID_A, 0), (PID_A, 1), (PID_B, 1)]  # the idle process has none
    for tl in timelines:
        assert tl.trace is info
        assert tl.global_pid == gpid(tl.pid)
        assert tl.process_name == "python3"
        assert tl.gpu is info.gpus[tl.device_id]


def test_kernels_split_by_device(loaded: tuple[Release, TraceInfo, list[Timeline]]) -> None:
    _, _, timelines = loaded
    tls = by_key(timelines)
    a0 = tls[(PID_A, 0)].kernels
    assert list(a0["short_name"]) == [GEMM, NCCL]
    assert list(a0["demangled_name"]) == [
        f"void {GEMM}<(int)128>(Params)",
        f"{NCCL}(ncclDevComm *, unsigned long, ncclWork *)",
    ]
    assert list(a0["correlation_id"]) == [11, 12] and list(a0["stream"]) == [7, 20]
    assert list(a0["start"]) == [1000, 1500] and list(a0["end"]) == [2000, 3000]
    assert list(a0["grid_x"]) == [132, 24] and list(a0["block_x"]) == [256, 256]
    assert list(a0["launch_type"]) == [1, 1] and a0["launch_type"].dtype.name == "int8"
    assert list(tls[(PID_A, 1)].kernels["correlation_id"]) == [13]
    assert list(tls[(PID_B, 1)].kernels["grid_x"]) == [33]


def test_a_timeline_s_process_and_device_columns_are_held_once(
        loaded: tuple[Release, TraceInfo, list[Timeline]]) -> None:
    _, _, timelines = loaded
    for tl in timelines:
        for table in (tl.kernels, tl.memcpy, tl.memset, tl.sync):
            if len(table) > 1:
                pids, devices = table["global_pid"], table["device_id"]
                assert pids.tolist() == [tl.global_pid] * len(table) and pids.strides == (0,)
                assert devices.tolist() == [tl.device_id] * len(table) and devices.strides == (0,)


def test_every_gpu_op_finds_its_launch_call(loaded: tuple[Release, TraceInfo, list[Timeline]]) -> None:
    """correlationIds are per process: B's kernel 11 belongs to B's call 11, not A's."""
    _, _, timelines = loaded
    for tl in timelines:
        calls = {int(r.correlation_id): r for r in tl.api.rows()}
        for frame in (tl.kernels, tl.memcpy, tl.memset):
            for op in frame.rows():
                call = calls[int(op.correlation_id)]
                assert (call.tid >> 24) & 0xFFFFFF == tl.pid
                assert call.start < op.start


def test_api_names_lose_their_version_suffix(loaded: tuple[Release, TraceInfo, list[Timeline]]) -> None:
    _, _, timelines = loaded
    tls = by_key(timelines)
    api = tls[(PID_A, 0)].api.sorted_by("start")
    assert list(api["name"]) == ["cudaLaunchKernel", "cudaLaunchKernel", "cudaLaunchKernel", "cudaMemcpyAsync"]
    assert list(api["tid"]) == [gtid(PID_A, t) for t in (A_MAIN, A_MAIN, A_COMM, A_MAIN)]
    assert set(api["event_class"]) == {0}
    assert sorted(tls[(PID_B, 1)].api["name"]) == ["cudaLaunchKernel", "cudaMemsetAsync"]


def test_memcpy_and_memset(loaded: tuple[Release, TraceInfo, list[Timeline]]) -> None:
    _, _, timelines = loaded
    tls = by_key(timelines)
    (copy,) = tls[(PID_A, 0)].memcpy.rows()
    assert (copy.start, copy.end, copy.bytes, copy.copy_kind, copy.stream) == (2100, 2200, 4096, 1, 7)
    assert len(tls[(PID_A, 1)].memcpy) == 0 and len(tls[(PID_A, 0)].memset) == 0
    (fill,) = tls[(PID_B, 1)].memset.rows()
    assert (fill.bytes, fill.correlation_id) == (512, 15)


def test_nvtx_ranges_and_marks(loaded: tuple[Release, TraceInfo, list[Timeline]]) -> None:
    _, _, timelines = loaded
    tls = by_key(timelines)
    rows = [
        (r.text, r.domain, r.event_type, r.start, r.end, r.tid, r.end_tid, r.range_id, r.int_value)
        for r in tls[(PID_A, 0)].nvtx.rows()
    ]
    assert rows == [
        ("rank r=0 local=0 world=2", "perfdoctor", 34, 20, -1, gtid(PID_A, A_MAIN), -1, -1, -1),
        ("step n=0", "perfdoctor", 59, 800, 3500, gtid(PID_A, A_MAIN), -1, -1, -1),
        ("forward", None, 59, 850, 1300, gtid(PID_A, A_MAIN), -1, -1, -1),
        (
            "comm op=all_reduce group=dp bytes=1048576 size=2",
            "perfdoctor",
            60,
            1350,
            1460,
            gtid(PID_A, A_COMM),
            -1,
            1,
            1_048_576,
        ),
    ]
    # NVTX belongs to the process, so each of its devices sees it.
    assert tls[(PID_A, 1)].nvtx.equals(tls[(PID_A, 0)].nvtx)
    b_rows = [(r.text, r.domain, r.event_type) for r in tls[(PID_B, 1)].nvtx.rows()]
    assert b_rows == [("ncclAllReduce", "NCCL", 59)]


def test_thread_names_and_osrt_counts(loaded: tuple[Release, TraceInfo, list[Timeline]]) -> None:
    _, _, timelines = loaded
    tls = by_key(timelines)
    assert tls[(PID_A, 0)].thread_names == {gtid(PID_A, A_MAIN): "python3", gtid(PID_A, A_COMM): "pd-comm"}
    assert tls[(PID_B, 1)].thread_names == {gtid(PID_B, B_MAIN): "python3"}
    assert tls[(PID_A, 0)].osrt_calls == 2  # the class-31 "profiling started" marker is not a call
    assert tls[(PID_B, 1)].osrt_calls == 1


@pytest.mark.parametrize("release", RELEASES, ids=[r.product[:6] for r in RELEASES])
def test_an_export_without_events_loads_empty(release: Release, tmp_path: Path) -> None:
    """A non-lazy export of a capture that recorded nothing: every table exists, all are empty."""
    path = tmp_path / "empty.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript((DDL / release.ddl).read_text())
    Builder(conn).insert(release.meta_table, name="EXPORT_SCHEMA_VERSION", value=release.schema)
    conn.commit()
    conn.close()
    info, timelines = load_export(path)
    assert (info.schema_version, info.has_cuda, timelines) == (release.schema, False, [])


def test_bad_inputs_raise_input_error(tmp_path: Path) -> None:
    text = tmp_path / "notes.sqlite"
    text.write_text("not a database\n" * 100)
    other = tmp_path / "other.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t (x INTEGER)")
    conn.commit()
    conn.close()
    for path in (tmp_path / "missing.sqlite", text, other, tmp_path):
        with pytest.raises(InputError):
            load_export(path)


def test_small_valued_kernel_columns_are_int32_unless_a_value_does_not_fit() -> None:
    import numpy as np

    from perfdoctor.load.nsys import _narrow

    assert _narrow(np.array([0, 7, 2**31 - 1])).dtype == np.int32
    wide = np.array([0, 2**31])  # a CUPTI uint32 past int32: kept exact
    assert _narrow(wide).dtype == np.int64 and _narrow(wide).tolist() == [0, 2**31]
