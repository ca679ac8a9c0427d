"""sample_traces/real/cpu_nvtx_nsys2022.sqlite: safe to publish, and what its README says it is.

The committed file is checked everywhere (no nsys needed); re-making it needs root and real nsys.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from perfdoctor.load.nsys import load_export
from tests.nsys.make_real_sample import DEFAULT_OUTPUT, MAX_BYTES, STEPS, make_sample, scan

# DESIGN §4 label grammar for what toy_training.py emits.
LABEL = re.compile(
    r"step n=\d+|(fwd|bwd) mb=\d+ chunk=\d+|gc gen=[012]"
    r"|comm op=(reduce_scatter|all_gather) group=dp bytes=\d+ size=\d+"
    r"|rank r=\d+ local=\d+ world=\d+|config \{.*\}"
)


def check_sample(path: Path, steps: int) -> None:
    """Privacy scan, size, and the NVTX content described in sample_traces/real/README.md."""
    assert path.stat().st_size < MAX_BYTES
    assert scan(path) == []
    info, timelines = load_export(path)
    assert info.product_version is not None and info.product_version.startswith("2022.4.")
    assert info.has_cuda is False
    (tl,) = timelines
    assert tl.device_id is None and tl.osrt_calls > 0
    nvtx = tl.nvtx
    assert np.unique(nvtx["tid"]).size == 1
    ours = nvtx[nvtx["domain"] == "perfdoctor"]
    assert all(LABEL.fullmatch(text) for text in ours["text"])
    assert [t for t in ours["text"] if t.startswith("step ")] == [f"step n={n}" for n in range(steps)]
    marks = ours[ours["event_type"] == 34]
    assert [t.split(" ")[0] for t in marks["text"]] == ["rank", "config"]
    assert json.loads(marks["text"][1].removeprefix("config "))["dp"] == 2
    kinds = Counter(text.split(" ")[0] for text in ours["text"])
    assert kinds == Counter(
        {"step": steps, "fwd": 2 * steps, "bwd": 2 * steps, "comm": 3 * steps, "gc": steps // 3, "rank": 1, "config": 1}
    )
    default = nvtx[nvtx["domain"] != "perfdoctor"]
    assert list(default["text"]) == ["data loader"] * steps


def test_committed_sample() -> None:
    check_sample(DEFAULT_OUTPUT, STEPS)


@pytest.mark.nsys
def test_sample_can_be_remade(nsys_cli: object, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("re-making the sample needs root (it captures as nobody through setpriv)")
    out = make_sample(tmp_path / "sample.sqlite", steps=3)
    check_sample(out, 3)
