"""User strings made inert for each output: Markdown (GitHub PR comments) and the terminal.

Kernel names, NVTX text, paths, rule texts and metric keys of saved JSON reports come from other
people's files. In Markdown they must not become HTML (``<img onerror>``), break out of a code span
or a table cell, or ping people (``@user``). On a terminal they must not carry escape sequences
(window title, clear screen, hidden text) or other control characters; and rich must never read
them as markup (``[/bold]`` is a crash, not a style).
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.segment import Segment

# Widest line a content-fitted console lays out (a bound, never a wrap width in practice).
FIT_MAX_WIDTH = 4096
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+!|~>-])")
# GitHub turns "@name" into a mention (a notification) even inside escaped text: a zero-width space
# after "@" keeps the text as shown and breaks the mention (what Renovate and Dependabot do).
_MENTION_BREAK = "@&#8203;"

# ESC sequences first (CSI "ESC [ ... final", OSC "ESC ] ... BEL|ST", other two-byte ESC x), then
# any remaining C0/C1 control, DEL, and bidirectional overrides that reorder what is displayed.
_ESC_SEQUENCE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]?|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x9b[0-?]*[ -/]*[@-~]?"
                           r"|\x9d[^\x07\x1b\x9c]*(?:\x07|\x9c)?|\x1b[@-_]?")
_CONTROL_KEEP_NEWLINE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def md(text: Any) -> str:
    """A user string as inert Markdown text on one line: HTML escaped, Markdown punctuation
    backslash-escaped (so ``|`` cannot end a table cell), mentions broken."""
    escaped = html.escape(terminal_text(str(text)), quote=False).replace("\r", " ").replace("\n", " ")
    return _MD_SPECIAL.sub(r"\\\1", escaped).replace("@", _MENTION_BREAK)


def code_span(text: Any) -> str:
    """A user string as an inline code span, safe inside a table cell: the fence is one backtick
    longer than any backtick run in the text (CommonMark), pipes are escaped (GFM tables split
    cells on them even inside code), and newlines become spaces. Code spans never render HTML or
    mentions, so nothing else needs escaping."""
    body = terminal_text(str(text)).replace("\r", " ").replace("\n", " ").replace("|", "\\|")
    longest = max((len(m) for m in re.findall(r"`+", body)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if body.startswith(("`", " ")) or body.endswith(("`", " ")) else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def code_block(code: str, language: str = "") -> str:
    """A fenced block whose fence is longer than any backtick run inside it."""
    longest = max((len(m) for m in re.findall(r"`+", code)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{language}\n{code}\n{fence}"


def terminal_text(text: str) -> str:
    """``text`` without escape sequences, control characters (newlines and tabs kept) or bidi
    overrides."""
    if text.isprintable():  # the common case: nothing to strip
        return text
    return _CONTROL_KEEP_NEWLINE.sub("", _ESC_SEQUENCE.sub("", text))


class SafeConsole(Console):
    """A rich Console whose text is stripped of control characters as it is written, so no user
    string reaches the terminal raw, whichever renderable carried it (tables, panels, progress).
    rich's own styling travels in the segments' styles and control codes, which are kept."""

    def __init__(self, *args: Any, fit_content: bool = False, **kwargs: Any) -> None:
        if fit_content:
            kwargs["width"] = FIT_MAX_WIDTH
        super().__init__(*args, **kwargs)
        self.fit_content = fit_content

    def print(self, *objects: Any, **kwargs: Any) -> None:
        """With ``fit_content`` (output that is not a terminal, no ``COLUMNS``), each renderable is laid out
        as wide as its content, so no line is wrapped at an arbitrary width (logs, ``| less``, ``> file``)."""
        if self.fit_content and objects and "width" not in kwargs:
            options = self.options.update(max_width=FIT_MAX_WIDTH)
            kwargs["width"] = max(Measurement.get(self, options, o).maximum for o in objects) or 1
        super().print(*objects, **kwargs)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control else Segment(terminal_text(segment.text), segment.style)
            for segment in buffer)


def safe_console(**kwargs: Any) -> Console:
    """The Console every perfdoctor command prints with (see :class:`SafeConsole`). Emoji codes are off:
    a kernel or range named ``:fire:`` prints as written (and rich's emoji table is not imported)."""
    kwargs.setdefault("emoji", False)
    return SafeConsole(**kwargs)


def output_console(**kwargs: Any) -> Console:
    """The console for a command's report: the terminal's width on a terminal; ``COLUMNS`` where set;
    otherwise (a pipe, a file) as wide as the content, never a fixed 80 columns."""
    console = safe_console(**kwargs)
    if console.is_terminal or os.environ.get("COLUMNS", "").strip().isdigit():
        return console
    return safe_console(fit_content=True, **kwargs)
