"""Threat 6, exit codes: every bad input is exit 2 with one line (damaged exports, wrong options, unusable
outputs); valid but unusual input analyses (every kernel zero-length); Ctrl-C is exit 130 with one
line, never a traceback, never "Exception ignored ... KeyboardInterrupt" followed by exit 0."""

from __future__ import annotations

import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.paths import REAL_H100, REPO, SAMPLES
from tests.robustness.harness import _limits, assert_bad_input, perfdoctor

BASE = SAMPLES / "clean_baseline" / "clean_baseline.rank0.sqlite"

# name -> SQL run on a copy of the export (PRAGMA writable_schema lets the last ones damage the schema)
DAMAGE = {
    "metadata value a blob": "UPDATE META_DATA_EXPORT SET value = X'FF00'",
    "metadata time shift text": "UPDATE META_DATA_EXPORT SET value = 'abc' WHERE name = 'EXPORT_PARAM_TIME_SHIFT'",
    "metadata normalize an integer": "UPDATE META_DATA_EXPORT SET value = 7 WHERE name = 'EXPORT_PARAM_TIME_NORMALIZE'",
    "session start text": "UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = 'abc'",
    "gpu id text": "UPDATE TARGET_INFO_GPU SET id = 'x'",
    "strings invalid UTF-8": "UPDATE StringIds SET value = CAST(X'C328FF' AS TEXT) WHERE rowid % 3 = 0",
    "kernel start a real": "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 1.5e300 WHERE rowid = 1",
    "table name invalid UTF-8": "UPDATE sqlite_master SET name = CAST(X'5374FF' AS TEXT), "
                                "tbl_name = CAST(X'5374FF' AS TEXT) WHERE name = 'TARGET_INFO_GPU'",
    "column name invalid UTF-8": "UPDATE sqlite_master SET sql = replace(sql, 'globalPid', CAST(X'6750FF' AS TEXT)) "
                                 "WHERE name = 'PROCESSES'",
}


def damaged(tmp: Path, sql: str) -> Path:
    trace = tmp / "damaged.sqlite"
    shutil.copy(BASE, trace)
    with sqlite3.connect(trace) as conn:
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute(sql)
    conn.close()
    return trace


@pytest.mark.parametrize("sql", list(DAMAGE.values()), ids=list(DAMAGE))
def test_damaged_export_is_exit_0_or_one_line_exit_2(tmp_path, sql):
    trace = damaged(tmp_path, sql)
    result = perfdoctor("analyze", trace, "--html", tmp_path / "r.html", "--markdown", tmp_path / "r.md")
    if result.code != 0:  # a value perfdoctor does not need may be damaged without harm
        assert_bad_input(result, str(trace))


def test_zero_length_kernels_analyse(tmp_path):
    trace = damaged(tmp_path, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET [end] = start")
    result = perfdoctor("analyze", trace, "-f", "json")
    assert result.code == 0, result.err


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e300"])
def test_device_memory_must_be_a_finite_size(tmp_path, value):
    snapshot = tmp_path / "rank0.pickle"
    snapshot.write_bytes(b"\x80\x04N.")
    assert_bad_input(perfdoctor("memory", snapshot, "--device-memory", value), "--device-memory")


FINALISER_CTRL_C = """
import os, signal, sys
sys.argv = ["perfdoctor", "rules"]
import perfdoctor.diagnose.rules as rules
from perfdoctor.cli import main

class Finaliser:
    def __del__(self):  # Ctrl-C lands while Python runs a finaliser: the KeyboardInterrupt is "ignored"
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100_000):
            pass

load = rules.load_rules
def load_rules(*args):
    Finaliser()
    return load(*args)
rules.load_rules = load_rules
main()
"""


def test_ctrl_c_inside_a_finaliser_still_exits_130():
    proc = subprocess.run([sys.executable, "-c", FINALISER_CTRL_C], cwd=REPO, capture_output=True, text=True,
                          timeout=60, preexec_fn=_limits)
    assert proc.returncode == 130, (proc.returncode, proc.stderr)
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "perfdoctor: interrupted"


IMPORT_CTRL_C = """
import os, signal, sys
sys.argv = ["perfdoctor", "analyze", sys.argv[1], "--format", "json"]

class Interrupted:  # Ctrl-C while numpy's C extension loads: numpy re-raises it as an ImportError
    def find_spec(self, name, path=None, target=None):
        if name == "perfdoctor.api":
            try:
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(100_000):  # the handler runs here
                    pass
            except KeyboardInterrupt:
                raise ImportError("numpy._core.umath failed to import") from None

sys.meta_path.insert(0, Interrupted())
from perfdoctor.cli import main
main()
"""


def test_ctrl_c_that_an_import_turns_into_its_error_still_exits_130():
    proc = subprocess.run([sys.executable, "-c", IMPORT_CTRL_C, REAL_H100], cwd=REPO, capture_output=True,
                          text=True, timeout=60, preexec_fn=_limits)
    assert proc.returncode == 130, (proc.returncode, proc.stderr)
    assert proc.stderr.strip() == "perfdoctor: interrupted"


def _trace_for_ctrl_c() -> Path:
    return REAL_H100


def _wait_until_reading(proc: subprocess.Popen, trace: Path, timeout: float = 60) -> bool:
    """Whether ``proc`` opened ``trace`` (it is past start-up, inside the analysis) before ending."""
    fds, deadline = Path(f"/proc/{proc.pid}/fd"), time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if any(Path(fd).resolve() == trace.resolve() for fd in fds.iterdir()):
                return True
        except OSError:  # a descriptor closed while we looked
            pass
        time.sleep(0.005)
    return False


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs /proc to see when the trace is open")
@pytest.mark.parametrize("delay", [0.0, 0.3, 0.8])
def test_ctrl_c_during_analyze_exits_130(tmp_path, delay):
    out, trace = tmp_path / "report.txt", _trace_for_ctrl_c()
    proc = subprocess.Popen([sys.executable, "-m", "perfdoctor", "analyze", trace, "--html", tmp_path / "r.html",
                             "-o", out], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_limits)
    reading = _wait_until_reading(proc, trace)
    time.sleep(delay)
    finished_first = proc.poll() is not None
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    if not reading or finished_first:
        pytest.skip("the analysis finished before the signal (fast machine)")
    assert "Traceback" not in err and "Exception ignored" not in err, err
    if proc.returncode == -signal.SIGINT:  # the signal came during interpreter teardown, after the work
        assert out.exists() and err == ""
    else:
        assert proc.returncode == 130, err
        assert err.strip().splitlines()[-1] == "perfdoctor: interrupted"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no half file
