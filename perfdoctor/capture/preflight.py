"""Checks before a capture launches anything, so that a long job never runs for nothing.

* The command exists (else exit 127 at once, as a shell says "command not found"; nsys would
  otherwise fail to launch it, and be retried) and is executable (else exit 126, as a shell says
  "Permission denied" for a file it found but cannot run).
* The Python that will run the ranks can emit the labels: the hook's own NVTX back-end choice
  (:func:`perfdoctor.capture.hook.nvtx_emit.make_emitter`: the ``nvtx`` package, else the NVTX C
  library) is run in that interpreter, with the training environment. Without a back end every
  label is off and the capture cannot be analysed by step or group: refused with exit 2. Which
  interpreter: the program's (``python train.py``), torchrun's (or ``PYTHON_EXEC``), or a script's
  ``#!`` line; for other programs (shell scripts, binaries) it cannot be known, and the check says so.
* nsys was found and answered ``--version`` / ``profile --help`` (:func:`find_nsys`), and can turn
  what it records into a report: in NVIDIA's layout the CLI (``target-linux-x64/nsys``) runs
  ``host-linux-x64/QdstrmImporter`` at the end; where that is missing (Debian's package without the
  link scripts/install_nsys.sh makes) nsys exits 0 and leaves only a ``.qdstrm``, which nothing reads.
  (``nsys status -e`` is not asked: it judges CPU sampling, which capture turns off.)
* With the PyTorch profiler instead of nsys: the training Python imports ``torch`` with a Kineto
  profiler (``torch.profiler.kineto_available()``) and perfdoctor's hook module; else exit 2.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from perfdoctor.capture import command as launch_command
from perfdoctor.capture.nsys_cli import NsysCli
from perfdoctor.capture.scrub import redact_text
from perfdoctor.errors import InputError, PerfdoctorError

CHECK_TIMEOUT_S = 120.0
CAPTURE_EXTRA_HINT = "pip install 'perfdoctor[capture]' (or nvtx==0.2.11) in the training environment"
_PROBE = ("import sys; sys.path.append({root!r})\n"
          "from perfdoctor.capture.hook.nvtx_emit import make_emitter\n"
          "print('perfdoctor-nvtx-backend', make_emitter(lambda line: None).backend)\n")
_TORCH_PROBE = ("import sys; sys.path.append({root!r})\n"
                "import perfdoctor.capture.hook.torch_profiler, torch.profiler\n"
                "print('perfdoctor-torch-profiler', torch.profiler.kineto_available() and 'kineto' or 'none')\n")


class CommandNotFound(PerfdoctorError):
    """The training command does not exist: exit 127, as a shell."""

    exit_code = 127


class CommandNotExecutable(PerfdoctorError):
    """The training command exists but cannot be run (not executable, a directory): exit 126, as a shell."""

    exit_code = 126


def check_command(launch: launch_command.Launch) -> None:
    """The first program of the launch (srun, torchrun, python or the program) can be run."""
    first = (launch.srun or launch.torchrun or launch.program)[0]
    if shutil.which(first) is not None:
        return
    found = _found_but_not_executable(first)
    if found is not None:
        why = "is a directory" if found.is_dir() else "not executable"
        raise CommandNotExecutable(f"{found}: permission denied ({why}; nothing was started)")
    raise CommandNotFound(f"{first}: command not found (nothing was started)")


def _found_but_not_executable(command: str) -> Path | None:
    """The file a shell would find for ``command`` and then refuse to run: the path itself when it names
    one, else the first such file on PATH (``shutil.which`` skips them)."""
    if "/" in command:
        return Path(command) if Path(command).exists() else None
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = Path(folder or ".") / command
        if candidate.exists():
            return candidate
    return None


def check_nsys(cli: NsysCli) -> None:
    """InputError when this nsys could record but not write a report (its importer is missing)."""
    binary = Path(cli.path).resolve()
    if binary.parent.name != "target-linux-x64":
        return  # another layout (a wrapper script, a fake): nothing known to check
    importer = binary.parent.parent / "host-linux-x64" / "QdstrmImporter"
    if not importer.exists():
        raise InputError(f"{cli.path}: nsys would record but write no report ({importer} is missing; Debian: "
                         "run scripts/install_nsys.sh, which links host-linux-x64); nothing was started")


def training_python(launch: launch_command.Launch) -> str | None:
    """The interpreter the ranks will run in, or None when the command does not tell."""
    if launch.torchrun:
        if "--no-python" in launch.torchrun or "--no_python" in launch.torchrun:
            return _python_of(launch.program[0])
        return launch_command.torchrun_python(launch.torchrun)
    return _python_of(launch.program[0])


def _python_of(program: str) -> str | None:
    if launch_command.is_python(program):
        return shutil.which(program) or program
    path = shutil.which(program)
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            line = fh.readline(512).decode(errors="replace")
    except OSError:
        return None
    words = line[2:].split() if line.startswith("#!") else []
    if words and Path(words[0]).name == "env" and len(words) > 1:
        words = [shutil.which(words[1]) or words[1]]
    return words[0] if words and launch_command.is_python(words[0]) else None


def check_labels(launch: launch_command.Launch, env: Mapping[str, str], package_root: Path) -> str:
    """A note saying which Python and NVTX back end the labels will come from (or that the Python cannot
    be known); InputError when that Python cannot emit them."""
    python = training_python(launch)
    if python is None:
        return (f"cannot tell which Python runs `{launch.program[0]}`: whether it can emit NVTX labels was not "
                f"checked ({CAPTURE_EXTRA_HINT})")
    backend = _probe(python, _PROBE, "perfdoctor-nvtx-backend", "NVTX", env, package_root)
    if backend == "none":
        raise InputError(f"{python} cannot emit NVTX labels (no `nvtx` module, no NVTX C library): "
                         f"{CAPTURE_EXTRA_HINT}; nothing was started")
    return f"NVTX labels from {python} via {backend}"


def check_torch_profiler(launch: launch_command.Launch, env: Mapping[str, str], package_root: Path) -> str:
    """A note saying which Python will profile itself with torch.profiler (or that it cannot be known);
    InputError when that Python has no torch, or a torch without the Kineto profiler."""
    python = training_python(launch)
    if python is None:
        return (f"cannot tell which Python runs `{launch.program[0]}`: whether it has torch.profiler was not "
                "checked")
    answer = _probe(python, _TORCH_PROBE, "perfdoctor-torch-profiler", "torch.profiler", env, package_root)
    if answer != "kineto":
        raise InputError(f"{python}: this torch has no Kineto profiler (torch.profiler.kineto_available() is False); "
                         "nothing was started")
    return f"PyTorch profiler (Kineto) in {python}"


def _probe(python: str, program: str, tag: str, what: str, env: Mapping[str, str], package_root: Path) -> str:
    """Run ``program`` in the training Python with the training environment; the word it prints after
    ``tag``. InputError when it cannot run or prints no answer (the last line of its stderr says why)."""
    try:
        proc = subprocess.run([python, "-c", program.format(root=str(package_root))], env=dict(env),
                              capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, stdin=subprocess.DEVNULL,
                              start_new_session=True)  # a terminal's Ctrl-C is for perfdoctor to handle
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InputError(f"{python}: cannot run the training Python to check {what} ({exc})") from None
    answer = next((line.split()[1] for line in proc.stdout.splitlines()
                   if line.startswith(f"{tag} ") and len(line.split()) == 2), None)
    if answer is None:
        tail = redact_text((proc.stderr.strip().splitlines() or ["no output"])[-1])
        raise InputError(f"{python}: perfdoctor's capture hook cannot run in the training Python ({tail}); "
                         f"nothing was started")
    return answer
