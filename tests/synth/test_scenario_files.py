"""Scenario validation: good files load, bad input names the offending field in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfdoctor.errors import InputError
from perfdoctor.synth import load_scenario
from perfdoctor.synth.schedule import stage_passes

from .conftest import scenario_paths


def test_packaged_scenarios_load() -> None:
    paths = scenario_paths()
    assert len(paths) >= 10
    for p in paths:
        assert load_scenario(p).name == p.stem


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("name: x\nparallel: {tp: 3}\n", "parallel.tp"),
        ("name: x\nparallel: {tpp: 2}\n", "parallel.tpp"),
        ("name: x\nkernels: {attention: sdpa}\n", "kernels.attention"),
        ("name: x\nmodel: {layers: two}\n", "model.layers"),
        ("name: x\nparallel: {pp: 2, vpp: 2}\nmodel: {num_microbatches: 3}\n", "parallel.vpp"),
        ("name: x\noutput: {ranks: [99]}\n", "output.ranks"),
        ("model: {}\n", "name"),
        ("name: x\nbogus: 1\n", "bogus"),
    ],
)
def test_bad_fields_are_named(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        load_scenario(path)
    assert field in str(err.value) and "\n" not in str(err.value)


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(InputError):
        load_scenario(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(InputError):
        load_scenario(bad)


def test_schedules_are_megatron_orders() -> None:
    """1F1B warm-up is p−s−1 forwards; every stage runs each (mb, chunk) forward and backward once."""
    for p, v, m in [(4, 1, 8), (4, 2, 8), (2, 3, 4)]:
        for s in range(p):
            order = stage_passes(p, v, m, s)
            assert sorted((x.mb, x.chunk) for x in order if x.forward) == sorted(
                (mb, c) for mb in range(m) for c in range(v)
            )
            assert sorted((x.mb, x.chunk) for x in order if not x.forward) == sorted(
                (mb, c) for mb in range(m) for c in range(v)
            )
            if v == 1:
                assert [x.forward for x in order[: p - s - 1]] == [True] * (p - s - 1)
                assert not order[p - s - 1 + 1].forward
