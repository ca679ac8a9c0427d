"""Where the test data lives: everything a test reads is inside the repository (a clone has nothing beside it).

``sample_traces/`` holds what users see (the README's sample, one trace set per scenario); ``tests/data/``
holds what only tests need: real traces of other people's runs (``traces/``, each with its licence and a
README line on its source and scrubbing), the Megatron-LM flag list and the config-field vocabulary
(``research/``) and the tuning guides the rule catalog is checked against (``guide/``).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
DATA = REPO / "tests" / "data"
TRACES = DATA / "traces"
RESEARCH = DATA / "research"
GUIDE = DATA / "guide"
REAL_H100 = SAMPLES / "real_h100" / "h100_2gpu_fastvideo.sqlite"
