"""perfdoctor.memo: a result is computed once per object, also when two threads ask for it at once (the
critical path's thread and the measurements' both ask for the host pauses), and objects of their own are
computed side by side, not one after the other."""

from __future__ import annotations

import threading

import pytest

from perfdoctor.memo import per_object


class Obj:
    """Identity-keyed: equal fields, still two inputs."""


def test_two_threads_asking_for_one_object_compute_it_once():
    started, release = threading.Event(), threading.Event()
    calls = []

    @per_object
    def slow(obj: Obj) -> list[int]:
        calls.append(threading.current_thread().name)
        started.set()
        assert release.wait(10)
        return [len(calls)]

    obj = Obj()
    results: dict[str, list[int]] = {}
    first = threading.Thread(target=lambda: results.__setitem__("first", slow(obj)), name="first")
    first.start()
    assert started.wait(10)  # the first thread is computing it
    second = threading.Thread(target=lambda: results.__setitem__("second", slow(obj)), name="second")
    second.start()
    second.join(0.2)
    assert second.is_alive()  # waiting for the first's result, not computing its own
    release.set()
    first.join(10)
    second.join(10)
    assert calls == ["first"]
    assert results["first"] is results["second"]
    assert slow(obj) is results["first"]


def test_different_objects_are_computed_side_by_side():
    both = threading.Barrier(2, timeout=10)  # each computation waits for the other: serialised, it would time out

    @per_object
    def meets(obj: Obj) -> int:
        both.wait()
        return id(obj)

    objs = [Obj(), Obj()]
    out: list[int] = []
    threads = [threading.Thread(target=lambda o=o: out.append(meets(o))) for o in objs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert sorted(out) == sorted(id(o) for o in objs)


def test_a_failed_computation_is_not_remembered():
    attempts = []

    @per_object
    def flaky(obj: Obj) -> int:
        attempts.append(1)
        if len(attempts) == 1:
            raise ValueError("first try")
        return len(attempts)

    obj = Obj()
    with pytest.raises(ValueError):
        flaky(obj)
    assert flaky(obj) == 2
    assert flaky(obj) == 2


def test_results_live_as_long_as_their_object_and_prime_stores_one():
    @per_object
    def size(obj: Obj) -> list[int]:
        return [1]

    obj = Obj()
    size.prime(obj, [7])
    assert size(obj) == [7]
    other = Obj()
    assert size(other) == [1]
