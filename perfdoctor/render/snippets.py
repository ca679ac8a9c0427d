"""Copy-paste snippets for a finding's knob, one per framework that has it.

A knob (DESIGN §5/§6) names the same setting in each framework: ``megatron_bridge`` (a config path),
``nemo`` (a NeMo 2 recipe path), ``megatron_lm`` (a command-line flag), ``env`` (an environment
variable), with one ``value``. A reader wants the line to paste, not the path: this module writes it
as Python for Megatron-Bridge and NeMo, as a flag for Megatron-LM, and as an ``export`` for the shell.
Pure text in, text out: the HTML, Markdown and terminal renderers (and ``perfdoctor explain``) escape
or fence it themselves.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

FRAMEWORKS = (("megatron_bridge", "Megatron-Bridge", "python"), ("nemo", "NeMo 2", "python"),
              ("megatron_lm", "Megatron-LM", "bash"), ("env", "environment", "bash"))
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Snippet:
    framework: str  # megatron_bridge | nemo | megatron_lm | env
    label: str  # human name of the framework
    language: str  # python | bash: for syntax highlighting of the code block
    code: str


def knob_snippets(knob: dict[str, Any]) -> list[Snippet]:
    """The snippets of one knob, in FRAMEWORKS order, for the frameworks the knob names."""
    value = knob.get("value")
    out = []
    for key, label, language in FRAMEWORKS:
        where = knob.get(key)
        if not where or not isinstance(where, str):
            continue
        code = {"megatron_bridge": _python("cfg", where, value), "nemo": _python("recipe", where, value),
                "megatron_lm": _flag(where, value), "env": _export(where, value)}[key]
        out.append(Snippet(key, label, language, code))
    return out


def python_literal(value: Any) -> str:
    """``value`` as Python source: True/False/None, numbers, quoted strings; strings that already
    look like Python (``True``, ``"bf16"``) pass through."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return "True" if lowered == "true" else "False"
    if lowered in ("none", "null"):
        return "None"
    if re.fullmatch(r"-?\d+(\.\d+)?([eE]-?\d+)?", text.strip()) or text.strip()[:1] in "\"'[{(":
        return text.strip()
    return repr(text)


def _python(root: str, path: str, value: Any) -> str:
    path = path.strip()
    if "=" in path:  # the rule already wrote a statement
        return path
    prefix = f"{root}."
    return f"{path if path.startswith(prefix) else prefix + path} = {python_literal(value)}"


def _flag(flag: str, value: Any) -> str:
    flag = flag.strip()
    if " " in flag or value is None:
        return flag
    if not flag.startswith("-"):
        flag = "--" + flag
    if isinstance(value, bool) or str(value).strip().lower() in ("true", "false"):
        return flag  # a switch: the rule names the flag that enacts the fix, whatever the config value's polarity
    return f"{flag} {shlex.quote(str(value))}"


def _export(name: str, value: Any) -> str:
    name = name.strip()
    if not _ENV_NAME.match(name):
        return name  # already a statement, e.g. "export A=1 B=2"
    text = "" if value is None else (str(int(value)) if isinstance(value, bool) else str(value))
    return f"export {name}={shlex.quote(text)}"
