"""The per-rank hook: labels, profiler window and memory history inside an unmodified training process.

``sitecustomize`` (see ``pythonpath/``) calls :func:`install` at interpreter start when the capture
launcher's environment is present. Nothing is imported or patched eagerly: a post-import hook waits
for ``torch`` (and Megatron's schedules) and patches them the moment they finish importing, which is
before the training code imports Megatron -- Megatron binds ``torch.distributed`` functions to its
own globals at import (research/megatron.md §3.1).

What a rank gets (labels in DESIGN §4 format, domain ``perfdoctor``):

* ``step n=<k>``: from the end of optimizer step k-1 to the end of optimizer step k, through PyTorch's
  global optimizer post-step hook, so any ``torch.optim.Optimizer`` counts, including the ones inside
  Megatron's optimizer wrappers. Step 0 (from start-up to the first optimizer step) has no known start
  and is not labelled. When several optimizers step per iteration (Megatron's chained optimizer),
  the iteration ends with the last of them.
* ``comm op= group= bytes= size=`` around ``torch.distributed`` collectives and
  ``batch_isend_irecv`` (``isend``/``irecv`` stay unwrapped: ``P2POp`` compares them by identity), and
  around the exit of ``_coalescing_manager`` blocks, where NCCL launches coalesced kernels.
* ``fwd``/``bwd`` per micro-batch when Megatron's schedules run; ``gc gen=`` through ``gc.callbacks``.
* ``data`` around the training loop's wait for the next batch (a DataLoader iterator's ``__next__``).
* ``rank`` and ``config`` marks once, inside the capture window.
* ``cudaProfilerStart``/``Stop`` at the ``--steps`` window unless the training code calls them itself;
  CUDA memory history once the rank has chosen its device, dumped to ``memory/rank<R>.pickle`` at the
  end of the window.

With ``PERFDOCTOR_PROFILER=torch`` (``perfdoctor capture --profiler torch``) there is no nsys: the
rank runs ``torch.profiler`` over the same window itself, the labels are ``record_function`` ranges of
the same text and the marks go into the trace's metadata (:mod:`perfdoctor.capture.hook.torch_profiler`).

A process becomes a *rank* when it initialises ``torch.distributed`` or steps an optimizer; the
torchrun agent, data-loader workers and compile workers do neither and stay untouched. Every
callback is guarded: a failure is reported once on stderr and training goes on.
"""

from __future__ import annotations

import atexit
import functools
import gc
import inspect
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from perfdoctor.capture import snapshot
from perfdoctor.capture.hook.groups import GroupNamer, megatron_groups
from perfdoctor.capture.hook.nvtx_emit import Emitter, make_emitter
from perfdoctor.capture.hook.torch_profiler import KinetoWindow, RecordFunctionEmitter, final_name, trace_metadata

ENV_RUN_DIR = "PERFDOCTOR_RUN_DIR"
ENV_STEPS = "PERFDOCTOR_STEPS"
ENV_RANKS = "PERFDOCTOR_RANKS"
ENV_MEMORY = "PERFDOCTOR_MEMORY"
ENV_MAX_ENTRIES = "PERFDOCTOR_MEMORY_MAX_ENTRIES"
ENV_PROFILER_API = "PERFDOCTOR_PROFILER_API"
ENV_PROFILER = "PERFDOCTOR_PROFILER"  # nsys (default) | torch

# torch.distributed function → DESIGN §4 op name.
COLLECTIVES = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce", "reduce": "reduce",
    "broadcast": "broadcast", "broadcast_object_list": "broadcast",
    "all_gather": "all_gather", "all_gather_into_tensor": "all_gather", "_all_gather_base": "all_gather",
    "all_gather_coalesced": "all_gather", "all_gather_object": "all_gather",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "all_to_all": "all_to_all", "all_to_all_single": "all_to_all",
    "send": "send", "recv": "recv", "batch_isend_irecv": "send_recv",
    "barrier": "barrier", "gather": "gather", "scatter": "scatter",
}
VERSION_PACKAGES = ("torch", "transformer_engine", "transformer-engine", "megatron-core", "megatron_core",
                    "megatron-bridge", "nemo_toolkit", "nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvtx")


def install() -> Hook | None:
    """Called by sitecustomize: set the hook up when the capture launcher's environment is present."""
    if not os.environ.get(ENV_RUN_DIR):
        return None
    hook = Hook(os.environ)
    hook.install()
    return hook


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """``"2-4"`` → (2, 4); empty → None. The launcher validated it already."""
    if not text:
        return None
    first, _, last = text.partition("-")
    return int(first), int(last or first)


def parse_ranks(text: str | None) -> set[int] | None:
    """``"all"``/empty → None (every rank); ``"0,3"`` → {0, 3}."""
    if not text or text == "all":
        return None
    return {int(r) for r in text.split(",") if r.strip()}


def env_rank() -> tuple[int, int, int]:
    """(rank, local rank, world size) from the launcher's environment (torchrun, Slurm, MPI)."""
    env = os.environ

    def first(*names: str, default: int) -> int:
        for name in names:
            value = env.get(name, "")
            if value.strip().isdigit():
                return int(value)
        return default

    return (first("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", default=0),
            first("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", default=0),
            first("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", default=1))


class _PostImport:
    """A ``sys.meta_path`` finder that runs a callback right after a module finishes importing."""

    def __init__(self, callbacks: dict[str, Callable[[ModuleType], None]]) -> None:
        self.callbacks = callbacks
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        callback = self.callbacks.get(fullname)
        if callback is None or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.discard(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            callback(module)

        loader.exec_module = exec_module  # this module's loader instance only
        return spec

    def invalidate_caches(self) -> None:
        pass


class Hook:
    """State of the hook in one process."""

    def __init__(self, env: Any) -> None:
        self.run_dir = Path(env[ENV_RUN_DIR])
        self.window = parse_steps(env.get(ENV_STEPS))
        self.ranks = parse_ranks(env.get(ENV_RANKS))
        self.memory_wanted = env.get(ENV_MEMORY, "1") == "1"
        self.max_entries = int(env.get(ENV_MAX_ENTRIES) or snapshot.DEFAULT_MAX_ENTRIES)
        self.profiler_api = env.get(ENV_PROFILER_API) == "1"
        self.torch_profiler = env.get(ENV_PROFILER) == "torch"
        self.kineto: KinetoWindow | None = None
        self.group_names: dict[str, str] = {}  # c10d name of each labelled process group → §4 group
        self.torch: Any = None
        self.emitter: Emitter = Emitter()
        self.namer = GroupNamer()
        self._warned: set[str] = set()
        self._tls = threading.local()
        self._lock = threading.RLock()
        self.active = False  # this process is a rank
        self.selected = False  # ... and one the user asked to profile
        self.rank = self.local_rank = 0
        self.world = 1
        self.labelling = False  # inside the window: emit labels
        self.steps_done = 0  # optimizer iterations finished
        self._counts: dict[int, int] = {}
        self._closer: int | None = None  # id of the optimizer whose step ends an iteration
        self._step_handle: Any = None
        self._microbatches = {"fwd": 0, "bwd": 0}
        self._marks_done = False
        self._config_done = False
        self._window_done = False
        self.profiler: dict[str, Any] = {"by": None, "started": False, "stopped": False,
                                         "kind": "torch" if self.torch_profiler else "nsys"}
        self.memory: dict[str, Any] = {"status": "not started"}
        self._cudart: Callable[[], Any] | None = None
        self._gc_handles: list[Any] = []

    # ----------------------------------------------------------------------------------- set-up
    def install(self) -> None:
        finder = _PostImport({"torch": self._guarded("torch patches", self.on_torch),
                              "megatron.core.pipeline_parallel.schedules":
                                  self._guarded("Megatron schedule patches", self.on_megatron_schedules)})
        sys.meta_path.insert(0, finder)
        if "torch" in sys.modules:
            self._guarded("torch patches", self.on_torch)(sys.modules["torch"])
        atexit.register(self._guarded("finish", self.finish))

    def warn(self, message: str, key: str | None = None) -> None:
        key = key or message
        if key in self._warned:
            return
        self._warned.add(key)
        try:
            sys.stderr.write(f"perfdoctor capture hook: {message}\n")
        except Exception:  # noqa: BLE001 (stderr closed: nothing to tell)
            pass

    def _guarded(self, what: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` that never raises: a failure is reported once and the hook's part of it is skipped."""

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 (the training run must go on)
                self.warn(f"{what} failed ({type(exc).__name__}: {exc}); training continues without it", what)
                return None

        return run

    def on_torch(self, torch: ModuleType) -> None:
        self.torch = torch
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available():
            from torch.distributed import distributed_c10d as c10d

            self._patch_collectives(dist, c10d)
            self._patch_init(dist, c10d)
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(self._guarded("step hook", self.on_optimizer_step))
        self._patch_cuda(torch)
        self._patch_data_loader(torch)

    def _patch_collectives(self, dist: ModuleType, c10d: ModuleType) -> None:
        for name, op in COLLECTIVES.items():
            original = getattr(c10d, name, None)
            if original is None or getattr(original, "__perfdoctor__", False):
                continue
            wrapper = self._comm_wrapper(original, op)
            setattr(c10d, name, wrapper)
            if getattr(dist, name, None) is original:
                setattr(dist, name, wrapper)
        manager = getattr(c10d, "_coalescing_manager", None)
        if manager is not None and not getattr(manager, "__perfdoctor__", False):
            wrapper = self._coalescing_wrapper(manager)
            c10d._coalescing_manager = wrapper
            if getattr(dist, "_coalescing_manager", None) is manager:
                dist._coalescing_manager = wrapper

    def _patch_init(self, dist: ModuleType, c10d: ModuleType) -> None:
        original = c10d.init_process_group

        @functools.wraps(original)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            self._guarded("rank set-up", self.activate)("init_process_group")
            return result

        init_process_group.__perfdoctor__ = True  # type: ignore[attr-defined]
        c10d.init_process_group = init_process_group
        if getattr(dist, "init_process_group", None) is original:
            dist.init_process_group = init_process_group

    def _patch_cuda(self, torch: ModuleType) -> None:
        cuda = torch.cuda
        original_set_device = cuda.set_device

        @functools.wraps(original_set_device)
        def set_device(*args: Any, **kwargs: Any) -> Any:
            result = original_set_device(*args, **kwargs)
            self._guarded("memory history", self.start_memory)("set_device")
            return result

        cuda.set_device = set_device
        original_cudart = cuda.cudart
        self._cudart = original_cudart
        hook = self

        class _ProfilerCalls:
            """``torch.cuda.cudart()`` as the training code sees it: notes its own profiler calls."""

            def __init__(self, lib: Any) -> None:
                self._lib = lib

            def cudaProfilerStart(self) -> Any:  # noqa: N802 (CUDA's name)
                hook._user_profiler("start")
                return self._lib.cudaProfilerStart()

            def cudaProfilerStop(self) -> Any:  # noqa: N802
                hook._user_profiler("stop")
                return self._lib.cudaProfilerStop()

            def __getattr__(self, name: str) -> Any:
                return getattr(self._lib, name)

        @functools.wraps(original_cudart)
        def cudart() -> Any:
            return _ProfilerCalls(original_cudart())

        cuda.cudart = cudart
        profiler = getattr(cuda, "profiler", None)
        if profiler is not None and getattr(profiler, "cudart", None) is original_cudart:
            profiler.cudart = cudart

    def _patch_data_loader(self, torch: ModuleType) -> None:
        """``data`` around every DataLoader iterator's ``__next__`` (the subclasses inherit it)."""
        from torch.utils.data import dataloader

        base = dataloader._BaseDataLoaderIter
        original = base.__next__
        if getattr(original, "__perfdoctor__", False):
            return

        @functools.wraps(original)
        def __next__(iterator: Any) -> Any:  # noqa: N807 (the method it replaces)
            if not self.labelling:
                return original(iterator)
            self.emitter.push("data")
            try:
                return original(iterator)
            finally:
                self.emitter.pop()

        __next__.__perfdoctor__ = True  # type: ignore[attr-defined]
        base.__next__ = __next__

    def on_megatron_schedules(self, schedules: ModuleType) -> None:
        for name, kind in (("forward_step", "fwd"), ("backward_step", "bwd")):
            original = getattr(schedules, name, None)
            if callable(original) and not getattr(original, "__perfdoctor__", False):
                setattr(schedules, name, self._microbatch_wrapper(original, kind))

    # ------------------------------------------------------------------------------- the rank
    def activate(self, why: str) -> None:
        """This process is a training rank: learn who it is, and start what the window needs."""
        with self._lock:
            if self.active:
                return
            self.active = True
            self.rank, self.local_rank, self.world = env_rank()
            dist = getattr(self.torch, "distributed", None)
            if dist is not None and dist.is_available() and dist.is_initialized():
                self.rank, self.world = dist.get_rank(), dist.get_world_size()
                self.namer.default_group = dist.distributed_c10d._get_default_group()
            self.selected = self.ranks is None or self.rank in self.ranks
            if not self.selected:
                return
            if self.torch_profiler:
                self.emitter = RecordFunctionEmitter(self.torch.autograd.profiler.record_function)
            else:
                self.emitter = make_emitter(self.warn)
            self.start_memory(why)
            if self.window is None or self.window[0] == 0:
                self._open_window()
            self.write_rank_file()

    def _open_window(self) -> None:
        if self.torch_profiler:
            self._guarded("torch.profiler start", self._start_kineto)()
        self.labelling = True
        if self.profiler_api and self.profiler["by"] is None:
            self._cudart_call("cudaProfilerStart")
            self.profiler.update(by="perfdoctor", started=True)
        self._emit_marks()
        if not self._gc_handles:
            gc.callbacks.append(self._on_gc)
            self._gc_handles.append(self._on_gc)

    def _close_window(self) -> None:
        if self._window_done:
            return
        self._window_done = True
        self.labelling = False
        if self.profiler_api and self.profiler["by"] == "perfdoctor" and self.profiler["started"]:
            self._cudart_call("cudaProfilerStop")
            self.profiler["stopped"] = True
        self._guarded("torch.profiler export", self._stop_kineto)()
        self.dump_memory()
        self.write_rank_file()

    def _start_kineto(self) -> None:
        if self.kineto is not None:
            return
        if getattr(self.torch.autograd.profiler, "_is_profiler_enabled", False):  # one profiler per process
            self.profiler["by"] = "training code"
            self.warn("the training code runs its own PyTorch profiler: perfdoctor's is not started and this rank "
                      "writes no trace (turn the training's profiler off)")
            return
        self.kineto = KinetoWindow(self.torch, self.run_dir, self.rank)
        self.kineto.start()
        self.profiler.update(by="perfdoctor", started=True, activities=self.kineto.activities)
        if not self.kineto.cuda:
            self.profiler["note"] = "no CUDA in this process: CPU activity only"

    def _stop_kineto(self) -> None:
        """Stop the rank's torch.profiler and export its trace (with the marks and group names)."""
        window = self.kineto
        if window is None or not window.running:
            return
        emitter = self.emitter
        marks = emitter.marks if isinstance(emitter, RecordFunctionEmitter) else []
        self._guarded("group names", self._name_known_groups)()
        path = window.stop_and_export(trace_metadata(marks, self.group_names, self.rank, window.activities))
        self.profiler.update(stopped=True, trace=final_name(path.name), at_step=self.steps_done)

    def _name_known_groups(self) -> None:
        """Names for the groups whose collectives may never pass through Python (DDP's C++ reducer on the
        world group, Megatron's groups used by other libraries), so their NCCL kernels are labelled too."""
        default = self.namer.default_group
        for group in [default, *[g for g, _ in megatron_groups()]]:
            pg_name = getattr(group, "group_name", None)
            if isinstance(pg_name, str):
                self.group_names.setdefault(pg_name, self.namer.name(group))

    def _cudart_call(self, name: str) -> None:
        try:
            getattr(self._cudart(), name)()
        except Exception as exc:  # noqa: BLE001 (no CUDA runtime in this torch: nothing to start)
            self.warn(f"{name} failed ({exc}): the capture window cannot be set by perfdoctor", name)

    def _user_profiler(self, what: str) -> None:
        """The training code starts/stops the profiler itself (Megatron --profile, NeMo NsysCallback)."""
        if self.profiler["by"] is None:
            self.profiler["by"] = "training code"
        if what == "start" and self.active and self.selected:
            # Marks emitted before the capture began are not in the report: emit them again inside it.
            self._marks_done = self._config_done = False
            self._emit_marks()

    def _emit_marks(self) -> None:
        if self._marks_done:
            return
        self._marks_done = True
        self.emitter.mark(f"rank r={self.rank} local={self.local_rank} world={self.world}")

    def _emit_config(self) -> None:
        if self._config_done:
            return
        self._config_done = True
        config = self.parallel_config()
        self.emitter.mark("config " + json.dumps(config, separators=(",", ":"), sort_keys=True))

    # ------------------------------------------------------------------------------- steps
    def on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.active:
            self.activate("optimizer step")
        if not self.selected:
            return
        key = id(optimizer)
        count = self._counts.get(key, 0) + 1
        self._counts[key] = count
        if self._closer is None:
            self._closer = key
        elif key != self._closer:
            if count == self._counts.get(self._closer, 0):  # same iteration, after the closer: it ends them
                self._closer = key
            return
        self._end_step()

    def _end_step(self) -> None:
        """Optimizer iteration ``steps_done`` just finished."""
        finished = self.steps_done
        self.steps_done += 1
        if self._step_handle is not None:
            self.emitter.end(self._step_handle)
            self._step_handle = None
        if self.labelling:
            self._emit_config()
        if self.window is not None and finished == self.window[1]:
            self._close_window()
            return
        if self.window is not None and self.steps_done == self.window[0]:
            self._open_window()
        self._microbatches = {"fwd": 0, "bwd": 0}
        if self.labelling:
            self._step_handle = self.emitter.start(f"step n={self.steps_done}")

    # ------------------------------------------------------------------------------- labels
    def _comm_wrapper(self, fn: Callable[..., Any], op: str) -> Callable[..., Any]:
        try:
            signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            signature = None
        describe = self._guarded("comm label", self._describe)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not self.labelling or getattr(self._tls, "in_comm", False) or signature is None:
                return fn(*args, **kwargs)
            described = describe(op, signature, args, kwargs)
            if described is None:
                return fn(*args, **kwargs)
            label, nbytes, group = described
            pending = getattr(self._tls, "coalescing", None)
            if pending is not None:
                pending.append((op, nbytes, group))
            handle = self.emitter.start(label)
            self._tls.in_comm = True
            try:
                return fn(*args, **kwargs)
            finally:
                self._tls.in_comm = False
                self.emitter.end(handle)

        wrapper.__perfdoctor__ = True  # type: ignore[attr-defined]
        return wrapper

    def _describe(self, op: str, signature: inspect.Signature, args: Any, kwargs: Any) -> tuple[str, int, Any]:
        bound = signature.bind_partial(*args, **kwargs).arguments
        if op == "send_recv":
            ops = list(bound.get("p2p_op_list") or [])
            group = ops[0].group if ops else None
            nbytes = sum(_nbytes(o.tensor) for o in ops)
        else:
            group = bound.get("group")
            nbytes = max((_nbytes(v) for k, v in bound.items() if k != "group"), default=0)
        return self._label(op, group, nbytes), nbytes, group

    def _label(self, op: str, group: Any, nbytes: int) -> str:
        name = self.namer.name(group)
        size = self._group_size(group)
        if self.torch_profiler:
            pg = group if group is not None else self.namer.default_group
            pg_name = getattr(pg, "group_name", None)
            if isinstance(pg_name, str):
                self.group_names.setdefault(pg_name, name)
        return f"comm op={op} group={name} bytes={nbytes} size={size}"

    def _group_size(self, group: Any) -> int:
        try:
            return int(self.torch.distributed.get_world_size(group))
        except Exception:  # noqa: BLE001 (not a member / not initialised)
            return -1

    def _coalescing_wrapper(self, manager: Callable[..., Any]) -> Callable[..., Any]:
        hook = self

        class _Coalesced:
            def __init__(self, inner: Any) -> None:
                self._inner = inner
                self._previous: Any = None

            def __enter__(self) -> Any:
                self._previous = getattr(hook._tls, "coalescing", None)
                hook._tls.coalescing = []
                return self._inner.__enter__()

            def __exit__(self, *exc: Any) -> Any:
                pending = hook._tls.coalescing
                hook._tls.coalescing = self._previous
                handle = None
                if pending and hook.labelling:
                    op, _, group = pending[0]
                    label = hook._guarded("comm label", hook._label)(op, group, sum(p[1] for p in pending))
                    handle = hook.emitter.start(label) if label else None
                try:
                    return self._inner.__exit__(*exc)
                finally:
                    if handle is not None:
                        hook.emitter.end(handle)

        @functools.wraps(manager)
        def coalescing_manager(*args: Any, **kwargs: Any) -> Any:
            return _Coalesced(manager(*args, **kwargs))

        coalescing_manager.__perfdoctor__ = True  # type: ignore[attr-defined]
        return coalescing_manager

    def _microbatch_wrapper(self, fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not self.labelling:
                return fn(*args, **kwargs)
            mb = kwargs.get("current_microbatch")
            if not isinstance(mb, int):
                mb = self._microbatches[kind]
            self._microbatches[kind] += 1
            chunk = kwargs.get("vp_stage")
            label = f"{kind} mb={mb}" + (f" chunk={chunk}" if isinstance(chunk, int) else "")
            self.emitter.push(label)
            try:
                return fn(*args, **kwargs)
            finally:
                self.emitter.pop()

        wrapper.__perfdoctor__ = True  # type: ignore[attr-defined]
        return wrapper

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if not self.labelling:
            return
        try:
            if phase == "start":
                self.emitter.push(f"gc gen={info.get('generation', 0)}")
            elif phase == "stop":
                self.emitter.pop()
        except Exception:  # noqa: BLE001 (never raise inside the collector)
            pass

    # ------------------------------------------------------------------------------- memory
    def start_memory(self, why: str) -> None:
        if not self.memory_wanted or self.memory["status"] != "not started" or self.torch is None:
            if not self.memory_wanted:
                self.memory = {"status": "off", "reason": "--no-memory"}
            return
        rank = self.rank if self.active else env_rank()[0]
        if self.ranks is not None and rank not in self.ranks:
            return
        reason = snapshot.unavailable_reason(self.torch)
        if reason is not None:
            self.memory = {"status": "skipped", "reason": reason}
            return
        snapshot.start_history(self.torch, self.max_entries)
        self.memory = {"status": "recording", "since": why, "max_entries": self.max_entries,
                       "device": int(self.torch.cuda.current_device())}

    def dump_memory(self) -> None:
        if self.memory.get("status") != "recording":
            return
        path = self.run_dir / "memory" / f"rank{self.rank}.pickle"
        try:
            snapshot.dump(self.torch, path)
            snapshot.stop_history(self.torch)
            self.memory.update(status="dumped", path=str(path.relative_to(self.run_dir)), at_step=self.steps_done)
        except Exception as exc:  # noqa: BLE001
            self.memory.update(status="failed", reason=f"{type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------------------- records
    def parallel_config(self) -> dict[str, Any]:
        """DESIGN §4 config keys this process can know: Megatron's parallel state and arguments, GPU name."""
        config: dict[str, Any] = {}
        ps = sys.modules.get("megatron.core.parallel_state")
        if ps is not None:
            for key, getter in (("tp", "get_tensor_model_parallel_world_size"),
                                ("pp", "get_pipeline_model_parallel_world_size"),
                                ("vpp", "get_virtual_pipeline_model_parallel_world_size"),
                                ("cp", "get_context_parallel_world_size"),
                                ("dp", "get_data_parallel_world_size"),
                                ("ep", "get_expert_model_parallel_world_size")):
                value = _safe_call(getattr(ps, getter, None))
                if isinstance(value, int):
                    config[key] = value
        calc = sys.modules.get("megatron.core.num_microbatches_calculator")
        if calc is not None:
            for key, getter in (("num_microbatches", "get_num_microbatches"),
                                ("micro_batch_size", "get_micro_batch_size"),
                                ("global_batch_size", "get_current_global_batch_size")):
                value = _safe_call(getattr(calc, getter, None))
                if isinstance(value, int):
                    config[key] = value
        global_vars = sys.modules.get("megatron.training.global_vars")
        args = _safe_call(getattr(global_vars, "get_args", None)) if global_vars is not None else None
        if args is not None:
            for key, attr in (("seq_length", "seq_length"), ("hidden_size", "hidden_size"),
                              ("num_layers", "num_layers"), ("vocab_size", "padded_vocab_size"),
                              ("sequence_parallel", "sequence_parallel"),
                              ("micro_batch_size", "micro_batch_size"), ("global_batch_size", "global_batch_size")):
                value = getattr(args, attr, None)
                if isinstance(value, (int, bool)) and key not in config:
                    config[key] = value
        gpu = self._gpu_name()
        if gpu:
            config["gpu"] = gpu
        return config

    def _gpu_name(self) -> str | None:
        cuda = getattr(self.torch, "cuda", None)
        try:
            if cuda is not None and cuda.is_available():
                return str(cuda.get_device_name(cuda.current_device()))
        except Exception:  # noqa: BLE001
            return None
        return None

    def write_rank_file(self) -> None:
        """``ranks/rank<R>.json``: who this rank was and what it recorded (read into the manifest)."""
        if not self.active or not self.selected:
            return
        record = {
            "rank": self.rank, "local_rank": self.local_rank, "world_size": self.world,
            "host": socket.gethostname(), "pid": os.getpid(), "python": sys.version.split()[0],
            "gpu": self._gpu_name(), "versions": _versions(self.torch),
            "config": self.parallel_config(), "steps_done": self.steps_done,
            "window": list(self.window) if self.window else None, "profiler": dict(self.profiler),
            "memory": dict(self.memory), "nvtx_backend": self.emitter.backend, "written_at": time.time(),
        }
        path = self.run_dir / "ranks" / f"rank{self.rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(record, indent=2, default=str))
        os.replace(partial, path)

    def finish(self) -> None:
        """At exit: close an open step, dump memory when the window never ended, record the rank."""
        if not self.active or not self.selected:
            return
        if self._step_handle is not None:
            self.emitter.end(self._step_handle)  # an unfinished iteration: ends where the process did
            self._step_handle = None
        if self.labelling:
            self._emit_config()
        self.labelling = False  # nothing is labelled while the profiler stops
        self._guarded("torch.profiler export", self._stop_kineto)()
        if not self._window_done:
            if self.window is not None and self.steps_done <= self.window[1]:
                self.memory.setdefault("note", f"the run ended after {self.steps_done} steps, inside the window")
            self.dump_memory()
        self.write_rank_file()


def _nbytes(value: Any) -> int:
    if hasattr(value, "element_size") and hasattr(value, "numel"):
        return int(value.element_size() * value.numel())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def _safe_call(fn: Callable[[], Any] | None) -> Any:
    if fn is None:
        return None
    try:
        return fn()
    except Exception:  # noqa: BLE001 (not initialised in this run)
        return None


def _versions(torch: Any) -> dict[str, str]:
    found: dict[str, str] = {}
    for package in VERSION_PACKAGES:
        try:
            found[package.replace("-", "_")] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    try:
        nccl = torch.cuda.nccl.version() if torch is not None and torch.cuda.is_available() else None
        if nccl:
            found["nccl"] = ".".join(str(p) for p in nccl) if isinstance(nccl, tuple) else str(nccl)
    except Exception:  # noqa: BLE001
        pass
    return found
