"""The executor does not change the report: --jobs 1, --jobs 2 and --dask local give the same JSON;
progress without a terminal is one line per 10 % on stderr."""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest

from perfdoctor.execute import run_tasks
from tests.paths import SAMPLES

RUN = SAMPLES / "pp_1f1b"  # four files, one rank each


def _json(*options: str) -> tuple[str, str]:
    proc = subprocess.run([sys.executable, "-m", "perfdoctor", "analyze", str(RUN), "--format", "json", *options],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, proc.stderr


def test_same_json_whatever_the_executor() -> None:
    pytest.importorskip("distributed")
    one, _ = _json("--jobs", "1")
    assert _json("--jobs", "2")[0] == one
    assert _json("--dask", "local", "--jobs", "2")[0] == one
    assert '"comm.pp.exposed_wait_ms"' in one


def test_bad_dask_address_is_one_line_exit_2() -> None:
    proc = subprocess.run([sys.executable, "-m", "perfdoctor", "analyze", str(RUN), "--dask", "nowhere"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--dask" in proc.stderr


def test_results_in_input_order_with_progress_every_tenth() -> None:
    seen = []
    # a builtin, importable wherever the pool's workers start (fork, or a fork server once the process
    # has threads or connectorx loaded, which cannot import this test module under --import-mode=importlib)
    out = run_tasks(functools.partial(pow, exp=2), list(range(20)), jobs=2,
                    progress=lambda done, total, what: seen.append(done))
    assert out == [x * x for x in range(20)]
    assert seen[0] == 0 and seen[-1] == 20 and sorted(seen) == seen


def test_progress_off_a_terminal_is_one_line_per_tenth() -> None:
    import io

    from rich.console import Console

    from perfdoctor.render.terminal import analysis_progress

    out = io.StringIO()
    with analysis_progress(Console(file=out, force_terminal=False, width=200)) as update:
        for done in range(41):
            update(done, 40, f"{done}/40 ranks analysed")
    lines = out.getvalue().splitlines()
    assert len(lines) == 10 and lines[0].endswith("(10 %)") and lines[-1].startswith("perfdoctor: 40/40")


def test_sample_analyses_k_representative_files(tmp_path) -> None:
    import shutil
    import sqlite3

    from perfdoctor import api

    src = next((SAMPLES / "clean_baseline").glob("*.sqlite"))
    for r in range(12):
        path = tmp_path / f"rank{r:02d}.sqlite"
        shutil.copyfile(src, path)
        with sqlite3.connect(path) as db:  # each copy its own rank, rank 5's steps twice as long
            for table, column in (("StringIds", "value"), ("NVTX_EVENTS", "text")):
                db.execute(f"UPDATE {table} SET {column} = ? WHERE {column} LIKE 'rank r=%'", (f"rank r={r} world=12",))
            if r == 5:
                db.execute("UPDATE NVTX_EVENTS SET end = end + (end - start) WHERE text LIKE 'step n=%' "
                           "OR textId IN (SELECT id FROM StringIds WHERE value LIKE 'step n=%')")
    report = api.analyze([tmp_path], jobs=1, sample=4)
    assert len(report.devices) == 4 and 5 in [d.rank for d in report.devices]
    assert report.warnings[0].startswith("--sample 4: analysed 4 of 12 files (")
    assert "slowest in the first pass" in report.warnings[0]


def test_a_file_without_config_marks_is_measured_under_the_runs_config(tmp_path) -> None:
    import shutil
    import sqlite3

    from perfdoctor import api

    src = next((SAMPLES / "clean_baseline").glob("*.sqlite"))
    for r in range(2):
        path = tmp_path / f"rank{r}.sqlite"
        shutil.copyfile(src, path)
        with sqlite3.connect(path) as db:
            for table, column in (("StringIds", "value"), ("NVTX_EVENTS", "text")):
                db.execute(f"UPDATE {table} SET {column} = ? WHERE {column} LIKE 'rank r=%'", (f"rank r={r}",))
                if r == 1:  # rank 1's capture lost its config mark
                    db.execute(f"UPDATE {table} SET {column} = 'note' WHERE {column} LIKE 'config {{%'")
    report = api.analyze([tmp_path], jobs=1)
    zero, one = report.metrics["ranks"]["0"], report.metrics["ranks"]["1"]
    assert zero["mfu"] is not None and one["mfu"] == zero["mfu"]


def test_log_progress_without_a_terminal_prints_every_tenth_and_nothing_for_few_tasks(capsys, monkeypatch) -> None:
    """perfdoctor.render.progress: stderr not a terminal → the once-per-10 % lines, created lazily."""
    from perfdoctor.render.progress import analysis_progress

    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    with analysis_progress() as update:
        update(1, 2, "few")
        for done in range(1, 21):
            update(done, 20, "many")
    err = capsys.readouterr().err
    assert "few" not in err
    assert err.count("perfdoctor: many (") == 10 and "(100 %)" in err
