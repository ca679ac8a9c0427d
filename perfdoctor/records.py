"""Byte strings kept out of memory until they are read: what the process that assembles a report holds
per rank while a thousand ranks' tasks come back (DESIGN §1 "Execution").

Each task's result arrives as bytes; held as they came, or as the objects they load to, they grow the
process by tens of KB a rank while the pool's workers are still running beside it, so the peak grew with
the number of ranks. Written to an unnamed temporary file (``tempfile.TemporaryFile`` in ``$TMPDIR``,
unlinked at once, as perfdoctor.load.pieces spills rows) and read back by number when their turn comes,
they cost two integers each in memory.
"""

from __future__ import annotations

import os
import tempfile
from array import array
from collections.abc import Callable, Collection, Iterator, Mapping
from functools import lru_cache
from typing import Any, BinaryIO, TypeVar

from perfdoctor import shared
from perfdoctor.errors import InputError

K = TypeVar("K")
V = TypeVar("V")


class Records:
    """Byte strings appended to a temporary file, each read back by the number :meth:`add` gave it."""

    def __init__(self) -> None:
        self._file: BinaryIO | None = None
        self._ends = array("q")  # where each record ends; the next starts there

    def add(self, data: bytes) -> int:
        """Write ``data`` (a full or unwritable temporary folder is said in one line, as bad input is)."""
        try:
            if self._file is None:
                self._file = tempfile.TemporaryFile(prefix="perfdoctor-records-", buffering=0)
            start = self._ends[-1] if self._ends else 0
            written = 0
            while written < len(data):  # an unbuffered write may write less than asked
                written += os.pwrite(self._file.fileno(), memoryview(data)[written:], start + written)
        except OSError as exc:
            raise InputError(f"cannot write the ranks' results to the temporary folder {tempfile.gettempdir()} "
                             f"({exc.strerror or exc}): set TMPDIR to a folder with room for them") from None
        self._ends.append(start + len(data))
        return len(self._ends) - 1

    def __getitem__(self, number: int) -> bytes:
        start = self._ends[number - 1] if number else 0
        assert self._file is not None
        return os.pread(self._file.fileno(), self._ends[number] - start, start)

    def __len__(self) -> int:
        return len(self._ends)

    def close(self) -> None:
        """Give the file's space back (it is unlinked already: the end of the process does it too)."""
        if self._file is not None:
            self._file.close()
            self._file = None


class Lazy(Mapping[K, V]):
    """Key → ``load(key)``, made each time it is asked for; the last ``cache`` made are kept (a walk across
    ranks asks for the same few again and again). Asking whether a key is there makes nothing."""

    def __init__(self, keys: Collection[K], load: Callable[[K], V], cache: int) -> None:
        self._keys = keys
        self._load = lru_cache(maxsize=cache)(load)

    def __getitem__(self, key: K) -> V:
        if key not in self._keys:
            raise KeyError(key)
        return self._load(key)

    def __contains__(self, key: object) -> bool:  # without loading it (Mapping's would)
        return key in self._keys

    def __iter__(self) -> Iterator[K]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


class Loaded(Lazy[int, Any]):
    """Key → the object pickled (perfdoctor.shared, names resolved in ``seen``) in its record of ``records``."""

    def __init__(self, records: Records, numbers: dict[int, int], seen: dict[Any, Any], cache: int) -> None:
        super().__init__(numbers, lambda key: shared.loads(records[numbers[key]], seen), cache)
