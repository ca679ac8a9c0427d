"""Where the test data lives: the repo's sample_traces/ and the shared folder beside the checkout."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
SHARED = REPO.parent / "shared"
REAL_H100 = SAMPLES / "real_h100" / "h100_2gpu_fastvideo.sqlite"
