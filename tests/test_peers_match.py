"""Cross-rank matching (perfdoctor.measure.peers.match) on collective instances built by hand, where the
answer is known: who arrived last (ties: the first rank in order), how long the others waited, clock
skew removed, instances missing on a member left unmatched, one rank, no instances — and without pandas
(issue 16: start-up)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from perfdoctor.classify.groups import GROUPS
from perfdoctor.measure import intervals as iv
from perfdoctor.measure.collectives import Collectives
from perfdoctor.measure.host import CAUSES
from perfdoctor.measure.peers import match

US = 1_000
ROOT = Path(__file__).resolve().parents[1]


def _rank(arrive_us: list[float], end_us: list[float], group: str = "dp", comm: int = 0, session_ns: int = 0,
          compute_us: float = 0.0) -> Collectives:
    """One rank's instances of ``group`` (one stream, in order), in a single step of 10 ms on the rank's
    clock, each with ``compute_us`` of compute before its arrival and its kernel exposed."""
    start = (np.array(arrive_us) * US).astype(np.int64)
    end = (np.array(end_us) * US).astype(np.int64)
    n = start.size
    zeros = np.zeros(n, dtype=np.int64)
    return Collectives(
        group=np.full(n, GROUPS.index(group), dtype=np.int8), comm=np.full(n, comm, dtype=np.uint64),
        stream=np.zeros(n, dtype=np.int16), seq=np.arange(n, dtype=np.int32), start=start, end=end,
        bytes=zeros - 1, before_start=zeros, before_compute=zeros + int(compute_us * US), before_other_comm=zeros,
        before_idle={c: zeros for c in CAUSES},
        long_calls=(zeros[:0], zeros[:0], np.zeros(0, dtype=object)),
        step_starts=np.array([0]), step_ends=np.array([10_000 * US]), session_start_utc_ns=session_ns,
        exposed={group: iv.union(start, end)})


def test_the_last_arrival_causes_the_wait_and_skewed_clocks_are_aligned() -> None:
    # Rank 1 arrives 100 µs after rank 0 at each of 4 all-reduces; both end 50 µs after it arrives. Its
    # file's session starts 1 ms later (its times are 1 ms earlier) and its clock is 30 µs ahead.
    arrive = [1000.0, 3000.0, 5000.0, 7000.0]
    r0 = _rank(arrive, [a + 150 for a in arrive], session_ns=10**15)
    r1 = _rank([a + 100 - 1000 + 30 for a in arrive], [a + 150 - 1000 + 30 for a in arrive],
               session_ns=10**15 + 1000 * US, compute_us=100)
    waits = match({0: r0, 1: r1}, {0: {"dp": 1.0}, 1: {"dp": 0.2}}, {}, 2)
    assert waits.clock_residual_us == 0.0
    assert waits.metrics["0"]["comm.dp.exposed_wait_ms"] == pytest.approx(1.0 * 100 / 150)
    assert waits.metrics["0"]["comm.dp.exposed_transfer_ms"] == pytest.approx(1.0 * 50 / 150)
    assert waits.metrics["1"]["comm.dp.exposed_wait_ms"] == 0.0
    assert waits.evidence["0"]["dp"]["waited_for_ms"] == {"1": 0.4}  # 4 × 100 µs in the one step
    assert waits.evidence["0"]["dp"]["matched"] == waits.evidence["0"]["dp"]["instances"] == 4
    assert waits.late_ms == {"0": 0.0, "1": pytest.approx(0.4)}
    s = waits.straggler
    assert (s.rank, s.group, s.cause, s.excess_ms["compute"], s.host_call, s.waits_on) == (1, "dp", "compute", 0.4,
                                                                                          None, [])


@pytest.mark.parametrize("order", [(2, 0, 1), (1, 2, 0)])
def test_a_tie_for_last_goes_to_the_first_rank_in_order(order: tuple[int, ...]) -> None:
    # Rank 0 arrives at 0; ranks 1 and 2 both at 100 µs: the wait is credited to whichever comes first.
    ranks = {0: _rank([0], [150]), 1: _rank([100], [150]), 2: _rank([100], [150])}
    waits = match({r: ranks[r] for r in order}, {r: {"dp": 1.0} for r in order}, {}, 3)
    first = next(r for r in order if r != 0)
    assert waits.evidence["0"]["dp"]["waited_for_ms"] == {str(first): 0.1}
    # Its late ms: per instance the median wait of the others (100 µs and its tied peer's 0).
    assert waits.straggler.rank == first and waits.late_ms[str(first)] == pytest.approx(0.05)


def test_an_instance_missing_on_a_member_matches_nowhere() -> None:
    # Communicator 7 = ranks 0, 1, 2 (from the NCCL id); rank 2 lacks the 2nd of 10 all-reduces, so each rank
    # matches 9 of its 10 (rank 2: 9 of 9), and rank 0 waited only at the 9 matched ones.
    arrive = [float(1000 * k) for k in range(10)]
    r0 = _rank(arrive, [a + 300 for a in arrive], comm=7)
    r1 = _rank([a + 200 for a in arrive], [a + 300 for a in arrive], comm=7)
    gone = arrive[:1] + arrive[2:]
    r2 = _rank(gone, [a + 300 for a in gone], comm=7)
    r2.seq[1:] = np.arange(1, 9)  # the missing one shifts nothing: ranks number their own instances
    waits = match({0: r0, 1: r1, 2: r2}, {r: {"dp": 1.0} for r in range(3)}, {}, 3)
    assert [waits.evidence[str(r)]["dp"]["matched"] for r in range(3)] == [9, 9, 9]
    assert [waits.evidence[str(r)]["dp"]["instances"] for r in range(3)] == [10, 10, 9]
    # Matching is by order: after the gap rank 2's instances pair with the others' next ones, so the
    # last instance of ranks 0 and 1 is unmatched, and below 90 % of a rank matched the split is unknown.
    r0_few = _rank(arrive[:5], [a + 300 for a in arrive[:5]], comm=7)
    r2_few = _rank(arrive[:1] + arrive[2:5], [a + 300 for a in arrive[:1] + arrive[2:5]], comm=7)
    few = match({0: r0_few, 2: r2_few}, {0: {"dp": 1.0}, 2: {"dp": 1.0}}, {}, 3)
    assert few.metrics["0"]["comm.dp.exposed_wait_ms"] is None and "0" not in few.evidence


def test_wide_pipeline_p2p_and_a_single_rank_match_nothing() -> None:
    sends = {r: _rank([100.0 * r], [500.0], group="pp") for r in range(4)}
    wide = match(sends, {r: {"pp": 1.0} for r in range(4)}, {"pp": 4}, 4)
    assert all(m["comm.pp.exposed_wait_ms"] is None for m in wide.metrics.values())
    assert wide.straggler is None and wide.late_ms == {str(r): 0.0 for r in range(4)}
    one = match({3: _rank([0.0, 10.0], [5.0, 20.0])}, {3: {"dp": 1.0}}, {}, 1)
    assert one.metrics == {"3": {"comm.dp.exposed_wait_ms": None, "comm.dp.exposed_transfer_ms": None}}
    assert (one.evidence, one.late_ms, one.clock_residual_us, one.straggler) == ({}, {"3": 0.0}, None, None)


def test_no_instances_at_all() -> None:
    empty = _rank([], [])
    waits = match({0: empty, 1: empty}, {}, {}, 2)
    assert (waits.metrics, waits.evidence, waits.late_ms, waits.clock_residual_us, waits.straggler) == \
        ({}, {}, {}, None, None)


def test_matching_neither_imports_nor_uses_pandas() -> None:
    """peers.py and grouped.py import no pandas, and match runs with any later import of pandas failing
    (its neighbours on the load path may still import it: only what match itself needs is checked)."""
    for module in ("peers", "grouped"):
        tree = ast.parse((ROOT / "perfdoctor" / "measure" / f"{module}.py").read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
            {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(name and name.split(".")[0] == "pandas" for name in imported), module
    code = f"""
import json, sys, types
sys.path.insert(0, {str(ROOT)!r})
sys.path.insert(0, {str(ROOT / "tests")!r})
from test_peers_match import _rank
from perfdoctor.measure import grouped, peers
for mod in (peers, grouped):
    assert not any(isinstance(v, types.ModuleType) and v.__name__.startswith("pandas") for v in vars(mod).values())
for name in [m for m in sys.modules if m == "pandas" or m.startswith("pandas.")]:
    sys.modules[name] = None  # from here on, importing pandas raises ImportError
arrive = [1000.0, 3000.0]
waits = peers.match({{0: _rank(arrive, [a + 150 for a in arrive]), 1: _rank([a + 100 for a in arrive],
                     [a + 150 for a in arrive])}}, {{0: {{"dp": 1.0}}, 1: {{"dp": 1.0}}}}, {{}}, 2)
print(json.dumps([waits.straggler.rank, waits.evidence["0"]["dp"]["waited_for_ms"]]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [1, {"1": 0.2}]

