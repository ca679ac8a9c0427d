"""Scenario files: the parameters of one simulated training run, validated field by field.

A scenario is YAML (or a dict) with the sections below; every key is optional except `name`. Bad input
raises :class:`perfdoctor.errors.InputError` with one line naming the field (e.g. ``parallel.tp``), so
`perfdoctor synth` can report it without a traceback.

The scenario also fixes the run's process groups (`Scenario.communicators`): which ranks share a TP, CP,
EP, DP or PP group and the 64-bit id NCCL reports for that group's communicator.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfdoctor.errors import InputError
from perfdoctor.safe_yaml import load_yaml_file
from perfdoctor.synth.gpu import GPUS

# Section -> key -> (type, default, allowed values or None). The defaults form the clean baseline.
_SPEC: dict[str, dict[str, tuple[type | tuple[type, ...], Any, tuple[Any, ...] | None]]] = {
    "model": {
        "layers": (int, 8, None),
        "hidden": (int, 4096, None),
        "heads": (int, 32, None),
        "kv_heads": (int, 8, None),
        "ffn_hidden": (int, 14336, None),
        "seq_length": (int, 4096, None),
        "micro_batch_size": (int, 1, None),
        "vocab": (int, 128256, None),
        "num_microbatches": (int, 4, None),
        "swiglu": (bool, True, None),
        "moe_experts": (int, 0, None),
        "moe_topk": (int, 2, None),
        "moe_ffn_hidden": (int, 4096, None),
        "grouped_gemm": (bool, True, None),
    },
    "parallel": {
        "tp": (int, 1, None),
        "pp": (int, 1, None),
        "vpp": (int, 1, None),
        "cp": (int, 1, None),
        "dp": (int, 8, None),
        "ep": (int, 1, None),
        "sequence_parallel": (bool, True, None),
    },
    "gpu": {
        "name": (str, "H100", tuple(GPUS)),
        "network_gbps": ((int, float), None, None),
        "nvlink_gbps": ((int, float), None, None),
        "network_latency_us": ((int, float), None, None),
        "gpus_per_node": (int, 8, None),
        # achieved share of peak (synth/gpu.py): lower it to simulate a slower GEMM library or a throttled GPU
        "gemm_efficiency": ((int, float), None, None),
    },
    "comm": {
        "overlap_grad_reduce": (bool, True, None),
        "overlap_param_gather": (bool, True, None),
        "distributed_optimizer": (bool, True, None),
        "bucket_params": (int, 40_000_000, None),
        "grad_dtype_bytes": (int, 4, (2, 4)),
        "tp_mode": (str, "nccl_stream", ("nccl_stream", "nccl_sync", "userbuffers")),
        "cuda_device_max_connections": (int, 1, None),
        "layernorm_sm_margin": (int, 16, None),
        "cp_network": (bool, False, None),
        "dp_network": (bool, True, None),
        "pp_network": (bool, False, None),
    },
    "host": {
        "launch_us": ((int, float), 4.0, None),
        "python_us": ((int, float), 6.0, None),
        "post_sync_python_us": ((int, float), 300.0, None),
        "sync_each_microbatch": (bool, False, None),
        "gc_every_steps": (int, 0, None),
        "gc_ms": ((int, float), 40.0, None),
        "gc_gen": (int, 2, (0, 1, 2)),
        "data_ms": ((int, float), 0.2, None),
        "data_stall_every_steps": (int, 0, None),
        "data_stall_ms": ((int, float), 25.0, None),
        # each layer pass replayed from a CUDA graph (TE graphed layers); nsys' --cuda-graph-trace mode: node
        # writes the graphs' kernels (sharing their cudaGraphLaunch's correlationId), graph one
        # CUPTI_ACTIVITY_KIND_GRAPH_TRACE row per replay instead (schema 2024.2 and later)
        "cuda_graphs": (bool, False, None),
        "cuda_graph_trace": (str, "graph", ("graph", "node")),
        # a pinned host-to-device prefetch of this many MiB per step on a side stream nothing waits for
        "prefetch_mb": ((int, float), 0, None),
    },
    "kernels": {
        "precision": (str, "bf16", ("bf16", "fp8")),
        "attention": (str, "flash", ("flash", "cudnn", "unfused")),
        "gemm": (str, "nvjet", ("nvjet", "xmma", "cutlass")),
        "norm": (str, "rmsnorm", ("rmsnorm", "layernorm")),
        "te_norm_namespace": (str, "normalization", ("normalization", "layer_norm")),
        "nccl_version": (str, "2.21", ("2.18", "2.21", "2.27")),
        "fused_bias_dropout": (bool, True, None),
        "fused_rope": (bool, True, None),
        "stream_base": (int, 7, None),
        # MoE token dispatch/combine with DeepEP (Megatron's flex dispatcher) instead of NCCL all-to-alls:
        # DeepEP's own kernels on its own comm stream, no NCCL call, the compute stream waiting on them
        "deep_ep": (bool, False, None),
    },
    "labels": {
        "perfdoctor": (bool, True, None),
        "nccl": (bool, True, None),
        "strings": (str, "registered", ("registered", "ascii")),
        # NCCL's NVTX extended payloads (communicator id, message size, ...) as `nsys export
        # --include-blobs=true` writes them; needs output.schema 2026.2 and labels.nccl
        "nccl_payload": (bool, False, None),
        # one ncclCommInitRankConfig range per communicator before the first step (with nccl_payload)
        "nccl_comm_init": (bool, True, None),
        # the program's own NVTX ranges (default domain) around each iteration, as hand-written benchmarks and
        # frameworks mark them: "train_step", "step_<n>", "Forward" + "Backward", Lightning's "run_training_batch"
        "user_steps": (str, "", ("", "train_step", "step_n", "forward_backward", "lightning")),
        # with user_steps: `init_model` (the weights uploaded to the GPU), `warmup` (the first `user_warmup` steps)
        # and `benchmark_loop` (the rest) ranges, as a CS336-style benchmark script marks them
        "user_phases": (bool, False, None),
        "user_warmup": (int, 1, None),
        # the ranges PyTorch's profiler records, without perfdoctor's: `ProfilerStep#N` and the DataLoader fetch
        # `enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__` (nsys: the default NVTX domain, as
        # emit_nvtx writes it; Kineto: user annotations)
        "pytorch": (bool, False, None),
    },
    "output": {
        "schema": (str, "2024.2", ("2022.4", "2024.2", "2026.2")),
        "layout": (str, "per_rank", ("per_rank", "per_node")),
        "ranks": ((list, str), "stages", None),
        # a capture window of this length (ms), beginning `window_start_ms` after the first step began, as
        # `nsys profile --delay/--duration` records it (synth/window.py); 0: the whole run
        "window_ms": ((int, float), 0, None),
        "window_start_ms": ((int, float), 0, None),
    },
    # A planted straggler (perfdoctor.synth.straggler): `rank` (none: no straggler) has GEMMs `gemm_slowdown` slower
    # (0.18: 18 %) and/or host Python cost `python_us` per launch (0: the host section's); `whole_stage`:
    # every rank of its pipeline stage is slow (a slow PP stage) instead of that rank alone. A single slow
    # rank in a pipeline run is simulated with its data-parallel lane of stages (perfdoctor.synth.simulate).
    "straggler": {
        "rank": (int, None, None),
        "gemm_slowdown": ((int, float), 0.0, None),
        "python_us": ((int, float), 0.0, None),
        "whole_stage": (bool, False, None),
    },
    "run": {
        "steps": (int, 3, None),
        "noise": ((int, float), 0.03, None),
        "seed": (int, 1, None),
    },
}
# Keys that appear in a validated section only when the first of their group is on, so scenarios without
# the option (and the truth files that record their labels) read exactly as before it existed.
_SPARSE = {"labels": (("nccl_payload", "nccl_comm_init"), ("user_steps", "user_phases", "user_warmup"), ("pytorch",)),
           "output": (("window_ms", "window_start_ms"),),
           "host": (("cuda_graphs", "cuda_graph_trace"), ("prefetch_mb",)), "kernels": (("deep_ep",),)}

# Process-group kinds with an NCCL communicator, in the order Megatron creates them
# (initialize_model_parallel: data-parallel with CP, CP, TP, PP, then the expert groups).
COMM_KINDS = ("dp", "cp", "tp", "pp", "ep")


@dataclass(frozen=True)
class Communicator:
    """One process group's NCCL communicator: its kind, member ranks in group-rank order, and the id
    (NCCL's `commHash`, an unsigned 64-bit value) its payloads carry."""

    group: str
    ranks: tuple[int, ...]
    id: int

    def rank_in_group(self, rank: int) -> int:
        return self.ranks.index(rank)


def communicator_id(group: str, ranks: tuple[int, ...]) -> int:
    """A stable 64-bit id per group instance. DP communicators always get the top bit, so any trace with
    data parallelism carries ids that do not fit a signed 64-bit integer."""
    digest = hashlib.blake2b(f"{group}:{','.join(map(str, ranks))}".encode(), digest_size=8).digest()
    cid = int.from_bytes(digest, "little")
    return cid | (1 << 63) if group == "dp" else cid


@dataclass(frozen=True)
class Scenario:
    """A validated scenario: `name`, `description` and one plain dict per section of `_SPEC`."""

    name: str
    description: str
    model: dict[str, Any]
    parallel: dict[str, Any]
    gpu: dict[str, Any]
    comm: dict[str, Any]
    host: dict[str, Any]
    kernels: dict[str, Any]
    labels: dict[str, Any]
    output: dict[str, Any]
    straggler: dict[str, Any]
    run: dict[str, Any]

    @property
    def world_size(self) -> int:
        p = self.parallel
        return p["tp"] * p["cp"] * p["dp"] * p["pp"]

    def rank_of(self, stage: int, tp_rank: int = 0, cp_rank: int = 0, dp_rank: int = 0) -> int:
        """Global rank in Megatron's tp-cp-(ep)-dp-pp order (research/kernel_taxonomy.md §6.1)."""
        p = self.parallel
        return tp_rank + p["tp"] * (cp_rank + p["cp"] * (dp_rank + p["dp"] * stage))

    def stage_of(self, rank: int) -> int:
        p = self.parallel
        return rank // (p["tp"] * p["cp"] * p["dp"])

    @property
    def nccl_payload(self) -> bool:
        return bool(self.labels.get("nccl_payload", False))

    @property
    def nccl_comm_init(self) -> bool:
        return self.nccl_payload and bool(self.labels.get("nccl_comm_init", True))

    def stage_ranks(self, stage: int) -> range:
        n = self.world_size // self.parallel["pp"]
        return range(stage * n, (stage + 1) * n)

    def group_ranks(self, group: str, rank: int) -> tuple[int, ...]:
        """The ranks of `rank`'s process group of kind `group`, in group-rank (ascending) order. `dp` is the
        data-parallel group with context parallelism (dp * cp ranks: gradients reduce over both, as the
        simulator's DP collectives do); `ep` follows Megatron's expert order tp-ep-dp-pp, whose EP ranks are
        consecutive in the combined cp-dp index."""
        p = self.parallel
        tp, cp, dp = p["tp"], p["cp"], p["dp"]
        t, j, stage = rank % tp, (rank // tp) % (cp * dp), self.stage_of(rank)
        c, d = j % cp, j // cp
        if group == "tp":
            return tuple(self.rank_of(stage, x, c, d) for x in range(tp))
        if group == "cp":
            return tuple(self.rank_of(stage, t, x, d) for x in range(cp))
        if group == "dp":
            return tuple(t + tp * (x + cp * dp * stage) for x in range(cp * dp))
        if group == "ep":
            first = j // p["ep"] * p["ep"]
            return tuple(t + tp * (first + x + cp * dp * stage) for x in range(p["ep"]))
        if group == "pp":
            return tuple(self.rank_of(s, t, c, d) for s in range(p["pp"]))
        raise ValueError(f"unknown process group kind {group!r}")

    def communicators(self, rank: int) -> list[Communicator]:
        """`rank`'s communicators (groups of more than one rank), in creation order."""
        out = []
        for group in COMM_KINDS:
            ranks = self.group_ranks(group, rank)
            if len(ranks) > 1:
                out.append(Communicator(group, ranks, communicator_id(group, ranks)))
        return out

    def output_ranks(self) -> list[int]:
        """Ranks to write: `stages` (first rank of each pipeline stage), `all`, or an explicit list."""
        ranks = self.output["ranks"]
        if ranks == "stages":
            return [self.rank_of(s) for s in range(self.parallel["pp"])]
        if ranks == "all":
            return list(range(self.world_size))
        return list(ranks)


def _fail(field: str, why: str) -> InputError:
    return InputError(f"scenario field {field}: {why}")


def _section(name: str, raw: Any) -> dict[str, Any]:
    spec = _SPEC[name]
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise _fail(name, "must be a mapping")
    unknown = sorted(set(raw) - set(spec))
    if unknown:
        raise _fail(f"{name}.{unknown[0]}", f"unknown key (known: {', '.join(spec)})")
    out: dict[str, Any] = {}
    for key, (typ, default, allowed) in spec.items():
        value = raw.get(key, default)
        field = f"{name}.{key}"
        if value is not None:
            if isinstance(value, bool) and typ is not bool and bool not in (typ if isinstance(typ, tuple) else (typ,)):
                raise _fail(field, f"expected {getattr(typ, '__name__', typ)}, got a boolean")
            if not isinstance(value, typ):
                raise _fail(field, f"expected {getattr(typ, '__name__', 'number')}, got {type(value).__name__}")
            if allowed is not None and value not in allowed:
                raise _fail(field, f"must be one of {', '.join(map(str, allowed))}, got {value!r}")
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
                raise _fail(field, "must not be negative")
        out[key] = value
    return out


def _check_consistency(s: Scenario) -> None:
    m, p = s.model, s.parallel
    for key in ("layers", "hidden", "heads", "kv_heads", "seq_length", "micro_batch_size", "num_microbatches"):
        if m[key] < 1:
            raise _fail(f"model.{key}", "must be at least 1")
    if s.output.get("window_ms", 0) < 0 or s.output.get("window_start_ms", 0) < 0:
        raise _fail("output.window_ms", "window length and start must be >= 0")
    for key in ("tp", "pp", "vpp", "cp", "dp", "ep"):
        if p[key] < 1:
            raise _fail(f"parallel.{key}", "must be at least 1")
    if m["hidden"] % m["heads"]:
        raise _fail("model.heads", "must divide model.hidden")
    if m["heads"] % m["kv_heads"] or m["kv_heads"] % p["tp"] and p["tp"] % m["kv_heads"]:
        raise _fail("model.kv_heads", "must divide model.heads and be compatible with parallel.tp")
    if m["heads"] % p["tp"]:
        raise _fail("parallel.tp", "must divide model.heads")
    if m["layers"] % (p["pp"] * p["vpp"]):
        raise _fail("parallel.vpp", "pp * vpp must divide model.layers")
    if p["vpp"] > 1 and (p["pp"] < 2 or m["num_microbatches"] % p["pp"]):
        raise _fail("parallel.vpp", "interleaving needs pp >= 2 and num_microbatches divisible by pp")
    if (m["seq_length"] // p["cp"]) % max(p["tp"], 1) or m["seq_length"] % (2 * p["cp"]):
        raise _fail("parallel.cp", "seq_length must split evenly over 2*cp chunks and tp")
    if p["ep"] > 1 and not m["moe_experts"]:
        raise _fail("parallel.ep", "needs model.moe_experts > 0")
    if m["moe_experts"] and m["moe_experts"] % p["ep"]:
        raise _fail("model.moe_experts", "must be divisible by parallel.ep")
    if p["ep"] > p["dp"] * p["cp"] or (p["dp"] * p["cp"]) % p["ep"]:
        raise _fail("parallel.ep", "must divide dp * cp")
    if s.run["steps"] < 1:
        raise _fail("run.steps", "must be at least 1")
    ranks = s.output["ranks"]
    if isinstance(ranks, str) and ranks not in ("stages", "all"):
        raise _fail("output.ranks", "must be 'stages', 'all' or a list of ranks")
    if isinstance(ranks, list):
        if not ranks or not all(
            isinstance(r, int) and not isinstance(r, bool) and 0 <= r < s.world_size for r in ranks
        ):
            raise _fail("output.ranks", f"must list ranks in [0, {s.world_size})")
        if len(set(ranks)) != len(ranks):
            raise _fail("output.ranks", "lists a rank twice")
    st = s.straggler
    if st["rank"] is not None and st["rank"] >= s.world_size:
        raise _fail("straggler.rank", f"must be a rank in [0, {s.world_size})")
    if st["rank"] is not None and not st["whole_stage"] and s.comm["overlap_grad_reduce"]:
        raise _fail("straggler.rank", "a single slow rank needs comm.overlap_grad_reduce: false "
                    "(the data-parallel rendezvous is modelled where the step waits for it)")
    if st["rank"] is not None and not st["whole_stage"] and p["pp"] > 1 and (
            p["tp"] * p["cp"] > 1 or s.comm["overlap_param_gather"] or p["dp"] < 2):
        raise _fail("straggler.rank", "a single slow rank in a pipeline run needs tp: 1, cp: 1, dp of 2 or more "
                    "and comm.overlap_param_gather: false (its lane of stages meets the others' only at "
                    "the DP collectives)")
    if s.gpu["gpus_per_node"] < 1:
        raise _fail("gpu.gpus_per_node", "must be at least 1")
    if s.nccl_payload:
        if s.output["schema"] != "2026.2":
            raise _fail("labels.nccl_payload", f'needs output.schema "2026.2", got {s.output["schema"]!r}')
        if not s.labels["nccl"]:
            raise _fail("labels.nccl_payload", "needs labels.nccl: true (payloads ride on NCCL's NVTX ranges)")


def scenario_from_dict(raw: dict[str, Any]) -> Scenario:
    """Validate a scenario mapping (as parsed from YAML) and fill in defaults."""
    if not isinstance(raw, dict):
        raise _fail("<top>", "a scenario must be a mapping")
    raw = copy.deepcopy(raw)
    name = raw.pop("name", None)
    if not isinstance(name, str) or not name or not name.replace("_", "").replace("-", "").isalnum():
        raise _fail("name", "required; letters, digits, '-' and '_' only")
    description = raw.pop("description", "")
    if not isinstance(description, str):
        raise _fail("description", "must be text")
    unknown = sorted(set(raw) - set(_SPEC))
    if unknown:
        raise _fail(unknown[0], f"unknown section (known: name, description, {', '.join(_SPEC)})")
    sections = {k: _section(k, raw.get(k)) for k in _SPEC}
    for section, groups in _SPARSE.items():
        for switch, *rest in groups:
            if not sections[section][switch]:
                for key in (switch, *rest):
                    del sections[section][key]
    s = Scenario(name=name, description=description, **sections)
    _check_consistency(s)
    return s


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML file."""
    path = Path(path)
    raw = load_yaml_file(path)
    return scenario_from_dict(raw)
