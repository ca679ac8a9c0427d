"""`perfdoctor --help` stays fast because the CLI imports no heavy module until a command runs.

(Speed itself is measured in benchmarks/, not in unit tests: this checks the cause, not the clock.)
"""

from __future__ import annotations

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
