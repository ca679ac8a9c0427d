"""Read a PyTorch CUDA memory snapshot (``torch.cuda.memory._dump_snapshot``) without running it.

Snapshots are pickles, and unpickling can call any importable function (``os.system`` through
``__reduce__``). A real snapshot holds only dicts, lists, tuples, strings, numbers, booleans and
``None`` (``THCPModule_memorySnapshot`` builds it from C++ with pybind11; Megatron-LM, Megatron-Bridge
and NeMo dump the same dict), and none of those needs a global. So :class:`_PlainDataUnpickler`
refuses every global and every persistent id: a pickle that names one is reported by that name and
never loaded. The plain data is then validated and copied into the small typed records below, so
measurements never see raw pickle content.

Accepted shapes (research/megatron.md §2.3): the snapshot dict (``segments``, ``device_traces``,
optionally ``allocator_settings``, ``external_annotations``), the older bare list of segments
(``torch.cuda.memory_snapshot()``), old blocks that carry ``history`` instead of ``frames``, and
snapshots converted from the profiler (``torch.cuda._memory_viz._profile_to_snapshot``), whose blocks
have no address (it follows from the segment address and the sizes of the blocks before it).
"""

from __future__ import annotations

import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from perfdoctor.errors import InputError

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


@dataclass(slots=True)
class TraceEntry:
    """One allocator event of the recorded history, oldest first.

    ``addr`` is the block address (``device_free`` bytes for ``oom``: what the device had left).
    ``time_us`` exists from PyTorch 2.1 on.
    """

    action: str
    addr: int
    size: int
    stream: int
    time_us: int | None
    frames: tuple[Frame, ...] = ()


@dataclass
class MemorySnapshot:
    """A validated snapshot: the allocator state at dump time plus the history that led to it."""

    path: Path
    segments: list[Segment]
    device_traces: dict[int, list[TraceEntry]]
    allocator_settings: dict[str, str | int | float | bool | None] = field(default_factory=dict)
    has_history: bool = True  # False for the old bare list of segments
    rank: int | None = None  # from the file name, when the loader could tell
    warnings: list[str] = field(default_factory=list)

    @property
    def devices(self) -> list[int]:
        """Devices with any segment or history, ascending."""
        seen = {s.device for s in self.segments} | {d for d, t in self.device_traces.items() if t}
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


def load_snapshot(path: str | Path) -> MemorySnapshot:
    """Read and validate one snapshot file. Raises :class:`InputError` (one line) for anything else."""
    path = Path(path)
    raw = _unpickle(path)
    return _validate(raw, path)


def _unpickle(path: Path) -> Any:
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise InputError(f"{path}: not a file")
        if size > MAX_FILE_BYTES:
            raise InputError(f"{path}: {size:,} bytes, more than the {MAX_FILE_BYTES:,} a memory snapshot may have")
        with path.open("rb") as fh:
            head = fh.read(2)
            if head == b"\x1f\x8b":
                raise InputError(f"{path}: gzip-compressed; decompress it first (gunzip)")
            if not head:
                raise InputError(f"{path}: empty file, not a memory snapshot")
            fh.seek(0)
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
        raise InputError(f"{path}: pickle needs more memory than is available") from None
    except Exception as exc:  # UnpicklingError, ValueError, struct.error... all mean a broken pickle
        text = str(exc)
        if "truncated" in text:
            raise InputError(f"{path}: truncated pickle (the file ends before the snapshot does)") from None
        raise InputError(f"{path}: not a PyTorch memory snapshot (not a readable pickle: "
                         f"{text.splitlines()[0] if text else type(exc).__name__})") from None


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
    frames = _FrameReader()
    if isinstance(raw, list):
        segments = _segments(raw, "segments", frames)
        snap = MemorySnapshot(path=path, segments=segments, device_traces={}, has_history=False)
        snap.warnings.append(f"{path.name}: a bare list of segments (no allocation history): "
                             "peaks are the dump-time state")
        return snap
    if not isinstance(raw, dict):
        raise _Shape(f"expected a dict with 'segments' and 'device_traces', found {_kind(raw)}")
    if "segments" not in raw:
        keys = ", ".join(sorted(str(k) for k in list(raw)[:8]))
        raise _Shape(f"no 'segments' key (keys: {keys or 'none'})")
    segments = _segments(raw["segments"], "segments", frames)
    traces_raw = raw.get("device_traces", [])
    if not isinstance(traces_raw, list):
        raise _Shape(f"device_traces: expected a list (one per device), found {_kind(traces_raw)}")
    device_traces: dict[int, list[TraceEntry]] = {}
    budget = MAX_TRACE_ENTRIES
    for dev, entries in enumerate(traces_raw):
        where = f"device_traces[{dev}]"
        if not isinstance(entries, list):
            raise _Shape(f"{where}: expected a list of events, found {_kind(entries)}")
        budget -= len(entries)
        if budget < 0:
            raise _Shape(f"more than {MAX_TRACE_ENTRIES:,} history entries")
        device_traces[dev] = [_trace_entry(e, f"{where}[{i}]", frames) for i, e in enumerate(entries)]
    settings = _settings(raw.get("allocator_settings"))
    snap = MemorySnapshot(path=path, segments=segments, device_traces=device_traces,
                          allocator_settings=settings, has_history="device_traces" in raw)
    if frames.cut:
        snap.warnings.append(f"{path.name}: {frames.cut:,} stacks deeper than {MAX_FRAMES} frames were cut")
    return snap


def _segments(raw: Any, where: str, frames: _FrameReader) -> list[Segment]:
    if not isinstance(raw, list):
        raise _Shape(f"{where}: expected a list, found {_kind(raw)}")
    if len(raw) > MAX_SEGMENTS:
        raise _Shape(f"{where}: more than {MAX_SEGMENTS:,} segments")
    out, blocks_left = [], MAX_BLOCKS
    for i, seg in enumerate(raw):
        here = f"{where}[{i}]"
        d = _dict(seg, here)
        address = _int(d["address"], f"{here}.address") if d.get("address") is not None else 0
        blocks_raw = d.get("blocks", [])
        if not isinstance(blocks_raw, list):
            raise _Shape(f"{here}.blocks: expected a list, found {_kind(blocks_raw)}")
        blocks_left -= len(blocks_raw)
        if blocks_left < 0:
            raise _Shape(f"more than {MAX_BLOCKS:,} blocks")
        blocks, offset = [], address
        for j, blk in enumerate(blocks_raw):
            block = _block(blk, f"{here}.blocks[{j}]", offset, frames)
            blocks.append(block)
            offset = block.address + block.size
        total = d.get("total_size")
        total_size = (_int(total, f"{here}.total_size") if total is not None
                      else sum(b.size for b in blocks))
        pool = d.get("segment_pool_id")
        pool_id = (tuple(_int(x, f"{here}.segment_pool_id") for x in pool)
                   if isinstance(pool, (list, tuple)) else None)
        out.append(Segment(
            device=_int(d.get("device", 0), f"{here}.device"),
            address=address,
            total_size=total_size,
            stream=_int(d.get("stream", 0), f"{here}.stream", signed=True),
            segment_type=_opt_str(d.get("segment_type"), f"{here}.segment_type"),
            pool_id=pool_id,
            is_expandable=bool(d.get("is_expandable", False)),
            blocks=blocks,
        ))
    return out


def _block(raw: Any, where: str, offset: int, frames: _FrameReader) -> Block:
    d = _dict(raw, where)
    size = _int(_required(d, "size", where), f"{where}.size")
    state = _required(d, "state", where)
    if state == "active_awaiting_free":  # the name PyTorch's docstring uses for active_pending_free
        state = "active_pending_free"
    if state not in BLOCK_STATES:
        raise _Shape(f"{where}.state: {_short(state)} is not one of {', '.join(BLOCK_STATES)}")
    address = d.get("address", d.get("addr"))
    stack: Any = d.get("frames")
    requested = d.get("requested_size")
    history = d.get("history")
    if isinstance(history, list) and history:  # PyTorch <= 2.0: the newest record first
        first = _dict(history[0], f"{where}.history[0]")
        stack = stack if stack is not None else first.get("frames")
        requested = requested if requested is not None else first.get("real_size")
        address = address if address is not None else first.get("addr")
    return Block(
        address=_int(address, f"{where}.address") if address is not None else offset,
        size=size,
        requested_size=_int(requested, f"{where}.requested_size") if requested is not None else size,
        state=state,
        frames=frames.read(stack, f"{where}.frames"),
    )


def _trace_entry(raw: Any, where: str, frames: _FrameReader) -> TraceEntry:
    d = _dict(raw, where)
    action = _required(d, "action", where)
    if action not in TRACE_ACTIONS:
        raise _Shape(f"{where}.action: {_short(action)} is not an allocator action")
    addr = d.get("device_free") if action == "oom" else d.get("addr")
    time_us = d.get("time_us")
    return TraceEntry(
        action=action,
        addr=_int(addr, f"{where}.addr") if addr is not None else 0,
        size=_int(d.get("size", 0), f"{where}.size"),
        stream=_int(d.get("stream", 0), f"{where}.stream", signed=True),
        time_us=_int(time_us, f"{where}.time_us", signed=True) if time_us is not None else None,
        frames=frames.read(d.get("frames"), f"{where}.frames"),
    )


def _settings(raw: Any) -> dict[str, str | int | float | bool | None]:
    """``allocator_settings`` (PyTorch >= 2.5): a flat dict of scalars; anything else is ignored."""
    if not isinstance(raw, dict):
        return {}
    return {str(k)[:MAX_STRING]: (v[:MAX_STRING] if isinstance(v, str) else v) for k, v in raw.items()
            if isinstance(k, str) and (v is None or isinstance(v, (str, int, float, bool)))}


class _FrameReader:
    """Frames → tuples of :class:`Frame`, converting each distinct stack object once.

    Pickles share repeated objects, so a stack list often appears in many entries; caching by object
    identity keeps loading linear in the file size even when a hostile pickle repeats one huge stack.
    Equal frames (the same call site in thousands of entries) become one interned :class:`Frame`.
    """

    def __init__(self) -> None:
        self._stacks: dict[int, tuple[Frame, ...]] = {}
        self._frames: dict[tuple[Any, Any, Any], Frame] = {}
        self._keep: list[Any] = []  # keeps ids valid while the cache is alive
        self.cut = 0

    def read(self, raw: Any, where: str) -> tuple[Frame, ...]:
        if raw is None:
            return ()
        if not isinstance(raw, (list, tuple)):
            raise _Shape(f"{where}: expected a list of frames, found {_kind(raw)}")
        cached = self._stacks.get(id(raw))
        if cached is not None:
            return cached
        if len(raw) > MAX_FRAMES:
            self.cut += 1
        stack = tuple(self._frame(f, f"{where}[{i}]") for i, f in enumerate(raw[:MAX_FRAMES]))
        self._stacks[id(raw)] = stack
        self._keep.append(raw)
        return stack

    def _frame(self, raw: Any, where: str) -> Frame:
        # Hot path (millions of frames in a big snapshot): exact type checks, then the cache.
        if type(raw) is not dict:
            raise _Shape(f"{where}: expected a dict, found {_kind(raw)}")
        key = (raw.get("filename", "??"), raw.get("line", 0), raw.get("name", "??"))
        plain = type(key[0]) is str and type(key[1]) is int and type(key[2]) is str
        frame = self._frames.get(key) if plain else None
        if frame is None:
            frame = Frame(filename=_str(key[0], f"{where}.filename"),
                          line=_int(key[1], f"{where}.line", signed=True),
                          name=_str(key[2], f"{where}.name"))
            self._frames[key] = frame
        return frame


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
    if not signed and value < 0:
        raise _Shape(f"{where}: negative ({value})")
    if abs(value) >= 1 << 64:
        raise _Shape(f"{where}: {value:.3e} does not fit in 64 bits")
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
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def rank_from_name(path: Path) -> int | None:
    """Rank in a snapshot's file name, for the names the capture hook and the frameworks write:
    ``rank3.pickle`` (perfdoctor), ``memory_snapshot-rank3.pickle`` (NeMo), ``snapshot_3.pickle`` and
    ``snapshot_oom_rank-3.pickle`` (Megatron-LM / Megatron-Bridge)."""
    stem = path.stem
    match = re.search(r"rank[-_]?(\d+)", stem, re.IGNORECASE) or re.search(r"[-_](\d+)$", stem)
    return int(match.group(1)) if match else None
