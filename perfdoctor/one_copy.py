"""One copy of each string among the results the ranks' tasks send back.

Each result arrives pickled on its own, so every rank brings its own copy of the same metric names,
category and kernel names, evidence keys, environment and table names of its file: at a thousand ranks
the copies were a fifth of what the process that assembles the report held. Strings (and sets of them)
are swapped for the first copy seen; containers are rebuilt in the same order, and nothing else changes
(numbers, arrays and other objects are kept as they are).
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any


def one_copy(value: Any, seen: dict[Any, Any]) -> Any:
    """``value`` with every string (dict keys included) of plain dicts, lists and tuples, and every
    frozenset, replaced by its copy in ``seen`` (added when new)."""
    kind = type(value)
    if kind is str or kind is frozenset:  # an equal frozenset unpickled alike iterates alike
        return seen.setdefault(value, value)
    if kind is dict:
        return {one_copy(k, seen): one_copy(v, seen) for k, v in value.items()}
    if kind is list:
        return [one_copy(v, seen) for v in value]
    if kind is tuple:
        return tuple(one_copy(v, seen) for v in value)
    return value


def one_copy_fields(obj: Any, seen: dict[Any, Any]) -> None:
    """:func:`one_copy` on each field of the dataclass ``obj``, in place."""
    assert is_dataclass(obj)
    for f in fields(obj):
        setattr(obj, f.name, one_copy(getattr(obj, f.name), seen))
