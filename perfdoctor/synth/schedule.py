"""Pipeline schedules: the order in which one stage runs forward and backward micro-batch passes.

These mirror Megatron-Core's `schedules.py` (research/megatron.md §6.2). Bubbles are not inserted
anywhere: they appear when the simulator runs these orders on every stage and each stage waits for the
activations or gradients its neighbours send.
"""

from __future__ import annotations

from typing import NamedTuple


class Pass(NamedTuple):
    """One forward or backward pass of micro-batch `mb` through model chunk `chunk`."""

    forward: bool
    mb: int
    chunk: int


def _interleaved_table(m: int, v: int, group: int) -> list[tuple[int, int]]:
    """Megatron's `get_schedule_table`: chunks cycle every `group` micro-batches."""
    table: list[tuple[int, int]] = []
    for first in range(0, m, group):
        last = min(first + group, m)
        table.extend((mb, c) for c in range(v) for mb in range(first, last))
    return table


def stage_passes(p: int, v: int, m: int, stage: int) -> list[Pass]:
    """Passes of `stage` in execution order: warm-up forwards, 1F1B steady state, cool-down backwards."""
    if v == 1:
        fwd = [(mb, 0) for mb in range(m)]
        bwd = fwd
        warmup = min(p - stage - 1, m)
    else:
        table = _interleaved_table(m, v, p)
        fwd = table
        bwd = [(mb, v - 1 - c) for mb, c in table]
        warmup = min((p - stage - 1) * 2 + (v - 1) * p, m * v)
    total = len(fwd)
    order = [Pass(True, *fwd[k]) for k in range(warmup)]
    for k in range(total - warmup):
        order.append(Pass(True, *fwd[warmup + k]))
        order.append(Pass(False, *bwd[k]))
    order.extend(Pass(False, *bwd[k]) for k in range(total - warmup, total))
    return order


def bubble_fraction_theory(p: int, v: int, m: int) -> float:
    """Share of the step the pipeline idles in an ideal schedule: (p−1)/(v·m+p−1)."""
    return (p - 1) / (v * m + p - 1) if p > 1 else 0.0
