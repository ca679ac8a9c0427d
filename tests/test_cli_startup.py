"""`perfdoctor --help` stays fast because the CLI imports no heavy module until a command runs.

(Speed itself is measured in benchmarks/, not in unit tests: this checks the cause, not the clock.)
"""

from __future__ import annotations

import os
import subprocess
import sys

HEAVY = ("pandas", "numpy", "pyarrow", "connectorx", "plotly", "perfdoctor.api")


def test_help_and_version_import_no_heavy_modules():
    code = ("import sys; from perfdoctor.cli import app\n"
            "for argv in (['--help'], ['--version'], ['analyze', '--help']):\n"
            "    try: app(argv, standalone_mode=False)\n"
            "    except SystemExit: pass\n"
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_analyze_imports_only_what_its_output_needs():
    """Without --html and --rules, analyze loads neither the HTML stack nor the rule-schema validator
    (the shipped rules are schema-checked by tests/diagnose/test_shipped_rules_schema.py)."""
    from tests.paths import REAL_H100

    code = ("import sys, contextlib, io; from perfdoctor.cli import app\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    try: app(['analyze', {str(REAL_H100)!r}], standalone_mode=False)\n"
            "    except SystemExit: pass\n"
            "print([m for m in ('plotly', 'jinja2', 'jsonschema') if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


CLI_FRAMEWORKS = ("typer", "pydantic", "plotly", "jinja2", "rich.progress", "pandas", "pyarrow", "connectorx",
                  "connectorx.connectorx")


def test_analyze_does_not_import_typer_pydantic_pandas_or_the_html_stack():
    """The CLI is plain click: `analyze --help` and a terminal analysis load neither typer nor pydantic
    (typer 0.29 builds a pydantic validator per parameter on every run) nor the HTML report's stack, nor
    the live progress bar when stderr is not a terminal; nor pandas (the tables are numpy) nor, for a small
    export (every table under 50,000 rows), connectorx and pyarrow. Run as a user runs it
    (``python -m perfdoctor``), the modules listed at exit."""
    from tests.paths import REAL_H100

    code = ("import atexit, sys\n"
            f"atexit.register(lambda: sys.stderr.write('LOADED ' + repr([m for m in {CLI_FRAMEWORKS!r} "
            "if m in sys.modules]) + '\\n'))\n"
            "import runpy; runpy.run_module('perfdoctor', run_name='__main__', alter_sys=True)")
    for argv in (["analyze", "--help"], ["analyze", str(REAL_H100)]):
        proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr.strip().splitlines()[-1] == "LOADED []", (argv, proc.stderr[-2000:])


def test_json_analysis_of_one_nsys_export_imports_neither_rich_nor_the_kineto_reader():
    """``analyze --format json`` of one nsys export with stderr not a terminal shows no progress, so rich
    (the terminal renderer's console, ~30 ms of start-up) stays unimported (perfdoctor.render.progress);
    nor is the Kineto reader and its msgspec (~13 ms) loaded for an input that is not Kineto, nor the capture
    hook's group parser (Kineto's process-group names, ~6 ms), nor the memory-snapshot reader without a
    snapshot, nor subprocess (only a .nsys-rep report is exported by running nsys)."""
    from tests.paths import REAL_H100

    lazy = ("rich", "msgspec", "perfdoctor.load.kineto", "perfdoctor.capture", "perfdoctor.load.memsnap",
            "subprocess")
    code = ("import atexit, sys\n"
            "atexit.register(lambda: sys.stderr.write('LOADED ' + repr(sorted(m for m in sys.modules "
            f"if m.split('.')[0] in {lazy!r} or m in {lazy!r})) + '\\n'))\n"
            "import runpy; runpy.run_module('perfdoctor', run_name='__main__', alter_sys=True)")
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    proc = subprocess.run([sys.executable, "-c", code, "analyze", str(REAL_H100), "--format", "json", "-o",
                           os.devnull], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "LOADED []", proc.stderr[-2000:]


def test_a_finished_analysis_leaves_the_interpreter_with_its_objects_frozen():
    """After the report is written, the objects are frozen out of the garbage collector (cli._exit_interrupted_or)
    so that teardown does not walk them again; atexit handlers still run, and the exit code stays 0."""
    from tests.paths import REAL_H100

    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: sys.stderr.write(f'FROZEN {gc.get_freeze_count() > 0}\\n'))\n"
            "import runpy; runpy.run_module('perfdoctor', run_name='__main__', alter_sys=True)")
    proc = subprocess.run([sys.executable, "-c", code, "analyze", str(REAL_H100), "--format", "json", "-o",
                           os.devnull], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "FROZEN True", proc.stderr[-2000:]


def test_an_analysis_in_process_freezes_nothing():
    """app() called in-process (a test, a caller's own program) leaves the collector as it found it: frozen
    objects are never collected, so only the CLI's own process (main()) freezes its modules."""
    import gc

    from click.testing import CliRunner

    from perfdoctor.cli import app
    from tests.paths import REAL_H100

    before = gc.get_freeze_count()
    result = CliRunner().invoke(app, ["analyze", str(REAL_H100), "--format", "json", "-o", os.devnull])
    assert result.exit_code == 0, result.output
    assert gc.get_freeze_count() == before and gc.isenabled()
