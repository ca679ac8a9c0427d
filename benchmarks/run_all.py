"""Run every benchmark as paired, alternating measurements against its limit and write docs/benchmarks.md.

Run: ``python benchmarks/run_all.py [--reps 9] [--quick] [--out docs/benchmarks.md]``
(``--quick`` skips the 3,000,000-kernel case). What is measured is the package as a user installs it:
the checkout's wheel, built and installed into a fresh virtual environment (bytecode compiled, the rule
catalog prebuilt; its dependencies are this interpreter's). Each case times perfdoctor and its limit in
the same run, alternating (benchmarks/paired.py), and reports medians and the median of the per-round
ratios:

* **start-up**: ``perfdoctor analyze`` of a real 2-GPU export vs ``python -c pass``;
* **N kernels** (100k, 1M, 3M of benchmarks/make_big_trace.py): the analysis (benchmarks/timed.py, timed
  after the imports) vs a C-level scan of the columns it needs (SQLite summing them, no Python objects),
  and the whole ``perfdoctor analyze`` process vs ``nsys stats`` of the installed nsys on the same file;
  peak RSS of each;
* **HTML**: ``perfdoctor analyze --html`` vs ``perfdoctor analyze`` of the 1M trace (what rendering adds);
* **SQLite readers** on the 1M trace (benchmarks/bench_readers.py): the measurement behind the loader's reader.

Sections owned by other benchmarks are run when their script is present (``EXTERNAL``): the script is
called as ``python benchmarks/<script> --json RESULT.json`` and must write
``{"title": str, "command": str, "columns": [str, ...], "rows": [[cell, ...], ...], "notes": str}``
(``notes`` optional; cells are printed as given). A script that is missing, fails or writes no result is
reported as such in its section, never silently dropped.

The 100k ratio is also stored in benchmarks/recorded.json: tests/test_benchmark_guard.py fails when a
fresh paired measurement is more than twice it (a gross regression, not noise).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paired import ROOT, difference, machine, paired, perfdoctor, ratio  # noqa: E402
from timed import NEEDED_COLUMNS  # noqa: E402

SMALL_EXPORT = ROOT / "sample_traces" / "real_h100" / "h100_2gpu_fastvideo.sqlite"
RECORDED = ROOT / "benchmarks" / "recorded.json"
EXTERNAL = (("Memory snapshots", "bench_memory.py"), ("Cross-rank", "bench_ranks.py"),
            ("Cross-rank matching", "bench_peers.py"))

TARGET_RATIO = 2.0
TARGET_RSS = 600 * 10**6
TARGET_STARTUP_S = 0.3
STARTUP_ROUNDS = 21
MB = 10**6


def timed(what: str, path: Path, python: Path | str = sys.executable) -> list[str]:
    """benchmarks/timed.py: the work on the file timed inside its own process, after the imports, by
    ``python`` with the perfdoctor it imports (run_all: the installed wheel's)."""
    return [str(python), str(ROOT / "benchmarks" / "timed.py"), what, str(path)]


def install_wheel(tmp: Path) -> Path:
    """This checkout's wheel installed into a fresh virtual environment that sees this interpreter's
    packages (its dependencies); returns the environment's bin directory."""
    wheels, venv = tmp / "wheel", tmp / "venv"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheels), str(ROOT)], check=True)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    (wheel,) = wheels.glob("perfdoctor-*.whl")
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-deps", "--force-reinstall", "-q",
                    str(wheel)], check=True)
    return venv / "bin"


def nsys_stats_command(path: Path) -> list[str] | None:
    nsys = shutil.which("nsys")
    return [nsys, "stats", "-q", "--format", "csv", "--output", "-", str(path)] if nsys else None


def nsys_version() -> str:
    nsys = shutil.which("nsys")
    if not nsys:
        return "not installed"
    out = subprocess.run([nsys, "--version"], capture_output=True, text=True).stdout.strip()
    return out.rsplit(" ", 1)[-1] if out else "unknown"


def startup_case(reps: int, bin_dir: Path) -> dict:
    s = paired({"perfdoctor": perfdoctor("analyze", str(SMALL_EXPORT), bin_dir=bin_dir),
                "python": [str(bin_dir / "python"), "-c", "pass"]}, reps)
    return {"perfdoctor_s": s["perfdoctor"].median_s, "python_s": s["python"].median_s,
            "difference_s": difference(s["perfdoctor"], s["python"]), "ratio": ratio(s["perfdoctor"], s["python"]),
            "perfdoctor_rss": s["perfdoctor"].median_rss}


def kernels_case(path: Path, reps: int, bin_dir: Path, with_nsys: bool = True) -> dict:
    python = bin_dir / "python"
    contenders = {"analyze": timed("analyze", path, python), "scan": timed("scan", path, python),
                  "cli": perfdoctor("analyze", str(path), bin_dir=bin_dir)}
    stats = nsys_stats_command(path) if with_nsys else None
    if stats:
        contenders["nsys"] = stats
    s = paired(contenders, reps)
    out = {"analyze_s": s["analyze"].median_work_s, "scan_s": s["scan"].median_work_s,
           "ratio": ratio(s["analyze"], s["scan"], work=True), "cli_s": s["cli"].median_s,
           "cli_rss": s["cli"].median_rss, "scan_rss": s["scan"].median_rss, "file_bytes": path.stat().st_size}
    if "nsys" in s:
        out |= {"nsys_s": s["nsys"].median_s, "vs_nsys": ratio(s["cli"], s["nsys"]),
                "nsys_rss": s["nsys"].median_rss}
    return out


def html_case(path: Path, reps: int, tmp: Path, bin_dir: Path) -> dict:
    page = tmp / "report.html"
    s = paired({"html": perfdoctor("analyze", str(path), "--html", str(page), bin_dir=bin_dir),
                "plain": perfdoctor("analyze", str(path), bin_dir=bin_dir)}, reps)
    return {"html_s": s["html"].median_s, "plain_s": s["plain"].median_s, "ratio": ratio(s["html"], s["plain"]),
            "render_s": difference(s["html"], s["plain"]), "html_rss": s["html"].median_rss,
            "page_bytes": page.stat().st_size}


def script_result(script: str, tmp: Path, *args: str, python: Path | str = sys.executable) -> dict:
    """The JSON result of ``python benchmarks/<script> [ARGS] --json FILE`` (see the module docstring)."""
    path = ROOT / "benchmarks" / script
    if not path.exists():
        return {"missing": f"benchmarks/{script} is not in this checkout"}
    result = tmp / f"{path.stem}.json"
    proc = subprocess.run([str(python), str(path), *args, "--json", str(result)], cwd=ROOT, capture_output=True,
                          text=True)
    if proc.returncode != 0 or not result.exists():
        tail = (proc.stderr.strip().splitlines() or ["no result written"])[-1]
        return {"missing": f"`python benchmarks/{script} --json FILE` gave no result (exit {proc.returncode}: {tail})"}
    return json.loads(result.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=9, help="paired rounds per case (>= 5 for the docs)")
    ap.add_argument("--quick", action="store_true", help="skip the 3,000,000-kernel case")
    ap.add_argument("--sizes", default="100000,1000000,3000000", help="kernel counts (100000 feeds the CI guard)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()
    started = time.time()
    results: dict = {"machine": machine(), "nsys": nsys_version(), "reps": args.reps}
    sizes = [int(n) for n in args.sizes.split(",") if not (args.quick and int(n) > 1_000_000)]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        print("installing the wheel ...", flush=True)
        bin_dir = install_wheel(tmp)
        print("start-up ...", flush=True)
        # A run takes a third of a second: more rounds cost little and steady the median on a shared machine.
        results["startup"] = startup_case(max(args.reps, STARTUP_ROUNDS), bin_dir)
        results["kernels"] = {}
        for n in sizes:
            path = tmp / f"kernels_{n}.sqlite"
            # Written by a child: a child's peak RSS (os.wait4) counts what it inherited from this process
            # before exec, so this process must never hold a trace's worth of memory.
            subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_big_trace.py"), str(path),
                            "--kernels", str(n)], check=True)
            print(f"{n:,} kernels ...", flush=True)
            results["kernels"][str(n)] = kernels_case(path, args.reps, bin_dir)
            if n == 1_000_000:
                print("HTML ...", flush=True)
                results["html"] = html_case(path, args.reps, tmp, bin_dir)
                print("readers ...", flush=True)
                results["readers"] = script_result("bench_readers.py", tmp, str(path), "--reps", str(args.reps),
                                                   python=bin_dir / "python")
            path.unlink()
        results["external"] = {}
        for title, script in EXTERNAL:
            print(f"{title} ...", flush=True)
            results["external"][title] = script_result(script, tmp)
    results["elapsed_s"] = time.time() - started
    args.out.write_text(render(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    guard = results["kernels"].get("100000")
    if guard is not None:
            RECORDED.write_text(json.dumps({"kernels": 100_000, "ratio_to_scan": round(guard["ratio"], 2),
                                        "machine": results["machine"]}, indent=1) + "\n")
    print(f"wrote {args.out}" + (f" and {RECORDED}" if guard is not None else ""))


def _s(x: float) -> str:
    return f"{x:.3f} s" if x < 10 else f"{x:.1f} s"


def _mb(x: float) -> str:
    return f"{x / MB:,.0f} MB"


def _ok(good: bool) -> str:
    return "yes" if good else "**no**"


def _script_section(ext: dict) -> list[str]:
    if "missing" in ext:
        return [f"Not measured in this run: {ext['missing']}."]
    lines = [f"`{ext['command']}`", "", "| " + " | ".join(ext["columns"]) + " |", "|" + "---|" * len(ext["columns"])]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in ext["rows"]]
    return lines + (["", ext["notes"]] if ext.get("notes") else [])


def render(r: dict) -> str:
    """docs/benchmarks.md: machine, command, one table per case, targets marked met or not."""
    lines = [
        "# Benchmarks",
        "",
        "Generated by `python benchmarks/run_all.py` (do not edit by hand). Every row is perfdoctor and its limit",
        f"measured in the same run, alternating (ABBA…), {r['reps']} paired rounds after one warm-up round; times are",
        "medians, **ratios are medians of the per-round ratios** (the machine is shared, so absolute times drift;",
        "paired ratios do not). Each contender is its own process: wall time and peak RSS include start-up.",
        "",
        f"- Machine: {r['machine']}",
        f"- nsys: {r['nsys']} (Debian package) · whole run took {r['elapsed_s'] / 60:.1f} min",
        "",
        "## Start-up: a real small export",
        "",
        f"`perfdoctor analyze {SMALL_EXPORT.relative_to(ROOT)}` (2 GPUs, 4,010 kernels) vs `python -c pass`,",
        f"{max(r['reps'], STARTUP_ROUNDS)} paired rounds. Target: within {TARGET_STARTUP_S} s of `python -c pass`.",
        "",
        "| perfdoctor analyze | python -c pass | difference | ratio | perfdoctor peak RSS | within target |",
        "|---|---|---|---|---|---|",
    ]
    s = r["startup"]
    lines.append(f"| {_s(s['perfdoctor_s'])} | {_s(s['python_s'])} | {_s(s['difference_s'])} | {s['ratio']:.2f}× | "
                 f"{_mb(s['perfdoctor_rss'])} | {_ok(s['difference_s'] <= TARGET_STARTUP_S)} |")
    lines += [
        "",
        "## Kernels: analyze vs the C-level scan and `nsys stats`",
        "",
        "Traces from `benchmarks/make_big_trace.py` (N kernels, N runtime launch calls, NVTX step ranges).",
        "*analyze* is `benchmarks/timed.py analyze FILE`: what `perfdoctor analyze FILE` does (load, classify,",
        "measure, diagnose, terminal report), timed inside the process after its imports (start-up is the case",
        "above). The limit, *scan*, is `benchmarks/timed.py scan FILE`: SQLite's C code reading every value the",
        "analysis needs once (`SELECT total(col), … FROM table`, no Python object per row) over",
        "",
    ]
    lines += [f"- `{t}`: {', '.join(c)}" for t, c in NEEDED_COLUMNS.items()]
    lines += [
        "",
        "*CLI* is the whole `perfdoctor analyze FILE` process (wall time and peak RSS, start-up included), paired",
        "with the whole `nsys stats FILE` process of Debian's nsys.",
        "",
        f"Targets at 1M kernels: analyze ≤ {TARGET_RATIO}× the scan, ≤ {TARGET_RSS // MB} MB peak RSS; growth to 3M "
        "linear.",
        "",
        "| kernels | file | analyze | scan | ratio | CLI | CLI peak RSS | nsys stats | CLI / nsys stats | "
        "nsys stats RSS |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, k in r["kernels"].items():
        nsys = (f"{_s(k['nsys_s'])} | {k['vs_nsys']:.2f}× | {_mb(k['nsys_rss'])}" if "nsys_s" in k
                else "n/a | n/a | n/a")
        lines.append(f"| {int(n):,} | {_mb(k['file_bytes'])} | {_s(k['analyze_s'])} | {_s(k['scan_s'])} | "
                     f"{k['ratio']:.2f}× | {_s(k['cli_s'])} | {_mb(k['cli_rss'])} | {nsys} |")
    ks = r["kernels"]
    if "1000000" in ks:
        one = ks["1000000"]
        lines += ["", f"At 1M: ratio {one['ratio']:.2f}× (target ≤ {TARGET_RATIO}×: {_ok(one['ratio'] <= TARGET_RATIO)}), "
                  f"CLI peak RSS {_mb(one['cli_rss'])} (target ≤ {TARGET_RSS // MB} MB: "
                  f"{_ok(one['cli_rss'] <= TARGET_RSS)})."]
        if "3000000" in ks:
            three = ks["3000000"]
            lines.append(f"1M → 3M: analyze ×{three['analyze_s'] / one['analyze_s']:.2f}, scan "
                         f"×{three['scan_s'] / one['scan_s']:.2f}, CLI peak RSS ×{three['cli_rss'] / one['cli_rss']:.2f} "
                         "(linear: ×3 or less, start-up is fixed).")
    if "html" in r:
        h = r["html"]
        lines += [
            "",
            "## HTML report of the 1M-kernel trace",
            "",
            "`perfdoctor analyze FILE --html report.html` vs `perfdoctor analyze FILE` (what drawing the timeline",
            "excerpt and rendering the page add).",
            "",
            "| with --html | without | ratio | rendering adds | peak RSS with --html | page size |",
            "|---|---|---|---|---|---|",
            f"| {_s(h['html_s'])} | {_s(h['plain_s'])} | {h['ratio']:.2f}× | {_s(h['render_s'])} | "
            f"{_mb(h['html_rss'])} | {_mb(h['page_bytes'])} |",
        ]
    sections = ([("SQLite readers (1M-kernel trace)", r["readers"])] if "readers" in r else [])
    for title, ext in sections + list(r["external"].items()):
        lines += ["", f"## {title}", ""] + _script_section(ext)
    lines += ["", "## CI guard", "",
              "`tests/test_benchmark_guard.py` repeats the 100k-kernel analyze/scan pairing (5 rounds) and fails only when the",
              "ratio is more than twice the one recorded here in `benchmarks/recorded.json`: a gross regression,",
              "not noise.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
