"""What rules weigh inside the causes, on the critical path (perfdoctor.blame.focus): unfused kernels by
kind, the blocked norms' delay, the sync stall; their what-ifs from the replay never exceed them."""

from __future__ import annotations

import numpy as np
import pytest

from perfdoctor import api
from perfdoctor.blame.causes import CODE, FOCUS
from perfdoctor.blame.focus import Marks, on_path
from perfdoctor.measure.kernel_mix import UNFUSED_KINDS
from tests.paths import REPO

SAMPLES = REPO / "sample_traces"


def _cols(rows):
    start, end, cause, op = zip(*rows)
    return {"start": np.array(start, dtype=np.int64), "end": np.array(end, dtype=np.int64),
            "cause": np.array([CODE[c] for c in cause], dtype=np.int64), "op": np.array(op, dtype=np.int64),
            "inferred": np.zeros(len(rows), dtype=bool)}


def test_on_path_by_hand():
    marks = Marks.empty(4)
    marks.unfused[0] = UNFUSED_KINDS.index("softmax")
    marks.unfused[3] = UNFUSED_KINDS.index("rope")
    marks.delay[2] = 15  # a norm that waited 15 ns for SMs
    marks.delay[3] = 500  # waited longer than the step is long: only the path inside the step counts
    cols = _cols([(60, 70, "compute.elementwise", 3), (50, 60, "compute.norm", 2), (30, 50, "transfer.dp", 1),
                  (10, 30, "compute.elementwise", 0), (5, 10, "host.launch", 0), (0, 5, "host.sync", -1)])
    at = np.maximum(cols["op"], 0)  # the marks of each segment's op (blame/path.py Segments.settle)
    cols |= {"unfused": np.where(cols["op"] >= 0, marks.unfused[at], -1),
             "delay": np.where(cols["op"] >= 0, marks.delay[at], 0)}
    out = dict(zip(FOCUS, on_path(cols, 0, sync_ns=5.0, after_sync_ns=3).tolist()))
    assert out["unfused_softmax"] == 20  # its kernel, not the launch segment that names it
    assert out["unfused_rope"] == 10 and out["unfused"] == 30
    assert out["ln_blocked"] == 15 + 60  # [35, 50) before the norm, [0, 60) before the other (clipped)
    assert out["sync_stall"] == 8


@pytest.fixture(scope="module")
def ln_blocked():
    return api.analyze([SAMPLES / "ln_blocked"])


def test_blocked_norms_weighed_on_the_path(ln_blocked):
    m = ln_blocked.metrics["all"]
    assert 0 < m["blocking.ln_blocked_ms"] <= m["ln.blocked_ms"] + 1e-6
    assert m["whatif.ln_blocked_ms"] is not None and 0 < m["whatif.ln_blocked_ms"] <= m["blocking.ln_blocked_ms"]
    finding = next(f for f in ln_blocked.findings if f["rule"] == "ln-sm-margin")
    assert finding["impact_ms_per_step"] == pytest.approx(m["blocking.ln_blocked_ms"], abs=1e-3)


def test_unfused_kernels_not_on_a_launch_bound_path():
    """host_bound's GPU waits for launches: its unfused kernels run in full but hold the step for little."""
    m = api.analyze([SAMPLES / "host_bound"]).metrics["all"]
    assert m["kernels.unfused_ms"] > 1.0
    assert m["blocking.unfused_ms"] < 0.5 * m["kernels.unfused_ms"]
    for rank in api.analyze([SAMPLES / "host_bound"]).metrics["ranks"].values():
        kinds = sum(rank[f"blocking.unfused_{k}_ms"] for k in UNFUSED_KINDS)
        assert kinds == pytest.approx(rank["blocking.unfused_ms"], abs=1e-6)


def test_path_names_pipeline_theory_and_imbalance_like_the_metrics():
    """With the schedule known (pp_1f1b's config), the path's waits for a stage are split as the metrics
    split them: the schedule's share first, the rest imbalance; no entry stays pipeline.wait."""
    report = api.analyze([SAMPLES / "pp_1f1b"])
    causes = {e["cause"] for entries in report.path.values() for e in entries}
    assert "pipeline.theory" in causes and "pipeline.wait" not in causes
    for rank, entries in report.path.items():
        m = report.metrics["ranks"][rank]
        theory = sum(e["end_ns"] - e["start_ns"] for e in entries if e["cause"] == "pipeline.theory") / 1e6
        if m["blocking.pipeline_imbalance_ms"] == 0:
            assert not any(e["cause"] == "pipeline.imbalance" for e in entries)
        assert theory <= m["step.time_ms"] * m["pipeline.bubble_fraction_theory"] + 0.01


def test_sm_margin_what_if_matches_the_run_with_the_margin(tmp_path):
    """ln_blocked re-simulated with an SM margin: the step saves what the replay without the norms' wait
    predicts, not the 232 ms of delay on the path (the DP transfers the norms waited through stay there;
    the kernels after each norm still need the all-gather it waited behind, a wait nsys recorded)."""
    import yaml

    from perfdoctor.synth import run_scenario

    scenario = yaml.safe_load((REPO / "perfdoctor" / "synth" / "scenarios" / "ln_blocked.yaml").read_text())
    before = api.analyze(run_scenario(scenario, tmp_path / "before"), jobs=1).metrics["ranks"]["0"]
    margin = scenario | {"comm": {**scenario.get("comm", {}), "layernorm_sm_margin": 16}}
    after = api.analyze(run_scenario(margin, tmp_path / "after"), jobs=1).metrics["ranks"]["0"]
    saved = before["step.time_ms"] - after["step.time_ms"]
    assert before["whatif.ln_blocked_ms"] == pytest.approx(saved, abs=0.02 * before["step.time_ms"])
    assert before["blocking.ln_blocked_ms"] - saved > 0.5 * before["step.time_ms"]  # blocking alone overstates
