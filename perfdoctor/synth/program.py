"""What one pipeline stage does in a training step, as CUDA launches on a RankRecorder.

`StageProgram.run` is a generator: it launches kernels until a pipeline receive needs data another stage
has not produced yet, then yields the keys it waits for; `simulate.py` resumes it once the peers have
posted them. Everything else (per-layer kernels, TP/CP/EP/DP communication, optimizer, host pauses,
labels) happens inline, so overlap and exposure emerge from streams and dependencies.

With `labels.nccl_payload` every NCCL collective / point-to-point range also records what its payload
needs (group kind, bytes, peer); one `ncclCommInitRankConfig` range per communicator precedes the first
step when `labels.nccl_comm_init` is on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator
from typing import Any

import numpy as np

from perfdoctor.synth import kernels as K
from perfdoctor.synth.gpu import GpuModel
from perfdoctor.synth.recorder import COPY_DTOH, COPY_HTOD, MEM_DEVICE, MEM_PAGEABLE, MEM_PINNED, RankRecorder
from perfdoctor.synth.scenario import Scenario
from perfdoctor.synth.schedule import Pass, stage_passes

Waits = Generator[list[tuple], list[int] | None, None]

_NCCL_NAME = {"all_gather": "ncclAllGather", "reduce_scatter": "ncclReduceScatter", "all_reduce": "ncclAllReduce"}
_COMM_INIT = "ncclCommInitRankConfig"
# Host time of one communicator's creation range: small enough that all of them fit in the last 0.5 ms
# before the first step, which the export's analysis window still covers.
_COMM_INIT_NS = 80_000
_SETUP_NS = 2_000_000  # host time between the config mark and the first step
_NORM_TUNED_HIDDEN = {
    768,
    1024,
    1536,
    2048,
    2304,
    3072,
    3840,
    4096,
    5120,
    6144,
    8192,
    10240,
    12288,
    12800,
    15360,
    16384,
    18432,
    20480,
    24576,
    25600,
    30720,
    32768,
    40960,
    49152,
    65536,
}


# Megatron's get_batch: the first stage needs tokens and position ids (int64), the last stage labels (int64)
# and the loss mask (float32); the pinned DataLoader batch is copied host-to-device per micro-batch.
_FIRST_STAGE_INPUTS = (8, 8)
_LAST_STAGE_INPUTS = (8, 4)
_LOSS_SCALAR_BYTES = 4  # the fp32 loss / grad-norm read back with `.item()` at step end
# What PyTorch's profiler (and emit_nvtx) names the training loop's wait for the next batch (labels.pytorch);
# its step ranges are `ProfilerStep#N`.
DATALOADER_RANGE = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
_PROFILER_STEP_NS = 60_000  # torch.profiler's step() bookkeeping at the top of each step (labels.pytorch)
_DEEP_EP_NOTIFY_NS = 25_000.0  # DeepEP's count exchange before a dispatch / combine: a few network round trips


class StageProgram:
    """Kernel sequence and timing of every rank of one pipeline stage (they are identical by symmetry)."""

    def __init__(
        self,
        sc: Scenario,
        gpu: GpuModel,
        stage: int,
        rec: RankRecorder,
        mailbox: dict[tuple, int],
        rng: np.random.Generator,
    ) -> None:
        self.sc, self.gpu, self.stage, self.rec, self.mailbox, self.rng = sc, gpu, stage, rec, mailbox, rng
        # A slow rank inside a pipeline run (synth/simulate.py): this program is one of two lanes (the slow
        # rank's data-parallel index, and every other one) whose DP collectives meet in ``rendezvous``.
        self.rendezvous: dict[tuple, int] | None = None
        self.lane = 0
        m, p, k = sc.model, sc.parallel, sc.kernels
        self.tp, self.pp, self.vpp, self.cp, self.dp, self.ep = p["tp"], p["pp"], p["vpp"], p["cp"], p["dp"], p["ep"]
        self.m = m["num_microbatches"]
        self.fp8 = k["precision"] == "fp8"
        self.label_pd = sc.labels["perfdoctor"]
        self.label_nccl = sc.labels["nccl"]
        self.nccl_payload = sc.nccl_payload
        if self.nccl_payload:
            rec.communicators = {r: {c.group: c for c in sc.communicators(r)} for r in sc.stage_ranks(stage)}
        base = k["stream_base"]
        self.s_compute = base
        self.s_dp = base + 8
        self.s_tp = base + 9
        self.s_cp = base + 10
        self.s_ep = base + 11  # DeepEP's comm stream (kernels.deep_ep)
        self.s_prefetch = base + 12  # a side stream for host.prefetch_mb
        self.deep_ep = bool(k.get("deep_ep"))
        self.layers_per_chunk = m["layers"] // (self.pp * self.vpp)
        self._noise = np.ones(0)
        self._noise_i = 0
        self._sigma = float(sc.run["noise"])
        self._build_kernels()
        self._build_buckets()
        tokens = m["micro_batch_size"] * m["seq_length"]
        dtypes = (_FIRST_STAGE_INPUTS if stage == 0 else ()) + (_LAST_STAGE_INPUTS if stage == self.pp - 1 else ())
        self.input_bytes = [tokens * size for size in dtypes]

    # ---- costs -------------------------------------------------------------------------------------
    def _build_kernels(self) -> None:
        sc, g, t = self.sc, self.gpu, self.rec.table
        m, k = sc.model, sc.kernels
        b, s, h, f = m["micro_batch_size"], m["seq_length"], m["hidden"], m["ffn_hidden"]
        heads, kv = m["heads"], m["kv_heads"]
        d = h // heads
        tok = b * s // self.cp  # tokens this rank's attention sees
        sp = self.tp if (self.tp > 1 and sc.parallel["sequence_parallel"]) else 1
        tok_sp = tok // sp
        act = tok_sp * h * 2  # bytes of one activation shard
        self.act_bytes = act
        self.full_act_bytes = tok * h * 2
        gate = 2 if m["swiglu"] else 1
        fam, fp8, sm = k["gemm"], self.fp8, g.sm_count
        tuned = h in _NORM_TUNED_HIDDEN and (tok_sp % 4 == 0)
        margin = sc.comm["layernorm_sm_margin"]
        nk, ns = k["norm"], k["te_norm_namespace"]

        def gemm(variant: int, flops: float) -> tuple[int, float]:
            return t.add(K.gemm_kernel(fam, fp8, variant, sm)), g.gemm_ns(flops, fp8)

        qkv_out = (heads + 2 * kv) * d
        self.k: dict[str, Any] = {
            "norm_fwd": (t.add(K.norm_kernel(nk, ns, "fwd", tuned, sm, margin)), g.memory_ns(3 * act)),
            "norm_bwd": (t.add(K.norm_kernel(nk, ns, "bwd", tuned, sm, margin)), g.memory_ns(5 * act)),
            "norm_fin": (t.add(K.norm_finalize_kernel(nk, ns, tuned)), g.memory_ns(h * 4 * 64)),
            "qkv": gemm(0, 2 * tok * h * qkv_out / self.tp),
            "proj": gemm(1, 2 * tok * h * h / self.tp),
            "fc1": gemm(2, 2 * tok * h * f * gate / self.tp),
            "fc2": gemm(3, 2 * tok * f * h / self.tp),
            "qkv_b": gemm(4, 2 * tok * h * qkv_out / self.tp),
            "proj_b": gemm(5, 2 * tok * h * h / self.tp),
            "fc1_b": gemm(6, 2 * tok * h * f * gate / self.tp),
            "fc2_b": gemm(7, 2 * tok * f * h / self.tp),
            "cast": (t.add(K.elementwise_kernel("cast_fp8")), g.memory_ns(act * 1.5)),
            "act_fwd": (
                t.add(K.elementwise_kernel("swiglu_fwd" if gate == 2 else "gelu_fwd")),
                g.memory_ns(tok * f * gate * 2 * 1.5 / self.tp),
            ),
            "act_bwd": (
                t.add(K.elementwise_kernel("swiglu_bwd" if gate == 2 else "gelu_bwd")),
                g.memory_ns(tok * f * gate * 2 * 2.5 / self.tp),
            ),
            "rope_fwd": (
                t.add(K.elementwise_kernel("rope_fwd" if k["fused_rope"] else "rope_unfused")),
                g.memory_ns(tok * qkv_out * 2 * 2 / self.tp),
            ),
            "rope_bwd": (
                t.add(K.elementwise_kernel("rope_bwd" if k["fused_rope"] else "rope_unfused")),
                g.memory_ns(tok * qkv_out * 2 * 2 / self.tp),
            ),
            "embed_fwd": (t.add(K.elementwise_kernel("embedding_fwd")), g.memory_ns(act * 2)),
            "embed_bwd": (t.add(K.elementwise_kernel("embedding_bwd")), g.memory_ns(act * 4)),
            "logits": gemm(8, 2 * tok * h * m["vocab"] / self.tp),
            "logits_b": gemm(9, 4 * tok * h * m["vocab"] / self.tp),
            "loss_fwd": (t.add(K.elementwise_kernel("loss_fwd")), g.memory_ns(tok * m["vocab"] * 4 / self.tp)),
            "loss_bwd": (t.add(K.elementwise_kernel("loss_bwd")), g.memory_ns(tok * m["vocab"] * 6 / self.tp)),
        }
        if k["fused_bias_dropout"]:
            self.k["bda_fwd"] = [(t.add(K.elementwise_kernel("bda_fused")), g.memory_ns(3 * act))]
            self.k["bda_bwd"] = [(t.add(K.elementwise_kernel("bda_fused_bwd")), g.memory_ns(3 * act))]
        else:
            self.k["bda_fwd"] = [
                (t.add(K.elementwise_kernel("dropout")), g.memory_ns(3 * act)),
                (t.add(K.elementwise_kernel("add")), g.memory_ns(3 * act)),
            ]
            self.k["bda_bwd"] = [(t.add(K.elementwise_kernel("dropout")), g.memory_ns(3 * act))]
        attn_flops = 4 * b * (s // self.cp) * s * h / self.tp * 0.5
        chunk_flops = attn_flops / self.cp
        kind = k["attention"]
        fwd_specs = K.attention_kernels(kind, "fwd", d)
        bwd_specs = K.attention_kernels(kind, "bwd", d)
        if kind == "unfused":
            bmm = [t.add(K.gemm_kernel(fam, False, 10, sm)), t.add(K.gemm_kernel(fam, False, 11, sm))]
            main = g.gemm_ns(chunk_flops * 2)  # unfused computes the masked half too
            score_bytes = b * heads // self.tp * (s // self.cp) * (s // self.cp) * 2
            self.k["attn_fwd"] = [
                (bmm[0], main / 2),
                (t.add(fwd_specs[0]), g.memory_ns(2 * score_bytes)),
                (bmm[1], main / 2),
            ]
            self.k["attn_bwd"] = [(bmm[1], main), (t.add(bwd_specs[0]), g.memory_ns(3 * score_bytes)), (bmm[0], main)]
        else:
            main_f, main_b = g.attention_ns(chunk_flops), g.attention_ns(chunk_flops * 2.5)
            small = g.memory_ns(tok * h * 2 / self.tp / self.cp)
            self.k["attn_fwd"] = [
                (t.add(sp_), main_f if i == len(fwd_specs) - 1 else small) for i, sp_ in enumerate(fwd_specs)
            ]
            main_i = 1 if kind == "flash" else len(bwd_specs) - 1
            self.k["attn_bwd"] = [(t.add(sp_), main_b if i == main_i else small) for i, sp_ in enumerate(bwd_specs)]
        # communication
        ver = k["nccl_version"]
        self.k["nccl_ag"] = t.add(K.nccl_kernel(ver, "AllGather"))
        self.k["nccl_rs"] = t.add(K.nccl_kernel(ver, "ReduceScatter", "bf16"))
        self.k["nccl_ar"] = t.add(K.nccl_kernel(ver, "AllReduce", "bf16"))
        gd = "f32" if sc.comm["grad_dtype_bytes"] == 4 else "bf16"
        self.k["nccl_grad_rs"] = t.add(K.nccl_kernel(ver, "ReduceScatter", gd, 32))
        self.k["nccl_grad_ar"] = t.add(K.nccl_kernel(ver, "AllReduce", gd, 32))
        self.k["nccl_p2p"] = t.add(K.nccl_kernel(ver, "SendRecv", channels=8))
        self.k["ub_ag"] = t.add(K.userbuffers_kernel("ag"))
        self.k["ub_rs"] = t.add(K.userbuffers_kernel("rs"))
        self.tp_xfer = g.link_ns(act * (self.tp - 1), network=False)  # ring AG/RS moves (n-1) shards
        self.cp_kv_bytes = 2 * tok * kv * d * 2 // max(1, self.tp)
        self.cp_xfer = g.link_ns(self.cp_kv_bytes, network=sc.comm["cp_network"])
        self.pp_xfer = g.link_ns(act, network=sc.comm["pp_network"])
        # MoE
        self.moe = m["moe_experts"] > 0
        if self.moe:
            e_local = m["moe_experts"] // self.ep
            routed = tok * m["moe_topk"]
            mf = m["moe_ffn_hidden"]
            self.e_local = e_local
            self.a2a_bytes = routed * h * 2 // sp
            self.k["router"] = gemm(12, 2 * tok * h * m["moe_experts"])
            self.k["topk"] = (t.add(K.elementwise_kernel("router_topk")), g.memory_ns(tok * m["moe_experts"] * 8))
            self.k["permute"] = (t.add(K.elementwise_kernel("permute")), g.memory_ns(routed * h * 4))
            self.k["unpermute"] = (t.add(K.elementwise_kernel("unpermute")), g.memory_ns(routed * h * 4))
            fc1_flops, fc2_flops = 2 * routed * h * mf * gate, 2 * routed * mf * h
            if m["grouped_gemm"]:
                gg = t.add(K.grouped_gemm_kernel(fp8, sm))
                self.k["experts_fwd"] = [
                    (gg, g.gemm_ns(fc1_flops, fp8)),
                    (self.k["act_fwd"][0], g.memory_ns(routed * mf * gate * 3)),
                    (gg, g.gemm_ns(fc2_flops, fp8)),
                ]
            else:
                per = []
                for e in range(e_local):
                    per.append((t.add(K.gemm_kernel(fam, fp8, 20 + e % 4, sm)), g.gemm_ns(fc1_flops / e_local, fp8)))
                    per.append((self.k["act_fwd"][0], g.memory_ns(routed * mf * gate * 3 / e_local)))
                    per.append((t.add(K.gemm_kernel(fam, fp8, 24 + e % 4, sm)), g.gemm_ns(fc2_flops / e_local, fp8)))
                self.k["experts_fwd"] = per
            self.k["experts_bwd"] = [(spec, dur * 2) for spec, dur in reversed(self.k["experts_fwd"])]
            if k.get("deep_ep"):
                self.k["ep_layout"] = (t.add(K.deep_ep_kernel("layout")), g.memory_ns(tok * m["moe_experts"] * 8))
                for what in ("notify_dispatch", "dispatch", "cached_notify", "combine"):
                    self.k[f"deep_ep_{what}"] = (t.add(K.deep_ep_kernel(what)), _DEEP_EP_NOTIFY_NS)
        # optimizer
        self.k["l2norm"] = (t.add(K.elementwise_kernel("l2norm")), 0.0)
        self.k["adam"] = (t.add(K.elementwise_kernel("adam")), 0.0)
        self.k["zero"] = (t.add(K.elementwise_kernel("zero_grad")), 0.0)

    def _layer_params(self) -> int:
        m = self.sc.model
        h, f, d = m["hidden"], m["ffn_hidden"], m["hidden"] // m["heads"]
        gate = 2 if m["swiglu"] else 1
        attn = h * (m["heads"] + 2 * m["kv_heads"]) * d + h * h
        mlp = (m["moe_experts"] // self.ep) * 3 * h * m["moe_ffn_hidden"] * self.tp if self.moe else h * f * (gate + 1)
        return (attn + mlp) // self.tp

    def _build_buckets(self) -> None:
        """DP buckets over this stage's layers, filled in backward (reverse layer) order."""
        self.dp_size = self.dp * self.cp
        per_layer = self._layer_params()
        self.stage_params = per_layer * self.layers_per_chunk * self.vpp
        cap = self.sc.comm["bucket_params"]
        self.buckets: dict[int, list[tuple[int, int]]] = {}  # chunk -> [(first layer index in bwd order, params)]
        for chunk in range(self.vpp):
            out, acc = [], 0
            for i in range(self.layers_per_chunk):
                acc += per_layer
                if acc >= cap or i == self.layers_per_chunk - 1:
                    out.append((i, acc))
                    acc = 0
            self.buckets[chunk] = out
        gb = self.sc.comm["grad_dtype_bytes"]
        net = self.sc.comm["dp_network"]
        frac = (self.dp_size - 1) / self.dp_size
        self.grad_xfer = {
            c: [
                self.gpu.link_ns(p * gb * frac * (2 if not self.sc.comm["distributed_optimizer"] else 1), net)
                for _, p in bl
            ]
            for c, bl in self.buckets.items()
        }
        self.param_xfer = {c: [self.gpu.link_ns(p * 2 * frac, net) for _, p in bl] for c, bl in self.buckets.items()}

    def _n(self, dur: float) -> float:
        """Duration with lognormal noise (pre-drawn in blocks to keep the hot loop cheap)."""
        if self._noise_i >= len(self._noise):
            self._noise = np.exp(self.rng.normal(0.0, self._sigma, 65536))
            self._noise_i = 0
        v = self._noise[self._noise_i]
        self._noise_i += 1
        return dur * v

    # ---- labels ------------------------------------------------------------------------------------
    def _comm(
        self,
        op: str,
        group: str,
        nbytes: int,
        size: int,
        spec: int,
        stream: int,
        dur: float,
        after: int = 0,
        nccl_calls: tuple[tuple[str, int], ...] = (),
        call_bytes: int = 0,
    ) -> int:
        """Launch a collective with the perfdoctor and NCCL NVTX ranges a real run would show.

        `nccl_calls`: the grouped point-to-point calls as (API name, peer offset in the group), each
        moving `call_bytes`; without them, one collective call of `nbytes`."""
        rec = self.rec
        pd = (
            rec.push(f"comm op={op} group={group} bytes={int(nbytes)} size={size}", "perfdoctor")
            if self.label_pd
            else -1
        )
        nc = -1
        if self.label_nccl:
            if len(nccl_calls) > 1:
                rec.pop(rec.push("ncclGroupStart", "NCCL"))
                for call, peer in nccl_calls:
                    rec.pop(self._nccl_call(call, group, call_bytes, peer))
                nc = rec.push("ncclGroupEnd", "NCCL")
            elif nccl_calls:
                nc = self._nccl_call(nccl_calls[0][0], group, call_bytes, nccl_calls[0][1])
            else:
                nc = self._nccl_call(_NCCL_NAME[op], group, nbytes)
        end = rec.launch(spec, stream, dur, group, after)
        if nc >= 0:
            rec.pop(nc)
        if pd >= 0:
            rec.pop(pd)
        return end

    def _nccl_call(self, name: str, group: str, nbytes: float, peer: int = 0) -> int:
        """Open the NVTX range of one NCCL API call; with payloads on, note what its payload holds."""
        idx = self.rec.push(name, "NCCL")
        if self.nccl_payload:
            self.rec.nccl_calls[idx] = (group, int(nbytes), peer)
        return idx

    def _comm_init(self) -> None:
        """ncclCommInitRankConfig of each communicator (torch creates them eagerly when the process group
        knows its device), ending where the setup time before the first step ends."""
        rec = self.rec
        comms = list(rec.communicators[rec.rank].values()) if rec.communicators else []
        rec.host_work(_SETUP_NS - _COMM_INIT_NS * len(comms))
        for comm in comms:
            idx = self._nccl_call(_COMM_INIT, comm.group, 0)
            rec.host_work(_COMM_INIT_NS)
            rec.pop(idx)

    def _run(self, key: str) -> int:
        spec, dur = self.k[key]
        return self.rec.launch(spec, self.s_compute, self._n(dur))

    def _seq(self, items: list[tuple[int, float]]) -> None:
        for spec, dur in items:
            self.rec.launch(spec, self.s_compute, self._n(dur))

    # ---- tensor parallel ---------------------------------------------------------------------------
    def _tp_collective(self, op: str) -> None:
        """SP all-gather before a column-parallel GEMM or reduce-scatter after a row-parallel one."""
        if self.tp == 1:
            return
        spec = self.k["nccl_ag" if op == "all_gather" else "nccl_rs"]
        nbytes = self.act_bytes * self.tp if op == "all_gather" else self.act_bytes * self.tp
        if self.sc.comm["tp_mode"] == "nccl_sync":
            self._comm(op, "tp", nbytes, self.tp, spec, self.s_compute, self._n(self.tp_xfer))
            return
        self.rec.wait_stream(self.s_tp, self.s_compute)
        self._comm(op, "tp", nbytes, self.tp, spec, self.s_tp, self._n(self.tp_xfer))
        self.rec.wait_stream(self.s_compute, self.s_tp)

    def _tp_gemm(self, key: str, before: str | None, after_op: str | None) -> None:
        """A TP GEMM with its SP collective; with userbuffers the GEMM is chunked and overlapped."""
        if self.tp > 1 and self.sc.comm["tp_mode"] == "userbuffers":
            self._ub_gemm(key, "ag" if before else "rs")
            return
        if before:
            self._tp_collective(before)
        if self.fp8:
            self._run("cast")
        self._run(key)
        if after_op:
            self._tp_collective(after_op)

    def _ub_gemm(self, key: str, kind: str) -> None:
        """TE comm-GEMM overlap: chunk i computes while chunk i±1 moves; with CUDA_DEVICE_MAX_CONNECTIONS
        above 1 the comm kernels queue behind the GEMM chunks and the overlap is lost."""
        rec, tp = self.rec, self.tp
        broken = self.sc.comm["cuda_device_max_connections"] != 1
        spec, dur = self.k[key]
        ub = self.k["ub_ag" if kind == "ag" else "ub_rs"]
        comm_dur = self.tp_xfer / (tp - 1)
        if self.fp8:
            self._run("cast")
        rec.wait_stream(self.s_tp, self.s_compute)
        if kind == "ag":
            prev_comm = 0
            for i in range(tp):
                gemm_start_floor = prev_comm
                if i < tp - 1:
                    after = rec.stream_free.get(self.s_compute, 0) if broken else 0
                    prev_comm_new = rec.launch(ub, self.s_tp, self._n(comm_dur), "tp", after)
                else:
                    prev_comm_new = prev_comm
                rec.launch(spec, self.s_compute, self._n(dur / tp), "", gemm_start_floor)
                prev_comm = prev_comm_new
            rec.wait_stream(self.s_compute, self.s_tp)
        else:
            for i in range(tp):
                gemm_end = rec.launch(spec, self.s_compute, self._n(dur / tp))
                if i > 0:
                    rec.launch(ub, self.s_tp, self._n(comm_dur), "tp", gemm_end if broken else gemm_end - int(dur / tp))
            rec.wait_stream(self.s_compute, self.s_tp)

    # ---- layers ------------------------------------------------------------------------------------
    def _attention(self, forward: bool) -> None:
        items = self.k["attn_fwd" if forward else "attn_bwd"]
        if self.cp == 1:
            self._seq(items)
            return
        rec = self.rec
        nbytes = self.cp_kv_bytes * (1 if forward else 2)
        xfer = self.cp_xfer * (1 if forward else 2)
        rec.wait_stream(self.s_cp, self.s_compute)
        ready = 0
        for i in range(self.cp):
            nxt = ready
            if i < self.cp - 1:
                # ring exchange: KV goes to the next CP rank while the previous one's arrives
                nxt = self._comm(
                    "send_recv",
                    "cp",
                    nbytes,
                    self.cp,
                    self.k["nccl_p2p"],
                    self.s_cp,
                    self._n(xfer),
                    after=ready,
                    nccl_calls=(("ncclSend", 1), ("ncclRecv", -1)),
                    call_bytes=nbytes,
                )
            for j, (spec, dur) in enumerate(items):
                rec.launch(spec, self.s_compute, self._n(dur), "", ready if j == 0 else 0)
            ready = nxt
        rec.wait_stream(self.s_compute, self.s_cp)

    def _moe(self, forward: bool) -> None:
        ep = self.ep
        if forward:
            self._run("router")
            self._run("topk")
            self._run("permute")
        a2a = self.a2a_bytes * (0.8 + 0.4 * self.rng.random())
        xfer = self.gpu.link_ns(a2a * (ep - 1) / ep, network=self.sc.comm["dp_network"]) if ep > 1 else 0
        if self.deep_ep and ep > 1:
            self._deep_ep_exchange("dispatch", xfer)
            self._seq(self.k["experts_fwd" if forward else "experts_bwd"])
            self._deep_ep_exchange("combine", xfer)
            self._run("unpermute" if forward else "permute")
            if not forward:
                self._run("topk")
                self._run("router")
            return
        # all_to_all_single: a send and a receive with every other EP rank, 1/ep of the tokens each
        calls = tuple((name, i) for i in range(1, ep) for name in ("ncclSend", "ncclRecv"))
        per_peer = int(a2a) // ep
        if ep > 1:
            self._comm(
                "all_to_all",
                "ep",
                int(a2a),
                ep,
                self.k["nccl_p2p"],
                self.s_compute,
                self._n(xfer),
                nccl_calls=calls,
                call_bytes=per_peer,
            )
        self._seq(self.k["experts_fwd" if forward else "experts_bwd"])
        if ep > 1:
            self._comm(
                "all_to_all",
                "ep",
                int(a2a),
                ep,
                self.k["nccl_p2p"],
                self.s_compute,
                self._n(xfer),
                nccl_calls=calls,
                call_bytes=per_peer,
            )
        self._run("unpermute" if forward else "permute")
        if not forward:
            self._run("topk")
            self._run("router")

    def _deep_ep_exchange(self, what: str, xfer: float) -> None:
        """A DeepEP dispatch or combine: the layout kernel (dispatch only) on the compute stream, then the
        count exchange and the token transfer on DeepEP's comm stream, which waits for the compute stream's
        tokens and which the compute stream then waits for."""
        rec = self.rec
        if what == "dispatch":
            self._run("ep_layout")
        rec.wait_stream(self.s_ep, self.s_compute)
        notify = "notify_dispatch" if what == "dispatch" else "cached_notify"
        spec, dur = self.k[f"deep_ep_{notify}"]
        rec.launch(spec, self.s_ep, self._n(dur), "ep")
        rec.launch(self.k[f"deep_ep_{what}"][0], self.s_ep, self._n(xfer), "ep")
        rec.wait_stream(self.s_compute, self.s_ep)

    def _graphed(self, key: str, layer_pass: Callable[[], None]) -> None:
        """One layer pass, replayed from its CUDA graph when the scenario uses graphs (host.cuda_graphs, as
        TE graphed layers do); only its compute-stream kernels are graph nodes."""
        if not self.sc.host.get("cuda_graphs"):
            layer_pass()
            return
        self.rec.graph_begin(key)
        layer_pass()
        self.rec.graph_end()

    def _layer_fwd(self) -> None:
        self._run("norm_fwd")
        self._layer_fwd_after_norm()

    def _layer_bwd(self) -> None:
        self._seq(self.k["bda_bwd"])
        if self.moe:
            self._tp_collective("all_gather")
            self._moe(False)
            self._tp_collective("reduce_scatter")
        else:
            self._tp_gemm("fc2_b", "all_gather", None)
            self._run("fc2_b")
            self._run("act_bwd")
            self._tp_gemm("fc1_b", None, "reduce_scatter")
            self._run("fc1_b")
        self._run("norm_bwd")
        self._run("norm_fin")
        self._seq(self.k["bda_bwd"])
        self._tp_gemm("proj_b", "all_gather", None)
        self._run("proj_b")
        self._attention(False)
        self._run("rope_bwd")
        self._tp_gemm("qkv_b", None, "reduce_scatter")
        self._run("qkv_b")
        self._run("norm_bwd")
        self._run("norm_fin")

    # ---- data parallel -----------------------------------------------------------------------------
    def _grad_bucket(self, chunk: int, b: int, stream: int) -> None:
        _, params = self.buckets[chunk][b]
        dist = self.sc.comm["distributed_optimizer"]
        op = "reduce_scatter" if dist else "all_reduce"
        spec = self.k["nccl_grad_rs" if dist else "nccl_grad_ar"]
        nbytes = params * self.sc.comm["grad_dtype_bytes"]
        self._comm(op, "dp", nbytes, self.dp_size, spec, stream, self._n(self.grad_xfer[chunk][b]))

    def _param_gathers(self, chunk: int, stream: int) -> list[int]:
        return [self._param_gather(chunk, b, stream) for b in range(len(self.buckets[chunk]))]

    def _param_gather(self, chunk: int, b: int, stream: int) -> int:
        params = self.buckets[chunk][b][1]
        return self._comm("all_gather", "dp", params * 2, self.dp_size, self.k["nccl_ag"], stream,
                          self._n(self.param_xfer[chunk][b]))

    def _meet(self, what: tuple, stream: int) -> Waits:
        """The DP collective just launched ends no earlier than the other lane's member arrived, plus its
        own transfer (NCCL's rendezvous); without a planted slow rank in a pipeline run, nothing."""
        if self.rendezvous is None:
            return
        rec = self.rec
        i = len(rec.k_end) - 1
        start, transfer = rec.k_start[i], rec.k_end[i] - rec.k_start[i]
        self.rendezvous[(self.lane, self.stage, *what)] = start
        arrivals = yield [(1 - self.lane, self.stage, *what)]
        assert arrivals is not None
        last = max(start, *arrivals)
        rec.dp_last.append(last)
        if last > start:
            rec.k_end[i] = last + transfer
            rec.stream_free[stream] = max(rec.stream_free[stream], last + transfer)

    # ---- passes ------------------------------------------------------------------------------------
    def _forward(self, p: Pass, step: int, gc_at: tuple[int, int] | None, ag_ends: dict[int, list[int]]) -> None:
        rec = self.rec
        r = rec.push(f"fwd mb={p.mb} chunk={p.chunk}", "perfdoctor") if self.label_pd else -1
        vstage = p.chunk * self.pp + self.stage
        if vstage == 0:
            self._run("embed_fwd")
        bucket_first = {}
        if p.chunk in ag_ends and p.mb == 0:
            # overlapped param gather: layer l needs the bucket that holds it (buckets in reverse order)
            n = self.layers_per_chunk
            for b, (last_bwd, _) in enumerate(self.buckets[p.chunk]):
                bucket_first[n - 1 - last_bwd] = ag_ends[p.chunk][b]
        for layer in range(self.layers_per_chunk):
            if gc_at == (p.mb, layer) and p.chunk == 0:
                self._gc()
            if layer in bucket_first:
                # wait placed before the first GEMM, not the norm (see recorder: norms never follow a wait)
                self._run("norm_fwd")
                rec.wait_stream(self.s_compute, self.s_dp)
                self._layer_fwd_after_norm()
            else:
                self._graphed(f"fwd chunk={p.chunk} layer={layer}", self._layer_fwd)
        if vstage == self.pp * self.vpp - 1:
            self._run("logits")
            self._run("loss_fwd")
        if r >= 0:
            rec.pop(r)
        if self.sc.host["sync_each_microbatch"]:
            rec.synchronize()
            rec.host_work(self.sc.host["post_sync_python_us"] * 1e3 / 4)

    def _layer_fwd_after_norm(self) -> None:
        self._tp_gemm("qkv", "all_gather", None)
        self._run("rope_fwd")
        self._attention(True)
        self._tp_gemm("proj", None, "reduce_scatter")
        self._seq(self.k["bda_fwd"])
        self._run("norm_fwd")
        if self.moe:
            self._tp_collective("all_gather")
            self._moe(True)
            self._tp_collective("reduce_scatter")
        else:
            self._tp_gemm("fc1", "all_gather", None)
            self._run("act_fwd")
            self._tp_gemm("fc2", None, "reduce_scatter")
        self._seq(self.k["bda_fwd"])

    def _backward(self, p: Pass, last_for_chunk: bool) -> None:
        rec = self.rec
        r = rec.push(f"bwd mb={p.mb} chunk={p.chunk}", "perfdoctor") if self.label_pd else -1
        vstage = p.chunk * self.pp + self.stage
        if vstage == self.pp * self.vpp - 1:
            self._run("loss_bwd")
            self._run("logits_b")
        overlap = last_for_chunk and self.dp_size > 1 and self.sc.comm["overlap_grad_reduce"]
        ends = {last: b for b, (last, _) in enumerate(self.buckets[p.chunk])}
        for i in range(self.layers_per_chunk):
            self._graphed(f"bwd chunk={p.chunk} layer={i}", self._layer_bwd)
            if overlap and i in ends:
                rec.wait_stream(self.s_dp, self.s_compute)
                self._grad_bucket(p.chunk, ends[i], self.s_dp)
        if vstage == 0:
            self._run("embed_bwd")
        if r >= 0:
            rec.pop(r)

    def _gc(self) -> None:
        h = self.sc.host
        r = self.rec.push(f"gc gen={h['gc_gen']}", "perfdoctor") if self.label_pd else -1
        self.rec.host_work(h["gc_ms"] * 1e6 * (0.8 + 0.4 * self.rng.random()), "gc")
        if r >= 0:
            self.rec.pop(r)

    def _p2p(self, step: int, sends: list[tuple], recvs: list[tuple]) -> Waits:
        """One batched isend/irecv: a SendRecv kernel on the compute stream that ends when this rank's
        sends are done and the data it receives has arrived (peers' sends are eager)."""
        if not sends and not recvs:
            return
        rec = self.rec
        op = "send_recv" if sends and recvs else ("send" if sends else "recv")
        # peers as stage offsets (a stage's rank in the PP group is the stage): a forward send goes to the
        # next virtual stage, a backward one to the previous; a receive comes from the key's sender
        peers = [(k[3] + 1 if k[0] == "f" else k[3] - 1) % self.pp - self.stage for k in sends]
        peers += [k[3] % self.pp - self.stage for k in recvs]
        calls = tuple(zip(["ncclSend"] * len(sends) + ["ncclRecv"] * len(recvs), peers))
        end = self._comm(
            op,
            "pp",
            self.act_bytes * (len(sends) + len(recvs)),
            self.pp,
            self.k["nccl_p2p"],
            self.s_compute,
            self._n(self.pp_xfer),
            nccl_calls=calls,
            call_bytes=self.act_bytes,
        )
        for key in sends:
            self.mailbox[key] = end
        if recvs:
            arrivals = yield recvs
            assert arrivals is not None
            final = max([end, *arrivals])
            if final > end:
                rec.p2p_wait[len(rec.k_end) - 1] = final - end
                rec.k_end[-1] = final
                rec.stream_free[self.s_compute] = max(rec.stream_free[self.s_compute], final)

    def _io(self, p: Pass, step: int) -> tuple[tuple | None, tuple | None]:
        """(what this pass must receive, what it must send) as mailbox keys, or None when local."""
        nv = self.pp * self.vpp
        v = p.chunk * self.pp + self.stage
        if p.forward:
            recv = ("f", step, p.mb, v - 1) if v > 0 else None
            send = ("f", step, p.mb, v) if v < nv - 1 else None
        else:
            recv = ("b", step, p.mb, v + 1) if v < nv - 1 else None
            send = ("b", step, p.mb, v) if v > 0 else None
        return recv, send

    def _step(self, step: int) -> Waits:
        rec, sc, h = self.rec, self.sc, self.sc.host
        sr = rec.push(f"step n={step}", "perfdoctor") if self.label_pd else -1
        user = self.sc.labels.get("user_steps", "")
        ur = rec.push({"train_step": "train_step", "step_n": f"step_{step}",
                       "lightning": "run_training_batch"}[user], "") if user and user != "forward_backward" else -1
        pr = rec.push(f"ProfilerStep#{step}", "") if sc.labels.get("pytorch") else -1
        self.step_starts.append(rec.host)
        data_ms = h["data_ms"]
        if h["data_stall_every_steps"] and step % h["data_stall_every_steps"] == h["data_stall_every_steps"] - 1:
            data_ms += h["data_stall_ms"]
        pytorch = bool(sc.labels.get("pytorch"))
        if pytorch:  # a plain PyTorch loop: prof.step()'s bookkeeping, then `for batch in loader` fetches first
            rec.host_work(_PROFILER_STEP_NS)
            self._fetch(data_ms)
        # zero_grad_buffer: Megatron clears this stage's contiguous grad buffer before forward-backward
        grad_bytes = self.stage_params * sc.comm["grad_dtype_bytes"]
        rec.fill(grad_bytes, self.s_compute, self.gpu.fill_ns(grad_bytes))
        if not pytorch:
            self._fetch(data_ms)
        prefetch = int(h.get("prefetch_mb", 0) * 2**20)
        if prefetch:  # nothing waits for it: the next step's batch, or offloaded weights for later
            rec.copy(prefetch, COPY_HTOD, MEM_PINNED, MEM_DEVICE, self.s_prefetch, self.gpu.copy_ns(prefetch))
        for _ in range(self.m):
            for nbytes in self.input_bytes:
                rec.copy(nbytes, COPY_HTOD, MEM_PINNED, MEM_DEVICE, self.s_compute, self.gpu.copy_ns(nbytes))
        gc_at = None
        if h["gc_every_steps"] and step % h["gc_every_steps"] == h["gc_every_steps"] - 1:
            gc_at = (int(self.rng.integers(0, self.m)), int(self.rng.integers(0, self.layers_per_chunk)))
        ag_ends: dict[int, list[int]] = {}
        dist, overlap_ag = sc.comm["distributed_optimizer"], sc.comm["overlap_param_gather"]
        if self.dp_size > 1 and dist and overlap_ag:
            rec.wait_stream(self.s_dp, self.s_compute)
            for chunk in range(self.vpp):
                ag_ends[chunk] = self._param_gathers(chunk, self.s_dp)
        passes = stage_passes(self.pp, self.vpp, self.m, self.stage)
        phase = -1  # forward_backward: one "Forward" range over the passes up to the first backward, then "Backward"
        if user == "forward_backward":
            phase = rec.push("Forward", "")
        last_bwd = {}
        for i, p in enumerate(passes):
            if not p.forward:
                last_bwd[p.chunk] = i
        pending_send: tuple | None = None
        for i, p in enumerate(passes):
            recv, send = self._io(p, step)
            yield from self._p2p(step, [pending_send] if pending_send else [], [recv] if recv else [])
            if not p.forward and phase >= 0 and self.rec.nvtx[phase][3] == "Forward":
                rec.pop(phase)
                phase = rec.push("Backward", "")
            if p.forward:
                self._forward(p, step, gc_at, ag_ends)
            else:
                self._backward(p, last_bwd[p.chunk] == i)
            pending_send = send
        yield from self._p2p(step, [pending_send] if pending_send else [], [])
        if phase >= 0:
            rec.pop(phase)
        if self.dp_size > 1:
            if sc.comm["overlap_grad_reduce"]:
                rec.wait_stream(self.s_compute, self.s_dp)
            else:
                for chunk in range(self.vpp):
                    for b in range(len(self.buckets[chunk])):
                        self._grad_bucket(chunk, b, self.s_compute)
                        yield from self._meet((step, "grad", chunk, b), self.s_compute)
        self._optimizer()
        if self.dp_size > 1 and dist and not overlap_ag:
            for chunk in range(self.vpp):
                for b in range(len(self.buckets[chunk])):
                    self._param_gather(chunk, b, self.s_compute)
                    yield from self._meet((step, "gather", chunk, b), self.s_compute)
        loss_ns = self.gpu.copy_ns(_LOSS_SCALAR_BYTES)
        rec.copy(_LOSS_SCALAR_BYTES, COPY_DTOH, MEM_DEVICE, MEM_PAGEABLE, self.s_compute, loss_ns)
        rec.synchronize()
        rec.host_work(h["post_sync_python_us"] * 1e3)
        for r in (pr, ur, sr):
            if r >= 0:
                rec.pop(r)

    def _fetch(self, data_ms: float) -> None:
        """The training loop waiting `data_ms` for its next batch, inside the data-loading ranges it records."""
        rec = self.rec
        dr = rec.push("data", "perfdoctor") if self.label_pd else -1
        tr = rec.push(DATALOADER_RANGE, "") if self.sc.labels.get("pytorch") else -1
        rec.host_work(data_ms * 1e6, "data")
        for r in (tr, dr):
            if r >= 0:
                rec.pop(r)

    def _optimizer(self) -> None:
        """Grad-norm and Adam as multi-tensor-apply chunks over this rank's (sharded) parameters."""
        shard = self.stage_params / (self.dp_size if self.sc.comm["distributed_optimizer"] else 1)
        chunks = max(1, int(shard // 50_000_000) + 1)
        l2 = self.gpu.memory_ns(shard * 4 / chunks)
        adam = self.gpu.memory_ns(shard * 16 * 2 / chunks)
        for _ in range(chunks):
            self.rec.launch(self.k["l2norm"][0], self.s_compute, self._n(l2))
        for _ in range(chunks):
            self.rec.launch(self.k["adam"][0], self.s_compute, self._n(adam))
        self.rec.launch(self.k["zero"][0], self.s_compute, self._n(l2))

    def run(self, config_mark: dict[str, Any]) -> Waits:
        """All steps of this stage; yields mailbox keys whenever it waits on a pipeline peer."""
        self.step_starts: list[int] = []
        if self.label_pd:
            # the per-process `rank` mark is added by the writer, which knows which rank each file holds
            self.rec.mark("config " + json.dumps(config_mark, separators=(",", ":")), "perfdoctor")
        phases = bool(self.sc.labels.get("user_phases"))
        init = self.rec.push("init_model", "") if phases else -1
        if self.sc.nccl_comm_init:
            self._comm_init()
        else:
            self.rec.host_work(_SETUP_NS)
        if init >= 0:
            self._upload_weights()
            self.rec.synchronize()
            self.rec.pop(init)
        warmup = self.sc.labels.get("user_warmup", 0) if phases else 0
        loop = -1
        for step in range(self.sc.run["steps"]):
            if phases and step == 0 and warmup:
                loop = self.rec.push("warmup", "")
            if phases and step == warmup:
                if loop >= 0:
                    self.rec.pop(loop)
                loop = self.rec.push("benchmark_loop", "")
            yield from self._step(step)
        if loop >= 0:
            self.rec.pop(loop)
        self.step_starts.append(self.rec.host)

    def _upload_weights(self) -> None:
        """model.to("cuda") inside `init_model`: this stage's parameters as built (fp32) copied from pageable
        host memory in 64 MiB pieces, on the compute stream."""
        total = self.stage_params * 4
        piece = 64 << 20
        for off in range(0, int(total), piece):
            nbytes = min(piece, int(total) - off)
            self.rec.copy(nbytes, COPY_HTOD, MEM_PAGEABLE, MEM_DEVICE, self.s_compute, self.gpu.copy_ns(nbytes))
