"""Ctrl-C, SIGTERM and SIGHUP during a capture: one state machine, one answer per phase.

A capture goes through four phases; a signal never raises inside perfdoctor (no KeyboardInterrupt
half-way through writing a file), it is recorded and the phase decides what it means:

========  ==============================================================================================
start     checks before anything runs: nothing is launched; the manifest says so; exit 128 + signal.
training  passed on, as sent and each time, to every process of the run except nsys's own (see
          :mod:`perfdoctor.capture.launcher`): nsys writes its report once its program has ended, and
          a second SIGINT or a SIGHUP would make nsys 2022.4 quit without it. The ``FORCE_AFTER``-th
          signal kills the run at once, and its report is lost (said so).
export    a first SIGINT/SIGHUP lets the export finish (the data is what the user waited for); SIGTERM,
          or any signal after an earlier one, stops the export: its ``nsys export`` is killed and
          waited for, the ``.nsys-rep`` is kept and the manifest says how to export it by hand.
finish    writing the manifest: recorded only.
========  ==============================================================================================

The capture's exit code is the training command's when it is not 0; after a signal it is never 0
but 128 + the first signal's number, as a shell reports a command a signal ended.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from types import FrameType, TracebackType

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
FORCE_AFTER = 3  # signals before the run is killed outright


class Interrupts:
    """Signals received during one capture, the phase each came in, and what the phase does with them."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.phase = "start"
        self.first: signal.Signals | None = None
        self.during: str | None = None  # phase of the first signal
        self.count = 0
        self.first_at: float | None = None
        self._action: Callable[[signal.Signals, int], None] | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> Interrupts:
        self._previous = {s: signal.signal(s, self._handle) for s in HANDLED}
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)  # type: ignore[arg-type]

    def enter(self, phase: str, action: Callable[[signal.Signals, int], None] | None = None) -> None:
        """Move to ``phase``; ``action(signal, count)`` runs for each signal received in it."""
        self.phase, self._action = phase, action

    @property
    def interrupted(self) -> bool:
        return self.first is not None

    @property
    def name(self) -> str | None:
        return self.first.name if self.first is not None else None

    def exit_code(self, training: int | None) -> int:
        """What perfdoctor exits with, given the training command's exit code (None: it never ran)."""
        if training:
            return training
        if self.first is not None:
            return 128 + int(self.first)
        return 0 if training is None else training

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        self.count += 1
        if self.first is None:
            self.first, self.during, self.first_at = sig, self.phase, time.monotonic()
        if self.phase == "start" and self.count == 1:
            self.say(f"{sig.name} before the training command started: it will not be started")
        if self._action is not None:
            self._action(sig, self.count)
