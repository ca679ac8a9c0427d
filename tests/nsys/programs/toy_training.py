"""A CPU-only stand-in for one Megatron rank, labelled the way the perfdoctor capture hook labels it.

usage: python toy_training.py [STEPS]

No GPU and no torch: each phase spins the CPU for a fixed time, so the NVTX structure is the only
thing that matters. Used to make sample_traces/real/cpu_nvtx_nsys2022.sqlite (tests/nsys/
make_real_sample.py). Every label follows DESIGN §4 (domain ``perfdoctor``): ``rank`` and ``config``
marks once, then per step ``step n=``, ``fwd``/``bwd`` per microbatch, a data-parallel
reduce-scatter per microbatch's backward and one all-gather per step (start/end ranges, as async
collectives are labelled), a ``gc gen=`` range on some steps, and a data-loading range in the
default domain. Needs nvtx==0.2.11 (newer nvtx records nothing under nsys 2022.4).
"""

from __future__ import annotations

import json
import sys
import time

import nvtx

DOMAIN = "perfdoctor"
CONFIG = {
    "tp": 1,
    "pp": 1,
    "cp": 1,
    "dp": 2,
    "ep": 1,
    "num_microbatches": 2,
    "micro_batch_size": 1,
    "global_batch_size": 4,
    "seq_length": 1024,
    "hidden_size": 256,
    "num_layers": 2,
    "vocab_size": 32000,
    "sequence_parallel": False,
    "gpu": "none (CPU-only sample)",
}
MICROBATCHES = CONFIG["num_microbatches"]
GRAD_BYTES = 4 * 1_000_000


def busy(ms: float) -> None:
    """Spin rather than sleep: a real step keeps the launching thread busy."""
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def comm(op: str, nbytes: int, ms: float) -> None:
    rng = nvtx.start_range(f"comm op={op} group=dp bytes={nbytes} size={CONFIG['dp']}", domain=DOMAIN)
    busy(ms)
    nvtx.end_range(rng)


def train(steps: int) -> None:
    nvtx.mark(message="rank r=0 local=0 world=2", domain=DOMAIN)
    nvtx.mark(message="config " + json.dumps(CONFIG), domain=DOMAIN)
    for n in range(steps):
        with nvtx.annotate(f"step n={n}", domain=DOMAIN):
            with nvtx.annotate("data loader"):  # default domain, as user code would label it
                busy(1)
            for mb in range(MICROBATCHES):
                with nvtx.annotate(f"fwd mb={mb} chunk=0", domain=DOMAIN):
                    busy(3)
            for mb in range(MICROBATCHES):
                with nvtx.annotate(f"bwd mb={mb} chunk=0", domain=DOMAIN):
                    busy(6)
                comm("reduce_scatter", GRAD_BYTES // MICROBATCHES, 1)
            comm("all_gather", GRAD_BYTES, 1.5)
            if n % 3 == 2:
                with nvtx.annotate(f"gc gen={n % 2 * 2}", domain=DOMAIN):
                    busy(4)


if __name__ == "__main__":
    train(int(sys.argv[1]) if len(sys.argv) > 1 else 8)
