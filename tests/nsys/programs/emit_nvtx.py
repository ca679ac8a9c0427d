"""Emit a known set of NVTX events, then write down what was emitted, for the real-nsys tests.

usage: python emit_nvtx.py MANIFEST.json

Covers what the loader must read back from a real capture: the perfdoctor domain with the label
format of DESIGN §4 (steps, nested fwd/bwd, comm, gc, rank/config marks), the default domain,
push/pop and start/end ranges, a range on a second thread, a start/end range that ends on
another thread than it started on, and a numeric payload. The manifest lists every range and mark
with its domain (null = default), kind, thread and enclosing range, plus the pid and native thread
ids, so the test compares against what really ran instead of repeating these lists.

Runs on nvtx==0.2.11: from 0.2.12 on, the nvtx package silently drops every range under nsys 2022.4
(research/nsys_local.md §1).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import nvtx

DOMAIN = "perfdoctor"
STEPS = 3
CONFIG = {"tp": 1, "pp": 1, "dp": 1, "num_microbatches": 2, "seq_length": 128, "gpu": "cpu"}
COMM_BYTES = 1024

events: list[dict[str, object]] = []


def record(
    text: str, domain: str | None, kind: str, thread: str, parent: str | None = None, end_thread: str | None = None
) -> None:
    """Note one emitted event; ``kind`` is pushpop, startend or mark; ``end_thread`` if ended elsewhere."""
    events.append(
        {"text": text, "domain": domain, "kind": kind, "thread": thread, "parent": parent, "end_thread": end_thread}
    )


def busy(ms: float) -> None:
    """Spin (not sleep) so that ranges have a visible, ordered duration."""
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def worker(handoff: list[object], ready: threading.Event, tids: dict[str, int]) -> None:
    tids["worker"] = threading.get_native_id()
    with nvtx.annotate("data batch=0", domain=DOMAIN):
        busy(5)
    record("data batch=0", DOMAIN, "pushpop", "worker")
    ready.wait()
    nvtx.end_range(handoff[0])  # started on the main thread


def main(manifest_path: str) -> None:
    tids = {"main": threading.get_native_id()}
    rank = "rank r=0 local=0 world=1"
    config = "config " + json.dumps(CONFIG)
    nvtx.mark(message=rank, domain=DOMAIN)
    record(rank, DOMAIN, "mark", "main")
    nvtx.mark(message=config, domain=DOMAIN)
    record(config, DOMAIN, "mark", "main")

    # Default domain: push/pop, start/end and a mark.
    nvtx.push_range("setup")
    busy(2)
    nvtx.pop_range()
    record("setup", None, "pushpop", "main")
    rid = nvtx.start_range("warmup")
    busy(2)
    nvtx.end_range(rid)
    record("warmup", None, "startend", "main")
    nvtx.mark("checkpoint loaded")
    record("checkpoint loaded", None, "mark", "main")

    for n in range(STEPS):
        step = f"step n={n}"
        with nvtx.annotate(step, domain=DOMAIN):
            for mb in range(2):
                for kind in ("fwd", "bwd"):
                    label = f"{kind} mb={mb} chunk=0"
                    nvtx.push_range(label, domain=DOMAIN)
                    busy(1)
                    nvtx.pop_range(domain=DOMAIN)
                    record(label, DOMAIN, "pushpop", "main", step)
            comm = f"comm op=all_reduce group=dp bytes={COMM_BYTES} size=2"
            rid = nvtx.start_range(comm, domain=DOMAIN, payload=COMM_BYTES)
            busy(2)
            nvtx.end_range(rid)
            record(comm, DOMAIN, "startend", "main", step)
        record(step, DOMAIN, "pushpop", "main")

    gc_label = "gc gen=2"
    with nvtx.annotate(gc_label, domain=DOMAIN):
        busy(2)
    record(gc_label, DOMAIN, "pushpop", "main")

    # A start/end range handed to another thread to end, and a range on that thread.
    handoff: list[object] = [nvtx.start_range("handoff", domain=DOMAIN)]
    record("handoff", DOMAIN, "startend", "main", end_thread="worker")
    ready = threading.Event()
    thread = threading.Thread(target=worker, args=(handoff, ready, tids))
    thread.start()
    busy(5)
    ready.set()
    thread.join()

    manifest = {
        "pid": os.getpid(),
        "tids": tids,
        "payload": {"text": f"comm op=all_reduce group=dp bytes={COMM_BYTES} size=2", "value": COMM_BYTES},
        "events": events,
    }
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
