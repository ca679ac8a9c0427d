"""Kernel taxonomy: what a GPU kernel is, from its name alone.

Every later stage asks the same questions of a kernel: is it communication (and which collective,
from which library), a GEMM, attention, a LayerNorm that can be starved by NCCL, or memory-bound glue?
The answers come from one ordered table of regular expressions, ``PATTERNS``: the first row that
matches wins, so specific families sit above the catch-alls that would also match them (attention
before GEMM because flash kernels are CUTLASS templates; ReduceScatter before Reduce). The facts
behind every row are in research/kernel_taxonomy.md (cited as §n below).

A row is tried on the short name and on the *signature head* of the demangled name: the demangled
name without its trailing argument list and without ``void``. Templates stay, because they carry
what the bare function name hides (``vectorized_elementwise_kernel<…GeluCUDAKernelImpl…>``,
``cutlass::Kernel<cutlass_80_tensorop_…gemm…>``). Patterns anchored with ``^`` therefore only
match the kernel's own name, never a string buried in someone else's template arguments.
Kineto traces carry only demangled names; pass them as ``short_name``, they are cut the same way.

``kind`` refines ``elementwise`` into the sub-kinds a detector of unfused or avoidable work needs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

# NCCL collective kernels, every naming scheme (§1.1, §1.3): >=2.8 `ncclKernel_<Coll>_…`,
# >=2.19 `ncclDevKernel_<Coll>…`, >=2.27 `ncclSymkDevKernel_<Coll>_…`, <=2.7 `nccl<Coll>RingLLKernel_…`.
# The collective token must end where NCCL ends it, so `Reduce` never matches `ReduceScatter`.
_NCCL = r"^nccl(?:(?:Dev|Symk|SymkDev)?Kernel_{c}(?:_|$)|{c}(?:Ring|Tree|CollNet)?(?:LL128|LL)?Kernel_)"
_B = r"(?<![A-Za-z0-9])"  # start of an identifier or of one of its `_`-separated words

# (regex, category, collective, library, kind); first match wins.
PATTERNS: tuple[tuple[str, str, str | None, str | None, str | None], ...] = (
    # -- communication: NCCL (library nccl; symmetric-kernel NCCL is still NCCL, DESIGN §3) --
    (_NCCL.format(c="ReduceScatter"), "comm", "reduce_scatter", "nccl", None),
    (_NCCL.format(c="AllReduce"), "comm", "all_reduce", "nccl", None),
    (_NCCL.format(c="AllGatherV?"), "comm", "all_gather", "nccl", None),
    (_NCCL.format(c="Broadcast"), "comm", "broadcast", "nccl", None),
    (_NCCL.format(c="Reduce"), "comm", "reduce", "nccl", None),
    # AllToAll, Gather, Scatter, PP send/recv and CP ring exchange all run as SendRecv (§1.2).
    (_NCCL.format(c="SendRecv"), "comm", "send_recv", "nccl", None),
    # ncclDevKernel_Generic (unspecialised work), RCCL's Generic_1/_2/_4, future collectives.
    (r"^nccl(?:(?:Dev|Symk|SymkDev)?Kernel_|[A-Z][A-Za-z]*Kernel_)", "comm", "other", "nccl", None),
    # -- communication: TE userbuffers, TP comm-GEMM overlap (§3.2) --
    (r"^userbuffers_\w*?_ag(?![A-Za-z0-9])", "comm", "all_gather", "userbuffers", None),
    (r"^userbuffers_\w*?_rs(?![A-Za-z0-9])", "comm", "reduce_scatter", "userbuffers", None),
    (r"^userbuffers_\w*_(?:rr|rw|mc)(?![A-Za-z0-9_])", "comm", "all_reduce", "userbuffers", None),
    (r"^kuserbuffers_(?:push|pull)", "comm", "send_recv", "userbuffers", None),
    (r"^k?userbuffers_", "comm", "other", "userbuffers", None),
    # Atomic-GEMM signalling: consumer_kernel spins until a chunk's communication has landed.
    (r"^(?:producer_kernel|consumer_kernel|consumer_batch_kernel|reset_counters_kernel|tiny_delay_kern)$",
     "comm", "other", "userbuffers", None),
    # -- communication: symmetric memory (torch symm_mem, §1.3) --
    # torch's reduce_scatter op reuses the two-shot kernel with template flag reduce_scatter=true.
    (_B + r"two_shot_all_reduce_kernel<[^,]+,[^,]+,[^,]+,\s*(?:true|\(bool\)1)",
     "comm", "reduce_scatter", "symmetric_memory", None),
    # multimem_one_shot_reduce_kernel backs multimem_one_shot_all_reduce (each rank its own root).
    (_B + r"(?:multimem_all_reduce|multimem_one_shot_reduce|one_shot_all_reduce|two_shot_all_reduce)_kernel",
     "comm", "all_reduce", "symmetric_memory", None),
    (_B + r"multimem_all_gather_kernel", "comm", "all_gather", "symmetric_memory", None),
    # vLLM custom all-reduce: peers' IPC buffers, the same scheme as torch symm_mem.
    (_B + r"cross_device_reduce_[12]stage", "comm", "all_reduce", "symmetric_memory", None),
    # torch's NVSHMEM all_to_all_vdev (MoE token exchange): the splits exchange, then the data exchange.
    (_B + r"(?:allToAllV(?:_2d)?|exchangeSplitAndOffset(?:_2d)?)(?![A-Za-z0-9])",
     "comm", "all_to_all", "symmetric_memory", None),
    # -- communication: expert-parallel dispatch/combine libraries (§1.3, nsys_schema §6.1) --
    # DeepEP (`deep_ep::intranode|internode|internode_ll|elastic::…`), DeepSeek's internal build of it
    # (`dpsk::ep::internode::dispatch/combine/notify_dispatch/cached_notify`, `…::dispatch_ll/combine_ll`,
    # seen in deepseek-ai/profile-data), its MSCCL++ port (`mscclpp::ep::…`) and HybridEP (`hybrid_ep::`).
    # The layout kernel only counts tokens per rank and moves nothing: elementwise, before the comm rows.
    (r"^(?:\w+::)*(?:deep_ep::layout::|(?:deep_ep|dpsk::ep|mscclpp::ep)::(?:\w+::)*get_dispatch_layout)",
     "elementwise", None, None, "moe"),
    # DeepEP v2 also moves pipeline activations (`deep_ep::elastic::pp_send_impl / pp_recv_impl`).
    (r"^(?:\w+::)*deep_ep::(?:\w+::)*pp_(?:send|recv)", "comm", "send_recv", "deep_ep", None),
    (r"^(?:\w+::)*(?:deep_ep|dpsk::ep|mscclpp::ep)::", "comm", "all_to_all", "deep_ep", None),
    (r"^(?:\w+::)*hybrid_ep::(?:\w+::)*\w*(?:dispatch|combine)", "comm", "all_to_all", "deep_ep", None),
    (r"^(?:\w+::)*hybrid_ep::(?:\w+::)*device_sync_kernel", "comm", "other", "deep_ep", None),
    # -- communication: MSCCL++ collectives (`mscclpp::collective::allreducePacket`, `…::alltoallvPeerParallelKernel`);
    # the rest (executor, all-gather variants) as other --
    (r"^(?:\w+::)*mscclpp::(?:\w+::)*(?i:all_?to_?all)", "comm", "all_to_all", "mscclpp", None),
    (r"^(?:\w+::)*mscclpp::(?:\w+::)*(?i:all_?reduce)", "comm", "all_reduce", "mscclpp", None),
    (r"^(?:\w+::)*mscclpp::", "comm", "other", "mscclpp", None),
    # -- communication: NVSHMEM host-initiated collectives on a stream (nvshmemi_h_to_d_coll_defs.cuh) --
    (r"^(?:nvshmemi_)?alltoall\w*_on_stream_kernel", "comm", "all_to_all", "nvshmem", None),
    (r"^(?:nvshmemi_)?(?:fcollect|allgather)\w*_on_stream_kernel", "comm", "all_gather", "nvshmem", None),
    (r"^(?:nvshmemi_)?reducescatter\w*_on_stream_kernel", "comm", "reduce_scatter", "nvshmem", None),
    (r"^(?:nvshmemi_)?rdxn\w*_on_stream_kernel|^nvshmemi_reduce_kernel", "comm", "all_reduce", "nvshmem", None),
    (r"^(?:nvshmemi_)?broadcast\w*_on_stream_kernel", "comm", "broadcast", "nvshmem", None),
    (r"^(?:nvshmemi_)?(?:barrier|sync|sync_all)_on_stream_kernel\w*$", "comm", "other", "nvshmem", None),
    # -- communication: UCC's CUDA execution engine, the reduction steps of its collectives --
    (r"^UCC_REDUCE_\w*(?:CUDA|ROCM)", "comm", "other", "ucc", None),
    # -- attention (§3.3); above GEMM because flash kernels are CUTLASS/wgmma templates --
    (_B + r"flash_(?:fwd|bwd)_\w*kernel", "attention", None, None, None),
    (r"flash::(?:FlashAttn|prepare_varlen_num_blocks)", "attention", None, None, None),
    (_B + r"cudnn_generated_\w*(?:sdpa|flash_[fb]prop)", "attention", None, None, None),
    # cuDNN SDPA backward's own helpers around its bprop kernel: rowsum(dO·O) before it, the fp32 dQ
    # accumulator cast to 16 bits after it (seen on H100, PyTorch 2.11 / cuDNN 9.19, tests/data/h100).
    (r"^cudnn::fusion::(?:compute_dot_do_o|convert_dq_to_16bits)", "attention", None, None, None),
    (_B + r"(?:prepare_kernel_(?:fwd|bwd)|populate_rng_state_kernel|get_runtime_num_segments_kernel"
     r"|thd_(?:out_correction|grad_correction|lse|read_half_tensor|partition_indices)_kernel"
     r"|convert_(?:thd_to_bshd|bshd_to_thd)_kernel)", "attention", None, None, None),
    # SDPA mem-efficient (fmha_cutlassF/B, PyTorchMemEffAttention::AttentionKernel), flex attention.
    (r"(?i:fmha|flash_?attn|fused_?attn|flex_?attention|attention_?(?:backward_?)?kernel|paged_?attention)",
     "attention", None, None, None),
    # -- GEMM and implicit-GEMM convolution (§4) --
    (r"^sm\d+_xmma_", "gemm", None, None, None),
    (r"^(?:cudnn_(?:infer|train)_)?(?:maxwell|pascal|volta|turing|ampere|hopper|blackwell)_\w*?(?:gemm|cudnn)",
     "gemm", None, None, None),
    (r"^nvjet_", "gemm", None, None, None),
    # ROCm: Tensile / hipBLASLt solutions ("Cijk_Alik_Bljk_..."), composable_kernel GEMMs
    (r"^Cijk_|ck(?:_tile)?::\w*gemm", "gemm", None, None, None),
    # CUTLASS namespace or library kernels, cuDNN's private copies, and CUTLASS names Kineto left mangled.
    (r"^(?:_ZN\d+)?cutlass", "gemm", None, None, None),
    # Convolution helpers launched by cuDNN around its implicit GEMMs (offsets, wgrad reduction).
    (r"^(?:cask_\w+|cudnn::cnn)::", "gemm", None, None, None),
    # cuBLAS helpers: split-K reduction and the cuBLASLt epilogue belong to their GEMM.
    (r"^cublas(?:Lt)?::|" + _B + r"splitKreduce_kernel|^epilogue::impl::globalKernel", "gemm", None, None, None),
    (_B + r"(?:magma_\w*gemm|gemv2[NT]_kernel|gemmSN_[NT]{2}_kernel|gemmk1_kernel)", "gemm", None, None, None),
    # DeepGEMM, TRT-LLM bmm_*, torch.compile GEMM templates.
    (r"^(?:deep_gemm::|bmm_|triton_tem_)", "gemm", None, None, None),
    # -- normalisation (§3.1) --
    # Tuned TE kernels fill the GPU exactly (cooperative launch when CTAS_PER_ROW > 1): they wait
    # for every SM, so they are the ones an NCCL kernel holding SMs delays.
    (_B + r"(?:ln|rmsnorm)_(?:fwd|bwd)(?:_finalize)?_tuned_kernel(?![A-Za-z0-9_])",
     "norm_persistent", None, None, None),
    (_B + r"(?:ln|rmsnorm)_(?:fwd|bwd)(?:_finalize)?_general_kernel(?![A-Za-z0-9_])", "norm", None, None, None),
    (_B + r"(?:vectorized_layer_norm_kernel|layer_norm_grad_input_kernel|GammaBetaBackward|RowwiseMomentsCUDAKernel"
     r"|LayerNormForwardCUDAKernel|batch_norm_\w+kernel)", "norm", None, None, None),
    (_B + r"cu(?:Apply(?:Layer|RMS)Norm|ComputeGradInput|Compute(?:Part)?GradGammaBeta)", "norm", None, None, None),
    (_B + r"bn_(?:fw|bw)_", "norm", None, None, None),  # cuDNN batch norm
    (r"(?i:(?:layer|rms|group|batch|instance)_?norm)", "norm", None, None, None),
    # -- optimizer (§3.4: multi-tensor apply; apex FusedAdam's adam_cuda_kernel) --
    (_B + r"multi_tensor_apply_kernel", "optimizer", None, None, None),
    (r"(?i:(?<![a-z0-9])(?:fused_)?(?:adamw?|lamb|sgd|adagrad)_\w*kernel)", "optimizer", None, None, None),
    # -- elementwise, by kind (§3.4); kinds first, they hide inside generic PyTorch templates --
    (_B + r"(?:moe_(?:un)?permute|fused_topk|fused_(?:score_for_)?moe_aux_loss)", "elementwise", None, None, "moe"),
    (r"(?i:cast_transpose)|" + _B + r"(?:transpose_(?:optimized|general|dbias)_kernel|reduce_dbias_kernel"
     r"|swap_first_dims_kernel|cast_fp8_|(?:de)?quantize_|compute_columnwise_amax_kernel)",
     "elementwise", None, None, "cast_transpose"),
    (r"amax|" + _B + r"(?:fp8_block_scaling|mxfp8_scaling|nvfp4)_", "elementwise", None, None, "fp8_scaling"),
    (r"(?i:cross_?entropy)|" + _B + r"nll_loss", "elementwise", None, None, "cross_entropy"),
    (r"(?i:softmax)", "elementwise", None, None, "softmax"),
    (r"(?i:(?<![a-z])(?:rope(?![a-z])|rotary))", "elementwise", None, None, "rope"),
    (r"(?i:dropout)", "elementwise", None, None, "dropout"),
    # TE activations (util/vectorized); PyTorch, Triton and JIT-fused bias+activation kernels.
    (_B + r"(?:d?gated_act_kernel|unary_(?:grad_)?kernel)", "elementwise", None, None, "bias_activation"),
    (r"(?i:(?<![a-z])(?:gelu|silu|swiglu|geglu|reglu|relu|sigmoid|tanh|swish|threshold_kernel))",
     "elementwise", None, None, "bias_activation"),
    # Copies stay elementwise: they cast (`.to(bf16)`), gather (`torch.cat`) or re-stride (`.contiguous()`).
    (_B + r"CatArrayBatchedCopy|copy_kernel_cuda", "elementwise", None, None, "copy"),
    # A fill reads nothing and writes a constant (`zero_()`, `fill_()`): a memset done by a kernel.
    (_B + r"FillFunctor", "memset", None, None, None),
    # -- elementwise, generic memory-bound kernels --
    (r"elementwise\w*_kernel|" + _B + r"reduce_kernel(?![A-Za-z0-9_])", "elementwise", None, None, None),
    # Gathers, pooling, and embedding_dense_backward's segment kernels (EmbeddingBackwardKernel.cu).
    (_B + r"(?:indexSelect(?:Large|Small)Index|indexing_backward_kernel|embedding_backward\w*_kernel"
     r"|vectorized_gather_kernel|krn_partials?_(?:per_segment|segment_offset)|compute_num_of_partial_segments"
     r"|compute_grad_weight(?:_bags)?|sum_and_scatter"
     r"|(?:max|avg|adaptive_(?:max|avg|average))_?pool)", "elementwise", None, None, None),
    (r"^cudnn::ops::|" + _B + r"(?:nchwToNhwc|nhwcToNchw)Kernel", "elementwise", None, None, None),
    (r"^triton_(?:poi|per|red)_", "elementwise", None, None, None),
)

CATEGORIES = ("gemm", "attention", "norm_persistent", "norm", "comm", "elementwise", "optimizer", "memcpy",
              "memset", "other")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "send_recv", "broadcast", "reduce", "all_to_all",
               "other")
LIBRARIES = ("nccl", "userbuffers", "symmetric_memory", "deep_ep", "mscclpp", "nvshmem", "ucc", "peer_copy")
KINDS = ("moe", "cast_transpose", "fp8_scaling", "cross_entropy", "softmax", "rope", "dropout", "bias_activation",
         "copy")

# nsys ENUM_CUDA_MEMCPY_OPER (nsys_schema §3.14): 10 = PtoP, a copy between two GPUs.
MEMCPY_PEER_TO_PEER = 10


@dataclass(frozen=True)
class KernelClass:
    """Where a kernel sits in the taxonomy. ``collective`` and ``library`` are set for comm only."""

    category: str  # one of CATEGORIES
    collective: str | None = None  # one of COLLECTIVES
    library: str | None = None  # one of LIBRARIES
    kind: str | None = None  # one of KINDS, elementwise only


@dataclass(frozen=True)
class Rule:
    """One compiled row of ``PATTERNS``."""

    pattern: re.Pattern[str]
    kernel_class: KernelClass


RULES: tuple[Rule, ...] = tuple(
    Rule(re.compile(regex), KernelClass(category, collective, library, kind))
    for regex, category, collective, library, kind in PATTERNS
)
OTHER = KernelClass("other")
_MEMCPY = KernelClass("memcpy")
_PEER_COPY = KernelClass("comm", "other", "peer_copy")


def _without_trailing(name: str, opening: str, closing: str) -> str:
    """``name`` without the bracketed group it ends with, found by balancing brackets from the end
    (template arguments hold parentheses of their own: ``(int)8``, ``[lambda(float) (instance 1)]``)."""
    if not name.endswith(closing):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        depth += {closing: 1, opening: -1}.get(name[i], 0)
        if depth == 0:
            return name[:i].rstrip()
    return name


def signature_head(name: str) -> str:
    """``name`` without a trailing ``(argument list)`` and a leading ``void``; templates are kept."""
    return _without_trailing(name.strip(), "(", ")").removeprefix("void ").lstrip()


def short_kernel_name(name: str) -> str:
    """What nsys calls a kernel's short name: the function alone, without return type, namespaces,
    template arguments and argument list (``void at::native::vectorized_elementwise_kernel<4, ...>(...)``
    → ``vectorized_elementwise_kernel``). Kineto traces carry only the demangled signature."""
    head = _without_trailing(signature_head(name), "<", ">").replace("(anonymous namespace)::", "")
    return head.rsplit("::", 1)[-1].split(" ")[-1] or name


def rule_index(short_name: str, demangled_name: str | None = None) -> int | None:
    """Index in ``RULES`` of the first rule matching either name, or None: says why a class was given."""
    names = {signature_head(short_name)}
    if demangled_name:
        names.add(signature_head(demangled_name))
    names.discard("")
    for i, rule in enumerate(RULES):
        search = rule.pattern.search
        for name in names:  # (a loop, not any() over a generator: a third of the time for a few hundred names)
            if search(name):
                return i
    return None


@lru_cache(maxsize=65536)
def classify_kernel(short_name: str, demangled_name: str | None = None) -> KernelClass:
    """Class of one kernel; ``OTHER`` when no rule matches."""
    i = rule_index(short_name, demangled_name)
    return OTHER if i is None else RULES[i].kernel_class


def classify_names(short_names: Sequence[str], demangled_names: Sequence[str | None] | None = None,
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised over UNIQUE names (callers pass the distinct names of a trace, typically hundreds):
    returns three object arrays (category, collective or None, library or None) aligned with the input.

    A missing demangled name may be None or NaN (pandas); it is ignored.
    """
    if demangled_names is None:
        demangled_names = [None] * len(short_names)
    if len(demangled_names) != len(short_names):
        raise ValueError(f"{len(short_names)} short names but {len(demangled_names)} demangled names")
    classes = [classify_kernel(str(s), d if isinstance(d, str) else None)
               for s, d in zip(short_names, demangled_names)]
    return (np.array([c.category for c in classes], dtype=object),
            np.array([c.collective for c in classes], dtype=object),
            np.array([c.library for c in classes], dtype=object))


def classify_memcpy(copy_kind: int) -> KernelClass:
    """Class of a CUDA memcpy row from its nsys ``copyKind``: peer-to-peer copies are communication
    (userbuffers with copy engines, NCCL >= 2.28 CE collectives, §1.1, §3.2); the rest are memcpy."""
    return _PEER_COPY if copy_kind == MEMCPY_PEER_TO_PEER else _MEMCPY
