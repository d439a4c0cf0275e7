"""Bottom-up OpenCL tile synthesis for Mali and Adreno, ranked by a static cost model.

Enumeration, innermost level first:
  1. register tiles the work-item can hold (accumulators + operands + addressing registers),
     rejected when they would spill;
  2. work-group shapes allowed by the description (size cap, wave multiples) and, where the
     reduction allows it, __local staging depths that fit local memory;
  3. the grid covering the output.
Candidates come from candidates.py; every one gets a predicted time from cost_model.py (the max
of ALU, L1, local-memory, L2, DRAM and latency terms, plus a launch overhead). This module ranks
them and builds the plan, with every code-shape decision. Nothing is measured; the result is a
pure, deterministic function of (spec, hardware, dtype, work-group cap).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from .._version import __version__
from ..errors import HardwareError, OperatorError
from ..ops.spec import Conv2dSpec, DepthwiseSpec, MatmulSpec, OperatorSpec
from .candidates import CANDIDATES, Candidate, ceil_div, work_group_shapes
from .cost_model import dram_gbps, evaluate
from .ir import DTYPES, PREDICTION_LABEL, GpuKernelPlan, Grid, RegisterTile, WorkGroupTile

TOP_ALTERNATIVES = 5


@dataclass(frozen=True)
class GpuSynthesis:
    plan: GpuKernelPlan
    alternatives: tuple[GpuKernelPlan, ...]   # next best plans, best first (cost-model ranking)
    predicted_gflops: float                   # cost-model prediction, not a measurement
    synthesis_seconds: float
    candidates_evaluated: int

    @property
    def kernel_variants(self) -> dict[str, GpuKernelPlan]:
        """Every kernel file the plan ships, by variant: the plan's own, and for dtype fp16 also the
        fp16-storage / fp32-arithmetic variant, which runs on devices without cl_khr_fp16."""
        out = {self.plan.variant: self.plan}
        if self.plan.dtype == "fp16":
            out["fp16_storage"] = self.plan.with_variant("fp16_storage")
        return out

    @property
    def portable_variant(self) -> str:
        """The variant that runs on any OpenCL device (PoCL lacks cl_khr_fp16): what is verified here."""
        return "fp16_storage" if self.plan.dtype == "fp16" else "fp32"

    def explain(self) -> str:
        lines = [self.plan.explain(), "", f"ranked alternatives ({PREDICTION_LABEL}):"]
        for i, alt in enumerate(self.alternatives, 1):
            lines.append(f"  {i}. {alt.tile_summary()} -> {alt.cost.seconds * 1e6:.1f} us, "
                         f"{alt.cost.gflops:.1f} GFLOP/s, bound by {alt.cost.bound}")
        lines.append(f"{self.candidates_evaluated} candidates evaluated in {self.synthesis_seconds * 1e3:.1f} ms")
        return "\n".join(lines)


# ---- hardware access -----------------------------------------------------------------------

def gpu_of(hw):
    """(hardware name, GpuDescription) from a HardwareDescription or a bare GpuDescription."""
    if hw is None:
        raise HardwareError("no hardware description given for the GPU target")
    if hasattr(hw, "warp_width") and hasattr(hw, "family"):
        return getattr(hw, "name", "gpu"), hw
    if not hasattr(hw, "gpu"):
        raise HardwareError(f"'{getattr(hw, 'name', hw)}' is not a hardware description")
    if hw.gpu is None:
        raise HardwareError(f"hardware '{hw.name}' has no GPU section; the GPU target needs a SoC or gpu/ "
                            f"description")
    return hw.name, hw.gpu


def _check_request(gpu, hw_name: str, dtype: str, max_work_group_size: Optional[int]) -> int:
    if dtype not in DTYPES:
        raise OperatorError(f"unknown dtype '{dtype}' for the GPU target (expected one of {', '.join(DTYPES)})")
    if dtype == "fp16":
        if gpu.fp16_flop_per_clock_per_cu is None:
            raise HardwareError(f"dtype fp16 requested but GPU '{gpu.name}' of '{hw_name}' has no fp16 arithmetic "
                                f"(fp16_flop_per_clock_per_cu is null)")
        if "cl_khr_fp16" not in tuple(gpu.extensions):
            raise HardwareError(f"dtype fp16 requested but GPU '{gpu.name}' of '{hw_name}' does not list the "
                                f"cl_khr_fp16 OpenCL extension")
    cap = int(gpu.max_work_group_size)
    if max_work_group_size is not None:
        if isinstance(max_work_group_size, bool) or not isinstance(max_work_group_size, int) \
                or max_work_group_size < 1:
            raise OperatorError(f"max work-group size must be a positive integer, got {max_work_group_size!r}")
        if max_work_group_size > gpu.max_work_group_size:
            raise OperatorError(f"requested work-group size {max_work_group_size} is larger than the "
                                f"{gpu.max_work_group_size} that GPU '{gpu.name}' allows")
        cap = max_work_group_size
    return cap


# ---- plan construction ----------------------------------------------------------------------

_TEMPLATES = {"matmul": ("matmul.cl.j2", "gemm", "M", "N"),
              "conv2d": ("conv2d.cl.j2", "implicit_gemm", "out-channels", "pixels"),
              "depthwise": ("depthwise.cl.j2", "direct_depthwise", "rows", "cols")}


def _plan(spec, cand: Candidate, cost, occ, hw_name, gpu, dtype, cap, cap_reason, decisions) -> GpuKernelPlan:
    template, lowering, row_axis, col_axis = _TEMPLATES[spec.name]
    variant = "fp16" if dtype == "fp16" else "fp32"
    rt = RegisterTile(rows=cand.rows, cols=cand.cols, vector_width=cand.vec, k_unroll=cand.k_unroll,
                      registers=cand.registers, row_axis=row_axis, col_axis=col_axis)
    wgt = WorkGroupTile(x=cand.wx, y=cand.wy, local_staging=bool(cand.depth), stage_depth=cand.depth,
                        local_bytes=cand.local_bytes, block_rows=cand.rows * cand.wy, block_cols=cand.cols * cand.wx)
    grid = Grid(global_size=tuple(cand.global_size), local_size=(cand.wx, cand.wy, 1))
    gpu_name = getattr(gpu, "name", gpu.family)
    header = (
        f"xfc {__version__} OpenCL kernel for {hw_name} ({gpu_name}, {gpu.family})",
        f"operator: {spec.describe()}",
        f"dtype {dtype}, variant {variant}, lowering {lowering}",
        f"tiles: {_tile_summary(rt, wgt, grid)}",
        f"predicted {cost.seconds * 1e6:.1f} us / {cost.gflops:.1f} GFLOP/s bound by {cost.bound} "
        f"({PREDICTION_LABEL})",
    )
    limits = (("max_work_group_size", int(gpu.max_work_group_size)), ("work_group_cap", cap),
              ("work_group_cap_reason", cap_reason),
              ("preferred_work_group_size", int(gpu.preferred_work_group_size)),
              ("local_memory_bytes", int(gpu.local_memory_kib * 1024)),
              ("local_memory_on_chip", bool(gpu.local_memory_on_chip)),
              ("l1_kib_per_cu", gpu.l1_kib_per_cu), ("compute_units", int(gpu.compute_units)))
    kname = f"xfc_{spec.name}"
    flags = dict(cand.flags)
    # matmul stores: a vector may cross N (partial vectors) or, staged, start off its nominal column
    # (clamped columns): then every store is checked and falls back to lanes
    guarded = spec.name == "matmul" and (flags["partial_vector"] or (bool(cand.depth) and flags["clamp_n"]))
    return GpuKernelPlan(spec=spec, hardware_name=hw_name, gpu_name=gpu_name, family=gpu.family, dtype=dtype,
                         variant=variant, lowering=lowering, template=template, kernel_name=kname,
                         register_tile=rt, work_group=wgt, grid=grid, constants=cand.constants, flags=cand.flags,
                         occupancy=occ, cost=cost, limits=limits, decisions=tuple(decisions),
                         header_lines=header, version=__version__, guarded_vector_store=guarded)


def _tile_summary(rt, wg, grid) -> str:
    st = f"staged depth {wg.stage_depth}" if wg.local_staging else "no local staging"
    return (f"REG {rt.describe()}; WG {wg.x}x{wg.y} ({st}); "
            f"GRID {'x'.join(map(str, grid.global_size))}")


def _decisions(ranked, gpu, cap, cap_reason, eb, line) -> list[str]:
    (best, cost, occ, info) = ranked[0]
    out = []
    on_chip = bool(gpu.local_memory_on_chip)
    staged_alts = [r for r in ranked if r[0].depth]
    plain_alts = [r for r in ranked if not r[0].depth]
    us = lambda c: f"{c.seconds * 1e6:.1f} us"  # noqa: E731
    if best.depth:
        alt = plain_alts[0] if plain_alts else None
        why = (f"__local memory is on chip ({gpu.local_memory_kib} KiB) and the {gpu.l1_kib_per_cu} KiB L1 "
               f"cannot hold the resident groups' working set "
               f"({int(best.working_set)} B x {occ.work_groups_per_cu}), so staging the block's operands cuts "
               f"L2 traffic")
        if alt:
            why += f" ({info['l2_bytes'] / 1e6:.1f} MB vs {alt[3]['l2_bytes'] / 1e6:.1f} MB without; " \
                   f"{us(cost)} vs {us(alt[1])})"
        out.append("local staging chosen: " + why)
    elif not on_chip:
        why = (f"local staging rejected: __local memory is NOT on chip on {getattr(gpu, 'name', gpu.family)}, "
               f"so staging only adds a copy through the same load/store cache")
        if staged_alts:
            why += f" (best staged alternative {us(staged_alts[0][1])} vs {us(cost)})"
        out.append(why)
    elif staged_alts:
        out.append(f"local staging not chosen: the L1 already captures the reuse or the reduction is too short "
                   f"(best staged alternative {us(staged_alts[0][1])} vs {us(cost)})")
    else:
        out.append("local staging not applicable to this lowering (direct kernel, no shared reduction operand)")
    wg = best.wx * best.wy
    out.append(f"work-group {best.wx}x{best.wy} = {wg} work-items: capped at {cap} by {cap_reason}; "
               f"{ceil_div(wg, int(gpu.warp_width))} wave(s) of {gpu.warp_width} per group")
    if occ.registers <= occ.register_budget:
        out.append(f"register tile {best.rows}x{best.cols}: ~{occ.registers} registers within the "
                   f"{occ.register_budget}-register budget, {occ.waves_resident} waves resident")
    else:
        small = [r for r in ranked if r[2].registers <= r[2].register_budget]
        if small:
            out.append(f"register tile {best.rows}x{best.cols}: ~{occ.registers} registers exceeds the "
                       f"{occ.register_budget}-register budget ({occ.waves_resident} waves resident, limited by "
                       f"{occ.limiter}) but the extra reuse pays; best tile within budget "
                       f"{us(small[0][1])} vs {us(cost)}")
        else:
            out.append(f"register tile {best.rows}x{best.cols}: ~{occ.registers} registers; no candidate fits the "
                       f"{occ.register_budget}-register full-occupancy budget, so {occ.waves_resident} waves are "
                       f"resident (limited by {occ.limiter}) and the tile trades reuse against waves")
    if dict(best.flags).get("weights_per_row"):
        out.append(f"window weights loaded one row ({dict(best.constants)['S']} values) at a time: all "
                   f"{dict(best.constants)['R'] * dict(best.constants)['S']} alone exceed the "
                   f"{occ.register_budget}-register budget")
    out.append(f"bound: {cost.bound} (largest cost-model term)")
    return out


def synthesize_gpu(spec: OperatorSpec, hw, dtype: str = "fp32",
                   max_work_group_size: Optional[int] = None, alu_efficiency: float = 1.0) -> GpuSynthesis:
    """Pick register, work-group and grid tiles for spec on hw's GPU. Pure and deterministic.
    alu_efficiency: see xfc.gpu.cost_model.evaluate (1.0: the description's FLOP rate)."""
    start = time.perf_counter()
    hw_name, gpu = gpu_of(hw)
    if not isinstance(spec, (MatmulSpec, Conv2dSpec, DepthwiseSpec)):
        raise OperatorError(f"GPU synthesis does not support operator {getattr(spec, 'name', spec)!r}")
    if gpu.family not in ("mali", "adreno"):
        raise HardwareError(f"GPU family '{gpu.family}' of '{hw_name}' is not supported (expected mali or adreno)")
    cap = _check_request(gpu, hw_name, dtype, max_work_group_size)
    _, top = work_group_shapes(gpu, cap)
    if gpu.family == "mali" and top < cap:
        cap_reason = f"the Mali preferred size {gpu.preferred_work_group_size} (Arm guidance: at most 64 work-items)"
    elif max_work_group_size is not None:
        cap_reason = f"the requested maximum {max_work_group_size}"
    else:
        cap_reason = f"the device maximum {gpu.max_work_group_size}"
    cap_eff = min(cap, top)
    half = dtype == "fp16"
    eb = 2 if half else 4
    line = max(32, int(gpu.coalescing_threads) * 4)
    dram = dram_gbps(hw)
    gen = CANDIDATES[spec.name]
    scored = []
    n = 0
    for cand in gen(spec, gpu, cap_eff, half, eb, line):
        n += 1
        res = evaluate(cand, spec, gpu, half, eb, line, dram, alu_efficiency)
        if res is None:
            continue
        cost, occ, info = res
        # deterministic ranking: time, then fewer registers, then larger groups, then the tuple of tiles
        key = (round(cost.seconds, 12), cand.registers, -(cand.wx * cand.wy), cand.rows, cand.cols, cand.vec,
               cand.wx, cand.depth)
        scored.append((key, cand, cost, occ, info))
    if not scored:
        raise OperatorError(f"no GPU tile fits {spec.describe()} on '{hw_name}' within a work-group cap of {cap}")
    scored.sort(key=lambda t: t[0])
    ranked = [(c, cost, occ, info) for _, c, cost, occ, info in scored]
    decisions = _decisions(ranked, gpu, cap_eff, cap_reason, eb, line)
    best = ranked[0]
    plan = _plan(spec, best[0], best[1], best[2], hw_name, gpu, dtype, cap_eff, cap_reason, decisions)
    alts = []
    seen = {plan.tile_summary()}
    for c, cost, occ, info in ranked[1:]:
        p = _plan(spec, c, cost, occ, hw_name, gpu, dtype, cap_eff, cap_reason, ())
        if p.tile_summary() in seen:
            continue
        seen.add(p.tile_summary())
        alts.append(p)
        if len(alts) >= TOP_ALTERNATIVES:
            break
    elapsed = time.perf_counter() - start
    return GpuSynthesis(plan=plan, alternatives=tuple(alts), predicted_gflops=plan.cost.gflops,
                        synthesis_seconds=elapsed, candidates_evaluated=n)
