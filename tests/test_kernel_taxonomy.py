"""Kernel taxonomy: every name form of research/kernel_taxonomy.md, every kernel of the real traces,
near-misses that must not match, and the integrity of the pattern table itself."""

from __future__ import annotations

import gzip
import json
import re
import sqlite3

import numpy as np
import pytest

from perfdoctor.classify.kernels import (
    CATEGORIES,
    COLLECTIVES,
    KINDS,
    LIBRARIES,
    OTHER,
    PATTERNS,
    RULES,
    KernelClass,
    classify_kernel,
    classify_memcpy,
    classify_names,
    rule_index,
    signature_head,
)
from tests.paths import REAL_H100, TRACES

NSYS_TRACE = REAL_H100
KINETO_TRACES = sorted((TRACES / "kineto").glob("*.json.gz"))


def comm(collective: str, library: str = "nccl") -> KernelClass:
    return KernelClass("comm", collective, library)


def ew(kind: str | None = None) -> KernelClass:
    return KernelClass("elementwise", kind=kind)


GEMM, ATTN, NORM, NORM_P, OPT, MEMSET = (KernelClass(c) for c in
                                          ("gemm", "attention", "norm", "norm_persistent", "optimizer", "memset"))
TE_NORM_TRAITS = ("<transformer_engine::normalization::Kernel_traits<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, "
                  "float, unsigned int, 4096u, 1u, 4u, 1u, 16u>>"
                  "(transformer_engine::normalization::ForwardKernelParams)")

# (short name, demangled name or None, expected class). Kineto-style inputs pass the demangled
# name as the short name.
POSITIVE: list[tuple[str, str | None, KernelClass]] = [
    # NCCL <= 2.7 (§1.1)
    ("ncclAllReduceRingLLKernel_sum_f32", "ncclAllReduceRingLLKernel_sum_f32(ncclColl)", comm("all_reduce")),
    ("ncclAllReduceTreeLLKernel_sum_f16", None, comm("all_reduce")),
    ("ncclAllGatherRingLLKernel_copy_i8", None, comm("all_gather")),
    ("ncclReduceScatterRingLLKernel_sum_f32", None, comm("reduce_scatter")),
    ("ncclReduceRingLLKernel_sum_f32", None, comm("reduce")),
    ("ncclBroadcastRingLLKernel_copy_i8", None, comm("broadcast")),
    ("ncclSendRecvKernel_copy_i8", "ncclSendRecvKernel_copy_i8(ncclColl)", comm("send_recv")),
    # NCCL 2.8 - 2.18, each argument-list suffix
    ("ncclKernel_AllReduce_RING_LL_Sum_float", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
     comm("all_reduce")),
    ("ncclKernel_ReduceScatter_RING_LL_Sum_half",
     "ncclKernel_ReduceScatter_RING_LL_Sum_half(ncclDevComm*, ncclWorkElem)",
     comm("reduce_scatter")),
    ("ncclKernel_ReduceScatter_COLLNET_DIRECT_LL_Sum___nv_bfloat16", None, comm("reduce_scatter")),
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t", None, comm("all_gather")),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t", None, comm("broadcast")),
    ("ncclKernel_Reduce_RING_LL_Sum_float", None, comm("reduce")),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t",
     "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", comm("send_recv")),
    # NCCL >= 2.19; both demangler spellings of the argument
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
     "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", comm("all_reduce")),
    ("ncclDevKernel_AllReduce_Sum_f32_TREE_LL", None, comm("all_reduce")),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL",
     "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)",
     comm("reduce_scatter")),
    ("ncclDevKernel_Reduce_Sum_f32_RING_LL", None, comm("reduce")),
    ("ncclDevKernel_AllGather_RING_LL", None, comm("all_gather")),
    ("ncclDevKernel_AllGatherV_RING_LL", None, comm("all_gather")),
    ("ncclDevKernel_Broadcast_RING_LL", None, comm("broadcast")),
    ("ncclDevKernel_SendRecv", "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)",
     comm("send_recv")),
    ("ncclDevKernel_Generic", "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", comm("other")),
    ("ncclDevKernel_Generic_1", None, comm("other")),  # RCCL
    # NCCL >= 2.27 symmetric kernels are NCCL kernels
    ("ncclSymkDevKernel_AllReduce_AGxLL_R_sum_bf16",
     "ncclSymkDevKernel_AllReduce_AGxLL_R_sum_bf16(ncclSymkDevWorkArgs4K)", comm("all_reduce")),
    ("ncclSymkDevKernel_AllReduce_RSxLDMC_AGxSTMC_sum_bf16", None, comm("all_reduce")),
    ("ncclSymkDevKernel_ReduceScatter_LD_sum_bf16", None, comm("reduce_scatter")),
    ("ncclSymkDevKernel_AllGather_LLMC", None, comm("all_gather")),
    # TE userbuffers (§3.2)
    ("userbuffers_fp16_sum_inplace_gpu_rr", None, comm("all_reduce", "userbuffers")),
    ("userbuffers_fp16_sum_inplace_gpu_rw", "void userbuffers_fp16_sum_inplace_gpu_rw<8>(int, int, int, int, int, "
     "int, int, void**, int, unsigned long)", comm("all_reduce", "userbuffers")),
    ("userbuffers_fp16_sum_inplace_gpu_mc", None, comm("all_reduce", "userbuffers")),
    ("userbuffers_fp16_sum_inplace_gpu_rr_ag", None, comm("all_gather", "userbuffers")),
    ("userbuffers_fp16_sum_inplace_gpu_rw_ag", None, comm("all_gather", "userbuffers")),
    ("userbuffers_fp16_sum_inplace_gpu_mc_ag", "void userbuffers_fp16_sum_inplace_gpu_mc_ag<8>(int, int, int, int, "
     "int, int, int, void**, int, unsigned long)", comm("all_gather", "userbuffers")),
    ("userbuffers_fp16_sum_inplace_gpu_rr_rs", None, comm("reduce_scatter", "userbuffers")),
    ("userbuffers_fp16_sum_inplace_gpu_mc_rs", None, comm("reduce_scatter", "userbuffers")),
    ("userbuffers_fp16_sum_inplace_gpu_rr_rs_oop", None, comm("reduce_scatter", "userbuffers")),
    ("userbuffers_fp16_sum_inplace_gpu_rr_rs_oop_fp8",
     "void userbuffers_fp16_sum_inplace_gpu_rr_rs_oop_fp8<8, __nv_fp8_e4m3>(int, int, int, int, int, int, int, "
     "void**, int, float*, int, int, int, int, unsigned long)", comm("reduce_scatter", "userbuffers")),
    ("userbuffers_fp16_sum_inplace_gpu_rr_rs_oop_stride", None, comm("reduce_scatter", "userbuffers")),
    ("userbuffers_fp16_sum_inplace_gpu_rr_rs_oop_atomic_fp8", None, comm("reduce_scatter", "userbuffers")),
    ("userbuffers_fp16_sum_inplace_gpu_rr_rs_oop_stride_atomic", None, comm("reduce_scatter", "userbuffers")),
    ("userbuffers_fp16_sum_inplace_gpu_rr_rs_oop_stride_multiatomic", None, comm("reduce_scatter", "userbuffers")),
    ("userbuffers_fp16_sum_inplace_gpu_mc_rs_oop", None, comm("reduce_scatter", "userbuffers")),
    ("kuserbuffers_pullsend", None, comm("send_recv", "userbuffers")),
    ("kuserbuffers_pullrecv", None, comm("send_recv", "userbuffers")),
    ("kuserbuffers_pushsend", None, comm("send_recv", "userbuffers")),
    ("kuserbuffers_pushrecv", None, comm("send_recv", "userbuffers")),
    ("kuserbuffers_pushsendrecv", None, comm("send_recv", "userbuffers")),
    ("kuserbuffers_pushsendrecv_atomic", None, comm("send_recv", "userbuffers")),
    ("kuserbuffers_pushsendrecv_multiatomic", None, comm("send_recv", "userbuffers")),
    ("kuserbuffers_inc", None, comm("other", "userbuffers")),
    ("kuserbuffers_dummy", None, comm("other", "userbuffers")),
    ("producer_kernel", "producer_kernel(void*, int)", comm("other", "userbuffers")),
    ("consumer_kernel", None, comm("other", "userbuffers")),
    ("consumer_batch_kernel", None, comm("other", "userbuffers")),
    ("reset_counters_kernel", None, comm("other", "userbuffers")),
    ("tiny_delay_kern", None, comm("other", "userbuffers")),
    # symmetric memory (torch symm_mem, vLLM), DeepEP
    ("multimem_all_reduce_kernel", "void <unnamed>::multimem_all_reduce_kernel<c10::BFloat16, (int)16>(T1 *, "
     "unsigned long, unsigned int **, unsigned long, unsigned long)", comm("all_reduce", "symmetric_memory")),
    ("multimem_one_shot_reduce_kernel", None, comm("all_reduce", "symmetric_memory")),
    ("one_shot_all_reduce_kernel", None, comm("all_reduce", "symmetric_memory")),
    ("void (anonymous namespace)::two_shot_all_reduce_kernel_inplace<c10::BFloat16, 16, 2>(c10::BFloat16**, "
     "unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long)", None,
     comm("all_reduce", "symmetric_memory")),
    ("two_shot_all_reduce_kernel", "void <unnamed>::two_shot_all_reduce_kernel<float, (int)16, (int)8, (bool)0, "
     "(bool)0>(T1 **, T1 *, unsigned long, unsigned long, unsigned int **, unsigned long, unsigned long, "
     "unsigned long)", comm("all_reduce", "symmetric_memory")),
    ("two_shot_all_reduce_kernel", "void <unnamed>::two_shot_all_reduce_kernel<c10::BFloat16, (int)16, (int)8, "
     "(bool)1, (bool)0>(T1 **, T1 *, unsigned long, unsigned long, unsigned int **, unsigned long, unsigned long, "
     "unsigned long)", comm("reduce_scatter", "symmetric_memory")),
    ("void (anonymous namespace)::two_shot_all_reduce_kernel<float, 16, 4, true, true>(float**, float*, unsigned "
     "long, unsigned long, unsigned int**, unsigned long, unsigned long, unsigned long)", None,
     comm("reduce_scatter", "symmetric_memory")),
    ("multimem_all_gather_kernel", None, comm("all_gather", "symmetric_memory")),
    ("cross_device_reduce_1stage", None, comm("all_reduce", "symmetric_memory")),
    ("void vllm::cross_device_reduce_2stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, "
     "__nv_bfloat16*, int, int)", None, comm("all_reduce", "symmetric_memory")),
    # torch NVSHMEM all_to_all_vdev (c10d::nvshmem_extension)
    ("void c10d::nvshmem_extension::allToAllV(void*, void*, long*, unsigned long, int, int)", None,
     comm("all_to_all", "symmetric_memory")),
    ("exchangeSplitAndOffset_2d", None, comm("all_to_all", "symmetric_memory")),
    # DeepEP (deepseek-ai/DeepEP csrc/kernels), one name per kernel family
    ("dispatch", "void deep_ep::intranode::dispatch<(int)8, (int)768, (int)6144>(int4 *, float *, int *)",
     comm("all_to_all", "deep_ep")),
    ("void deep_ep::internode_ll::combine<false>(void*, int*, int)", None, comm("all_to_all", "deep_ep")),
    ("void primus_turbo::deep_ep::intranode::cached_notify_dispatch<8>(int const*, int, void**, int**, int)", None,
     comm("all_to_all", "deep_ep")),
    # SGLang prefill on DeepEP (deepseek-ai/profile-data): older builds keep the layout kernel in internode::
    ("void deep_ep::internode::notify_dispatch<false, 4>(int const*, int*, int, int const*, int*, int const*, int*, "
     "int, bool const*, int, int, int, int, int, int, int, int*, int*, int*, int*, void*, void**, int**, int, int, "
     "int)", None, comm("all_to_all", "deep_ep")),
    ("void deep_ep::internode::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int, int, "
     "int)", None, ew("moe")),
    ("void deep_ep::elastic::hybrid_dispatch_impl<true, false, 24, 4, 8, 8, 8, 7168, 56, 4096, 256, 8, 64, 2, "
     "100000000000>(void*)", None, comm("all_to_all", "deep_ep")),
    ("void deep_ep::elastic::pp_send_impl<8, 2, 4096, 1, 100000000000>(ncclDevComm, ncclWindow_vidmem*, void*, "
     "long, void*, void*, int, int, long, int)", None, comm("send_recv", "deep_ep")),
    # DeepSeek-V3 training and inference (deepseek-ai/profile-data train.json, prefill.json, decode.json)
    ("void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*, float*, long*, float*, "
     "dpsk::ep::internode::SourceMeta*, int4 const*, float const*, long const*, float const*, int*, int*, int*, int*, "
     "int const*, int const*, int const*, int const*, int, int, int, int, int, bool const*, void*, int, int, void**, "
     "int, int, int, int, int*)", None, comm("all_to_all", "deep_ep")),
    ("void dpsk::ep::internode::combine<false, 4, __nv_bfloat16, 4, 4, 16, 24>(int4*, float*, bool const*, "
     "int4 const*, float const*, int4 const*, int4 const*, int const*, int const*, "
     "dpsk::ep::internode::SourceMeta const*, int const*, int const*, int const*, int, int, int, int, void*, int, "
     "int, void**, int, int, int, int, int*)", None, comm("all_to_all", "deep_ep")),
    ("void dpsk::ep::internode::notify_dispatch<false, 4>(int const*, long*, int, int const*, int*, int const*, "
     "int*, int, bool const*, int, int, int, int, int, int, int, int*, int*, int*, int*, void*, void**, int**, int, "
     "int, int*, int)", None, comm("all_to_all", "deep_ep")),
    ("void dpsk::ep::internode::cached_notify<false>(int, int, int, int, int*, int, int, int const*, int const*, "
     "int*, void*, void**, int**, int, int, int, int*, bool, int)", None, comm("all_to_all", "deep_ep")),
    ("void dpsk::ep::internode::dispatch_ll<true, 3, 10, 7168>(void*, float*, int*, long*, int*, int*, void*, int*, "
     "void*, void const*, long const*, int*, int*, int*, int, int, int, int, int, int, int, int*, int)", None,
     comm("all_to_all", "deep_ep")),
    ("void dpsk::ep::internode::combine_ll<3, 10, 7168, 9>(void*, void*, int*, void*, void const*, long const*, "
     "float const*, int const*, long const*, int*, int, int*, int, int, int, int, int, int, int, int*, int)", None,
     comm("all_to_all", "deep_ep")),
    ("void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int, int, "
     "int)", None, ew("moe")),
    # HybridEP (Megatron's flex dispatcher backend; names as profiling scripts match them)
    ("void hybrid_ep::dispatch_kernel<__nv_bfloat16>(hybrid_ep::dispatch_kernel_param_t<__nv_bfloat16>)", None,
     comm("all_to_all", "deep_ep")),
    ("void hybrid_ep::combine_kernel<8>(hybrid_ep::combine_kernel_param_t)", None, comm("all_to_all", "deep_ep")),
    ("hybrid_ep::device_sync_kernel(int*, int)", None, comm("other", "deep_ep")),
    # MSCCL++: its DeepEP port, collectives, executor
    ("dispatch", "void mscclpp::ep::internode_ll::dispatch<true, false, false, 3, 10, 7168>(void*, float*, int*, "
     "long*, int*, void*, long*, void*, void const*, long const*, int*, int*, long*, int, int, int, int, int, int, "
     "int, int, void*, mscclpp::PortChannelDeviceHandle*)", comm("all_to_all", "deep_ep")),
    ("allreducePacket", "void mscclpp::collective::allreducePacket<(mscclpp::ReduceOp)0, __nv_bfloat16, "
     "__nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, mscclpp::DeviceHandle<mscclpp::MemoryChannel>*, "
     "unsigned long, unsigned long, int, int, int, unsigned long, void*, unsigned int, unsigned int)",
     comm("all_reduce", "mscclpp")),
    ("void mscclpp::collective::alltoallvPeerParallelKernel(mscclpp::DeviceHandle<mscclpp::MemoryChannel>*, "
     "mscclpp::DeviceSyncer*, int, int, void const*, void*, unsigned long const*, unsigned long const*, "
     "unsigned long const*, unsigned long const*, unsigned long const*)", None, comm("all_to_all", "mscclpp")),
    ("void mscclpp::executionKernel<__nv_bfloat16, false>(int, __nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, "
     "void*, unsigned long, mscclpp::DeviceExecutionPlan*, unsigned int, unsigned long)", None,
     comm("other", "mscclpp")),
    # NVSHMEM on-stream collectives (nvshmemi_h_to_d_coll_defs.cuh)
    ("void alltoall_on_stream_kernel<int>(int, int*, int const*, unsigned long)", None,
     comm("all_to_all", "nvshmem")),
    ("fcollect_on_stream_kernel", None, comm("all_gather", "nvshmem")),
    ("void reducescatter_on_stream_kernel<float, (rdxn_ops)4>(int, float*, float const*, unsigned long)", None,
     comm("reduce_scatter", "nvshmem")),
    ("rdxn_on_stream_kernel", None, comm("all_reduce", "nvshmem")),
    ("void nvshmemi_reduce_kernel<unsigned char, (rdxn_ops)0>(int, int, int, unsigned char*, unsigned char const*, "
     "unsigned long, unsigned char*, long volatile*, long volatile*)", None, comm("all_reduce", "nvshmem")),
    ("broadcast_on_stream_kernel", None, comm("broadcast", "nvshmem")),
    ("barrier_on_stream_kernel_threadgroup", None, comm("other", "nvshmem")),
    ("sync_all_on_stream_kernel", None, comm("other", "nvshmem")),
    # UCC CUDA execution engine (ec/cuda)
    ("void UCC_REDUCE_CUDA_DEFAULT_SUM<float, float, false, 4>(ucc_eee_task_reduce, unsigned short)", None,
     comm("other", "ucc")),
    ("UCC_REDUCE_CUDA_MULTI_DST_SUM", None, comm("other", "ucc")),
    ("get_dispatch_layout", "void deep_ep::layout::get_dispatch_layout<(int)256, (int)32, (int)8>(const long *, "
     "int *, int *, int *, bool *, int, int, int, int)", ew("moe")),
    # attention (§3.3)
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0", None, ATTN),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_7_64x128x128_4x1x1_kernel0_0", None, ATTN),
    ("cudnn_generated_fort_native_sm100_flash_fprop_f16_knob_1_128x128x64_kernel0_0", None, ATTN),
    # cuDNN SDPA backward helpers, launched by aten::_scaled_dot_product_cudnn_attention_backward (tests/data/h100)
    ("void cudnn::fusion::compute_dot_do_o_specialized<true, 128>(void const*, void const*, void*, void*, unsigned)",
     None, ATTN),
    ("compute_dot_do_o_specialized", "void cudnn::fusion::compute_dot_do_o_specialized<true, 128>(void const*)", ATTN),
    ("void cudnn::fusion::convert_dq_to_16bits<true>(void const*, void*, unsigned int)", None, ATTN),
    ("prepare_kernel_fwd", "void transformer_engine::fused_attn::prepare_kernel_fwd<__nv_bfloat16>("
     "transformer_engine::fused_attn::FADescriptor)", ATTN),
    ("prepare_kernel_bwd", None, ATTN),
    ("populate_rng_state_kernel", None, ATTN),
    ("get_runtime_num_segments_kernel", None, ATTN),
    ("thd_out_correction_kernel", None, ATTN),
    ("thd_grad_correction_kernel", None, ATTN),
    ("thd_lse_kernel", None, ATTN),
    ("thd_read_half_tensor_kernel", None, ATTN),
    ("thd_partition_indices_kernel", None, ATTN),
    ("convert_thd_to_bshd_kernel", None, ATTN),
    ("convert_bshd_to_thd_kernel", None, ATTN),
    ("flash_fwd_splitkv_kernel", None, ATTN),
    ("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", None, ATTN),
    ("flash_bwd_dot_do_o_kernel", None, ATTN),
    ("flash_bwd_convert_dq_kernel", None, ATTN),
    ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, "
     "cutlass::bfloat16_t>, false, true, false, false, true, true>(pytorch_flash::Flash_fwd_params)", None, ATTN),
    ("device_kernel", "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<"
     "flash::CollectiveMainloopFwdSm90<(int)2, cute::tuple<cute::C<(int)1>>, (bool)1>>>>(T1::Params)", ATTN),
    ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdCombine<cute::tuple<cute::C<8>, "
     "cute::C<128> >, 7, 256, 1, false, true, cutlass::bfloat16_t, float, cutlass::arch::Sm90> > >(flash::"
     "FlashAttnFwdCombine<cute::tuple<cute::C<8>, cute::C<128> >, 7, 256, 1, false, true, cutlass::bfloat16_t, "
     "float, cutlass::arch::Sm90>::Params)", None, ATTN),
    ("void flash::prepare_varlen_num_blocks_kernel<128, true>(int, int, int, int const*)", None, ATTN),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", None, ATTN),
    ("fmha_cutlassB_bf16_aligned_64x64_k128_sm80", None, ATTN),
    ("void attention_kernel_batched_impl<PyTorchMemEffAttention::AttentionKernel<float, cutlass::arch::Sm80, true, "
     "64, 64, 64, true, true> >(PyTorchMemEffAttention::AttentionKernel<float, cutlass::arch::Sm80, true, 64, 64, "
     "64, true, true>::Params)", None, ATTN),
    ("triton_tem_fused_flex_attention_0", None, ATTN),
    # GEMM (§4)
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
     "__5x_cublas", None, GEMM),
    ("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x128_warpgroupsize1x1x1_execute_segment_k_off_kernel"
     "__5x_cublas", None, GEMM),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x256x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_"
     "kernel__5x_cublas", None, GEMM),
    ("ampere_sgemm_128x64_nn", None, GEMM),
    ("ampere_h16816gemm_256x128_ldg8_stages_32x3_nn", None, GEMM),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", None, GEMM),
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN", None, GEMM),
    ("nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT", None, GEMM),
    # ROCm: Tensile / hipBLASLt, composable_kernel; aiter paged attention
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT128x128x64_MI16x16x1", None, GEMM),
    ("_ZN5aiter35paged_attention_ll4mi_QKV_mfma16_kernelI14__hip_bfloat16", None, ATTN),
    ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN", None, GEMM),
    ("nvjet_sm100_tst_256x128_64x4_2x1_2cta_h_bz_splitK_TNT", None, GEMM),
    ("Kernel", "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>("
     "cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params)", GEMM),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1_tn_align8>("
     "cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1_tn_align8::Params)", None, GEMM),
    ("cutlass3x_sm90_tensorop_s64x128x16gemm_bf16_bf16_f32_bf16_bf16_128x128x64_1x1x1_0_tnn_align8_warpspecialized"
     "_cooperative_epi_tma", None, GEMM),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>, "
     "cutlass::gemm::collective::CollectiveMma<>, void> >(cutlass::gemm::kernel::GemmUniversal<>::Params)", None, GEMM),
    ("void cutlass::Kernel<cutlass::gemm::kernel::GemmGrouped<cutlass::gemm::threadblock::MmaMultistage<>, "
     "cutlass::epilogue::threadblock::Epilogue<>, false> >(cutlass::gemm::kernel::GemmGrouped<>::Params)", None, GEMM),
    ("cutlass_grouped_gemm", None, GEMM),
    ("splitKreduce_kernel", None, GEMM),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, "
     "false>(cublasLt::cublasSplitKParams<float>, float const*)", None, GEMM),
    ("void epilogue::impl::globalKernel<8, 32, float, float, float, true, false, true>(int, int, long, float*)",
     None, GEMM),
    ("gemv2T_kernel_val", None, GEMM),
    ("gemmSN_TN_kernel", None, GEMM),
    ("gemmk1_kernel", None, GEMM),
    ("void deep_gemm::fp8_gemm_kernel<4096u, 7168u, 128u, 160u, 128u, 1u, 8u, 128u, 32u, 4u>(float*, int*, "
     "unsigned int, CUtensorMap_st)", None, GEMM),
    ("bmm_E4m3_E4m3E4m3_Fp32_t128x64x128u2_s4_et64x64_m64x64x32_cga1x1x1_16dp256b_TN_transOut_schedS_sm100f",
     None, GEMM),
    ("triton_tem_fused_addmm_relu_0", None, GEMM),
    ("volta_fp16_s884cudnn_fp16_256x128_ldg8_relu_f2f_exp_small_nhwc2nchw_tn_v1", None, GEMM),
    # LayerNorm / RMSNorm (§3.1): TE tuned vs general, then PyTorch, Apex, cuDNN
    ("ln_fwd_tuned_kernel", "void transformer_engine::normalization::ln_fwd_tuned_kernel" + TE_NORM_TRAITS, NORM_P),
    ("ln_bwd_tuned_kernel", None, NORM_P),
    ("ln_bwd_finalize_tuned_kernel", "void transformer_engine::layer_norm::ln_bwd_finalize_tuned_kernel<"
     "transformer_engine::layer_norm::Kernel_traits_finalize<4096u, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16, "
     "float, unsigned int, 1024u, 16u>>(transformer_engine::layer_norm::BwdParams)", NORM_P),
    ("rmsnorm_fwd_tuned_kernel", None, NORM_P),
    ("rmsnorm_bwd_tuned_kernel", None, NORM_P),
    ("rmsnorm_bwd_finalize_tuned_kernel", None, NORM_P),
    ("ln_fwd_general_kernel", "void transformer_engine::normalization::ln_fwd_general_kernel" + TE_NORM_TRAITS, NORM),
    ("ln_bwd_general_kernel", None, NORM),
    ("ln_bwd_finalize_general_kernel", None, NORM),
    ("rmsnorm_fwd_general_kernel", None, NORM),
    ("rmsnorm_bwd_general_kernel", None, NORM),
    ("rmsnorm_bwd_finalize_general_kernel", None, NORM),
    ("layer_norm_grad_input_kernel", None, NORM),
    ("GammaBetaBackwardCUDAKernel", None, NORM),
    ("void at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel<float>(long, float, float const*, float*, "
     "float*)", None, NORM),
    ("void at::native::batch_norm_collect_statistics_kernel<at::native::InvStd, float, float, int>()", None, NORM),
    ("cuApplyLayerNorm", None, NORM),
    ("cuApplyRMSNorm", None, NORM),
    ("cuComputeGradInput", None, NORM),
    ("cuComputePartGradGammaBeta", None, NORM),
    ("triton_per_fused_add_native_layer_norm_3", None, NORM),
    # optimizer
    ("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float, float, int>, float, float>("
     "long, int volatile*, TensorListMetadata<4>, AdamFunctor<float, float, int>, float, float)", None, OPT),
    ("void adam_cuda_kernel<float, c10::Half>(float*, c10::Half*, float*, float*, c10::Half const*, float, float)",
     None, OPT),
    # TE elementwise (§3.4), by kind
    ("moe_permute_kernel", None, ew("moe")),
    ("moe_unpermute_kernel", None, ew("moe")),
    ("fused_topk_with_score_function_forward_kernel", None, ew("moe")),
    ("fused_topk_with_score_function_backward_kernel", None, ew("moe")),
    ("fused_moe_aux_loss_forward_kernel", None, ew("moe")),
    ("fused_score_for_moe_aux_loss_backward_kernel", None, ew("moe")),
    ("cast_transpose_optimized_kernel", None, ew("cast_transpose")),
    ("cast_transpose_general_kernel", None, ew("cast_transpose")),
    ("cast_transpose_fusion_kernel_optimized", None, ew("cast_transpose")),
    ("cast_transpose_fused_kernel_notaligned", None, ew("cast_transpose")),
    ("multi_cast_transpose_kernel", None, ew("cast_transpose")),
    ("transpose_optimized_kernel", None, ew("cast_transpose")),
    ("transpose_general_kernel", None, ew("cast_transpose")),
    ("transpose_dbias_kernel_notaligned", None, ew("cast_transpose")),
    ("reduce_dbias_kernel", None, ew("cast_transpose")),
    ("dgated_act_cast_transpose_kernel_notaligned", None, ew("cast_transpose")),
    ("block_scaled_cast_transpose_kernel", None, ew("cast_transpose")),
    ("block_scaled_1d_cast_transpose_kernel", None, ew("cast_transpose")),
    ("swap_first_dims_kernel", None, ew("cast_transpose")),
    ("cast_fp8_1D_kernel", None, ew("cast_transpose")),
    ("cast_fp8_2D_kernel", None, ew("cast_transpose")),
    ("cast_fp8_gated_kernel", None, ew("cast_transpose")),
    ("quantize_mxfp8_kernel_cast_only", None, ew("cast_transpose")),
    ("quantize_gated_mxfp8_kernel", None, ew("cast_transpose")),
    ("dequantize_mxfp8_kernel", None, ew("cast_transpose")),
    ("quantize_transpose_nvfp4_tuned_1D_kernel", None, ew("cast_transpose")),  # "tuned", yet no norm
    ("quantize_transpose_nvfp4_2D_kernel", None, ew("cast_transpose")),
    ("dequantize_fp4_kernel", None, ew("cast_transpose")),
    ("compute_columnwise_amax_kernel", None, ew("cast_transpose")),
    ("group_quantize_mxfp8_kernel", None, ew("cast_transpose")),
    ("amax_kernel", None, ew("fp8_scaling")),
    ("compute_scale_from_amax_kernel", None, ew("fp8_scaling")),
    ("zero_amax_kernel", None, ew("fp8_scaling")),
    ("fp8_block_scaling_compute_partial_amax_kernel", None, ew("fp8_scaling")),
    ("mxfp8_scaling_swizzle_kernel", None, ew("fp8_scaling")),
    ("nvfp4_compute_per_tensor_scale_kernel", None, ew("fp8_scaling")),
    ("cross_entropy_kernel", None, ew("cross_entropy")),
    ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(float*, "
     "float*, float*, long*, float*, bool, long, long, long, long)", None, ew("cross_entropy")),
    ("scaled_softmax_warp_forward", None, ew("softmax")),
    ("scaled_masked_softmax_warp_backward", None, ew("softmax")),
    ("scaled_upper_triang_masked_softmax_warp_forward", None, ew("softmax")),
    ("scaled_aligned_causal_masked_softmax_warp_backward", None, ew("softmax")),
    ("cunn_SoftMaxForward", None, ew("softmax")),
    ("fused_rope_forward_kernel", None, ew("rope")),
    ("fused_rope_backward_kernel", None, ew("rope")),
    ("fused_qkv_rope_forward_kernel", None, ew("rope")),
    ("fused_qkv_rope_backward_kernel", None, ew("rope")),
    ("fused_rope_thd_linear_grid_forward_kernel", None, ew("rope")),
    ("triton_poi_fused_apply_rotary_pos_emb_2", None, ew("rope")),
    ("dropout_kernel_fwd_f16", None, ew("dropout")),
    ("fused_dropout_kernel_vec", None, ew("dropout")),
    ("gated_act_kernel", None, ew("bias_activation")),
    ("dgated_act_kernel", None, ew("bias_activation")),
    ("unary_kernel", "void transformer_engine::unary_kernel<4u, transformer_engine::Empty, "
     "&transformer_engine::gelu<float, float>, __nv_bfloat16, __nv_bfloat16>(__nv_bfloat16 const*)",
     ew("bias_activation")),
    ("unary_grad_kernel", None, ew("bias_activation")),
    ("triton_poi_fused_mul_silu_0", None, ew("bias_activation")),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel(at::TensorIteratorBase&)::"
     "{lambda()#1}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, float)", None,
     ew("bias_activation")),
    # seen in the real traces (nsys short + demangled, Kineto demangled)
    ("void cask_cudnn_infer::computeOffsetsKernel<false, false>(cask_cudnn_infer::ComputeOffsetsParams)", None, GEMM),
    ("void cudnn::cnn::reduce_wgrad_nchw_helper<float, float>(void*, void const*, float, int, int)", None, GEMM),
    ("void cudnn::bn_fw_tr_1C11_singleread<float, 512, true, 1, 2, 0>(cudnn::bn_fw_tr_1C11_args<float>)", None, NORM),
    ("vectorized_elementwise_kernel", "void at::native::vectorized_elementwise_kernel<(int)8, at::native::"
     "bfloat16_copy_kernel_cuda(at::TensorIteratorBase &)::[lambda(float) (instance 1)], std::array<char *, "
     "(unsigned long)2>>(int, T2, T3)", ew("copy")),
    ("CatArrayBatchedCopy_vectorized", None, ew("copy")),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> "
     ">(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)", None, MEMSET),
    ("elementwise_kernel", "void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_"
     "nocast<at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float>>>(at::"
     "TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)", ew()),
    ("reduce_kernel", "void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, at::native::"
     "MeanOps<float, float, float, float>, unsigned int, float, (int)4, (int)4>>(T3)", ew()),
    ("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>(cudnn::ops::"
     "nchw2nhwc_params_t<float>, float const*, float*)", None, ew()),
    ("void at::native::(anonymous namespace)::max_pool_forward_nchw<float, float>(int, float const*, long, long, "
     "long, int, int, int, int, int, int, int, int, int, int, float*, long*)", None, ew()),
    # PyTorch glue
    ("indexSelectLargeIndex", None, ew()),
    ("embedding_backward_feature_kernel", None, ew()),
    # embedding_dense_backward's segment kernels and the gather of aten::gather (tests/data/h100)
    ("void at::native::(anonymous namespace)::krn_partials_per_segment<long>(long*, long const*, long const*, long)",
     None, ew()),
    ("compute_grad_weight", "void at::native::(anonymous namespace)::compute_grad_weight<float, long>(long const*)",
     ew()),
    ("void at::native::(anonymous namespace)::sum_and_scatter<float, long>(long const*, float*, long)", None, ew()),
    ("void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)",
     None, ew()),
    ("triton_red_fused_sum_1", None, ew()),
]

# Must not be taken for what they resemble.
NEAR_MISSES: list[tuple[str, str | None, KernelClass]] = [
    ("nccl_like_helper", None, OTHER),  # NCCL kernels are nccl…Kernel_…
    ("ncclKernelHelper", None, OTHER),
    ("launcher", "void my_ns::launcher<&ncclDevKernel_AllReduce_Sum_f32_RING_LL>(int)", OTHER),
    ("void at::native::vectorized_elementwise_kernel<4, my::Tag<ncclDevKernel_SendRecv>>(int)", None, ew()),
    ("my_gemm_wrapper_elementwise", None, OTHER),  # no GEMM family, no PyTorch elementwise kernel
    ("my_nvjet_wrapper", None, OTHER),
    ("void at::native::vectorized_elementwise_kernel<4, cutlass::half_t>(int)", None, ew()),  # CUTLASS type only
    ("layer_norm_tuned_helper", None, NORM),  # a norm, not one of TE's tuned kernels
    ("ln_fwd_tuned_kernel_helper", None, OTHER),
    ("xln_fwd_tuned_kernel", None, OTHER),
    ("flash_fwd_kernel", "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4>, flash::Softmax<2>, "
     "true>(flash::Flash_fwd_params)", ATTN),  # softmax inside attention stays attention
    ("my_userbuffers_copy", None, OTHER),
    ("producer_kernel_v2", None, OTHER),
    ("void deep_epsilon::scale<float>(float*)", None, OTHER),
    ("void my::deep_ep_like::dispatch<8>(int*)", None, OTHER),
    # CUB scans in a namespace that only ends like DeepSeek's (profile-data: `cdpsk::ep::CUB_…`, not DeepEP)
    ("void cdpsk::ep::CUB_200200_900_NS::DeviceScanKernel<int>(int*)", None, OTHER),
    ("sync_kernel", None, OTHER),
    ("void my_app::dispatch_kernel<float>(float*)", None, OTHER),
    ("property_copy_kernel", None, OTHER),  # "rope" inside a word
    ("cudnn_infer_ampere_scudnn_128x64_relu_xregs_large_nn_v1", None, GEMM),  # relu epilogue, still a GEMM
    ("nvjet_tst_128x64_64x8_1x2_h_bz_bias_gelu_TNT", None, GEMM),
    ("rmsnorm_fwd_tuned_kernel_v2", None, NORM),
    ("void my::cudnn::fusion::compute_dot_do_o<true>(void const*)", None, OTHER),  # not cuDNN's own namespace
    ("void cudnn::fusion::rowwise_reduce<float>(float const*)", None, OTHER),  # other cuDNN fusion kernels
]


@pytest.mark.parametrize(("short", "demangled", "expected"), POSITIVE + NEAR_MISSES,
                         ids=[c[0][:80] for c in POSITIVE + NEAR_MISSES])
def test_name_forms(short: str, demangled: str | None, expected: KernelClass) -> None:
    assert classify_kernel(short, demangled) == expected


def test_every_rule_has_a_positive_case() -> None:
    hit = {rule_index(s, d) for s, d, _ in POSITIVE}
    assert [PATTERNS[i][0] for i in range(len(RULES)) if i not in hit] == []


def test_table_values_are_the_published_vocabulary() -> None:
    for regex, category, collective, library, kind in PATTERNS:
        re.compile(regex)
        assert category in CATEGORIES, regex
        if category == "comm":
            assert collective in COLLECTIVES and library in LIBRARIES, regex
        else:
            assert collective is None and library is None, regex
        assert kind is None or (category == "elementwise" and kind in KINDS), regex


@pytest.mark.parametrize(("name", "head"), [
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)", "ncclDevKernel_SendRecv"),
    ("void at::native::vectorized_elementwise_kernel<(int)8, at::native::f(at::TensorIteratorBase &)::"
     "[lambda(float) (instance 1)], std::array<char *, (unsigned long)2>>(int, T2, T3)",
     "at::native::vectorized_elementwise_kernel<(int)8, at::native::f(at::TensorIteratorBase &)::"
     "[lambda(float) (instance 1)], std::array<char *, (unsigned long)2>>"),
    ("nvjet_tst_64x8_64x16_2x4_h_bz_TNT", "nvjet_tst_64x8_64x16_2x4_h_bz_TNT"),
    ("void (anonymous namespace)::softmax_warp_forward<float>(float*)",
     "(anonymous namespace)::softmax_warp_forward<float>"),
])
def test_signature_head_keeps_templates_and_drops_arguments(name: str, head: str) -> None:
    assert signature_head(name) == head


def test_classify_names_is_aligned_and_tolerates_missing_demangled_names() -> None:
    shorts = ["ncclDevKernel_SendRecv", "nvjet_tst_96x64_64x10_1x2_h_bz_bias_TNN", "Kernel", "mystery"]
    demangled = [None, float("nan"), "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(P)",
                 None]
    category, collective, library = classify_names(shorts, demangled)
    assert all(a.dtype == object and len(a) == 4 for a in (category, collective, library))
    assert list(category) == ["comm", "gemm", "gemm", "other"]
    assert list(collective) == ["send_recv", None, None, None]
    assert list(library) == ["nccl", None, None, None]
    assert [len(a) for a in classify_names([])] == [0, 0, 0]
    with pytest.raises(ValueError):
        classify_names(["a", "b"], ["a"])


@pytest.mark.parametrize(("copy_kind", "expected"), [
    (10, comm("other", "peer_copy")),  # PtoP
    (8, KernelClass("memcpy")),  # DtoD
    (1, KernelClass("memcpy")),  # HtoD
    (2, KernelClass("memcpy")),  # DtoH
    (np.int64(10), comm("other", "peer_copy")),
])
def test_classify_memcpy(copy_kind: int, expected: KernelClass) -> None:
    assert classify_memcpy(copy_kind) == expected


# Real traces. Expected classes by family, first fragment contained in the name wins; written
# from reading the traces, independently of the pattern table.
REAL_FAMILIES: list[tuple[str, KernelClass]] = [
    ("ncclDevKernel_SendRecv", comm("send_recv")),  # all_to_all for sequence parallelism, as SendRecv
    ("ncclKernel_AllReduce_RING_LL_Sum_float", comm("all_reduce")),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t", comm("broadcast")),
    ("flash_fwd_kernel", ATTN),
    ("nvjet_tst_", GEMM),
    ("cutlass", GEMM),  # cutlass::Kernel, cuDNN's cutlass_cudnn_* (also mangled)
    ("sm80_xmma_", GEMM),  # cuDNN implicit-GEMM convolutions
    ("_sgemm_", GEMM),
    ("ampere_scudnn_", GEMM),
    ("splitKreduce_kernel", GEMM),
    ("epilogue::impl::globalKernel", GEMM),
    ("magma_sgemmEx_kernel", GEMM),
    ("cudnn::cnn::reduce_wgrad", GEMM),  # weight-gradient reduction of a convolution
    ("cask_cudnn_infer::computeOffsetsKernel", GEMM),  # index setup of an implicit-GEMM convolution
    ("vectorized_layer_norm_kernel", NORM),
    ("cudnn::bn_", NORM),  # batch norm
    ("multi_tensor_apply_kernel", OPT),
    ("FillFunctor", MEMSET),
    ("copy_kernel_cuda", ew("copy")),
    ("CatArrayBatchedCopy", ew("copy")),
    ("GeluCUDAKernelImpl", ew("bias_activation")),
    ("threshold_kernel_impl", ew("bias_activation")),  # ReLU
    ("sigmoid", ew("bias_activation")),
    ("tanh", ew("bias_activation")),
    ("softmax_warp_", ew("softmax")),
    ("max_pool_", ew()),
    ("cudnn::ops::n", ew()),  # NCHW <-> NHWC layout transposes
    ("elementwise_kernel", ew()),
    ("reduce_kernel", ew()),
]


def _expected_real(name: str) -> KernelClass | None:
    return next((cls for fragment, cls in REAL_FAMILIES if fragment in name), None)


@pytest.fixture(scope="module")
def nsys_names() -> list[tuple[str, str]]:
    with sqlite3.connect(f"file:{NSYS_TRACE}?mode=ro", uri=True) as db:
        return db.execute("SELECT DISTINCT s.value, d.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                          "JOIN StringIds s ON s.id = k.shortName "
                          "JOIN StringIds d ON d.id = k.demangledName").fetchall()


@pytest.fixture(scope="module")
def kineto_names() -> set[str]:
    """Kernel names of the Kineto traces; a regex over the text is ten times faster than json.load."""
    assert KINETO_TRACES, f"no Kineto traces under {TRACES}"
    event = re.compile(r'"cat": "kernel", "name": ("(?:[^"\\]|\\.)*")')
    names: set[str] = set()
    for path in KINETO_TRACES:
        names |= {json.loads(m) for m in event.findall(gzip.open(path).read().decode())}
    return names


def test_real_nsys_kernels(nsys_names: list[tuple[str, str]]) -> None:
    assert len(nsys_names) > 20
    wrong = [(s, d[:100], classify_kernel(s, d), _expected_real(d)) for s, d in nsys_names
             if classify_kernel(s, d) != _expected_real(d)]
    assert wrong == []


def test_real_kineto_kernels(kineto_names: set[str]) -> None:
    assert len(kineto_names) > 100
    wrong = [(n[:100], classify_kernel(n), _expected_real(n)) for n in kineto_names
             if classify_kernel(n) != _expected_real(n)]
    assert wrong == []


def test_no_real_kernel_is_other(nsys_names: list[tuple[str, str]], kineto_names: set[str]) -> None:
    """Every kernel of the real traces has a category, from the short name alone too; none is argued
    to be "other" so far."""
    names = [s for s, _ in nsys_names] + [d for _, d in nsys_names] + sorted(kineto_names)
    category, _, _ = classify_names(names)
    assert [n[:100] for n, c in zip(names, category) if c == "other"] == []
