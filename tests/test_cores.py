"""Work beside the analysis (perfdoctor.cores): the same results with a second core as without one."""

from __future__ import annotations

import threading

import pytest

from perfdoctor import api, cores
from perfdoctor.render.json import report_dict
from tests.paths import REAL_H100, SAMPLES


def test_beside_runs_on_a_second_thread_only_with_a_second_core(monkeypatch) -> None:
    where = []

    def record(x: int) -> int:
        where.append(threading.current_thread() is threading.main_thread())
        return x * 2

    monkeypatch.setattr(cores, "PER_TASK", 1)
    later = cores.beside(record, 3)
    assert where == []  # one core: computed when asked for, once
    assert later.result() == 6 and later.result() == 6 and where == [True]
    monkeypatch.setattr(cores, "PER_TASK", 2)
    assert cores.beside(record, 4).result() == 8 and where == [True, False]


def test_a_timeline_too_large_or_too_small_for_two_measurements_at_once_runs_them_one_at_a_time(monkeypatch) -> None:
    on_main = []
    monkeypatch.setattr(cores, "PER_TASK", 2)
    most, mapped_most = cores.SIDE_BY_SIDE_MAX_BYTES, cores.SIDE_BY_SIDE_MAPPED_MAX_BYTES
    # (tables, of them in memory): mapped tables count against the larger limit only
    for size, main_thread in (((most, None), False), ((most + 1, None), True),
                              ((cores.SIDE_BY_SIDE_MIN_BYTES, None), False),
                              ((cores.SIDE_BY_SIDE_MIN_BYTES - 1, None), True),
                              ((mapped_most, most), False), ((mapped_most, most + 1), True),
                              ((mapped_most + 1, 0), True)):
        with cores.sized_for(*size):
            later = cores.beside(lambda: on_main.append(threading.current_thread() is threading.main_thread()))
        later.result()
        assert on_main[-1] is main_thread
    assert cores._side_by_side  # restored after the block


def test_an_error_beside_reaches_the_caller(monkeypatch) -> None:
    monkeypatch.setattr(cores, "PER_TASK", 2)
    later = cores.beside(lambda: 1 // 0)
    with pytest.raises(ZeroDivisionError):
        later.result()


@pytest.mark.parametrize("trace", [REAL_H100, SAMPLES / "pp_1f1b", SAMPLES / "exposed_dp"], ids=lambda p: p.name)
def test_the_report_is_the_same_with_one_core_or_two(trace, monkeypatch) -> None:
    monkeypatch.setattr(cores, "SIDE_BY_SIDE_MIN_BYTES", 0)  # these small timelines measured beside each other too

    def report(jobs: int) -> dict:
        out = report_dict(api.analyze([trace], jobs=jobs))
        out.pop("generated_at", None)
        out.get("run", {}).pop("elapsed_s", None)
        return out

    assert report(1) == report(2)


def test_no_thread_outlives_the_analysis() -> None:
    """A thread left behind would make a later process pool start from a fork server, and be joined at
    exit, where a Ctrl-C can go unanswered."""
    before = {t.ident for t in threading.enumerate()}
    api.analyze([REAL_H100], jobs=2)
    assert {t.name for t in threading.enumerate() if t.ident not in before} == set()


def test_on_demand_computes_once_for_every_thread_that_asks():
    """Two threads asking at once for an on-demand result get the one value, computed once."""
    import threading
    import time

    from perfdoctor.cores import on_demand

    calls = []

    def slow(x):
        calls.append(x)
        time.sleep(0.05)
        return [x]

    later = on_demand(slow, 7)
    got = []
    threads = [threading.Thread(target=lambda: got.append(later.result())) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [7] and all(g is got[0] for g in got) and got[0] == [7]
