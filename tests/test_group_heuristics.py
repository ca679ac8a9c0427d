"""Group labels without any label source (issue 4): the name-only fallback of kernel_taxonomy.md §6.3.

Every shipped scenario is simulated twice with the same seed, with and without NVTX labels: the
kernels are identical, so the NVTX-projected groups of the labelled trace are the reference for the
heuristic groups of the unlabelled one. Target: right for ≥ 90 % of comm time in every scenario.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from perfdoctor.classify.group_heuristics import CONFIDENCE, group_sizes, heuristic_groups
from perfdoctor.classify.groups import GROUPS, decode, label_groups
from perfdoctor.classify.timeline import kernel_classes
from perfdoctor.load.run import load_run
from perfdoctor.model import Timeline
from perfdoctor.synth import run_scenario
from perfdoctor.table import Table
from tests.paths import REAL_H100, REPO

SCENARIOS = sorted((REPO / "perfdoctor" / "synth" / "scenarios").glob("*.yaml"))
TARGET = 0.90


@pytest.fixture(scope="session")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Per scenario: (labelled, unlabelled) trace directories, simulated once per session."""
    root = tmp_path_factory.mktemp("group_heuristics")
    out = {}
    for path in SCENARIOS:
        raw = yaml.safe_load(path.read_text())
        labels = raw.get("labels", {})
        run_scenario({**raw, "labels": {**labels, "perfdoctor": True}}, root / "labelled" / path.stem)
        bare = {**raw, "labels": {**labels, "perfdoctor": False, "nccl": False}}
        run_scenario(bare, root / "bare" / path.stem)
        out[path.stem] = (root / "labelled" / path.stem, root / "bare" / path.stem)
    return out


def _facts(tl: Timeline, kcls: Table) -> np.ndarray:
    """Group codes known without guessing: NVTX labels, and TP for userbuffers kernels (else -1)."""
    labels = label_groups(tl, kcls)
    fact = (labels.source == "nvtx") | kcls["library"].mask("userbuffers")
    return np.where(fact, labels.codes, -1).astype(np.int8)


def _heuristic_groups(tl: Timeline, kcls: Table, config: dict, known: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`heuristic_groups` aligned with the kernels (its arrays are the comm kernels')."""
    idx = np.flatnonzero(kcls["category"].mask("comm"))
    out = []
    for codes in heuristic_groups(tl.kernels, kcls, config, idx, known[idx]):
        whole = np.full(len(tl.kernels), -1, dtype=np.int8)
        whole[idx] = codes
        out.append(whole)
    return out[0], out[1]


def _guess(tl: Timeline, config: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group and confidence names (None where unlabelled), and the comm mask."""
    kcls = kernel_classes(tl.kernels)
    known = _facts(tl, kcls)
    group, confidence = _heuristic_groups(tl, kcls, config, known)
    return (decode(np.where(group >= 0, group, known), GROUPS), decode(confidence, CONFIDENCE),
            kcls["category"].mask("comm"))


def accuracy(labelled: Path, bare: Path, config: dict | None = None) -> float:
    """Share of the reference-labelled comm time whose heuristic group matches the reference."""
    right = total = 0.0
    ref_run, bare_run = load_run([labelled]), load_run([bare])
    for ref_tl, tl in zip(ref_run.timelines, bare_run.timelines):
        assert len(ref_tl.kernels) == len(tl.kernels)
        ref = decode(_facts(ref_tl, kernel_classes(ref_tl.kernels)), GROUPS)
        got = _guess(tl, ref_run.config if config is None else config)[0]
        dur = (tl.kernels["end"] - tl.kernels["start"]).astype(np.float64)
        has_ref = ref != None  # noqa: E711
        total += dur[has_ref].sum()
        right += dur[has_ref & (got == ref)].sum()
    return right / total if total else 1.0


@pytest.mark.parametrize("scenario", [p.stem for p in SCENARIOS])
def test_heuristic_groups_match_nvtx_labels(traces, scenario):
    labelled, bare = traces[scenario]
    assert accuracy(labelled, bare, config={}) >= TARGET, scenario  # plain capture: no config either


@pytest.mark.parametrize("scenario", ["exposed_cp", "moe_ep", "pp_1f1b", "unlabeled"])
def test_known_config_keeps_labels_right(traces, scenario):
    labelled, bare = traces[scenario]
    assert accuracy(labelled, bare) >= TARGET, scenario  # config from the labelled run's mark


def test_confidence_is_given_and_raised_by_the_config(traces):
    _, bare = traces["exposed_tp"]
    (tl,) = load_run([bare]).timelines
    group, confidence, comm = _guess(tl, {})
    assert set(group[comm]) == {"tp"} and set(confidence[comm]) == {"low"}  # on the compute stream
    group, confidence, _ = _guess(tl, {"tp": 8, "dp": 1})
    assert set(confidence[comm]) == {"medium"}


def test_groups_of_size_one_are_ruled_out(traces):
    _, bare = traces["pp_1f1b"]
    tl = load_run([bare]).timelines[0]
    group, _, comm = _guess(tl, {"pp": 1, "cp": 1, "ep": 1})
    kcls = kernel_classes(tl.kernels)
    p2p = comm & kcls["collective"].mask("send_recv")
    assert p2p.any() and all(g is None for g in group[p2p])  # no group left that could send


def test_dp_group_spans_context_parallel_ranks():
    assert group_sizes({"dp": 1, "cp": 4})["dp"] == 4
    assert group_sizes({"dp": 1})["dp"] is None
    assert group_sizes({"dp": 1, "cp": 1})["dp"] == 1


def test_nvtx_labels_are_never_overridden(traces):
    labelled, _ = traces["unlabeled"]
    (tl,) = load_run([labelled]).timelines
    kcls = kernel_classes(tl.kernels)
    ref = label_groups(tl, kcls)
    nvtx = ref.source == "nvtx"
    assert nvtx.any()
    group, _ = _heuristic_groups(tl, kcls, {}, np.where(nvtx, ref.codes, -1).astype(np.int8))
    assert (group[nvtx] == -1).all()


def test_real_trace_guess_is_sensible_and_flagged_low():
    """FastVideo's sequence-parallel all-to-alls (SendRecv beside attention on the compute stream)."""
    for tl in load_run([REAL_H100]).timelines:
        group, confidence, comm = _guess(tl, {})
        assert set(group[comm]) <= {"cp", None}
        assert set(confidence[comm]) <= {"low", None}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("size", [1, 3, 1 << 18])
def test_kernels_on_streams_by_slices(seed, size, monkeypatch):
    """Kernels per stream counted a slice at a time (dense stream numbers bincounted, sparse ones searched,
    streams outside the asked ones skipped) are the whole column's counts."""
    from perfdoctor.classify import group_heuristics as gh

    rng = np.random.default_rng(seed)
    numbers = rng.choice([[3, 7, 20], [0, 1 << 40, -5], [13]][seed % 3], size=int(rng.integers(0, 50)))
    stream = numbers.astype(np.int64 if seed % 3 == 1 else np.int32)
    asked = np.unique(rng.choice(stream, size=2)) if stream.size else np.zeros(0, dtype=stream.dtype)
    monkeypatch.setattr(gh, "SLICE", size)
    assert gh._kernels_on(stream, asked).tolist() == [int((stream == s).sum()) for s in asked]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("size", [1, 4, 1 << 18])
def test_compute_neighbours_by_slices(seed, size, monkeypatch):
    """The compute kernels before each launch position and the compute index of each kernel of some codes,
    made a slice at a time, are the ones from every compute kernel's position at once."""
    from perfdoctor.classify import group_heuristics as gh

    rng = np.random.default_rng(seed)
    seq = rng.integers(-2, 5, int(rng.integers(1, 60))).astype(np.int8)
    position = rng.permutation(np.flatnonzero(seq == gh.COMM))
    compute_pos = np.flatnonzero(seq >= 0)
    monkeypatch.setattr(gh, "SLICE", size)
    assert gh._computes_before(seq, position).tolist() == np.searchsorted(compute_pos, position).tolist()
    kinds = {"gemm": (gh.GEMM,), "moe": (gh.MOE,), "layer": (gh.GEMM, gh.ATTENTION)}
    got = gh._compute_index(seq, kinds)
    assert list(got) == list(kinds)
    for name, codes in kinds.items():
        want = np.flatnonzero(np.isin(seq[compute_pos], codes))
        assert got[name].tolist() == want.tolist()
