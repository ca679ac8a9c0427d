"""Kernel mix: where compute time goes by kernel family, and the kernels a faster recipe would not run.

- Shares of step time (union per step ÷ step duration) for GEMM, attention, norm, element-wise and
  optimizer kernels: a GEMM share far below ~60 % on a large model says the time goes elsewhere.
- Unfused patterns, by name (research/kernel_taxonomy.md §3.3-§3.4): an attention softmax (with its
  mask) as its own kernel instead of inside a fused attention kernel; plain PyTorch dropout instead of
  Megatron's bias-dropout-add fusion (compiler-generated ``triton_*`` kernels are fusions);
  PyTorch activation functors instead of fused bias+activation (TE's activation kernels are fused);
  log-softmax + NLL instead of a fused cross-entropy; a RoPE kernel that is neither TE's fused one nor
  compiler-generated. An unfused RoPE written as plain tensor ops is only multiplies and adds: nothing
  in its names says RoPE, so it cannot be told apart and is not counted.
- Attention implementation (flash / cudnn / unfused), with the kernel that shows it.
- MoE experts as one grouped GEMM or one GEMM per local expert: the GEMM launches between a token
  permutation and the next MoE kernel count the expert GEMMs of one layer pass.
- Host↔device copies the device spent not computing (``memcpy.exposed``): CPU offloading or ``.item()``
  / ``.cpu()`` copies that stall the step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from perfdoctor.classify.kernels import classify_kernel, signature_head
from perfdoctor.classify.timeline import category_mask, name_pairs
from perfdoctor.measure import intervals as iv
from perfdoctor.measure.steps import Steps
from perfdoctor.memo import per_object
from perfdoctor.model import Timeline
from perfdoctor.table import Table

FAMILIES: dict[str, tuple[str, ...]] = {
    "attention": ("attention",),
    "norm": ("norm", "norm_persistent"),
    "elementwise": ("elementwise",),
    "optimizer": ("optimizer",),
}
UNFUSED_KINDS = ("softmax", "cross_entropy", "dropout", "bias_activation", "rope")
# nsys ENUM_CUDA_MEMCPY_OPER: 1 = host to device, 2 = device to host.
HOST_COPY_KINDS = (1, 2)

_LOG_SOFTMAX = re.compile(r"(?i)log_?softmax|nll_loss")
_FUSED_SOFTMAX = re.compile(r"(?i)online_softmax")  # TE's fused cross-entropy (Triton)
_INDUCTOR = re.compile(r"triton_(?:poi|red|per)_fused_")  # kernels Inductor (torch.compile) generated
_COMPILED = re.compile(r"^triton_|(?i:fused_(?:bias|add)|bias_dropout|dropout_add)")
_NATIVE = re.compile(r"at::native::")
_FUSED_ROPE = re.compile(r"(?i)fused|^triton_|transformer_engine::|flash")
_GROUPED_GEMM = re.compile(r"GroupProblemShape|GemmGrouped|(?i:grouped_?gemm)")
_CUDNN_ATTENTION = re.compile(r"cudnn_generated")
_FLASH_ATTENTION = re.compile(r"(?i)flash")
_MOE_PERMUTE = re.compile(r"(?i)(?<!un)permute")


@dataclass(frozen=True)
class StepMix:
    """Per step (aligned with the steps, ns): measured on the device's interval sets, so per window of the
    steps (perfdoctor.measure.windows)."""

    family_ns: dict[str, np.ndarray]  # union of each family's kernels per step
    unfused_ns: dict[str, np.ndarray]  # per unfused kind (zeros for a kind not in the steps)
    unfused_total_ns: np.ndarray  # union over all unfused kernels (overlaps counted once)
    memcpy_exposed_ns: np.ndarray  # host↔device copy time with no kernel running, per step


@dataclass(frozen=True)
class MixEvidence:
    """What the whole timeline's kernels show of the mix."""

    unfused_names: dict[str, str]  # unfused kind -> one kernel name that shows it
    attention: str | None  # flash | cudnn | unfused | other
    attention_evidence: str | None
    moe_gemm: str | None  # grouped | per_expert
    moe_evidence: str | None
    moe_gemm_launches: int | None  # most GEMM launches between a token permute and the next MoE kernel


def mix_per_step(tl: Timeline, kcls: Table, steps: Steps, compute: iv.Intervals, unfused: np.ndarray) -> StepMix:
    """The mix of one timeline's steps; ``compute``: its compute kernels' union (``Activity.compute``),
    ``unfused``: its kernels' unfused kinds (:func:`unfused_kinds`, of the whole timeline's kernels for a
    window of its steps: found once per distinct name, not again per window)."""
    k = tl.kernels
    start, end = k.col("start"), k.col("end")

    def per_step(mask: np.ndarray) -> np.ndarray:
        return iv.overlap_per_interval(steps.starts, steps.ends, iv.union(start[mask], end[mask])).astype(float)

    families = {f: per_step(category_mask(kcls, *cats)) for f, cats in FAMILIES.items()}
    unfused_ns = {kind: per_step(unfused == i) for i, kind in enumerate(UNFUSED_KINDS)}
    return StepMix(families, unfused_ns, per_step(unfused >= 0), _exposed_host_copies(tl, compute, steps))


def mix_evidence(tl: Timeline, kcls: Table) -> MixEvidence:
    """The attention backend, the MoE expert GEMMs and the unfused kernels' names of one timeline."""
    k = tl.kernels
    unfused, evidence = unfused_kinds(k)
    attention, attention_evidence = _attention_impl(k, category_mask(kcls, "attention"), unfused, evidence)
    moe_gemm, moe_evidence, launches = _moe_gemms(k, category_mask(kcls, "gemm"))
    return MixEvidence(evidence, attention, attention_evidence, moe_gemm, moe_evidence, launches)


def unfused_kind(short: str, demangled: str | None = None) -> str | None:
    """Which unfused pattern a kernel is, from its names (see the module docstring), or None."""
    kind = classify_kernel(short, demangled).kind
    head = signature_head(demangled or short)
    names = f"{short} {head}"
    if _LOG_SOFTMAX.search(names):  # torch.compile's own log-softmax/NLL kernels are the fusion advised
        return None if _INDUCTOR.match(short) or _INDUCTOR.match(head) else "cross_entropy"
    if kind == "softmax":
        return None if _FUSED_SOFTMAX.search(names) else "softmax"
    if kind == "dropout":
        return None if _COMPILED.search(names) else "dropout"
    if kind == "bias_activation":
        return "bias_activation" if _NATIVE.search(names) else None
    if kind == "rope":
        return None if _FUSED_ROPE.search(names) else "rope"
    return None


@per_object
def unfused_kinds(k: Table) -> tuple[np.ndarray, dict[str, str]]:
    """Unfused kind per kernel (index into ``UNFUSED_KINDS``; −1 where fused or not such a kernel), and
    one kernel name per kind. Once per table (read-only result): the critical path's kernel marks, the
    windows' step quantities and the kernel mix all ask (at 10M kernels, 25 ms each)."""
    inverse, shorts, demangleds = name_pairs(k)
    kinds = [unfused_kind(s, d) for s, d in zip(shorts, demangleds)]
    evidence: dict[str, str] = {}
    for name, kind in zip(shorts, kinds):
        if kind is not None:
            evidence.setdefault(kind, name)
    codes = np.array([UNFUSED_KINDS.index(kind) if kind else -1 for kind in kinds], dtype=np.int8)
    return codes[inverse] if len(k) else np.zeros(0, dtype=np.int8), evidence


def _attention_impl(k: Table, attn: np.ndarray, unfused: np.ndarray, evidence: dict[str, str],
                    ) -> tuple[str | None, str | None]:
    """flash / cudnn from the longest attention kernel's name; unfused when only a softmax kernel shows."""
    if attn.any():
        names = k["short_name"]
        totals = np.bincount(names.codes[attn], weights=(k["end"] - k["start"])[attn].astype(np.float64),
                             minlength=names.values.size)
        present = sorted(np.flatnonzero(np.bincount(names.codes[attn], minlength=names.values.size)),
                         key=lambda i: str(names.values[i]))  # ties: the first name in order, as a groupby
        best = present[int(np.argmax(totals[present]))]
        top = str(names.values[best])
        impl = "cudnn" if _CUDNN_ATTENTION.search(top) else "flash" if _FLASH_ATTENTION.search(top) else "other"
        return impl, f"{top} ({totals[best] / 1e6:.1f} ms in the trace)"
    if "softmax" in evidence:
        count = int((unfused == UNFUSED_KINDS.index("softmax")).sum())
        return "unfused", f"{evidence['softmax']} ×{count} between GEMMs, no fused attention kernel"
    return None, None


def _moe_gemms(k: Table, gemm: np.ndarray) -> tuple[str | None, str | None, int | None]:
    inverse, shorts, demangleds = name_pairs(k)
    classes = [classify_kernel(s, d) for s, d in zip(shorts, demangleds)]
    moe_name = np.array([c.kind == "moe" for c in classes], dtype=bool)
    if not len(k) or not moe_name[inverse].any():
        return None, None, None
    grouped = [(s, m.group(0)) for s, d, c in zip(shorts, demangleds, classes)
               if c.category == "gemm" and (m := _GROUPED_GEMM.search(f"{s} {d or ''}"))]
    order = np.argsort(k.col("start"), kind="stable")
    is_gemm = gemm[order]
    is_moe = moe_name[inverse][order]
    permute = is_moe & np.array([bool(_MOE_PERMUTE.search(shorts[i])) for i in inverse[order]], dtype=bool)
    gemms_before = np.concatenate(([0], np.cumsum(is_gemm)))
    moe_pos = np.flatnonzero(is_moe)
    nxt = np.searchsorted(moe_pos, np.flatnonzero(permute), side="right")
    has_next = nxt < moe_pos.size
    spans = gemms_before[moe_pos[nxt[has_next]]] - gemms_before[np.flatnonzero(permute)[has_next] + 1]
    launches = int(spans.max()) if spans.size else None
    if grouped:
        return "grouped", f"grouped GEMM {grouped[0][0]} ({grouped[0][1]})", launches
    if launches and launches > 2:
        return "per_expert", f"{launches} GEMM launches between a token permute and the next MoE kernel", launches
    return None, None, launches


def _exposed_host_copies(tl: Timeline, compute: iv.Intervals, steps: Steps) -> np.ndarray:
    """Per step, ns of host↔device copies while no compute kernel ran."""
    cp = tl.memcpy
    host = np.isin(cp.col("copy_kind"), HOST_COPY_KINDS) if len(cp) else np.zeros(0, dtype=bool)
    copies = iv.union(cp.col("start")[host], cp.col("end")[host])
    return iv.overlap_per_interval(steps.starts, steps.ends, iv.subtract(copies, compute)).astype(float)
