"""Round 2 of threat 6 (issue 24): damaged values where they enter, each one line and exit 2 naming the
file, the table or mark, and the value; never exit 3, never a silent analysis of nonsense, never an
allocation sized by a number from the input or the command line before it is bounded.

- export columns: ``StringIds.value`` or NVTX text stored as blobs, string ids beyond int64 (or far
  beyond the table: a lookup table sized by the largest id wanted 931 GiB);
- capture marks: a rank beyond int64 or negative, config marks with a string ``pp``, a nested object,
  ``NaN``/``Infinity``, a size beyond 1,048,576, or not an object;
- command-line sizes (``--tp/--pp/--cp/--dp/--ep/--vpp``, ``--num-microbatches``) and ``--config``
  values, each from 1 to 1,048,576, and the world they multiply to;
- saved reports for ``diff`` of the wrong types (metrics strings, steps a list, step time a string,
  numbers beyond 2**63, big integers) and a ``--fail-on-regression`` of NaN;
- an input inside a directory the user cannot enter (run as user ``nobody``: CI runs as root).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import perfdoctor as perfdoctor_package
from tests.paths import SAMPLES
from tests.robustness.harness import Result, _limits, assert_bad_input, digest, perfdoctor

MARKED = SAMPLES / "pp_1f1b" / "pp_1f1b.rank0.sqlite"  # has the capture hook's rank and config marks
MARK = "WHERE id IN (SELECT id FROM StringIds WHERE value LIKE '{kind} %')"


def _mark(kind: str, text: str) -> str:
    return f"UPDATE StringIds SET value = '{text}' " + MARK.format(kind=kind)


# name -> (SQL run on a copy of MARKED, what the one line must name besides the file)
DAMAGE = {
    "StringIds.value blobs": ("UPDATE StringIds SET value = CAST(value AS BLOB)", "table StringIds, column value"),
    "NVTX text a blob": ("UPDATE NVTX_EVENTS SET text = CAST('step n=1' AS BLOB) WHERE rowid < 5",
                         "table NVTX_EVENTS, column text: b'step n=1'"),
    "NVTX text id beyond int64": ("UPDATE NVTX_EVENTS SET textId = 1e20 WHERE rowid < 3",
                                  "table NVTX_EVENTS, column textId: 1e+20"),
    "kernel name id beyond int64": ("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET shortName = '99999999999999999999' "
                                    "WHERE rowid = 1", "table CUPTI_ACTIVITY_KIND_KERNEL, column shortName: 1e+20"),
    "rank mark beyond int64": (_mark("rank", "rank r=99999999999999999999 local=0 world=8"),
                               "r='99999999999999999999'"),
    "rank mark negative": (_mark("rank", "rank r=-5 local=0 world=8"), "r='-5'"),
    "rank mark text": (_mark("rank", "rank r=zero local=0 world=8"), "r='zero'"),
    "config pp a string": (_mark("config", 'config {"pp": "4"}'), "pp: expected a whole number from 1 to 1,048,576"),
    "config tp an object": (_mark("config", 'config {"tp": {"a": 1}}'), "tp: expected a whole number"),
    "config value an object": (_mark("config", 'config {"x": {"a": [1]}}'), "x: expected a number, a string"),
    "config NaN": (_mark("config", 'config {"pp": NaN}'), "NaN is not a number"),
    "config Infinity": (_mark("config", 'config {"num_microbatches": Infinity}'), "Infinity is not a number"),
    "config pp beyond the bound": (_mark("config", 'config {"pp": 99999999999999999999}'),
                                   "pp: expected a whole number from 1 to 1,048,576, got 99999999999999999999"),
    "config world beyond the bound": (_mark("config", 'config {"tp": 1024, "dp": 1024, "pp": 4}'),
                                      "4,194,304 ranks"),
    "config a list": (_mark("config", "config [1,2]"), "not a JSON object"),
    "config not JSON": (_mark("config", "config {pp: 4"), "not a JSON object"),
}


def damaged(tmp: Path, sql: str) -> Path:
    trace = tmp / "damaged.sqlite"
    shutil.copy(MARKED, trace)
    with sqlite3.connect(trace) as conn:
        assert conn.execute(sql).rowcount > 0
    conn.close()
    return trace


@pytest.mark.parametrize(("sql", "needle"), list(DAMAGE.values()), ids=list(DAMAGE))
def test_damaged_value_is_one_line_exit_2_naming_it(tmp_path, sql, needle):
    trace = damaged(tmp_path, sql)
    before = sorted(os.listdir(tmp_path))
    result = perfdoctor("analyze", trace, "-f", "json")
    assert_bad_input(result, str(trace))
    assert needle in result.err, result.err
    assert sorted(os.listdir(tmp_path)) == before


def test_sparse_string_ids_are_not_a_table_of_the_largest_id(tmp_path):
    """A valid id of 10**12 (ids may be sparse): the names resolve without a 931 GiB lookup table."""
    trace = damaged(tmp_path, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET shortName = 1000000000000 WHERE rowid = 1")
    result = perfdoctor("analyze", trace, "-f", "json")  # the harness caps the address space at 3 GiB
    assert result.code == 0, result.err
    from perfdoctor.load.nsys import load_export

    _, timelines = load_export(trace)
    assert "<string 1000000000000>" in set(timelines[0].kernels["short_name"].values)


SIZES = ["--tp", "--pp", "--cp", "--dp", "--ep", "--vpp", "--num-microbatches"]


@pytest.mark.parametrize(("flag", "value"), [(f, v) for f in SIZES for v in ("0", "-1")] +
                         [("--pp", "99999999999999999999"), ("--num-microbatches", "1048577"),
                          ("--tp", "two")])
def test_command_line_sizes_are_bounded(flag, value):
    result = perfdoctor("analyze", MARKED, flag, value, "-f", "json", timeout=60)
    assert_bad_input(result, flag)


@pytest.mark.parametrize("value", ["0", "99999999999"])
def test_capture_memory_entries_are_bounded(value):
    """The ring buffer each rank keeps: bounded before the training command (and its memory) starts."""
    assert_bad_input(perfdoctor("capture", "--memory-max-entries", value, "--", "true", timeout=60),
                     "--memory-max-entries")


def test_command_line_world_is_bounded():
    result = perfdoctor("analyze", MARKED, "--tp", "1024", "--dp", "1024", "--pp", "8", "-f", "json", timeout=60)
    assert_bad_input(result, "8,388,608 ranks")


def test_largest_sizes_are_accepted():
    """*control*: the bound itself is a size (pp = 1,048,576 over one rank: the analysis runs)."""
    result = perfdoctor("analyze", MARKED, "--pp", "1048576", "--num-microbatches", "1048576", "-f", "json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["run"]["config"]["pp"] == 1048576


@pytest.mark.parametrize(("text", "needle"), [
    ("pipeline_model_parallel_size: 0\n", "pipeline_model_parallel_size: expected a whole number from 1"),
    ("pipeline_model_parallel_size: 99999999999999999999\n", "99999999999999999999"),
    ("num_microbatches: .nan\n", "num_microbatches: expected a whole number"),
    ("model: {tensor_model_parallel_size: 4096, data_parallel_size: 4096}\n", "16,777,216 ranks"),
])
def test_config_file_sizes_are_bounded(tmp_path, text, needle):
    config = tmp_path / "config.yaml"
    config.write_text(text)
    result = perfdoctor("analyze", MARKED, "--config", config, "-f", "json", timeout=60)
    assert_bad_input(result, needle)
    assert str(config) in result.err or "parallel sizes" in result.err


def _saved_report(tmp_path: Path) -> dict:
    path = tmp_path / "base.json"
    result = perfdoctor("analyze", SAMPLES / "pp_1f1b", "-f", "json", "-o", path)
    assert result.code == 0, result.err
    return json.loads(path.read_text())


def _edit(report: dict, change: str) -> dict:
    report = json.loads(json.dumps(report))
    metrics = report["metrics"]["all"]
    if change == "metrics strings":
        metrics.update({k: "12" for k in metrics})
    elif change == "steps a list":
        report["steps"] = [1, 2]
    elif change == "step time a string":
        metrics["step.time_ms"] = "100"
    elif change == "huge number":
        metrics["step.time_ms"] = 1e308
    elif change == "big int":
        metrics["step.time_ms"] = 10**30
    elif change == "steps.count huge":
        report["steps"]["count"] = 10**25
    elif change == "series of strings":
        next(iter(report["series"].values()))["step.time_ms"] = ["a", "b"]
    elif change == "kernel counts of strings":
        device = next(d for d in report["devices"] if "work" in (d.get("evidence") or {}))
        device["evidence"]["work"]["kernels"]["k"] = ["a", 1]
    elif change == "finding impact a string":
        report["findings"].append({"rule": "x", "impact_ms_per_step": "5"})
    return report


REPORT_DAMAGE = {
    "metrics strings": "metrics.all.", "steps a list": "steps: expected object",
    "step time a string": "metrics.all.step.time_ms: expected number or null, got '100'",
    "huge number": "metrics.all.step.time_ms: 1e+308", "big int": "metrics.all.step.time_ms: 1000000000000000000000",
    "steps.count huge": "steps.count", "series of strings": "step.time_ms.0: expected number",
    "kernel counts of strings": "evidence.work.kernels.k.0: expected integer", "finding impact a string":
        "impact_ms_per_step: expected number or null",
}


def test_diff_of_wrongly_typed_reports_is_one_line_exit_2(tmp_path):
    base = tmp_path / "base.json"
    report = _saved_report(tmp_path)
    base.write_text(json.dumps(report))
    for change, needle in REPORT_DAMAGE.items():
        head = tmp_path / f"{change.replace(' ', '_')}.json"
        head.write_text(json.dumps(_edit(report, change)))
        for args in ((base, head), (head, base)):
            result = perfdoctor("diff", *args, "-f", "json", timeout=60)
            assert_bad_input(result, f"{head}: not a perfdoctor report")
            assert needle in result.err, (change, result.err)
    same = perfdoctor("diff", base, base, "-f", "json", timeout=60)  # *control*: the report itself compares
    assert same.code == 0, same.err


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_fail_on_regression_must_be_a_finite_percentage(tmp_path, value):
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"schema_version": "1", "metrics": {"all": {"step.time_ms": 100.0}}}))
    assert_bad_input(perfdoctor("diff", base, base, "--fail-on-regression", value, timeout=60),
                     "--fail-on-regression")


NOBODY = (65534, 65534)


def _as_nobody(*args: str | Path) -> Result:
    """``python -m perfdoctor ARGS`` as user nobody, with this interpreter's packages (and this checkout
    or the installed wheel) on PYTHONPATH; skipped where nobody cannot run a matching interpreter."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("dropping to user nobody needs root and setpriv")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(perfdoctor_package.__file__).parents[1]),
                                          *(p for p in sys.path if p and Path(p).is_dir())])}
    drop = ["setpriv", f"--reuid={NOBODY[0]}", f"--regid={NOBODY[1]}", "--clear-groups"]
    for python in (f"/usr/bin/python{version}", sys.executable):
        probe = subprocess.run([*drop, python, "-c", "import perfdoctor.cli, numpy, click"], env=env,
                               capture_output=True, cwd="/")
        if probe.returncode == 0:
            proc = subprocess.run([*drop, python, "-m", "perfdoctor", *map(str, args)], env=env, cwd="/",
                                  capture_output=True, text=True, timeout=120, preexec_fn=_limits)
            return Result(proc.returncode, proc.stdout, proc.stderr)
    pytest.skip(f"user nobody cannot run a Python {version} with perfdoctor's packages here")


@pytest.mark.parametrize("command", ["analyze", "memory", "diff"])
def test_input_inside_a_closed_directory_is_one_line_exit_2(tmp_path, command):
    os.chmod(tmp_path, 0o755)
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    name = {"analyze": "trace.sqlite", "memory": "rank0.pickle", "diff": "report.json"}[command]
    shutil.copy(MARKED, closed / name)
    hashes = digest(closed / name)
    args = [closed / name] * (2 if command == "diff" else 1)
    assert_bad_input(_as_nobody(command, *args), f"{closed / name}: permission denied")
    assert digest(closed / name) == hashes and os.listdir(closed) == [name]


def test_a_crafted_key_stays_inert_in_the_one_line(tmp_path):
    """Keys of a saved report are user strings: the message escapes them (no line break, no escape code)."""
    report = tmp_path / "crafted.json"
    report.write_text(json.dumps({"schema_version": "1", "metrics": {"all": {"\x1b]0;pwned\x07\nx": "1"}}}))
    result = perfdoctor("diff", report, report, timeout=60)
    assert_bad_input(result, "not a perfdoctor report: metrics.all.'\\x1b]0;pwned\\x07\\nx'")
    assert "\x1b" not in result.err and "\x07" not in result.err
