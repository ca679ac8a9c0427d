"""Kernel name spellings as real libraries emit them, and the table that interns them per trace.

Spellings follow research/kernel_taxonomy.md: NCCL ≤2.18 `ncclKernel_*`, ≥2.19 `ncclDevKernel_*`,
≥2.27 symmetric `ncclSymkDevKernel_*`; TE tuned (cooperative) and general norms under the
`normalization` or older `layer_norm` namespace; cuBLAS nvjet / sm90 xmma / CUTLASS GEMMs; flash-attention
2, cuDNN fused attention, or the unfused softmax path. Scenarios pick a spelling family so detectors
cannot key on a single name.
"""

# Demangled names are copied verbatim from real exports; keeping each on one line keeps them greppable
# against the taxonomy notes, so the line limit does not apply here.
# ruff: noqa: E501

from __future__ import annotations

from dataclasses import dataclass, field

LAUNCH_REGULAR = 1
LAUNCH_COOPERATIVE = 2

API_LAUNCH = "cudaLaunchKernel_v7000"
API_LAUNCH_EX = "cudaLaunchKernelExC_v11060"
API_LAUNCH_COOP = "cudaLaunchCooperativeKernel_v9000"
API_CU_LAUNCH_EX = "cuLaunchKernelEx"


@dataclass(frozen=True)
class KernelSpec:
    """Everything nsys records about a kernel that does not depend on when it ran."""

    short: str
    demangled: str
    api: str = API_LAUNCH
    launch_type: int = LAUNCH_REGULAR
    grid: tuple[int, int, int] = (1024, 1, 1)
    block: tuple[int, int, int] = (128, 1, 1)
    registers: int = 32
    is_comm: bool = False
    is_tuned_norm: bool = False

    @property
    def mangled(self) -> str:
        """An Itanium-style symbol for the base name (nsys stores one when the capture has it)."""
        base = self.short.split("<")[0]
        return f"_Z{len(base)}{base}v" if base.isidentifier() else base


@dataclass
class KernelTable:
    """Interns KernelSpecs so the hot loop stores one small int per kernel."""

    specs: list[KernelSpec] = field(default_factory=list)
    index: dict[KernelSpec, int] = field(default_factory=dict)

    def add(self, spec: KernelSpec) -> int:
        idx = self.index.get(spec)
        if idx is None:
            idx = self.index[spec] = len(self.specs)
            self.specs.append(spec)
        return idx


_NCCL_TY = {"2.18": {"f32": "float", "bf16": "__nv_bfloat16", "i8": "int8_t"}}


def nccl_kernel(version: str, coll: str, dtype: str = "bf16", channels: int = 16) -> KernelSpec:
    """NCCL collective or p2p kernel. `coll`: AllReduce, AllGather, ReduceScatter, SendRecv."""
    if version == "2.18":
        if coll == "SendRecv":
            short = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t"
        elif coll == "AllGather":
            short = "ncclKernel_AllGather_RING_LL_Sum_int8_t"
        else:
            short = f"ncclKernel_{coll}_RING_LL_Sum_{_NCCL_TY['2.18'][dtype]}"
        demangled = f"{short}(ncclDevComm *, unsigned long, ncclWork *)"
        api = API_LAUNCH
    else:
        if coll == "SendRecv":
            short = "ncclDevKernel_SendRecv"
        elif coll == "AllGather":
            short = "ncclDevKernel_AllGather_RING_LL"
        elif version == "2.27" and coll in ("AllReduce", "ReduceScatter"):
            short = (
                f"ncclSymkDevKernel_{coll}_LD_sum_{dtype}"
                if coll == "ReduceScatter"
                else f"ncclSymkDevKernel_AllReduce_AGxLL_R_sum_{dtype}"
            )
        else:
            short = f"ncclDevKernel_{coll}_Sum_{dtype}_RING_LL"
        arg = (
            "ncclSymkDevWorkArgs4K" if short.startswith("ncclSymk") else "ncclDevKernelArgsStorage<(unsigned long)4096>"
        )
        demangled = f"{short}({arg})"
        api = API_CU_LAUNCH_EX
    return KernelSpec(short, demangled, api, grid=(channels, 1, 1), block=(640, 1, 1), registers=96, is_comm=True)


def userbuffers_kernel(kind: str) -> KernelSpec:
    """TE userbuffers comm kernel for TP overlap: `ag` (ring push) or `rs` (reduce-scatter)."""
    short = "kuserbuffers_pushsendrecv" if kind == "ag" else "userbuffers_fp16_sum_inplace_gpu_rr_rs"
    params = (
        "(int, int, int, int, int, int, void *, void *, void *, int)"
        if kind == "ag"
        else "(int, int, int, int, int, int, void **, int, unsigned long)"
    )
    return KernelSpec(short, f"{short}{params}", grid=(8, 1, 1), block=(1024, 1, 1), registers=40, is_comm=True)


_GEMM_TILES = ["256x128x64", "128x256x64", "128x128x64", "192x192x64", "64x256x64"]


def gemm_kernel(family: str, fp8: bool, variant: int, sm_count: int) -> KernelSpec:
    """cuBLAS/CUTLASS GEMM; `variant` picks a tile/layout so different GEMMs get different names."""
    layout = ["TNN", "NNN", "NTN", "TNT"][variant % 4]
    tile = _GEMM_TILES[variant % len(_GEMM_TILES)]
    if family == "nvjet":
        t = tile.rsplit("x", 1)[0]
        pre = "nvjet_qqtst" if fp8 else "nvjet_tst"
        short = f"{pre}_{t}_64x4_2x1_v_bz_{['coopB', 'coopA', 'splitK', 'coopB'][variant % 4]}_{layout}"
        return KernelSpec(short, short, API_LAUNCH_EX, grid=(sm_count, 1, 1), block=(384, 1, 1), registers=168)
    if family == "xmma":
        ab = "e4m3e4m3_e4m3f32_f32" if fp8 else "bf16bf16_bf16f32_f32"
        short = (
            f"sm90_xmma_gemm_{ab}_{layout[:2].lower()}_n_tilesize{tile}_warpgroupsize2x1x1"
            f"_execute_segment_k_off_kernel__5x_cublas"
        )
        return KernelSpec(short, short, API_LAUNCH_EX, grid=(sm_count, 1, 1), block=(384, 1, 1), registers=168)
    ty = "e4m3" if fp8 else "bf16"
    short = "device_kernel"
    demangled = (
        f"void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>, "
        f"cutlass::gemm::collective::CollectiveMma<cutlass::gemm::MainloopSm90TmaGmmaWarpSpecialized<4>, "
        f"cute::tuple<cute::C<{tile.split('x')[0]}>, cute::C<{tile.split('x')[1]}>, cute::C<64>>, cutlass::{ty}_t>>>"
        f"(T1::Params)"
    )
    return KernelSpec(short, demangled, API_LAUNCH_EX, grid=(sm_count, 1, 1), block=(384, 1, 1), registers=168)


def grouped_gemm_kernel(fp8: bool, sm_count: int) -> KernelSpec:
    """TE/CUTLASS grouped GEMM used for all local experts at once."""
    ty = "float_e4m3_t" if fp8 else "bfloat16_t"
    demangled = (
        f"void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<"
        f"cute::tuple<int, int, int>>, cutlass::gemm::collective::CollectiveMma<cutlass::{ty}>>>(T1::Params)"
    )
    return KernelSpec(
        "device_kernel", demangled, API_LAUNCH_EX, grid=(sm_count, 1, 1), block=(384, 1, 1), registers=168
    )


def norm_kernel(kind: str, namespace: str, direction: str, tuned: bool, sm_count: int, margin: int) -> KernelSpec:
    """TE LayerNorm/RMSNorm; tuned kernels fill every SM (minus the margin) with a cooperative launch."""
    base = "ln" if kind == "layernorm" else "rmsnorm"
    flavour = "tuned" if tuned else "general"
    short = f"{base}_{direction}_{flavour}_kernel"
    ns = f"transformer_engine::{namespace}"
    params = "ForwardKernelParams" if direction == "fwd" else "BackwardKernelParams"
    demangled = f"void {ns}::{short}<{ns}::Kernel_traits<__nv_bfloat16, __nv_bfloat16, float, 4096, 1, 4, 1, 16>>({ns}::{params})"
    if tuned:
        return KernelSpec(
            short,
            demangled,
            API_LAUNCH_COOP,
            LAUNCH_COOPERATIVE,
            grid=(sm_count - margin, 1, 1),
            block=(128, 1, 1),
            registers=64,
            is_tuned_norm=True,
        )
    return KernelSpec(short, demangled, grid=(sm_count * 2, 1, 1), block=(128, 1, 1), registers=64)


def norm_finalize_kernel(kind: str, namespace: str, tuned: bool) -> KernelSpec:
    base = "ln" if kind == "layernorm" else "rmsnorm"
    short = f"{base}_bwd_finalize_{'tuned' if tuned else 'general'}_kernel"
    ns = f"transformer_engine::{namespace}"
    return KernelSpec(
        short,
        f"void {ns}::{short}<{ns}::Kernel_traits_finalize<4096, 32>>({ns}::BackwardKernelParams)",
        grid=(64, 1, 1),
        block=(256, 1, 1),
    )


def attention_kernels(kind: str, direction: str, head_dim: int) -> list[KernelSpec]:
    """Core-attention kernels for one call: flash-attention 2, cuDNN fused, or unfused softmax."""
    if kind == "flash":
        if direction == "fwd":
            d = (
                f"void flash_fwd_kernel<Flash_fwd_kernel_traits<{head_dim}, 128, 64, 4, false, false, cutlass::bfloat16_t, "
                f"Flash_kernel_traits<{head_dim}, 128, 64, 4, cutlass::bfloat16_t>>, false, true, false, false, true, true, "
                f"false, false>(Flash_fwd_params)"
            )
            return [KernelSpec("flash_fwd_kernel", d, grid=(244, 1, 1), block=(128, 1, 1), registers=255)]
        return [
            KernelSpec(
                "flash_bwd_dot_do_o_kernel",
                "void flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t>>(Flash_bwd_params)",
            ),
            KernelSpec(
                "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel",
                "void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t>, false, true, false, false, true, true, false>(Flash_bwd_params)",
                grid=(488, 1, 1),
                registers=255,
            ),
            KernelSpec(
                "flash_bwd_convert_dq_kernel",
                "void flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t>>(Flash_bwd_params, int)",
            ),
        ]
    if kind == "cudnn":
        op = "fprop" if direction == "fwd" else "bprop"
        name = f"cudnn_generated_fort_native_sdpa_sm90_flash_{op}_wgmma_f16_knob_3_64x64x{head_dim}_4x1x1_kernel0_0"
        prep = KernelSpec(
            f"prepare_kernel_{direction}",
            f"void transformer_engine::fused_attn::prepare_kernel_{direction}<__nv_bfloat16>(long, long, long, long, long, long *, long *)",
        )
        return [prep, KernelSpec(name, name, API_LAUNCH_EX, grid=(264, 1, 1), block=(384, 1, 1), registers=168)]
    if direction == "fwd":
        sm = "scaled_upper_triang_masked_softmax_warp_forward"
        return [
            KernelSpec(
                sm,
                f"void {sm}<__nv_bfloat16, __nv_bfloat16, float, 12>(__nv_bfloat16 *, const __nv_bfloat16 *, float, int, int, int)",
            )
        ]
    sm = "scaled_upper_triang_masked_softmax_warp_backward"
    return [
        KernelSpec(
            sm,
            f"void {sm}<__nv_bfloat16, __nv_bfloat16, float, 12>(__nv_bfloat16 *, __nv_bfloat16 *, const __nv_bfloat16 *, float, int, int, int)",
        )
    ]


def elementwise_kernel(what: str) -> KernelSpec:
    """Element-wise kernels (activations, rope, dropout/bias fusions, casts, embedding, loss, optimizer)."""
    table = {
        "swiglu_fwd": (
            "gated_act_kernel",
            "void transformer_engine::gated_act_kernel<4, true, float, transformer_engine::Empty, &transformer_engine::silu<float, float>, __nv_bfloat16, __nv_bfloat16>(const __nv_bfloat16 *, __nv_bfloat16 *, const float *, float *, float *, float *, unsigned long, unsigned long, transformer_engine::Empty)",
        ),
        "swiglu_bwd": (
            "dgated_act_kernel",
            "void transformer_engine::dgated_act_kernel<4, float, transformer_engine::Empty, &transformer_engine::silu<float, float>, &transformer_engine::dsilu<float, float>, __nv_bfloat16, __nv_bfloat16>(const __nv_bfloat16 *, const __nv_bfloat16 *, __nv_bfloat16 *, unsigned long, unsigned long, transformer_engine::Empty)",
        ),
        "gelu_fwd": (
            "vectorized_elementwise_kernel",
            "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase &, at::native::GeluType)::[lambda() (instance 2)]::operator ()() const::[lambda(c10::BFloat16) (instance 1)], at::detail::Array<char *, 2>>(int, T2, T3)",
        ),
        "gelu_bwd": (
            "vectorized_elementwise_kernel",
            "void at::native::vectorized_elementwise_kernel<4, at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase &, at::native::GeluType)::[lambda() (instance 2)]::operator ()() const::[lambda(c10::BFloat16, c10::BFloat16) (instance 1)], at::detail::Array<char *, 3>>(int, T2, T3)",
        ),
        "rope_fwd": (
            "fused_rope_forward_kernel",
            "void transformer_engine::fused_rope_forward_kernel<__nv_bfloat16>(const __nv_bfloat16 *, const float *, __nv_bfloat16 *, int, int, int, int, int, int, int, int, int, int, int)",
        ),
        "rope_bwd": (
            "fused_rope_backward_kernel",
            "void transformer_engine::fused_rope_backward_kernel<__nv_bfloat16>(const __nv_bfloat16 *, const float *, __nv_bfloat16 *, int, int, int, int, int, int, int, int, int, int, int)",
        ),
        "rope_unfused": (
            "elementwise_kernel",
            "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float>>>(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)",
        ),
        "bda_fused": ("triton_poi_fused_add_native_dropout_0", "triton_poi_fused_add_native_dropout_0"),
        "bda_fused_bwd": ("triton_poi_fused_native_dropout_backward_0", "triton_poi_fused_native_dropout_backward_0"),
        "dropout": (
            "fused_dropout_kernel_vec",
            "void at::native::<unnamed>::fused_dropout_kernel_vec<c10::BFloat16, float, unsigned int, 1, 4, bool>(at::cuda::detail::TensorInfo<const T1, T3>, at::cuda::detail::TensorInfo<T1, T3>, at::cuda::detail::TensorInfo<T6, T3>, T3, T2, at::PhiloxCudaState)",
        ),
        "add": (
            "vectorized_elementwise_kernel",
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char *, 3>>(int, T2, T3)",
        ),
        "cast_fp8": (
            "cast_transpose_fusion_kernel_optimized",
            "void transformer_engine::cast_transpose_fusion_kernel_optimized<true, false, float, __nv_bfloat16, __nv_fp8_e4m3>(transformer_engine::CTDBiasParam<__nv_bfloat16, __nv_fp8_e4m3, float>, int, int, int, int)",
        ),
        "embedding_fwd": (
            "indexSelectLargeIndex",
            "void at::native::<unnamed>::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>(at::cuda::detail::TensorInfo<T1, T3>, at::cuda::detail::TensorInfo<const T1, T3>, at::cuda::detail::TensorInfo<const T2, T3>, int, int, T3, T3, long)",
        ),
        "embedding_bwd": (
            "embedding_backward_feature_kernel",
            "void at::native::<unnamed>::embedding_backward_feature_kernel<c10::BFloat16, float, long>(const T3 *, const T1 *, T1 *, int, long, int)",
        ),
        "loss_fwd": (
            "cunn_SoftMaxForward",
            "void at::native::<unnamed>::cunn_SoftMaxForward<8, float, float, float, at::native::<unnamed>::LogSoftMaxForwardEpilogue>(T4 *, const T2 *, int)",
        ),
        "loss_bwd": (
            "cunn_SoftMaxBackward",
            "void at::native::<unnamed>::cunn_SoftMaxBackward<8, float, float, float, at::native::<unnamed>::LogSoftMaxBackwardEpilogue>(T2 *, const T4 *, const T4 *, long)",
        ),
        "router_topk": (
            "fused_topk_with_score_function_forward_kernel",
            "void transformer_engine::fused_topk_with_score_function_forward_kernel<float>(const float *, int, int, int, bool, int, int, int, float, int, float *, bool *, float *)",
        ),
        "permute": (
            "moe_permute_kernel",
            "void transformer_engine::moe_permute_kernel<__nv_bfloat16, float, true>(const __nv_bfloat16 *, __nv_bfloat16 *, const int *, const float *, float *, int, int, int)",
        ),
        "unpermute": (
            "moe_unpermute_kernel",
            "void transformer_engine::moe_unpermute_kernel<__nv_bfloat16, float, true>(const __nv_bfloat16 *, __nv_bfloat16 *, const int *, const float *, float *, int, int, int)",
        ),
        "adam": (
            "multi_tensor_apply_kernel",
            "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float, float, float>, float, float, float, float, float, float, adamMode_t, float>(long, int volatile *, T1, T2, T3...)",
        ),
        "l2norm": (
            "multi_tensor_apply_kernel",
            "void multi_tensor_apply_kernel<TensorListMetadata<1>, L2NormFunctor<float, 512, 1>, float *, float *, bool, int>(long, int volatile *, T1, T2, T3...)",
        ),
        "zero_grad": (
            "vectorized_elementwise_kernel",
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char *, 1>>(int, T2, T3)",
        ),
    }
    short, demangled = table[what]
    api = API_LAUNCH_EX if short.startswith("triton_") else API_LAUNCH
    return KernelSpec(short, demangled, api, grid=(4096, 1, 1), block=(256, 1, 1), registers=28)


# DeepEP's normal (internode) kernels, as SGLang's prefill on DeepEP records them (deepseek-ai/profile-data):
# notify_dispatch / cached_notify exchange the token counts, dispatch / combine move the tokens, over NVSHMEM
# and NVLink buffers, with no NCCL call and launched with cudaLaunchKernelEx on DeepEP's own comm stream.
DEEP_EP = {
    "layout": (
        "get_dispatch_layout",
        "void deep_ep::internode::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int, int, int)",
    ),
    "notify_dispatch": (
        "notify_dispatch",
        "void deep_ep::internode::notify_dispatch<false, 4>(int const*, int*, int, int const*, int*, int const*, int*, int, bool const*, int, int, int, int, int, int, int, int*, int*, int*, int*, void*, void**, int**, int, int, int)",
    ),
    "dispatch": (
        "dispatch",
        "void deep_ep::internode::dispatch<false, 4, false, 7, 4>(int4*, float*, long*, float*, deep_ep::internode::SourceMeta*, int4 const*, float const*, long const*, float const*, int*, int*, int*, int*, int const*, int const*, int const*, int const*, int, int, int, int, int, bool const*, void*, int, int, void**, int, int, int, int)",
    ),
    "cached_notify": (
        "cached_notify",
        "void deep_ep::internode::cached_notify<false>(int, int, int, int, int*, int, int, int const*, int const*, int*, void*, void**, int**, int, int, int, bool, int)",
    ),
    "combine": (
        "combine",
        "void deep_ep::internode::combine<false, 4, __nv_bfloat16, 16, 4, 4, 16, 24>(int4*, float*, bool const*, int4 const*, float const*, int const*, int const*, deep_ep::internode::SourceMeta const*, int const*, int const*, int const*, int, int, int, int, void*, int, int, void**, int, int, int, int)",
    ),
}


def deep_ep_kernel(what: str, sms: int = 24) -> KernelSpec:
    """One DeepEP kernel (`DEEP_EP` key); its transfer kernels hold `sms` SMs (DeepEP's `num_sms` default)."""
    short, demangled = DEEP_EP[what]
    comm = what != "layout"
    return KernelSpec(short, demangled, API_LAUNCH_EX, grid=(sms if comm else 128, 1, 1), block=(768, 1, 1),
                      registers=64, is_comm=comm)
