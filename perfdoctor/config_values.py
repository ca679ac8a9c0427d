"""What a run-configuration value may be, wherever it comes from: command-line flags, a ``--config`` file
or a capture's ``config {json}`` mark (DESIGN §4).

Sizes and counts are multiplied, divided and used to index ranks and stages, so they are checked once,
where they enter, instead of trusted by every measurement: a parallel size or the number of
micro-batches is a whole number from 1 to :data:`MAX_SIZE`, a model dimension a whole number up to
:data:`MAX_COUNT`, and every other value a finite scalar (or a list of them). The world those sizes
describe (tp·cp·dp·pp) is at most :data:`MAX_SIZE` ranks too.
"""

from __future__ import annotations

import math
from typing import Any

from perfdoctor.errors import shown

MAX_SIZE = 1 << 20  # ranks in a run, or micro-batches per step: a million is beyond any real run
MAX_COUNT = 1 << 40  # tokens, hidden sizes, vocabularies, bucket bytes: far beyond any model
INT64 = 1 << 63
# A size: ranks of a parallel group, pipeline chunks, micro-batches.
SIZES = ("tp", "pp", "vpp", "cp", "dp", "ep", "etp", "num_microbatches")
# Positive model and batch dimensions.
DIMENSIONS = ("micro_batch_size", "global_batch_size", "seq_length", "hidden_size", "num_layers", "vocab_size",
              "padded_vocab_size", "num_attention_heads", "num_query_groups", "kv_channels", "ffn_hidden_size",
              "num_experts", "gpus_per_node")
# Whole numbers where 0 means "off" or "none".
COUNTS = ("moe_shared_expert_intermediate_size", "manual_gc_interval", "recompute_num_layers",
          "cpu_offloading_num_layers", "bucket_size")
WORLD = ("tp", "cp", "dp", "pp")


def value_problem(key: str, value: Any) -> str | None:
    """Why ``value`` cannot be the config value ``key`` (None when it can)."""
    if key in SIZES or key in DIMENSIONS or key in COUNTS:
        low = 0 if key in COUNTS else 1
        high = MAX_SIZE if key in SIZES else MAX_COUNT
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            return f"expected a whole number from {low} to {high:,}, got {shown(value)}"
        return None
    if key == "gpu" and not isinstance(value, (str, type(None))):
        return f"expected the GPU's name, got {shown(value)}"
    if isinstance(value, list):
        return next((p for p in map(_scalar_problem, value) if p), None)
    return _scalar_problem(value)


def world_problem(config: dict[str, Any]) -> str | None:
    """Why the parallel sizes cannot describe one run (None when they can): more ranks than :data:`MAX_SIZE`."""
    sizes = [config.get(k) for k in WORLD]
    if not all(isinstance(s, int) for s in sizes if s is not None):
        return None  # each value is checked (and named) on its own
    world = math.prod(s for s in sizes if s)
    if world > MAX_SIZE:
        product = " × ".join(f"{k} {config[k]}" for k in WORLD if config.get(k))
        return f"{product} is {world:,} ranks, more than {MAX_SIZE:,}"
    return None


def _scalar_problem(value: Any) -> str | None:
    if value is None or isinstance(value, (str, bool)):
        return None
    if isinstance(value, int):
        return None if -INT64 <= value < INT64 else f"{shown(value)} does not fit in 64 bits"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value} is not a finite number"
    return f"expected a number, a string or true/false, got {shown(value)}"
