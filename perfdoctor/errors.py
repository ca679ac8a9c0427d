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
