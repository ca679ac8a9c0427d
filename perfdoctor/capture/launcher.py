"""``perfdoctor capture -- CMD``: run a training command under nsys with the per-rank hook, then export.

Or, with ``--profiler torch`` (and by default where nsys is missing or cannot write a report, said in
one line), without nsys: each rank's hook runs ``torch.profiler`` over the window and writes a Kineto
trace, which is scrubbed of secrets into ``rank<R>.pt.trace.json.gz`` once the run has ended
(:func:`_scrub_traces`); everything else (checks, signals, exit codes, manifest) is the same.

One call, in order: check that the command exists and its Python can emit the labels
(:mod:`perfdoctor.capture.preflight`), find nsys, check the output directory, insert ``nsys profile``
into the command (:mod:`perfdoctor.capture.command`), start it with the hook on ``PYTHONPATH``, pass
Ctrl-C/SIGTERM/SIGHUP on to every process of the run (:mod:`perfdoctor.capture.interrupts` says what
each signal does in each phase), export every report to SQLite (also after an interruption) and scrub
secrets from the exports (:mod:`perfdoctor.capture.scrub`), and write the manifest. The training
command's exit code is the capture's exit code; 128 + signal when a signal interrupted the capture and
the command itself reported success (or never ran).

Process control, and why:

* The command runs in a session of its own, so a terminal's Ctrl-C reaches perfdoctor alone and is
  forwarded once, on purpose, to every process below it: nsys starts the program in yet another
  session (``nsys-launcher``), which a process-group signal would miss. nsys itself is never signalled:
  it writes its report when its program ends, while SIGHUP or a second SIGINT make nsys 2022.4 quit
  without one (and a SIGINT to nsys reaches its program a second time, cutting its clean-up short).
* If the run does not end ``KILL_AFTER_S`` seconds after a signal, everything below us is killed.
* The nsys agent daemon is re-parented to pid 1 and can outlive its CLI; it is found by the CLI's pid
  (every pid seen below us is remembered) and ended, never by name.
* About 5 % of nsys 2022.4 launches fail within a second, before the program starts. The hook
  touches a marker file when the program's Python starts; without the marker and without a report,
  the launch is retried (at most ``START_TRIES`` times). Once the program started it is never re-run.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from perfdoctor.capture import command as launch_command
from perfdoctor.capture import manifest as run_manifest
from perfdoctor.capture import preflight, scrub
from perfdoctor.capture.hook import runtime, torch_profiler
from perfdoctor.capture.interrupts import FORCE_AFTER, Interrupts
from perfdoctor.capture.nsys_cli import (
    NsysCli,
    agents_of,
    descendants,
    export_sqlite,
    find_nsys,
    is_nsys,
    kill_tree,
    profile_args,
)
from perfdoctor.errors import InputError, UsageError

MIN_FREE_BYTES = 1 << 30  # refuse to start a capture with less free space than this in RUN_DIR
KILL_AFTER_S = 60.0
START_TRIES = 3
HOOK_PATH = Path(__file__).resolve().parent / "hook" / "pythonpath"
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class CaptureOptions:
    """What the user asked for (``perfdoctor capture`` options)."""

    command: list[str]
    out: Path | None = None
    steps: tuple[int, int] | None = None
    ranks: list[int] | None = None  # None: all
    per_rank: bool | None = None  # None: per node, unless srun alone starts the ranks
    memory: bool = True
    memory_max_entries: int = 100_000
    nsys_args: list[str] = field(default_factory=list)
    nsys: str | None = None
    force: bool = False
    cuda: bool | None = None  # None: trace CUDA when this machine has an NVIDIA GPU
    keep_reports: bool = False  # True: keep each .nsys-rep (owner-only) beside its scrubbed export
    profiler: str = "auto"  # nsys | torch | auto: nsys where it can write reports, else torch


@dataclass
class CaptureResult:
    run_dir: Path
    exit_code: int  # perfdoctor's: the training command's, or 128 + signal after an interruption
    reports: list[Path]  # the reports still in the run directory
    exports: list[Path]  # SQLite exports (nsys) or Kineto traces (torch), scrubbed
    manifest: Path
    notes: list[str]
    training_exit_code: int | None  # None: the training command never started
    interrupted_by: str | None
    profiler: str = "nsys"


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """``"2-4"`` → (2, 4); ``"3"`` → (3, 3). Steps count optimizer steps from 0."""
    if text is None or text == "":
        return None
    first, dash, last = text.partition("-")
    try:
        window = (int(first), int(last) if dash else int(first))
    except ValueError:
        raise UsageError(f"--steps {text!r}: expected A-B with whole numbers, e.g. 10-12") from None
    if window[0] < 0 or window[1] < window[0]:
        raise UsageError(f"--steps {text!r}: expected 0 <= A <= B")
    return window


def parse_ranks(text: str | None) -> list[int] | None:
    if text is None or text.strip().lower() in ("", "all"):
        return None
    try:
        ranks = sorted({int(r) for r in text.split(",") if r.strip()})
    except ValueError:
        raise UsageError(f"--ranks {text!r}: expected `all` or a comma-separated list like 0,1,8") from None
    if not ranks or ranks[0] < 0:
        raise UsageError(f"--ranks {text!r}: expected `all` or ranks >= 0")
    return ranks


def prepare_run_dir(out: Path | None, force: bool) -> Path:
    """Create (or, with ``force``, reuse) the run directory; refuse one we cannot fill."""
    run_dir = out if out is not None else Path("perfdoctor-runs") / time.strftime("%Y%m%d-%H%M%S")
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"{run_dir}: exists and is not a directory")
    if run_dir.is_dir() and any(run_dir.iterdir()) and not force:
        raise UsageError(f"{run_dir}: exists and is not empty; choose another --out, or pass --force to write "
                         "into it (files of the same names are overwritten, nothing else is touched)")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=run_dir, prefix=".perfdoctor-write-test", delete=True)
        probe.close()
    except OSError as exc:
        raise InputError(f"{run_dir}: cannot write there ({exc.strerror or exc})") from None
    free = shutil.disk_usage(run_dir).free
    if free < MIN_FREE_BYTES:
        raise InputError(f"{run_dir}: only {free / 2**20:.0f} MiB free; a capture needs at least "
                         f"{MIN_FREE_BYTES / 2**30:.0f} GiB (reports of a few training steps take hundreds of MB)")
    return run_dir.resolve()


def has_nvidia_gpu() -> bool:
    """An NVIDIA driver with at least one GPU is present (what ``-t cuda`` needs)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def gpu_names() -> list[str]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30, stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return sorted({line.strip() for line in out.splitlines() if line.strip()})


def hook_env(base: dict[str, str], run_dir: Path, options: CaptureOptions, profiler_api: bool,
             started_file: Path) -> dict[str, str]:
    """The environment of the training command: the hook first on PYTHONPATH, its settings in PERFDOCTOR_*."""
    env = dict(base)
    env["PYTHONPATH"] = os.pathsep.join([str(HOOK_PATH), *[p for p in [base.get("PYTHONPATH")] if p]])
    env[runtime.ENV_RUN_DIR] = str(run_dir)
    env[runtime.ENV_STEPS] = f"{options.steps[0]}-{options.steps[1]}" if options.steps else ""
    env[runtime.ENV_RANKS] = ",".join(map(str, options.ranks)) if options.ranks is not None else "all"
    env[runtime.ENV_MEMORY] = "1" if options.memory else "0"
    env[runtime.ENV_MAX_ENTRIES] = str(options.memory_max_entries)
    env[runtime.ENV_PROFILER_API] = "1" if profiler_api else "0"
    env[runtime.ENV_PROFILER] = "torch" if options.profiler == "torch" else "nsys"
    env["PERFDOCTOR_STARTED_FILE"] = str(started_file)
    env["PERFDOCTOR_PACKAGE_ROOT"] = str(PACKAGE_ROOT)
    return env


def run_capture(options: CaptureOptions, say: Callable[[str], None] = lambda s: None) -> CaptureResult:
    """Capture ``options.command``; see the module docstring. Raises InputError/UsageError (exit 2) or
    CommandNotFound (127) before anything runs when the request cannot work."""
    if options.profiler not in PROFILERS:
        raise UsageError(f"--profiler {options.profiler!r}: expected one of {', '.join(PROFILERS)}")
    launch = launch_command.parse_launch(options.command)
    per_rank = options.per_rank if options.per_rank is not None else launch.per_rank_default
    with Interrupts(say) as interrupts:
        preflight.check_command(launch)
        cli = _nsys_or_fallback(options, say)
        options = replace(options, profiler="nsys" if cli is not None else "torch")
        if cli is None:
            notes = [preflight.check_torch_profiler(launch, os.environ, PACKAGE_ROOT)]
            run_dir = prepare_run_dir(options.out, options.force)
            return _capture_torch(options, launch, run_dir, notes, interrupts, say)
        notes = [preflight.check_labels(launch, os.environ, PACKAGE_ROOT)]
        run_dir = prepare_run_dir(options.out, options.force)
        return _capture(options, launch, per_rank, cli, run_dir, notes, interrupts, say)


PROFILERS = ("auto", "nsys", "torch")


def _nsys_or_fallback(options: CaptureOptions, say: Callable[[str], None]) -> NsysCli | None:
    """The nsys to capture with, or None for the PyTorch profiler: asked for (``--profiler torch``), or
    ``auto`` where nsys is missing or cannot write reports (one line says so). ``--profiler nsys`` and an
    explicit ``--nsys PATH`` insist: their failure is the capture's (exit 2)."""
    if options.profiler == "torch":
        return None
    try:
        cli = find_nsys(options.nsys)
        preflight.check_nsys(cli)
    except InputError as exc:
        if options.profiler == "nsys" or options.nsys is not None:
            raise
        say(f"{exc} -> capturing with the PyTorch profiler instead (--profiler nsys insists on nsys)")
        return None
    return cli


def _capture(options: CaptureOptions, launch: launch_command.Launch, per_rank: bool, cli: NsysCli, run_dir: Path,
             notes: list[str], interrupts: Interrupts, say: Callable[[str], None]) -> CaptureResult:
    cuda = has_nvidia_gpu() if options.cuda is None else options.cuda
    profiler_api = options.steps is not None and cuda
    if options.steps is not None and not cuda:
        notes.append("no NVIDIA GPU here: the whole run is captured (cudaProfilerStart needs CUDA); --steps "
                     "still selects the labelled steps and the memory-snapshot window")
    if not cuda:
        notes.append("no NVIDIA GPU here: traced nvtx,osrt only (no CUDA)")
    pattern = launch_command.report_pattern(launch, per_rank=per_rank)
    nsys_cmd = profile_args(cli, output=str(run_dir / pattern), cuda=cuda, profiler_api=profiler_api,
                            force=options.force, extra=options.nsys_args)
    wrapped = launch_command.wrap(launch, nsys_cmd, per_rank=per_rank, ranks=options.ranks)
    private = Path(tempfile.mkdtemp(prefix="perfdoctor-capture-"))
    started_file = private / "started"
    env = hook_env(dict(os.environ), run_dir, options, profiler_api, started_file)
    secrets = scrub.secret_values(os.environ, [*options.command, *options.nsys_args])
    began = ended = time.time()
    exit_code: int | None = None
    lost: list[dict[str, str]] = []
    try:
        for attempt in range(1, START_TRIES + 1):
            if interrupts.interrupted:
                break
            exit_code = _run(wrapped, env, interrupts, say)
            reports = _reports(run_dir, pattern)
            if reports or started_file.exists() or interrupts.interrupted or attempt == START_TRIES:
                break
            if any(run_dir.glob("*.qdstrm")):
                notes.append("nsys left only .qdstrm files: its importer was not found (Debian: run "
                             "scripts/install_nsys.sh, which links host-linux-x64)")
                break
            say(f"nsys failed to start (exit code {exit_code}); retrying ({attempt + 1}/{START_TRIES})")
            time.sleep(1.0)
        ended = time.time()
        reports = _reports(run_dir, pattern)
        owner_only(reports)
        exports = _export_all(cli, reports, options, private, secrets, interrupts, notes, say, lost)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    interrupts.enter("finish")
    if exit_code is None:
        notes.append(f"the training command was not started ({interrupts.name} before launch)")
    elif not reports:
        notes.append("nsys wrote no report (see its output above)" + (
            f"; the run was interrupted by {interrupts.name}: what it captured is lost" if interrupts.interrupted
            else ""))
    kept = [r for r in reports if r.exists()]
    if kept:
        why = "as --keep-reports yes asked" if options.keep_reports else "because their export did not finish"
        notes.append(f"{len(kept)} .nsys-rep report(s) kept {why}, readable by their owner only: they hold the run's "
                     "whole environment and command line unredacted, secrets included (nsys reports cannot be "
                     "edited); share the SQLite exports and manifest.json, never the reports")
    files = sorted(p for p in run_dir.rglob("*") if p.is_file() and not p.name.startswith("."))
    capture_exit = interrupts.exit_code(exit_code)
    manifest = run_manifest.build_manifest(
        run_dir=run_dir, command=options.command, wrapped=wrapped, started=began, ended=ended,
        exit_code=exit_code, capture_exit_code=capture_exit, interrupted=interrupts.name,
        interrupted_during=interrupts.during, signals=interrupts.count,
        nsys={"path": cli.path, "version": cli.version, "trace": _trace_of(nsys_cmd),
              "per_rank": per_rank, "profiler_api_window": profiler_api}, profiler="nsys",
        options={"steps": list(options.steps) if options.steps else None, "ranks": options.ranks or "all",
                 "memory": options.memory, "memory_max_entries": options.memory_max_entries, "profiler": "nsys",
                 "nsys_args": options.nsys_args, "force": options.force, "keep_reports": options.keep_reports},
        env=os.environ, files=files, gpus=gpu_names() if cuda else [], notes=notes, secrets=secrets,
        not_exported=lost)
    path = run_manifest.write_manifest(run_dir, manifest)
    return CaptureResult(run_dir, capture_exit, kept, exports, path, manifest["notes"], exit_code,
                         interrupts.name)


def _capture_torch(options: CaptureOptions, launch: launch_command.Launch, run_dir: Path, notes: list[str],
                   interrupts: Interrupts, say: Callable[[str], None]) -> CaptureResult:
    """The command as given, each rank profiling itself (see the module docstring)."""
    if options.nsys_args or options.per_rank is not None:
        notes.append("--nsys-arg / --per-rank / --per-node do not apply to the PyTorch profiler: ignored")
    command = list(options.command)
    private = Path(tempfile.mkdtemp(prefix="perfdoctor-capture-"))
    env = hook_env(dict(os.environ), run_dir, options, False, private / "started")
    secrets = scrub.secret_values(os.environ, options.command)
    began = ended = time.time()
    exit_code: int | None = None
    try:
        if not interrupts.interrupted:
            exit_code = _run(command, env, interrupts, say)
        ended = time.time()
        traces = _scrub_traces(run_dir, secrets, interrupts, notes, say)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    interrupts.enter("finish")
    if exit_code is None:
        notes.append(f"the training command was not started ({interrupts.name} before launch)")
    elif not traces:
        notes.append("no rank wrote a PyTorch profiler trace: the window was never reached (see --steps), or the "
                     "program never became a rank (no torch.distributed, no optimizer step)")
    files = sorted(p for p in run_dir.rglob("*") if p.is_file() and not p.name.startswith("."))
    capture_exit = interrupts.exit_code(exit_code)
    manifest = run_manifest.build_manifest(
        run_dir=run_dir, command=options.command, wrapped=command, started=began, ended=ended,
        exit_code=exit_code, capture_exit_code=capture_exit, interrupted=interrupts.name,
        interrupted_during=interrupts.during, signals=interrupts.count, nsys=None, profiler="torch",
        options={"steps": list(options.steps) if options.steps else None, "ranks": options.ranks or "all",
                 "memory": options.memory, "memory_max_entries": options.memory_max_entries,
                 "profiler": "torch", "force": options.force},
        env=os.environ, files=files, gpus=gpu_names() if has_nvidia_gpu() else [], notes=notes, secrets=secrets)
    path = run_manifest.write_manifest(run_dir, manifest)
    return CaptureResult(run_dir, capture_exit, [], traces, path, manifest["notes"], exit_code, interrupts.name,
                         profiler="torch")


def _scrub_traces(run_dir: Path, secrets: set[str], interrupts: Interrupts, notes: list[str],
                  say: Callable[[str], None]) -> list[Path]:
    """Each rank's hidden Kineto trace, scrubbed into its final name and removed (also after a signal:
    a first SIGINT/SIGHUP lets the scrubbing finish; SIGTERM or a second signal stops it, and the traces
    not yet scrubbed are deleted, since nothing unscrubbed may stay in the run directory)."""
    state = _enter_export(interrupts, say, stopping="stopping; traces not yet scrubbed of secrets are deleted",
                          going_on="scrubbing the traces first; send it again to stop")
    traces = []
    for raw in sorted(run_dir.glob(f".*{torch_profiler.UNSCRUBBED_SUFFIX}")):
        target = raw.with_name(torch_profiler.final_name(raw.name))
        try:
            if state["abort"]:
                notes.append(f"{target.name} deleted unscrubbed ({interrupts.name} during the scrubbing)")
                continue
            say(f"scrubbing {target.name}")
            scrub.scrub_kineto(raw, target, secrets)
            traces.append(target)
        except (OSError, ValueError) as exc:
            notes.append(f"{target.name} could not be scrubbed of secrets ({exc}), so it was not kept")
        finally:
            raw.unlink(missing_ok=True)
    return traces


def _enter_export(interrupts: Interrupts, say: Callable[[str], None], *, stopping: str,
                  going_on: str) -> dict[str, bool]:
    """Enter the export phase (:mod:`perfdoctor.capture.interrupts`): a first SIGINT/SIGHUP lets it go on,
    SIGTERM or a later signal sets ``abort`` in the returned state, which the export loop reads."""
    state = {"abort": False}

    def on_signal(sig: signal.Signals, count: int) -> None:
        if sig == signal.SIGTERM or count > 1:
            state["abort"] = True
            say(f"{sig.name}: {stopping}")
        else:
            say(f"{sig.name}: {going_on}")

    interrupts.enter("export", on_signal)
    return state


def owner_only(reports: list[Path]) -> None:
    """Make each report readable by its owner alone: it holds the environment and command line, secrets
    included, for as long as it lies in the run directory (until its export is written, or for good)."""
    for report in reports:
        try:
            report.chmod(0o600)
        except OSError:  # not ours (a shared run directory): the note at the end still says what it holds
            pass


def _trace_of(nsys_cmd: list[str]) -> str:
    return next((a.split("=", 1)[1] for a in nsys_cmd if a.startswith("--trace=")), "")


def _reports(run_dir: Path, pattern: str) -> list[Path]:
    prefix = pattern.split("%", 1)[0]
    return sorted(p for p in run_dir.glob(f"{prefix}*.nsys-rep") if p.is_file() and p.stat().st_size > 0)


def _run(argv: list[str], env: dict[str, str], interrupts: Interrupts, say: Callable[[str], None]) -> int:
    """Run ``argv`` in its own session and pass signals on (see :mod:`perfdoctor.capture.interrupts`).

    Returns its exit code; a child killed by a signal reports 128 + its number, as shells do.
    """
    try:
        proc = subprocess.Popen(argv, env=env, start_new_session=True)
    except OSError as exc:
        raise InputError(f"{argv[0]}: cannot start it ({exc.strerror or exc})") from None
    seen: set[int] = {proc.pid}

    def forward(sig: signal.Signals, count: int) -> None:
        if count >= FORCE_AFTER:
            say(f"{sig.name} #{count}: killing the run now; what nsys had not written is lost")
            kill_tree(proc.pid, signal.SIGKILL)
            return
        if count == 1:
            say(f"{sig.name}: passing it to the training processes; nsys then writes its report, which is exported")
        else:
            say(f"{sig.name} again: passed on; {FORCE_AFTER - count} more kill(s) the run and lose its report")
        for pid in [proc.pid, *descendants(proc.pid)]:
            if not is_nsys(pid):  # nsys writes its report once its program ends; a signal can only spoil it
                _signal(pid, sig)

    interrupts.enter("training", forward)
    if interrupts.interrupted:  # a signal between the last check and the start
        forward(interrupts.first or signal.SIGINT, 1)
    try:
        last_scan = 0.0
        while proc.poll() is None:
            now = time.monotonic()
            if now - last_scan > 2.0:
                seen.update(descendants(proc.pid))
                last_scan = now
            first_at = interrupts.first_at
            if first_at is not None and now - first_at > KILL_AFTER_S:
                say(f"the run did not end {KILL_AFTER_S:.0f} s after {interrupts.name}: killing it")
                kill_tree(proc.pid, signal.SIGKILL)
                interrupts.first_at = float("inf")
            time.sleep(0.1)
    finally:
        interrupts.enter("export")  # until the export starts, a signal is only counted
        for agent in agents_of(seen):
            kill_tree(agent, signal.SIGTERM)
    rc = proc.returncode
    return 128 - rc if rc < 0 else rc


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):  # gone already, or not ours to signal
        pass


def not_exported(report: Path, why: str) -> dict[str, str]:
    """What a report without its SQLite export means (manifest ``not_exported``): nothing captured is lost,
    the report holds it all; how to export it by hand."""
    return {"report": report.name, "why": why,
            "lost": f"{report.stem}.sqlite only: {report.name} holds everything captured (kept, owner-only, "
                    "unredacted)",
            "export_by_hand": f"nsys export --type sqlite --output {report.stem}.sqlite {report.name}",
            "or_analyse": "perfdoctor analyze RUN_DIR (exports it into ~/.cache/perfdoctor, outside RUN_DIR)"}


def _export_all(cli: NsysCli, reports: list[Path], options: CaptureOptions, private: Path, secrets: set[str],
                interrupts: Interrupts, notes: list[str], say: Callable[[str], None],
                lost: list[dict[str, str]]) -> list[Path]:
    """Export each report to SQLite through a hidden file that is scrubbed into ``X.sqlite`` and removed
    (``X.sqlite`` never holds a secret, not even for a moment); unless ``keep_reports``, delete each
    report once its scrubbed export is in place. A report left without its export is kept, and ``lost``
    gets what that means and how to export it by hand (:func:`not_exported`)."""
    env = dict(os.environ)
    env["TMPDIR"] = str(private)
    state = _enter_export(interrupts, say, stopping="stopping the export; the .nsys-rep report(s) are kept",
                          going_on="exporting what was captured first; send it again to stop the export")
    exports = []
    for report in reports:
        target = report.with_suffix(".sqlite")
        if state["abort"]:
            lost.append(not_exported(report, f"not started: {interrupts.name} stopped the export"))
            notes.append(f"{report.name} not exported ({interrupts.name}): export it by hand with "
                         f"`{lost[-1]['export_by_hand']}`")
            continue
        if target.exists() and not options.force:
            notes.append(f"{target.name} exists: not re-exported (pass --force to overwrite)")
            continue
        say(f"exporting {report.name} to SQLite")
        raw = report.with_name(f".{report.stem}.unscrubbed.sqlite")  # beside it: /tmp may be too small
        output, log = export_sqlite(cli, report, raw, force=True, env=env, abort=lambda: state["abort"])
        if output is None:
            tail = " ".join(log.strip().splitlines()[-2:])
            reason = f"stopped by {interrupts.name}" if state["abort"] else f"failed: {tail}"
            lost.append(not_exported(report, reason))
            notes.append(f"export of {report.name} {reason}; the report is kept: export it by hand with "
                         f"`{lost[-1]['export_by_hand']}`")
            continue
        try:
            scrub.scrub_sqlite(raw, target, secrets)
        except sqlite3.Error as exc:
            lost.append(not_exported(report, f"could not be scrubbed of secrets ({exc})"))
            notes.append(f"export of {report.name} could not be scrubbed of secrets ({exc}), so it was not kept; "
                         "the report is kept")
            continue
        finally:
            raw.unlink(missing_ok=True)
        exports.append(target)
        if options.keep_reports is False:
            report.unlink()
    return exports
