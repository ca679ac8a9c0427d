"""Which training framework ran (DESIGN §5 ``run.framework``): Megatron knobs are the fix only for Megatron.

Evidence, strongest first; the first that speaks decides, and ``source`` says which it was:

1. the capture manifest (``manifest.json`` of ``perfdoctor capture``): the package versions the ranks
   imported (megatron-bridge, nemo_toolkit, megatron-core) and the training command (``pretrain_*.py``
   of Megatron-LM);
2. the capture hook's marks: the hook writes parallel-config keys (tp, pp, num_microbatches, ...) and
   ``fwd``/``bwd`` micro-batch ranges only from ``megatron.core``'s parallel state and schedules;
3. Megatron's own NVTX ranges (``--nvtx-ranges``: ``forward_backward_pipelining...``), Megatron's
   process-group names in a PyTorch profiler trace, and the environment NeMo's launcher sets (``NEMO_*``);
4. PyTorch's fingerprints: ATen / Transformer Engine / c10d kernels, ``aten::`` or ``ProfilerStep#``
   NVTX ranges, the launcher's ``TORCHELASTIC_*`` / ``LOCAL_WORLD_SIZE`` environment → ``pytorch``;
5. nothing → ``unknown`` (an MPI or CUDA application, not a PyTorch program).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from perfdoctor.load.labels import any_message, any_word
from perfdoctor.model import Run, Timeline, TimelineInfo

MANIFEST = "manifest.json"
MANIFEST_MAX_BYTES = 4 << 20
# Config keys the capture hook can only read from megatron.core (capture/hook/runtime.py parallel_config).
MEGATRON_CONFIG_KEYS = ("tp", "pp", "cp", "ep", "vpp", "num_microbatches")
MEGATRON_NVTX = re.compile(r"forward_backward_(no_)?pipelining|megatron", re.IGNORECASE)
# MEGATRON_NVTX as the words it matches: in ASCII text (lower-cased once) they answer as the pattern does,
# without its case-insensitive scan of every position (~7 ms per 300 KB of operator ranges).
MEGATRON_WORDS = ("megatron", "forward_backward_pipelining", "forward_backward_no_pipelining")
HOOK_MICROBATCH = re.compile(r"^(fwd|bwd) mb=\d+")
PYTORCH_NVTX = re.compile(r"^(aten::|ProfilerStep#|autograd::|nccl:)")
PYTORCH_KERNEL = re.compile(r"\bat::native::|\bc10::|transformer_engine::|^cunn_|\bat_cuda_detail::")
FINGERPRINTS = {"hook_microbatch": (HOOK_MICROBATCH, "nvtx"), "megatron_nvtx": (MEGATRON_NVTX, "nvtx"),
                "pytorch_nvtx": (PYTORCH_NVTX, "nvtx"), "pytorch_kernel": (PYTORCH_KERNEL, "kernels")}
PYTORCH_ENV = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
               "PYTORCH_CUDA_ALLOC_CONF", "LOCAL_WORLD_SIZE")


def detect_framework(run: Run) -> dict[str, Any]:
    """``{name, source}`` of the run's framework, from the evidence listed in the module docstring."""
    for check in (_from_manifest, _from_hook, _from_megatron_traces, _from_pytorch):
        found = check(run)
        if found is not None:
            return {"name": found[0], "source": found[1]}
    return {"name": "unknown", "source": "no PyTorch or Megatron fingerprint in the trace"}


def _from_manifest(run: Run) -> tuple[str, str] | None:
    for info in run.traces:
        for folder in (info.path.parent, info.path.parent.parent):
            manifest = _read_manifest(folder / MANIFEST)
            if manifest is None:
                continue
            versions = {str(k).lower().replace("_", "-") for k in (manifest.get("versions") or {})}
            command = " ".join(str(c) for c in manifest.get("command") or [])
            if "megatron-bridge" in versions:
                return "megatron-bridge", "manifest (megatron-bridge imported)"
            if "nemo-toolkit" in versions:
                return "nemo2", "manifest (nemo_toolkit imported)"
            if re.search(r"pretrain_\w+\.py", command):
                return "megatron-lm", "manifest (Megatron-LM pretrain script)"
            if "megatron-core" in versions:
                return "megatron-core", "manifest (megatron-core imported)"
    return None


def _read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        if not path.is_file() or path.stat().st_size > MANIFEST_MAX_BYTES:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _from_hook(run: Run) -> tuple[str, str] | None:
    marked = [k for k in MEGATRON_CONFIG_KEYS if run.config_sources.get(k) == "nvtx-mark"]
    if marked:
        return "megatron-core", f"capture config mark ({', '.join(marked)} from Megatron's parallel state)"
    if _has(run, "hook_microbatch"):
        return "megatron-core", "capture hook's micro-batch ranges (Megatron schedules)"
    return None


def _from_megatron_traces(run: Run) -> tuple[str, str] | None:
    if _has(run, "megatron_nvtx"):
        return "megatron-core", "Megatron NVTX ranges"
    if any(info.config for info in run.traces):  # only Megatron's group descriptions fill it (load.kineto)
        return "megatron-core", "PyTorch profiler process groups (Megatron group names)"
    if _env_has(run, lambda name: name.startswith("NEMO_")):
        return "nemo2", "environment (NEMO_* variables)"
    return None


def _from_pytorch(run: Run) -> tuple[str, str] | None:
    if _has(run, "pytorch_nvtx"):
        return "pytorch", "PyTorch NVTX ranges"
    if _has(run, "pytorch_kernel"):
        return "pytorch", "PyTorch / Transformer Engine kernel names"
    if _env_has(run, lambda name: name in PYTORCH_ENV):
        return "pytorch", "environment (PyTorch launcher variables)"
    return None


def _has(run: Run, fingerprint: str) -> bool:
    """Whether any timeline of the run shows ``fingerprint`` (a TimelineInfo carries what its tables showed)."""
    return any(fingerprint in (tl.fingerprints if isinstance(tl, TimelineInfo) else timeline_fingerprints(tl))
               for tl in run.timelines)


def timeline_fingerprints(tl: Timeline) -> frozenset[str]:
    """Which of ``FINGERPRINTS`` the timeline's NVTX text or kernel names show (computed where the
    timeline is, so a per-rank task sends back the answer, not the tables)."""
    found = set()
    for name, (pattern, where) in FINGERPRINTS.items():
        table = tl.nvtx if where == "nvtx" else tl.kernels
        if not len(table):
            continue
        if where == "nvtx":
            shown = None if pattern is not MEGATRON_NVTX else any_word(table, MEGATRON_WORDS)
            if shown is None:
                shown = any_message(table, pattern)  # all distinct messages in one scan, shared with the labels
        else:
            names = table["demangled_name" if "demangled_name" in table else "short_name"].values
            shown = any(pattern.search(str(v)) for v in names)
        if shown:
            found.add(name)
    return frozenset(found)


def _env_has(run: Run, test: Any) -> bool:
    return any(test(name) for info in run.traces for name in info.env)

