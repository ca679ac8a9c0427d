"""The truth JSON must agree with quantities recomputed from the SQLite file alone (plain sqlite3/numpy,
no simulator code): exposed comm per group, host gaps by cause, LN-blocked norms, step boundaries. The device
is busy while a kernel, copy or fill runs, so idle gaps and the op that ends one come from all three tables."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import numpy as np
import pytest

COMM = re.compile(r"^(nccl|k?userbuffers)")
TOL_MS = 1e-5


def _union(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(s) == 0:
        return s, e
    o = np.argsort(s, kind="stable")
    s, e = s[o], e[o]
    out_s, out_e = [int(s[0])], [int(e[0])]
    for a, b in zip(s[1:].tolist(), e[1:].tolist()):
        if a > out_e[-1]:
            out_s.append(a)
            out_e.append(b)
        else:
            out_e[-1] = max(out_e[-1], b)
    return np.asarray(out_s, np.int64), np.asarray(out_e, np.int64)


def _measure(s: np.ndarray, e: np.ndarray, lo: int, hi: int) -> int:
    return int((np.clip(e, lo, hi) - np.clip(s, lo, hi)).sum())


def _load(path: Path) -> dict:
    con = sqlite3.connect(path)
    strings = dict(con.execute("SELECT id, value FROM StringIds"))
    procs = {}
    for (gp,) in con.execute("SELECT DISTINCT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL"):
        pid = (gp >> 24) & 0xFFFFFF
        k = con.execute(
            "SELECT start, end, streamId, shortName, correlationId, launchType FROM CUPTI_ACTIVITY_KIND_KERNEL "
            "WHERE globalPid=? ORDER BY start",
            (gp,),
        ).fetchall()
        r = con.execute(
            "SELECT start, end, correlationId, nameId, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME "
            "WHERE globalTid >> 24 = ? >> 24",
            (gp,),
        ).fetchall()
        doms = {
            d: t
            for d, t in con.execute(
                "SELECT domainId, text FROM NVTX_EVENTS WHERE eventType=75 AND globalTid >> 24 = ? >> 24", (gp,)
            )
        }
        nv = [
            (s, e, strings.get(tid, txt), doms.get(d))
            for s, e, txt, tid, d in con.execute(
                "SELECT start, end, text, textId, domainId FROM NVTX_EVENTS "
                "WHERE eventType=59 AND globalTid >> 24 = ? >> 24",
                (gp,),
            )
        ]
        ops = con.execute(
            "SELECT start, end, correlationId FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE globalPid=? UNION ALL "
            "SELECT start, end, correlationId FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE globalPid=?",
            (gp, gp),
        ).fetchall()
        procs[pid] = {"k": k, "r": r, "nvtx": nv, "ops": ops}
    con.close()
    return {"strings": strings, "procs": procs}


def _groups(proc: dict, strings: dict) -> np.ndarray:
    """Group of each comm kernel from the enclosing `comm` NVTX range of its launch (userbuffers: tp)."""
    launch = {c: (s, e) for s, e, c, _, _ in proc["r"]}
    comm_ranges = sorted(
        (s, e, re.search(r"group=(\w+)", t).group(1))
        for s, e, t, d in proc["nvtx"]
        if d == "perfdoctor" and t.startswith("comm ")
    )
    starts = np.asarray([c[0] for c in comm_ranges], np.int64)
    out = []
    for _s, _e, _stream, name, corr, _lt in proc["k"]:
        short = strings[name]
        if not COMM.match(short):
            out.append("")
        elif "userbuffers" in short:
            out.append("tp")
        else:
            a, b = launch[corr]
            i = int(np.searchsorted(starts, a, side="right")) - 1
            while i >= 0 and not (comm_ranges[i][0] <= a and b <= comm_ranges[i][1]):
                i -= 1
            out.append(comm_ranges[i][2] if i >= 0 else "?")
    return np.asarray(out)


def _cause(t: int, proc: dict, strings: dict) -> str:
    for s, e, _, n, _ in proc["r"]:
        if strings[n].startswith(("cudaStreamSynchronize", "cudaDeviceSynchronize")) and s <= t < e:
            return "sync"
    for s, e, text, dom in proc["nvtx"]:
        if dom == "perfdoctor" and s <= t < e:
            if text.startswith("gc "):
                return "gc"
    for s, e, text, dom in proc["nvtx"]:
        if dom == "perfdoctor" and s <= t < e and text == "data":
            return "data"
    return "launch_bound"


def _traces(generated: dict) -> list[Path]:
    return [p for paths in generated.values() for p in paths]


def test_every_scenario_wrote_truth(generated: dict) -> None:
    for paths in generated.values():
        for p in paths:
            assert p.with_suffix(".truth.json").exists()


@pytest.mark.parametrize(
    "name",
    [
        "clean_baseline",
        "exposed_dp",
        "exposed_tp",
        "exposed_cp",
        "pp_1f1b",
        "pp_interleaved",
        "host_bound",
        "gc_jitter",
        "ln_blocked",
        "per_node",
        "unlabeled",
        "tp_overlap_connections",
        "moe_ep",
    ],
)
def test_truth_matches_sqlite(generated: dict, name: str) -> None:
    for path in generated[name]:
        truth = json.loads(path.with_suffix(".truth.json").read_text())
        data = _load(path)
        labeled = truth["labels"]["perfdoctor"]
        latency = truth["launch_latency_ns"]
        by_pid = {v["pid"]: v for v in truth["ranks"].values()}
        assert set(by_pid) == set(data["procs"])
        for pid, proc in data["procs"].items():
            rt = by_pid[pid]
            k = np.asarray([(s, e, st, c, lt) for s, e, st, _, c, lt in proc["k"]], np.int64)
            start, end, stream = k[:, 0], k[:, 1], k[:, 2]
            names = [data["strings"][x[3]] for x in proc["k"]]
            is_comm = np.asarray([bool(COMM.match(n)) for n in names])
            cs, ce = _union(start[~is_comm], end[~is_comm])
            # every device op: kernels, then copies and fills (start, end, correlationId)
            dev = np.asarray([(s, e, c) for s, e, _, _, c, _ in proc["k"]] + proc["ops"], np.int64)
            dev = dev[np.argsort(dev[:, 0], kind="stable")]
            as_, ae = _union(dev[:, 0], dev[:, 1])
            groups = _groups(proc, data["strings"]) if labeled else None
            launch = {c: (s, e) for s, e, c, _, _ in proc["r"]}
            if labeled:
                steps = sorted((s, e) for s, e, t, d in proc["nvtx"] if d == "perfdoctor" and t.startswith("step "))
                assert [s for s, _ in steps] == [st["start_ns"] for st in rt["steps"]]
            for st in rt["steps"]:
                lo, hi = st["start_ns"], st["end_ns"]
                comp = _measure(cs, ce, lo, hi)
                assert abs(comp / 1e6 - st["compute_ms"]) < TOL_MS
                ms, me = _union(np.concatenate([cs, start[is_comm]]), np.concatenate([ce, end[is_comm]]))
                assert abs((_measure(ms, me, lo, hi) - comp) / 1e6 - st["exposed_total_ms"]) < TOL_MS
                if labeled:
                    for g in ("dp", "tp", "cp", "pp", "ep"):
                        sel = groups == g
                        gs, ge = _union(np.concatenate([cs, start[sel]]), np.concatenate([ce, end[sel]]))
                        assert abs((_measure(gs, ge, lo, hi) - comp) / 1e6 - st["exposed_ms"][g]) < TOL_MS, g
                # host gaps
                gap_s = np.concatenate([[lo], np.clip(ae, lo, hi)])
                gap_e = np.concatenate([np.clip(as_, lo, hi), [hi]])
                host = {"launch_bound": 0, "sync": 0, "gc": 0, "data": 0}
                wait = 0
                for g0, g1 in zip(gap_s.tolist(), gap_e.tolist()):
                    if g1 <= g0:
                        continue
                    nxt = np.flatnonzero(dev[:, 0] >= g1)
                    caused = len(nxt) == 0 or launch[int(dev[nxt[0], 2])][0] >= g0
                    if caused:
                        host[_cause(g0, proc, data["strings"])] += g1 - g0
                    else:
                        wait += g1 - g0
                if labeled:
                    for c, v in host.items():
                        assert abs(v / 1e6 - st["host_gap_ms"][c]) < TOL_MS, c
                else:
                    assert abs(sum(host.values()) / 1e6 - sum(st["host_gap_ms"].values())) < TOL_MS
                assert abs(wait / 1e6 - st["device_wait_ms"]) < TOL_MS
                # LN blocked: cooperative norms that started later than their launch and stream allowed
                count, delay = 0, 0
                prev_end: dict[int, int] = {}
                for i in range(len(start)):
                    if k[i, 4] == 2 and lo <= start[i] < hi:
                        free = max(launch[int(k[i, 3])][1] + latency, prev_end.get(int(stream[i]), 0))
                        assert start[i] >= free
                        if start[i] > free:
                            count += 1
                            delay += int(start[i] - free)
                    prev_end[int(stream[i])] = int(end[i])
                assert count == st["ln_blocked_count"]
                assert abs(delay / 1e6 - st["ln_blocked_ms"]) < TOL_MS


def test_pathologies_show_in_truth(generated: dict) -> None:
    """Each scenario produces the pathology it is named after (and the baseline does not)."""

    def last(name: str, i: int = 0) -> dict:
        t = json.loads(generated[name][i].with_suffix(".truth.json").read_text())
        return next(iter(t["ranks"].values()))["steps"][-1]

    base = last("clean_baseline")
    assert base["ln_blocked_count"] == 0 and base["exposed_total_ms"] < 0.35 * base["step_ms"]
    assert last("exposed_dp")["exposed_ms"]["dp"] > 0.5 * last("exposed_dp")["step_ms"]
    assert last("exposed_tp")["exposed_ms"]["tp"] > 0.15 * last("exposed_tp")["step_ms"]
    assert last("exposed_cp")["exposed_ms"]["cp"] > 0.3 * last("exposed_cp")["step_ms"]
    assert last("host_bound")["host_gap_ms"]["launch_bound"] > 0.3 * last("host_bound")["step_ms"]
    assert last("gc_jitter")["host_gap_ms"]["gc"] > 10
    assert last("ln_blocked")["ln_blocked_count"] > 0
    assert last("moe_ep")["exposed_ms"]["ep"] > 0
    for name in ("pp_1f1b", "pp_interleaved"):
        assert all(last(name, i)["bubble_fraction"] > 0.1 for i in range(4))
