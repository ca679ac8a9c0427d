"""Runs in a subprocess for test_hook.py: the hook installed as sitecustomize would, then real torch (gloo,
one process) with fake Megatron modules; prints every NVTX call the hook made, as JSON.

usage: python hook_program.py FAKE_MEGATRON_DIR  (PERFDOCTOR_* settings come from the environment)
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile

from perfdoctor.capture.hook import runtime

events: list[list] = []


class Recorder(runtime.Emitter):
    backend = "recorder"

    def start(self, message):
        events.append(["start", message])
        return len(events)

    def end(self, handle):
        events.append(["end", events[handle - 1][1]])

    def push(self, message):
        events.append(["push", message])

    def pop(self):
        events.append(["pop"])

    def mark(self, message):
        events.append(["mark", message])


runtime.make_emitter = lambda warn: Recorder()
hook = runtime.install()
sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402 (after the hook, as in a training process)
import torch.distributed as dist  # noqa: E402
from megatron.core import parallel_state  # noqa: E402 (the fake one)
from megatron.core.pipeline_parallel import schedules  # noqa: E402

store = tempfile.mktemp()
dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
tp = dist.new_group([0], group_desc="TENSOR_MODEL_PARALLEL_GROUP")
nameless = dist.new_group([0])
parallel_state.set_groups(pp=nameless)
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
expert_optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)  # a chained optimizer's 2nd
for step in range(5):
    events.append(["test", f"iteration {step}"])
    schedules.forward_step(None, current_microbatch=0)
    schedules.backward_step(None)
    model(torch.ones(4)).sum().backward()
    dist.all_reduce(model.weight.grad)  # world group, no Megatron dp group: dp
    dist.all_gather_into_tensor(torch.empty(8), torch.ones(8), group=tp)
    dist.broadcast(torch.ones(2), 0, group=nameless)  # no description: Megatron's getters name it pp
    with dist._coalescing_manager(group=tp):
        dist.all_reduce(torch.ones(3), group=tp)
    optimizer.step()
    expert_optimizer.step()
    gc.collect()
dist.destroy_process_group()
hook.finish()
print(json.dumps({"events": events, "rank_file": os.path.exists(os.path.join(os.environ["PERFDOCTOR_RUN_DIR"],
                                                                              "ranks", "rank0.json"))}))
