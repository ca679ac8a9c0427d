"""MFU: Megatron's FLOPs formula against hand-computed numbers, the peak table, and a simulated run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from perfdoctor import api
from perfdoctor.measure.mfu import estimate, model_flops, peak_tflops
from tests.paths import SAMPLES


def test_dense_gpt_matches_the_closed_form() -> None:
    """No GQA, ffn = 4h, GELU: 72·B·s·L·h²·(1 + s/(12h) + V/(12·L·h)) (research/megatron.md §5.1)."""
    config = {"num_layers": 24, "hidden_size": 2048, "seq_length": 2048, "vocab_size": 51200,
              "global_batch_size": 512}
    flops, assumed, reason = model_flops(config)
    assert reason is None
    assert flops == pytest.approx(8_892_850_045_452_288, rel=1e-12)  # 72·512·2048·24·2048²·(1 + 1/12 + 25/288)
    assert any("4·hidden" in a for a in assumed) and any("SwiGLU" in a for a in assumed)


def test_llama3_8b_matches_nemo_formula() -> None:
    """GQA + SwiGLU: NeMo's llama3 formula gbs·s·L·h²·(12 + 12g/n + 18·ffn/h + 6s/h + 6V/(L·h))."""
    config = {"num_layers": 32, "hidden_size": 4096, "seq_length": 8192, "vocab_size": 128256,
              "global_batch_size": 1, "num_attention_heads": 32, "num_query_groups": 8,
              "ffn_hidden_size": 14336, "swiglu": True, "tp": 1}
    flops, assumed, _ = model_flops(config)
    assert flops == pytest.approx(421_645_529_382_912, rel=1e-12)
    assert assumed == []


def test_moe_counts_topk_experts_and_shared_expert() -> None:
    h, s, layers, v = 1024, 1024, 2, 1024
    config = {"num_layers": layers, "hidden_size": h, "seq_length": s, "vocab_size": v, "global_batch_size": 2,
              "num_attention_heads": 8, "num_query_groups": 8, "swiglu": True, "num_experts": 8,
              "moe_router_topk": 2, "moe_ffn_hidden_size": 512, "moe_shared_expert_intermediate_size": 256,
              "ffn_hidden_size": 4096}
    tokens = 2 * s
    per_token = 6 * h * (512 * 2 + 256) * 3 * layers + 6 * (h * 3 * h + h * h) * layers + 6 * h * v
    assert model_flops(config)[0] == pytest.approx(tokens * per_token + 2 * s * s * 6 * h * layers, rel=1e-12)


def test_vocab_is_padded_like_megatron() -> None:
    base = {"num_layers": 1, "hidden_size": 128, "seq_length": 16, "global_batch_size": 1}
    padded = model_flops({**base, "vocab_size": 128256, "tp": 8})[0]
    exact = model_flops({**base, "vocab_size": 129024, "tp": 8})[0]  # next multiple of 128·8
    assert padded == exact
    assert model_flops({**base, "padded_vocab_size": 128256, "vocab_size": 1, "tp": 8})[0] < padded


@pytest.mark.parametrize(("name", "bf16", "fp8"), [
    ("NVIDIA H100 80GB HBM3", 989.0, 1979.0),
    ("NVIDIA H200", 989.0, 1979.0),
    ("NVIDIA A100-SXM4-80GB", 312.0, None),
    ("NVIDIA B200", 2250.0, 4500.0),
    ("NVIDIA GB200", 2500.0, 5000.0),
    ("NVIDIA H100 PCIe", None, None),
    ("Tesla V100-SXM2-32GB", None, None),
    (None, None, None),
])
def test_dense_peaks(name: str | None, bf16: float | None, fp8: float | None) -> None:
    assert peak_tflops(name) == (bf16, fp8)


def test_unknown_config_says_what_is_missing() -> None:
    result = estimate({"tp": 2, "dp": 4}, "NVIDIA H100 80GB HBM3", 100.0, {})
    assert result.mfu is None and result.tflops_per_gpu is None
    assert "num_layers" in result.reason and "hidden_size" in result.reason


def test_world_size_from_environment_and_unknown_gpu() -> None:
    config = {"num_layers": 24, "hidden_size": 2048, "seq_length": 2048, "vocab_size": 51200,
              "global_batch_size": 512}
    result = estimate(config, "Tesla V100", 1000.0, {"WORLD_SIZE": "64"})
    assert result.tflops_per_gpu == pytest.approx(8_892_850_045_452_288 / 64 / 1e12)
    assert result.mfu is None and "V100" in result.reason
    assert estimate(config, "NVIDIA H100 80GB HBM3", 1000.0, {}).reason.startswith("MFU needs the world size")


def test_simulated_run_mfu_from_truth() -> None:
    """The sample's config mark and measured step time give Megatron's TFLOP/s/GPU and MFU vs 989."""
    truth = json.loads(next((SAMPLES / "clean_baseline").glob("*.truth.json")).read_text())
    c = truth["config"]
    step_s = float(np.median([s["step_ms"] for s in truth["ranks"]["0"]["steps"]])) / 1e3
    h, s, layers, v = c["hidden_size"], c["seq_length"], c["num_layers"], c["vocab_size"]
    tokens = c["global_batch_size"] * s
    # GQA + SwiGLU from the mark (Megatron's num_floating_point_operations); vocab 32000 already divisible
    q = h  # kv_channels · heads
    kv = h // c["num_attention_heads"] * c["num_query_groups"]
    per_token_layer = 6 * (h * (q + 2 * kv) + q * h) + 6 * h * c["ffn_hidden_size"] * 3 + 6 * s * q
    flops = tokens * (layers * per_token_layer + 6 * h * v)
    world = c["tp"] * c["pp"] * c["cp"] * c["dp"]
    want_tflops = flops / world / step_s / 1e12
    m = api.analyze([SAMPLES / "clean_baseline"]).metrics["ranks"]["0"]
    assert m["model.tflops_per_gpu"] == pytest.approx(want_tflops, rel=1e-3)
    assert m["mfu"] == pytest.approx(want_tflops / 989.0, rel=1e-3)
    assert m["mfu.fp8"] == pytest.approx(want_tflops / 1979.0, rel=1e-3)
    assert 0 < m["mfu"] < 1


def test_config_from_the_command_line_refines_the_estimate() -> None:
    gated = api.analyze([SAMPLES / "clean_baseline"]).metrics["all"]["mfu"]
    plain = api.analyze([SAMPLES / "clean_baseline"], {"swiglu": False}).metrics["all"]["mfu"]
    assert gated > plain  # the command line wins over the mark; SwiGLU MLPs do 3/2 the MLP FLOPs
