"""perfdoctor's own NVTX labels (DESIGN §4): parse ``kind key=value ...`` messages and capture marks.

Only ranges and marks in the ``perfdoctor`` domain count; anything else is somebody else's label.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from perfdoctor.config_values import MAX_SIZE, value_problem, world_problem
from perfdoctor.errors import InputError, shown, shown_key
from perfdoctor.memo import per_object
from perfdoctor.table import Table, factorize

if TYPE_CHECKING:
    from perfdoctor.model import Timeline

DOMAIN = "perfdoctor"
RANK_FIELDS = ("r", "local", "world")

def parse_label(text: str) -> tuple[str, dict[str, str]]:
    """``"comm op=all_reduce group=dp"`` → ``("comm", {"op": "all_reduce", "group": "dp"})``."""
    kind, _, rest = text.partition(" ")
    fields = {}
    for token in rest.split():
        key, eq, value = token.partition("=")
        if eq:
            fields[key] = value
    return kind, fields


def labelled(nvtx: Table, kind: str) -> Table:
    """Rows of ``nvtx`` in the perfdoctor domain whose message starts with ``kind``."""
    return nvtx.take(labelled_rows(nvtx, kind))


def labelled_rows(nvtx: Table, kind: str) -> np.ndarray:
    """Positions in ``nvtx`` of :func:`labelled`'s rows.

    Messages repeat (every step, every layer), so each distinct message's kind is found once per table
    and each call compares kinds, not messages.
    """
    if not len(nvtx):
        return np.zeros(0, dtype=np.int64)
    rows = _our_rows(nvtx)
    if not rows.size:  # no perfdoctor domain (most exports): no message's kind is needed
        return rows
    codes, _ = message_codes(nvtx)
    return rows[_message_kinds(nvtx)[codes[rows]] == kind]


def matching(nvtx: Table, pattern: re.Pattern[str]) -> Table:
    """Rows of ``nvtx`` (any domain) whose message matches ``pattern``; each distinct message tested once."""
    if not len(nvtx) or not any_message(nvtx, pattern):
        return nvtx.take(np.zeros(0, dtype=np.int64))
    codes, uniques = message_codes(nvtx)
    hit = np.array([isinstance(t, str) and bool(pattern.match(t)) for t in uniques] + [False])
    return nvtx.take(np.flatnonzero(hit[codes]))


def any_message(nvtx: Table, pattern: re.Pattern[str]) -> bool:
    """Whether ``pattern`` can match (``match`` or ``search``) any distinct message: one scan of all of
    them joined by newlines with ``^``/``$`` at line ends, instead of one call per message. It can answer
    yes for none (a match across two messages), never no for one, for patterns without string anchors
    (``\\A``, ``\\Z``)."""
    return _line_search(pattern.pattern, pattern.flags)(_joined(nvtx)) is not None


def any_word(nvtx: Table, words: tuple[str, ...]) -> bool | None:
    """Whether any distinct message holds one of the lower-case ``words``, ignoring case; None where a
    message is not ASCII (outside ASCII, a case-insensitive pattern matches more than ``str.lower`` finds:
    the Kelvin sign for k, a dotless i for i), so the caller searches with its pattern instead."""
    joined = _joined(nvtx)
    if not joined.isascii():
        return None
    lower = joined.lower()
    return any(word in lower for word in words)


@functools.cache
def _line_search(text: str, flags: int) -> Callable[[str], re.Match[str] | None]:
    """``re.compile(text, flags | MULTILINE).search`` over the newline-joined messages, answering alike.

    A pattern anchored at a line start (``^`` first, before any top-level ``|``) is searched as a newline
    followed by the rest, in the joined text with a newline in front: a line starts at p exactly where
    that text holds a newline at p, and the engine looks for that one character instead of trying the
    anchor at every position (about ten times faster on 300 KB of operator ranges)."""
    multiline = re.compile(text, flags | re.MULTILINE)
    if not text.startswith("^") or "(?<" in text or flags & re.VERBOSE or not _whole_at_line_start(text, flags):
        return multiline.search  # (a lookbehind could see the newline)
    after_newline = re.compile(f"\n(?:{text[1:]})", flags | re.MULTILINE).search
    return lambda joined: after_newline("\n" + joined)


def _whole_at_line_start(text: str, flags: int) -> bool:
    """Whether the ``^`` that ``text`` starts with anchors all of it, not one alternative of a top-level ``|``
    (the interpreter's own pattern parser says; where its private form is not the one known here, no)."""
    try:
        from re import _constants as constants  # type: ignore[attr-defined]  # CPython 3.11+
        from re import _parser as parser  # type: ignore[attr-defined]
    except ImportError:  # 3.10
        import sre_constants as constants
        import sre_parse as parser
    try:
        data = parser.parse(text, flags).data
        return bool(data) and data[0] == (constants.AT, constants.AT_BEGINNING)
    except Exception:  # noqa: BLE001  # a parser of another shape: the plain search answers
        return False


@per_object
def _joined(nvtx: Table) -> str:
    return "\n".join(message_codes(nvtx)[1])


@per_object
def message_codes(nvtx: Table) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the index of its message among the table's distinct messages (−1: no text, which
    indexes one past the end), and those messages: one hash pass per table, then per-message work."""
    codes, uniques = factorize(nvtx.col("text", dtype=object))
    return codes, np.asarray(uniques, dtype=object)


@per_object
def _message_kinds(nvtx: Table) -> np.ndarray:
    """The kind (first word) of each distinct message, ``None`` for no text (last: code −1)."""
    _, uniques = message_codes(nvtx)
    return np.array([t.partition(" ")[0] if isinstance(t, str) else None for t in uniques] + [None], dtype=object)


@per_object
def _our_rows(nvtx: Table) -> np.ndarray:
    """Rows of the perfdoctor domain, once per table."""
    return np.flatnonzero(nvtx.col("domain", dtype=object) == DOMAIN)


def rank_mark(timeline: Timeline) -> dict[str, int] | None:
    """The ``rank r=.. local=.. world=..`` mark of a process, if the capture hook wrote one; a mark whose
    numbers are not ranks (text, negative, beyond :data:`MAX_SIZE`) is a damaged file."""
    for text in labelled(timeline.nvtx, "rank")["text"]:
        _, fields = parse_label(text)
        mark = {}
        for key in RANK_FIELDS:
            if key not in fields:
                continue
            value = fields[key]
            low = 1 if key == "world" else 0
            if not (value.isascii() and value.isdigit() and len(value) <= 7 and low <= int(value) <= MAX_SIZE):
                raise InputError(f"{timeline.trace.path}: NVTX mark {shown(text, 80)}: {key}={shown(value)} is not a "
                                 f"whole number from {low} to {MAX_SIZE:,}")
            mark[key] = int(value)
        return mark
    return None


def config_mark(timeline: Timeline) -> dict[str, Any]:
    """The ``config {json}`` mark of a process (parallel and model config known at capture time); a mark
    that is not a JSON object of valid values (perfdoctor.config_values) is a damaged file."""
    for text in labelled(timeline.nvtx, "config")["text"]:
        where = f"{timeline.trace.path}: NVTX mark {shown(text, 80)}"
        try:
            value = json.loads(text.partition(" ")[2], parse_constant=_not_a_number)
        except (json.JSONDecodeError, ValueError, RecursionError) as exc:
            raise InputError(f"{where}: not a JSON object ({str(exc).splitlines()[0]})") from None
        if not isinstance(value, dict):
            raise InputError(f"{where}: not a JSON object of config values")
        for key, item in value.items():
            if problem := value_problem(key, item):
                raise InputError(f"{where}: {shown_key(key)}: {problem}")
        if problem := world_problem(value):
            raise InputError(f"{where}: {problem}")
        return value
    return {}


def _not_a_number(name: str) -> Any:
    raise ValueError(f"{name} is not a number")
