"""Model FLOPs utilisation: the model's useful FLOPs per step over what the GPUs could do in that time.

The FLOPs are Megatron-LM's ``num_floating_point_operations`` (research/megatron.md §5.1), the number
Megatron logs as TFLOP/s/GPU, so perfdoctor's figure can be checked against the training log:

    FLOPs = T·[6·h·(ffn·E·L_dense + moe_ffn·k·E·L_moe + shared_ffn·E·L_moe) + A·L + 6·h·V_pad] + S2·6·Qp·L

with T = B·s tokens, S2 = B·s², E = 3 for SwiGLU else 2, A = 6·(h·(Qp+Kp+Vp) + Qp·h), Qp = kv_channels·heads,
Kp = Vp = kv_channels·query_groups (causal attention counts half the score matrix). Megatron's own defaults
fill what the config does not say (ffn = 4h, no GQA, no SwiGLU, kv_channels = h/heads, vocab padded to a
multiple of 128·tp); every default used is named in ``assumptions`` so the report can show it.

MFU divides by the *dense* tensor peak of the GPU (§5.3; NVIDIA's datasheets print sparse numbers, twice
as high). ``mfu`` uses the BF16 peak, the usual convention even for FP8 runs; ``fp8`` uses the FP8 peak.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# (name pattern, dense BF16 TFLOP/s, dense FP8 TFLOP/s or None); first match wins, so GB200 sits above
# B200 and the H100/H200 PCIe/NVL parts (lower clocks and power, not in the table) above plain H100/H200.
PEAKS: tuple[tuple[re.Pattern[str], float | None, float | None], ...] = (
    (re.compile(r"GB200"), 2500.0, 5000.0),
    (re.compile(r"B200"), 2250.0, 4500.0),
    (re.compile(r"H[12]00.*(?:PCIe|NVL)"), None, None),
    (re.compile(r"H200|H100"), 989.0, 1979.0),  # SXM; GH200's GPU is the same part
    (re.compile(r"A100"), 312.0, None),
)
VOCAB_DIVISIBLE_BY = 128  # Megatron --make-vocab-size-divisible-by default
REQUIRED = ("num_layers", "hidden_size", "seq_length", "vocab_size")


@dataclass(frozen=True)
class Mfu:
    """MFU of one timeline, or why it is unknown (``reason``)."""

    flops_per_step: float | None = None  # model FLOPs of one global batch
    tflops_per_gpu: float | None = None  # achieved model TFLOP/s per GPU
    peak_bf16_tflops: float | None = None
    peak_fp8_tflops: float | None = None
    mfu: float | None = None  # vs dense BF16 peak
    mfu_fp8: float | None = None  # vs dense FP8 peak
    assumptions: list[str] = field(default_factory=list)
    reason: str | None = None


def peak_tflops(gpu_name: str | None) -> tuple[float | None, float | None]:
    """Dense (BF16, FP8) tensor peak in TFLOP/s for a device name; None where not in the table."""
    for pattern, bf16, fp8 in PEAKS:
        if gpu_name and pattern.search(gpu_name):
            return bf16, fp8
    return None, None


def model_flops(config: dict[str, Any]) -> tuple[float | None, list[str], str | None]:
    """Megatron's FLOPs of one training step (forward + backward) for the global batch.

    Returns (flops, defaults assumed, reason it is unknown).
    """
    missing = [k for k in REQUIRED if not config.get(k)]
    batch, batch_note = _global_batch(config)
    if batch is None:
        missing.append("global_batch_size")
    if missing:
        return None, [], f"MFU needs the model config: {', '.join(missing)} unknown (give it with --config)"
    assumed = [batch_note] if batch_note else []

    def get(key: str, default: Any, note: str) -> Any:
        value = config.get(key)
        if value is None:
            assumed.append(note)
            return default
        return value

    layers, h, s = int(config["num_layers"]), int(config["hidden_size"]), int(config["seq_length"])
    if config.get("num_attention_heads"):
        heads = int(config["num_attention_heads"])
        groups = int(get("num_query_groups", heads, "no GQA (query groups = heads)"))
        kv_channels = int(config.get("kv_channels") or h // heads)
        q_proj, kv_proj = kv_channels * heads, kv_channels * groups
    else:
        assumed.append("no GQA (attention heads unknown)")
        q_proj = kv_proj = h
    ffn = int(get("ffn_hidden_size", 4 * h, "ffn_hidden_size = 4·hidden"))
    gate = 3 if get("swiglu", False, "no SwiGLU") else 2
    experts = int(config.get("num_experts") or 0)
    tp = int(config.get("tp") or 1)
    vocab = int(config.get("padded_vocab_size") or _pad(int(config["vocab_size"]), VOCAB_DIVISIBLE_BY * tp))
    tokens, tokens_sq = batch * s, batch * s * s
    attn_linear = 6 * (h * (q_proj + 2 * kv_proj) + q_proj * h)
    if experts:
        topk = int(get("moe_router_topk", 2, "moe_router_topk = 2"))
        moe_ffn = int(get("moe_ffn_hidden_size", ffn, "moe_ffn_hidden_size = ffn_hidden_size"))
        shared = int(config.get("moe_shared_expert_intermediate_size") or 0)
        mlp = 6 * h * (moe_ffn * topk + shared) * gate * layers
    else:
        mlp = 6 * h * ffn * gate * layers
    flops = tokens * (mlp + attn_linear * layers + 6 * h * vocab) + tokens_sq * 6 * q_proj * layers
    return float(flops), assumed, None


def estimate(config: dict[str, Any], gpu_name: str | None, step_ms: float | None, env: dict[str, str],
             ) -> Mfu:
    """MFU for a step time measured on one rank (every rank runs the same step, so this is the run's MFU).

    The world size comes from the config (tp·pp·cp·dp) or, failing that, the captured ``WORLD_SIZE``.
    """
    flops, assumed, reason = model_flops(config)
    if flops is None:
        return Mfu(reason=reason)
    world = _world_size(config, env)
    if world is None:
        return Mfu(flops, assumptions=assumed, reason="MFU needs the world size: dp unknown (give it with --dp)")
    if not step_ms:
        return Mfu(flops, assumptions=assumed, reason="MFU needs the step time: no training steps found")
    tflops = flops / world / (step_ms * 1e-3) / 1e12
    bf16, fp8 = peak_tflops(gpu_name or config.get("gpu"))
    why = None if bf16 else f"no dense peak known for GPU {gpu_name or 'unknown'!r}"
    return Mfu(flops, tflops, bf16, fp8, tflops / bf16 if bf16 else None, tflops / fp8 if fp8 else None,
               assumed, why)


def _global_batch(config: dict[str, Any]) -> tuple[int | None, str | None]:
    if config.get("global_batch_size"):
        return int(config["global_batch_size"]), None
    mbs, m, dp = config.get("micro_batch_size"), config.get("num_microbatches"), config.get("dp")
    if mbs and m and dp:
        return int(mbs) * int(m) * int(dp), "global_batch_size = micro_batch_size·num_microbatches·dp"
    return None, None


def _world_size(config: dict[str, Any], env: dict[str, str]) -> int | None:
    if config.get("dp"):
        return int(config["dp"]) * int(config.get("tp") or 1) * int(config.get("pp") or 1) * int(config.get("cp") or 1)
    value = env.get("WORLD_SIZE", "")
    return int(value) if value.strip().isdigit() else None


def _pad(vocab: int, multiple: int) -> int:
    return -(-vocab // multiple) * multiple
