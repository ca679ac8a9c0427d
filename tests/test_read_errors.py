"""Read errors say what is wrong: a missing optional column is no corruption, foreign formats are named."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3

import pytest

from perfdoctor.load.nsys import load_export
from tests.paths import SAMPLES
from tests.test_cli_bad_input import assert_one_line_error, fingerprint, run_cli

SAMPLE = SAMPLES / "exposed_dp" / "exposed_dp.rank0.sqlite"
KINETO = {
    "schemaVersion": 1,
    "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85031714816}],
    "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8},
    "traceEvents": [{"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_tn", "pid": 0, "tid": 7,
                     "ts": 1700000000000.0, "dur": 41.5, "args": {"device": 0, "stream": 7}}],
}


def without_column(tmp_path, table: str, column: str):
    path = tmp_path / "export.sqlite"
    shutil.copyfile(SAMPLE, path)
    with sqlite3.connect(path) as conn:
        conn.execute(f"ALTER TABLE [{table}] DROP COLUMN [{column}]")
    conn.close()
    return path


@pytest.mark.parametrize(("table", "column"), [
    ("CUPTI_ACTIVITY_KIND_KERNEL", "gridX"),
    ("CUPTI_ACTIVITY_KIND_KERNEL", "launchType"),
    ("CUPTI_ACTIVITY_KIND_MEMCPY", "copyKind"),
    ("CUPTI_ACTIVITY_KIND_RUNTIME", "correlationId"),
    ("NVTX_EVENTS", "domainId"),
])
def test_export_without_an_optional_column_loads(tmp_path, table, column):
    _, expected = load_export(SAMPLE)
    _, timelines = load_export(without_column(tmp_path, table, column))
    assert [len(t.kernels) for t in timelines] == [len(t.kernels) for t in expected]
    assert [len(t.nvtx) for t in timelines] == [len(t.nvtx) for t in expected]


def test_export_without_event_times_names_the_column(capsys, tmp_path):
    path = without_column(tmp_path, "CUPTI_ACTIVITY_KIND_KERNEL", "start")
    code, _, err = run_cli(capsys, "analyze", str(path))
    assert_one_line_error(code, err, "CUPTI_ACTIVITY_KIND_KERNEL has no 'start' column")
    assert "corrupt" not in err


@pytest.mark.parametrize("name", ["trace.json", "trace.pt.trace.json.gz", "rank0.sqlite"])
def test_kineto_trace_is_read_whatever_its_name(capsys, tmp_path, name):
    """A PyTorch profiler trace is recognised by content and analysed (perfdoctor.load.kineto), untouched."""
    path = tmp_path / name
    data = json.dumps(KINETO, indent=2).encode()
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    before = fingerprint(path)
    code, out, err = run_cli(capsys, "analyze", str(path))
    assert code == 0, err
    assert "PyTorch profiler (Kineto) trace" in out
    assert fingerprint(path) == before


def test_kineto_trace_is_a_trace_for_diff(capsys, tmp_path):
    """diff takes a Kineto JSON as a trace to analyse, not as a saved report."""
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(KINETO))
    code, _, err = run_cli(capsys, "diff", str(path), str(path))
    assert code == 0, err


def test_git_lfs_pointer_is_named(capsys, tmp_path):
    path = tmp_path / "rank0.sqlite"
    path.write_text("version https://git-lfs.github.com/spec/v1\n"
                    "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 12345\n")
    code, _, err = run_cli(capsys, "analyze", str(path))
    assert_one_line_error(code, err, "Git LFS pointer")
    assert "git lfs pull" in err


def test_nsys_report_under_another_name_is_named(capsys, tmp_path):
    path = tmp_path / "rank0.sqlite"
    path.write_bytes(b"NVIDIA Tegra Profiler Report 1.\n" + bytes(200))
    code, _, err = run_cli(capsys, "analyze", str(path))
    assert_one_line_error(code, err, "an Nsight Systems report, not its SQLite export")
