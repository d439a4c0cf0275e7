"""OpenCL kernel synthesis for mobile GPUs (Arm Mali, Qualcomm Adreno).

    from xfc.gpu import synthesize_gpu, run_gpu_synth
    result = synthesize_gpu(spec, hw)          # pure, deterministic, static cost model only
    print(result.plan.explain())
    report = run_gpu_synth(spec, hw, "out/", dtype="fp32", verify=True, explain=True, bench=False)

Levels, innermost first: per-work-item register tile -> work-group tile (optionally staged
through __local memory) -> grid. See docs/gpu.md.
"""
from .ir import GpuKernelPlan, RegisterTile, WorkGroupTile, Grid, CostEstimate  # noqa: F401
from .synth import synthesize_gpu, GpuSynthesis, gpu_of  # noqa: F401


def run_gpu_synth(*args, **kwargs):
    """Render, build, run on PoCL and verify (see xfc.gpu.build.run_gpu_synth)."""
    from .build import run_gpu_synth as _run
    return _run(*args, **kwargs)


__all__ = ["GpuKernelPlan", "RegisterTile", "WorkGroupTile", "Grid", "CostEstimate", "synthesize_gpu",
           "GpuSynthesis", "gpu_of", "run_gpu_synth"]
