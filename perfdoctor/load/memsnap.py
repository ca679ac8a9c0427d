"""Read a PyTorch CUDA memory snapshot (``torch.cuda.memory._dump_snapshot``) without running it.

Snapshots are pickles, and unpickling can call any importable function (``os.system`` through
``__reduce__``). A real snapshot holds only dicts, lists, tuples, strings, numbers, booleans and
``None`` (``THCPModule_memorySnapshot`` builds it from C++ with pybind11; Megatron-LM, Megatron-Bridge
and NeMo dump the same dict), and none of those needs a global. So :class:`_PlainDataUnpickler`
refuses every global and every persistent id: a pickle that names one is reported by that name and
never loaded. The plain data is then validated and copied into the small typed records below (the
history as columns, stacks interned), so measurements never see raw pickle content.

**Bounded.** The C unpickler is as fast as reading gets, but it cannot be interrupted (a hash bomb of
a few hundred bytes hashes shared nested tuples for hours; a 9-byte pickle asks for a 2³²-entry memo).
So unpickling and validation run in a child process (:mod:`perfdoctor.load.bounded`) with a memory
and CPU budget proportional to the file's size (:func:`budget_for`); only the compact result comes back.
Container sizes, stack depth and string lengths are capped while validating (``MAX_*``).

Accepted shapes (research/megatron.md §2.3): the snapshot dict (``segments``, ``device_traces``,
optionally ``allocator_settings``, ``external_annotations``), the older bare list of segments
(``torch.cuda.memory_snapshot()``), old blocks that carry ``history`` instead of ``frames``, and
snapshots converted from the profiler (``torch.cuda._memory_viz._profile_to_snapshot``), whose blocks
have no address (it follows from the segment address and the sizes of the blocks before it).
"""

from __future__ import annotations

import operator
import pickle
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from itertools import count, repeat
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from perfdoctor.errors import InputError
from perfdoctor.load.bounded import Budget, run_bounded

# Limits that keep a hostile or broken file from taking the machine down. A Megatron snapshot with the
# default 100k-entry history and Python stacks is a few hundred MB.
MAX_FILE_BYTES = 4 << 30
MAX_SEGMENTS = 1_000_000
MAX_BLOCKS = 20_000_000
MAX_TRACE_ENTRIES = 20_000_000  # over all devices
MAX_FRAMES = 256  # per stack; deeper stacks are cut (the allocation site is near the top)
MAX_STRING = 4096  # characters kept of one file name or function name

BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")
TRACE_ACTIONS = ("alloc", "free_requested", "free_completed", "free", "segment_alloc", "segment_free",
                 "segment_map", "segment_unmap", "snapshot", "oom", "annotate")
_ACTION_CODE = {a: i for i, a in enumerate(TRACE_ACTIONS)}

# A snapshot whose history ended this long before the trace's session began, or began this long after
# the trace's last event, is from another run (outside_session).
SESSION_SKEW_S = 300
SESSION_AFTER_S = 7 * 86400

# Budget of one load (budget_for): memory beyond what the process maps, CPU seconds.
BUDGET_BASE_BYTES = 512 << 20
BUDGET_BYTES_PER_BYTE = 32
BUDGET_BASE_S = 5.0
BUDGET_S_PER_MB = 0.25


class Frame(NamedTuple):
    """One stack frame: innermost first in every ``frames`` tuple (as PyTorch records them)."""

    filename: str
    line: int
    name: str


@dataclass(slots=True)
class Block:
    """A piece of a segment: allocated (``active_allocated``), freed but still in use by a stream
    (``active_pending_free``) or cached free memory (``inactive``). ``frames`` is the stack of the
    allocation that owns it, when history was recorded."""

    address: int
    size: int
    requested_size: int
    state: str
    frames: tuple[Frame, ...] = ()


@dataclass(slots=True)
class Segment:
    """One cudaMalloc (or one expandable segment's mapped range) held by the caching allocator."""

    device: int
    address: int
    total_size: int
    stream: int
    segment_type: str | None
    pool_id: tuple[int, ...] | None
    is_expandable: bool
    blocks: list[Block]


class TraceEntry(NamedTuple):
    """One allocator event of the recorded history (a row of :class:`Trace`).

    ``addr`` is the block address (``device_free`` bytes for ``oom``: what the device had left).
    ``time_us`` exists from PyTorch 2.1 on.
    """

    action: str
    addr: int
    size: int
    stream: int
    time_us: int | None
    frames: tuple[Frame, ...] = ()


@dataclass(eq=False)
class Trace:
    """One device's history, oldest first, as columns.

    A Megatron history holds 100k+ events; one Python object per event would cost more than the
    pickle itself, and the measurements are array operations anyway. Stacks are interned: ``stack``
    indexes ``stacks`` (0 is the empty stack), so a call site seen in a million events is stored once.
    Indexing and iteration give :class:`TraceEntry` rows, for code that wants one event at a time.
    """

    action: np.ndarray  # int8 index into TRACE_ACTIONS
    addr: np.ndarray  # uint64
    size: np.ndarray  # int64, never negative
    stream: np.ndarray  # int64
    time_us: np.ndarray | None  # int64; None unless every event has a time
    stack: np.ndarray  # int32 index into stacks
    stacks: list[tuple[Frame, ...]]

    def __len__(self) -> int:
        return len(self.action)

    def __getitem__(self, i: int) -> TraceEntry:
        return TraceEntry(TRACE_ACTIONS[self.action[i]], int(self.addr[i]), int(self.size[i]), int(self.stream[i]),
                          int(self.time_us[i]) if self.time_us is not None else None,
                          self.stacks[self.stack[i]])

    def __iter__(self) -> Iterator[TraceEntry]:
        return (self[i] for i in range(len(self)))

    def mask(self, *actions: str) -> np.ndarray:
        """Boolean column: which events are one of ``actions``."""
        return np.isin(self.action, [TRACE_ACTIONS.index(a) for a in actions])

    def count(self, *actions: str) -> int:
        return int(np.count_nonzero(self.mask(*actions)))


def empty_trace() -> Trace:
    """A history with no events (a device that has segments but recorded nothing)."""
    ints = np.zeros(0, dtype=np.int64)
    return Trace(np.zeros(0, dtype=np.int8), ints.astype(np.uint64), ints, ints, None,
                 np.zeros(0, dtype=np.int32), [()])


@dataclass
class MemorySnapshot:
    """A validated snapshot: the allocator state at dump time plus the history that led to it."""

    path: Path
    segments: list[Segment]
    device_traces: dict[int, Trace]
    allocator_settings: dict[str, str | int | float | bool | None] = field(default_factory=dict)
    has_history: bool = True  # False for the old bare list of segments
    rank: int | None = None  # from the file name, when the loader could tell
    warnings: list[str] = field(default_factory=list)

    @property
    def devices(self) -> list[int]:
        """Devices with any segment or history, ascending."""
        seen = {s.device for s in self.segments} | {d for d, t in self.device_traces.items() if len(t)}
        return sorted(seen)


class _Forbidden(Exception):
    """A pickle opcode asked for a global or a persistent object."""


class _PlainDataUnpickler(pickle.Unpickler):
    """Unpickler that builds only built-in containers and scalars: no global is ever imported.

    ``find_class`` is also what the C unpickler calls for the copyreg extension opcodes, so refusing
    here closes GLOBAL, STACK_GLOBAL, INST, OBJ and EXT*. REDUCE, NEWOBJ and BUILD then have no
    callable or class to work on.
    """

    def find_class(self, module: str, name: str) -> Any:
        raise _Forbidden(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise _Forbidden("a persistent object id")


def budget_for(size: int) -> Budget:
    """The memory and CPU a snapshot file of ``size`` bytes may take to read.

    Loaded snapshots take up to ~15× their pickle in Python objects (a frame dict of ~230 bytes is
    ~20 bytes of pickle when its strings are memoised); the budget allows twice that. The CPU budget
    allows ~4 MB/s, a quarter of what the C unpickler reaches on a busy 2-core machine.
    """
    return Budget(memory_bytes=BUDGET_BASE_BYTES + BUDGET_BYTES_PER_BYTE * size,
                  cpu_s=BUDGET_BASE_S + BUDGET_S_PER_MB * size / (1 << 20))


def load_snapshot(path: str | Path) -> MemorySnapshot:
    """Read and validate one snapshot file. Raises :class:`InputError` (one line) for anything else.

    The reading runs in a child process under :func:`budget_for` (see :mod:`perfdoctor.load.bounded`):
    a pickle bomb ends as a one-line error, never as a hang or an exhausted machine.
    """
    path = Path(path)
    size = _check_file(path)
    return run_bounded(lambda: _validate(_unpickle(path), path), budget_for(size), str(path), _RESULT_TYPES)


def _check_file(path: Path) -> int:
    try:
        if not path.is_file():
            raise InputError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
        size = path.stat().st_size
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if size > MAX_FILE_BYTES:
        raise InputError(f"{path}: {size:,} bytes, more than the {MAX_FILE_BYTES:,} a memory snapshot may have")
    if size == 0:
        raise InputError(f"{path}: empty file, not a memory snapshot")
    return size


def _unpickle(path: Path) -> Any:
    try:
        with path.open("rb") as fh:
            if fh.read(2) == b"\x1f\x8b":
                raise InputError(f"{path}: gzip-compressed; decompress it first (gunzip)")
            fh.seek(0)
            # From the file, not a copy of it in memory (a tenth of the peak for a real snapshot). A
            # FRAME or BINBYTES8 length of a terabyte becomes a read() of that size: the reader's
            # memory budget turns it into a one-line error.
            return _PlainDataUnpickler(fh).load()
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except _Forbidden as exc:
        raise InputError(f"{path}: refusing to load: the pickle asks for {exc} (a memory snapshot holds only "
                         "plain data; nothing in it was run)") from None
    except EOFError:
        raise InputError(f"{path}: truncated pickle (the file ends before the snapshot does)") from None
    except RecursionError:
        raise InputError(f"{path}: pickle nests too deeply to be a memory snapshot") from None
    except MemoryError:
        raise
    except Exception as exc:  # UnpicklingError, ValueError, struct.error... all mean a broken pickle
        text = str(exc)
        if "truncated" in text:
            raise InputError(f"{path}: truncated pickle (the file ends before the snapshot does)") from None
        raise InputError(f"{path}: not a PyTorch memory snapshot (not a readable pickle: "
                         f"{text.splitlines()[0][:200] if text else type(exc).__name__})") from None


# --------------------------------------------------------------------------------------------
# Validation: raw pickle data → typed records


class _Shape(Exception):
    """The data is a pickle but not a snapshot; the message names where."""


def _validate(raw: Any, path: Path) -> MemorySnapshot:
    try:
        return _build(raw, path)
    except _Shape as exc:
        raise InputError(f"{path}: not a PyTorch memory snapshot: {exc}") from None


def _build(raw: Any, path: Path) -> MemorySnapshot:
    stacks = _StackTable()
    if type(raw) is list:
        segments = _segments(raw, "segments", stacks)
        snap = MemorySnapshot(path=path, segments=segments, device_traces={}, has_history=False)
        snap.warnings.append(f"{path.name}: a bare list of segments (no allocation history): "
                             "dump-time state only")
        return snap
    if type(raw) is not dict:
        raise _Shape(f"expected a dict with 'segments' and 'device_traces', found {_kind(raw)}")
    if "segments" not in raw:
        keys = ", ".join(sorted(_short(k) for k in list(raw)[:8]))
        raise _Shape(f"no 'segments' key (keys: {keys or 'none'})")
    segments = _segments(raw["segments"], "segments", stacks)
    traces_raw = raw.get("device_traces", [])
    if type(traces_raw) is not list:
        raise _Shape(f"device_traces: expected a list (one per device), found {_kind(traces_raw)}")
    device_traces: dict[int, Trace] = {}
    budget = MAX_TRACE_ENTRIES
    for dev, entries in enumerate(traces_raw):
        where = f"device_traces[{dev}]"
        if type(entries) is not list:
            raise _Shape(f"{where}: expected a list of events, found {_kind(entries)}")
        budget -= len(entries)
        if budget < 0:
            raise _Shape(f"more than {MAX_TRACE_ENTRIES:,} history entries")
        device_traces[dev] = _trace(entries, where, stacks)
    settings = _settings(raw.get("allocator_settings"))
    snap = MemorySnapshot(path=path, segments=segments, device_traces=device_traces,
                          allocator_settings=settings, has_history="device_traces" in raw)
    if stacks.cut:
        snap.warnings.append(f"{path.name}: {stacks.cut:,} stacks deeper than {MAX_FRAMES} frames were cut")
    return snap


def _segments(raw: Any, where: str, stacks: _StackTable) -> list[Segment]:
    if type(raw) is not list:
        raise _Shape(f"{where}: expected a list, found {_kind(raw)}")
    if len(raw) > MAX_SEGMENTS:
        raise _Shape(f"{where}: more than {MAX_SEGMENTS:,} segments")
    out, blocks_left = [], MAX_BLOCKS
    for i, seg in enumerate(raw):
        here = f"{where}[{i}]"
        d = _dict(seg, here)
        address = _int(d["address"], f"{here}.address") if d.get("address") is not None else 0
        blocks_raw = d.get("blocks", [])
        if type(blocks_raw) is not list:
            raise _Shape(f"{here}.blocks: expected a list, found {_kind(blocks_raw)}")
        blocks_left -= len(blocks_raw)
        if blocks_left < 0:
            raise _Shape(f"more than {MAX_BLOCKS:,} blocks")
        blocks, offset = [], address
        for j, blk in enumerate(blocks_raw):
            block = _block(blk, f"{here}.blocks[{j}]", offset, stacks)
            blocks.append(block)
            offset = block.address + block.size
        total = d.get("total_size")
        total_size = (_int(total, f"{here}.total_size") if total is not None
                      else sum(b.size for b in blocks))
        pool = d.get("segment_pool_id")
        pool_id = (tuple(_int(x, f"{here}.segment_pool_id") for x in pool[:8])
                   if type(pool) in (list, tuple) else None)
        out.append(Segment(
            device=_int(d.get("device", 0), f"{here}.device"),
            address=address,
            total_size=total_size,
            stream=_int(d.get("stream", 0), f"{here}.stream", signed=True),
            segment_type=_opt_str(d.get("segment_type"), f"{here}.segment_type"),
            pool_id=pool_id,
            is_expandable=d.get("is_expandable", False) is True,
            blocks=blocks,
        ))
    return out


def _block(raw: Any, where: str, offset: int, stacks: _StackTable) -> Block:
    d = _dict(raw, where)
    size = _int(_required(d, "size", where), f"{where}.size")
    state = _required(d, "state", where)
    if state == "active_awaiting_free":  # the name PyTorch's docstring uses for active_pending_free
        state = "active_pending_free"
    if type(state) is not str or state not in BLOCK_STATES:
        raise _Shape(f"{where}.state: {_short(state)} is not one of {', '.join(BLOCK_STATES)}")
    address = d.get("address", d.get("addr"))
    stack: Any = d.get("frames")
    requested = d.get("requested_size")
    history = d.get("history")
    if type(history) is list and history:  # PyTorch <= 2.0: the newest record first
        first = _dict(history[0], f"{where}.history[0]")
        stack = stack if stack is not None else first.get("frames")
        requested = requested if requested is not None else first.get("real_size")
        address = address if address is not None else first.get("addr")
    return Block(
        address=_int(address, f"{where}.address") if address is not None else offset,
        size=size,
        requested_size=_int(requested, f"{where}.requested_size") if requested is not None else size,
        state=state,
        frames=stacks.stacks[stacks.id_of(stack, f"{where}.frames")],
    )


def _trace(entries: list, where: str, stacks: _StackTable) -> Trace:
    """One device's events → columns, in bulk: one C-level pass per field, then one type check per
    column (a Python loop over a million events with a check per field would cost more than the
    unpickling)."""
    if not entries:
        return replace(empty_trace(), stacks=stacks.stacks)
    if any(type(e) is not dict for e in entries):
        i = next(i for i, e in enumerate(entries) if type(e) is not dict)
        raise _Shape(f"{where}[{i}]: expected a dict, found {_kind(entries[i])}")
    actions = [e.get("action") for e in entries]
    # only strings are looked up: hashing a hostile nested tuple could take forever
    codes = list(map(_ACTION_CODE.get, actions)) if set(map(type, actions)) == {str} else \
        [_ACTION_CODE.get(a) if type(a) is str else None for a in actions]
    if None in codes:
        i = codes.index(None)
        if "action" not in entries[i]:
            raise _Shape(f"{where}[{i}]: no 'action'")
        raise _Shape(f"{where}[{i}].action: {_short(actions[i])} is not an allocator action")
    action = np.array(codes, dtype=np.int8)
    addrs = [e.get("addr") for e in entries]
    for i in np.flatnonzero(action == _ACTION_CODE["oom"]).tolist():
        addrs[i] = entries[i].get("device_free")
    times = [e.get("time_us") for e in entries]
    has_times = all(t is not None for t in times)
    return Trace(
        action=action,
        addr=_column(addrs, where, "addr", np.uint64),
        size=_column([e.get("size", 0) for e in entries], where, "size", np.int64),
        stream=_column([e.get("stream", 0) for e in entries], where, "stream", np.int64, signed=True),
        time_us=_column(times, where, "time_us", np.int64, signed=True) if has_times else None,
        stack=stacks.ids([e.get("frames") for e in entries], where),
        stacks=stacks.stacks,
    )


def _column(values: list, where: str, name: str, dtype: type, signed: bool = False) -> np.ndarray:
    """Integers (``None`` as 0) → a numpy column; anything else names the first offending event."""
    kinds = set(map(type, values))
    if kinds - {int, type(None)}:
        i = next(i for i, v in enumerate(values) if type(v) not in (int, type(None)))
        raise _Shape(f"{where}[{i}].{name}: expected an integer, found {_kind(values[i])}")
    if type(None) in kinds:
        values = [0 if v is None else v for v in values]
    try:
        col = np.array(values, dtype=dtype)
    except OverflowError:
        for i, v in enumerate(values):  # name the first value out of range
            _int(v, f"{where}[{i}].{name}", signed)
            if dtype is np.int64 and not -(1 << 63) <= v < 1 << 63:
                raise _Shape(f"{where}[{i}].{name}: {v} does not fit in 63 bits") from None
        raise
    if not signed and dtype is np.int64 and col.size and col.min() < 0:
        i = int(np.argmin(col))
        raise _Shape(f"{where}[{i}].{name}: negative ({values[i]})")
    return col


def _settings(raw: Any) -> dict[str, str | int | float | bool | None]:
    """``allocator_settings`` (PyTorch >= 2.5): a flat dict of scalars; anything else is ignored."""
    if not isinstance(raw, dict):
        return {}
    return {str(k)[:MAX_STRING]: (v[:MAX_STRING] if isinstance(v, str) else v) for k, v in raw.items()
            if isinstance(k, str) and (v is None or isinstance(v, (str, int, float, bool)))}


class _StackTable:
    """Stacks → interned tuples of :class:`Frame`; each event or block keeps only an index.

    A stack is keyed by its frames' (file, line, name), so the same call site in a million events
    (each with its own list of frame dicts, as PyTorch writes them) is converted and stored once.
    Stacks are capped at ``MAX_FRAMES``; on the checked path a stack list seen before is found by
    identity without reading it again. What a hostile pickle can still make expensive (hashing shared
    nested tuples, one stack referenced a million times) is bounded by the reader's CPU budget.
    """

    def __init__(self) -> None:
        self.stacks: list[tuple[Frame, ...]] = [()]
        self._by_key: dict[tuple, int] = {(): 0}
        self._by_id: dict[int, int] = {}
        self._frames: dict[tuple[str, int, str], Frame] = {}
        self.cut = 0

    def ids(self, raws: list, where: str) -> np.ndarray:
        """Stack index of each raw stack (``None`` → 0, the empty stack).

        Fast path in C-level passes: each stack → a tuple of (file, line, name) keys, each key → a
        provisional number (``dict.setdefault``); only distinct keys are then validated and interned.
        Anything unusual (a missing field, a frame that is not a dict, a deep stack) takes the checked
        path, one stack at a time.
        """
        provisional: dict[tuple, int] = {}
        try:
            stacks = [() if raw is None else raw for raw in raws]
            if set(map(type, stacks)) - {list, tuple} or max(map(len, stacks), default=0) > MAX_FRAMES:
                raise TypeError
            keys = map(tuple, map(map, repeat(_FRAME_KEY), stacks))
            numbers = np.fromiter(map(provisional.setdefault, keys, count()), dtype=np.int64, count=len(stacks))
        except (KeyError, TypeError):  # a frame that is not a dict or lacks a field; an unhashable value
            return np.array([self.id_of(raw, f"{where}[{i}].frames") for i, raw in enumerate(raws)], dtype=np.int32)
        distinct, inverse = np.unique(numbers, return_inverse=True)
        by_number = {n: key for key, n in provisional.items()}
        keys_distinct = [by_number[n] for n in distinct.tolist()]
        if not all(map(_plain, keys_distinct)):  # a wrongly typed field: the checked path names it
            return np.array([self.id_of(raw, f"{where}[{i}].frames") for i, raw in enumerate(raws)], dtype=np.int32)
        return np.array([self._intern(k) for k in keys_distinct], dtype=np.int32)[inverse]

    def id_of(self, raw: Any, where: str) -> int:
        """Index of one stack, checked field by field; a stack object seen before is not read again."""
        sid = self._by_id.get(id(raw))
        if sid is not None:
            return sid
        if raw is None:
            return 0
        if type(raw) not in (list, tuple):
            raise _Shape(f"{where}: expected a list of frames, found {_kind(raw)}")
        frames = raw
        if len(raw) > MAX_FRAMES:
            self.cut += 1
            frames = raw[:MAX_FRAMES]
        sid = self._intern(tuple(self._slow_key(f, f"{where}[{k}]") for k, f in enumerate(frames)))
        self._by_id[id(raw)] = sid
        return sid

    def _intern(self, key: tuple) -> int:
        """Index of a stack given by its validated (file, line, name) keys."""
        sid = self._by_key.get(key)
        if sid is None:
            sid = self._by_key[key] = len(self.stacks)
            self.stacks.append(tuple(self._frame(k) for k in key))
        return sid

    def _frame(self, key: tuple[str, int, str]) -> Frame:
        frame = self._frames.get(key)
        if frame is None:
            frame = self._frames[key] = Frame(key[0][:MAX_STRING], key[1], key[2][:MAX_STRING])
        return frame

    @staticmethod
    def _slow_key(raw: Any, where: str) -> tuple[str, int, str]:
        if type(raw) is not dict:
            raise _Shape(f"{where}: expected a dict, found {_kind(raw)}")
        return (_str(raw.get("filename", "??"), f"{where}.filename"),
                _int(raw.get("line", 0), f"{where}.line", signed=True),
                _str(raw.get("name", "??"), f"{where}.name"))


_FRAME_KEY = operator.itemgetter("filename", "line", "name")


def _plain(key: tuple) -> bool:
    """Every frame is (str, int, str) with a 64-bit line: safe and cheap to hash."""
    return all(type(f) is str and type(ln) is int and type(n) is str and -(1 << 63) <= ln < 1 << 63
               for f, ln, n in key)


def _dict(raw: Any, where: str) -> dict:
    if not isinstance(raw, dict):
        raise _Shape(f"{where}: expected a dict, found {_kind(raw)}")
    return raw


def _required(d: dict, key: str, where: str) -> Any:
    if key not in d:
        raise _Shape(f"{where}: no '{key}'")
    return d[key]


def _int(value: Any, where: str, signed: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Shape(f"{where}: expected an integer, found {_kind(value)}")
    if value.bit_length() > 64:
        raise _Shape(f"{where}: a {value.bit_length()}-bit integer does not fit in 64 bits")
    if not signed and value < 0:
        raise _Shape(f"{where}: negative ({value})")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _Shape(f"{where}: expected a string, found {_kind(value)}")
    return value[:MAX_STRING]


def _opt_str(value: Any, where: str) -> str | None:
    return None if value is None else _str(value, where)


def _kind(value: Any) -> str:
    return type(value).__name__


def _short(value: Any) -> str:
    """A string value quoted and cut, or only the type of anything else (the repr of a hostile
    nested structure could be exponentially long)."""
    if type(value) is not str:
        return f"a {_kind(value)}"
    return repr(value) if len(value) <= 40 else repr(value[:37]) + "..."


_RESULT_TYPES = frozenset({
    (__name__, "MemorySnapshot"), (__name__, "Segment"), (__name__, "Block"), (__name__, "Frame"),
    (__name__, "Trace"), ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"),
    ("numpy", "dtype"), ("numpy", "ndarray"), ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
})  # what a loaded snapshot is made of (the child process sends it to the parent as a pickle)


def history_range_us(snap: MemorySnapshot) -> tuple[int, int] | None:
    """First and last time (µs since the epoch) of the snapshot's history, when its events have times."""
    ranges = [(int(t.time_us.min()), int(t.time_us.max())) for t in snap.device_traces.values()
              if len(t) and t.time_us is not None]
    return (min(r[0] for r in ranges), max(r[1] for r in ranges)) if ranges else None


def outside_session(snap: MemorySnapshot, session_start_ns: int | None, trace_end_ns: int | None) -> str | None:
    """Why ``snap`` cannot belong to the traced session (start and last event as UTC ns), or ``None``.

    The traced process starts after nsys starts its session, so a history that ended before the session
    began is from another process (``SESSION_SKEW_S`` allows for clocks of different hosts). A history
    may begin after the trace ends: training goes on after the capture window and snapshots are often
    dumped at the end or at an OOM, so only one more than ``SESSION_AFTER_S`` later is refused. Without
    times in the history (PyTorch < 2.1) nothing can be told.
    """
    span = history_range_us(snap)
    if span is None or session_start_ns is None:
        return None
    first_ns, last_ns = span[0] * 1000, span[1] * 1000
    if last_ns < session_start_ns - SESSION_SKEW_S * 10**9:
        return (f"its history ({_utc(first_ns)} to {_utc(last_ns)}) ended {_duration(session_start_ns - last_ns)} "
                f"before the trace's session began ({_utc(session_start_ns)}): it is from another run")
    if trace_end_ns is not None and first_ns > trace_end_ns + SESSION_AFTER_S * 10**9:
        return (f"its history begins {_duration(first_ns - trace_end_ns)} after the trace ends "
                f"({_utc(first_ns)} vs {_utc(trace_end_ns)}): it is from another run")
    return None


def _utc(ns: int) -> str:
    import datetime as dt

    try:
        return dt.datetime.fromtimestamp(ns / 1e9, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return f"{ns} ns"


def _duration(ns: int) -> str:
    s = ns / 1e9
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:,.1f} {unit}"
    return f"{s:,.1f} s"


def rank_from_name(path: Path) -> int | None:
    """Rank in a snapshot's file name, for the names the capture hook and the frameworks write:
    ``rank3.pickle`` (perfdoctor), ``memory_snapshot-rank3.pickle`` (NeMo), ``snapshot_3.pickle`` and
    ``snapshot_oom_rank-3.pickle`` (Megatron-LM / Megatron-Bridge)."""
    stem = path.stem
    match = re.search(r"rank[-_]?(\d+)", stem, re.IGNORECASE) or re.search(r"[-_](\d+)$", stem)
    return int(match.group(1)) if match else None
