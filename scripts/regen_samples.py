"""Regenerate the synthetic sample traces: `python scripts/regen_samples.py [OUT_DIR]`.

Every scenario shipped in perfdoctor/synth/scenarios/ is written to `<OUT_DIR>/<scenario>/` (default
`sample_traces/`). Output is deterministic (seeded, no wall-clock values), and tests/synth compares a
fresh regeneration with the committed files. Real captures in sample_traces/ are not touched.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from importlib import resources
from pathlib import Path

from perfdoctor.synth import run_scenario


def scenario_files() -> list[Path]:
    """The packaged scenario YAMLs, sorted by name."""
    return sorted(Path(str(resources.files("perfdoctor.synth").joinpath("scenarios"))).glob("*.yaml"))


def main(argv: list[str]) -> int:
    # argparse, not argv[1]: ``--help`` once became an output folder of that name, and was committed
    parser = argparse.ArgumentParser(description="Regenerate the synthetic sample traces (deterministic).")
    parser.add_argument("out_dir", nargs="?", type=Path,
                        default=Path(__file__).resolve().parent.parent / "sample_traces",
                        help="where each scenario's folder is written (default: sample_traces/)")
    root = parser.parse_args(argv[1:]).out_dir
    for path in scenario_files():
        out = root / path.stem
        if out.exists():
            shutil.rmtree(out)
        written = run_scenario(path, out)
        size = sum(p.stat().st_size for p in written) / 2**20
        print(f"{path.stem:28s} {len(written)} file(s) {size:6.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
