"""The CPU target: (spec, hardware) -> CpuKernelPlan -> C source. Pure; nothing here builds or runs.

Floors, lowest first (no module imports one above it):
  isa.py         one row per ISA (lanes, masks, A operand, transposes, dialect prelude, hand defaults)
  ir.py          GemmSchedule, DepthwiseSchedule, CpuKernelPlan: every tile and code-shape choice a field
  tiles.py       MicroTile, MicroTileScore, MicroTileEvaluator; enumeration and ranking of micro-tiles
  cost_model.py  the static cost model: StaticEvaluator, gemm_estimate, depthwise_estimate (named constants)
  decide.py      the code-shape decisions both planners take (c_store, stage_copy, row_tail, a_pack default)
  explain.py     TileLevel, CpuSynthesis (.explain(), .report())
  plans.py       hand_plan (tests, benchmarks), validated like synthesized plans
  synth.py       bottom-up growth and ranking: synthesize_cpu
  codegen.py     render context + Jinja: spelling only (never imports synth or cost_model)
  mutants.py     TEST-ONLY deliberately wrong kernels (edits of rendered C)
"""
