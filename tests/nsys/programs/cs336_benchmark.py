"""A CS336-style benchmark of a small Transformer language model, run on the CPU, with the NVTX ranges the
assignment's benchmarking script adds (nvtx==0.2.11): ``init_model`` (build the model, move it to the
device), ``warmup`` (untimed iterations), ``benchmark_loop`` (timed iterations), and per iteration
``forward``, ``backward`` and ``optimizer_step``. No perfdoctor labels, no ProfilerStep.

usage: python cs336_benchmark.py [WARMUP] [STEPS]
"""

from __future__ import annotations

import sys

import nvtx
import torch
from torch import nn

VOCAB, D_MODEL, LAYERS, HEADS, D_FF, CONTEXT, BATCH = 32000, 512, 4, 8, 1024, 32, 2


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.attn = nn.MultiheadAttention(D_MODEL, HEADS, batch_first=True)
        self.ffn = nn.Sequential(nn.Linear(D_MODEL, D_FF), nn.GELU(), nn.Linear(D_FF, D_MODEL))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.ffn(self.ln2(x))


class LanguageModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Parameter(torch.zeros(CONTEXT, D_MODEL))
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.register_buffer("mask", torch.triu(torch.full((CONTEXT, CONTEXT), float("-inf")), 1))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos
        for block in self.blocks:
            x = block(x, self.mask)
        return self.head(self.ln(x))


def build_model() -> LanguageModel:
    return LanguageModel()


def main(warmup: int, steps: int) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    device = "cpu"  # "cuda" in the assignment
    with nvtx.annotate("init_model"):
        model = build_model().to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        tokens = torch.randint(0, VOCAB, (BATCH, CONTEXT + 1), device=device)
    loss_fn = nn.CrossEntropyLoss()

    def iteration() -> None:
        with nvtx.annotate("forward"):
            logits = model(tokens[:, :-1])
            loss = loss_fn(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        with nvtx.annotate("backward"):
            loss.backward()
        with nvtx.annotate("optimizer_step"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    with nvtx.annotate("warmup"):
        for _ in range(warmup):
            iteration()
    with nvtx.annotate("benchmark_loop"):
        for _ in range(steps):
            iteration()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1, int(sys.argv[2]) if len(sys.argv) > 2 else 4)
