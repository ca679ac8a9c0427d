"""Kernel mix: family shares, unfused patterns, attention implementation, MoE GEMMs, exposed host copies."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from perfdoctor import api
from perfdoctor.classify.timeline import category_mask, kernel_classes
from perfdoctor.load.run import load_run
from perfdoctor.measure import intervals as iv
from perfdoctor.measure.kernel_mix import mix_evidence, mix_per_step, unfused_kind, unfused_kinds
from perfdoctor.measure.steps import Steps
from perfdoctor.model import Timeline, TraceInfo
from perfdoctor.synth import run_scenario
from perfdoctor.table import Strings, Table
from tests.paths import REPO, SAMPLES


@pytest.fixture(scope="module")
def samples() -> dict[str, dict]:
    return {s: api.analyze([SAMPLES / s]).metrics["ranks"]["0"]
            for s in ("clean_baseline", "host_bound", "moe_ep", "exposed_tp")}


@pytest.mark.parametrize(("short", "demangled", "kind"), [
    ("scaled_upper_triang_masked_softmax_warp_forward", None, "softmax"),
    ("cunn_SoftMaxForward", "void at::native::<unnamed>::cunn_SoftMaxForward<8, float, float, float, "
     "at::native::<unnamed>::LogSoftMaxForwardEpilogue>(T4 *, const T2 *, int)", "cross_entropy"),
    ("nll_loss_forward_reduce_cuda_kernel_2d", None, "cross_entropy"),
    ("online_softmax_kernel", None, None),  # TE's fused cross-entropy (Triton)
    # torch.compile (Inductor) fuses log-softmax and NLL into its own reductions (tests/data/h100/gpt_compiled)
    ("triton_red_fused__log_softmax__to_copy__unsafe_view_nll_loss_forward_sub_view_17", None, None),
    ("triton_per_fused__to_copy_add_embedding_dense_backward_native_layer_norm_native_layer_norm_backward_nll_loss_f",
     None, None),
    ("triton_red_log_softmax_nll_loss_kernel", None, "cross_entropy"),  # hand-written Triton, not Inductor's fusion
    ("fused_dropout_kernel_vec", None, "dropout"),
    ("triton_poi_fused_add_native_dropout_0", None, None),
    ("triton_poi_fused_native_dropout_backward_0", None, None),
    ("vectorized_elementwise_kernel", "void at::native::vectorized_elementwise_kernel<4, "
     "at::native::GeluCUDAKernelImpl(at::TensorIteratorBase &, at::native::GeluType)::[lambda() (instance 2)]"
     "::operator ()() const::[lambda(c10::BFloat16) (instance 1)], at::detail::Array<char *, 2>>(int, T2, T3)",
     "bias_activation"),
    ("gated_act_kernel", "void transformer_engine::gated_act_kernel<4, true, float>(const __nv_bfloat16 *)", None),
    ("fused_rope_forward_kernel", None, None),
    ("rotary_embedding_kernel", None, "rope"),
    ("flash_fwd_kernel", None, None),
    ("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNN", None, None),
])
def test_unfused_kinds_by_name(short: str, demangled: str | None, kind: str | None) -> None:
    assert unfused_kind(short, demangled) == kind


def test_family_shares_are_fractions_of_the_step(samples: dict[str, dict]) -> None:
    for name, m in samples.items():
        shares = [m[f"kernels.{f}_fraction"] for f in ("gemm", "attention", "norm", "elementwise", "optimizer")]
        assert all(0 <= s <= 1 for s in shares), name
        assert sum(shares) <= m["compute.fraction"] + 1e-9, name  # disjoint kernel families inside compute
    assert samples["host_bound"]["kernels.attention_fraction"] == 0  # unfused: BMM GEMMs + softmax
    assert samples["clean_baseline"]["kernels.attention_fraction"] > 0.05


def test_host_bound_unfused_vs_clean(samples: dict[str, dict]) -> None:
    hb, clean = samples["host_bound"], samples["clean_baseline"]
    for kind in ("softmax", "dropout"):
        assert hb[f"kernels.unfused.{kind}_ms"] > 0.1
        assert clean[f"kernels.unfused.{kind}_ms"] == 0
    # Both compute the loss as log-softmax + NLL (PyTorch cross-entropy): that is unfused in both.
    assert hb["kernels.unfused.cross_entropy_ms"] > 0 and clean["kernels.unfused.cross_entropy_ms"] > 0
    assert hb["kernels.unfused_ms"] > clean["kernels.unfused_ms"]
    whole = _mix(SAMPLES / "host_bound")  # one window-long step: the union equals the sum of serial kernels
    assert whole.unfused_total_ns[0] == pytest.approx(sum(v[0] for v in whole.unfused_ns.values()), rel=1e-9)
    # GELU as a PyTorch functor (no bias-GELU fusion) in the LayerNorm/GELU model
    assert samples["exposed_tp"]["kernels.unfused.bias_activation_ms"] > 0
    assert clean["kernels.unfused.bias_activation_ms"] == 0  # TE's fused SwiGLU


def _mix(directory: Path):
    run = load_run([directory])
    tl = run.timelines[0]
    kcls = kernel_classes(tl.kernels)
    start, end = int(tl.kernels["start"].min()), int(tl.kernels["end"].max())
    per_step = mix_per_step(tl, kcls, Steps(np.array([start]), np.array([end]), "window"), _compute(tl, kcls),
                            unfused_kinds(tl.kernels)[0])
    return SimpleNamespace(**vars(per_step), **vars(mix_evidence(tl, kcls)))


def _compute(tl: Timeline, kcls: Table) -> iv.Intervals:
    """The union of the compute (non-comm) kernels, as ``Activity.compute`` has it."""
    compute = ~category_mask(kcls, "comm")
    return iv.union(tl.kernels.col("start")[compute], tl.kernels.col("end")[compute])


def test_attention_implementation() -> None:
    assert _mix(SAMPLES / "clean_baseline").attention == "flash"
    assert _mix(SAMPLES / "exposed_tp").attention == "cudnn"
    hb = _mix(SAMPLES / "host_bound")
    assert hb.attention == "unfused" and "softmax" in hb.attention_evidence


def test_moe_per_expert_vs_grouped_gemm(samples: dict[str, dict], tmp_path: Path) -> None:
    per_expert = _mix(SAMPLES / "moe_ep")
    assert per_expert.moe_gemm == "per_expert"
    assert per_expert.moe_gemm_launches == 4  # 8 experts / EP 4 = 2 local experts × (fc1, fc2)
    assert samples["moe_ep"]["moe.expert_gemm_launches"] == 4
    assert samples["clean_baseline"]["moe.expert_gemm_launches"] is None
    raw = yaml.safe_load((REPO / "perfdoctor/synth/scenarios/moe_ep.yaml").read_text())
    raw["model"].update(grouped_gemm=True, layers=2)
    raw["run"]["steps"] = 1
    run_scenario(raw, tmp_path)
    grouped = _mix(tmp_path)
    assert grouped.moe_gemm == "grouped" and "GroupProblemShape" in grouped.moe_evidence
    assert grouped.moe_gemm_launches == 2


def _timeline(kernels: list[tuple[int, int, str]], copies: list[tuple[int, int, int]]) -> Timeline:
    names = Strings.encode([n for *_, n in kernels])
    k = Table({"start": np.array([s for s, _, _ in kernels], dtype=np.int64),
               "end": np.array([e for _, e, _ in kernels], dtype=np.int64),
               "short_name": names, "demangled_name": names})
    cp = Table({"start": np.array([s for s, _, _ in copies], dtype=np.int64),
                "end": np.array([e for _, e, _ in copies], dtype=np.int64),
                "copy_kind": np.array([c for *_, c in copies], dtype=np.int64)})
    trace = TraceInfo(Path("x.sqlite"), "nsys-sqlite", None, None, "META_DATA_EXPORT", None, True)
    empty = Table()
    return Timeline(trace, 1, 1, 0, k, cp, empty, empty, empty, empty)


def test_exposed_host_copies() -> None:
    """HtoD/DtoH copies count where no compute kernel runs; DtoD and copies under compute do not;
    a copy under an NCCL kernel is still exposed (communication is not compute)."""
    gemm, nccl = "nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNN", "ncclDevKernel_AllGather_RING_LL"
    tl = _timeline(
        [(0, 100, gemm), (300, 400, nccl), (1000, 1100, gemm)],
        [(50, 150, 1), (200, 250, 2), (320, 380, 1), (500, 900, 8), (1050, 1100, 2)],
    )
    kcls = kernel_classes(tl.kernels)
    mix = mix_per_step(tl, kcls, Steps(np.array([0, 600]), np.array([600, 1200]), "nvtx-step"), _compute(tl, kcls),
                       unfused_kinds(tl.kernels)[0])
    # step 0: 100..150 (50) + 200..250 (50) + 320..380 under NCCL (60); step 1: copy under the GEMM
    assert mix.memcpy_exposed_ns.tolist() == [160.0, 0.0]
