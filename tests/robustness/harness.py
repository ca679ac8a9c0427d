"""Run perfdoctor as a user would, inside a box: a wall-clock timeout and an address-space limit, so a
hang or a bomb fails its test instead of taking the (shared) machine down."""

from __future__ import annotations

import hashlib
import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.paths import REPO

TIMEOUT_S = 120
MEMORY_BYTES = 3 << 30  # the largest honest input here needs < 1 GiB


@dataclass
class Result:
    code: int
    out: str
    err: str


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash must not write a core file


def perfdoctor(*args: str | Path, timeout: float = TIMEOUT_S, stdout=subprocess.PIPE,
               env: dict[str, str] | None = None) -> Result:
    """``python -m perfdoctor ARGS`` from the repository root (this checkout's package); ``env``: added to
    this process's environment."""
    proc = subprocess.run([sys.executable, "-m", "perfdoctor", *map(str, args)], cwd=REPO, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, errors="replace", timeout=timeout, preexec_fn=_limits,
                          env=None if env is None else {**os.environ, **env})
    return Result(proc.returncode, proc.stdout or "", proc.stderr)


def assert_bad_input(result: Result, needle: str = "") -> None:
    """Exit 2, one line on stderr starting ``perfdoctor:``, no traceback."""
    assert result.code == 2, (result.code, result.err[-2000:])
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("perfdoctor: "), result.err[-2000:]
    assert needle in lines[0], lines[0]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
