"""benchmarks/run_all.py's own machinery: what it reads from its children, how it judges a limit, the trace cache.

The numbers in docs/benchmarks.md are only as good as this: a child's report misread, a process tree's memory
missed, a limit judged the wrong way round or a failed section dropped would each make the page lie.
"""

from __future__ import annotations

import sys

import pytest

from tests.paths import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import make_big_trace  # noqa: E402
import paired  # noqa: E402
import run_all  # noqa: E402


def test_reports_are_the_name_value_lines_that_end_the_output():
    out = b"a line of the child's own\nx=1\nimports_s=0.25\nelapsed_s=1.5\n"
    assert paired._reports(out) == {"elapsed_s": 1.5, "imports_s": 0.25, "x": 1.0}
    assert paired._reports(b"elapsed_s=2\nnot a report\n") == {}


def test_tree_peak_sums_a_child_and_its_child():
    pytest.importorskip("psutil")
    hold = "b = bytearray(250_000_000); b[::4096] = b'x' * len(b[::4096])"  # 250 MB resident
    grandchild = f"import time; {hold}; time.sleep(0.5)"
    child = f"import subprocess, sys; {hold}; subprocess.run([sys.executable, '-c', {grandchild!r}], check=True)"
    _, rss, _ = paired.run_once([sys.executable, "-c", child], tree=True)
    assert rss >= 500_000_000  # both at once: more than either process's own peak (what os.wait4 gives)


def test_a_tree_that_starves_the_machine_is_killed_and_reported(monkeypatch):
    pytest.importorskip("psutil")  # the tree sampler's (installed with the distributed extra)
    monkeypatch.setattr(paired, "MEMORY_FLOOR", 1 << 60)  # more than any machine has
    with pytest.raises(RuntimeError, match="available"):
        paired.run_once([sys.executable, "-c", "import time; time.sleep(30)"], tree=True)


def _results(**sections) -> dict:
    return {"sections": sections, "failed": {}, "skipped": {}, "speed_ranks": 64, "flat_ranks": [128, 1024]}


def _kernels(ratio: float, rss: int) -> dict:
    return {"ratio": ratio, "cli_s": ratio, "scan_s": 1.0, "cli_rss": rss, "file_bytes": 10**8}


def _verdict(rows: list[str], start: str) -> str:
    (row,) = [r for r in rows if r.startswith(f"| {start}")]
    return row.rsplit("|", 2)[-2].strip()


def test_each_limit_is_judged_from_the_measurement():
    rows = run_all.summary(_results(
        startup={"difference_s": 0.29}, **{"1m": _kernels(2.6, 10**8), "10m": _kernels(1.9, 1_100_000_000)},
        **{"ranks-jobs": {"speedup": 1.69}, "ranks-rss": {"ratio": 1.1, "few_rss": 1e8, "many_rss": 1.1e8}}))
    assert _verdict(rows, "start-up") == "met"
    assert _verdict(rows, "1M kernels: whole CLI") == "**not met**"
    assert _verdict(rows, "10M kernels: whole CLI") == "met"
    assert _verdict(rows, "10M kernels: CLI peak RSS") == "**not met**"
    assert _verdict(rows, "64 ranks") == "**not met**"
    assert _verdict(rows, "1,024 ranks") == "met"


def test_a_failed_or_skipped_section_keeps_its_row():
    r = _results(startup={"difference_s": 0.1})
    r["failed"]["10m"] = "RuntimeError: exited -9\nKilled | oom"
    r["skipped"]["30m"] = "--quick"
    rows = run_all.summary(r)
    assert len(rows) == 2 + 14  # header + every Done-when row (unsorted and per-node: peak RSS and ratio shown)
    assert "**failed**: RuntimeError: exited -9 Killed \\| oom" in next(x for x in rows if "10M kernels: whole" in x)
    assert "not measured in this run (--quick)" in next(x for x in rows if "30M kernels: CLI peak" in x)


def test_table_value_reads_a_script_table_by_row_and_column():
    ext = {"command": "python benchmarks/bench_ranks.py", "columns": ["executor", "speed-up vs --jobs 1",
                                                                      "peak RSS of the process tree MiB"],
           "rows": [["--jobs 1", "1.00×", "1,126"], ["--jobs 2", "1.71×", "251"]]}
    assert run_all.table_value(ext, "--jobs 2", "speed-up") == pytest.approx(1.71)
    assert run_all.table_value(ext, "--jobs 1", "peak RSS") == 1126 * 2**20
    with pytest.raises(RuntimeError, match="no row"):
        run_all.table_value(ext, "--dask", "peak RSS")


def test_cached_trace_is_keyed_by_size_seed_and_generator(tmp_path, monkeypatch):
    first = make_big_trace.cached(1_000, 0, tmp_path)
    assert make_big_trace.cached(1_000, 0, tmp_path) == first
    other_seed = make_big_trace.cached(1_000, 1, tmp_path)
    assert other_seed != first and other_seed.read_bytes() != first.read_bytes()
    monkeypatch.setattr(make_big_trace, "generator_hash", lambda: "edited")
    edited = make_big_trace.cached(1_000, 0, tmp_path)
    assert edited.name.endswith("_edited.sqlite")
    assert not first.exists() and other_seed.exists()  # the stale file of that size and seed is gone
    make_big_trace.write(tmp_path / "direct.sqlite", 1_000, 0)
    assert edited.read_bytes() == (tmp_path / "direct.sqlite").read_bytes()


def test_unsorted_copy_holds_the_same_kernels_out_of_start_order(tmp_path, monkeypatch):
    import sqlite3

    monkeypatch.setattr(run_all, "UNSORTED_BLOCK", 64)
    source = make_big_trace.cached(1_000, 0, tmp_path)
    copy = run_all.unsorted_copy(source)
    assert copy != source and copy.parent == source.parent
    query = "SELECT start FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid"
    before = [r[0] for r in sqlite3.connect(source).execute(query)]
    after = [r[0] for r in sqlite3.connect(copy).execute(query)]
    assert before == sorted(before) and after != sorted(after)  # written in order; the copy is not
    assert sorted(after) == before
    assert after[:64] == before[64:128] and after[64:128] == before[:64]  # the first two blocks swapped
    assert copy.stat().st_size <= 1.1 * source.stat().st_size  # vacuumed: no dropped table's pages
    mtime = copy.stat().st_mtime_ns
    assert run_all.unsorted_copy(source) == copy and copy.stat().st_mtime_ns == mtime  # cached
    assert not list(tmp_path.glob("*.tmp"))


def test_what_the_interpreter_lacks_is_one_line_before_anything_runs(monkeypatch, capsys):
    find_spec = run_all.importlib.util.find_spec
    monkeypatch.setattr(run_all.importlib.util, "find_spec",
                        lambda name: None if name in ("psutil", "wheel") else find_spec(name))
    monkeypatch.setattr(run_all.importlib.metadata, "version", lambda name: "65.5.0")
    assert run_all.unmet_needs() == ["psutil", "wheel"]
    monkeypatch.setattr(run_all.importlib.metadata, "version", lambda name: "70.1.0")  # bdist_wheel built in
    assert run_all.unmet_needs() == ["psutil"]
    monkeypatch.setattr(run_all, "install_wheel", lambda tmp: pytest.fail("ran with psutil missing"))
    monkeypatch.setattr(sys, "argv", ["run_all.py", "--sections", "1m"])
    with pytest.raises(SystemExit) as stop:
        run_all.main()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "pip install psutil" in err


def test_the_price_of_fresh_memory_is_measured_and_said_beside_the_machine(monkeypatch):
    # in a child: mapped and written here, the probe's pages would be the peak RSS every later child reports
    monkeypatch.setattr(paired.mmap, "mmap", lambda *a: pytest.fail("the probe ran in the measuring process"))
    rate = paired.fresh_memory_rate(megabytes=8, rounds=1, settle_s=0)
    assert 0.001 < rate < 1000  # GB/s: a first write to 2,048 fresh pages, timed
    assert run_all._fresh_memory([0.912, 2.004]) == [
        "- Fresh memory (256 MiB untouched for 3 s, then written a byte a page): 0.91 GB/s at the start, "
        "2.00 GB/s at the end"]
    assert run_all._fresh_memory([]) == []  # results from before it was measured


def test_median_rank_is_the_widest_order_statistic_with_the_coverage_asked() -> None:
    """The interval [d_k, d_(n+1-k)] misses the median when at most k-1 differences fall below it or above
    it: checked against the binomial tail summed independently (fractions, no floating point)."""
    from fractions import Fraction
    from math import comb

    def misses(n: int, k: int) -> Fraction:  # P(the interval of rank k misses the median)
        return 2 * sum(Fraction(comb(n, i), 2**n) for i in range(k))

    for n in range(1, 80):
        k = paired.median_rank(n, 0.95)
        if k is None:
            assert misses(n, 1) > Fraction(5, 100), n
        else:
            assert misses(n, k) <= Fraction(5, 100) < misses(n, k + 1), n
    assert paired.median_rank(21, 0.95) == 6  # 2 · P(Binomial(21, ½) ≤ 5) = 0.027; ≤ 6: 0.078


def test_difference_interval_brackets_the_median_difference() -> None:
    a, b = paired.Sample(["a"]), paired.Sample(["b"])
    a.wall_s = [1.0 + 0.01 * i for i in range(31)]
    b.wall_s = [0.5 + 0.02 * ((7 * i) % 31) / 31 for i in range(31)]
    d = sorted(x - y for x, y in zip(a.wall_s, b.wall_s))
    low, high = paired.difference_interval(a, b)
    assert (low, high) == (d[9], d[21])  # k = 10 for 31 rounds
    assert low <= paired.difference(a, b) <= high
    a.wall_s, b.wall_s = a.wall_s[:5], b.wall_s[:5]
    assert paired.difference_interval(a, b) is None  # 5 rounds cannot give 95 %
