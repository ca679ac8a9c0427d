"""One rank's host thread and GPU streams, advanced launch by launch, recording what nsys would see.

The model (DESIGN §7): a single Python thread issues CUDA API calls. Each launch costs Python overhead
plus the API call itself; the kernel starts when its call has returned (plus the launch latency), its
stream is free and any event it waits on has fired. A host that launches more slowly than the GPU drains
leaves the device idle (host-bound); a synchronize blocks the host until the device drains. A TE tuned
norm is a cooperative launch that needs every SM: while an NCCL kernel on another stream holds SMs, it
cannot start until that kernel ends, unless the SM margin env var leaves room. Copies and fills
(`cudaMemcpyAsync`, `cudaMemsetAsync`) queue on a stream like kernels and keep the device busy; every
`cudaStreamSynchronize` and `cudaStreamWaitEvent` leaves a CUPTI synchronization record, as in real exports.

Columns are appended to plain lists (ints), so a million kernels stay cheap; the writer and the
ground truth read the same lists.

A recorder stands for every rank of its pipeline stage. NCCL's NVTX payloads differ between those ranks
(each names its own communicator), so the recorder keeps what they depend on — per NCCL API range the
process-group kind, bytes and peer offset (`nccl_calls`), and every rank's communicators — and the writer
builds each rank's payloads from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfdoctor.synth.kernels import KernelTable
from perfdoctor.synth.scenario import Communicator

GROUP_CODES = {"": 0, "dp": 1, "tp": 2, "cp": 3, "pp": 4, "ep": 5}
GROUP_NAMES = {v: k for k, v in GROUP_CODES.items()}

API_SYNC_STREAM = "cudaStreamSynchronize_v3020"
API_EVENT_RECORD = "cudaEventRecord_v3020"
API_STREAM_WAIT = "cudaStreamWaitEvent_v3020"
API_MEMCPY = "cudaMemcpyAsync_v3020"
API_MEMSET = "cudaMemsetAsync_v3020"
API_GRAPH_LAUNCH = "cudaGraphLaunch_v10000"
# A replayed graph runs its kernels back to back: the device starts the next node ~0.4 us after one ends,
# with no host in between (DESIGN §3 "CUDA graphs").
GRAPH_NODE_GAP_NS = 400

# nsys enums (research/nsys_schema.md §3.14): ENUM_CUDA_MEMCPY_OPER, ENUM_CUDA_MEM_KIND, ENUM_CUPTI_SYNC_TYPE
COPY_HTOD, COPY_DTOH = 1, 2
MEM_PAGEABLE, MEM_PINNED, MEM_DEVICE = 0, 1, 2
SYNC_STREAM_WAIT_EVENT, SYNC_STREAM_SYNCHRONIZE = 2, 3
NO_EVENT = 0xFFFFFFFF  # eventId of a stream synchronize, as nsys writes it
# CUPTI's synchronization record lies inside its API call: real exports show it ~0.5 us after the call
# starts and ~0.6 us before it returns (stream sync), ~0.3 / 0.2 us for the short stream-wait calls.
_SYNC_EDGE_NS = {SYNC_STREAM_SYNCHRONIZE: (550, 650), SYNC_STREAM_WAIT_EVENT: (300, 200)}

NVTX_MARK = 34
NVTX_PUSHPOP = 59
NVTX_DOMAIN_CREATE = 75


@dataclass
class HostCost:
    """Per-call host costs in ns; `jitter` is the lognormal sigma of Python overhead."""

    python_ns: float
    launch_ns: dict[str, float]
    latency_ns: int = 3_000
    jitter: float = 0.3


@dataclass
class RankRecorder:
    """Timeline of one process driving one GPU; times are ns on the session clock."""

    rank: int
    table: KernelTable
    cost: HostCost
    rng: np.random.Generator
    sm_margin: int
    compute_stream: int
    host: int = 0
    stream_free: dict[int, int] = field(default_factory=dict)
    corr: int = 0
    # kernels
    k_start: list[int] = field(default_factory=list)
    k_end: list[int] = field(default_factory=list)
    k_stream: list[int] = field(default_factory=list)
    k_spec: list[int] = field(default_factory=list)
    k_corr: list[int] = field(default_factory=list)
    k_group: list[int] = field(default_factory=list)
    # CUDA graphs (host.cuda_graphs): per kernel the graph it was replayed from (0: launched on its own)
    # and its node id in that graph; graph ids are 1.. in order of first replay
    k_graph: list[int] = field(default_factory=list)
    k_node: list[int] = field(default_factory=list)
    graph_ids: dict[str, int] = field(default_factory=dict)
    _replay: list[int] | None = None  # graph id, correlationId, ns the replay may start at, nodes so far
    # copies (CUPTI_ACTIVITY_KIND_MEMCPY): kind/src/dst are the nsys enum values
    c_start: list[int] = field(default_factory=list)
    c_end: list[int] = field(default_factory=list)
    c_stream: list[int] = field(default_factory=list)
    c_corr: list[int] = field(default_factory=list)
    c_bytes: list[int] = field(default_factory=list)
    c_kind: list[int] = field(default_factory=list)
    c_src: list[int] = field(default_factory=list)
    c_dst: list[int] = field(default_factory=list)
    # fills (CUPTI_ACTIVITY_KIND_MEMSET), all to device memory with value 0
    f_start: list[int] = field(default_factory=list)
    f_end: list[int] = field(default_factory=list)
    f_stream: list[int] = field(default_factory=list)
    f_corr: list[int] = field(default_factory=list)
    f_bytes: list[int] = field(default_factory=list)
    # synchronization records: (start, end, stream, correlationId, syncType, eventId, eventSyncId)
    syncs: list[tuple[int, int, int, int, int, int, int]] = field(default_factory=list)
    events: int = 0
    # CUDA API calls
    r_start: list[int] = field(default_factory=list)
    r_end: list[int] = field(default_factory=list)
    r_corr: list[int] = field(default_factory=list)
    r_name: list[str] = field(default_factory=list)
    # NVTX rows: (start, end, eventType, text, domain)
    nvtx: list[tuple[int, int | None, int, str, str]] = field(default_factory=list)
    # NCCL payloads (labels.nccl_payload): per global rank of the stage its communicators by group kind,
    # None when payloads are off; per NCCL API row index (group kind, message bytes, peer offset), the
    # peer being the group rank `peer offset` places after the caller's
    communicators: dict[int, dict[str, Communicator]] | None = None
    nccl_calls: dict[int, tuple[str, int, int]] = field(default_factory=dict)
    # host activity that explains idle time, independent of labels: (start, end, cause)
    host_ranges: list[tuple[int, int, str]] = field(default_factory=list)
    # Python work that launches nothing and names no cause (bookkeeping after a synchronize): (start, end);
    # and per pipeline send/receive kernel index, how long it waited for its peer's data at its end. The
    # critical-path truth (synth/truth_path.py) needs both; nsys records neither.
    quiet_host: list[tuple[int, int]] = field(default_factory=list)
    p2p_wait: dict[int, int] = field(default_factory=dict)
    # a slow rank inside a pipeline run (synth/simulate.py): per DP collective, when its last member arrived
    dp_last: list[int] = field(default_factory=list)
    # tuned norms delayed behind NCCL: (kernel index, delay ns)
    ln_blocked: list[tuple[int, int]] = field(default_factory=list)
    # comm kernels on side streams that may hold SMs: (start, end, stream)
    _busy: list[tuple[int, int, int]] = field(default_factory=list)
    _noise: np.ndarray = field(default_factory=lambda: np.ones(0))
    _noise_i: int = 0

    def _python(self) -> int:
        if self._noise_i >= len(self._noise):
            self._noise = np.exp(self.rng.normal(0.0, self.cost.jitter, 65536)) * self.cost.python_ns
            self._noise_i = 0
        v = self._noise[self._noise_i]
        self._noise_i += 1
        return int(v)

    def api(self, name: str, cost_ns: int) -> tuple[int, int, int]:
        """Record a CUDA API call on the host thread; returns (start, end, correlationId)."""
        self.corr += 1
        start = self.host
        end = start + cost_ns
        self.host = end
        self.r_start.append(start)
        self.r_end.append(end)
        self.r_corr.append(self.corr)
        self.r_name.append(name)
        return start, end, self.corr

    def graph_begin(self, key: str) -> None:
        """Replay the CUDA graph captured for `key` (one per layer pass, as TE graphed layers are): one
        cudaGraphLaunch call; the compute-stream kernels launched until `graph_end` are its nodes."""
        graph = self.graph_ids.setdefault(key, len(self.graph_ids) + 1)
        self.host += self._python()
        _, api_end, corr = self.api(API_GRAPH_LAUNCH, int(self.cost.launch_ns[API_GRAPH_LAUNCH]))
        self._replay = [graph, corr, api_end + self.cost.latency_ns, 0]

    def graph_end(self) -> None:
        self._replay = None

    def launch(self, spec: int, stream: int, dur: float, group: str = "", after: int = 0) -> int:
        """Launch kernel `spec` on `stream`; returns its GPU end time. Inside a graph replay a compute-stream
        kernel costs the host nothing and shares the graph launch's correlationId."""
        s = self.table.specs[spec]
        graph = node = 0
        if self._replay is not None and stream == self.compute_stream:
            graph, corr, ready, nodes = self._replay
            self._replay[3] += 1
            node = graph * 100_000 + nodes + 1  # graphNodeId: unique across the process's graphs
            free = self.stream_free.get(stream, 0)
            start = max(ready if nodes == 0 else free + GRAPH_NODE_GAP_NS, free, after)
        else:
            self.host += self._python()
            _, api_end, corr = self.api(s.api, int(self.cost.launch_ns[s.api]))
            start = max(api_end + self.cost.latency_ns, self.stream_free.get(stream, 0), after)
        if s.is_tuned_norm and self.sm_margin == 0 and self._busy:
            start = self._wait_for_sms(start, stream)
        end = start + max(int(dur), 1_000)
        self.stream_free[stream] = end
        self.k_start.append(start)
        self.k_end.append(end)
        self.k_stream.append(stream)
        self.k_spec.append(spec)
        self.k_corr.append(corr)
        self.k_group.append(GROUP_CODES[group])
        self.k_graph.append(graph)
        self.k_node.append(node)
        if s.is_comm and stream != self.compute_stream:
            self._busy.append((start, end, stream))
        return end

    def _queue(self, api: str, stream: int, dur: float) -> tuple[int, int, int]:
        """Issue an async copy/fill call; the op runs once the call returned and its stream is free."""
        self.host += self._python()
        _, api_end, corr = self.api(api, int(self.cost.launch_ns[api]))
        start = max(api_end + self.cost.latency_ns, self.stream_free.get(stream, 0))
        end = start + max(int(dur), 500)
        self.stream_free[stream] = end
        return start, end, corr

    def copy(self, nbytes: int, kind: int, src: int, dst: int, stream: int, dur: float) -> None:
        """cudaMemcpyAsync of `nbytes` (copy kind and memory kinds as nsys enums) on `stream`."""
        start, end, corr = self._queue(API_MEMCPY, stream, dur)
        self.c_start.append(start)
        self.c_end.append(end)
        self.c_stream.append(stream)
        self.c_corr.append(corr)
        self.c_bytes.append(int(nbytes))
        self.c_kind.append(kind)
        self.c_src.append(src)
        self.c_dst.append(dst)

    def fill(self, nbytes: int, stream: int, dur: float) -> None:
        """cudaMemsetAsync(ptr, 0, nbytes) of device memory on `stream`."""
        start, end, corr = self._queue(API_MEMSET, stream, dur)
        self.f_start.append(start)
        self.f_end.append(end)
        self.f_stream.append(stream)
        self.f_corr.append(corr)
        self.f_bytes.append(int(nbytes))

    def _sync_record(self, sync_type: int, stream: int, event: int, event_sync: int) -> None:
        """The CUPTI synchronization record of the API call just recorded."""
        lead, trail = _SYNC_EDGE_NS[sync_type]
        start, end, corr = self.r_start[-1], self.r_end[-1], self.r_corr[-1]
        self.syncs.append((start + lead, end - trail, stream, corr, sync_type, event, event_sync))

    def _wait_for_sms(self, start: int, stream: int) -> int:
        """A cooperative norm cannot become resident while a side-stream NCCL kernel holds SMs."""
        self._busy = [b for b in self._busy if b[1] > start]
        t = start
        moved = True
        while moved:
            moved = False
            for b0, b1, bs in self._busy:
                if bs != stream and b0 <= t < b1:
                    t = b1
                    moved = True
        if t > start:
            self.ln_blocked.append((len(self.k_start), t - start))
        return t

    def wait_stream(self, dst: int, src: int) -> None:
        """`dst` waits for everything queued on `src` (event record + stream wait, as PyTorch does)."""
        _, _, record = self.api(API_EVENT_RECORD, 1_500)
        self.api(API_STREAM_WAIT, 1_500)
        self.events += 1
        self._sync_record(SYNC_STREAM_WAIT_EVENT, dst, self.events, record)
        self.stream_free[dst] = max(self.stream_free.get(dst, 0), self.stream_free.get(src, 0))

    def synchronize(self) -> None:
        """cudaStreamSynchronize on the compute stream: returns right after the device drains."""
        drained = max(self.stream_free.values(), default=0)
        start = self.host
        end = max(start, drained) + 4_000
        self.corr += 1
        self.r_start.append(start)
        self.r_end.append(end)
        self.r_corr.append(self.corr)
        self.r_name.append(API_SYNC_STREAM)
        self._sync_record(SYNC_STREAM_SYNCHRONIZE, self.compute_stream, NO_EVENT, 0)
        self.host_ranges.append((start, end, "sync"))
        self.host = end

    def host_work(self, ns: float, cause: str = "") -> None:
        """Python work that launches nothing (GC, data loading, bookkeeping)."""
        start = self.host
        self.host += int(ns)
        if cause:
            self.host_ranges.append((start, self.host, cause))
        elif self.host > start:
            self.quiet_host.append((start, self.host))

    def push(self, text: str, domain: str) -> int:
        """Open an NVTX push/pop range; returns the row index to close with `pop`. NVTX calls cost no
        host time here, so a range opened at a step boundary starts exactly at that boundary."""
        self.nvtx.append((self.host, None, NVTX_PUSHPOP, text, domain))
        return len(self.nvtx) - 1

    def pop(self, idx: int) -> None:
        start, _, etype, text, domain = self.nvtx[idx]
        self.nvtx[idx] = (start, self.host, etype, text, domain)

    def mark(self, text: str, domain: str) -> None:
        self.nvtx.append((self.host, None, NVTX_MARK, text, domain))

    def kernel_arrays(self) -> dict[str, np.ndarray]:
        """The kernel columns as int64 numpy arrays (for truth and the writer)."""
        return {
            "start": np.asarray(self.k_start, dtype=np.int64),
            "end": np.asarray(self.k_end, dtype=np.int64),
            "stream": np.asarray(self.k_stream, dtype=np.int64),
            "spec": np.asarray(self.k_spec, dtype=np.int64),
            "corr": np.asarray(self.k_corr, dtype=np.int64),
            "group": np.asarray(self.k_group, dtype=np.int64),
            "graph": np.asarray(self.k_graph, dtype=np.int64),
            "node": np.asarray(self.k_node, dtype=np.int64),
        }

    def op_arrays(self) -> dict[str, np.ndarray]:
        """Every device op (kernels, then copies, then fills) as int64 arrays: start, end, corr. The device
        is busy while any of them runs (DESIGN §3), so idle time and gap-ending ops come from these."""
        return {
            "start": np.asarray(self.k_start + self.c_start + self.f_start, dtype=np.int64),
            "end": np.asarray(self.k_end + self.c_end + self.f_end, dtype=np.int64),
            "corr": np.asarray(self.k_corr + self.c_corr + self.f_corr, dtype=np.int64),
        }
