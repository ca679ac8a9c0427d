"""The Nsight Systems CLI: find it, learn what this release supports, build and run its commands.

Facts this module is built on (research/nsys_local.md, research/nsys_schema.md §8):

* Options and ``--trace`` values differ by release (``python-gil`` from 2023.4, ``cusolver`` from
  2024.2, ``--cpuctxsw`` everywhere we know of), so the profile command is built from the release's
  own ``nsys profile --help`` rather than from a table of versions.
* ``--cpuctxsw=none`` is mandatory: with context-switch tracing the 2022.4 agent can spin forever
  once the app has exited. ``--sample=none`` keeps CPU sampling out for the same reason and because
  it costs the training run time.
* The CLI starts an agent daemon (``nsys --start-agent --session-name=profile-<exe>-<CLI pid>``,
  re-parented to pid 1) that can outlive a killed CLI: cleanup finds it by our CLI's pid, never by a
  broad name.
* nsys keeps its session directory and ``nsys-report-*.qdstrm`` under ``$TMPDIR``: a private one per
  call keeps concurrent captures apart.
* ``nsys export --include-blobs=true`` (2026.x) keeps NVTX extended payloads (NCCL's communicator ids)
  in ``NVTX_EVENTS.binaryData``; without it they are dropped (``EXPORT_PARAM_INCLUDE_BLOBS`` false).
* A ``.qdstrm`` without a ``.nsys-rep`` means the importer was not found (Debian needs the
  host-linux-x64 link that scripts/install_nsys.sh makes).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perfdoctor.errors import InputError

INSTALL_HINT = ("install Nsight Systems (Debian 12: `bash scripts/install_nsys.sh`; elsewhere the CUDA toolkit or "
                "https://developer.nvidia.com/nsight-systems) or pass --nsys PATH")
_VERSION_RE = re.compile(r"version (\d+\.\d+\.\d+(?:\.\d+)?)")
_OPTION_RE = re.compile(r"^\s*(?:-\w, )?(--[a-z0-9][a-z0-9-]*)=", re.MULTILINE)
_TRACE_RE = re.compile(r"--trace=\s*Possible values are (.*?)\.\s*\n\s*Select", re.DOTALL)


@dataclass(frozen=True)
class NsysCli:
    """One Nsight Systems CLI: where it is, its version, and what its ``profile`` accepts."""

    path: str
    version: str  # "2022.4.2.1"
    options: frozenset[str] = field(default_factory=frozenset)  # long options of `nsys profile`
    traces: frozenset[str] = field(default_factory=frozenset)  # values --trace accepts
    export_options: frozenset[str] = field(default_factory=frozenset)  # long options of `nsys export`

    @property
    def release(self) -> str:
        """Release as users name it ("2022.4")."""
        return ".".join(self.version.split(".")[:2])


def find_nsys(executable: str | None = None) -> NsysCli:
    """The nsys CLI (``executable``: a name on PATH or a path; default ``nsys``), or InputError saying how
    to install one."""
    name = executable or "nsys"
    path = shutil.which(name)
    if path is None:
        where = f"{name}: not found" if executable else "nsys (Nsight Systems CLI) not found on PATH"
        raise InputError(f"{where}; {INSTALL_HINT}")
    try:
        out = _run_quiet([path, "--version"])
        help_text = _run_quiet([path, "profile", "--help"])
        export_help = _run_quiet([path, "export", "--help"])
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InputError(f"{path}: cannot run it ({exc}); {INSTALL_HINT}") from None
    match = _VERSION_RE.search(out)
    if match is None:
        raise InputError(f"{path}: not an Nsight Systems CLI (`--version` printed no version); {INSTALL_HINT}")
    options, traces = parse_profile_help(help_text)
    return NsysCli(path, match.group(1), options, traces, parse_options(export_help))


def parse_options(help_text: str) -> frozenset[str]:
    """Long options (``--name``) a command's ``--help`` lists."""
    return frozenset(_OPTION_RE.findall(help_text))


def parse_profile_help(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """Long options and ``--trace`` values listed by ``nsys profile --help``."""
    options = parse_options(text)
    match = _TRACE_RE.search(text)
    traces = frozenset(re.findall(r"'([a-z0-9-]+)'", match.group(1))) if match else frozenset()
    return options, traces


def trace_apis(cli: NsysCli, cuda: bool) -> list[str]:
    """What to trace: NVTX and OS runtime always; CUDA (+cuBLAS, cuDNN where this release knows them)
    when the machine has a GPU. Without a GPU ``-t cuda`` records nothing and only costs start-up."""
    wanted = ["cuda", "nvtx", "osrt", "cublas", "cudnn"] if cuda else ["nvtx", "osrt"]
    known = cli.traces or frozenset(("cuda", "nvtx", "osrt"))
    return [t for t in wanted if t in known]


def profile_args(cli: NsysCli, *, output: str, cuda: bool, profiler_api: bool, force: bool,
                 extra: Sequence[str] = ()) -> list[str]:
    """``nsys profile ...`` up to (not including) the program: ``output`` is the ``-o`` pattern
    (``%q{RANK}``, ``%h`` substitutions are nsys's). ``profiler_api``: collect only between
    cudaProfilerStart and cudaProfilerStop (the ``--steps`` window), and keep the program running
    afterwards."""
    args = [cli.path, "profile", f"--trace={','.join(trace_apis(cli, cuda))}", "--sample=none"]
    if "--cpuctxsw" in cli.options or not cli.options:
        args.append("--cpuctxsw=none")
    if profiler_api:
        args += ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
    if cuda and "--cuda-graph-trace" in cli.options:
        args.append("--cuda-graph-trace=node")
    args.append(f"--force-overwrite={'true' if force else 'false'}")
    args.append(f"--output={output}")
    return [*args, *extra]


def export_args(cli: NsysCli, report: Path, output: Path, *, force: bool) -> list[str]:
    """``nsys export`` to SQLite; with NVTX payload blobs where the release can export them (2026.x:
    NCCL's communicator ids, which label the parallel group of plain captures)."""
    blobs = ["--include-blobs=true"] if "--include-blobs" in cli.export_options else []
    return [cli.path, "export", "--type=sqlite", *blobs, f"--force-overwrite={'true' if force else 'false'}",
            f"--output={output}", str(report)]


def export_sqlite(cli: NsysCli, report: Path, output: Path, *, force: bool, env: dict[str, str],
                  abort: Callable[[], bool] = lambda: False, timeout_s: float = 1800.0) -> tuple[Path | None, str]:
    """Export one report to ``output``. Returns (path or None, log). ``abort()`` is asked while the
    export runs: once true, the export is killed and waited for (never left running), and its partial
    output removed."""
    log_path = Path(env["TMPDIR"]) / f"export-{report.stem}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(export_args(cli, report, output, force=force), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    rc: int | None = None
    try:
        while rc is None and time.monotonic() < deadline and not abort():
            try:
                rc = proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
    finally:
        if rc is None:
            kill_tree(proc.pid, signal.SIGKILL)
            proc.wait()
        for agent in agents_of({proc.pid}):
            kill_tree(agent, signal.SIGKILL)
    text = log_path.read_bytes().decode(errors="replace").replace("\r", "\n")
    ok = rc == 0 and output.is_file()
    if not ok:
        output.unlink(missing_ok=True)
    return (output if ok else None), text


def _run_quiet(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          start_new_session=True)  # a terminal's Ctrl-C is for perfdoctor to handle
    return proc.stdout + proc.stderr


def kill_tree(root: int, sig: int) -> None:
    """Send ``sig`` to ``root`` and everything below it (snapshotted first: children get re-parented)."""
    for pid in [root, *descendants(root)]:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):  # gone already, or not ours to signal
            pass


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in _process_parents():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _process_parents() -> Iterator[tuple[int, int]]:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # "pid (comm) state ppid ...": comm may hold spaces
        yield int(entry.name), int(fields[1])


def is_nsys(pid: int) -> bool:
    """The process runs an Nsight Systems binary (its name: ``nsys``, ``nsys-launcher``, ``nsys-tee``): one
    that is not passed the user's signals, or it quits without writing its report."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().startswith("nsys")
    except OSError:
        return False


def agents_of(cli_pids: set[int]) -> list[int]:
    """Agents started by nsys CLIs with these pids (``--session-name=profile-<exe>-<cli pid>``)."""
    session = re.compile(r"--session-name=\S*-(\d+)")
    agents = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "--start-agent" not in args:
            continue
        owners = {int(m.group(1)) for m in map(session.fullmatch, args) if m}
        if owners & cli_pids:
            agents.append(int(entry.name))
    return agents
