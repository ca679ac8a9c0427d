"""CUDA memory history: start it once a rank has its device, dump it at the end of the window.

The dump is PyTorch's own snapshot format (``torch.cuda.memory._snapshot()``: a dict with
``segments`` and ``device_traces``, research/megatron.md §2.3), pickled exactly as
``torch.cuda.memory._dump_snapshot`` does, so PyTorch's viewer and perfdoctor's reader both open it.

Why the details matter:

* ``_record_memory_history`` creates a CUDA context on the *current* device: started before the rank
  chose its device, every rank would put a stray context on GPU 0.
* The history is a ring buffer of ``max_entries`` allocator events (each several KB with Python
  stacks); bounded, it drops the oldest events instead of growing without limit.
* Only the arguments that PyTorch 2.1-2.13 all accept are passed (``enabled``, ``context``,
  ``stacks``, ``max_entries``); Python stacks are far cheaper than C++ ones.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

DEFAULT_MAX_ENTRIES = 100_000


def unavailable_reason(torch: Any) -> str | None:
    """Why memory history cannot be recorded in this process, or None when it can."""
    cuda = getattr(torch, "cuda", None)
    if cuda is None:
        return "this torch has no torch.cuda"
    try:
        if not cuda.is_available():
            return "no CUDA device (torch.cuda.is_available() is False)"
    except Exception as exc:  # noqa: BLE001 (a broken driver reads as "no CUDA")
        return f"torch.cuda.is_available() failed: {exc}"
    memory = getattr(cuda, "memory", None)
    if memory is None or not hasattr(memory, "_record_memory_history") or not hasattr(memory, "_snapshot"):
        return f"torch {getattr(torch, '__version__', '?')} has no memory history API"
    return None


def start_history(torch: Any, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
    """Record allocator events (with Python stacks) into a ring buffer of ``max_entries``."""
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python",
                                             max_entries=int(max_entries))


def stop_history(torch: Any) -> None:
    torch.cuda.memory._record_memory_history(enabled=None)


def dump(torch: Any, path: Path) -> Path:
    """Write the allocator snapshot to ``path`` (via a temporary name, so a reader never sees half a file)."""
    snapshot = torch.cuda.memory._snapshot()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with open(partial, "wb") as fh:
        pickle.dump(snapshot, fh)
    os.replace(partial, path)
    return path
