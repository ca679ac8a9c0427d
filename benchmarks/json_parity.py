"""Dump `perfdoctor analyze X --format json` for every trace in the repository, or diff against a dump.

A refactor of the loader or of the per-file task must not change any report: run ``save DIR`` before the
change and ``check DIR`` after it (byte-identical JSON, the tool version and the checkout's path aside).
Inputs: every trace under sample_traces/ (each run directory analysed as one run, as the README does),
tests/data/traces/ and tests/data/h100/.

Run: ``python benchmarks/json_parity.py save /tmp/before`` then ``python benchmarks/json_parity.py check
/tmp/before``.
"""

from __future__ import annotations

import argparse
import difflib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def inputs() -> list[Path]:
    """Run directories of sample_traces/ and single files of tests/data/traces/."""
    runs = sorted(p for p in (ROOT / "sample_traces").iterdir() if p.is_dir())
    files = sorted(p for folder in ("traces", "h100") for p in (ROOT / "tests" / "data" / folder).rglob("*")
                   if p.is_file() and p.name.endswith((".sqlite", ".json.gz")))
    return runs + files + [ROOT / "tests" / "data" / "traces" / "kineto" / "param_dlrm_8rank"]


def report(path: Path) -> str:
    """The JSON report of one input, or its error line (a refusal must stay a refusal)."""
    out = subprocess.run([sys.executable, "-m", "perfdoctor", "analyze", str(path), "--format", "json",
                          "--allow-mixed"], capture_output=True, text=True, cwd=ROOT)
    text = out.stdout if out.returncode == 0 else f"exit {out.returncode}: {out.stderr.strip()[-300:]}\n"
    text = text.replace(str(ROOT), "<checkout>")  # dumps of two checkouts (a worktree, main) compare
    return "\n".join(line for line in text.splitlines() if '"tool_version"' not in line) + "\n"


def name(path: Path) -> str:
    return str(path.relative_to(ROOT)).replace("/", "__") + ".json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("save", "check"))
    ap.add_argument("dir", type=Path)
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    changed = 0
    for path in inputs():
        text = report(path)
        saved = args.dir / name(path)
        if args.mode == "save":
            saved.write_text(text)
            continue
        if not saved.exists():  # an input added since the dump: nothing to compare it with
            changed += 1
            print(f"NOT SAVED {path.relative_to(ROOT)}")
            continue
        before = saved.read_text()
        if before != text:
            changed += 1
            print(f"DIFFERS {path.relative_to(ROOT)}")
            sys.stdout.writelines(list(difflib.unified_diff(before.splitlines(True), text.splitlines(True),
                                                            "before", "after", n=1))[:40])
    count = len(inputs())
    print(f"{count} inputs " + ("saved" if args.mode == "save" else f"checked: {changed} differ"))
    sys.exit(1 if changed else 0)


if __name__ == "__main__":
    main()
