"""HTML report of a 1,000,000-kernel trace: time to render and file size (issue 6: < 10 s, < 15 MB).

Builds the trace with benchmarks/make_big_trace.py (random kernels, NVTX step ranges), analyses it, then
times ``render_html`` (plotly.js inlined) separately from the analysis, and reports the page size and
how many rectangles the timeline excerpt drew. Run: ``python benchmarks/bench_html.py [--kernels N]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_big_trace import write  # noqa: E402

from perfdoctor import api  # noqa: E402
from perfdoctor.render.html import render_html  # noqa: E402

TIME_BUDGET_S = 10.0
SIZE_BUDGET_BYTES = 15 * 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--trace", type=Path, help="use this trace instead of generating one")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = args.trace or Path(tmp) / "big.sqlite"
        if args.trace is None:
            t0 = time.perf_counter()
            write(trace, args.kernels)
            print(f"generated {args.kernels:,} kernels in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        report = api.analyze([trace])
        analyze_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        page = render_html(report)
        render_s = time.perf_counter() - t0
    size = len(page.encode("utf-8"))
    rects = sum(len(ex.rects) for ex in report.excerpts if ex is not None)
    print(f"analyze (load + measure + excerpt): {analyze_s:.2f} s")
    print(f"render_html: {render_s:.2f} s, {size / 2**20:.2f} MiB, {rects:,} timeline bars "
          f"(budget {TIME_BUDGET_S:.0f} s, {SIZE_BUDGET_BYTES / 2**20:.0f} MiB)")
    print(f"analyze + render: {analyze_s + render_s:.2f} s")
    if render_s > TIME_BUDGET_S or size > SIZE_BUDGET_BYTES:
        sys.exit(1)


if __name__ == "__main__":
    main()
