"""Every knob of the tuning guide's index (Megatron-Bridge edition, and the NeMo 2 edition) is named by
at least one rule's knobs, or listed in rules/NOT_DETECTABLE.md with the reason."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.paths import GUIDE, REPO

MB_GUIDE = GUIDE / "megatron-bridge-performance-guide.md"
NEMO_GUIDE = GUIDE / "nemo2-performance-guide.txt"
RULES = REPO / "rules"
FIELDS = ("megatron_bridge", "nemo", "megatron_lm", "env", "value", "note")

# The two indexes as parsed from the guide texts (tests/data/guide/), written out so that a change of the
# guides shows in review; test_snapshot_matches_the_guides keeps them in sync with the texts.
MB_INDEX = (
    'CommOverlapConfig.tp_comm_overlap',
    'CommOverlapConfig.tp_comm_overlap_cfg',
    'CUDA_DEVICE_MAX_CONNECTIONS',
    'TrainingConfig.manual_gc_interval',
    'MixedPrecisionConfig.fp8_param',
    'ProfilingConfig',
    'NCCL_NET_GDR_C2C',
    'NCCL_NET_GDR_LEVEL',
    'NCCL_NVLS_ENABLE',
    'NVTE_BWD_LAYERNORM_SM_MARGIN=<#SM for DP collectives',
    'TransformerConfig.attention_backend',
    'AttnBackend',
    'NVTE_FWD_LAYERNORM_SM_MARGIN=<#SM for DP collectives',
    'PYTORCH_CUDA_ALLOC_CONF',
    'TrainingConfig.micro_batch_size',
    'FinetuningDatasetConfig.packed_sequence_specs.packed_sequence_size',
    'TransformerConfig.apply_rope_fusion',
    'TransformerConfig.bias_activation_fusion',
    'TransformerConfig.bias_dropout_fusion',
    'TransformerConfig.cp_comm_type',
    'TransformerConfig.cpu_offloading',
    'TransformerConfig.cpu_offloading_num_layers',
    'TransformerConfig.cpu_offloading_weights',
    'GPTProvider.cross_entropy_loss_fusion',
    'TransformerConfig.enable_cuda_graph',
    'MixedPrecisionConfig.fp8_param_gather',
    'GPTProvider.gradient_accumulation_fusion',
    'TransformerConfig.masked_softmax_fusion',
    'TransformerConfig.recompute_granuality',
    'TransformerConfig.recompute_method',
    'TransformerConfig.recompute_num_layers',
    'OptimizerConfig.use_precision_aware_optimizer',
    'GPTProvider.account_for_embedding_in_pipeline_split',
    'GPTProvider.account_for_loss_in_pipeline_split',
    'TransformerConfig.context_parallel_size',
    'DistributedDataParallelConfig.align_param_gather',
    'DistributedDataParallelConfig.bucket_size',
    'DistributedDataParallelConfig.bucket_size',
    'DistributedDataParallelConfig.data_parallel_sharding_strategy',
    'DistributedDataParallelConfig.grad_reduce_in_fp32',
    'DistributedDataParallelConfig.num_distributed_optimizer_instances',
    'DistributedDataParallelConfig.overlap_grad_reduce',
    'DistributedDataParallelConfig.overlap_param_gather',
    'T5ModelProvider.encoder_pipeline_model_parallel_size',
    'T5ModelProvider.encoder_tensor_model_parallel_size',
    'TransformerConfig.expert_model_parallel_size=<int>',
    'TransformerConfig.expert_tensor_parallel_size=<int>',
    'TransformerConfig.moe_grouped_gemm',
    'DistributedInitConfig.use_torch_fsdp2',
    'TransformerConfig.pipeline_model_parallel_size',
    'TransformerConfig.tensor_model_parallel_size',
    'TransformerConfig.virtual_pipeline_model_parallel_size',
    'OptimizerConfig.use_distributed_optimizer',
    'TORCH_NCCL_AVOID_RECORD_STREAMS',
    'TPOverlapCfg.cga_size',
    'TPOverlapCfg.fp8_buf',
    'TPOverlapCfg.num_sm',
    'TPOverlapCfg.num_split',
)

NEMO_INDEX = (
    'callback.tp_comm_overlap',
    'callback.tp_comm_overlap_cfg',
    'CUDA_DEVICE_MAX_CONNECTIONS',
    'garbageCollectionCallback.gc_interval_train',
    'garbageCollectionCallback.gc_interval_val',
    'megatronMixedPrecision.fp8_params',
    'MemoryProfilePlugin',
    'NCCL_NET_GDR_C2C',
    'NCCL_NET_GDR_LEVEL',
    'NCCL_NVLS_ENABLE',
    'NsysPlugin',
    'NVTE_BWD_LAYERNORM_SM_MARGIN=<#SM for DP collectives',
    'NVTE_FLASH_ATT',
    'NVTE_FUSED_ATT',
    'NVTE_FWD_LAYERNORM_SM_MARGIN=<#SM for DP collectives',
    'PYTORCH_CUDA_ALLOC_CONF',
    'recipe.data.micro_batch_size',
    'recipe.data.packed_sequence_specs.packed_sequence_size',
    'recipe.model.config.apply_rope_fusion',
    'recipe.model.config.bias_activation_fusion',
    'recipe.model.config.bias_dropout_fusion',
    'recipe.model.config.cp_comm_type',
    'recipe.model.config.cpu_offloading',
    'recipe.model.config.cpu_offloading_num_layers',
    'recipe.model.config.cpu_offloading_weights',
    'recipe.model.config.cross_entropy_loss_fusion',
    'recipe.model.config.enable_cuda_graph',
    'recipe.model.config.fp8_param_gather',
    'recipe.model.config.gradient_accumulation_fusion',
    'recipe.model.config.masked_softmax_fusion',
    'recipe.model.config.recompute_granuality',
    'recipe.model.config.recompute_method',
    'recipe.model.config.recompute_num_layers',
    'recipe.model.config.use_precision_aware_optimizer',
    'recipe.trainer.strategy.account_for_embedding_in_pipeline_split',
    'recipe.trainer.strategy.account_for_loss_in_pipeline_split',
    'recipe.trainer.strategy.context_parallel_size',
    'recipe.trainer.strategy.context_parallel_size',
    'recipe.trainer.strategy.ddp.align_param_gather',
    'recipe.trainer.strategy.ddp.bucket_size',
    'recipe.trainer.strategy.ddp.bucket_size',
    'recipe.trainer.strategy.ddp.data_parallel_sharding_strategy',
    'recipe.trainer.strategy.ddp.grad_reduce_in_fp32',
    'recipe.trainer.strategy.ddp.num_distributed_optimizer_instances',
    'recipe.trainer.strategy.ddp.overlap_grad_reduce',
    'recipe.trainer.strategy.ddp.overlap_param_gather',
    'recipe.trainer.strategy.encoder_pipeline_model_parallel_size',
    'recipe.trainer.strategy.encoder_tensor_model_parallel_size',
    'recipe.trainer.strategy.expert_model_parallel_size=<int>',
    'recipe.trainer.strategy.expert_tensor_parallel_size=<int>',
    'recipe.trainer.strategy.fsdp',
    'recipe.trainer.strategy.num_distributed_optimizer_instances',
    'recipe.trainer.strategy.pipeline_model_parallel_size',
    'recipe.trainer.strategy.tensor_model_parallel_size',
    'recipe.trainer.strategy.virtual_pipeline_model_parallel_size',
    'recipe.trainer.use_distributed_optimizer',
    'TORCH_NCCL_AVOID_RECORD_STREAMS',
    'transformerLayerTPOverlapCfg.cga_size',
    'transformerLayerTPOverlapCfg.fp8_buf',
    'transformerLayerTPOverlapCfg.num_sm',
)


def _mb_index() -> list[str]:
    index = MB_GUIDE.read_text().split("## Index - List of Tuning Knobs", 1)[1]
    return re.findall(r"^- `([^`]+)`", index, re.M)  # commented-out entries start with <!--


def _nemo_index() -> list[str]:
    index = NEMO_GUIDE.read_text().split("Index - List of Tuning Knobs", 1)[1]
    return [line.strip() for line in index.splitlines() if line.strip()]


def _key(entry: str) -> str:
    """`TransformerConfig.expert_model_parallel_size=<int>` → `expert_model_parallel_size`."""
    return entry.split("=", 1)[0].strip().split(".")[-1]


def _knob_text() -> str:
    parts = []
    for path in RULES.glob("*.yaml"):
        spec = yaml.safe_load(path.read_text())
        for knob in spec["knobs"] + spec.get("next_step", {}).get("knobs", []):
            parts.extend(str(knob.get(f) or "") for f in FIELDS)
    return "\n".join(parts)


def test_snapshot_matches_the_guides():
    assert tuple(_mb_index()) == MB_INDEX
    assert tuple(_nemo_index()) == NEMO_INDEX


@pytest.mark.parametrize("entries", [MB_INDEX, NEMO_INDEX], ids=["megatron-bridge", "nemo2"])
def test_every_index_knob_is_covered(entries):
    knobs, not_detectable = _knob_text(), (RULES / "NOT_DETECTABLE.md").read_text()
    missing = [e for e in entries if _key(e) not in knobs and f"{_key(e)}`" not in not_detectable]
    assert not missing, missing


def test_not_detectable_knobs_are_not_recommended():
    """A knob listed as not detectable must not also be recommended by a rule (one answer per knob)."""
    table = (RULES / "NOT_DETECTABLE.md").read_text()
    listed = {m.split(".")[-1] for m in re.findall(r"^\| `([^`]+)`", table, re.M)}
    knobs = _knob_text()
    assert listed and not [k for k in listed if k in knobs]
