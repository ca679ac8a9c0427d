"""`run_scenario`: simulate a scenario and write its traces plus one ground-truth JSON per trace.

Files in `out_dir`: `<name>.rank<r>.sqlite` (layout per_rank) or `<name>.node<k>.sqlite` (per_node, one
process per rank of that node), each with `<same stem>.truth.json` describing the ranks it holds. With
``fmt="kineto"`` each rank is a PyTorch profiler trace `<name>.rank<r>.pt.trace.json.gz` instead (the
profiler writes one file per process, so the layout is always per rank), with the same truth.
Ranks of the same pipeline stage share that stage's simulated timeline (they are symmetric in the
model); each file gets its own session start so cross-file alignment must use utcEpochNs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from perfdoctor.errors import InputError
from perfdoctor.synth.kineto_writer import write_kineto
from perfdoctor.synth.scenario import Scenario, load_scenario, scenario_from_dict
from perfdoctor.synth.simulate import StageResult, config_mark, dp_index, simulate
from perfdoctor.synth.straggler import wait_truth
from perfdoctor.synth.truth import rank_truth
from perfdoctor.synth.truth_path import path_truth
from perfdoctor.synth.window import cut_window
from perfdoctor.synth.writer import SCHEMAS, SESSION_UTC_NS, ProcessOut, write_trace

TRUTH_FORMAT = "perfdoctor-synth-truth/1"


def _scenario(scenario: str | Path | dict[str, Any] | Scenario) -> Scenario:
    if isinstance(scenario, Scenario):
        return scenario
    if isinstance(scenario, dict):
        return scenario_from_dict(scenario)
    return load_scenario(scenario)


def _env(sc: Scenario, rank: int | None, local: int | None) -> dict[str, str]:
    """Process environment as nsys records it: launcher variables plus the perf-relevant knobs."""
    c = sc.comm
    env = {
        "MASTER_ADDR": "node000",
        "MASTER_PORT": "29500",
        "WORLD_SIZE": str(sc.world_size),
        "LOCAL_WORLD_SIZE": str(min(sc.gpu["gpus_per_node"], sc.world_size)),
    }
    if rank is not None:
        env.update({"RANK": str(rank), "LOCAL_RANK": str(local), "GROUP_RANK": str(rank // sc.gpu["gpus_per_node"])})
    env.update(
        {
            "CUDA_DEVICE_MAX_CONNECTIONS": str(c["cuda_device_max_connections"]),
            "NVTE_FWD_LAYERNORM_SM_MARGIN": str(c["layernorm_sm_margin"]),
            "NVTE_BWD_LAYERNORM_SM_MARGIN": str(c["layernorm_sm_margin"]),
            "NCCL_DEBUG": "WARN",
            "NCCL_IB_QPS_PER_CONNECTION": "4",
            "NCCL_VERSION": {"2.18": "2.18.5-1", "2.21": "2.21.5-1", "2.27": "2.27.3-1"}[sc.kernels["nccl_version"]],
            "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
            "PYTHONHASHSEED": "0",
        }
    )
    if not sc.labels["nccl"]:
        env["NCCL_NVTX_DISABLE"] = "1"
    return env


def _timeline_of(sc: Scenario, stages: list[StageResult], rank: int) -> StageResult:
    """The simulated timeline a rank shows: its stage's, or its own when it is the planted straggler."""
    res = stages[sc.stage_of(rank)]
    if res.straggler is None:
        return res
    if sc.parallel["pp"] > 1:  # the slow rank's lane: every stage of its data-parallel index (simulate.py)
        return res.straggler if dp_index(sc, rank) == dp_index(sc, sc.straggler["rank"]) else res
    return res.straggler if rank == sc.straggler["rank"] else res


def _wait_truth(sc: Scenario, stages: list[StageResult], table: Any, rank: int, offset: int) -> dict[str, Any]:
    """With a planted straggler, per step the exposed DP comm split into wait and transfer."""
    res = _timeline_of(sc, stages, rank)
    if res.dp_last is None:
        return {}
    return {"dp_waits": wait_truth(res.recorder, table, res.dp_last, res.step_bounds, offset)}


def run_scenario(
    scenario: str | Path | dict[str, Any] | Scenario,
    out_dir: Path,
    *,
    seed: int | None = None,
    schema: str | None = None,
    fmt: str = "sqlite",
) -> list[Path]:
    """Simulate `scenario` and write its traces into `out_dir`; returns the trace paths in rank order.
    ``fmt``: "sqlite" (nsys exports in ``schema``) or "kineto" (PyTorch profiler traces)."""
    sc = _scenario(scenario)
    seed = sc.run["seed"] if seed is None else seed
    schema = schema or sc.output["schema"]
    if schema not in SCHEMAS:
        raise InputError(f"schema {schema!r} unknown (known: {', '.join(SCHEMAS)})")
    if fmt not in ("sqlite", "kineto"):
        raise InputError(f"format {fmt!r} unknown (known: sqlite, kineto)")
    if fmt == "kineto" and sc.output.get("window_ms"):
        raise InputError("output.window_ms cuts nsys exports only (--format sqlite)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stages, table, gpu = simulate(sc, seed)
    per_node = sc.output["layout"] == "per_node" and fmt == "sqlite"
    gpn = sc.gpu["gpus_per_node"]
    files: dict[str, list[int]] = {}
    for rank in sc.output_ranks():
        key = f"node{rank // gpn}" if per_node else f"rank{rank}"
        files.setdefault(key, []).append(rank)
    written = []
    for i, (key, ranks) in enumerate(files.items()):
        node = ranks[0] // gpn
        offset = ((seed * 7_919 + i * 104_729) % 40_000) * 1_000
        procs = []
        for rank in ranks:
            local = rank % gpn
            res = _timeline_of(sc, stages, rank)
            mark = f"rank r={rank} local={local} world={sc.world_size}" if sc.labels["perfdoctor"] else None
            procs.append(ProcessOut(rank, local, 3000 + 211 * local + 17 * (node % 50), res.recorder, mark))
        if per_node:
            capture = (
                "torchrun",
                [f"--nproc_per_node={gpn}", f"--node_rank={node}", "pretrain_gpt.py"],
                _env(sc, None, None),
            )
        else:
            r = ranks[0]
            capture = (
                "python",
                ["-u", "pretrain_gpt.py", f"--tensor-model-parallel-size={sc.parallel['tp']}"],
                _env(sc, r, r % gpn),
            )
        if fmt == "kineto":
            path = out_dir / f"{sc.name}.{key}.pt.trace.json.gz"
            p = procs[0]
            write_kineto(path, sc, p.rank, p.local_rank, p.pid, p.recorder, table, gpu, offset, SESSION_UTC_NS + offset)
        else:
            path = out_dir / f"{sc.name}.{key}.sqlite"
            write_trace(path, schema, procs, table, gpu, offset, sc.labels["strings"] == "ascii", node, capture,
                        sc.host.get("cuda_graph_trace", "node"))
        window = None
        if sc.output.get("window_ms"):
            w0 = stages[sc.stage_of(ranks[0])].step_bounds[0] - offset + int(sc.output["window_start_ms"] * 1e6)
            window = {"start_ns": w0, "end_ns": w0 + int(sc.output["window_ms"] * 1e6)}
            cut_window(path, window["start_ns"], window["end_ns"])
        truth = {
            "format": TRUTH_FORMAT,
            "scenario": sc.name,
            "description": sc.description,
            "seed": seed,
            "schema": schema if fmt == "sqlite" else "kineto",
            "trace": path.name,
            "config": config_mark(sc, gpu),
            "labels": sc.labels,
            "launch_latency_ns": stages[0].recorder.cost.latency_ns,
            **({"window": window} if window else {}),
            "ranks": {
                str(p.rank): {
                    "stage": sc.stage_of(p.rank),
                    "pid": p.pid,
                    "device_id": p.local_rank,
                    **rank_truth(sc, p.recorder, table, _timeline_of(sc, stages, p.rank).step_bounds, offset),
                    **_wait_truth(sc, stages, table, p.rank, offset),
                    **path_truth(p.recorder, table, _timeline_of(sc, stages, p.rank).step_bounds, offset,
                                 _timeline_of(sc, stages, p.rank).dp_last),
                }
                for p in procs
            },
        }
        if sc.straggler["rank"] is not None:
            truth["straggler"] = dict(sc.straggler)
        (out_dir / f"{sc.name}.{key}.truth.json").write_text(json.dumps(truth, indent=1, sort_keys=True) + "\n")
        written.append(path)
    return written
