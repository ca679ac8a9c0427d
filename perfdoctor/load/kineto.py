"""Load a PyTorch profiler (Kineto) Chrome-trace JSON into the same Timelines as an nsys export.

Megatron-LM (``--use-pytorch-profiler``), NeMo's profiling callbacks and plain ``torch.profiler`` write
one ``*.json`` (often gzipped) per rank: ``traceEvents`` plus ``deviceProperties`` and
``distributedInfo`` (rank, world size, process groups). Events map onto the Timeline tables
(``perfdoctor.model``):

- ``kernel`` → kernels (stream, correlation id, grid/block; NCCL kernels also carry their process
  group — ``Process Group Name/Description/Ranks``, ``Group size``, message sizes — kept as the
  ``pg_*`` and ``msg_bytes`` columns that ``classify.groups`` turns into ``label_source: kineto_pg``);
- ``gpu_memcpy`` / ``gpu_memset`` → memcpy / memset (copy kind from the event name, nsys' enum);
- ``cuda_runtime`` / ``cuda_driver`` → CUDA API calls (their ``correlation`` links them to kernels);
- ``cpu_op`` and ``user_annotation`` → ranges in the default NVTX domain, as nsys shows
  ``emit_nvtx`` ranges: ``ProfilerStep#N`` defines steps, ``enumerate(DataLoader)#...`` data loading;
  their ``category`` column says which of the two each was (``OP_CATEGORY``: the host time covered by
  operators, against which time outside any operator — GC, I/O, plain Python — stands out).

Traces written by ``perfdoctor capture --profiler torch`` carry a ``perfdoctor`` metadata object
(perfdoctor.capture.hook.torch_profiler): there, the ``user_annotation`` ranges named like DESIGN §4
labels (``step n=``, ``comm op= group=``, ``gc gen=``, ``data``, ``fwd``/``bwd``) are perfdoctor's
and go to the ``perfdoctor`` domain, as the NVTX ones of an nsys capture do; the ``rank`` and
``config`` marks are read from the metadata; and a capture without CUDA activity is a host-only
timeline (``device_id`` None), as a CPU-only nsys export is.

Times: Kineto writes microseconds (``ts``, ``dur``), absolute since the epoch in older versions and
relative to ``baseTimeNanoseconds`` in newer ones; both become integer nanoseconds, rounded after
subtracting a per-file base so that float precision is never lost on epoch-sized values.

Bounded memory: PyTorch writes one event per indented block (``\\n  {`` … ``\\n  },``), so the event
array is decoded in chunks of a few MB split at those boundaries (msgspec into typed structs holding
only the fields used), each chunk turned into numpy columns before the next is read. A file written
differently (compact JSON from another tool, or a layout where a cut does not decode) is decoded
whole, which needs memory of the order of the file's size a few times over.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec
import numpy as np

from perfdoctor.errors import InputError
from perfdoctor.model import GpuInfo, Timeline, TraceInfo
from perfdoctor.table import Strings, Table, distinct, repeated
from perfdoctor.width import code_type

FORMAT = "kineto-json"
GZIP_MAGIC = b"\x1f\x8b"
# Read this much decompressed JSON at a time; an event block is rarely over a few kB.
CHUNK_BYTES = 8 << 20
# One event block ends with this at the top level of the ``traceEvents`` array in files PyTorch writes
# (nested objects are indented further, and JSON strings cannot hold a raw newline).
EVENT_BOUNDARY = b"\n  },"
EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
# Above this many bytes without one event boundary the file is not PyTorch-formatted: decode it whole.
MAX_UNSPLIT_BYTES = 64 << 20

TID_BITS = 24  # the same globalTid layout as nsys exports (load.nsys): pid << 24 | tid
ID_MASK = (1 << TID_BITS) - 1
NVTX_PUSH_POP = 59  # ranges land in the NVTX table as push/pop ranges of the default domain
NVTX_MARK = 34  # the capture's rank and config marks (nsys' event type for marks)
# perfdoctor's capture labels (DESIGN §4) as record_function ranges: their domain and first words.
CAPTURE_DOMAIN = "perfdoctor"
CAPTURE_KINDS = frozenset({"step", "comm", "fwd", "bwd", "gc", "data"})
RANGE_CATEGORIES = ("cpu_op", "user_annotation")
# The NVTX ``category`` column of a Kineto range says which it was: an operator the profiler recorded
# (``cpu_op``: every launch happens inside one) or a user annotation (``record_function``, ``ProfilerStep#N``).
OP_CATEGORY, ANNOTATION_CATEGORY = 1, 0
# ROCm builds of PyTorch record HIP calls (hipLaunchKernel, hipMemcpyAsync, ...) as "hip_runtime" in recent
# versions and as "cuda_runtime" in older ones; their kernels and copies use the CUDA categories.
API_CATEGORIES = ("cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver")
# Kineto's memcpy names: "Memcpy HtoD (Pageable -> Device)"; nsys' ENUM_CUDA_MEMCPY_OPER codes.
COPY_KINDS = {"HtoD": 1, "DtoH": 2, "HtoA": 3, "AtoH": 4, "AtoA": 5, "AtoD": 6, "DtoA": 7, "DtoD": 8,
              "HtoH": 9, "PtoP": 10}
_COPY_NAME = re.compile(r"^Memcpy (\w+)")
# roctracer's names for copies: "CopyHostToDevice", "CopyDeviceToDevice", ...
ROCTRACER_COPIES = {"CopyHostToDevice": "HtoD", "CopyDeviceToHost": "DtoH", "CopyDeviceToDevice": "DtoD",
                    "CopyHostToHost": "HtoH", "CopyPeerToPeer": "PtoP"}
# NCCL's data types as Kineto spells them, in bytes (message sizes are given in elements).
DTYPE_BYTES = {"float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8, "float64": 8,
               "int": 4, "int32": 4, "int64": 8, "long": 8, "int8": 1, "char": 1, "uint8": 1, "byte": 1,
               "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}


class _TextArgs(msgspec.Struct, frozen=True):
    """The loosely typed ``args`` fields, the same in the strict and the loose decoding: names, and what
    only NCCL kernels carry (recent PyTorch), which are few."""

    name: Any = None  # metadata events: process / thread names
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    group_size: Any = msgspec.field(default=None, name="Group size")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: Any = None


class _Args(_TextArgs, frozen=True):
    """The ``args`` fields perfdoctor uses, typed so that msgspec converts them in C; every other key is
    skipped without being built. The decoders are not strict: a number written as a string (roctracer
    writes ``"bytes": "4096"``) converts. A chunk with a value that does not convert at all is decoded
    again loosely (:class:`_LooseEvent`): optional fields become "unknown", a needed one (``ts``)
    is a one-line error naming the event and the field."""

    correlation: int = -1
    stream: int = -1
    device: int = -1
    grid: tuple[int, int, int] = (-1, -1, -1)
    block: tuple[int, int, int] = (-1, -1, -1)
    nbytes: int = msgspec.field(default=-1, name="bytes")


_NO_ARGS = _Args()


class _Event(msgspec.Struct, frozen=True):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = -1
    tid: int | str = -1
    ts: float = 0.0
    dur: float = 0.0
    args: _Args = _NO_ARGS


class _Top(msgspec.Struct):
    """The file-level keys; ``traceEvents`` is empty when only the header is decoded."""

    traceEvents: list[_Event] = []  # noqa: N815 (the file's key)
    schemaVersion: Any = None  # noqa: N815
    deviceProperties: Any = None  # noqa: N815
    distributedInfo: Any = None  # noqa: N815
    baseTimeNanoseconds: Any = None  # noqa: N815
    perfdoctor: Any = None  # written by perfdoctor's capture hook (see the module docstring)


_TOP = msgspec.json.Decoder(_Top, strict=False)
_EVENTS = msgspec.json.Decoder(list[_Event], strict=False)


class _LooseArgs(_TextArgs, frozen=True):
    correlation: Any = -1
    stream: Any = -1
    device: Any = -1
    grid: Any = None
    block: Any = None
    nbytes: Any = msgspec.field(default=-1, name="bytes")


class _LooseEvent(msgspec.Struct, frozen=True):
    """An event whose fields are taken as written; :func:`_tighten` makes it an :class:`_Event`."""

    ph: Any = ""
    cat: Any = ""
    name: Any = ""
    pid: Any = -1
    tid: Any = -1
    ts: Any = 0.0
    dur: Any = 0.0
    args: Any = None


class _LooseTop(msgspec.Struct):
    traceEvents: list[_LooseEvent] = []  # noqa: N815
    schemaVersion: Any = None  # noqa: N815
    deviceProperties: Any = None  # noqa: N815
    distributedInfo: Any = None  # noqa: N815
    baseTimeNanoseconds: Any = None  # noqa: N815


_LOOSE_TOP = msgspec.json.Decoder(_LooseTop)
_LOOSE_EVENTS = msgspec.json.Decoder(list[_LooseEvent])


def _tighten(events: list[_LooseEvent], path: Path, first: int = 0) -> list[_Event]:
    """Loosely decoded events as typed ones: optional values that are not numbers become unknown (−1);
    a time that is not a number, on an event perfdoctor reads, is an error naming the event."""
    out = []
    for i, e in enumerate(events):
        cat = e.cat if isinstance(e.cat, str) else ""
        ph = e.ph if isinstance(e.ph, str) else ""
        needed = ph == "X" and cat in _KIND
        ts, dur = _number(e.ts), _number(e.dur)
        if needed and (ts is None or dur is None):
            field_name, value = ("ts", e.ts) if ts is None else ("dur", e.dur)
            raise InputError(f"{path}: event {first + i} ({cat} {str(e.name)[:60]!r}): `{field_name}` is not a "
                             f"number ({str(value)[:40]!r})")
        a = msgspec.convert(e.args, _LooseArgs, strict=False) if isinstance(e.args, dict) else _LooseArgs()
        args = _Args(correlation=_int(a.correlation, -1), stream=_int(a.stream, -1), device=_int(a.device, -1),
                     grid=_dims(a.grid), block=_dims(a.block), nbytes=_int(a.nbytes, -1), name=a.name,
                     pg_name=a.pg_name, pg_desc=a.pg_desc, group_size=_int(a.group_size, None),
                     in_nelems=_int(a.in_nelems, None), out_nelems=_int(a.out_nelems, None), dtype=a.dtype)
        pid, tid = _int(e.pid, None), _int(e.tid, None)
        out.append(_Event(ph=ph, cat=cat, name=e.name if isinstance(e.name, str) else str(e.name),
                          pid=pid if pid is not None else str(e.pid), tid=tid if tid is not None else str(e.tid),
                          ts=ts or 0.0, dur=dur or 0.0, args=args))
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _dims(value: Any) -> tuple[int, int, int]:
    """``[x, y, z]`` (numbers or numeric strings) → a tuple; anything else → unknown."""
    if isinstance(value, (list, tuple)) and len(value) == 3:
        dims = [_int(v, None) for v in value]
        if all(d is not None for d in dims):
            return (dims[0], dims[1], dims[2])
    return (-1, -1, -1)


def sniff(head: bytes) -> bool:
    """True when the first bytes of a (decompressed) file look like a Chrome trace with ``traceEvents``."""
    text = head.lstrip()
    return text.startswith(b"{") and (b'"traceEvents"' in text or b'"schemaVersion"' in text
                                      or b'"deviceProperties"' in text)


def is_kineto(path: Path) -> bool:
    """Whether ``path`` is a Kineto trace (plain or gzipped JSON), judged from its first kilobytes."""
    try:
        with path.open("rb") as f:
            head = f.read(4096)
        if head.startswith(GZIP_MAGIC):
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 4096)
    except (OSError, zlib.error):
        return False
    return sniff(head)


# --------------------------------------------------------------------------------------------
# Streaming decode


def _open(path: Path) -> IO[bytes]:
    with path.open("rb") as f:
        gz = f.read(2) == GZIP_MAGIC
    return gzip.open(path, "rb") if gz else path.open("rb")


def _read(stream: IO[bytes], path: Path) -> bytes:
    try:
        return stream.read(CHUNK_BYTES)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise InputError(f"{path}: truncated or corrupt gzip stream ({exc})") from None


def _decode(data: bytes, path: Path, first: int = 0) -> _Top:
    """A whole ``{"traceEvents": [...], ...}`` document; a value of an unexpected type is decoded again
    loosely (see :class:`_Args`). ``first``: the index of its first event in the file (for errors)."""
    try:
        return _TOP.decode(data)
    except msgspec.ValidationError:
        pass
    except msgspec.DecodeError as exc:
        raise InputError(f"{path}: invalid or truncated JSON ({exc})") from None
    try:
        loose = _LOOSE_TOP.decode(data)
    except msgspec.ValidationError as exc:
        raise InputError(f"{path}: not a PyTorch profiler (Kineto) trace: {exc}") from None
    return _Top(traceEvents=_tighten(loose.traceEvents, path, first), schemaVersion=loose.schemaVersion,
                deviceProperties=loose.deviceProperties, distributedInfo=loose.distributedInfo,
                baseTimeNanoseconds=loose.baseTimeNanoseconds)


def _decode_events(view: memoryview, path: Path, first: int) -> list[_Event]:
    """One chunk of the event array; typed decoding first, loose decoding where a value's type differs."""
    try:
        return _EVENTS.decode(view)
    except msgspec.ValidationError:
        return _tighten(_LOOSE_EVENTS.decode(view), path, first)


class _NotSplittable(Exception):
    """A chunk cut at an apparent event boundary did not decode: the file is not in PyTorch's layout."""


def _stream(path: Path) -> Iterator[_Top | list[_Event]]:
    """Yield the file's header (a ``_Top`` without events), then lists of events, then a last ``_Top``
    with the final events and the keys written after the array. Raises ``_NotSplittable`` when a cut
    at an apparent event boundary does not decode (the caller then decodes the file whole)."""
    with _open(path) as stream:
        buf = b""
        while (match := EVENTS_KEY.search(buf)) is None:
            block = _read(stream, path)
            if not block:
                if buf.lstrip().startswith(b"{"):
                    raise InputError(f"{path}: JSON without `traceEvents`: not a PyTorch profiler (Kineto) trace")
                raise InputError(f"{path}: not a PyTorch profiler (Kineto) trace (no JSON object)")
            buf += block
            if len(buf) > MAX_UNSPLIT_BYTES:
                raise InputError(f"{path}: no `traceEvents` in the first {MAX_UNSPLIT_BYTES >> 20} MB: "
                                 "not a PyTorch profiler (Kineto) trace")
        try:
            yield _TOP.decode(buf[:match.start()] + b'"traceEvents": []}')
        except msgspec.MsgspecError:
            raise _NotSplittable from None
        seen = 0
        # The buffer always starts with "[": at a cut, the boundary's comma becomes "]" and msgspec decodes
        # the buffer up to it in place, without copying the chunk.
        buf = bytearray(b"[") + buf[match.end():]
        while True:
            block = _read(stream, path)
            buf += block
            cut = buf.rfind(EVENT_BOUNDARY)
            if cut >= 0 and block:
                comma = cut + len(EVENT_BOUNDARY) - 1
                buf[comma] = ord("]")
                try:
                    with memoryview(buf) as view:
                        events = _decode_events(view[:comma + 1], path, seen)
                except msgspec.MsgspecError:
                    raise _NotSplittable from None
                seen += len(events)
                yield events
                buf = bytearray(b"[") + buf[comma + 1:]
            elif not block:
                yield _decode(b'{"traceEvents": ' + bytes(buf), path, seen)
                return


def _whole(path: Path) -> _Top:
    """The file decoded in one piece (JSON written by another tool, in another layout)."""
    with _open(path) as stream:
        chunks = []
        while block := _read(stream, path):
            chunks.append(block)
    return _decode(b"".join(chunks), path)


# --------------------------------------------------------------------------------------------
# Events → columns


@dataclass
class _Columns:
    """Per table, lists of numpy chunks (one per decoded chunk of events), concatenated at the end."""

    chunks: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def add(self, name: str, values: list[Any], dtype: Any) -> None:
        self.chunks.setdefault(name, []).append(np.asarray(values, dtype=dtype))

    def get(self, name: str, dtype: Any) -> np.ndarray:
        parts = self.chunks.get(name)
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


@dataclass
class _Collector:
    """What the events of one file say, accumulated chunk by chunk as numpy columns."""

    path: Path
    base_us: float | None = None
    names: dict[str, int] = field(default_factory=dict)  # every string once: name → code
    cols: _Columns = field(default_factory=_Columns)
    process_names: dict[int, str] = field(default_factory=dict)
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    pg: bool = False

    def codes(self, texts: list[str]) -> list[int]:
        names = self.names
        out = []
        for text in texts:
            code = names.get(text)
            if code is None:
                code = names[text] = len(names)
            out.append(code)
        return out

    def optional_codes(self, texts: list[Any]) -> list[int]:
        """Codes of values that may be missing (−1) or not strings (their text)."""
        return [-1 if t is None else c for t, c in zip(texts, self.codes([str(t) for t in texts]))]

    def times(self, prefix: str, events: list[_Event]) -> None:
        ts = np.fromiter((e.ts for e in events), dtype=np.float64, count=len(events))
        if self.base_us is None and ts.size:
            self.base_us = float(np.floor(ts.min()))
        self.cols.add(f"{prefix}.ts", ts, np.float64)
        self.cols.add(f"{prefix}.dur", np.fromiter((e.dur for e in events), dtype=np.float64, count=len(events)),
                      np.float64)

    def add(self, events: list[_Event]) -> None:
        by_kind: dict[str, list[_Event]] = {}
        for e in events:
            if e.ph == "X":
                kind = _KIND.get(e.cat)
                if kind:
                    by_kind.setdefault(kind, []).append(e)
            elif e.ph == "M" and isinstance(e.args.name, str) and isinstance(e.pid, int):
                if e.name == "process_name":
                    self.process_names[e.pid] = e.args.name
                elif e.name == "thread_name" and isinstance(e.tid, int):
                    self.thread_names[(e.pid, e.tid)] = e.args.name.strip()
        for kind, rows in by_kind.items():
            getattr(self, f"_{kind}")(rows)

    def _device_common(self, prefix: str, rows: list[_Event]) -> list[_Args]:
        args = [e.args for e in rows]
        n = len(rows)
        self.times(prefix, rows)
        self.cols.add(f"{prefix}.stream", np.fromiter((a.stream for a in args), np.int64, n), np.int64)
        device = np.fromiter((a.device for a in args), np.int64, n)
        if (device < 0).any():  # older traces: the GPU is the event's pid
            device = np.where(device >= 0, device, [e.pid if isinstance(e.pid, int) else -1 for e in rows])
        self.cols.add(f"{prefix}.device", device, np.int64)
        self.cols.add(f"{prefix}.corr", np.fromiter((a.correlation for a in args), np.int64, n), np.int64)
        return args

    def _kernel(self, rows: list[_Event]) -> None:
        args = self._device_common("kernel", rows)
        self.cols.add("kernel.name", self.codes([e.name for e in rows]), np.int64)
        self.cols.add("kernel.grid", np.array([a.grid for a in args], dtype=np.int64).reshape(-1, 3), np.int64)
        self.cols.add("kernel.block", np.array([a.block for a in args], dtype=np.int64).reshape(-1, 3), np.int64)
        named = [i for i, a in enumerate(args) if a.pg_name is not None or a.pg_desc is not None]
        pg_name, pg_desc = np.full(len(rows), -1, np.int64), np.full(len(rows), -1, np.int64)
        size, nbytes = np.full(len(rows), -1, np.int64), np.full(len(rows), -1, np.int64)
        if named:
            self.pg = True
            picked = [args[i] for i in named]
            pg_name[named] = self.optional_codes([a.pg_name for a in picked])
            pg_desc[named] = self.optional_codes([a.pg_desc for a in picked])
            size[named] = [a.group_size if type(a.group_size) is int else -1 for a in picked]
            nbytes[named] = _message_bytes(picked)
        for name, column in (("pg_name", pg_name), ("pg_desc", pg_desc), ("pg_size", size), ("msg_bytes", nbytes)):
            self.cols.add(f"kernel.{name}", column, np.int64)

    def _memcpy(self, rows: list[_Event]) -> None:
        args = self._device_common("memcpy", rows)
        self.cols.add("memcpy.bytes", np.fromiter((a.nbytes for a in args), np.int64, len(args)), np.int64)
        self.cols.add("memcpy.kind", [_copy_kind(e.name) for e in rows], np.int64)

    def _memset(self, rows: list[_Event]) -> None:
        args = self._device_common("memset", rows)
        self.cols.add("memset.bytes", np.fromiter((a.nbytes for a in args), np.int64, len(args)), np.int64)

    def _host(self, prefix: str, rows: list[_Event]) -> None:
        self.times(prefix, rows)
        self.cols.add(f"{prefix}.pid", [e.pid if isinstance(e.pid, int) else -1 for e in rows], np.int64)
        self.cols.add(f"{prefix}.tid", [e.tid if isinstance(e.tid, int) else 0 for e in rows], np.int64)
        self.cols.add(f"{prefix}.name", self.codes([e.name for e in rows]), np.int64)

    def _api(self, rows: list[_Event]) -> None:
        self._host("api", rows)
        self.cols.add("api.corr", np.fromiter((e.args.correlation for e in rows), np.int64, len(rows)), np.int64)
        self.cols.add("api.driver", [e.cat in ("cuda_driver", "hip_driver") for e in rows], np.int64)

    def _range(self, rows: list[_Event]) -> None:
        self._host("range", rows)
        self.cols.add("range.op", [e.cat == "cpu_op" for e in rows], np.int64)
        self.cols.add("range.annotation", [e.cat == "user_annotation" for e in rows], bool)


_KIND = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset",
         **dict.fromkeys(API_CATEGORIES, "api"), **dict.fromkeys(RANGE_CATEGORIES, "range")}


def _int(value: Any, default: int | None = None) -> int | None:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return default


def _message_bytes(args: list[_Args]) -> np.ndarray:
    """Bytes each collective moves per rank (the larger of its in/out messages), −1 where not recorded."""
    nelems = np.maximum([a.in_nelems if type(a.in_nelems) is int else -1 for a in args],
                        [a.out_nelems if type(a.out_nelems) is int else -1 for a in args])
    width = np.array([DTYPE_BYTES.get(str(a.dtype).lower(), -1) for a in args])
    return np.where((nelems >= 0) & (width > 0), nelems * width, -1)


def _copy_kind(name: Any) -> int:
    match = _COPY_NAME.match(name) if isinstance(name, str) else None
    if match is None:
        return COPY_KINDS.get(ROCTRACER_COPIES.get(name, ""), 0) if isinstance(name, str) else 0
    return COPY_KINDS.get(match.group(1), 0)


# --------------------------------------------------------------------------------------------
# Columns → Timelines


def load_kineto(path: str | Path) -> tuple[TraceInfo, list[Timeline]]:
    """Read one Kineto trace (``.json`` or ``.json.gz``). Raises :class:`InputError` for anything else."""
    path = Path(path)
    collector = _Collector(path)
    tops: list[_Top] = []
    try:
        for part in _stream(path):
            if isinstance(part, _Top):
                collector.add(part.traceEvents)
                tops.append(part)
            else:
                collector.add(part)
            del part
    except _NotSplittable:
        collector = _Collector(path)
        tops = [_whole(path)]
        collector.add(tops[0].traceEvents)
    return _build(collector, _merge_top(*tops))


def _merge_top(*tops: _Top) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for top in tops:
        for key in ("schemaVersion", "deviceProperties", "distributedInfo", "baseTimeNanoseconds", "perfdoctor"):
            value = getattr(top, key)
            if value is not None:
                meta[key] = value
    return meta


def _build(c: _Collector, meta: dict[str, Any]) -> tuple[TraceInfo, list[Timeline]]:
    path = c.path
    n_kernels = len(c.cols.get("kernel.ts", np.float64))
    n_copies = len(c.cols.get("memcpy.ts", np.float64)) + len(c.cols.get("memset.ts", np.float64))
    captured = meta.get("perfdoctor") if isinstance(meta.get("perfdoctor"), dict) else None
    if not n_kernels and not n_copies and captured is None:
        raise InputError(f"{path}: PyTorch profiler trace without GPU events (no kernels, copies or fills): "
                         "profile with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]")
    dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    base_ns = _int(meta.get("baseTimeNanoseconds"))
    base_us = c.base_us or 0.0
    if base_ns is not None:
        session = base_ns
    elif base_us > 1e15:  # microseconds since the epoch (older Kineto): timestamps are already UTC
        session = 0
    else:
        session = None
    strings = np.array(list(c.names), dtype=object)

    def ns(prefix: str) -> tuple[np.ndarray, np.ndarray]:
        ts = c.cols.get(f"{prefix}.ts", np.float64)
        dur = c.cols.get(f"{prefix}.dur", np.float64)
        start = np.rint((ts - base_us) * 1000.0).astype(np.int64) + int(base_us) * 1000
        return start, start + np.rint(dur * 1000.0).astype(np.int64)

    pids, counts = np.unique(np.concatenate([c.cols.get("api.pid", np.int64), c.cols.get("range.pid", np.int64)]),
                             return_counts=True)
    real = pids >= 0
    pids, counts = pids[real], counts[real]
    host_pid = int(pids[np.argmax(counts)]) if pids.size else 0  # the process that launched the most
    gpid = (host_pid & ID_MASK) << TID_BITS
    # The profiler records no Python garbage collection: device idle time it causes is host time outside ops
    # (perfdoctor's capture hook records it as ``gc`` ranges).
    warnings: list[str] = [] if captured is not None else [
        "PyTorch profiler traces do not record Python garbage collection: device idle time caused by GC pauses "
        "is counted as host time outside profiled ops (host.outside_ops_ms)"]
    if not n_kernels and not n_copies:
        warnings.append("no CUDA data in this trace: the PyTorch profiler recorded CPU activity only (no CUDA "
                        "device in the captured process); only ranges and CPU ops can be summarised")
    if pids.size > 1:
        warnings.append(f"events of {pids.size} host processes; CUDA calls and ranges of pid {host_pid} are used")

    def host_table(prefix: str) -> tuple[Table, np.ndarray]:
        start, end = ns(prefix)
        pid = c.cols.get(f"{prefix}.pid", np.int64)
        mine = pid == host_pid
        tid = gpid | (c.cols.get(f"{prefix}.tid", np.int64) & ID_MASK)
        return Table({"start": start[mine], "end": end[mine], "tid": tid[mine]}), mine

    api, mine = host_table("api")
    api["correlation_id"] = c.cols.get("api.corr", np.int64)[mine]
    api["name"] = _categorical(c.cols.get("api.name", np.int64)[mine], strings)
    api["event_class"] = c.cols.get("api.driver", np.int64)[mine]
    api = api.sorted_by("start")

    ranges, mine = host_table("range")
    text = np.asarray(strings[c.cols.get("range.name", np.int64)[mine]], dtype=object)
    domain = np.full(len(ranges), None, dtype=object)
    op = c.cols.get("range.op", np.int64)[mine] > 0
    if captured is not None:
        ours = c.cols.get("range.annotation", bool)[mine] & _is_label(text)
        domain[ours] = CAPTURE_DOMAIN
        ranges, text, domain = _with_marks(ranges, text, domain, captured)
        op = np.concatenate([op, np.zeros(len(ranges) - len(op), dtype=bool)])  # the marks are annotations
    n = len(ranges)
    nvtx = Table({
        "start": ranges["start"], "end": ranges["end"],
        "event_type": np.where(ranges["end"] < 0, NVTX_MARK, NVTX_PUSH_POP).astype(np.int64),
        "tid": ranges["tid"], "end_tid": np.full(n, -1, dtype=np.int64), "domain": domain, "text": text,
        "range_id": np.full(n, -1, dtype=np.int64),
        "category": np.where(op, OP_CATEGORY, ANNOTATION_CATEGORY),
        "int_value": np.full(n, -1, dtype=np.int64), "double_value": np.full(n, np.nan),
    }).sorted_by("start")

    kernels = _kernels(c, ns, strings, gpid)
    memcpy = _device_frame(c, "memcpy", ns, gpid, {"bytes": "memcpy.bytes", "copy_kind": "memcpy.kind"})
    memset = _device_frame(c, "memset", ns, gpid, {"bytes": "memset.bytes"})
    sync = Table.empty(("start", "end", "stream", "correlation_id", "sync_type"))

    gpus = _gpus(meta.get("deviceProperties"))
    info = TraceInfo(
        path=path, format=FORMAT, product_version=None,
        schema_version=str(meta["schemaVersion"]) if meta.get("schemaVersion") is not None else None,
        meta_table="", session_start_utc_ns=session, has_cuda=True, gpus=gpus,
        counts={"kernels": len(kernels), "memcpy": len(memcpy), "memset": len(memset), "sync": 0,
                "cuda_api": len(api), "nvtx": len(nvtx), "osrt": 0},
        warnings=warnings,
    )
    rank, world = _int(dist.get("rank")), _int(dist.get("world_size"))
    info.config = _config_from_groups(dist.get("pg_config"))
    groups = captured.get("groups") if captured is not None else None
    if isinstance(groups, dict):
        info.capture_groups = {str(k): v for k, v in groups.items() if isinstance(v, str)}
    thread_names = {gpid | (tid & ID_MASK): name for (pid, tid), name in c.thread_names.items() if pid == host_pid}
    devices = sorted(set(distinct(kernels["device_id"]).tolist()) | set(distinct(memcpy["device_id"]).tolist())
                     | set(distinct(memset["device_id"]).tolist()))
    timelines = []
    for dev in devices:
        timelines.append(Timeline(
            trace=info, pid=host_pid, global_pid=gpid, device_id=int(dev),
            kernels=_on(kernels, dev), memcpy=_on(memcpy, dev), memset=_on(memset, dev), sync=sync,
            api=api, nvtx=nvtx, thread_names=thread_names, process_name=c.process_names.get(host_pid),
        ))
    if not devices:  # a CPU-only capture: the process's host activity, as for a CPU-only nsys export
        timelines.append(Timeline(
            trace=info, pid=host_pid, global_pid=gpid, device_id=None, kernels=kernels, memcpy=memcpy,
            memset=memset, sync=sync, api=api, nvtx=nvtx, thread_names=thread_names,
            process_name=c.process_names.get(host_pid)))
        info.has_cuda = False
    if rank is not None and len(devices) > 1:
        warnings.append(f"rank {rank} drove {len(devices)} GPUs: ranks are given in file order")
    info.rank, info.world_size = rank, world
    return info, timelines


def _is_label(text: np.ndarray) -> np.ndarray:
    """Which range names are §4 labels (``step n=3``, ``data``); each distinct name judged once."""
    names, inverse = np.unique(text.astype(str), return_inverse=True) if text.size else (text, text)
    kinds = np.array([t.partition(" ")[0] in CAPTURE_KINDS and (t == "data" or "=" in t) for t in names], dtype=bool)
    return kinds[inverse.reshape(-1)] if text.size else np.zeros(0, dtype=bool)


def _with_marks(ranges: Table, text: np.ndarray, domain: np.ndarray,
                captured: dict[str, Any]) -> tuple[Table, np.ndarray, np.ndarray]:
    """The capture's ``rank`` and ``config`` marks (from the trace's metadata) as mark rows (end −1) at
    the start of its first label, so that ``load.labels.rank_mark``/``config_mark`` read them as they
    read the NVTX marks of an nsys capture."""
    rank = captured.get("rank") if isinstance(captured.get("rank"), dict) else {}
    config = captured.get("config") if isinstance(captured.get("config"), dict) else {}
    marks = []
    if rank and all(_int(v) is not None for v in rank.values()):
        marks.append("rank " + " ".join(f"{k}={_int(v)}" for k, v in rank.items()))
    marks.append("config " + json.dumps(config, separators=(",", ":"), sort_keys=True))
    ours = np.flatnonzero(domain == CAPTURE_DOMAIN)
    at = int(ranges["start"][ours].min()) if ours.size else (int(ranges["start"].min()) if len(ranges) else 0)
    tid = int(ranges["tid"][ours[0]]) if ours.size else (int(ranges["tid"][0]) if len(ranges) else 0)
    k = len(marks)
    rows = Table({"start": np.full(k, at, dtype=np.int64), "end": np.full(k, -1, dtype=np.int64),
                  "tid": np.full(k, tid, dtype=np.int64)})
    both = Table({col: np.concatenate([ranges[col], rows[col]]) for col in ("start", "end", "tid")})
    return (both, np.concatenate([text, np.array(marks, dtype=object)]),
            np.concatenate([domain, np.full(k, CAPTURE_DOMAIN, dtype=object)]))


def _on(frame: Table, device: int) -> Table:
    """The rows on one device; their device column is then that one value, held once (as ``global_pid``)."""
    keep = frame["device_id"] == device
    rows = frame if keep.all() else frame.take(keep)
    if not len(rows):
        return rows
    return Table({c: repeated(rows[c], len(rows)) if c == "device_id" else rows[c] for c in rows.columns},
                 rows=len(rows))


def _categorical(codes: np.ndarray, strings: np.ndarray, clean: Any = None) -> Strings:
    """Codes into the file's string list → dictionary-encoded text over the distinct names used."""
    used, inverse = np.unique(codes, return_inverse=True)
    values = np.array([clean(s) if clean else s for s in strings[used]], dtype=object) if used.size else \
        np.zeros(0, dtype=object)
    cats, remap = np.unique(values, return_inverse=True) if values.size else (values, np.zeros(0, dtype=np.int64))
    kind = code_type(cats.size)
    return Strings(remap[inverse.reshape(-1)].astype(kind) if used.size else np.zeros(0, dtype=kind), cats)


def _kernels(c: _Collector, ns: Any, strings: np.ndarray, gpid: int) -> Table:
    from perfdoctor.classify.kernels import short_kernel_name

    start, end = ns("kernel")
    names = c.cols.get("kernel.name", np.int64)
    dims = {kind: c.cols.get(f"kernel.{kind}", np.int64).reshape(-1, 3) for kind in ("grid", "block")}
    frame = Table({
        "start": start, "end": end, "stream": c.cols.get("kernel.stream", np.int64),
        "correlation_id": c.cols.get("kernel.corr", np.int64),
        "launch_type": repeated(np.zeros(1, dtype=np.int8), start.size),  # Kineto records no cooperative launch
        **{f"{kind}_{axis}": dims[kind][:, i] for kind in ("grid", "block") for i, axis in enumerate("xyz")},
        "short_name": _categorical(names, strings, short_kernel_name),
        "demangled_name": _categorical(names, strings),
        "device_id": c.cols.get("kernel.device", np.int64),
        "global_pid": repeated(np.array([gpid], dtype=np.int64), start.size),
    })
    if c.pg:
        pg_name, pg_desc = c.cols.get("kernel.pg_name", np.int64), c.cols.get("kernel.pg_desc", np.int64)
        text = np.append(strings, None)  # code −1 → None
        frame["pg_name"] = np.asarray(text[pg_name], dtype=object)
        frame["pg_desc"] = np.asarray(text[pg_desc], dtype=object)
        frame["pg_size"] = c.cols.get("kernel.pg_size", np.int64)
        frame["msg_bytes"] = c.cols.get("kernel.msg_bytes", np.int64)
    return frame.sorted_by("start")


def _device_frame(c: _Collector, prefix: str, ns: Any, gpid: int, extra: dict[str, str]) -> Table:
    start, end = ns(prefix)
    frame = Table({"start": start, "end": end, "stream": c.cols.get(f"{prefix}.stream", np.int64),
                          "correlation_id": c.cols.get(f"{prefix}.corr", np.int64),
                          **{k: c.cols.get(v, np.int64) for k, v in extra.items()},
                          "device_id": c.cols.get(f"{prefix}.device", np.int64),
                          "global_pid": repeated(np.array([gpid], dtype=np.int64), start.size)})
    return frame.sorted_by("start")


def _gpus(props: Any) -> dict[int, GpuInfo]:
    gpus: dict[int, GpuInfo] = {}
    for p in props if isinstance(props, list) else []:
        if not isinstance(p, dict) or _int(p.get("id")) is None:
            continue
        major, minor = _int(p.get("computeMajor")), _int(p.get("computeMinor"))
        gpus[_int(p["id"])] = GpuInfo(
            device_id=_int(p["id"]), name=p.get("name") if isinstance(p.get("name"), str) else None,
            sm_count=_int(p.get("numSms")), total_memory=_int(p.get("totalGlobalMem")),
            compute_capability=f"{major}.{minor}" if major is not None and minor is not None else None)
    return gpus


def _config_from_groups(pg_config: Any) -> dict[str, int]:
    """Parallel sizes that Megatron's named process groups state (``distributedInfo.pg_config``):
    ``TENSOR_MODEL_PARALLEL_GROUP`` of size 4 → ``tp: 4``. Unnamed groups say nothing."""
    from perfdoctor.capture.hook.groups import from_description

    sizes: dict[str, int] = {}
    for pg in pg_config if isinstance(pg_config, list) else []:
        if not isinstance(pg, dict):
            continue
        group, size = from_description(pg.get("pg_desc")), _int(pg.get("pg_size"))
        if group in ("tp", "cp", "dp", "pp", "ep") and size and size > 0:
            sizes.setdefault(group, size)
    return sizes

