"""Group labels from NCCL's NVTX payloads (``label_source`` nccl_payload; issue 4 item 2).

Scenarios are simulated as nsys 2026.2 exports with payload blobs (``labels.nccl_payload``) and without
perfdoctor labels, and again with perfdoctor labels and no payloads (same seed, identical kernels): the
labelled twin's NVTX-projected groups are the reference, the truth's ``communicators`` map each
communicator id to its group and members.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import yaml

from perfdoctor import api
from perfdoctor.classify import groups as groups_module
from perfdoctor.classify.communicators import communicators
from perfdoctor.classify.groups import GROUPS, label_groups
from perfdoctor.classify.timeline import category_mask, kernel_classes
from perfdoctor.load.run import load_run
from perfdoctor.synth import run_scenario
from tests.paths import REAL_H100, REPO

SCENARIOS = ("pp_1f1b", "exposed_cp", "moe_ep", "exposed_tp")


def _simulate(name: str, root: Path, *, payload: bool, comm_init: bool = True) -> Path:
    raw = yaml.safe_load((REPO / "perfdoctor" / "synth" / "scenarios" / f"{name}.yaml").read_text())
    raw["run"]["steps"] = 1
    raw["output"]["schema"] = "2026.2"
    labels = {**raw.get("labels", {}), "nccl": True, "perfdoctor": not payload, "nccl_payload": payload}
    if payload:
        labels["nccl_comm_init"] = comm_init
    out = root / f"{name}-{'payload' if payload else 'labelled'}{'' if comm_init else '-noinit'}"
    run_scenario({**raw, "labels": labels}, out)
    return out


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("nccl_payload")
    return {name: (_simulate(name, root, payload=True), _simulate(name, root, payload=False)) for name in SCENARIOS}


def _truth_communicators(directory: Path) -> dict[int, dict]:
    out = {}
    for path in directory.glob("*.truth.json"):
        for rank in json.loads(path.read_text())["ranks"].values():
            out.update({int(k): v for k, v in rank.get("communicators", {}).items()})
    return out


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_comm_kernel_finds_its_communicator(traces, scenario):
    """Projection: each comm kernel's communicator (enclosing call, or the calls of its ncclGroupStart /
    ncclGroupEnd bracket) is one whose truth group is the kernel's reference group."""
    payload, labelled = traces[scenario]
    truth = _truth_communicators(payload)
    for tl, ref in zip(load_run([payload]).timelines, load_run([labelled]).timelines):
        kcls = kernel_classes(tl.kernels)
        comm_idx = np.flatnonzero(category_mask(kcls, "comm"))
        comms = communicators(tl, comm_idx)
        assert comms.of.min() >= 0, "a comm kernel without a communicator"
        expected = label_groups(ref, kernel_classes(ref.kernels)).group[comm_idx]
        got = [truth[int(comms.ids[c])]["group"] for c in comms.of]
        assert got == list(expected)
        assert sorted(comms.sizes[comms.sizes > 0]) == sorted(truth[int(i)]["size"] for i in comms.ids)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_payload_labels_match_the_reference(traces, scenario):
    payload, labelled = traces[scenario]
    run, ref_run = load_run([payload]), load_run([labelled])
    for tl, ref in zip(run.timelines, ref_run.timelines):
        for config in ({}, ref_run.config):
            labels = label_groups(tl, kernel_classes(tl.kernels), config)
            expected = label_groups(ref, kernel_classes(ref.kernels)).group
            comm = expected != None  # noqa: E711
            assert (labels.group[comm] == expected[comm]).all()
            assert set(labels.source[comm]) == {"nccl_payload"}
            # Sizes against the config name a communicator for sure only when one group has its size.
            sure = labels.confidence[comm] == "high"
            assert sure.any() == bool(config) or scenario == "moe_ep"
            assert "low" not in set(labels.confidence[comm])


def test_without_communicator_sizes_the_vote_decides(tmp_path):
    payload = _simulate("exposed_tp", tmp_path, payload=True, comm_init=False)
    (tl,) = load_run([payload]).timelines
    labels = label_groups(tl, kernel_classes(tl.kernels), {"tp": 8, "dp": 1})
    comm = labels.codes >= 0
    assert comm.any() and set(labels.group[comm]) == {"tp"}
    assert set(labels.source[comm]) == {"nccl_payload"} and set(labels.confidence[comm]) == {"medium"}


def test_a_communicator_outvotes_wrong_guesses(traces, monkeypatch):
    """One communicator is one group: when up to 40 % of each group's kernel time is guessed wrong, the duration-
    weighted vote per communicator still labels every kernel right (per-kernel guesses would not)."""
    payload, labelled = traces["pp_1f1b"]
    tl, ref = load_run([payload]).timelines[1], load_run([labelled]).timelines[1]
    expected = label_groups(ref, kernel_classes(ref.kernels)).codes
    dur = (tl.kernels["end"] - tl.kernels["start"])
    noisy = expected.copy()
    comm = np.flatnonzero(expected >= 0)
    for g in np.unique(expected[comm]):  # per group, its shortest kernels up to 40 % of its time: wrong
        mine = comm[expected[comm] == g]
        mine = mine[np.argsort(dur[mine])]
        wrong = mine[np.cumsum(dur[mine]) <= 0.4 * dur[mine].sum()]
        noisy[wrong] = (g + 1) % 5
    sure = np.where(noisy >= 0, 0, -1).astype(np.int8)
    monkeypatch.setattr(groups_module, "heuristic_groups",
                        lambda kernels, kcls, config, idx, known: (noisy[idx], sure[idx]))
    labels = label_groups(tl, kernel_classes(tl.kernels), {})
    assert (labels.codes[comm] == expected[comm]).all() and (noisy[comm] != expected[comm]).any()


def test_hex_text_blobs_and_undecodable_ones(traces, tmp_path):
    """binaryData as hexadecimal text decodes like the BLOB; a blob that does not parse is counted in a
    warning and its call skipped, never guessed."""
    payload, _ = traces["exposed_tp"]
    (src,) = payload.glob("*.sqlite")
    hexed, broken = tmp_path / "hex.sqlite", tmp_path / "broken.sqlite"
    for dst, sql in ((hexed, "UPDATE NVTX_EVENTS SET binaryData = hex(binaryData) WHERE binaryData IS NOT NULL"),
                     (broken, "UPDATE NVTX_EVENTS SET binaryData = X'0102' WHERE rowid IN (SELECT rowid FROM "
                              "NVTX_EVENTS WHERE binaryData IS NOT NULL LIMIT 5)")):
        shutil.copy(src, dst)
        with sqlite3.connect(dst) as con:
            con.execute(sql)
    original = load_run([src]).timelines[0].nccl
    # Unsigned ids round-trip, those of 2**63 and above included (the simulator sets bit 63 of DP ids).
    assert len(original) and set(original["comm"].tolist()) == set(_truth_communicators(payload))
    assert load_run([hexed]).timelines[0].nccl.equals(original)
    run = load_run([broken])
    assert len(run.timelines[0].nccl) == len(original) - 5
    assert any("5 NVTX payload blob(s) could not be decoded" in w for w in run.warnings)


def test_exports_without_blobs_have_no_payload_calls():
    """The real nsys 2026.2 export has NCCL's payload schemas but was exported without blobs."""
    run = load_run([REAL_H100])
    assert all(tl.nccl is not None and not len(tl.nccl) for tl in run.timelines)
    assert not any("payload" in w for w in run.warnings)


def test_report_names_the_label_source(traces):
    payload, _ = traces["pp_1f1b"]
    report = api.analyze([payload], timeline_excerpts=False)
    sources = {s for d in report.devices for g in d.groups.values() for s in g["label_source"]}
    assert sources == {"nccl_payload"}
    assert set(report.devices[0].groups) <= set(GROUPS)
