"""perfdoctor and Meta's HolisticTraceAnalysis (HTA) on the same PyTorch profiler traces: wall time,
peak memory and the numbers both report. Writes ``docs/vs-hta.md``.

    python benchmarks/bench_vs_hta.py               # all cases, 5 paired repetitions, rewrites docs/vs-hta.md

Each case runs both tools as separate processes, alternating (perfdoctor, HTA, perfdoctor, ...), so a
busy machine slows both alike; the table gives medians and their ratio. Peak memory is the maximum
resident set of each process (``/usr/bin/time -f %M``). What is timed:
- perfdoctor: ``perfdoctor analyze TRACES --format json`` — load, every measurement, the rules, the report;
- HTA: ``TraceAnalysis(...)`` (its parser) plus ``get_temporal_breakdown`` and ``get_comm_comp_overlap``,
  the two analyses whose numbers are compared below.

HTA is installed into its own virtual environment (``--hta-venv``, created on first use from PyPI:
``HolisticTraceAnalysis`` without its notebook dependencies), so it never touches perfdoctor's.

Numbers compared per rank, both from the same file:
- HTA temporal breakdown (µs): ``kernel_time`` = first GPU event start to last GPU event end, ``idle`` =
  time with no GPU event, ``compute`` = union of computation kernels, ``non_compute`` = the rest of the GPU
  time (communication, copies, fills);
- HTA comm/compute overlap: |comm ∩ compute| / |comm| over merged intervals.
perfdoctor's counterparts are computed from its own Timeline, taxonomy and interval algebra
(``perfdoctor.measure.intervals``) over the same events; the definitions differ where stated in the doc.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's perfdoctor, as the timed subprocesses get (PYTHONPATH)
KINETO = REPO / "tests" / "data" / "traces" / "kineto"  # real traces of other people's runs, with their licences
HTA_VERSION = "0.5.0"
HTA_DEPS = ["numpy", "pandas", "plotly", "networkx", "pydot", "psutil", "pyyaml"]

HTA_SCRIPT = r"""
import json, sys, logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
files = json.loads(sys.argv[1])
ta = TraceAnalysis(trace_files={int(k): v for k, v in files.items()}, trace_dir="/", include_last_profiler_step=True)
tb = ta.get_temporal_breakdown(visualize=False)
ov = ta.get_comm_comp_overlap(visualize=False)
out = {}
for _, row in tb.iterrows():
    out[str(int(row["rank"]))] = {
        "kernel_time_us": float(row["kernel_time(us)"]), "idle_us": float(row["idle_time(us)"]),
        "compute_us": float(row["compute_time(us)"]), "non_compute_us": float(row["non_compute_time(us)"])}
col = [c for c in ov.columns if c != "rank"][0]
for _, row in ov.iterrows():
    out[str(int(row["rank"]))]["comm_overlap"] = float(row[col]) / (100.0 if "pctg" in col else 1.0)
json.dump(out, open(sys.argv[2], "w"))
"""


def hta_python(venv: Path) -> Path:
    """The venv's interpreter, creating the venv with HTA on first use."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "--no-deps", f"HolisticTraceAnalysis=={HTA_VERSION}"], check=True)
        subprocess.run([*pip, *HTA_DEPS], check=True)
    return python


def timed(cmd: list[str], env: dict[str, str] | None = None, ok: tuple[int, ...] = (0,)) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one process; an exit status outside ``ok`` stops the run."""
    with tempfile.NamedTemporaryFile(suffix=".time") as tf:
        began = time.perf_counter()
        proc = subprocess.run(["/usr/bin/time", "-o", tf.name, "-f", "%M", *cmd], capture_output=True, text=True,
                              env=env)
        wall = time.perf_counter() - began
        if proc.returncode not in ok:
            raise SystemExit(f"{cmd[:4]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return wall, int(Path(tf.name).read_text().split()[-1]) * 1024


def rank_files(paths: list[Path]) -> dict[int, str]:
    """HTA wants {rank: file}: the rank each Kineto trace records."""
    from perfdoctor.load.kineto import load_kineto

    return {info.rank: str(p) for p in paths for info in [load_kineto(p)[0]]}


def perfdoctor_numbers(paths: list[Path]) -> dict[str, dict[str, float]]:
    """HTA's quantities, computed with perfdoctor's loader, taxonomy and interval algebra."""
    import numpy as np

    from perfdoctor.classify.timeline import category_mask, kernel_classes
    from perfdoctor.load.kineto import load_kineto
    from perfdoctor.measure.intervals import intersect, measure, union

    out = {}
    for path in paths:
        info, timelines = load_kineto(path)
        for tl in timelines:
            k = tl.kernels
            comm = category_mask(kernel_classes(k), "comm")
            s, e = k["start"], k["end"]
            ops_s = np.concatenate([s, tl.memcpy["start"], tl.memset["start"]])
            ops_e = np.concatenate([e, tl.memcpy["end"], tl.memset["end"]])
            busy = union(ops_s, ops_e)
            compute = union(s[~comm], e[~comm])
            comm_u = union(s[comm], e[comm])
            span = (ops_e.max() - ops_s.min()) / 1e3
            comm_ms = measure(comm_u)
            out[str(info.rank if tl.rank is None else tl.rank)] = {
                "kernel_time_us": span, "idle_us": span - measure(busy) / 1e3, "compute_us": measure(compute) / 1e3,
                "non_compute_us": (measure(busy) - measure(compute)) / 1e3,
                "comm_overlap": measure(intersect(comm_u, compute)) / comm_ms if comm_ms else float("nan"),
            }
    return out


def large_trace(out: Path, steps: int, layers: int) -> list[Path]:
    """A simulated Megatron run (DP×TP) written as PyTorch profiler traces, one per rank."""
    from perfdoctor.synth import run_scenario
    from perfdoctor.synth.scenario import load_scenario

    sc = load_scenario(REPO / "perfdoctor" / "synth" / "scenarios" / "clean_baseline.yaml")
    spec = {"name": "large_kineto", "description": "benchmark", "model": {**sc.model, "layers": layers},
            "parallel": dict(sc.parallel), "gpu": dict(sc.gpu), "comm": dict(sc.comm), "kernels": dict(sc.kernels),
            "output": {**sc.output, "ranks": [0]}, "run": {**sc.run, "steps": steps}}
    return run_scenario(spec, out, fmt="kineto")


def compare(pd_numbers: dict, hta_default: dict, hta_ns: dict) -> list[list[str]]:
    """Rows: rank, quantity, perfdoctor, HTA (default), HTA without its µs rounding, and perfdoctor's
    deviation from each."""

    def diff(x: float | None, y: float | None) -> str:
        return "" if x is None or y is None or y == 0 or x != x or y != y else f"{100 * (x - y) / y:+.3f} %"

    rows = []
    for rank in sorted(hta_default, key=int):
        a, b, c = pd_numbers.get(rank, {}), hta_default[rank], hta_ns.get(rank, {})
        for key, label in (("kernel_time_us", "GPU span (µs)"), ("idle_us", "idle (µs)"),
                           ("compute_us", "compute (µs)"), ("non_compute_us", "non-compute (µs)"),
                           ("comm_overlap", "comm ∩ compute / comm")):
            x, y, z = a.get(key), b.get(key), c.get(key)
            fmt = "{:.4f}" if key == "comm_overlap" else "{:,.1f}"
            rows.append([rank, label, *(fmt.format(v) if v is not None else "–" for v in (x, y, z)),
                         diff(x, y), diff(x, z)])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--hta-venv", type=Path, default=Path.home() / ".cache" / "perfdoctor-bench" / "hta-venv")
    ap.add_argument("--steps", type=int, default=40, help="steps of the large simulated trace")
    ap.add_argument("--layers", type=int, default=32, help="layers of the large simulated trace")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "vs-hta.md")
    args = ap.parse_args()
    hta = hta_python(args.hta_venv)
    work = Path(tempfile.mkdtemp(prefix="vs-hta-"))
    cases = [("hta_nccl_data (A100, rank 0 of 2)", [KINETO / "hta_nccl_data.json.gz"]),
             ("hta_ddp_v100_rank1 (V100 DDP)", [KINETO / "hta_ddp_v100_rank1.json.gz"]),
             ("param_dlrm_8rank (8 ranks)", sorted((KINETO / "param_dlrm_8rank").glob("*.json.gz"))),
             (f"simulated Megatron, {args.layers} layers × {args.steps} steps", large_trace(work / "large", args.steps,
                                                                                           args.layers))]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    results = []
    for name, paths in cases:
        files = rank_files(paths)
        kernels = sum(_kernel_count(p) for p in paths)
        size = sum(p.stat().st_size for p in paths)
        pd_cmd = [sys.executable, "-m", "perfdoctor", "analyze", *map(str, paths), "--format", "json",
                  "-o", str(work / "report.json")]
        ranks = json.dumps({str(r): f for r, f in files.items()})
        hta_cmd = [str(hta), "-c", HTA_SCRIPT, ranks, str(work / "hta.json")]
        pd_runs, hta_runs = [], []
        for _ in range(args.repeat):
            pd_runs.append(timed(pd_cmd, env, ok=(0, 1)))  # 1: perfdoctor found something
            hta_runs.append(timed(hta_cmd))
        default = json.loads((work / "hta.json").read_text())
        timed([*hta_cmd[:-1], str(work / "hta_ns.json")], {**os.environ, "HTA_DISABLE_NS_ROUNDING": "1"})
        numbers = compare(perfdoctor_numbers(paths), default, json.loads((work / "hta_ns.json").read_text()))
        results.append((name, len(paths), kernels, size, pd_runs, hta_runs, numbers))
        print(name, "done", file=sys.stderr)
    args.out.write_text(render(results, args))


def _kernel_count(path: Path) -> int:
    from perfdoctor.load.kineto import load_kineto

    return sum(len(t.kernels) for t in load_kineto(path)[1])


def render(results: list[Any], args: argparse.Namespace) -> str:
    med = statistics.median
    lines = [
        "# perfdoctor and HolisticTraceAnalysis on the same PyTorch profiler traces",
        "",
        f"Regenerate: `python benchmarks/bench_vs_hta.py` (this file; {args.repeat} paired, alternating runs per "
        f"case, medians). Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; HTA {HTA_VERSION} in its own venv. Both tools read the same files.",
        "",
        "## Speed and memory",
        "",
        "| trace | ranks | kernels | file MB | perfdoctor s | HTA s | HTA ÷ perfdoctor | perfdoctor MB | HTA MB |"
        " memory ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, ranks, kernels, size, pd_runs, hta_runs, _ in results:
        pw, hw = med(r[0] for r in pd_runs), med(r[0] for r in hta_runs)
        pm, hm = med(r[1] for r in pd_runs), med(r[1] for r in hta_runs)
        lines.append(f"| {name} | {ranks} | {kernels:,} | {size / 1e6:.1f} | {pw:.2f} | {hw:.2f} | {hw / pw:.1f}× | "
                     f"{pm / 2**20:,.0f} | {hm / 2**20:,.0f} | {pm / hm:.2f} |")
    lines += [
        "",
        "perfdoctor's time is the whole `perfdoctor analyze` (load, every measurement, the rules, the JSON report); "
        "HTA's is its parser plus the temporal breakdown and the comm/compute overlap. Memory is each process's peak "
        "resident set; the memory ratio is perfdoctor ÷ HTA.",
        "",
        "## The numbers both report",
        "",
        "Per rank, perfdoctor's values computed over the same events with its own loader, kernel taxonomy and interval "
        "algebra, next to HTA's default and HTA with its microsecond rounding switched off "
        "(`HTA_DISABLE_NS_ROUNDING=1`, see below); the last two columns are perfdoctor's deviation from each.",
        "",
    ]
    for name, *_, numbers in results:
        lines += [f"### {name}", "", "| rank | quantity | perfdoctor | HTA | HTA, ns kept | vs HTA | vs HTA, ns kept |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {' | '.join(row)} |" for row in numbers]
        lines.append("")
    lines += [
        "## Where the definitions differ",
        "",
        "- **Which events count.** HTA keeps a GPU event only if a CPU event with the same correlation id was "
        "recorded before the end of the last profiler step (`include_last_profiler_step=True` here; its default "
        "also drops the whole last step); GPU work whose launch was not recorded (another thread, outside the "
        "window) is dropped. perfdoctor keeps every GPU event of the device: it measures the device, and its "
        "host-gap analysis reports launches it cannot see.",
        "- **Communication.** HTA calls a kernel communication when its name contains `nccl`; perfdoctor's taxonomy "
        "also counts TE userbuffers, symmetric-memory all-reduce and peer-to-peer copies as communication (none of "
        "these occur in the traces above).",
        "- **Idle time.** HTA's idle is the GPU span minus the union of all GPU events, the same as perfdoctor's "
        "device idle; perfdoctor additionally splits it per step into host-caused causes (launch-bound, sync, data) "
        "and device-side waits, which HTA's idle-time breakdown defines differently (host wait / kernel wait by "
        "a fixed threshold between consecutive kernels of a stream).",
        "- **Per step.** perfdoctor's report gives medians over `ProfilerStep#N` steps; HTA sums over the window. The "
        "table compares window totals.",
        "- **Compute.** Both: the union of non-communication kernels; copies and fills are neither.",
        "- **Time resolution.** Newer PyTorch writes nanosecond timestamps (`ts` with three decimals); HTA rounds "
        "every event inward to whole microseconds (start up, end down: its parser's `round_down_time_stamps`), "
        "so each event loses up to 2 µs and short kernels can vanish. perfdoctor keeps nanoseconds. This is the "
        "whole difference on traces with nanosecond timestamps: with HTA's rounding off, the numbers agree.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
