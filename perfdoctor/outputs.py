"""Where perfdoctor's outputs go: never onto an input, and never half written.

An output path is checked against every file the command reads before anything is computed: the
paths given, every file below a run directory or a ``--rules`` directory, through symlinks (the
resolved path) and hard links (the same ``(st_dev, st_ino)``). A clash is exit 2 with one line, so
``perfdoctor analyze x.sqlite -o x.sqlite`` cannot turn an export into a text file.

Regular files are written atomically: a temporary file in the same directory, then ``os.replace``;
an interrupted or failed write (full disk, Ctrl-C) leaves the old file, or nothing, never half a
report. Outputs that are not regular files (``/dev/stdout``, a FIFO, a terminal) are written in
place, since they cannot be renamed over.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from perfdoctor.errors import UsageError

# A run directory is walked to find what the command reads; beyond this many entries it is not a run
# directory a user meant (and the walk itself would be unbounded), so only the given paths count.
MAX_WALK = 100_000


def input_files(paths: Iterable[Path]) -> list[Path]:
    """Every file a command may read from ``paths``: the files themselves and all files below the
    directories (run directories, rule directories)."""
    out: list[Path] = []
    for path in paths:
        out.append(path)
        if path.is_dir():
            for seen, below in enumerate(path.rglob("*")):
                if seen >= MAX_WALK:
                    break
                out.append(below)
    return out


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()  # follows symlinks: a link to an input is that input
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _real(path: Path) -> str:
    return os.path.realpath(path)


def check_outputs(outputs: dict[str, Path | None], inputs: Iterable[Path]) -> None:
    """Refuse (exit 2) any output that is an input, or the same file as another output.

    ``outputs`` maps the option name (``--html``...) to its path; None entries are absent options.
    """
    given = {name: path for name, path in outputs.items() if path is not None}
    if not given:
        return
    by_id: dict[tuple[int, int], Path] = {}
    by_real: dict[str, Path] = {}
    for path in input_files(inputs):
        ident = _identity(path)
        if ident is not None:
            by_id.setdefault(ident, path)
        by_real.setdefault(_real(path), path)
    claimed: dict[str, str] = {}
    for name, path in given.items():
        ident, real = _identity(path), _real(path)
        if ident is not None and stat.S_ISCHR(path.stat().st_mode):
            continue  # /dev/null, /dev/stdout, a terminal: not a file anyone reads back
        hit = by_id.get(ident) if ident is not None else None
        hit = hit or by_real.get(real)
        if hit is not None:
            same = "" if hit == path else f" (the same file as input {hit})"
            raise UsageError(f"{name} {path}: is an input of this command{same}; refusing to overwrite it")
        if real in claimed:
            raise UsageError(f"{name} {path}: the same file as {claimed[real]}; give each output its own file")
        claimed[real] = name


# Called with a ``write(text)`` function: writes an output piece by piece (a large report is never one string).
Fill = Callable[[Callable[[str], object]], None]


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (see :func:`write_stream`)."""
    write_stream(path, lambda write: write(text))


def write_stream(path: Path, fill: Fill) -> None:
    """Write what ``fill`` writes to ``path`` atomically when it is (or will be) a regular file; in place
    when it is a device or FIFO. OSError becomes a one-line :class:`UsageError` (exit 2)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise UsageError(f"{path}: cannot write ({exc.strerror})") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{path}: is a directory, not a file to write")
        _write_in_place(path, fill)
        return
    target = Path(_real(path))  # replace the file a symlink points to, keep the link
    mode = (st.st_mode & 0o7777) if st is not None else 0o666 & ~_umask()
    import tempfile  # not at import time: `perfdoctor --help` stays fast

    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fill(fh.write)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        raise UsageError(f"{path}: cannot write ({exc.strerror or exc})") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _write_in_place(path: Path, fill: Fill) -> None:
    try:
        with path.open("w", encoding="utf-8") as fh:
            fill(fh.write)
    except OSError as exc:
        raise UsageError(f"{path}: cannot write ({exc.strerror or exc})") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_stdout(text: str) -> None:
    """Write to stdout; a closed, full or broken stdout is exit 2 with one line (see :func:`flush_stdout`)."""
    stream_stdout(lambda write: write(text))


def stream_stdout(fill: Fill) -> None:
    """Write what ``fill`` writes to stdout (see :func:`write_stdout`)."""
    if sys.stdout is None:
        raise UsageError("stdout is closed: give --output FILE")
    try:
        fill(sys.stdout.write)
        sys.stdout.flush()
    except OSError as exc:
        raise stdout_error(exc) from None


def flush_stdout() -> None:
    """Flush stdout before exiting, so a write error becomes one line and exit 2 instead of
    "Exception ignored" at interpreter shutdown; the dead stream is swapped for /dev/null."""
    if sys.stdout is None:
        return
    try:
        sys.stdout.flush()
    except OSError as exc:
        _silence_stdout()
        raise stdout_error(exc) from None
    except ValueError:  # already closed
        pass


def stdout_error(exc: OSError) -> UsageError:
    """The one-line error for a stdout that cannot be written (closed, full, broken pipe)."""
    _silence_stdout()
    return UsageError(f"cannot write to stdout ({exc.strerror or exc}): give --output FILE")


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
