"""The data model every stage shares: Timelines in, Report out.

A :class:`Timeline` is one GPU as seen from one process (DESIGN §2). Its event tables are
:class:`perfdoctor.table.Table` objects (named numpy columns), read in bulk; times are integer
nanoseconds on the timeline of the file they came from (``TraceInfo.session_start_utc_ns`` aligns
files). Strings (kernel names, NVTX text) are resolved once per file, so measurements never touch the
SQLite file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from perfdoctor.load.memsnap import MemorySnapshot
    from perfdoctor.table import Table


@dataclass(frozen=True)
class GpuInfo:
    """Properties of one device, from ``TARGET_INFO_GPU`` (or ``TARGET_INFO_CUDA_DEVICE`` in 2026 exports)."""

    device_id: int
    name: str | None = None
    sm_count: int | None = None
    total_memory: int | None = None
    clock_rate_hz: int | None = None
    memory_bandwidth: int | None = None
    compute_capability: str | None = None
    bus_location: str | None = None
    uuid: str | None = None


@dataclass
class TraceInfo:
    """What one input file is: exporter and schema versions, capture settings and environment."""

    path: Path
    format: str  # "nsys-sqlite" | "kineto-json"
    product_version: str | None  # e.g. "2026.2.1.210"
    schema_version: str | None  # EXPORT_SCHEMA_VERSION, e.g. "3.25.0"
    meta_table: str  # META_DATA_EXPORT (>= 2023.4) or EXPORT_META_DATA (<= 2022.4)
    session_start_utc_ns: int | None
    has_cuda: bool
    env: dict[str, str] = field(default_factory=dict)  # captured environment (META_DATA_CAPTURE)
    hostname: str | None = None
    gpus: dict[int, GpuInfo] = field(default_factory=dict)
    tables: frozenset[str] = frozenset()
    counts: dict[str, int] = field(default_factory=dict)  # rows per event table, for the summary
    warnings: list[str] = field(default_factory=list)
    # Parallel sizes the file itself states (a Kineto trace's named process groups: ``{"tp": 4}``), and
    # the rank and world size it records; merged into the run config below marks and CLI values.
    config: dict[str, Any] = field(default_factory=dict)
    rank: int | None = None
    world_size: int | None = None
    # c10d process-group name → DESIGN §4 group, as perfdoctor's capture hook named the groups it saw
    # (the metadata of a ``perfdoctor capture --profiler torch`` trace): labels NCCL kernels by their
    # ``Process Group Name`` where no ``comm`` range encloses their launch.
    capture_groups: dict[str, str] = field(default_factory=dict)

    @property
    def producer(self) -> str:
        """Who wrote the file and in which format version, as reports name it."""
        if self.format == "kineto-json":
            return f"PyTorch profiler (Kineto) trace, schema {self.schema_version or '?'}"
        version = f"nsys {self.nsys_version}" if self.nsys_version else "nsys version unknown"
        return f"{version}, export schema {self.schema_version or '?'}"

    @property
    def nsys_version(self) -> str | None:
        """Release as users say it ("2026.2"), from the product version string."""
        if not self.product_version:
            return None
        parts = self.product_version.split(".")
        return ".".join(parts[:2])


class _Identity:
    """What a timeline's identity gives: its GPU's properties and a short human name."""

    trace: TraceInfo
    pid: int
    device_id: int | None
    rank: int | None

    @property
    def gpu(self) -> GpuInfo | None:
        if self.device_id is None:
            return None
        return self.trace.gpus.get(self.device_id)

    @property
    def label(self) -> str:
        """Short human name: ``rank 0 · pid 144 · GPU 0``."""
        bits = []
        if self.rank is not None:
            bits.append(f"rank {self.rank}")
        bits.append(f"pid {self.pid}")
        bits.append(f"GPU {self.device_id}" if self.device_id is not None else "no GPU")
        return " · ".join(bits)


@dataclass
class Timeline(_Identity):
    """One (process, device) of one trace file.

    ``device_id`` is ``None`` for a process that ran no CUDA work (CPU-only capture): such a
    timeline still carries its NVTX ranges and OS-runtime counts.

    Tables (:class:`perfdoctor.table.Table`, integer ns, one row per event):
      kernels   start end stream correlation_id launch_type grid_x grid_y grid_z block_x block_y block_z
                short_name demangled_name (dictionary-encoded ``Strings``); sorted by start (the loader sorts once, so
                measurements rely on it instead of sorting a million rows again). A CUDA graph replay
                traced as a whole (nsys --cuda-graph-trace=graph) is one row here, named
                ``[CUDA graph <graphId> replay]`` with launch/grid/block columns -1 (load/graph_trace.py):
                busy compute for its whole span, linked to its cudaGraphLaunch by correlation id
      memcpy    start end stream correlation_id bytes copy_kind
      memset    start end stream correlation_id bytes
      sync      start end stream correlation_id sync_type
      api       start end tid correlation_id name event_class   (CUDA runtime/driver calls of this process;
                name dictionary-encoded ``Strings``)
      nvtx      start end event_type tid end_tid domain text range_id category int_value double_value
                (ranges have end >= start; marks have end == -1)
      nccl      start end tid name comm bytes nranks rank   (NCCL API calls whose NVTX payload names their
                communicator: ``comm`` uint64 id; -1 where a value is unknown; only in exports with blobs)

    Detail columns: kernels grid_x…block_z, api event_class and nvtx range_id category int_value
    double_value are read only when asked for (``load_export(path, detail=True)``, the default);
    ``api.analyze`` loads with ``detail=False`` because no measurement reads them (load.nsys_columns.DETAIL_COLUMNS).
    A loader of another input format (Kineto, …) fills the other columns and may leave these out.

    Columns are held at the width their values need (nsys: stream and correlation_id int32, launch_type
    int8), ``Strings`` codes int8/int16/int32 by how many distinct values there are; a table's ``device_id``
    and ``global_pid`` (one value on a timeline) are held once, as read-only broadcasts. Tables are
    read-only, and arithmetic that can leave a column's type (``codes * n``) widens it first.
    """

    trace: TraceInfo
    pid: int
    global_pid: int
    device_id: int | None
    kernels: Table
    memcpy: Table
    memset: Table
    sync: Table
    api: Table
    nvtx: Table
    nccl: Table | None = None  # NCCL payload events (load/nccl_payload.py); None or empty: none
    thread_names: dict[int, str] = field(default_factory=dict)
    process_name: str | None = None
    osrt_calls: int = 0
    rank: int | None = None
    rank_source: str | None = None  # nvtx-mark | env | manifest | file-order
    memory: MemorySnapshot | None = None  # this rank's CUDA memory snapshot, when the run has one
    # Set by a loader that leaves the large tables in the file's pieces until the timeline is analysed
    # (load/pieces.py): called by :meth:`filled`; kernels, api, memcpy and memset are empty until then.
    pending: Callable[[Timeline], Timeline] | None = field(default=None, repr=False, compare=False)

    def filled(self) -> Timeline:
        """This timeline with all its tables (itself when its loader read them whole)."""
        return self.pending(self) if self.pending is not None else self


@dataclass
class TimelineInfo(_Identity):
    """Who a Timeline is, without its event tables: what a per-rank task sends back to the process that
    assembles the Report (DESIGN §1 "Execution"), so no timeline ever travels between processes.
    ``rank_mark`` / ``config_mark`` are the capture hook's marks, kept for the run-level rank assignment
    and config merge; ``last_event_ns`` (its latest event, on its file's clock) tells captures apart and
    snapshots from other runs; ``fingerprints`` are the framework evidence its tables held
    (perfdoctor.classify.framework)."""

    trace: TraceInfo
    pid: int
    global_pid: int
    device_id: int | None
    process_name: str | None = None
    rank: int | None = None
    rank_source: str | None = None
    rank_mark: dict[str, int] | None = None
    config_mark: dict[str, Any] = field(default_factory=dict)
    memory: MemorySnapshot | None = None
    last_event_ns: int | None = None
    fingerprints: frozenset[str] = frozenset()


@dataclass
class Run:
    """All timelines of one analysis (one file, several files, or a run directory)."""

    traces: list[TraceInfo]
    timelines: list[Timeline] | list[TimelineInfo]  # analyze() keeps only the identities (TimelineInfo)
    config: dict[str, Any] = field(default_factory=dict)
    config_sources: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # {name: megatron-bridge|nemo2|megatron-lm|megatron-core|pytorch|unknown, source} (classify/framework.py)
    framework: dict[str, str] = field(default_factory=lambda: {"name": "unknown", "source": "not detected"})


@dataclass
class DeviceSummary:
    """What one timeline did: the breakdown ``perfdoctor analyze`` prints per device.

    Times are ns. ``category_ns`` sums kernel durations per category (overlapping kernels count twice,
    as in nsys' kernel summary); ``busy_ns``, ``compute_ns`` and ``comm_ns`` are unions (wall time).
    """

    rank: int
    label: str
    pid: int
    device_id: int | None
    process_name: str | None
    gpu_name: str | None
    window: tuple[int, int] | None
    step_source: str
    step_ns: list[int]
    kernel_count: int
    comm_kernel_count: int
    busy_ns: int
    compute_ns: int
    comm_ns: int
    category_ns: dict[str, int]
    category_count: dict[str, int]
    collectives: dict[str, dict[str, int]]  # collective → {"count", "ns"}
    comm_libraries: dict[str, int]  # library → kernel count
    streams: list[dict[str, int]]  # {"stream", "kernels", "ns", "comm_kernels", "comm_ns"}
    top_kernels: list[dict[str, Any]]  # {"name", "category", "count", "ns"}
    memcpy_count: int
    memset_count: int
    cuda_api_calls: int
    nvtx_ranges: int
    nvtx_marks: int
    nvtx_domains: dict[str, int]
    osrt_calls: int
    # How each parallel group's comm kernels were labelled (DESIGN §4): per group, kernels, ns, and the
    # kernels/ns per label_source (nvtx | heuristic) and per confidence (high | medium | low).
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    # What findings quote, per topic (ln, tp_overlap, attention, moe, unfused, mfu, comm, pipeline):
    # kernel names, groups, environment values — see perfdoctor.measure.metrics.timeline_metrics.
    evidence: dict[str, Any] = field(default_factory=dict)
    # The range the steps come from (framework-step / repeating-range sources), the device time before the
    # first step (init, warm-up: in no step) and the ranges the program named there.
    step_label: str = ""
    excluded_ns: int = 0
    excluded_ranges: list[str] = field(default_factory=list)


@dataclass
class Report:
    """Everything an analysis produced; renderers only format it (DESIGN §5 is its JSON form)."""

    tool_version: str
    run: Run
    devices: list[DeviceSummary]
    metrics: dict[str, dict[str, Any]]  # {"all": {...}, "ranks": {"0": {...}}}
    findings: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Per rank, per-step series of the main metrics (perfdoctor.measure.step_series): the noise estimate
    # of ``perfdoctor diff``. JSON: ``series``.
    series: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    # Per device (aligned with ``devices``), the representative step drawn per stream for the HTML
    # timeline (perfdoctor.measure.excerpt.Excerpt, or None); not part of the JSON report.
    excerpts: list[Any] = field(default_factory=list)
    # One step of every rank on the aligned clock, with the waits between ranks, for the Perfetto timeline
    # (perfdoctor.measure.trace_excerpt.RunTrace; only when asked for); not part of the JSON report.
    run_trace: Any = None
    # Per rank (str keys), the critical path of its representative step (perfdoctor.blame.join): entries
    # {start_ns, end_ns, rank, cause, what, inferred} in time order on the rank's clock. JSON: ``path``.
    path: Mapping[str, list[dict[str, Any]]] = field(default_factory=dict)
