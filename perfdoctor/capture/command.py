"""Where ``nsys profile`` goes in the user's launch command, and what its reports are called.

A launch is a chain: ``[srun OPTS] [torchrun OPTS | python -m torch.distributed.run OPTS] PROGRAM``.
nsys profiles the process it starts and that process's children, so its place decides what one
report holds (research/megatron.md §3.2, research/nsys_schema.md §7.1):

* **per node**: nsys in front of the process that starts a node's ranks (torchrun, or the whole
  command on one machine): one report per node, ``node-<host>.nsys-rep``.
* **per rank**: nsys in front of each rank's program. torchrun then runs with ``--no-python`` and
  starts ``nsys profile ... python train.py``; srun starts ``nsys profile ...`` as its task. Reports
  are named by the rank's environment (``%q{RANK}`` under torchrun, ``%q{SLURM_PROCID}`` under srun).

When only some ranks are profiled, the per-rank program is a tiny ``sh`` that execs nsys for those
ranks and the program alone for the others.
"""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from perfdoctor.errors import UsageError

# torchrun's options that take no value (torch.distributed.run's parser, torch 2.x); every other
# option takes one, given as --opt=VALUE or --opt VALUE.
TORCHRUN_FLAGS = {"-h", "--help", "--standalone", "-m", "--module", "--no-python", "--no_python", "--run-path",
                  "--run_path", "--virtual-local-rank", "--virtual_local_rank", "--use-env", "--use_env"}
# srun's options that take no value; those with an optional value must spell it --opt=VALUE.
SRUN_FLAGS = {"-h", "--help", "--usage", "-V", "--version", "-v", "--verbose", "-Q", "--quiet", "-l", "--label",
              "-u", "--unbuffered", "-O", "--overcommit", "-E", "--preserve-env", "-H", "--hold", "-X",
              "--disable-status", "-Z", "--no-allocate", "-s", "--oversubscribe", "--pty", "--multi-prog",
              "--exclusive", "--test-only", "--spread-job", "--use-min-nodes", "--contiguous", "--exact",
              "--whole", "--overlap", "-k", "--no-kill", "-K", "--kill-on-bad-exit", "--quit-on-interrupt",
              "-I", "--immediate", "--reboot", "--jobid-in-env"}
TORCHRUN_MODULES = {"torch.distributed.run", "torch.distributed.launch"}


@dataclass(frozen=True)
class Launch:
    """The user's command split into its launchers and the program each rank runs."""

    srun: list[str]  # "srun OPTS" (empty when not under srun)
    torchrun: list[str]  # "torchrun OPTS" or "python -m torch.distributed.run OPTS" (empty when absent)
    program: list[str]  # what a rank runs: torchrun's script and args, or srun's task, or the command

    @property
    def per_rank_default(self) -> bool:
        """srun without torchrun starts every rank itself: there is no per-node process to wrap."""
        return bool(self.srun) and not self.torchrun


def parse_launch(argv: list[str]) -> Launch:
    """Split ``argv``. Raises UsageError when a launcher is given no program."""
    if not argv:
        raise UsageError("no command to capture: put it after `--`, e.g. `perfdoctor capture -- torchrun train.py`")
    srun: list[str] = []
    rest = argv
    if Path(argv[0]).name == "srun":
        cut = _first_positional(argv, 1, SRUN_FLAGS)
        srun, rest = argv[:cut], argv[cut:]
        if not rest:
            raise UsageError("srun is given no program to run")
    start = _torchrun_start(rest)
    if start is None:
        return Launch(srun, [], list(rest))
    cut = _first_positional(rest, start, TORCHRUN_FLAGS)
    if cut >= len(rest):
        raise UsageError("torchrun is given no training script")
    return Launch(srun, list(rest[:cut]), list(rest[cut:]))


def _torchrun_start(argv: list[str]) -> int | None:
    """Index of torchrun's first option, or None when ``argv`` does not start torchrun."""
    if not argv:
        return None
    if Path(argv[0]).name == "torchrun":
        return 1
    if is_python(argv[0]) and len(argv) >= 3 and argv[1] == "-m" and argv[2] in TORCHRUN_MODULES:
        return 3
    return None


def is_python(exe: str) -> bool:
    name = Path(exe).name
    return name.startswith("python") and all(c.isdigit() or c == "." for c in name[len("python"):])


def _first_positional(argv: list[str], start: int, flags: set[str]) -> int:
    i = start
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return i + 1
        if not arg.startswith("-") or arg == "-":
            return i
        if "=" in arg or arg in flags or (len(arg) > 2 and not arg.startswith("--")):  # -n8 style
            i += 1
        else:
            i += 2
    return i


def torchrun_python(torchrun: list[str]) -> str:
    """The interpreter torchrun starts ranks with: its own (``PYTHON_EXEC`` overrides, as in torchrun)."""
    if os.environ.get("PYTHON_EXEC"):
        return os.environ["PYTHON_EXEC"]
    if is_python(torchrun[0]):
        return shutil.which(torchrun[0]) or torchrun[0]
    path = shutil.which(torchrun[0])
    if path:
        try:
            with open(path, "rb") as fh:
                first = fh.readline(512).decode(errors="replace").strip()
        except OSError:
            first = ""
        if first.startswith("#!") and is_python(first[2:].split()[0] if first[2:].split() else ""):
            return first[2:].split()[0]
    return shutil.which("python3") or "python3"


def wrap(launch: Launch, nsys: list[str], *, per_rank: bool, ranks: list[int] | None) -> list[str]:
    """The full command with ``nsys`` (``nsys profile ... --output=...``, no program) inserted.

    ``ranks``: the ranks to profile (None: all). Per node, every rank of a node shares one nsys, so
    the selection is left to the hook (it only labels, starts the profiler and records memory on
    selected ranks).
    """
    if not per_rank:
        if launch.per_rank_default:
            raise UsageError("--per-node needs a launcher that starts a node's ranks (torchrun); under srun "
                             "alone every task is one rank: use --per-rank")
        return [*launch.srun, *nsys, *launch.torchrun, *launch.program]
    if launch.torchrun:
        opts, program = _rank_program_of_torchrun(launch)
        return [*launch.srun, *opts, *_select(nsys, program, ranks, "RANK")]
    if launch.srun:
        return [*launch.srun, *_select(nsys, launch.program, ranks, "SLURM_PROCID")]
    return [*nsys, *launch.program]  # a single process is its own rank


def _rank_program_of_torchrun(launch: Launch) -> tuple[list[str], list[str]]:
    """torchrun's options with ``--no-python`` added, and the per-rank program it must then start."""
    opts = list(launch.torchrun)
    head = 3 if is_python(opts[0]) and len(opts) > 1 and opts[1] == "-m" else 1
    given = set(opts[head:])
    no_python = bool(given & {"--no-python", "--no_python"})
    module = bool(given & {"-m", "--module"})
    opts = [o for o in opts[:head]] + [o for o in opts[head:] if o not in {"-m", "--module", "--run-path",
                                                                          "--run_path"}]
    if no_python:
        return opts, list(launch.program)
    python = torchrun_python(launch.torchrun)
    program = [python, "-m", *launch.program] if module else [python, *launch.program]
    return [*opts, "--no-python"], program


def _select(nsys: list[str], program: list[str], ranks: list[int] | None, rank_var: str) -> list[str]:
    if ranks is None:
        return [*nsys, *program]
    cases = "|".join(str(r) for r in ranks)
    script = f'case "${{{rank_var}}}" in {cases}) exec {shlex.join(nsys)} "$@";; *) exec "$@";; esac'
    return ["/bin/sh", "-c", script, "perfdoctor-rank", *program]


def report_pattern(launch: Launch, *, per_rank: bool) -> str:
    """The ``-o`` name (without folder) of each report."""
    if not per_rank:
        return "node-%h"
    if launch.torchrun:
        return "rank%q{RANK}"
    if launch.srun:
        return "rank%q{SLURM_PROCID}"
    return "rank0"
