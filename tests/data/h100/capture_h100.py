"""Capture perfdoctor's own real PyTorch traces on one GPU (tests/data/h100/README.md).

Writes into OUT_DIR:
  gpt_eager.json.gz      Kineto trace of a GPT-style decoder training loop (bf16 autocast, fused AdamW,
                         scaled_dot_product_attention), 3 profiled steps marked by ProfilerStep#N
  gpt_cudagraph.json.gz  the same model and step captured once as one CUDA graph (forward, backward and
                         optimizer step) and replayed: the trace shows cudaGraphLaunch
  gpt_memory.pickle      CUDA memory snapshot (torch.cuda.memory._dump_snapshot) of a few eager steps
  env.json               torch / CUDA / GPU versions for the README
  ddp.txt                whether a 2-rank NCCL DDP run on the one GPU was possible
With --compile (instead of all the above):
  gpt_compiled.json.gz   the model under torch.compile(mode="reduce-overhead"): Triton kernels replayed
                         by CUDA-graph trees, fused AdamW eager

Usage: python capture_h100.py OUT_DIR [--cpu-dry-run] [--compile]
The CPU dry run (tiny sizes, CPU profiler only) checks the script where there is no GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function, schedule

FULL = dict(layers=6, hidden=1536, heads=12, seq=1024, batch=4, vocab=16384)
TINY = dict(layers=2, hidden=64, heads=4, seq=32, batch=2, vocab=256)


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.proj = nn.Linear(hidden, hidden, bias=False)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden, bias=False)
        self.fc2 = nn.Linear(4 * hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, seq: int, vocab: int, **_: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def make(cfg: dict, device: str, capturable: bool = False):
    torch.manual_seed(0)
    model = GPT(**cfg).to(device)
    fused = device == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused, capturable=capturable and fused)
    return model, opt


def batch(cfg: dict, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    data = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), device=device)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def train_step(model, opt, x, y, device: str, cache: bool = True) -> torch.Tensor:
    with record_function("forward"):
        with torch.autocast(device_type=device, dtype=torch.bfloat16, cache_enabled=cache):
            logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))
    with record_function("backward"):
        loss.backward()
    with record_function("optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=not cache)
    return loss


def activities(device: str) -> list:
    return [ProfilerActivity.CPU, ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def eager_trace(cfg: dict, device: str, out: Path) -> None:
    model, opt = make(cfg, device)
    for _ in range(3):  # allocator, cuBLAS heuristics and autotuning out of the way
        train_step(model, opt, *batch(cfg, device), device)
    sync(device)
    with profile(activities=activities(device), schedule=schedule(wait=1, warmup=1, active=3, repeat=1)) as prof:
        for _ in range(5):
            with record_function("data"):
                x, y = batch(cfg, device)
            train_step(model, opt, x, y, device)
            sync(device)  # a loss.item() a real loop would do for logging
            prof.step()
    prof.export_chrome_trace(str(out))


def kernel_events(path: Path) -> dict[str, int]:
    """How many device kernels and graph launches an exported trace holds (printed to check the capture)."""
    import gzip

    events = json.load(gzip.open(path))["traceEvents"]
    return {"kernels": sum(e.get("cat") == "kernel" for e in events),
            "graph_launches": sum(e.get("cat") == "cuda_runtime" and e.get("name", "").startswith("cudaGraphLaunch")
                                  for e in events),
            "profiler_steps": sum(e.get("name", "").startswith("ProfilerStep#") for e in events)}


def graph_trace(cfg: dict, device: str, out: Path, profile_capture: bool = False) -> None:
    """Whole-step capture as in the PyTorch CUDA-graphs docs: warm up on a side stream, capture forward,
    backward and the capturable fused AdamW step once, then replay with new data copied in.
    ``profile_capture``: the profiler runs from before the capture on (a fallback for CUPTI versions
    that do not report the kernels of graphs captured while it was off)."""
    outer = profile(activities=activities(device)) if profile_capture else None
    if outer:
        outer.__enter__()
    model, opt = make(cfg, device, capturable=True)
    static_x, static_y = batch(cfg, device)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            train_step(model, opt, static_x, static_y, device, cache=False)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        static_loss = train_step(model, opt, static_x, static_y, device, cache=False)
    for _ in range(3):
        g.replay()
    sync(device)
    if outer:
        prof = outer
    else:
        prof = profile(activities=activities(device), schedule=schedule(wait=1, warmup=1, active=3, repeat=1))
        prof.__enter__()
    for _ in range(5):
        with record_function("data"):
            x, y = batch(cfg, device)
            static_x.copy_(x)
            static_y.copy_(y)
        with record_function("graph_replay"):
            g.replay()
        static_loss.item()
        prof.step()
    prof.__exit__(None, None, None)
    prof.export_chrome_trace(str(out))


def memory_snapshot(cfg: dict, out: Path, entries: int, context: str = "all") -> None:
    torch.cuda.empty_cache()
    torch.cuda.memory._record_memory_history(context=context, stacks="python", max_entries=entries)
    model, opt = make(cfg, "cuda")
    for _ in range(3):
        train_step(model, opt, *batch(cfg, "cuda"), "cuda")
    sync("cuda")
    torch.cuda.memory._dump_snapshot(str(out))
    torch.cuda.memory._record_memory_history(enabled=None)
    del model, opt


def compiled_trace(cfg: dict, device: str, out: Path) -> None:
    """Forward and loss as one compiled function returning only the loss (the pattern CUDA-graph trees
    replay safely); backward through the compiled backward; fused AdamW eager."""
    model, opt = make(cfg, device)

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            logits = model(x)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))

    compiled = torch.compile(loss_of, mode="reduce-overhead" if device == "cuda" else "default")

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        torch.compiler.cudagraph_mark_step_begin()
        with record_function("forward"):
            loss = compiled(x, y)
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)

    for _ in range(5):  # compile, record the CUDA-graph trees, then replay them
        step(*batch(cfg, device))
    sync(device)
    with profile(activities=activities(device), schedule=schedule(wait=1, warmup=1, active=3, repeat=1)) as prof:
        for _ in range(5):
            with record_function("data"):
                x, y = batch(cfg, device)
            step(x, y)
            sync(device)
            prof.step()
    prof.export_chrome_trace(str(out))


DDP_CHILD = r"""
import os, sys, torch, torch.distributed as dist
rank = int(sys.argv[1])
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", 0))
t = torch.ones(1 << 20, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
print("rank", rank, "all_reduce ok", t[0].item())
dist.destroy_process_group()
"""


def try_ddp(out: Path) -> None:
    """One try: two NCCL ranks on the same GPU. NCCL normally refuses ('Duplicate GPU detected')."""
    procs = [subprocess.Popen([sys.executable, "-c", DDP_CHILD, str(r)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    lines = []
    for r, p in enumerate(procs):
        try:
            text, _ = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
            text += "\n<timed out after 60 s>"
        lines.append(f"=== rank {r} exit {p.returncode}\n{text[-3000:]}")
    out.write_text("\n".join(lines))


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    dry = "--cpu-dry-run" in sys.argv
    device = "cpu" if dry else "cuda"
    cfg = TINY if dry else FULL
    if not dry:
        torch.backends.cuda.matmul.allow_tf32 = True
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
           "config": cfg}
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        env |= {"gpu": p.name, "sms": p.multi_processor_count, "memory": p.total_memory,
                "cc": f"{p.major}.{p.minor}"}
    n = sum(p.numel() for p in GPT(**cfg).parameters())
    env["params"] = n
    print(json.dumps(env), flush=True)
    t = time.time()
    if "--compile" in sys.argv:
        compiled_trace(cfg, device, out / "gpt_compiled.json.gz")
        print(f"compiled trace {time.time() - t:.1f}s", flush=True)
        if device == "cuda":
            print("compiled trace:", kernel_events(out / "gpt_compiled.json.gz"), flush=True)
        return
    eager_trace(cfg, device, out / "gpt_eager.json.gz")
    print(f"eager trace {time.time() - t:.1f}s", flush=True)
    if device == "cuda":
        print("eager trace:", kernel_events(out / "gpt_eager.json.gz"), flush=True)
    if device == "cuda":
        t = time.time()
        try:
            graph_trace(cfg, device, out / "gpt_cudagraph.json.gz")
            counts = kernel_events(out / "gpt_cudagraph.json.gz")
            print("graph trace:", counts, flush=True)
            if counts["kernels"] < 10:
                graph_trace(cfg, device, out / "gpt_cudagraph_profiled_capture.json.gz", profile_capture=True)
                print("graph trace, profiled capture:",
                      kernel_events(out / "gpt_cudagraph_profiled_capture.json.gz"), flush=True)
        except Exception as exc:  # report and go on: the other captures are still worth having
            print("graph capture failed:", repr(exc), flush=True)
        print(f"graph trace {time.time() - t:.1f}s", flush=True)
        t = time.time()
        memory_snapshot(cfg, out / "gpt_memory.pickle", entries=100_000)
        memory_snapshot(cfg, out / "gpt_memory_alloc_stacks.pickle", entries=100_000, context="alloc")
        print(f"memory snapshot {time.time() - t:.1f}s", flush=True)
        if "--no-ddp" not in sys.argv:
            t = time.time()
            try_ddp(out / "ddp.txt")
            print(f"ddp try {time.time() - t:.1f}s", flush=True)
    (out / "env.json").write_text(json.dumps(env, indent=1))
    for f in sorted(out.iterdir()):
        print(f"{f.name}\t{f.stat().st_size}", flush=True)


if __name__ == "__main__":
    main()
