"""The PyTorch-profiler back end of the capture hook (``perfdoctor capture --profiler torch``).

Where nsys cannot run, the rank profiles itself: ``torch.profiler`` records CPU activity (and CUDA
activity where CUDA is available) between the start and the end of the ``--steps`` window only,
started and stopped explicitly, so steps outside the window run unprofiled; the rank then exports one
Kineto trace.

perfdoctor's labels (DESIGN §4) become ``record_function`` ranges with the same text as the NVTX
ones (``step n=3``, ``comm op=all_reduce group=dp bytes=... size=...``, ``gc gen=0``, ``data``).
The ``rank`` and ``config`` marks, and the names the hook gave each process group, go into the trace's
metadata under :data:`METADATA_KEY` (``prof.add_metadata_json``); that key also tells the Kineto loader
(perfdoctor.load.kineto) that the ranges named like §4 labels are perfdoctor's. Kineto writes a
metadata value into the file as it is, except that it turns every backslash into a slash, so the value
is an object whose strings hold neither quotes nor backslashes (:func:`_plain`), never JSON in a string.

The trace is written to a hidden name in the run directory that the analysis never reads
(:func:`unscrubbed_name`); ``perfdoctor capture`` scrubs secrets out of it into the final name once the
run has ended (perfdoctor.capture.scrub.scrub_kineto).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from perfdoctor.capture.hook.nvtx_emit import Emitter

METADATA_KEY = "perfdoctor"
METADATA_VERSION = 1
TRACE_SUFFIX = ".pt.trace.json.gz"
UNSCRUBBED_SUFFIX = ".unscrubbed"


def trace_name(rank: int) -> str:
    """``rank3.pt.trace.json.gz``: what ``perfdoctor analyze RUN_DIR`` finds and reads."""
    return f"rank{rank}{TRACE_SUFFIX}"


def unscrubbed_name(rank: int) -> str:
    """The hidden name the rank writes before capture scrubs it (no .json suffix: never read as a trace)."""
    return f".{trace_name(rank)}{UNSCRUBBED_SUFFIX}"


def final_name(unscrubbed: str) -> str:
    """``.rank3.pt.trace.json.gz.unscrubbed`` → ``rank3.pt.trace.json.gz``."""
    return unscrubbed.removeprefix(".").removesuffix(UNSCRUBBED_SUFFIX)


class RecordFunctionEmitter(Emitter):
    """DESIGN §4 labels as ``record_function`` ranges; marks are kept for the trace's metadata.

    Ranges opened with ``start`` may end on another thread (a step ends where the optimizer ran);
    ``push``/``pop`` ranges nest per thread.
    """

    backend = "torch.profiler"

    def __init__(self, record_function: Any) -> None:
        self._record_function = record_function
        self._stacks = threading.local()
        self.marks: list[str] = []

    def start(self, message: str) -> Any:
        handle = self._record_function(message)
        handle.__enter__()
        return handle

    def end(self, handle: Any) -> None:
        if handle is not None:
            handle.__exit__(None, None, None)

    def push(self, message: str) -> None:
        stack = getattr(self._stacks, "open", None)
        if stack is None:
            stack = self._stacks.open = []
        stack.append(self.start(message))

    def pop(self) -> None:
        stack = getattr(self._stacks, "open", None)
        if stack:
            self.end(stack.pop())

    def mark(self, message: str) -> None:
        self.marks.append(message)


class KinetoWindow:
    """One ``torch.profiler.profile`` per rank, started at the window's start and stopped at its end."""

    def __init__(self, torch: Any, run_dir: Path, rank: int) -> None:
        self.torch = torch
        self.path = run_dir / unscrubbed_name(rank)
        self.cuda = _cuda_available(torch)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.activities = ["cpu", "cuda"] if self.cuda else ["cpu"]
        self.profile = torch.profiler.profile(activities=activities, record_shapes=False, with_stack=False,
                                              profile_memory=False)
        self.running = False
        self.exported: str | None = None

    def start(self) -> None:
        self.profile.start()
        self.running = True

    def stop_and_export(self, metadata: dict[str, Any]) -> Path:
        """Stop recording (metadata must be added while the profiler is on), export, return the file."""
        self.running = False
        try:
            self.profile.add_metadata_json(METADATA_KEY, json.dumps(_plain(metadata), separators=(",", ":")))
        finally:
            self.profile.stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f"{self.path.name}.{os.getpid()}.partial.gz")  # .gz: torch gzips it
        self.profile.export_chrome_trace(str(partial))
        os.replace(partial, self.path)
        self.exported = self.path.name
        return self.path


def trace_metadata(marks: list[str], groups: dict[str, str], rank: int, activities: list[str]) -> dict[str, Any]:
    """What the Kineto loader reads: the marks (``rank r=.. local=.. world=..``, ``config {json}``) as
    objects, and the §4 group of each process group the hook labelled, by its c10d name (the
    ``Process Group Name`` Kineto records on NCCL kernels)."""
    rank_mark: dict[str, int] = {}
    config: dict[str, Any] = {}
    for mark in marks:
        kind, _, rest = mark.partition(" ")
        if kind == "rank":
            rank_mark = {k: int(v) for k, _, v in (t.partition("=") for t in rest.split()) if v.lstrip("-").isdigit()}
        elif kind == "config":
            config = json.loads(rest)
    return {"version": METADATA_VERSION, "rank": rank_mark or {"r": rank}, "config": config, "groups": groups,
            "activities": activities}


def _plain(value: Any) -> Any:
    """``value`` with quotes and backslashes taken out of its strings (Kineto would corrupt them)."""
    if isinstance(value, str):
        return value.replace("\\", "/").replace('"', "'")
    if isinstance(value, dict):
        return {_plain(str(k)): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _cuda_available(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 (a broken driver reads as "no CUDA")
        return False
