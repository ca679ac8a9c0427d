"""Progress for ``api.analyze(progress=...)`` without importing rich unless something is shown.

Why a module of its own: ``perfdoctor analyze --format json`` of one file (stderr a pipe or a log) prints
no progress at all, yet importing the terminal renderer pulled rich's console into every such start-up.
Where stderr may be a terminal (rich would say so), the decision and the bar stay rich's
(:func:`perfdoctor.render.terminal.analysis_progress`); otherwise the once-per-10 % log lines create
their console at the first line printed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def may_be_terminal() -> bool:
    """False only where rich's ``Console(stderr=True).is_terminal`` is certainly False: stderr is not a
    tty and neither variable that makes rich call it one is set (FORCE_COLOR non-empty,
    TTY_COMPATIBLE=1); inside IPython rich decides (its Jupyter check)."""
    if os.environ.get("FORCE_COLOR") or os.environ.get("TTY_COMPATIBLE") == "1" or "IPython" in sys.modules:
        return True
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


@contextmanager
def analysis_progress() -> Iterator[Callable[[int, int, str], None] | None]:
    """The terminal renderer's progress where stderr may be a terminal; log lines otherwise."""
    if may_be_terminal():
        from perfdoctor.render.terminal import analysis_progress as rich_progress

        with rich_progress() as update:
            yield update
        return
    console: list[Any] = []

    def update(done: int, total: int, what: str) -> None:
        if not console and total >= 10:  # fewer tasks print nothing (_every_tenth)
            from perfdoctor.render.escape import safe_console
            from perfdoctor.render.terminal import _every_tenth

            console.append(_every_tenth(safe_console(stderr=True)))
        if console:
            console[0](done, total, what)

    yield update
