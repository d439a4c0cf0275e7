"""The GPU target: OpenCL kernel synthesis for mobile GPUs (Arm Mali, Qualcomm Adreno). Pure;
nothing here builds or runs (xfc.toolchain.opencl builds the harness, xfc.runners.pocl runs it,
xfc.pipeline.run_gpu_synth joins them).

    from xfc.gpu import synthesize_gpu
    result = synthesize_gpu(spec, hw)          # pure, deterministic, static cost model only
    print(result.plan.explain())

Levels, innermost first: per-work-item register tile -> work-group tile (optionally staged
through __local memory) -> grid. See docs/gpu.md. Floors, lowest first:
  ir.py          GpuKernelPlan and its tiles: every decision a field
  candidates.py  register tiles x work-group shapes x staging depths, with their load patterns
  cost_model.py  occupancy and the predicted time of a candidate (named assumptions)
  synth.py       ranking, the plan and the decisions it explains: synthesize_gpu
  codegen.py     template context + Jinja (templates/opencl/): spelling only
"""
from .ir import CostEstimate, GpuKernelPlan, Grid, RegisterTile, WorkGroupTile
from .synth import GpuSynthesis, gpu_of, synthesize_gpu

__all__ = ["GpuKernelPlan", "RegisterTile", "WorkGroupTile", "Grid", "CostEstimate", "synthesize_gpu",
           "GpuSynthesis", "gpu_of"]
