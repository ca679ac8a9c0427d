"""Make sample_traces/real_cs336/cs336_benchmark_nsys2022.sqlite: a CS336-style benchmark captured with
real nsys 2022.4 on the CPU, plus the GPU activity a GPU run of it would add.

usage (from the repository root, as root, nsys 2022.4 from scripts/install_nsys.sh, torch and
nvtx==0.2.11 importable by this interpreter):
    python -m tests.nsys.make_cs336_sample [OUTPUT]

1. ``tests/nsys/programs/cs336_benchmark.py`` (a small Transformer LM trained with AdamW on the CPU) runs
   under ``nsys profile --trace=nvtx`` as ``nobody`` with a minimal environment: its NVTX ranges
   (``init_model``, ``warmup``, ``benchmark_loop``; ``forward`` / ``backward`` / ``optimizer_step`` per
   iteration), their thread and their timing are real.
2. The export is scrubbed as make_real_sample does (other processes, environment blocks, unreferenced
   strings, VACUUM, byte scan).
3. A CPU capture has no CUDA tables, so :func:`add_gpu` writes the rows a GPU run adds, with the nsys 2022.4
   export DDL the simulator holds: inside ``init_model``, ``model.to("cuda")`` as one pageable
   host-to-device copy per parameter tensor (the model's real sizes, at ``PAGEABLE_GBPS``), each with its
   ``cudaMemcpyAsync`` call; inside every ``forward`` / ``backward`` / ``optimizer_step`` range, that pass's
   kernels (names as PyTorch's CUDA kernels are called) launched evenly over the range by
   ``cudaLaunchKernel`` calls on the range's thread. What is synthetic is said in the README.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sqlite3
import sys
import tempfile
from importlib import resources
from pathlib import Path

from tests.nsys.capture import CaptureError, export_sqlite, find_nsys, profile
from tests.nsys.make_real_sample import NOBODY, SampleError, _python_for_nobody, scan, scrub

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUTPUT = REPO / "sample_traces" / "real_cs336" / "cs336_benchmark_nsys2022.sqlite"
PROGRAM = Path(__file__).resolve().parent / "programs" / "cs336_benchmark.py"
WARMUP, STEPS = 1, 4
MAX_BYTES = 1_000_000
# Host-to-device copies from pageable memory (model.to("cuda") of freshly built weights) run well under
# the link's peak: a bounce through a pinned staging buffer.
PAGEABLE_GBPS = 3.0
# A GPU that keeps up with this CPU: each pass's kernels fill this share of the pass's launch spacing.
KERNEL_SHARE = 0.6
_PID_MASK = ~((1 << 24) - 1)
LAYER_KERNELS = {
    "forward": ["vectorized_layer_norm_kernel", "ampere_sgemm_128x64_tn", "cunn_SoftMaxForward",
                "ampere_sgemm_64x64_nn", "ampere_sgemm_128x64_tn", "vectorized_elementwise_kernel",
                "vectorized_layer_norm_kernel", "ampere_sgemm_128x128_tn", "GeluCUDAKernelImpl",
                "ampere_sgemm_128x64_tn", "vectorized_elementwise_kernel"],
    "backward": ["ampere_sgemm_128x64_nt", "ampere_sgemm_128x64_nn", "GeluBackwardCUDAKernelImpl",
                 "ampere_sgemm_128x128_nt", "ampere_sgemm_128x128_nn", "layer_norm_grad_input_kernel",
                 "GammaBetaBackwardCUDAKernel", "ampere_sgemm_64x64_nt", "cunn_SoftMaxBackward",
                 "ampere_sgemm_64x64_nn", "ampere_sgemm_128x64_nt", "ampere_sgemm_128x64_nn",
                 "layer_norm_grad_input_kernel", "GammaBetaBackwardCUDAKernel", "reduce_kernel",
                 "vectorized_elementwise_kernel"],
    "optimizer_step": ["multi_tensor_apply_kernel", "multi_tensor_apply_kernel", "vectorized_elementwise_kernel"],
}
MODEL_KERNELS = {  # once per pass: embedding, final norm, LM head, loss
    "forward": ["indexSelectLargeIndex", "vectorized_layer_norm_kernel", "ampere_sgemm_128x128_tn",
                "cunn_SoftMaxForward", "nll_loss_forward_reduce_cuda_kernel_2d"],
    "backward": ["nll_loss_backward_reduce_cuda_kernel_2d", "cunn_SoftMaxBackward", "ampere_sgemm_128x128_nt",
                 "ampere_sgemm_128x128_nn", "layer_norm_grad_input_kernel", "embedding_backward_cuda_kernel"],
    "optimizer_step": [],
}


def make_sample(output: Path) -> Path:
    if os.geteuid() != 0:
        raise SampleError("run as root (the capture drops to nobody with setpriv)")
    cli = find_nsys()
    if cli is None or cli.release != "2022.4":
        raise SampleError(f"needs nsys 2022.4 on PATH, found {cli}")
    if importlib.util.find_spec("nvtx") is None or importlib.util.find_spec("torch") is None:
        raise SampleError("needs torch and nvtx==0.2.11 importable by this interpreter")
    with tempfile.TemporaryDirectory(prefix="perfdoctor_cs336_") as tmp:
        work = Path(tmp)
        os.chmod(work, 0o755)
        program = Path(shutil.copy(PROGRAM, work / PROGRAM.name))
        out = work / "out"
        out.mkdir()
        os.chown(out, *NOBODY)
        env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8", "PYTHONNOUSERSITE": "1",
               "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}
        # The system interpreter of our version with this environment's packages on the path (nobody cannot
        # reach an interpreter under /root, where a virtual environment's symlink may lead)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p.endswith("site-packages"))
        python = _python_for_nobody(env)
        cap = profile([python, str(program), str(WARMUP), str(STEPS)], out / "cs336.nsys-rep",
                      nsys=cli.path, trace="nvtx", env=env, run_as=NOBODY)
        if cap.returncode != 0:
            raise SampleError(f"the program failed (rc={cap.returncode})\n{cap.log[-2000:]}")
        export = export_sqlite(cap.report, nsys=cli.path, env=env, run_as=NOBODY)
        scrub(export)
        add_gpu(export, _parameter_bytes())
        scrub(export)
        leaks = scan(export)
        if leaks:
            raise SampleError("secret-looking names left after scrubbing: " + ", ".join(leaks))
        if export.stat().st_size >= MAX_BYTES:
            raise SampleError(f"{export.stat().st_size} bytes; the sample must stay under {MAX_BYTES}")
        output.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(export, output)
    return output


def _parameter_bytes() -> list[int]:
    """Bytes of each parameter tensor of the benchmark's model (fp32), in registration order."""
    spec = importlib.util.spec_from_file_location("cs336_benchmark", PROGRAM)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [p.numel() * p.element_size() for p in module.build_model().parameters()]


def add_gpu(path: Path, parameter_bytes: list[int]) -> None:
    """Write the CUDA rows of a GPU run of the captured program into the export (module docstring)."""
    con = sqlite3.connect(path)
    try:
        ddl = resources.files("perfdoctor.synth").joinpath("ddl", "2022.4.2.sql").read_text()
        for statement in ddl.split(";"):
            if "CUPTI_ACTIVITY_KIND_" in statement and statement.strip().startswith("CREATE TABLE"):
                con.execute(statement.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1))
        strings = {v: i for i, v in con.execute("SELECT id, value FROM StringIds")}
        next_id = [max(strings.values(), default=0) + 1]

        def sid(text: str) -> int:
            if text not in strings:
                strings[text] = next_id[0]
                con.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (next_id[0], text))
                next_id[0] += 1
            return strings[text]

        rows = con.execute(
            "SELECT start, end, globalTid, coalesce(text, (SELECT value FROM StringIds WHERE id = textId)) "
            "FROM NVTX_EVENTS WHERE end IS NOT NULL ORDER BY start").fetchall()
        init = next(r for r in rows if r[3] == "init_model")
        tid = init[2]
        gpid = tid & _PID_MASK
        calls, kernels, copies = [], [], []
        corr, gpu_free = [0], [0]

        def call(name: str, start: int, end: int) -> int:
            corr[0] += 1
            calls.append((start, end, 0, tid, corr[0], sid(name), 0))
            return corr[0]

        # model.to("cuda"): one synchronous pageable copy per parameter, ending where init_model ends
        copy_ns = [int(b / (PAGEABLE_GBPS * 1e9) * 1e9) + 2_000 for b in parameter_bytes]
        t = init[1] - sum(copy_ns) - 20_000 * len(copy_ns)
        for nbytes, dur in zip(parameter_bytes, copy_ns):
            c = call("cudaMemcpyAsync_v3020", t, t + dur + 12_000)
            copies.append((t + 8_000, t + 8_000 + dur, 0, 1, 7, c, gpid, nbytes, 1, 0, 1, 0, 0, 1, 0, 1))
            t += dur + 20_000
            gpu_free[0] = max(gpu_free[0], t)
        for start, end, thread, text in rows:
            if thread != tid or text not in LAYER_KERNELS:
                continue
            names = LAYER_KERNELS[text] * 4 + MODEL_KERNELS[text]
            spacing = (end - start) // (len(names) + 1)
            for i, name in enumerate(names):
                at = start + (i + 1) * spacing
                c = call("cudaLaunchKernel_v7000", at, at + 4_000)
                k0 = max(gpu_free[0], at + 7_000)
                k1 = k0 + int(KERNEL_SHARE * spacing)
                kernels.append((k0, k1, 0, 1, 7, c, gpid, sid(name), sid(name), None, 1, 0, 32, 132, 1, 1, 256, 1, 1,
                                0, 0, 0, 0, corr[0], 0, None, 0))
                gpu_free[0] = k1
        con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, "
                        "correlationId, nameId, returnValue) VALUES (?, ?, ?, ?, ?, ?, ?)", calls)
        con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, end, deviceId, contextId, streamId, "
                        "correlationId, globalPid, bytes, copyKind, deprecatedSrcId, srcKind, dstKind, srcDeviceId, "
                        "srcContextId, dstDeviceId, dstContextId) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                        "?, ?)", copies)
        con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, "
                        "correlationId, globalPid, demangledName, shortName, mangledName, launchType, cacheConfig, "
                        "registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ, staticSharedMemory, "
                        "dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId, sharedMemoryExecuted, "
                        "graphNodeId, sharedMemoryLimitConfig) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                        "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", kernels)
        con.commit()
    finally:
        con.close()


if __name__ == "__main__":
    try:
        written = make_sample(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUTPUT)
    except (SampleError, CaptureError) as exc:
        sys.exit(f"make_cs336_sample: {exc}")
    print(f"wrote {written} ({written.stat().st_size} bytes)")
