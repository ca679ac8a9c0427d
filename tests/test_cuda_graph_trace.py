"""CUDA-graph runs under both nsys graph-trace modes (DESIGN §3 "CUDA graphs").

The simulator replays every layer pass from a CUDA graph (TE graphed layers) and writes the same run
twice: ``node`` mode (kernel rows sharing their cudaGraphLaunch's correlation id, with graphNodeId) and
``graph`` mode (one CUPTI_ACTIVITY_KIND_GRAPH_TRACE row per replay, with nsys 2024.2's DDL, no kernel
rows for graph nodes). Ground truth is the simulator's own per-step exposed comm and idle time.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from perfdoctor import api
from perfdoctor.diagnose import load_rules
from perfdoctor.diagnose.conditions import Context
from perfdoctor.diagnose.findings import evaluate_rules
from perfdoctor.errors import InputError
from perfdoctor.synth import run_scenario

SCENARIO = {
    "name": "graphed",
    "model": {"layers": 4, "hidden": 2048, "heads": 16, "kv_heads": 4, "ffn_hidden": 8192, "seq_length": 4096,
              "vocab": 32000, "num_microbatches": 4},
    "parallel": {"tp": 1, "dp": 4},
    "host": {"cuda_graphs": True, "launch_us": 8, "python_us": 30},
    "output": {"schema": "2024.2"},
    "run": {"steps": 3},
}


def _run(root: Path, mode: str, graphs: bool = True) -> Path:
    sc = json.loads(json.dumps(SCENARIO))
    sc["host"].update({"cuda_graphs": graphs, "cuda_graph_trace": mode})
    run_scenario(sc, root / f"{mode}{'' if graphs else '_eager'}", seed=3)
    return root / f"{mode}{'' if graphs else '_eager'}"


@pytest.fixture(scope="module")
def twins(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("graphs")
    return {"node": _run(root, "node"), "graph": _run(root, "graph"), "eager": _run(root, "node", graphs=False)}


def _truth(run: Path) -> dict:
    return json.loads(next(run.glob("*.truth.json")).read_text())["ranks"]["0"]


def test_graph_mode_writes_replays_not_kernels(twins):
    (path,) = twins["graph"].glob("*.sqlite")
    con = sqlite3.connect(path)
    replays, = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE").fetchone()
    linked, = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE g JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
                          "ON r.correlationId = g.correlationId JOIN StringIds s ON s.id = r.nameId "
                          "WHERE s.value LIKE 'cudaGraphLaunch%'").fetchone()
    kernels, = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    con.close()
    (node_path,) = twins["node"].glob("*.sqlite")
    con = sqlite3.connect(node_path)
    node_kernels, in_graphs, launches = con.execute(
        "SELECT count(*), count(graphNodeId), count(DISTINCT CASE WHEN graphNodeId IS NOT NULL THEN correlationId END) "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    con.close()
    # one replay per graphed layer pass (steps x microbatches x layers x fwd/bwd, less the passes that wait
    # for a parameter all-gather and run eagerly), each linked to its cudaGraphLaunch call
    assert replays == launches == linked and 2 * 4 * 4 * 2 < replays <= 4 * 4 * 4 * 2
    assert kernels == node_kernels - in_graphs and in_graphs > 5 * replays


def test_graph_mode_is_busy_like_node_mode(twins):
    node, graph = api.analyze([twins["node"]]), api.analyze([twins["graph"]])
    mn, mg = node.metrics["all"], graph.metrics["all"]
    truth = _truth(twins["node"])["steps"]
    assert mg["step.time_ms"] == pytest.approx(mn["step.time_ms"], rel=1e-6)
    assert mn["gpu.busy_fraction"] > 0.95
    # busy: a replay is busy from its first node's start to its last node's end (0.4 us node gaps included)
    assert mg["gpu.busy_fraction"] == pytest.approx(mn["gpu.busy_fraction"], abs=0.005)
    assert mg["gpu.busy_fraction"] == pytest.approx(np.median([s["busy_ms"] / s["step_ms"] for s in truth[1:]]),
                                                    abs=0.005)
    assert mg["comm.exposed_ms"] == pytest.approx(mn["comm.exposed_ms"], rel=0.01)
    assert mg["comm.exposed_ms"] == pytest.approx(np.median([s["exposed_total_ms"] for s in truth[1:]]), rel=0.03)
    # no invented idle or launch-bound time inside replays
    assert mg["host.launch_bound_ms"] == pytest.approx(mn["host.launch_bound_ms"], abs=0.05)
    assert mg["host.idle_fraction"] <= mn["host.idle_fraction"] + 0.001
    assert "host-launch-bound" not in {f["rule"] for f in graph.findings}
    assert {f["rule"] for f in graph.findings} <= {f["rule"] for f in node.findings}


def test_graph_mode_says_what_was_not_captured(twins):
    graph = api.analyze([twins["graph"]])
    m = graph.metrics["all"]
    assert m["graphs.replay_fraction"] > 0.5 and m["graphs.launches_per_step"] >= 24
    assert m["kernels.gemm_fraction"] is None and m["kernels.count_per_step"] is None
    assert any("--cuda-graph-trace=node" in w and "not captured" in w for w in graph.warnings)
    node = api.analyze([twins["node"]])
    # The same replays, traced node by node: each spans its kernels (they share the launch's correlation id).
    assert node.metrics["all"]["graphs.replay_fraction"] == pytest.approx(m["graphs.replay_fraction"], abs=0.01)
    assert node.metrics["all"]["kernels.count_per_step"] is not None
    assert node.metrics["all"]["graphs.launches_per_step"] == m["graphs.launches_per_step"]
    assert not any("--cuda-graph-trace" in w for w in node.warnings)
    eager = api.analyze([twins["eager"]])
    assert eager.metrics["all"]["graphs.launches_per_step"] == 0.0


def test_cuda_graphs_candidate_does_not_fire_on_a_graphed_run(twins):
    (rule,) = [r for r in load_rules() if r.id == "cuda-graphs-candidate"]
    symptoms = {"host.short_kernel_fraction": 0.8, "kernels.count_per_step": 1000.0, "host.launch_bound_ms": 5.0,
                "blocking.host_launch_ms": 5.0, "step.time_ms": 100.0}
    for run, fires in (("eager", True), ("node", False), ("graph", False)):
        measured = api.analyze([twins[run]]).metrics["ranks"]["0"]
        ctx = Context(metrics={**measured, **symptoms})
        assert bool(evaluate_rules([rule], {"0": ctx}, ctx)) is fires, run


def test_graph_mode_needs_a_schema_with_the_graph_trace_table(tmp_path):
    sc = json.loads(json.dumps(SCENARIO))
    sc["output"]["schema"] = "2022.4"
    with pytest.raises(InputError, match="cuda_graph_trace graph needs schema 2024.2"):
        run_scenario(sc, tmp_path, seed=1)


def test_replays_join_the_kernels_at_their_widths(twins):
    """Replay rows merged among the kernels keep the kernel columns narrow (launch type int8, ids int32),
    the replays' missing launch type −1."""
    from perfdoctor.load.graph_trace import replay_mask
    from perfdoctor.load.nsys import load_export

    (path,) = twins["graph"].glob("*.sqlite")
    _, timelines = load_export(path, detail=False)
    k = next(tl.kernels for tl in timelines if len(tl.kernels))
    replays = replay_mask(k)
    assert replays.any() and not replays.all()
    assert k["launch_type"].dtype == np.int8 and set(k["launch_type"][replays].tolist()) == {-1}
    assert k["stream"].dtype == np.int32 and k["correlation_id"].dtype == np.int32
    assert k["device_id"].strides == (0,) and np.all(np.diff(k["start"]) >= 0)
