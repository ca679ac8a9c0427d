"""A small GPT trained with DDP on random tokens, knowing nothing about perfdoctor (tests/e2e/gpu_capture.sh).

usage: torchrun --nproc_per_node N tests/e2e/gpt_train.py [--device cuda|cpu] [--steps 4] [--layers 4]
       [--hidden 256] [--seq 256] [--batch 8]

NCCL on GPUs (one per rank, ``torch.cuda.set_device(LOCAL_RANK)``), gloo on CPU. Batches come from a
``DataLoader``; gradients are all-reduced by DDP (PyTorch's C++ reducer, on the world group), and the
loss is averaged over the ranks with ``torch.distributed.all_reduce`` for logging, as training scripts do.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attn = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, seq: int, hidden: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, hidden), nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(hidden), nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        mask = torch.triu(torch.full((n, n), float("-inf"), device=tokens.device), diagonal=1)
        x = self.tok(tokens) + self.pos(torch.arange(n, device=tokens.device))
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    args = parser.parse_args()
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    else:
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda") if cuda else torch.device("cpu")
    torch.manual_seed(0)
    model = GPT(args.vocab, args.seq, args.hidden, args.layers, heads=max(1, args.hidden // 64)).to(device)
    model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    seeded = torch.Generator().manual_seed(rank)
    data = torch.randint(0, args.vocab, (args.steps * args.batch, args.seq + 1), generator=seeded)
    batches = iter(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=args.batch))
    for step in range(args.steps):
        (tokens,) = next(batches)
        tokens = tokens.to(device, non_blocking=True)
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if rank == 0:
            print(f"step {step} loss {mean.item() / world:.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
