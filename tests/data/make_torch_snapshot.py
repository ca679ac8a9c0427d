"""Write tests/data/torch_profiler_snapshot.pickle: a memory snapshot produced by real PyTorch, on CPU.

``torch.cuda.memory._snapshot()`` needs a GPU; the profiler path does not: PyTorch's own
``torch.cuda._memory_viz._profile_to_snapshot`` turns a ``profile_memory=True`` profile into the
snapshot format its memory viewer reads (segments, blocks, device_traces with frames). The ground
truth written next to it comes straight from the profiler's memory timeline, not from perfdoctor:
the peak of live tensor bytes, and the span of addresses the converter uses as the segment size.

Run with torch installed (``pip install torch --index-url https://download.pytorch.org/whl/cpu``):
    python tests/data/make_torch_snapshot.py
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch
from torch.cuda._memory_viz import _profile_to_snapshot
from torch.profiler import ProfilerActivity, profile
from torch.profiler._memory_profiler import Action, TensorKey

HERE = Path(__file__).resolve().parent
WORKSPACE_ELEMENTS = 1 << 20  # 4 MiB of float32: the largest allocation, alive at the peak


def make_workspace() -> torch.Tensor:
    return torch.ones(WORKSPACE_ELEMENTS)


def train(steps: int = 2) -> profile:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 256)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        for _ in range(steps):
            workspace = make_workspace()
            loss = (model(x).square().mean() + workspace[0])
            loss.backward()
            opt.step()
            opt.zero_grad()
            del workspace, loss
    return prof


def truth(prof: profile) -> dict:
    """Peak live bytes and the address span, replayed forwards over the profiler's own timeline."""
    live, peak, lo, hi = 0, 0, None, 0
    for _time, action, (key, _version), size in prof._memory_profile().timeline:
        if not isinstance(key, TensorKey):
            continue
        if action in (Action.PREEXISTING, Action.CREATE):
            live += size
            lo = key.storage.ptr if lo is None else min(lo, key.storage.ptr)
            hi = max(hi, key.storage.ptr + size)
        elif action == Action.DESTROY:
            live -= size
        peak = max(peak, live)
    return {"peak_allocated_bytes": peak, "allocated_at_dump_bytes": live, "reserved_bytes": hi - (lo or 0),
            "largest_allocation_function": make_workspace.__name__, "torch_version": torch.__version__}


def main() -> None:
    prof = train()
    (HERE / "torch_profiler_snapshot.pickle").write_bytes(pickle.dumps(_profile_to_snapshot(prof)))
    (HERE / "torch_profiler_snapshot.truth.json").write_text(json.dumps(truth(prof), indent=2) + "\n")


if __name__ == "__main__":
    main()
