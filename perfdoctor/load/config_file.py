"""``--config FILE``: the run's parallel and model configuration from the framework's own files.

Three shapes are read, as JSON or YAML:

* Megatron-LM arguments: the flat ``args`` namespace (``tensor_model_parallel_size: 2``; flag spellings
  such as ``--tensor-model-parallel-size`` are accepted as keys), or its ``--yaml-cfg`` sections;
* a Megatron-Bridge ``ConfigContainer`` YAML (``model.tensor_model_parallel_size``,
  ``train.micro_batch_size``, ``ddp.bucket_size``, ...);
* a NeMo 2 recipe dump (``trainer.strategy.tensor_model_parallel_size``, ``model.config.num_layers``,
  ``data.micro_batch_size``, ...).

All three name a setting by the same field name (the project's research notes on Megatron, §4), only nested
differently, so a value is found by its field name wherever it sits. When the same field appears
twice with different values (Bridge copies ``grad_reduce_in_fp32`` into ``ddp``), the shallowest
path wins. Values are perfdoctor's config keys (DESIGN §4); unknown fields are ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from perfdoctor.config_values import value_problem, world_problem
from perfdoctor.errors import InputError, UsageError

MAX_BYTES = 4 * 1024 * 1024  # a config is kilobytes; refuse before parsing a large file
# perfdoctor key -> the field names frameworks use for it.
ALIASES: dict[str, tuple[str, ...]] = {
    "tp": ("tensor_model_parallel_size",),
    "pp": ("pipeline_model_parallel_size",),
    "vpp": ("virtual_pipeline_model_parallel_size", "num_virtual_stages_per_pipeline_rank"),
    "cp": ("context_parallel_size",),
    "dp": ("data_parallel_size",),
    "ep": ("expert_model_parallel_size",),
    "etp": ("expert_tensor_parallel_size",),
    "seq_length": ("seq_length", "encoder_seq_length", "sequence_length"),
    "num_experts": ("num_experts", "num_moe_experts"),
    "bucket_size": ("bucket_size", "ddp_bucket_size"),
}
# Fields read under their own name (rules name them as config.<field>).
SAME_NAME = (
    "num_microbatches", "micro_batch_size", "global_batch_size", "hidden_size", "num_layers", "vocab_size",
    "padded_vocab_size", "num_attention_heads", "num_query_groups", "kv_channels", "ffn_hidden_size",
    "sequence_parallel", "moe_grouped_gemm", "moe_shared_expert_intermediate_size", "overlap_grad_reduce",
    "overlap_param_gather", "align_param_gather", "use_distributed_optimizer", "grad_reduce_in_fp32",
    "tp_comm_overlap", "manual_gc", "manual_gc_interval", "recompute_granularity", "recompute_method",
    "recompute_num_layers", "cpu_offloading", "cpu_offloading_num_layers", "cpu_offloading_weights",
    "enable_cuda_graph", "cuda_graph_impl", "cp_comm_type", "attention_backend", "bias_activation_fusion",
    "bias_dropout_fusion", "apply_rope_fusion", "masked_softmax_fusion", "cross_entropy_loss_fusion",
    "gradient_accumulation_fusion", "use_precision_aware_optimizer", "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split", "fp8", "swiglu", "gpus_per_node",
)
KEY_OF_FIELD = {field: key for key, fields in ALIASES.items() for field in fields} | {f: f for f in SAME_NAME}


def load_config_file(path: Path) -> dict[str, Any]:
    """perfdoctor config keys -> values read from ``path``; :class:`InputError` (one line) for a bad file."""
    data = _parse(path)
    found: dict[str, tuple[int, str, Any]] = {}  # key -> (depth, dotted path, value)
    for dotted, value in _leaves(data, ()):
        field = dotted[-1].lstrip("-").replace("-", "_")
        key = KEY_OF_FIELD.get(field)
        if key is None or value is None or not _scalar(value):
            continue
        candidate = (len(dotted), ".".join(dotted), _typed(path, ".".join(dotted), key, value))
        if key not in found or candidate[0] < found[key][0]:
            found[key] = candidate
    config = {key: value for key, (_, _, value) in found.items()}
    if problem := world_problem(config):
        raise InputError(f"{path}: {problem}")
    if "num_microbatches" not in config and all(config.get(k) for k in ("global_batch_size", "micro_batch_size", "dp")):
        per_step, rest = divmod(config["global_batch_size"], config["micro_batch_size"] * config["dp"])
        if per_step and not rest:
            config["num_microbatches"] = per_step
    return config


def _parse(path: Path) -> Any:
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise InputError(f"{path}: --config must be a file")
        if size > MAX_BYTES:
            raise InputError(f"{path}: --config file is {size:,} bytes; a configuration is at most {MAX_BYTES:,}")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the --config file ({getattr(exc, 'strerror', None) or exc})") from None
    import yaml  # only when a --config file is given (8 ms of every other run's start-up)

    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: line {exc.lineno}: not valid JSON ({exc.msg})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        raise InputError(f"{path}: {where}not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a --config file must be a mapping of settings (Megatron-LM arguments, a "
                         "Megatron-Bridge ConfigContainer or a NeMo 2 recipe)")
    return data


def _leaves(node: Any, prefix: tuple[str, ...]):
    """(path, value) of every non-mapping value under ``node``; ``_target_`` markers are skipped."""
    for key, value in node.items():
        if not isinstance(key, str) or key.startswith("_"):
            continue
        if isinstance(value, dict):
            yield from _leaves(value, (*prefix, key))
        else:
            yield (*prefix, key), value


def _scalar(value: Any) -> bool:
    if isinstance(value, list):
        return all(isinstance(v, (str, int, float, bool)) for v in value)
    return isinstance(value, (str, int, float, bool))


def _typed(path: Path, where: str, key: str, value: Any) -> Any:
    """Sizes are bounded whole numbers (perfdoctor.config_values); anything else there is a bad file, not a guess."""
    if problem := value_problem(key, value):
        raise InputError(f"{path}: {where}: {problem}")
    return value


def user_config(config_file: Path | None, flags: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The values the user gave and their sources: the --config file's, overridden by command-line flags."""
    from_file = load_config_file(config_file) if config_file is not None else {}
    given = {k: v for k, v in flags.items() if v is not None}
    if problem := world_problem({**from_file, **given}):
        raise UsageError(f"parallel sizes: {problem}")
    return {**from_file, **given}, {**dict.fromkeys(from_file, "config-file"), **dict.fromkeys(given, "cli")}
