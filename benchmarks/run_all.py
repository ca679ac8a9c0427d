"""Measure what a user runs, each case paired with its limit in the same run, and write docs/benchmarks.md.

Run: ``python benchmarks/run_all.py`` (every section; ``--quick`` skips the 10M and 30M kernels;
``--sections startup,1m,ranks`` runs only those; ``--reps N`` paired rounds per case). What is measured is
the package as a user installs it: the checkout's wheel, built and installed into a fresh virtual
environment (bytecode compiled, the rule catalog prebuilt; its dependencies are this interpreter's).

Sections (``--sections``, default all, in this order):

* ``startup``: ``perfdoctor analyze`` of the bundled real 2-GPU export vs ``python -c pass``;
* ``100k``, ``1m``, ``10m``, ``30m``: N-kernel traces of benchmarks/make_big_trace.py. The headline is the
  whole installed CLI process, ``perfdoctor analyze FILE --format json -o /dev/null`` (start-up included),
  paired with the C-level SQLite scan of the columns it needs (benchmarks/timed.py ``scan``), with the
  peak RSS of the CLI's whole process tree and the file size beside it; below it the in-process split
  (benchmarks/timed.py ``analyze``: imports, load, analysis, JSON) and, up to 1M, ``nsys stats``;
* ``30m-unsorted``: the 30M trace with its kernel rows out of start order (pairs of 65,536-row blocks
  swapped, as a real export's come), which the loader sorts; ``10m-node``, ``30m-node``: per-node exports,
  the kernels of 8 GPUs' processes in one file;
* ``html``, ``readers``: the HTML report and the SQLite readers (benchmarks/bench_readers.py) at 1M;
* ``ranks-jobs``, ``ranks-rss`` (``ranks``: both): benchmarks/bench_ranks.py, 64 ranks ``--jobs 2`` vs
  ``--jobs 1``, and the peak RSS of 1,024 ranks against 128 (the same simulated rank);
* ``memory``, ``peers``: benchmarks/bench_memory.py and benchmarks/bench_peers.py.

Every "Done when" row of issue 25 is shown at the top, met or not met against its limit, computed from
this run's measurement. A section that fails (a command exits non-zero, a script writes no result) is
reported as failed in its place and in the summary, and the run exits 1: never silently dropped. So is a
measured process tree that leaves the machine under 2 GiB of available memory (killed: benchmarks/paired.py)
or runs past an hour.

Traces are cached (benchmarks/make_big_trace.py ``--cached``: ``$PERFDOCTOR_BENCH_CACHE`` or
``~/.cache/perfdoctor-bench``, keyed by size, seed and the generator's hash); a 30M-kernel trace is 3.3 GB.

A script section is called as ``python benchmarks/<script> [ARGS] --json RESULT.json`` and must write
``{"title": str, "command": str, "columns": [str, ...], "rows": [[cell, ...], ...], "notes": str}``
(``notes`` optional; cells are printed as given).

The 100k in-process ratio is also stored in benchmarks/recorded.json: tests/test_benchmark_guard.py fails
when a fresh paired measurement is more than twice it (a gross regression, not noise).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import site
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paired import (  # noqa: E402
    CHILD_TIMEOUT_S,
    FRESH_MEGABYTES,
    FRESH_SETTLE_S,
    ROOT,
    Sample,
    difference,
    difference_interval,
    fresh_memory_rate,
    machine,
    paired,
    perfdoctor,
    ratio,
    ratio_to_work,
)
from timed import NEEDED_COLUMNS  # noqa: E402

SMALL_EXPORT = ROOT / "sample_traces" / "real_h100" / "h100_2gpu_fastvideo.sqlite"
RECORDED = ROOT / "benchmarks" / "recorded.json"
SIZES = {"100k": 100_000, "1m": 1_000_000, "10m": 10_000_000, "30m": 30_000_000, "30m-unsorted": 30_000_000,
         "10m-node": 10_000_000, "30m-node": 30_000_000}
# Per-node exports: the kernels spread over this many GPUs' processes in one file (make_big_trace --processes).
PROCESSES = {"10m-node": 8, "30m-node": 8}
# Kernel rows out of start order (:func:`unsorted_copy`): the loader sorts them, a real export's case.
UNSORTED = ("30m-unsorted",)
BIG = ("10m", "30m", "30m-unsorted", "10m-node", "30m-node")  # skipped by --quick; fewer rounds (--big-reps)
SECTIONS = ("startup", "100k", "1m", "html", "readers", "10m", "30m", "30m-unsorted", "10m-node", "30m-node",
            "ranks-jobs", "ranks-rss", "memory", "peers")
ALIASES = {"ranks": ("ranks-jobs", "ranks-rss")}
SCRIPTS = {"memory": ("Memory snapshots", "bench_memory.py"), "peers": ("Cross-rank matching", "bench_peers.py")}

# Issue 25's limits ("Done when").
STARTUP_LIMIT_S = 0.3
RATIO_LIMIT = {"1m": 2.5, "10m": 2.0}
RSS_LIMIT = {"10m": 10**9, "30m": 10**9, "30m-unsorted": 10**9, "10m-node": 10**9, "30m-node": 10**9}
JOBS_SPEEDUP_LIMIT = 1.7
# "Flat": 8× the ranks may add at most a quarter to the peak (it would add 700 % if memory followed ranks).
FLAT_RSS_LIMIT = 1.25

# Rounds of the start-up case: 31 give a 95 % interval of the median difference between the 10th and the
# 22nd of the sorted differences (paired.difference_interval), about 12 s more than 21 rounds took.
STARTUP_ROUNDS = 31
MB = 10**6


def timed(what: str, path: Path, python: Path | str = sys.executable) -> list[str]:
    """benchmarks/timed.py: the work on the file timed inside its own process, after the imports, by
    ``python`` with the perfdoctor it imports (run_all: the installed wheel's)."""
    return [str(python), str(ROOT / "benchmarks" / "timed.py"), what, str(path)]


def cli(path: Path, bin_dir: Path) -> list[str]:
    """What a user runs: the installed console script, JSON report thrown away."""
    return perfdoctor("analyze", str(path), "--format", "json", "-o", os.devnull, bin_dir=bin_dir)


def unmet_needs() -> list[str]:
    """The packages this interpreter lacks for a run, to pip-install: checked before anything runs, so a
    missing one is one line, not a traceback from every measured process's memory sampler or a wheel build
    that fails after the arguments were taken. psutil samples the measured process trees
    (benchmarks/paired.py; perfdoctor's distributed extra brings it); building the wheel without build
    isolation needs setuptools' ``bdist_wheel``, built in from setuptools 70.1 and otherwise the wheel
    package's (a fresh Python 3.11 venv has setuptools 65)."""
    missing = [name for name in ("psutil", "setuptools") if importlib.util.find_spec(name) is None]
    if "setuptools" not in missing and importlib.util.find_spec("wheel") is None:
        major, minor = (int(part) for part in re.findall(r"\d+", importlib.metadata.version("setuptools"))[:2])
        if (major, minor) < (70, 1):
            missing.append("wheel")
    return missing


def install_wheel(tmp: Path) -> Path:
    """This checkout's wheel installed into a fresh virtual environment whose dependencies are this
    interpreter's packages; returns the environment's bin directory. From inside a virtual environment,
    ``venv --system-site-packages`` sees only the base interpreter's packages, so this one's site-packages
    are added by a .pth file (its lines are plain path entries: the checkout's editable-install hooks in
    them do not run, and the wheel comes first on sys.path)."""
    wheels, venv = tmp / "wheel", tmp / "venv"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheels), str(ROOT)], check=True)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    (wheel,) = wheels.glob("perfdoctor-*.whl")
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--force-reinstall", "-q", str(wheel)],
                   check=True)
    if sys.prefix != sys.base_prefix:
        purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        Path(purelib, "run_all_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    where = subprocess.run([str(python), "-c", "import perfdoctor; print(perfdoctor.__file__)"], cwd=tmp,
                           capture_output=True, text=True, check=True).stdout.strip()
    if not where.startswith(str(venv)):
        raise RuntimeError(f"the fresh environment imports perfdoctor from {where}, not from its wheel")
    return venv / "bin"


def trace(kernels: int, cache: Path, processes: int = 1) -> tuple[Path, float]:
    """The cached trace of ``kernels`` (written by a child: a child's peak RSS counts what it inherited from
    this process, so this process never holds a trace's worth of memory) and the seconds it took."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_big_trace.py"), "--cached", "--kernels",
                          str(kernels), "--processes", str(processes)],
                         env={**os.environ, "PERFDOCTOR_BENCH_CACHE": str(cache)},
                         capture_output=True, text=True)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no message"])[-1]
        raise RuntimeError(f"make_big_trace.py --kernels {kernels} exited {out.returncode}: {last}")
    return Path(out.stdout.strip().splitlines()[-1]), time.perf_counter() - t0


# Rows of a block of kernels that nsys would write together (one activity buffer's worth, give or take).
UNSORTED_BLOCK = 1 << 16


def unsorted_copy(path: Path) -> Path:
    """``path``'s trace with its kernel rows out of start order, cached beside it: the rows in blocks of
    :data:`UNSORTED_BLOCK`, each pair of blocks swapped (sorted runs out of order, as activity buffers of
    several streams are flushed). The generator writes them in order; a real export's are not, and then the
    loader sorts them: that sort, and its memory, is what this case measures. SQLite reorders the rows in its
    own page cache (nothing is held in this process), into a temporary name that is then renamed; a minute or
    two at 30M kernels, once."""
    out = path.with_name(path.stem + f"_unsorted{UNSORTED_BLOCK}.sqlite")
    if out.exists():
        return out
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    shutil.copyfile(path, tmp)
    block = f"((rowid - 1) / {UNSORTED_BLOCK})"
    try:
        conn = sqlite3.connect(tmp)
        conn.executescript(
            "PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; PRAGMA temp_store = FILE; "
            "CREATE TABLE reordered AS SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL "
            f"ORDER BY {block} + 1 - 2 * ({block} % 2), rowid; "
            "DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL; ALTER TABLE reordered RENAME TO CUPTI_ACTIVITY_KIND_KERNEL; "
            "VACUUM;")  # the dropped table's pages: the file as large as the sorted one
        conn.close()
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def read_through(path: Path) -> None:
    """Read the file once so every contender finds it in the page cache (instead of a warm-up round of a
    minute-long analysis)."""
    with open(path, "rb") as fh:
        while fh.read(1 << 24):
            pass


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
    s = paired({"perfdoctor": cli(SMALL_EXPORT, bin_dir), "python": [str(bin_dir / "python"), "-c", "pass"]}, reps)
    return {"rounds": reps, "perfdoctor_s": s["perfdoctor"].median_s, "python_s": s["python"].median_s,
            "difference_s": difference(s["perfdoctor"], s["python"]),
            "difference_interval_s": difference_interval(s["perfdoctor"], s["python"]),
            "ratio": ratio(s["perfdoctor"], s["python"]), "perfdoctor_rss": s["perfdoctor"].median_rss}


def _split(s: Sample) -> dict:
    """The in-process split's medians; ``outside_s``: the wall time beyond the imports and the work
    (interpreter start and exit), per round."""
    out = {k: s.median_report(k) for k in ("imports_s", "load_s", "analyze_s", "render_s")}
    beyond = sorted(w - r.get("imports_s", 0) - r.get("elapsed_s", 0) for w, r in zip(s.wall_s, s.reports))
    return out | {"work_s": s.median_work_s, "wall_s": s.median_s, "outside_s": beyond[len(beyond) // 2],
                  "rss": s.max_rss}


def kernels_case(path: Path, reps: int, bin_dir: Path, big: bool) -> dict:
    """The whole CLI vs the C scan (headline), the in-process split, and ``nsys stats`` for small sizes."""
    python = bin_dir / "python"
    contenders = {"cli": cli(path, bin_dir), "scan": timed("scan", path, python),
                  "split": timed("analyze", path, python)}
    stats = None if big else nsys_stats_command(path)
    if stats:
        contenders["nsys"] = stats
    if big:
        read_through(path)
    s = paired(contenders, reps, warmup=0 if big else 1, tree={"cli", "split"}, progress=big)
    out = {"rounds": reps, "file_bytes": path.stat().st_size,
           "cli_s": s["cli"].median_s, "cli_rss": s["cli"].max_rss, "cli_rss_median": s["cli"].median_rss,
           "scan_s": s["scan"].median_work_s, "scan_wall_s": s["scan"].median_s, "scan_rss": s["scan"].max_rss,
           "ratio": ratio_to_work(s["cli"], s["scan"]),
           "split": _split(s["split"]), "split_ratio": ratio(s["split"], s["scan"], work=True)}
    if "nsys" in s:
        out |= {"nsys_s": s["nsys"].median_s, "vs_nsys": ratio(s["cli"], s["nsys"]), "nsys_rss": s["nsys"].max_rss}
    return out


def html_case(path: Path, reps: int, tmp: Path, bin_dir: Path) -> dict:
    page = tmp / "report.html"
    s = paired({"html": perfdoctor("analyze", str(path), "--html", str(page), bin_dir=bin_dir),
                "plain": perfdoctor("analyze", str(path), bin_dir=bin_dir)}, reps)
    return {"html_s": s["html"].median_s, "plain_s": s["plain"].median_s, "ratio": ratio(s["html"], s["plain"]),
            "render_s": difference(s["html"], s["plain"]), "html_rss": s["html"].median_rss,
            "page_bytes": page.stat().st_size}


def script_result(script: str, tmp: Path, *args: str, python: Path | str = sys.executable) -> dict:
    """The JSON result of ``python benchmarks/<script> [ARGS] --json FILE`` (see the module docstring);
    an error when the script is missing, fails or writes no result. A result whose command names no
    arguments gets ARGS appended, so the docs say what ran."""
    path = ROOT / "benchmarks" / script
    if not path.exists():
        raise RuntimeError(f"benchmarks/{script} is not in this checkout")
    result = tmp / f"{path.stem}.json"
    result.unlink(missing_ok=True)
    proc = subprocess.run([str(python), str(path), *args, "--json", str(result)], cwd=ROOT, capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT_S)
    if proc.returncode != 0 or not result.exists():
        tail = (proc.stderr.strip().splitlines() or ["no result written"])[-1]
        raise RuntimeError(f"`python benchmarks/{script} {' '.join(args)} --json FILE` gave no result "
                           f"(exit {proc.returncode}: {tail})")
    out = json.loads(result.read_text())
    if out.get("command", "").endswith(script):  # a command without its arguments: show the ones given
        out["command"] = " ".join([out["command"], *args])
    return out


_UNIT = {"MiB": 2**20, "MB": 10**6, "GiB": 2**30, "GB": 10**9, "KiB": 2**10}


def table_value(ext: dict, row_name: str, column_start: str) -> float:
    """The number in ``ext``'s row named ``row_name`` (first cell) under the column whose title starts with
    ``column_start``; a memory column's unit (MiB, MB …, named in its title) is applied, giving bytes. An
    error when the row, column or number is missing, so a changed script fails loudly here."""
    columns = ext["columns"]
    col = next((i for i, c in enumerate(columns) if c.lower().startswith(column_start.lower())), None)
    row = next((r for r in ext["rows"] if str(r[0]).strip() == row_name), None)
    if col is None or row is None:
        raise RuntimeError(f"{ext.get('command', 'script')}: no row {row_name!r} or column {column_start!r} "
                           f"in {columns}")
    number = re.search(r"-?[\d,]*\.?\d+", str(row[col]))
    if number is None:
        raise RuntimeError(f"{ext.get('command', 'script')}: {row[col]!r} is not a number")
    unit = next((_UNIT[u] for u in _UNIT if re.search(rf"\b{u}\b", columns[col])), 1)
    return float(number.group().replace(",", "")) * unit


def jobs_case(tmp: Path, python: Path, reps: int, ranks: int, kernels: int) -> dict:
    """benchmarks/bench_ranks.py through its ``--json`` interface: ``--jobs 2`` vs ``--jobs 1`` on a run of
    ``ranks`` simulated ranks."""
    table = script_result("bench_ranks.py", tmp, "--ranks", str(ranks), "--kernels", str(kernels), "--repeat",
                          str(reps), "--no-dask", python=python)
    return {"table": table, "speedup": table_value(table, "--jobs 2", "speed-up")}


def flat_case(tmp: Path, python: Path, ranks: tuple[int, int], kernels: int) -> dict:
    """benchmarks/bench_ranks.py on ``ranks`` (fewer, more) copies of the same simulated rank, one round each:
    the peak RSS of the process tree with ``--jobs 2`` (and 1) against the number of ranks."""
    runs = {}
    for r in ranks:
        print(f"  {r:,} ranks × {kernels:,} kernels ...", flush=True)
        table = script_result("bench_ranks.py", tmp, "--ranks", str(r), "--kernels", str(kernels), "--repeat", "1",
                              "--no-dask", python=python)
        runs[r] = {"table": table, "rss": {m: table_value(table, m, "peak RSS") for m in ("--jobs 1", "--jobs 2")}}
    few, many = (runs[r]["rss"]["--jobs 2"] for r in ranks)
    return {"runs": runs, "few_rss": few, "many_rss": many, "ratio": many / few}


def _usage(message: str) -> None:
    print(f"run_all: {message}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", help=f"comma-separated, of: {','.join(SECTIONS)} (default: all)")
    ap.add_argument("--quick", action="store_true", help="skip the 10M and 30M kernels")
    ap.add_argument("--reps", type=int, default=9, help="paired rounds per case (>= 5 for the docs; "
                                                                "benchmarks/recorded.json is written only then)")
    ap.add_argument("--big-reps", type=int, default=3, help="paired rounds at 10M and 30M kernels")
    ap.add_argument("--speed-ranks", type=int, default=64, help="ranks of the --jobs 2 vs --jobs 1 case")
    ap.add_argument("--speed-kernels", type=int, default=100_000, help="kernels per rank of that case")
    ap.add_argument("--flat-ranks", default="128,1024", help="FEW,MANY ranks of the peak-RSS-vs-ranks case")
    ap.add_argument("--flat-kernels", type=int, default=5_000, help="kernels per rank of the peak-RSS-vs-ranks case")
    ap.add_argument("--out", type=Path, help="markdown to write (default: docs/benchmarks.md when every section "
                                             "runs, or with --quick; else printed)")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()
    chosen = SECTIONS if args.sections is None else tuple(
        part for s in args.sections.split(",") for part in ALIASES.get(s.strip().lower(), (s.strip().lower(),)))
    unknown = [s for s in chosen if s not in SECTIONS]
    flat = tuple(int(r) for r in re.findall(r"\d+", args.flat_ranks))
    if unknown:
        _usage(f"unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    if args.reps < 1 or args.big_reps < 1 or len(flat) != 2 or not 0 < flat[0] < flat[1]:
        _usage("--reps and --big-reps must be >= 1, --flat-ranks FEW,MANY with 0 < FEW < MANY")
    if missing := unmet_needs():
        _usage(f"this Python lacks {', '.join(missing)}: pip install {' '.join(missing)}")
    skipped = {s: "--quick" for s in BIG if args.quick and s in chosen}
    skipped |= {s: "not in --sections" for s in SECTIONS if s not in chosen}
    run = [s for s in SECTIONS if s not in skipped]
    out = args.out or (ROOT / "docs" / "benchmarks.md" if args.sections is None else None)
    cache = Path(os.environ.get("PERFDOCTOR_BENCH_CACHE") or Path.home() / ".cache" / "perfdoctor-bench")
    started = time.time()
    results: dict = {"machine": machine(), "nsys": nsys_version(), "reps": args.reps, "big_reps": args.big_reps,
                     "command": " ".join(["python", "benchmarks/run_all.py", *sys.argv[1:]]), "skipped": skipped,
                     "sections": {}, "failed": {}, "traces": {},
                     "speed_ranks": args.speed_ranks, "flat_ranks": list(flat),
                     "fresh_memory_gbps": [fresh_memory_rate()]}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        print("installing the wheel ...", flush=True)
        bin_dir = install_wheel(tmp)
        python = bin_dir / "python"

        def kernels(name: str) -> dict:
            path, took = trace(SIZES[name], cache, PROCESSES.get(name, 1))
            if name in UNSORTED:
                t0 = time.perf_counter()
                path, took = unsorted_copy(path), took + time.perf_counter() - t0
            results["traces"][name] = {"path": str(path), "seconds": took}
            return kernels_case(path, args.big_reps if name in BIG else args.reps, bin_dir, name in BIG)

        cases: dict[str, Callable[[], dict]] = {
            # A run takes a third of a second: more rounds cost little and steady the median.
            "startup": lambda: startup_case(max(args.reps, STARTUP_ROUNDS), bin_dir),
            **{name: (lambda name=name: kernels(name)) for name in SIZES},
            "html": lambda: html_case(trace(SIZES["1m"], cache)[0], args.reps, tmp, bin_dir),
            "readers": lambda: script_result("bench_readers.py", tmp, str(trace(SIZES["1m"], cache)[0]), "--reps",
                                             str(args.reps), python=python),
            "ranks-jobs": lambda: jobs_case(tmp, python, min(args.reps, 5), args.speed_ranks, args.speed_kernels),
            "ranks-rss": lambda: flat_case(tmp, python, flat, args.flat_kernels),
            **{name: (lambda script=script: script_result(script, tmp)) for name, (_, script) in SCRIPTS.items()},
        }
        for name in run:
            print(f"{name} ...", flush=True)
            t0 = time.time()
            try:
                results["sections"][name] = cases[name]()
            except Exception as exc:  # reported in its place and in the summary, and the run exits 1
                traceback.print_exc()
                results["failed"][name] = f"{type(exc).__name__}: {exc}"
            print(f"{name}: {'failed' if name in results['failed'] else 'done'} in {time.time() - t0:.0f} s",
                  flush=True)
    results["elapsed_s"] = time.time() - started
    results["load_at_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    results["fresh_memory_gbps"].append(fresh_memory_rate())
    text = render(results)
    print("\n".join(summary(results)))
    if out is not None:
        out.write_text(text)
        print(f"wrote {out}")
    elif args.json is None:
        print(text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    guard = results["sections"].get("100k")
    if guard is not None and args.reps >= 5:  # fewer rounds: a trial run, not a reference
        RECORDED.write_text(json.dumps({"kernels": SIZES["100k"], "ratio_to_scan": round(guard["split_ratio"], 2),
                                        "machine": results["machine"]}, indent=1) + "\n")
        print(f"wrote {RECORDED}")
    if results["failed"]:
        sys.exit(f"run_all: failed sections: {', '.join(results['failed'])}")


def _s(x: float) -> str:
    return f"{x:.3f} s" if x < 10 else f"{x:.1f} s"


def _interval(s: dict) -> str:
    """The start-up difference's 95 % interval, as `` (95 %: low–high s)``; empty for a run that did not
    record it (too few rounds, or recorded.json from before it was)."""
    interval = s.get("difference_interval_s")
    return "" if not interval else f" (95 %: {interval[0]:.3f}–{interval[1]:.3f} s)"


def _mb(x: float) -> str:
    return f"{x / MB:,.0f} MB"


def _met(good: bool) -> str:
    return "met" if good else "**not met**"


def _state(r: dict, section: str) -> str | None:
    """Why a section has no measurement (failed / skipped), None when it has one."""
    if section in r["failed"]:
        return "**failed**: " + " ".join(r["failed"][section].split()).replace("|", "\\|")
    if section in r["skipped"]:
        return f"not measured in this run ({r['skipped'][section]})"
    return None if section in r["sections"] else "not measured in this run"


def summary(r: dict) -> list[str]:
    """Issue 25's "Done when" rows: what was measured, its limit, and whether it is met."""
    sec = r["sections"]
    rows: list[tuple[str, str, str, str]] = []

    def row(section: str, what: str, limit: str, measure: Callable[[dict], tuple[str, bool | None]]) -> None:
        state = _state(r, section)
        if state is not None:
            rows.append((what, state, limit, "—"))
            return
        shown, good = measure(sec[section])
        rows.append((what, shown, limit, "shown (no limit)" if good is None else _met(good)))

    row("startup", "start-up: `perfdoctor analyze` of the real 2-GPU export above `python -c pass`",
        f"≤ {STARTUP_LIMIT_S} s",
        lambda s: (_s(s["difference_s"]) + _interval(s), s["difference_s"] <= STARTUP_LIMIT_S))
    for name, n in (("1m", "1M"), ("10m", "10M"), ("30m", "30M"), ("30m-unsorted", "30M (rows out of start order)"),
                    ("10m-node", "10M (8 GPUs' processes)"), ("30m-node", "30M (8 GPUs' processes)")):
        if name in RATIO_LIMIT:
            row(name, f"{n} kernels: whole CLI / C scan", f"≤ {RATIO_LIMIT[name]}×",
                lambda k, name=name: (f"{k['ratio']:.2f}× ({_s(k['cli_s'])} / {_s(k['scan_s'])})",
                                      k["ratio"] <= RATIO_LIMIT[name]))
        if name in RSS_LIMIT:
            row(name, f"{n} kernels: CLI peak RSS (process tree)", f"≤ {_mb(RSS_LIMIT[name])}",
                lambda k, name=name: (f"{_mb(k['cli_rss'])} (file {_mb(k['file_bytes'])})",
                                      k["cli_rss"] <= RSS_LIMIT[name]))
        if name not in RATIO_LIMIT:
            row(name, f"{n} kernels: whole CLI / C scan", "—",
                lambda k: (f"{k['ratio']:.2f}× ({_s(k['cli_s'])} / {_s(k['scan_s'])})", None))
    row("ranks-jobs", f"{r['speed_ranks']} ranks: `--jobs 2` speed-up over `--jobs 1`", f"≥ {JOBS_SPEEDUP_LIMIT}×",
        lambda k: (f"{k['speedup']:.2f}×", k["speedup"] >= JOBS_SPEEDUP_LIMIT))
    few, many = r["flat_ranks"]
    row("ranks-rss", f"{many:,} ranks: peak RSS (`--jobs 2`, process tree) flat against {few:,} ranks",
        f"≤ {FLAT_RSS_LIMIT}× the {few:,} ranks'",
        lambda k: (f"{k['ratio']:.2f}× ({_mb(k['many_rss'])} vs {_mb(k['few_rss'])})", k["ratio"] <= FLAT_RSS_LIMIT))
    lines = ["| Done when (issue 25) | measured | limit | |", "|---|---|---|---|"]
    return lines + [f"| {' | '.join(cells)} |" for cells in rows]


def _script_section(ext: dict) -> list[str]:
    lines = [f"`{ext['command']}`", "", "| " + " | ".join(ext["columns"]) + " |", "|" + "---|" * len(ext["columns"])]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in ext["rows"]]
    return lines + (["", ext["notes"]] if ext.get("notes") else [])


def _kernels(name: str, n: int) -> str:
    """A size's row label: its kernels, and the GPUs they are spread over in a per-node export."""
    return f"{n:,}" + (f" over {PROCESSES[name]} GPUs" if name in PROCESSES else "") + (
        ", rows out of start order" if name in UNSORTED else "")


def _kernels_sections(r: dict) -> list[str]:
    sec = r["sections"]
    lines = [
        "## Kernels: the whole CLI vs the C-level scan",
        "",
        "Traces from `benchmarks/make_big_trace.py` (N kernels, N runtime launch calls, NVTX step ranges; cached",
        "by size, seed and the generator's hash). *CLI* is the installed console script as a user runs it,",
        "`perfdoctor analyze FILE --format json -o /dev/null`: the whole process's wall time, start-up included,",
        "and the peak RSS of its whole process tree (sampled every 20 ms, or the process's own peak when larger;",
        "the largest of the rounds). The limit, *C scan*, is `benchmarks/timed.py scan FILE`: SQLite's C code",
        "reading every value the analysis needs once (`SELECT total(col), … FROM table`, no Python object per",
        "row), timed inside its process, over",
        "",
    ]
    lines += [f"- `{t}`: {', '.join(c)}" for t, c in NEEDED_COLUMNS.items()]
    lines += [
        "",
        f"Ratio: median of the per-round ratios CLI wall / C scan. {r['reps']} paired rounds after a warm-up round",
        f"up to 1M; {r['big_reps']} at 10M and 30M, after one read of the file (page cache) instead of a warm-up.",
        "",
        "| kernels | file | C scan | CLI | ratio | limit | | CLI peak RSS | limit | |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, n in SIZES.items():
        state = _state(r, name)
        if state is not None:
            lines.append(f"| {_kernels(name, n)} | {state} | | | | | | | | |")
            continue
        k = sec[name]
        lim = f"≤ {RATIO_LIMIT[name]}×" if name in RATIO_LIMIT else "—"
        met = _met(k["ratio"] <= RATIO_LIMIT[name]) if name in RATIO_LIMIT else ""
        rlim = f"≤ {_mb(RSS_LIMIT[name])}" if name in RSS_LIMIT else "—"
        rmet = _met(k["cli_rss"] <= RSS_LIMIT[name]) if name in RSS_LIMIT else ""
        lines.append(f"| {_kernels(name, n)} | {_mb(k['file_bytes'])} | {_s(k['scan_s'])} | {_s(k['cli_s'])} | "
                     f"{k['ratio']:.2f}× | "
                     f"{lim} | {met} | {_mb(k['cli_rss'])} ({k['cli_rss'] / k['file_bytes']:.1f}× the file) | "
                     f"{rlim} | {rmet} |")
    lines += [
        "",
        "### In-process split",
        "",
        "`benchmarks/timed.py analyze FILE` (the installed wheel's python), paired in the same rounds: what",
        "`perfdoctor analyze FILE --format json` does, timed inside the process. *imports*: perfdoctor's modules;",
        "*load*: `perfdoctor.api.load_trace` (the reads of the file; n/a when the analysis no longer calls it in",
        "the process); *analyze*: all of `api.analyze`, the load included; *JSON*: rendering and writing the",
        "report; *start + exit*: the process's wall time beyond those (interpreter start-up and teardown).",
        "*work / scan*: (analyze + JSON) / C scan, the in-process ratio (the CI guard's, at 100k).",
        "",
        "| kernels | start + exit | imports | load | analyze | JSON | wall | work / scan | peak RSS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, n in SIZES.items():
        if name in sec:
            p = sec[name]["split"]
            load = _s(p["load_s"]) if p.get("load_s") is not None else "n/a"
            lines.append(f"| {_kernels(name, n)} | {_s(p['outside_s'])} | {_s(p['imports_s'])} | {load} | "
                         f"{_s(p['analyze_s'])} | "
                         f"{_s(p['render_s'])} | {_s(p['wall_s'])} | {sec[name]['split_ratio']:.2f}× | "
                         f"{_mb(p['rss'])} |")
    nsys = [(n, sec[name]) for name, n in SIZES.items() if name in sec and "nsys_s" in sec[name]]
    if nsys:
        lines += ["", "### `nsys stats`", "",
                  f"The whole `nsys stats FILE` process of Debian's nsys ({r['nsys']}), paired in the same rounds "
                  "(up to 1M kernels).", "",
                  "| kernels | CLI | nsys stats | CLI / nsys stats | nsys stats peak RSS |", "|---|---|---|---|---|"]
        lines += [f"| {n:,} | {_s(k['cli_s'])} | {_s(k['nsys_s'])} | {k['vs_nsys']:.2f}× | {_mb(k['nsys_rss'])} |"
                  for n, k in nsys]
    return lines


def _ranks_section(r: dict) -> list[str]:
    lines = ["## Ranks", "",
             "`benchmarks/bench_ranks.py`: `perfdoctor analyze RUN --format json` of a run of simulated ranks (one",
             "rank copied, each copy its own rank) per executor; peak RSS of the whole process tree.", "",
             f"### `--jobs 2` vs `--jobs 1`, {r['speed_ranks']} ranks", ""]
    if (state := _state(r, "ranks-jobs")) is not None:
        lines.append(state)
    else:
        k = r["sections"]["ranks-jobs"]
        met = _met(k["speedup"] >= JOBS_SPEEDUP_LIMIT)
        lines += [f"Speed-up {k['speedup']:.2f}× (limit ≥ {JOBS_SPEEDUP_LIMIT}×: {met}).", ""]
        lines += _script_section(k["table"])
    few, many = r["flat_ranks"]
    lines += ["", f"### Peak RSS against the number of ranks: {many:,} vs {few:,}", ""]
    if (state := _state(r, "ranks-rss")) is not None:
        return lines + [state]
    k = r["sections"]["ranks-rss"]
    lines += [f"One round each, the same simulated rank. With `--jobs 2` the {many:,} ranks peak at {k['ratio']:.2f}× "
              f"the {few:,} ranks' (limit ≤ {FLAT_RSS_LIMIT}× for {many / few:g}× the ranks: "
              f"{_met(k['ratio'] <= FLAT_RSS_LIMIT)})."]
    for n, v in k["runs"].items():
        lines += ["", f"{int(n):,} ranks:", ""] + _script_section(v["table"])
    return lines


def _fresh_memory(rates: list[float]) -> list[str]:
    """The machine's fresh-memory line (benchmarks/paired.py ``fresh_memory_rate``), at the run's start and
    end; none for results from before it was measured."""
    if not rates:
        return []
    said = ", ".join(f"{rate:.2f} GB/s at the {when}" for rate, when in zip(rates, ("start", "end")))
    return [f"- Fresh memory ({FRESH_MEGABYTES} MiB untouched for {FRESH_SETTLE_S:g} s, then written a byte a page): "
            f"{said}"]


def render(r: dict) -> str:
    """docs/benchmarks.md: machine, command, the Done-when summary, then one section per case."""
    sec = r["sections"]
    lines = [
        "# Benchmarks",
        "",
        "Generated by `python benchmarks/run_all.py` (do not edit by hand; `--help` lists its sections and",
        "options). Every row is perfdoctor and its limit measured in the same run, alternating (ABBA…); times are",
        "medians, **ratios are medians of the per-round ratios** (the machine is shared, so absolute times drift;",
        "paired ratios much less). Each contender is its own process of the installed wheel: wall time and peak",
        "RSS include start-up. What pairing does not cancel is a price only the CLI pays: fresh memory, slow on",
        "a virtual machine whose host takes back free pages (benchmarks/paired.py says why; its rate at the run's",
        "start and end is below the machine).",
        "",
        f"- Machine: {r['machine']}",
        *_fresh_memory(r.get("fresh_memory_gbps", [])),
        f"- Command: `{r['command']}` · whole run took {r['elapsed_s'] / 60:.1f} min"
        + (f", load average {r['load_at_end']:.1f} at its end" if r.get("load_at_end") is not None else ""),
        "",
        "## Summary",
        "",
        *summary(r),
        "",
        "## Start-up: a real small export",
        "",
    ]
    state = _state(r, "startup")
    if state is not None:
        lines.append(state)
    else:
        s = sec["startup"]
        lines += [
            f"`perfdoctor analyze {SMALL_EXPORT.relative_to(ROOT)} --format json -o /dev/null` (2 GPUs, 4,010",
            f"kernels) vs `python -c pass`, {s['rounds']} paired rounds. Limit: at most {STARTUP_LIMIT_S} s above "
            "`python -c pass`.",
            "",
            "The difference is the median of the rounds' differences; beside it, the 95 % confidence interval of",
            "that median (distribution-free: benchmarks/paired.py `difference_interval`). This machine's speed",
            "drifts by a third between minutes, and a difference, unlike a ratio, drifts with it.",
            "",
            "| perfdoctor analyze | python -c pass | difference | ratio | perfdoctor peak RSS | limit | |",
            "|---|---|---|---|---|---|---|",
            f"| {_s(s['perfdoctor_s'])} | {_s(s['python_s'])} | {_s(s['difference_s'])}{_interval(s)} | "
            f"{s['ratio']:.2f}× | "
            f"{_mb(s['perfdoctor_rss'])} | ≤ {STARTUP_LIMIT_S} s | {_met(s['difference_s'] <= STARTUP_LIMIT_S)} |",
        ]
    lines += [""] + _kernels_sections(r)
    lines += ["", "## HTML report of the 1M-kernel trace", ""]
    if (state := _state(r, "html")) is not None:
        lines.append(state)
    else:
        h = sec["html"]
        lines += [
            "`perfdoctor analyze FILE --html report.html` vs `perfdoctor analyze FILE` (what drawing the timeline",
            "excerpt and rendering the page add).",
            "",
            "| with --html | without | ratio | rendering adds | peak RSS with --html | page size |",
            "|---|---|---|---|---|---|",
            f"| {_s(h['html_s'])} | {_s(h['plain_s'])} | {h['ratio']:.2f}× | {_s(h['render_s'])} | "
            f"{_mb(h['html_rss'])} | {_mb(h['page_bytes'])} |",
        ]
    for name, title in (("readers", "SQLite readers (1M-kernel trace)"),):
        lines += ["", f"## {title}", ""]
        lines += [state] if (state := _state(r, name)) is not None else _script_section(sec[name])
    lines += [""] + _ranks_section(r)
    for name, (title, _) in SCRIPTS.items():
        lines += ["", f"## {title}", ""]
        lines += [state] if (state := _state(r, name)) is not None else _script_section(sec[name])
    lines += ["", "## CI guard", "",
              "`tests/test_benchmark_guard.py` repeats the 100k-kernel in-process analyze/scan pairing (5 rounds) and",
              "fails only when the ratio is more than twice the one recorded in `benchmarks/recorded.json` by the",
              "last run with the `100k` section: a gross regression, not noise.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
