"""Derived figures: the only place peak numbers and the machine balance are computed."""
from __future__ import annotations

from .model import HardwareDescription


def derived_figures(hw: HardwareDescription) -> dict:
    """Peak FP32 GFLOP/s per core, per cluster, whole CPU, GPU, and the machine balance."""
    clusters = []
    for c in hw.clusters:
        clusters.append({
            "role": c.role, "core": c.core.name, "count": c.count, "clock_ghz": c.clock_ghz,
            "fp32_flop_per_cycle_per_core": c.core.fp32_flop_per_cycle,
            "peak_gflops_per_core": round(c.peak_gflops_per_core, 3),
            "peak_gflops_cluster": round(c.peak_gflops, 3),
        })
    cpu_total = sum(c.peak_gflops for c in hw.clusters)
    gpu_peak = hw.gpu.peak_fp32_gflops if hw.gpu else None
    out = {
        "clusters": clusters,
        "cpu_peak_gflops": round(cpu_total, 3) if hw.clusters else None,
        "gpu_peak_fp32_gflops": round(gpu_peak, 3) if gpu_peak is not None else None,
        "gpu_peak_fp16_gflops": round(hw.gpu.peak_fp16_gflops, 3) if hw.gpu and hw.gpu.peak_fp16_gflops else None,
        "dram_bandwidth_gbps": hw.memory.peak_bandwidth_gbps if hw.memory else None,
    }
    if hw.memory and hw.clusters:
        out["cpu_bytes_per_flop"] = round(hw.memory.peak_bandwidth_gbps / cpu_total, 4)
    if hw.memory and gpu_peak:
        out["gpu_bytes_per_flop"] = round(hw.memory.peak_bandwidth_gbps / gpu_peak, 4)
    return out
