"""A tiny data-parallel training run on CPU (gloo) that knows nothing about perfdoctor.

usage: torchrun --nproc_per_node 2 tests/e2e/tiny_train.py [STEPS]

Groups are made the way Megatron makes them (``group_desc``): a data-parallel group that all-reduces
gradients, a tensor-parallel group that all-gathers activations, and a pipeline group that swaps a
tensor with ``batch_isend_irecv``. Every other step makes cyclic garbage and collects it, so GC runs
inside steps. Batches come from a ``DataLoader``. The optimizer is plain ``torch.optim.SGD``.

With ``TINY_TRAIN_TIMES=FILE`` each rank writes its iteration times to ``FILE.<rank>`` (JSON: one
``[wall s, process CPU s]`` pair per iteration), which benchmarks/bench_capture_overhead.py compares with
and without a capture.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def main(steps: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    everyone = list(range(world))
    dp = dist.new_group(everyone, group_desc="DATA_PARALLEL_GROUP")
    tp = dist.new_group(everyone, group_desc="TENSOR_MODEL_PARALLEL_GROUP")
    pp = dist.new_group(everyone, group_desc="PIPELINE_MODEL_PARALLEL_GROUP")
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(steps * 32, 64)),
                                               batch_size=32))
    times = []
    for step in range(steps):
        began, cpu = time.perf_counter(), time.process_time()
        (x,) = next(batches)
        hidden = model[0](x)
        gathered = [torch.empty_like(hidden) for _ in range(world)]
        dist.all_gather(gathered, hidden.detach(), group=tp)
        loss = model[2](model[1](hidden)).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, group=dp)
            p.grad /= world
        if world > 1:
            peer = (rank + 1) % world
            inbox = torch.empty(1024)
            ops = [dist.P2POp(dist.isend, torch.full((1024,), float(rank)), peer, group=pp),
                   dist.P2POp(dist.irecv, inbox, (rank - 1) % world, group=pp)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        optimizer.step()
        optimizer.zero_grad()
        if step % 2 == 1:
            for _ in range(200):
                a: list = []
                a.append(a)
            gc.collect()
        times.append((time.perf_counter() - began, time.process_time() - cpu))
    if os.environ.get("TINY_TRAIN_TIMES"):
        with open(f"{os.environ['TINY_TRAIN_TIMES']}.{rank}", "w") as fh:
            json.dump(times, fh)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
