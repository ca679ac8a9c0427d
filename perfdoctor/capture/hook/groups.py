"""Which parallel group (DESIGN §4 ``group=``) a ``torch.distributed`` process group is.

Sources, in order (research/megatron.md §3.1.4):

1. the group's description: Megatron passes ``group_desc=`` to ``new_group`` (PyTorch >= 2.4 keeps it
   as ``pg.group_desc``), e.g. ``TENSOR_MODEL_PARALLEL_GROUP``;
2. identity with the groups that ``megatron.core.parallel_state`` hands out (older PyTorch, or code
   that builds groups without a description);
3. the default (world) group is the data-parallel group of plain PyTorch DDP/FSDP training when no
   Megatron parallel state exists; anything else is ``other``.
"""

from __future__ import annotations

import re
import sys
from typing import Any

# Megatron group descriptions (parallel_state.py) → DESIGN §4 group names. Longest match first, so
# that TENSOR_AND_CONTEXT_PARALLEL wins over TENSOR_MODEL_PARALLEL-style prefixes.
_DESCRIPTIONS = (
    ("EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP", "ep"),
    ("EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP", "ep"),
    ("EXPERT_TENSOR_PARALLEL_GROUP", "etp"),
    ("EXPERT_MODEL_PARALLEL_GROUP", "ep"),
    ("EXPERT_DATA_PARALLEL_GROUP", "edp"),
    ("INTRA_EXPERT_DATA_PARALLEL_GROUP", "edp"),
    ("TENSOR_AND_CONTEXT_PARALLEL_GROUP", "tp"),
    ("TENSOR_AND_DATA_PARALLEL_GROUP", "other"),
    ("TENSOR_MODEL_PARALLEL_GROUP", "tp"),
    ("INTRA_PARTIAL_DATA_PARALLEL_GROUP", "dp"),
    ("INTER_PARTIAL_DATA_PARALLEL_GROUP", "dp"),
    ("INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP", "dp"),
    ("INTER_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP", "dp"),
    ("DATA_PARALLEL_GROUP", "dp"),
    ("HYBRID_DP_CP_GROUP", "dp"),
    ("CONTEXT_PARALLEL_GROUP", "cp"),
    ("PIPELINE_MODEL_PARALLEL_GROUP", "pp"),
    ("POSITION_EMBEDDING_GROUP", "embd"),
    ("EMBEDDING_GROUP", "embd"),
    ("MODEL_PARALLEL_GROUP", "mp"),
)
_HIERARCHICAL = re.compile(r"^HIERARCHICAL_(.+)_L\d+$")

# parallel_state getters → group name; DP first so that the DP-with-CP group (the one the DDP reduces
# over) is named dp even where it coincides with another group's ranks.
_GETTERS = (
    ("get_data_parallel_group", {"with_context_parallel": True}, "dp"),
    ("get_data_parallel_group", {"with_context_parallel": True, "partial_data_parallel": True}, "dp"),
    ("get_data_parallel_group", {}, "dp"),
    ("get_inter_distributed_optimizer_instance_group", {}, "dp"),
    ("get_intra_distributed_optimizer_instance_group", {}, "dp"),
    ("get_expert_data_parallel_group", {}, "edp"),
    ("get_expert_data_parallel_group", {"partial_expert_data_parallel": True}, "edp"),
    ("get_tensor_model_parallel_group", {}, "tp"),
    ("get_tensor_and_context_parallel_group", {}, "tp"),
    ("get_expert_tensor_parallel_group", {}, "etp"),
    ("get_context_parallel_group", {}, "cp"),
    ("get_pipeline_model_parallel_group", {}, "pp"),
    ("get_expert_model_parallel_group", {}, "ep"),
    ("get_expert_tensor_and_model_parallel_group", {}, "ep"),
    ("get_embedding_group", {}, "embd"),
    ("get_position_embedding_group", {}, "embd"),
    ("get_model_parallel_group", {}, "mp"),
)


def from_description(desc: str | None) -> str | None:
    """``"DATA_PARALLEL_GROUP_WITH_CP_GLOO"`` → ``"dp"``; None for descriptions we do not know."""
    if not desc or desc in ("undefined", "default_pg"):
        return None
    desc = desc.upper()
    match = _HIERARCHICAL.match(desc)
    if match:
        desc = match.group(1)
    for prefix, name in _DESCRIPTIONS:
        if desc.startswith(prefix):
            return name
    return None


def megatron_groups() -> list[tuple[Any, str]]:
    """(process group, name) for every group Megatron's parallel state has made, if it is initialised.

    Only reads ``megatron.core.parallel_state`` when the training code already imported it.
    """
    ps = sys.modules.get("megatron.core.parallel_state")
    if ps is None:
        return []
    try:
        if not ps.model_parallel_is_initialized():
            return []
    except Exception:  # noqa: BLE001 (older or newer Megatron: no parallel state to compare with)
        return []
    found = []
    for getter, kwargs, name in _GETTERS:
        fn = getattr(ps, getter, None)
        if fn is None:
            continue
        group = _call_getter(fn, kwargs)
        if group is not None:
            found.append((group, name))
    return found


def _call_getter(fn: Any, kwargs: dict[str, Any]) -> Any:
    """Getters assert when a group was not made; some take ``check_initialized`` (newer MCore)."""
    for extra in ({"check_initialized": False}, {}):
        try:
            return fn(**kwargs, **extra)
        except TypeError:
            continue
        except Exception:  # noqa: BLE001 (AssertionError/RuntimeError: that group does not exist here)
            return None
    return None


class GroupNamer:
    """Names process groups once each (by identity) and remembers the answer."""

    def __init__(self, default_group: Any = None) -> None:
        self._cache: dict[int, tuple[Any, str]] = {}
        self.default_group = default_group

    def name(self, group: Any) -> str:
        key = id(group)
        hit = self._cache.get(key)
        if hit is not None and hit[0] is group:
            return hit[1]
        name, final = self._resolve(group)
        if final:
            self._cache[key] = (group, name)  # keeps the group alive, so its id is not reused
        return name

    def _resolve(self, group: Any) -> tuple[str, bool]:
        """(name, final): not final while Megatron is imported but its parallel state is not made yet."""
        name = from_description(getattr(group, "group_desc", None))
        if name:
            return name, True
        megatron = megatron_groups()
        for candidate, candidate_name in megatron:
            if candidate is group:
                return candidate_name, True
        final = bool(megatron) or "megatron.core.parallel_state" not in sys.modules
        if group is None or group is self.default_group:
            return ("other" if megatron else "dp"), final
        return "other", final
