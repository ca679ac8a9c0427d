"""Re-make sample_traces/real/cpu_nvtx_nsys2022.sqlite: a real nsys 2022.4 CPU-only capture, scrubbed.

usage (from the repository root, as root, with nsys 2022.4 installed by scripts/install_nsys.sh and
nvtx==0.2.11 importable):
    python -m tests.nsys.make_real_sample [OUTPUT]

An nsys report carries more than the traced program: the environment of the profiled process,
command lines and names of other processes on the machine, the app's stdout/stderr, and -- when nsys
runs as root -- environment strings of *unrelated* processes, which land in the export's StringIds
(research/nsys_local.md §4; seen here too). So the capture runs as ``nobody`` with a minimal
environment from a private folder, and the export is scrubbed before it may be committed:

1. rows of other processes go (PROCESSES, ThreadNames, and ProcessStreams that are not empty);
2. rows whose text looks like a secret assignment (``...TOKEN=...``) or holds an environment block
   (NUL-separated ``NAME=value`` entries, e.g. the CLI's ``DeviceEnvironment``) go from every table;
3. strings that no column references go (the DDL marks every reference with
   ``-- REFERENCES StringIds(id)``), which removes environment blobs;
4. VACUUM rewrites the file, so deleted rows leave no bytes behind;
5. a byte scan for secret-looking names must then find nothing, or the script fails.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.nsys.capture import CaptureError, export_sqlite, find_nsys, profile

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUTPUT = REPO / "sample_traces" / "real" / "cpu_nvtx_nsys2022.sqlite"
PROGRAM = Path(__file__).resolve().parent / "programs" / "toy_training.py"
STEPS = 8
NOBODY = (65534, 65534)
MAX_BYTES = 1_000_000

_SECRET_WORD = r"(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|CRED|AUTH)"
# An assignment to a secret-looking name, in any case: "GH_TOKEN=...", "api_key=...".
_SECRET_ASSIGNMENT = re.compile(rf"(?i)[A-Z0-9_]*{_SECRET_WORD}[A-Z0-9_]*\s*=")
# Any identifier spelled like an environment variable that names a secret: "AWS_SECRET_ACCESS_KEY".
# It must hold an underscore, or SQL's own "PRIMARY KEY" in the schema text would match.
_SECRET_NAME = re.compile(rf"\b(?:[A-Z0-9]*_[A-Z0-9_]*{_SECRET_WORD}|{_SECRET_WORD}[A-Z0-9]*_)[A-Z0-9_]*\b".encode())
# Two NUL-separated NAME=value entries: a copied process environment.
_ENV_BLOCK = re.compile(rb"[A-Z_][A-Z0-9_]*=[^\x00]*\x00[A-Z_][A-Z0-9_]*=")
_STRING_REFERENCE = re.compile(r"^\s*(\w+)\s.*--.*REFERENCES StringIds\(id\)")
_PID_MASK = ~((1 << 24) - 1)


class SampleError(RuntimeError):
    """The sample could not be made, or would not be safe to publish."""


def make_sample(output: Path, *, steps: int = STEPS) -> Path:
    """Capture the toy training loop as ``nobody``, export, scrub and check it; write ``output``."""
    if os.geteuid() != 0:
        raise SampleError("run as root (the capture drops to nobody with setpriv)")
    cli = find_nsys()
    if cli is None or cli.release != "2022.4":
        raise SampleError(f"needs nsys 2022.4 on PATH, found {cli}")
    with tempfile.TemporaryDirectory(prefix="perfdoctor_sample_") as tmp:
        work = Path(tmp)
        os.chmod(work, 0o755)
        # Everything nobody needs lives in this folder: the program and the nvtx package.
        site = work / "site"
        shutil.copytree(_nvtx_package(), site / "nvtx")
        program = Path(shutil.copy(PROGRAM, work / PROGRAM.name))
        out = work / "out"
        out.mkdir()
        os.chown(out, *NOBODY)
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": "/nonexistent",
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(site),
            "PYTHONNOUSERSITE": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        python = _python_for_nobody(env)
        cap = profile(
            [python, str(program), str(steps)], out / "sample.nsys-rep", nsys=cli.path, env=env, run_as=NOBODY
        )
        if cap.returncode != 0:
            raise SampleError(f"the program failed (rc={cap.returncode})\n{cap.log[-2000:]}")
        export = export_sqlite(cap.report, nsys=cli.path, env=env, run_as=NOBODY)
        scrub(export)
        leaks = scan(export)
        if leaks:
            raise SampleError("secret-looking names left after scrubbing: " + ", ".join(leaks))
        size = export.stat().st_size
        if size >= MAX_BYTES:
            raise SampleError(f"{size} bytes; the sample must stay under {MAX_BYTES}")
        output.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(export, output)
    return output


def _nvtx_package() -> Path:
    spec = importlib.util.find_spec("nvtx")
    if spec is None or spec.origin is None:
        raise SampleError("the nvtx package (nvtx==0.2.11) is not installed")
    return Path(spec.origin).parent


def _python_for_nobody(env: dict[str, str]) -> str:
    """The system interpreter of our version, else this one, whichever user nobody can run.

    The copied nvtx package holds a compiled module, so the interpreter must match our version.
    The check goes through a shell's ``test -x`` as well: nsys looks the program up (stat) before it
    starts it, and that fails where the folders above it are closed to nobody.
    """
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for python in (f"/usr/bin/python{version}", sys.executable):
        check = [
            "setpriv",
            f"--reuid={NOBODY[0]}",
            f"--regid={NOBODY[1]}",
            "--clear-groups",
            "/bin/sh",
            "-c",
            'test -x "$0" && "$0" -c "import nvtx"',
            python,
        ]
        if subprocess.run(check, env=env, capture_output=True).returncode == 0:
            return python
    raise SampleError(f"no Python {version} that user nobody can run with nvtx")


def scrub(path: Path) -> None:
    """Remove what must not be published from an export, in place (see the module docstring)."""
    conn = sqlite3.connect(path)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        traced = _traced_processes(conn, tables)
        keep = ",".join(str(g) for g in traced) or "NULL"
        if "PROCESSES" in tables:
            conn.execute(f"DELETE FROM PROCESSES WHERE globalPid NOT IN ({keep})")
        if "ThreadNames" in tables:
            conn.execute(f"DELETE FROM ThreadNames WHERE (globalTid & {_PID_MASK}) NOT IN ({keep})")
        if "ProcessStreams" in tables:
            conn.execute(
                f"DELETE FROM ProcessStreams WHERE globalPid NOT IN ({keep}) "
                "OR contentId NOT IN (SELECT id FROM StringIds WHERE value = '')"
            )
        conn.create_function("publishable", 1, _publishable, deterministic=True)
        for table in tables:
            for column, decl_type in _columns(conn, table):
                if decl_type.upper() in ("TEXT", ""):
                    conn.execute(f"DELETE FROM [{table}] WHERE NOT publishable([{column}])")
        if "StringIds" in tables:
            referenced = [
                f"SELECT [{column}] FROM [{table}] WHERE [{column}] IS NOT NULL"  # NOT IN (.., NULL) is NULL
                for table, column in _string_references(conn)
            ]
            if referenced:
                conn.execute(f"DELETE FROM StringIds WHERE id NOT IN ({' UNION '.join(referenced)})")
        conn.commit()
        conn.execute("VACUUM")
    finally:
        conn.close()


def _publishable(value: object) -> bool:
    """False for a secret-looking assignment or an environment block (e.g. nsys' DeviceEnvironment)."""
    if not isinstance(value, str):
        return True
    return not (_SECRET_ASSIGNMENT.search(value) or _ENV_BLOCK.search(value.encode(errors="replace")))


def scan(path: Path) -> list[str]:
    """Secret-looking names, assignments or environment blocks in the file's bytes (empty list: clean)."""
    data = path.read_bytes()
    found = {m.group(0).decode(errors="replace") for m in _SECRET_NAME.finditer(data)}
    if _ENV_BLOCK.search(data):
        found.add("<environment block>")
    text = data.decode("latin-1")
    found |= {m.group(0) for m in _SECRET_ASSIGNMENT.finditer(text)}
    return sorted(found)


def _traced_processes(conn: sqlite3.Connection, tables: list[str]) -> set[int]:
    """globalPids that own NVTX or OS-runtime events: the profiled program and nothing else."""
    gpids: set[int] = set()
    for table in ("NVTX_EVENTS", "OSRT_API"):
        if table in tables:
            gpids |= {r[0] for r in conn.execute(f"SELECT DISTINCT globalTid & {_PID_MASK} FROM [{table}]")}
    return gpids


def _columns(conn: sqlite3.Connection, table: str) -> list[tuple[str, str]]:
    return [(r[1], r[2]) for r in conn.execute(f"PRAGMA table_info([{table}])")]


def _string_references(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    """(table, column) pairs that the DDL comments mark as references to StringIds."""
    refs = []
    for table, sql in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"):
        for line in (sql or "").splitlines():
            match = _STRING_REFERENCE.match(line)
            if match:
                refs.append((table, match.group(1)))
    return refs


if __name__ == "__main__":
    try:
        written = make_sample(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUTPUT)
    except (SampleError, CaptureError) as exc:
        sys.exit(f"make_real_sample: {exc}")
    print(f"wrote {written} ({written.stat().st_size} bytes)")
