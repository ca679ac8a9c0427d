"""Run a program under a real Nsight Systems CLI and export the report to SQLite, without ever hanging.

Each fact below was measured with nsys 2022.4.2 on CPU-only Debian 12 (research/nsys_local.md §2-§4)
and is one piece of code here:

* ``--cpuctxsw=none`` is mandatory: with context-switch tracing the 2022.4 agent spins forever on
  EPOLLHUP once the app has exited, and the CLI waits on it forever. ``--sample=none`` keeps CPU
  sampling (perf) out for the same reason.
* About 5 % of launches fail within a second, before the app starts (the CLI cannot reach its
  agent); a retry succeeds. Success therefore means "the .nsys-rep exists", not rc == 0 -- the CLI
  returns the *app's* exit code and writes the report anyway.
* The CLI starts an agent daemon (``nsys --start-agent --session-name=profile-<exe>-<CLI pid>``,
  re-parented to pid 1) that outlives a failed or killed CLI, and the app runs in a session of its
  own under ``nsys-launcher``. Killing the CLI's process group reaches neither, so cleanup kills the
  CLI's descendants and the one agent whose session name ends in our CLI's pid -- never another
  capture's nsys.
* nsys keeps its session directory, lock and ``nsys-report-*.qdstrm`` under ``$TMPDIR``: a private
  one per call keeps concurrent captures apart and leaves nothing behind.
* A ``.qdstrm`` without a ``.nsys-rep`` means the importer was not found (Debian needs the
  host-linux-x64 link made by scripts/install_nsys.sh); retrying cannot help.
* The report embeds the environment of the profiled process and the app's stdout/stderr, so
  captures meant for publication run as an unprivileged user (``run_as``) with a minimal ``env``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from perfdoctor.capture.nsys_cli import agents_of, kill_tree

DEFAULT_TIMEOUT_S = 120.0
_VERSION_RE = re.compile(r"version (\d+\.\d+\.\d+(?:\.\d+)?)")
_LOG_TAIL_CHARS = 2000


class CaptureError(RuntimeError):
    """nsys did not produce a report or an export; the message ends with the CLI's last output."""


@dataclass(frozen=True)
class NsysCli:
    """One Nsight Systems command-line tool: where it is and which version it is."""

    path: str
    version: str  # "2022.4.2.1"

    @property
    def release(self) -> str:
        """Release as users name it ("2022.4"); exporters of one release write one schema."""
        return ".".join(self.version.split(".")[:2])


@dataclass(frozen=True)
class Capture:
    """A finished ``nsys profile`` run."""

    report: Path
    returncode: int  # the profiled program's exit code, which nsys passes on
    attempts: int
    log: str


def find_nsys(executable: str = "nsys") -> NsysCli | None:
    """The nsys CLI named ``executable`` (a name on PATH or a path), or None if absent or broken."""
    path = shutil.which(executable)
    if path is None:
        return None
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = _VERSION_RE.search(out)
    return NsysCli(path, match.group(1)) if match else None


def profile(
    command: Sequence[str],
    output: Path,
    *,
    nsys: str = "nsys",
    trace: str = "osrt,nvtx",
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    run_as: tuple[int, int] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    tries: int = 3,
) -> Capture:
    """Profile ``command`` into ``output`` (a path ending in ``.nsys-rep``).

    ``env`` replaces the environment of nsys and the program (None: inherit ours); ``run_as`` is a
    (uid, gid) pair to drop to with setpriv (needs root; ``output``'s folder must be writable by
    that user). Each attempt is killed after ``timeout_s`` seconds; start-up failures are retried
    up to ``tries`` attempts in all. Raises CaptureError when no report comes out.
    """
    output = Path(output).resolve()
    if output.suffix != ".nsys-rep":
        raise ValueError(f"{output}: the report name must end in .nsys-rep")
    base = output.with_suffix("")  # nsys adds .nsys-rep itself
    qdstrm = base.parent / (base.name + ".qdstrm")
    argv = [
        *_run_as_prefix(run_as),
        nsys,
        "profile",
        f"--trace={trace}",
        "--sample=none",
        "--cpuctxsw=none",
        "--force-overwrite=true",
        f"--output={base}",
        *extra_args,
        *command,
    ]
    logs: list[str] = []
    for attempt in range(1, tries + 1):
        output.unlink(missing_ok=True)
        qdstrm.unlink(missing_ok=True)
        with _private_tmpdir(run_as) as tmp:
            rc, log = _run_watched(argv, env=_with_tmpdir(env, tmp), timeout_s=timeout_s)
        logs.append(f"--- attempt {attempt}: rc={rc}\n{log}")
        if rc is None:  # a report written before the kill may be cut short: never hand it out
            raise CaptureError(f"nsys profile ran past {timeout_s:.0f} s and was killed\n{_tail(logs)}")
        if output.is_file() and output.stat().st_size > 0:
            return Capture(output, rc, attempt, "\n".join(logs))
        if qdstrm.exists():
            raise CaptureError(
                f"nsys profile left only {qdstrm.name}: the importer was not found "
                f"(run scripts/install_nsys.sh)\n{_tail(logs)}"
            )
        time.sleep(1.0)
    raise CaptureError(f"nsys profile produced no {output.name} in {tries} attempts\n{_tail(logs)}")


def export_sqlite(
    report: Path,
    output: Path | None = None,
    *,
    nsys: str = "nsys",
    lazy: bool = True,
    run_as: tuple[int, int] | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Path:
    """Export ``report`` with ``nsys export --type sqlite``.

    ``output`` defaults to the report's name with ``.sqlite``. ``lazy=False`` creates every table of
    the release's schema, empty ones included (the default writes only tables with rows). Any nsys
    CLI that can read the report works, so a newer release's exporter re-exports an older capture
    in its own schema.
    """
    report = Path(report).resolve()
    output = (Path(output) if output is not None else report.with_suffix(".sqlite")).resolve()
    output.unlink(missing_ok=True)
    argv = [
        *_run_as_prefix(run_as),
        nsys,
        "export",
        "--type=sqlite",
        "--force-overwrite=true",
        f"--lazy={str(lazy).lower()}",
        f"--output={output}",
        str(report),
    ]
    with _private_tmpdir(run_as) as tmp:
        rc, log = _run_watched(argv, env=_with_tmpdir(env, tmp), timeout_s=timeout_s)
    if rc != 0 or not output.is_file():
        why = f"ran past {timeout_s:.0f} s and was killed" if rc is None else f"failed (rc={rc})"
        raise CaptureError(f"nsys export {why}\n{_tail([log])}")
    return output


def _run_as_prefix(run_as: tuple[int, int] | None) -> list[str]:
    """setpriv execs its command, so the CLI keeps setpriv's pid (the agent's session name uses it)."""
    if run_as is None:
        return []
    uid, gid = run_as
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]


@contextmanager
def _private_tmpdir(run_as: tuple[int, int] | None) -> Iterator[Path]:
    tmp = Path(tempfile.mkdtemp(prefix="nsys_capture_"))
    try:
        if run_as is not None:
            os.chown(tmp, *run_as)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _with_tmpdir(env: Mapping[str, str] | None, tmp: Path) -> dict[str, str]:
    merged = dict(os.environ if env is None else env)
    merged["TMPDIR"] = str(tmp)
    return merged


def _run_watched(argv: list[str], *, env: dict[str, str], timeout_s: float) -> tuple[int | None, str]:
    """Run one nsys command; return (rc or None if it timed out, its output).

    Output goes to a file in the private TMPDIR rather than a pipe: the CLI's children inherit
    stdout, and a pipe held open by a stray child would block reading it.
    """
    log_path = Path(env["TMPDIR"]) / "cli.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        rc: int | None = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        rc = None
        kill_tree(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        # The agent is only found while the CLI's pid names it; it survives both a failed start
        # and a killed CLI.
        for agent in agents_of({proc.pid}):
            kill_tree(agent, signal.SIGKILL)
    text = log_path.read_bytes().decode(errors="replace")
    return rc, text.replace("\r", "\n")


def _tail(logs: list[str]) -> str:
    lines = [ln for ln in "\n".join(logs).splitlines() if ln.strip() and "[" not in ln[:2]]
    return "\n".join(lines)[-_LOG_TAIL_CHARS:]
