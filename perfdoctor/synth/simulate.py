"""Run every pipeline stage of a scenario together, resolving pipeline sends and receives.

Each stage is a `StageProgram` generator with its own host clock. A stage runs until a receive needs
data that no peer has posted yet; the coordinator then moves on to the next stage and comes back once
the data exists. Because sends complete eagerly and Megatron's schedules are deadlock-free, this always
finishes; a schedule that could not would raise instead of hanging.

A single slow rank inside a pipeline run is simulated as two *lanes* of stages: the slow rank's
data-parallel index (its stage slow, the others normal, exchanging activations among themselves) and
every other index (all normal). The lanes' DP collectives meet (``StageProgram._meet``): each ends no
earlier than the other lane's member arrived plus its transfer, so the slow rank delays its DP group,
and through the pipeline sends the next stages, as a real run does.
"""

from __future__ import annotations

from collections import ChainMap
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from perfdoctor.synth.gpu import GpuModel, gpu_model
from perfdoctor.synth.kernels import API_CU_LAUNCH_EX, API_LAUNCH, API_LAUNCH_COOP, API_LAUNCH_EX, KernelTable
from perfdoctor.synth.program import StageProgram
from perfdoctor.synth.recorder import API_GRAPH_LAUNCH, API_MEMCPY, API_MEMSET, HostCost, RankRecorder
from perfdoctor.synth.scenario import Scenario
from perfdoctor.synth.straggler import rendezvous


@dataclass
class StageResult:
    """One stage's recorded timeline and its step boundaries (host time of each `step` start, plus end)."""

    stage: int
    recorder: RankRecorder
    step_bounds: list[int]
    # A planted straggler (synth/straggler.py): its own timeline, and per timeline of the stage the last
    # arrival of each DP collective (the truth of who waited how long)
    straggler: StageResult | None = None
    dp_last: np.ndarray | None = None


def config_mark(sc: Scenario, gpu: GpuModel) -> dict[str, Any]:
    """The `config {json}` mark's keys (DESIGN §4)."""
    m, p = sc.model, sc.parallel
    return {
        "tp": p["tp"],
        "pp": p["pp"],
        "vpp": p["vpp"],
        "cp": p["cp"],
        "dp": p["dp"],
        "ep": p["ep"],
        "num_microbatches": m["num_microbatches"],
        "micro_batch_size": m["micro_batch_size"],
        "global_batch_size": m["num_microbatches"] * m["micro_batch_size"] * p["dp"],
        "seq_length": m["seq_length"],
        "hidden_size": m["hidden"],
        "num_layers": m["layers"],
        "num_attention_heads": m["heads"],
        "num_query_groups": m["kv_heads"],
        "ffn_hidden_size": m["ffn_hidden"],
        "swiglu": m["swiglu"],
        "vocab_size": m["vocab"],
        **({"num_experts": m["moe_experts"], "moe_router_topk": m["moe_topk"],
            "moe_ffn_hidden_size": m["moe_ffn_hidden"]} if m["moe_experts"] else {}),
        "sequence_parallel": p["sequence_parallel"] and p["tp"] > 1,
        "gpu": gpu.name,
    }


def simulate(sc: Scenario, seed: int) -> tuple[list[StageResult], KernelTable, GpuModel]:
    """Simulate all pipeline stages of `sc`; stage s stands for every rank of that stage."""
    overrides = {
        k: float(sc.gpu[k]) for k in ("network_gbps", "nvlink_gbps", "network_latency_us", "gemm_efficiency")
        if sc.gpu[k] is not None
    }
    gpu = gpu_model(sc.gpu["name"], overrides)
    table = KernelTable()
    h = sc.host
    launch = float(h["launch_us"]) * 1e3
    cost = HostCost(
        python_ns=float(h["python_us"]) * 1e3,
        launch_ns={
            API_LAUNCH: launch,
            API_LAUNCH_EX: launch * 1.3,
            API_LAUNCH_COOP: launch * 1.5,
            API_CU_LAUNCH_EX: launch * 1.2,
            API_MEMCPY: launch * 2.0,  # real exports: async copies cost ~2x a kernel launch on the host
            API_MEMSET: launch * 1.2,
            API_GRAPH_LAUNCH: launch * 2.5,  # one call replays a whole layer pass
        },
    )
    mailbox: dict[tuple, int] = {}
    programs, gens, recs = [], [], []
    mark = config_mark(sc, gpu)
    st = sc.straggler
    pp = sc.parallel["pp"]
    slow_stage = sc.stage_of(st["rank"]) if st["rank"] is not None and st["whole_stage"] else None
    lanes = st["rank"] is not None and not st["whole_stage"] and pp > 1
    meet: dict[tuple, int] = {}
    for lane in range(2 if lanes else 1):
        box = ChainMap({}, meet) if lanes else mailbox  # a lane's own activations; both lanes' DP arrivals
        for stage in range(pp):
            slow = stage == slow_stage or (lane == 1 and stage == sc.stage_of(st["rank"]))
            dp_rank = dp_index(sc, st["rank"]) if lane == 1 else (1 if lanes and dp_index(sc, st["rank"]) == 0 else 0)
            prog = _program(sc, stage, table, _slow_cost(cost, st) if slow else cost,
                            _slow_gpu(gpu, st) if slow else gpu, box, seed, dp_rank)
            if lanes:
                prog.rendezvous, prog.lane = meet, lane
            programs.append(prog)
            recs.append(prog.rec)
            gens.append(prog.run(mark))
    waiting: list[list[tuple] | None] = [None] * len(gens)
    started = [False] * len(gens)
    active = set(range(len(gens)))
    while active:
        progressed = False
        for i in sorted(active):
            while True:
                keys = waiting[i]
                box = programs[i].mailbox
                if keys is not None and not all(k in box for k in keys):
                    break
                try:
                    if not started[i]:
                        started[i] = True
                        waiting[i] = next(gens[i])
                    else:
                        waiting[i] = gens[i].send([box[k] for k in keys] if keys else None)
                    progressed = True
                except StopIteration:
                    active.discard(i)
                    progressed = True
                    break
        if active and not progressed:
            raise RuntimeError("pipeline schedule deadlocked: no stage can make progress")
    results = [StageResult(i % pp, recs[i], programs[i].step_starts) for i in range(len(gens))]
    if lanes:
        for normal, slow in zip(results[:pp], results[pp:]):
            normal.dp_last, slow.dp_last = np.asarray(normal.recorder.dp_last), np.asarray(slow.recorder.dp_last)
            normal.straggler = slow
        return results[:pp], table, gpu
    if st["rank"] is not None and not st["whole_stage"]:
        _plant_straggler(sc, results[0], table, cost, gpu, mark, seed)
    return results, table, gpu


def dp_index(sc: Scenario, rank: int) -> int:
    """A rank's index in its data-parallel group (Megatron's tp-cp-dp-pp order)."""
    p = sc.parallel
    return (rank // (p["tp"] * p["cp"])) % p["dp"]


def _program(sc: Scenario, stage: int, table: KernelTable, cost: HostCost, gpu: GpuModel,
             mailbox: dict[tuple, int], seed: int, dp_rank: int = 0) -> StageProgram:
    rng = np.random.default_rng([seed, stage])
    rec = RankRecorder(
        rank=sc.rank_of(stage, dp_rank=dp_rank),
        table=table,
        cost=cost,
        rng=rng,
        sm_margin=sc.comm["layernorm_sm_margin"],
        compute_stream=sc.kernels["stream_base"],
    )
    rec.host = 1_500_000_000 + int(rng.integers(0, 5_000_000))
    return StageProgram(sc, gpu, stage, rec, mailbox, rng)


def _slow_gpu(gpu: GpuModel, st: dict[str, Any]) -> GpuModel:
    return replace(gpu, gemm_efficiency=gpu.gemm_efficiency / (1.0 + float(st["gemm_slowdown"])))


def _slow_cost(cost: HostCost, st: dict[str, Any]) -> HostCost:
    return replace(cost, python_ns=float(st["python_us"]) * 1e3) if st["python_us"] else cost


def _plant_straggler(sc: Scenario, normal: StageResult, table: KernelTable, cost: HostCost, gpu: GpuModel,
                     mark: dict[str, Any], seed: int) -> None:
    """Simulate the straggler rank's own timeline (same noise, slower GEMMs or host; pp is 1, so it
    exchanges nothing with other stages), then make both wait at their DP collectives."""
    st = sc.straggler
    prog = _program(sc, 0, table, _slow_cost(cost, st), _slow_gpu(gpu, st), {}, seed)
    for _ in prog.run(mark):
        raise RuntimeError("a stage without pipeline peers waited on one")
    slow = StageResult(0, prog.rec, prog.step_starts)
    normal.dp_last, slow.dp_last = rendezvous([normal.recorder, slow.recorder],
                                              [normal.step_bounds, slow.step_bounds], table)
    normal.straggler = slow
