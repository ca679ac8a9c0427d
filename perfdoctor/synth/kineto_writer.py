"""Write one simulated rank as a PyTorch profiler (Kineto) trace, the twin of its nsys export.

The same recorder rows the SQLite writer uses become the events ``torch.profiler`` writes
(``perfdoctor.load.kineto`` documents the mapping it reads back): kernels with their demangled names,
streams and correlation ids; NCCL kernels (not userbuffers or DeepEP ones, which no process group
launches) carry ``Process Group Name/Description/Ranks`` and ``Group
size`` as recent PyTorch records them, Megatron's group descriptions included; copies and fills named
as Kineto names them; CUDA runtime/driver calls; perfdoctor's NVTX labels become what a PyTorch
profile holds instead — ``ProfilerStep#N`` for ``step``, ``enumerate(DataLoader)#...`` for ``data``,
``nccl:<op>`` for ``comm`` — and labels with no PyTorch counterpart (GC, NCCL's own NVTX ranges, the
capture marks) are left out, as a real profile would lack them. ``distributedInfo`` carries rank,
world size and the Megatron process groups with their sizes. Times keep nanosecond precision
(``ts`` is written as microseconds with three decimals, relative to ``baseTimeNanoseconds``).

The layout is the one PyTorch writes (one indented block per event), so the loader's streaming path is
the one exercised.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import IO, Any

import numpy as np

from perfdoctor.synth.gpu import GpuModel
from perfdoctor.synth.kernels import KernelTable
from perfdoctor.synth.recorder import GROUP_NAMES, MEM_DEVICE, MEM_PINNED, NVTX_MARK, RankRecorder
from perfdoctor.synth.scenario import Scenario

# Megatron's process-group descriptions (megatron/core/parallel_state.py), as new_group(group_desc=...) names them.
GROUP_DESCRIPTIONS = {"dp": "DATA_PARALLEL_GROUP_WITH_CP", "tp": "TENSOR_MODEL_PARALLEL_GROUP",
                      "cp": "CONTEXT_PARALLEL_GROUP", "pp": "PIPELINE_MODEL_PARALLEL_GROUP",
                      "ep": "EXPERT_MODEL_PARALLEL_GROUP"}
COPY_NAMES = {1: "HtoD", 2: "DtoH", 8: "DtoD", 10: "PtoP"}
MEMORY_NAMES = {0: "Pageable", MEM_PINNED: "Pinned", MEM_DEVICE: "Device"}
DATA_RANGE = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
_API_VERSION = "_v"


def _us(ns: int) -> str:
    """Exact microseconds with three decimals (a float would round epoch-sized values)."""
    sign = "-" if ns < 0 else ""
    ns = abs(int(ns))
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


def _event(out: IO[str], first: list[bool], fields: dict[str, Any], args: dict[str, Any] | None = None) -> None:
    """One event block in PyTorch's layout; ``ts``/``dur`` values are pre-formatted numbers."""
    body = ", ".join(f'"{k}": {v if k in ("ts", "dur") else json.dumps(v)}' for k, v in fields.items())
    if args is not None:
        pairs = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in args.items())
        body += ',\n    "args": {\n      ' + pairs + "\n    }"
    out.write(("\n  {\n    " if first[0] else ",\n  {\n    ") + body + "\n  }")
    first[0] = False


def write_kineto(path: Path, sc: Scenario, rank: int, local: int, pid: int, rec: RankRecorder, table: KernelTable,
                 gpu: GpuModel, offset_ns: int, session_utc_ns: int) -> None:
    """Write ``rec`` (global rank ``rank`` on device ``local``, host process ``pid``) as gzipped Kineto JSON;
    times are shifted by ``-offset_ns`` and ``baseTimeNanoseconds`` is ``session_utc_ns``."""
    sizes = {"dp": sc.parallel["dp"] * sc.parallel["cp"], "tp": sc.parallel["tp"], "cp": sc.parallel["cp"],
             "pp": sc.parallel["pp"], "ep": sc.parallel["ep"]}
    # Every rank creates every group, so PyTorch's group names are the same on all ranks and differ
    # between instances (the DP group of ranks 0-1 is not that of ranks 2-3): one number per instance.
    pg_config = [{"pg_name": str(1 + i * sc.world_size + min(sc.group_ranks(g, rank))),
                  "pg_desc": GROUP_DESCRIPTIONS[g], "backend_config": "cuda:nccl",
                  "pg_size": sizes[g], "ranks": list(sc.group_ranks(g, rank))}
                 for i, g in enumerate(GROUP_DESCRIPTIONS) if sizes[g] > 1]
    header = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": local, "name": gpu.name, "totalGlobalMem": 85_520_809_984, "computeMajor": 9,
                              "computeMinor": 0, "numSms": gpu.sm_count}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": sc.world_size,
                            "pg_count": len(pg_config), "pg_config": pg_config},
    }
    pg_name = {g["pg_desc"]: g["pg_name"] for g in pg_config}
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=6) as out:
        out.write("{\n" + json.dumps(header, indent=2)[2:-2] + ',\n  "traceEvents": [')
        first = [True]
        _metadata(out, first, pid, local)
        _kernels(out, first, rec, table, local, offset_ns, sizes, pg_name)
        _copies(out, first, rec, local, offset_ns)
        _api(out, first, rec, pid, offset_ns)
        _ranges(out, first, rec, pid, offset_ns)
        out.write(f'\n  ],\n  "traceName": "{path.name}",\n  "baseTimeNanoseconds": {session_utc_ns}\n}}\n')


def _metadata(out: IO[str], first: list[bool], pid: int, local: int) -> None:
    _event(out, first, {"name": "process_name", "ph": "M", "ts": "0", "pid": pid, "tid": 0}, {"name": "python3"})
    _event(out, first, {"name": "process_labels", "ph": "M", "ts": "0", "pid": local, "tid": 0},
           {"labels": f"GPU {local}"})
    _event(out, first, {"name": "thread_name", "ph": "M", "ts": "0", "pid": pid, "tid": pid},
           {"name": f"thread {pid} (python3)"})


def _kernels(out: IO[str], first: list[bool], rec: RankRecorder, table: KernelTable, local: int, offset_ns: int,
             sizes: dict[str, int], pg_name: dict[str, str]) -> None:
    k = rec.kernel_arrays()
    for i in np.argsort(k["start"], kind="stable"):
        spec = table.specs[int(k["spec"][i])]
        args: dict[str, Any] = {"device": local, "context": 1, "stream": int(k["stream"][i]),
                                "correlation": int(k["corr"][i]), "grid": list(spec.grid), "block": list(spec.block)}
        group = GROUP_NAMES.get(int(k["group"][i]), "")
        if spec.is_comm and group and spec.short.startswith("nccl"):  # ProcessGroupNCCL's kernels only
            desc = GROUP_DESCRIPTIONS[group]
            args.update({"Group size": sizes[group], "dtype": "BFloat16",
                         "Process Group Name": pg_name.get(desc, "0"), "Process Group Description": desc})
        _event(out, first, {"ph": "X", "cat": "kernel", "name": spec.demangled, "pid": local,
                            "tid": int(k["stream"][i]), "ts": _us(int(k["start"][i]) - offset_ns),
                            "dur": _us(int(k["end"][i] - k["start"][i]))}, args)


def _copies(out: IO[str], first: list[bool], rec: RankRecorder, local: int, offset_ns: int) -> None:
    for s, e, stream, corr, nbytes, kind, src, dst in zip(rec.c_start, rec.c_end, rec.c_stream, rec.c_corr,
                                                          rec.c_bytes, rec.c_kind, rec.c_src, rec.c_dst):
        name = f"Memcpy {COPY_NAMES.get(kind, 'DtoD')} ({MEMORY_NAMES.get(src, 'Device')} -> " \
               f"{MEMORY_NAMES.get(dst, 'Device')})"
        _event(out, first, {"ph": "X", "cat": "gpu_memcpy", "name": name, "pid": local, "tid": stream,
                            "ts": _us(s - offset_ns), "dur": _us(e - s)},
               {"device": local, "context": 1, "stream": stream, "correlation": corr, "bytes": nbytes})
    for s, e, stream, corr, nbytes in zip(rec.f_start, rec.f_end, rec.f_stream, rec.f_corr, rec.f_bytes):
        _event(out, first, {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": local, "tid": stream,
                            "ts": _us(s - offset_ns), "dur": _us(e - s)},
               {"device": local, "context": 1, "stream": stream, "correlation": corr, "bytes": nbytes})


def _api(out: IO[str], first: list[bool], rec: RankRecorder, pid: int, offset_ns: int) -> None:
    for s, e, corr, name in zip(rec.r_start, rec.r_end, rec.r_corr, rec.r_name):
        base = name.split(_API_VERSION)[0] if _API_VERSION in name else name
        cat = "cuda_runtime" if base.startswith("cuda") else "cuda_driver"
        _event(out, first, {"ph": "X", "cat": cat, "name": base, "pid": pid, "tid": pid, "ts": _us(s - offset_ns),
                            "dur": _us(e - s)}, {"cbid": 0, "correlation": corr})


def _ranges(out: IO[str], first: list[bool], rec: RankRecorder, pid: int, offset_ns: int) -> None:
    """perfdoctor labels → what PyTorch's profiler records in their place; others stay user annotations."""
    for s, e, etype, text, domain in rec.nvtx:
        if etype == NVTX_MARK or e is None or domain == "NCCL":
            continue
        if domain == "perfdoctor":
            kind, _, rest = text.partition(" ")
            fields = dict(t.split("=", 1) for t in rest.split() if "=" in t)
            name = {"step": f"ProfilerStep#{fields.get('n', 0)}", "data": DATA_RANGE,
                    "comm": f"nccl:{fields.get('op', 'unknown')}"}.get(kind)
            if name is None:  # gc (not visible to the profiler), fwd/bwd micro-batch labels
                continue
        else:
            name = text
        _event(out, first, {"ph": "X", "cat": "user_annotation", "name": name, "pid": pid, "tid": pid,
                            "ts": _us(s - offset_ns), "dur": _us(e - s)}, {})
