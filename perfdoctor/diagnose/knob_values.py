"""Knob values and what-if estimates computed from the run (DESIGN §5, §6): data in, literal out.

A rule's knob gives its ``value`` as a literal or as ``{compute: NAME}``, one of the named computations
below; its ``what_if`` as ``{metric, times, scale}`` over run values or ``{compute: NAME}``. Each
computation is a pure function of the values a rule can read (``Context.resolve``) and returns a literal
of the knob's type, or ``None`` when the run does not tell: the renderer then writes a typed placeholder
in a comment instead of a value that would be accepted and break the run. Nothing here evaluates code.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, Protocol

from perfdoctor.diagnose.conditions import as_number

# A literal value is a bool, a number, or a token with no spaces (an enum member, a choice): never prose.
TOKEN = re.compile(r"^[A-Za-z0-9_.:+\-/,=]+$")
TYPES = ("int", "float", "bool", "str")
# DP collectives shorter than this are latency-bound (dp-small-buckets' own threshold): the bucket that
# makes the median collective this long carries enough bytes that the per-call latency stops dominating.
LATENCY_BOUND_US = 300.0
# Megatron-Core's default bucket: max(40M, 1M x DP) parameters (research/megatron.md §4 row 4).
DEFAULT_BUCKET_PARAMS, BUCKET_PARAMS_PER_DP = 40_000_000, 1_000_000


class Source(Protocol):
    def resolve(self, name: str) -> Any: ...


def _num(src: Source, name: str) -> float | None:
    return as_number(src.resolve(name))


def _layers_per_stage(src: Source) -> int | None:
    layers, pp = _num(src, "config.num_layers"), _num(src, "config.pp")
    if not layers or not pp or layers % pp:
        return None
    return int(layers // pp)


def vpp_size(src: Source) -> int | None:
    """The smallest virtual-pipeline size >= 2 that divides the layers per stage (every virtual stage
    gets the same number of layers, which Megatron requires)."""
    per_stage = _layers_per_stage(src)
    if per_stage is None:
        return None
    return next((v for v in range(2, per_stage + 1) if per_stage % v == 0), None)


def layers_per_virtual_stage(src: Source) -> int | None:
    """Megatron-LM's ``--num-layers-per-virtual-pipeline-stage``: layers per virtual stage (not a count)."""
    per_stage, v = _layers_per_stage(src), vpp_size(src)
    return None if per_stage is None or v is None else per_stage // v


def _bubble(p: float, v: float, m: float) -> float:
    return (p - 1) / (v * m + p - 1)


def global_batch_for_4pp_microbatches(src: Source) -> int | None:
    """A global batch with 4 x PP micro-batches per step (bubble (p-1)/(4p+p-1) < 20 %)."""
    p, mbs, dp = _num(src, "config.pp"), _num(src, "config.micro_batch_size"), _num(src, "config.dp")
    if not p or not mbs or not dp:
        return None
    return int(4 * p * mbs * dp)


def dp_bucket_size(src: Source) -> int | None:
    """A DP bucket (parameters) large enough that the median DP collective leaves the latency-bound range:
    the current bucket times LATENCY_BOUND_US / median collective time, rounded up to a whole factor."""
    median_us = _num(src, "comm.dp.median_kernel_us")
    if not median_us or median_us <= 0:
        return None
    current = _num(src, "config.bucket_size")
    if not current:
        dp = _num(src, "config.dp")
        if not dp:
            return None
        current = max(DEFAULT_BUCKET_PARAMS, BUCKET_PARAMS_PER_DP * dp)
    return int(current * max(2, math.ceil(LATENCY_BOUND_US / median_us)))


def ln_sm_margin(src: Source) -> int | None:
    """SMs to leave free for NCCL: the CTAs of the widest NCCL kernel that blocked a norm (each CTA holds
    at least one SM while it runs), rounded up to a multiple of 4."""
    ctas = _num(src, "evidence.ln.blocker_ctas")
    if not ctas or ctas <= 0:
        return None
    return int(4 * math.ceil(ctas / 4))


def max_connections(src: Source) -> int | None:
    """CUDA_DEVICE_MAX_CONNECTIONS for TP/CP overlap: 1 before Blackwell (launch order = execution order)."""
    cc = _num(src, "device.compute_capability")
    return 1 if cc is None or cc < 10 else None


def _half(name: str) -> Callable[[Source], int | None]:
    def half(src: Source) -> int | None:
        value = _num(src, name)
        return int(value // 2) if value and value >= 2 else None
    half.__doc__ = f"Half the current {name.split('.')[-1]} (one step smaller in a power-of-two mapping)."
    return half


def double_micro_batch(src: Source) -> int | None:
    """Twice the current micro-batch size (one step larger; the trace cannot tell what fits in memory)."""
    mbs = _num(src, "config.micro_batch_size")
    return int(2 * mbs) if mbs else None


def layers_per_stage(src: Source) -> int | None:
    """Transformer layers per pipeline stage (all of a stage's layers)."""
    if _num(src, "config.pp") is None and (layers := _num(src, "config.num_layers")):
        return int(layers)
    return _layers_per_stage(src)


def seq_length(src: Source) -> int | None:
    value = _num(src, "config.seq_length")
    return int(value) if value else None


def gpus_per_node(src: Source) -> int | None:
    """GPUs of one NVLink domain: the launcher's LOCAL_WORLD_SIZE, else the configured GPUs per node."""
    value = _num(src, "env.LOCAL_WORLD_SIZE") or _num(src, "config.gpus_per_node")
    return int(value) if value else None


def fewer_offloaded_layers(src: Source) -> int | None:
    """Half the offloaded layers (rounded down), so the copies fit under the compute they hide behind."""
    value = _num(src, "config.cpu_offloading_num_layers")
    return int(value // 2) if value and value >= 1 else None


def nccl_max_ctas(src: Source) -> int | None:
    """NCCL's CTA cap that fits inside the SM margin already set."""
    margin = _num(src, "env.NVTE_FWD_LAYERNORM_SM_MARGIN") or _num(src, "env.NVTE_BWD_LAYERNORM_SM_MARGIN")
    return int(margin) if margin and margin >= 1 else None


COMPUTE: dict[str, Callable[[Source], Any]] = {
    "half_tp": _half("config.tp"),
    "half_cp": _half("config.cp"),
    "half_pp": _half("config.pp"),
    "double_micro_batch": double_micro_batch,
    "layers_per_stage": layers_per_stage,
    "seq_length": seq_length,
    "gpus_per_node": gpus_per_node,
    "fewer_offloaded_layers": fewer_offloaded_layers,
    "nccl_max_ctas": nccl_max_ctas,
    "vpp_size": vpp_size,
    "layers_per_virtual_stage": layers_per_virtual_stage,
    "global_batch_for_4pp_microbatches": global_batch_for_4pp_microbatches,
    "dp_bucket_size": dp_bucket_size,
    "ln_sm_margin": ln_sm_margin,
    "max_connections": max_connections,
}


def _path_bubble(src: Source) -> float | None:
    """The pipeline bubble on the critical path: the waiting for the producing stage up to the schedule's
    theory (blocking.pipeline_theory_ms), or all of it when the schedule was unknown to the join."""
    theory, wait = _num(src, "blocking.pipeline_theory_ms"), _num(src, "blocking.pipeline_wait_ms")
    return None if theory is None or wait is None else theory + wait


def bubble_after_vpp(src: Source) -> float | None:
    """Bubble theory with the proposed VPP: the bubble on the critical path x (1 - theory(v') / theory(v))."""
    bubble, p, m = _path_bubble(src), _num(src, "config.pp"), _num(src, "config.num_microbatches")
    v_new = vpp_size(src)
    if bubble is None or not p or not m or v_new is None:
        return None
    v = _num(src, "config.vpp") or 1
    return bubble * (1 - _bubble(p, v_new, m) / _bubble(p, v, m))


def bubble_after_more_microbatches(src: Source) -> float | None:
    """Bubble theory with 4 x PP micro-batches: the bubble on the critical path x (1 - theory(m') / theory(m))."""
    bubble, p, m = _path_bubble(src), _num(src, "config.pp"), _num(src, "config.num_microbatches")
    if bubble is None or not p or not m or m >= 4 * p:
        return None
    v = _num(src, "config.vpp") or 1
    return bubble * (1 - _bubble(p, v, 4 * p) / _bubble(p, v, m))


ESTIMATE: dict[str, Callable[[Source], float | None]] = {
    "bubble_after_vpp": bubble_after_vpp,
    "bubble_after_more_microbatches": bubble_after_more_microbatches,
}


def literal_problem(value: Any, kind: str | None) -> str | None:
    """Why ``value`` is not a literal of type ``kind`` (None when it is)."""
    if value is None or isinstance(value, dict):
        return None
    if isinstance(value, str) and not TOKEN.match(value):
        return f"value {value!r} is prose, not a literal (put prose in note)"
    if kind is None:
        return None
    ok = {"int": isinstance(value, int) and not isinstance(value, bool),
          "float": isinstance(value, (int, float)) and not isinstance(value, bool),
          "bool": isinstance(value, bool), "str": isinstance(value, str)}[kind]
    return None if ok else f"value {value!r} is not of type {kind}"


def resolve_value(spec: Any, src: Source) -> Any:
    """The literal a knob's ``value`` (or ``flag_value``) spec stands for in this run (None: unknown)."""
    if isinstance(spec, dict):
        return COMPUTE[spec["compute"]](src)
    return spec


def estimate(spec: dict[str, Any] | None, src: Source, impact: Callable[[dict[str, Any], Source], float | None],
             cap: float | None) -> float | None:
    """ms per step a knob is expected to save: a named estimate or a metric product, at most ``cap``
    (the finding's impact: a knob cannot save more time than the problem costs)."""
    if not spec:
        return None
    value = ESTIMATE[spec["compute"]](src) if "compute" in spec else impact(spec, src)
    if value is None:
        return None
    value = max(0.0, value)
    return round(min(value, cap) if cap is not None else value, 3)
