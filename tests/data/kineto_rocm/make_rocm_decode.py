"""Write rocm_decode.json (run from the repository root): a small PyTorch-profiler trace shaped like what a ROCm
build of PyTorch writes (AMD TraceLens test traces of vLLM / SGLang decode were the model): HIP calls under
`hip_runtime`, numbers written as strings (`"bytes": "4096"`, some `correlation`s, `stream`, `ts` of metadata),
roctracer copy names (`CopyDeviceToHost`), a fill without `args`, Tensile GEMMs and aiter paged attention;
`load_model` uploads the weights before five `execute_model` decode steps."""
import json

PID, TID = 3351, 3351
events = [
    {"name": "process_name", "ph": "M", "ts": "1760000000000.000", "pid": PID, "tid": 0, "args": {"name": "python3"}},
    {"name": "thread_name", "ph": "M", "ts": "1760000000000.000", "pid": PID, "tid": TID,
     "args": {"name": "thread 3351 (python3)"}},
    {"name": "process_name", "ph": "M", "ts": "1760000000000.000", "pid": 0, "tid": 0, "args": {"name": "python3"}},
    {"name": "process_labels", "ph": "M", "ts": "1760000000000.000", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
]
t = 1760000000100.0
corr = 1000
gpu = t
KERNELS = [("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT128x128x64_MI16x16x1", 180.0),
           ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16> >", 12.0),
           ("_ZN5aiter35paged_attention_ll4mi_QKV_mfma16_kernelI14__hip_bfloat16", 95.0),
           ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>", 9.0)]


def launch(name, dur, api="hipLaunchKernel", cat="kernel", extra=None, corr_as_str=False):
    global t, corr, gpu
    corr += 1
    events.append({"ph": "X", "cat": "hip_runtime", "name": api, "pid": PID, "tid": TID, "ts": round(t, 3),
                   "dur": 4.5, "args": {"External id": corr + 50000,
                                        "correlation": str(corr) if corr_as_str else corr}})
    t += 6.0
    start = max(gpu, t + 3.0)
    args = {"device": 0, "stream": "0" if corr % 2 else 0, "correlation": corr, "External id": corr + 50000}
    args.update(extra or {})
    ev = {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 0, "ts": round(start, 3), "dur": dur, "args": args}
    if cat == "kernel":
        args.update({"kernel": name, "grid": [304, 1, 1], "block": [256, 1, 1]})
    events.append(ev)
    gpu = start + dur


# model load: weights uploaded before the first decode step
events.append({"ph": "X", "cat": "user_annotation", "name": "load_model", "pid": PID, "tid": TID, "ts": round(t, 3),
               "dur": 900.0, "args": {"External id": 1}})
for _ in range(6):
    launch("Memcpy HtoD (Host -> Device)", 140.0, api="hipMemcpyAsync", cat="gpu_memcpy",
           extra={"bytes": "67108864", "memory bandwidth (GB/s)": "479.3"})
t = max(t, gpu) + 100.0
for step in range(5):
    s0 = t
    for layer in range(6):
        for name, dur in KERNELS:
            launch(name, dur, corr_as_str=(layer == 3))
    launch("CopyDeviceToHost", 3.0, api="hipMemcpyWithStream", cat="gpu_memcpy", extra={"bytes": "512"})
    events.append({"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 0,
                   "ts": round(gpu, 3), "dur": "1.5"})  # no args at all
    t = max(t, gpu) + 40.0
    events.append({"ph": "X", "cat": "user_annotation", "name": "execute_model", "pid": PID, "tid": TID,
                   "ts": round(s0 - 2.0, 3), "dur": round(t - s0, 3), "args": {"External id": 2 + step}})
    t += 250.0  # the scheduler's Python between decode steps
doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "AMD Instinct MI300X", "totalGlobalMem": 205822885888,
                                                  "computeMajor": 9, "computeMinor": 4, "maxThreadsPerBlock": 1024,
                                                  "numSms": 304}],
       "distributedInfo": {"backend": "nccl", "rank": "0", "world_size": "1"},
       "traceEvents": events, "traceName": "rocm_decode.json", "displayTimeUnit": "ms"}
# PyTorch's layout: one event per indented block, so the reader's chunked path applies
head = {k: v for k, v in doc.items() if k != "traceEvents"}
body = ",\n".join("  {\n    " + json.dumps(e)[1:-1] + "\n  }" for e in events)
with open("tests/data/kineto_rocm/rocm_decode.json", "w") as f:
    f.write("{\n" + "".join(f'  "{k}": {json.dumps(v)},\n' for k, v in head.items())
            + '  "traceEvents": [\n' + body + "\n  ]\n}\n")
