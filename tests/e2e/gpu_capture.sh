#!/usr/bin/env bash
# End to end on a GPU machine: a small GPT (tests/e2e/gpt_train.py, DDP over every GPU) trained for 4 steps
# under `perfdoctor capture --profiler torch --steps 1-2`, then `perfdoctor analyze` of the run directory,
# then checks of what both produced. Prints one summary line per check; exits non-zero if one fails.
#
# usage: tests/e2e/gpu_capture.sh [--cpu] [WORK_DIR]
#   --cpu     the same on CPU (gloo, CPU activity only, no memory snapshots): checks the script itself
#   WORK_DIR  where the run directory (WORK_DIR/run) and the report (WORK_DIR/report.json) go
#             (default: a new temporary directory)
# env: PYTHON (default python3), NPROC (ranks; default: the GPU count, 2 with --cpu)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
device=cuda
if [ "${1:-}" = "--cpu" ]; then device=cpu; shift; fi
work=${1:-$(mktemp -d)}
mkdir -p "$work"
if [ -z "${NPROC:-}" ]; then
    if [ "$device" = cuda ]; then
        NPROC=$("$python" -c "import torch; print(torch.cuda.device_count())")
        if [ "$NPROC" -lt 1 ]; then echo "gpu_capture.sh: no CUDA device visible to torch (use --cpu)" >&2; exit 2; fi
    else
        NPROC=2
    fi
fi
torchrun=("$python" -m torch.distributed.run)
"$python" -m perfdoctor capture --profiler torch --out "$work/run" --steps 1-2 -- \
    "${torchrun[@]}" --nproc_per_node "$NPROC" "$here/gpt_train.py" --device "$device" --steps 4
"$python" -m perfdoctor analyze "$work/run" --format json > "$work/report.json"
"$python" - "$work" "$device" "$NPROC" <<'PY'
import json, sys
from pathlib import Path

work, device, nproc = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
run, report = work / "run", json.loads((work / "report.json").read_text())
manifest = json.loads((run / "manifest.json").read_text())
failed = []


def check(ok, what):
    print(f"{'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        failed.append(what)


ranks = list(range(nproc))
print(f"device: {device}, gpus: {manifest['gpus'] or 'none'}, torch {manifest['versions'].get('torch')}, "
      f"ranks {nproc}")
check(manifest["profiler"] == "torch" and manifest["exit_code"] == 0, "manifest: profiler torch, exit code 0")
check(sorted(p.name for p in run.glob("rank*.pt.trace.json.gz")) == [f"rank{r}.pt.trace.json.gz" for r in ranks],
      "one Kineto trace per rank")
check(report["run"]["ranks"] == ranks, f"analyze: ranks {report['run']['ranks']}")
check(report["steps"]["source"] == "nvtx-step" and report["steps"]["count"] == 2,
      f"analyze: steps {report['steps']}")
check(all(d["nvtx_domains"].get("perfdoctor", 0) > 0 for d in report["devices"]), "capture labels read")
if device == "cuda":
    snapshots = sorted(p.name for p in (run / "memory").glob("rank*.pickle"))
    check(snapshots == [f"rank{r}.pickle" for r in ranks], f"memory snapshots {snapshots}")
    check(all(d["device_id"] is not None and d["kernel_count"] > 0 for d in report["devices"]),
          "kernels on every rank's GPU: " + ", ".join(f"{d['kernel_count']}" for d in report["devices"]))
    groups = {g: sorted(info["label_source"]) for d in report["devices"] for g, info in d["groups"].items()}
    print(f"comm groups and label sources: {groups}")
    if nproc > 1:
        check("capture" in groups.get("dp", []), "dp comm kernels labelled from the capture")
    print(f"step median {report['steps']['median_ms']:.2f} ms; gpu.busy_fraction "
          f"{report['metrics']['all']['gpu.busy_fraction']}; findings: {[f['rule'] for f in report['findings']]}")
else:
    check(all(m["status"] == "skipped" for m in manifest["memory"].values()), "memory snapshots skipped (no CUDA)")
    check(any("no CUDA data" in w for w in report["warnings"]), "analyze says the trace has no CUDA data")
print(f"run directory {run}; report {work / 'report.json'}")
sys.exit(1 if failed else 0)
PY
