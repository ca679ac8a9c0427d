"""Copy-paste snippets for a finding's knob, one per framework that has it.

A knob (DESIGN §5/§6) names the same setting in each framework: ``megatron_bridge`` (a config path under
``cfg``), ``nemo`` (a NeMo 2 recipe path, or ``executor.env_vars`` for an environment variable),
``megatron_lm`` (one command-line flag), ``env`` (an environment variable), with one literal ``value``
(``flag_value`` when the flag takes another quantity, e.g. layers per virtual stage instead of the VPP
size). Every line is valid where it is pasted: Python for Megatron-Bridge and NeMo, a flag and a value of
the flag's type for Megatron-LM, an ``export`` for the shell. When the run did not tell the value, the
line is a comment with a typed placeholder (``# --micro-batch-size <int>``), which does nothing when
pasted instead of something that would be accepted and break the run. Pure text in, text out: the
renderers escape or fence it themselves.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

FRAMEWORKS = (("megatron_bridge", "Megatron-Bridge", "python"), ("nemo", "NeMo 2", "python"),
              ("megatron_lm", "Megatron-LM", "bash"), ("env", "environment", "bash"))
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENUM = re.compile(r"^[A-Z][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Snippet:
    framework: str  # megatron_bridge | nemo | megatron_lm | env
    label: str  # human name of the framework
    language: str  # python | bash: for syntax highlighting of the code block
    code: str


def knob_snippets(knob: dict[str, Any]) -> list[Snippet]:
    """The snippets of one knob, in FRAMEWORKS order, for the frameworks the knob names."""
    out = []
    for key, label, language in FRAMEWORKS:
        where = knob.get(key)
        if not where or not isinstance(where, str):
            continue
        code = {"megatron_bridge": _bridge, "nemo": _nemo, "megatron_lm": _flag, "env": _export}[key](where, knob)
        if code:
            out.append(Snippet(key, label, language, code))
    return out


def placeholder(knob: dict[str, Any]) -> str:
    return f"<{knob.get('type') or 'value'}>"


def python_literal(value: Any, knob: dict[str, Any] | None = None) -> str:
    """``value`` as Python source: True/False/None, numbers, quoted strings; an enum member
    (``AttnBackend.flash``) stays a name when the knob says which module to import it from."""
    if isinstance(value, str) and knob and knob.get("python_import") and _ENUM.match(value):
        return value
    return repr(value)


def _assign(target: str, value: Any, knob: dict[str, Any]) -> str:
    if value is None:
        return f"# {target} = {placeholder(knob)}"
    line = f"{target} = {python_literal(value, knob)}"
    return f"{knob['python_import']}\n{line}" if knob.get("python_import") else line


def _bridge(path: str, knob: dict[str, Any]) -> str:
    path = path.strip()
    return _assign(path if path.startswith("cfg.") else f"cfg.{path}", knob.get("value"), knob)


def _nemo(path: str, knob: dict[str, Any]) -> str:
    path = path.strip()
    if path == "executor.env_vars":
        name, value = knob.get("env"), knob.get("value")
        if not name:
            return ""
        if value is None:
            return f'# executor.env_vars["{name}"] = "{placeholder(knob)}"'
        return f"executor.env_vars[{name!r}] = {_env_text(value)!r}"
    return _assign(path if path.startswith("recipe.") else f"recipe.{path}", knob.get("value"), knob)


def _flag(flag: str, knob: dict[str, Any]) -> str:
    flag = flag.strip()
    value = knob["flag_value"] if "flag_value" in knob else knob.get("value")
    if isinstance(value, bool):
        return flag if value else ""  # a switch: present or absent
    if value is None:
        return f"# {flag} {placeholder(knob)}"
    return f"{flag} {shlex.quote(str(value))}"


def _env_text(value: Any) -> str:
    return str(int(value)) if isinstance(value, bool) else str(value)


def _export(name: str, knob: dict[str, Any]) -> str:
    name = name.strip()
    if not _ENV_NAME.match(name):
        return ""
    value = knob.get("value")
    if value is None:
        return f"# export {name}={placeholder(knob)}"
    return f"export {name}={shlex.quote(_env_text(value))}"
