"""blame/join.py `_across` looks only at the late rank's entries that can overlap a wait (bisected on their
starts and running end); the path it builds is the one of the plain loop over all of them, kept below."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from perfdoctor.blame.join import _across


def _loop_across(rank, entries, entries_of, paths, clock):  # noqa: ANN001, ANN202
    out = []
    for e in entries:
        late = e.get("late")
        if (late is None or late not in clock or rank not in clock or late not in paths
                or paths[late].representative != paths[rank].representative):
            out.append(e)
            continue
        theirs = entries_of(late)
        shift = clock[rank] - clock[late]
        t = e["start_ns"]
        for x in theirs:
            a, b = max(x["start_ns"] - shift, e["start_ns"]), min(x["end_ns"] - shift, e["end_ns"])
            if b <= a or x.get("rank") != late:
                continue
            if a > t:
                out.append(e | {"start_ns": t, "end_ns": a})
            out.append({k: v for k, v in x.items() if k != "late"} | {"start_ns": a, "end_ns": b})
            t = b
        if t < e["end_ns"]:
            out.append(e | {"start_ns": t})
    return out


def _path(rng: random.Random, rank: int, ranks: int, in_order: bool) -> list[dict]:
    out, t = [], rng.randint(0, 50)
    for _ in range(rng.randint(0, 40)):
        start = t + rng.randint(-5, 20) if not in_order else t + rng.randint(0, 20)
        end = start + rng.randint(-3, 60)
        entry = {"start_ns": start, "end_ns": end, "rank": rank if rng.random() < 0.9 else rank + 100,
                 "cause": rng.choice(["compute.gemm", "comm.wait"])}
        if rng.random() < 0.4:
            entry["late"] = rng.randrange(ranks + 1)  # sometimes a rank without a path or clock
        out.append(entry)
        t = max(t, start if in_order else t) + rng.randint(0, 30)
    return out


@pytest.mark.parametrize("seed", range(60))
def test_across_matches_the_loop_over_every_entry(seed: int) -> None:
    rng = random.Random(seed)
    ranks = rng.randint(2, 5)
    in_order = seed % 3 != 0  # a path out of start order: no upper bound, still the same answer
    entries = {r: _path(rng, r, ranks, in_order) for r in range(ranks)}
    paths = {r: SimpleNamespace(representative=rng.choice([0, 0, 1])) for r in range(ranks)}
    clock = {r: rng.randint(-40, 40) for r in range(ranks) if rng.random() < 0.9}
    for rank in range(ranks):
        assert (_across(rank, entries[rank], entries.__getitem__, paths, clock)
                == _loop_across(rank, entries[rank], entries.__getitem__, paths, clock))


def test_the_random_paths_follow_waits() -> None:
    rng = random.Random(1)
    entries = {r: _path(rng, r, 3, True) for r in range(3)}
    paths = {r: SimpleNamespace(representative=0) for r in range(3)}
    clock = dict.fromkeys(range(3), 0)
    followed = [e for r in range(3) for e in _across(r, entries[r], entries.__getitem__, paths, clock)
                if e["rank"] in range(3) and e["rank"] != r]
    assert followed
