"""GPU performance models: what a kernel or a transfer costs on a given device.

Durations in the simulator come from FLOPs and bytes divided by these rates, so a scenario that changes
the GPU (or its interconnect) changes the timeline the way real hardware would, without hand-tuned
per-kernel constants. Peak numbers are dense (not sparse) datasheet values, see research/megatron.md §5.3.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class GpuModel:
    """Rates of one device and its links; efficiencies turn peaks into achievable throughput."""

    name: str
    sm_count: int
    bf16_tflops: float
    fp8_tflops: float
    hbm_gbps: float  # memory bandwidth, GB/s
    nvlink_gbps: float  # per-GPU unidirectional NVLink bandwidth, GB/s
    network_gbps: float  # per-GPU network (IB/RoCE) bandwidth, GB/s
    pcie_gbps: float = 40.0  # achievable pinned host<->device copy rate (PCIe gen5 x16), GB/s
    nvlink_latency_us: float = 8.0
    network_latency_us: float = 20.0
    total_memory: int = 80 * 2**30
    clock_rate_hz: int = 1_980_000_000
    compute_major: int = 9
    compute_minor: int = 0
    chip: str = "GH100"
    gemm_efficiency: float = 0.72
    attention_efficiency: float = 0.55
    memory_efficiency: float = 0.75

    def gemm_ns(self, flops: float, fp8: bool = False) -> float:
        """Time of a tensor-core GEMM of `flops` at the achievable fraction of peak."""
        peak = self.fp8_tflops if fp8 else self.bf16_tflops
        return flops / (peak * 1e12 * self.gemm_efficiency) * 1e9 + 3_000.0

    def attention_ns(self, flops: float) -> float:
        """Fused attention runs below GEMM efficiency (softmax, masking, small head dims)."""
        return flops / (self.bf16_tflops * 1e12 * self.attention_efficiency) * 1e9 + 4_000.0

    def memory_ns(self, nbytes: float) -> float:
        """Bandwidth-bound kernels (norms, element-wise, casts, optimizer)."""
        return nbytes / (self.hbm_gbps * 1e9 * self.memory_efficiency) * 1e9 + 2_000.0

    def copy_ns(self, nbytes: float) -> float:
        """Host<->device copy over PCIe; small copies cost the DMA setup (~1 us in real exports)."""
        return nbytes / (self.pcie_gbps * 1e9) * 1e9 + 1_000.0

    def fill_ns(self, nbytes: float) -> float:
        """cudaMemset: write-only, so it streams at the achievable HBM rate; a 4-byte fill takes ~0.8 us."""
        return nbytes / (self.hbm_gbps * 1e9 * self.memory_efficiency) * 1e9 + 800.0

    def link_ns(self, nbytes: float, network: bool) -> float:
        """Point-to-point time of `nbytes` over NVLink or the network, latency included."""
        gbps, lat = (
            (self.network_gbps, self.network_latency_us) if network else (self.nvlink_gbps, self.nvlink_latency_us)
        )
        return nbytes / (gbps * 1e9) * 1e9 + lat * 1e3


GPUS: dict[str, GpuModel] = {
    "H100": GpuModel("NVIDIA H100 80GB HBM3", 132, 989.0, 1979.0, 3350.0, 450.0, 50.0),
    "H200": GpuModel("NVIDIA H200", 132, 989.0, 1979.0, 4800.0, 450.0, 50.0, total_memory=141 * 2**30),
    "A100": GpuModel(
        "NVIDIA A100-SXM4-80GB",
        108,
        312.0,
        312.0,
        2039.0,
        300.0,
        25.0,
        pcie_gbps=20.0,
        clock_rate_hz=1_410_000_000,
        compute_major=8,
        chip="GA100",
    ),
    "B200": GpuModel(
        "NVIDIA B200",
        148,
        2250.0,
        4500.0,
        8000.0,
        900.0,
        50.0,
        total_memory=180 * 2**30,
        clock_rate_hz=1_965_000_000,
        compute_major=10,
        chip="GB100",
    ),
}


def gpu_model(name: str, overrides: dict[str, float] | None = None) -> GpuModel:
    """Catalogue entry `name` with scenario overrides applied (e.g. a slower network)."""
    return replace(GPUS[name], **(overrides or {}))
