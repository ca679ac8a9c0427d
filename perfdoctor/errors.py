"""Errors that map to exit codes (DESIGN §5): bad input is exit 2 with one line, never a traceback."""

from __future__ import annotations


class PerfdoctorError(Exception):
    """Base class; ``exit_code`` is what the CLI returns."""

    exit_code = 3


class InputError(PerfdoctorError):
    """The user gave us something we cannot read (missing path, not SQLite, not an nsys export...)."""

    exit_code = 2


class UsageError(PerfdoctorError):
    """Options that contradict each other or name unknown things."""

    exit_code = 2


def shown(value: object, limit: int = 60) -> str:
    """A value from the input as a one-line message shows it: ``repr`` (quoted, control characters
    escaped, so a crafted value cannot break the line or the terminal), cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def shown_key(key: str) -> str:
    """A key from the input (a JSON or YAML key) as a message names it: as written when it is short and
    printable, else :func:`shown`."""
    return key if key.isprintable() and len(key) <= 60 else shown(key)
