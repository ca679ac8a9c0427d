"""Ctrl-C in the CLI: always exit 130 with one line, never a traceback, never exit 0.

Python raises KeyboardInterrupt wherever the main thread happens to be. When that is a finaliser
(``__del__``, a weakref or GC callback, a sqlite3 cursor being freed) the exception is *ignored*:
Python prints "Exception ignored ... KeyboardInterrupt" and the command carries on, finishing
with exit 0 as if nothing happened. The handler below records the signal before raising, so the
CLI can still exit 130 afterwards, and the unraisable hook keeps that interrupt off stderr.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

_received = False


def install() -> None:
    """Install the SIGINT handler and the quiet unraisable hook (the CLI's entry point calls this)."""
    global _received
    _received = False
    try:
        signal.signal(signal.SIGINT, _on_sigint)
    except ValueError:  # not the main thread (the CLI called from a worker): keep Python's default
        return
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            return  # recorded by _on_sigint; the CLI exits 130 at the end
        previous(unraisable)

    sys.unraisablehook = hook


def received() -> bool:
    """Whether Ctrl-C was pressed since :func:`install`."""
    return _received


def _on_sigint(signum: int, frame: Any) -> None:
    global _received
    _received = True
    raise KeyboardInterrupt
