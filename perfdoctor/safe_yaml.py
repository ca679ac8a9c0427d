"""Bounded readers for the YAML and JSON files users hand perfdoctor (rule files, configs, saved reports).

A safe loader already refuses to run code; these add bounds on what a hostile file can cost:
- regular files only, opened without blocking (a FIFO named ``x.yaml`` would wait for a writer
  forever, a link to ``/dev/zero`` never ends);
- a size limit, read with one bounded ``read``;
- YAML: a nesting-depth limit and an alias-expansion limit, both checked on libyaml's event stream
  before anything is built. libyaml's composer recurses in C, so a deeply nested 100 kB file
  crashes the interpreter (SIGSEGV, nothing on stderr) if it reaches it; and aliases referring to
  aliases ("billion laughs") expand exponentially in whatever walks the loaded data afterwards;
- JSON: a depth limit (the decoder recurses), NaN and Infinity refused (not JSON; they would reach
  the renderers as numbers).

Every failure is an :class:`~perfdoctor.errors.InputError` (exit 2) whose one line names the file.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from perfdoctor.errors import InputError

MAX_BYTES = 1 << 20  # a rule file or config is a few kB; the whole shipped catalog is < 100 kB
MAX_DEPTH = 64  # a rule's conditions nest a handful of levels
MAX_NODES = 100_000  # scalars + collections after expanding every alias

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when PyYAML was built with it; same subset


def read_regular_file(path: Path, max_bytes: int = MAX_BYTES, error: type[InputError] = InputError) -> bytes:
    """The bytes of ``path`` if it is a regular file (after symlinks) of at most ``max_bytes``. A
    package resource that is no file on disk (the shipped rules inside a zip) is read through its
    Traversable, within the same limit."""
    if not isinstance(path, (str, os.PathLike)):
        try:
            with path.open("rb") as fh:
                data = fh.read(max_bytes + 1)
        except OSError as exc:
            raise error(f"{path}: cannot read ({exc.strerror or exc})") from None
        if len(data) > max_bytes:
            raise error(f"{path}: larger than the {max_bytes:,}-byte limit")
        return data
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path}: not a regular file")
        if st.st_size > max_bytes:
            raise error(f"{path}: {st.st_size:,} bytes, larger than the {max_bytes:,}-byte limit")
        chunks, left = [], max_bytes + 1  # a file growing while read still stops at the limit
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 16))):
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise error(f"{path}: larger than the {max_bytes:,}-byte limit")
    return data


def load_yaml_file(path: Path, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH,
                   max_nodes: int = MAX_NODES, error: type[InputError] = InputError) -> Any:
    """Parse a user's YAML file with the safe loader, within the bounds above; ``error`` is the
    InputError subclass to raise (e.g. RuleError)."""
    raw = read_regular_file(path, max_bytes, error)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: cannot read ({exc})") from None
    try:
        _check_events(text, max_depth, max_nodes)
        return yaml.load(text, Loader=_LOADER)
    except _Bound as exc:
        raise error(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "<yaml>"
        raise error(f"{path}: {where}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    except (RecursionError, MemoryError, ValueError, OverflowError) as exc:  # e.g. a timestamp out of range
        raise error(f"{path}: not valid YAML ({type(exc).__name__}: {exc})") from None


def load_trusted_yaml(text: str) -> Any:
    """Parse YAML that ships inside the package (the tests check it) with the same safe loader, without
    the bounds a user's file needs: bounding is a second parse, paid at every start-up."""
    return yaml.load(text, Loader=_LOADER)


class _Bound(Exception):
    """A YAML file over one of the limits (message: which)."""


def _check_events(text: str, max_depth: int, max_nodes: int) -> None:
    """Walk libyaml's event stream (flat, no recursion) measuring depth and the node count after
    alias expansion; raise :class:`_Bound` past a limit."""
    anchors: dict[str, int] = {}
    stack: list[list[Any]] = [[None, 0]]  # [anchor, expanded nodes inside] per open collection
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            if len(stack) > max_depth:
                raise _Bound(f"nested deeper than {max_depth} levels")
            stack.append([event.anchor, 0])
            continue
        if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            anchor, inner = stack.pop()
            size = 1 + inner
        elif isinstance(event, yaml.ScalarEvent):
            anchor, size = event.anchor, 1
        elif isinstance(event, yaml.AliasEvent):
            anchor, size = None, anchors.get(event.anchor, 1)
        else:
            continue
        if anchor is not None:
            anchors[anchor] = size
        stack[-1][1] += size
        if stack[-1][1] > max_nodes:
            raise _Bound(f"more than {max_nodes:,} values once aliases are expanded (an alias bomb?)")


def load_json_file(path: Path, max_bytes: int, error: type[InputError] = InputError) -> Any:
    """Parse a user's JSON file: regular file, at most ``max_bytes``, no NaN/Infinity, bounded depth."""
    raw = read_regular_file(path, max_bytes, error)
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constant, parse_float=_finite)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        raise error(f"{path}: not valid JSON ({exc})") from None
    except RecursionError:
        raise error(f"{path}: not valid JSON (nested too deeply)") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:20]} overflows a double")
    return value
