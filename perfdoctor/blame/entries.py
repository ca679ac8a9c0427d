"""The report's ``path`` held as columns: per rank, its bounded entries (perfdoctor.blame.join).

A thousand ranks' entries as dicts were ~22 KB a rank in the process that assembles the report (64 dicts of
six keys each); as columns at their width, with the causes and names as codes, they are ~1.5 KB. Read as a
mapping of rank (str) to its list of entry dicts, made when asked for, in the key order the join gives
them (``start_ns``, ``end_ns``, ``rank``, ``cause``, ``what``, ``inferred``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from perfdoctor.blame.causes import CAUSES, CODE

KEYS = ("start_ns", "end_ns", "rank", "cause", "what", "inferred")


class PathEntries(Mapping[str, list[dict[str, Any]]]):
    """Rank (str) → its path entries; :meth:`add` a rank's entries, read them back as dicts."""

    def __init__(self) -> None:
        self._ranks: dict[str, tuple[np.ndarray, ...]] = {}
        self._names: dict[str, int] = {}  # ``what`` texts, shared by every rank
        self._name_list: list[str] = []

    def add(self, rank: str, entries: list[dict[str, Any]]) -> None:
        if any(tuple(e) != KEYS for e in entries):
            raise ValueError(f"path entries of rank {rank} are not {KEYS}")
        what = [self._names.setdefault(e["what"], len(self._names)) for e in entries]
        self._name_list.extend(list(self._names)[len(self._name_list):])
        self._ranks[rank] = (np.array([e["start_ns"] for e in entries], dtype=np.int64),
                             np.array([e["end_ns"] for e in entries], dtype=np.int64),
                             np.array([e["rank"] for e in entries], dtype=np.int64),
                             np.array([CODE[e["cause"]] for e in entries], dtype=np.int8),
                             np.array(what, dtype=np.int32),
                             np.array([e["inferred"] for e in entries], dtype=bool))

    def __getitem__(self, rank: str) -> list[dict[str, Any]]:
        start, end, ranks, cause, what, inferred = (c.tolist() for c in self._ranks[rank])
        names = self._name_list
        return [{"start_ns": s, "end_ns": e, "rank": r, "cause": CAUSES[c], "what": names[w], "inferred": i}
                for s, e, r, c, w, i in zip(start, end, ranks, cause, what, inferred)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._ranks)

    def __len__(self) -> int:
        return len(self._ranks)
