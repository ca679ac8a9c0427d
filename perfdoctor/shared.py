"""One copy of each name among the results the ranks' tasks send back.

Each result arrives pickled on its own, so every rank would bring its own copy of the same metric names,
category and kernel names, evidence keys, environment and table names of its file: at a thousand ranks
the copies were a fifth of what the process that assembles the report held. So a task's result is
pickled with every string (and set of strings) as a reference to itself, and the receiving side resolves
each reference to the first copy it has seen: the same objects as a plain pickle gives, equal in value,
with one copy of each name, and nothing rebuilt after loading.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

# Protocol 4: from protocol 5 on, numpy arrays are loaded as views of their pickled bytes (an extra object
# each, ~100 bytes, as much as a short array's data).
PROTOCOL = 4


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        kind = type(obj)
        return obj if kind is str or kind is frozenset else None


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, seen: dict[Any, Any]) -> None:
        super().__init__(io.BytesIO(data))
        self._seen = seen

    def persistent_load(self, pid: Any) -> Any:  # an equal frozenset unpickled alike iterates alike
        return self._seen.setdefault(pid, pid)


def dumps(obj: Any) -> bytes:
    """``obj`` pickled with its strings and frozensets as references (see :func:`loads`)."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=PROTOCOL).dump(obj)
    return buffer.getvalue()


def loads(data: bytes, seen: dict[Any, Any]) -> Any:
    """What :func:`dumps` pickled, each string and frozenset the copy in ``seen`` (added when new)."""
    return _Unpickler(data, seen).load()
