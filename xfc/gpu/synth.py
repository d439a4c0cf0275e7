"""Bottom-up OpenCL tile synthesis for Mali and Adreno, ranked by a static cost model.

Enumeration, innermost level first:
  1. register tiles the work-item can hold (accumulators + operands + addressing registers),
     rejected when they would spill;
  2. work-group shapes allowed by the description (size cap, wave multiples) and, where the
     reduction allows it, __local staging depths that fit local memory;
  3. the grid covering the output.
Every candidate gets a predicted time = max of ALU, L1, local-memory, L2, DRAM and latency
terms (see `_evaluate`), plus a launch overhead. Nothing is measured; the result is a pure,
deterministic function of (spec, hardware, dtype, work-group cap).

Model constants that the hardware description does not carry are named below; they are
assumptions of the cost model, not facts about a particular GPU.
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Optional

from .._version import __version__
from ..errors import HardwareError, OperatorError
from ..ops.spec import Conv2dSpec, DepthwiseSpec, MatmulSpec, OperatorSpec
from .ir import (DTYPES, PREDICTION_LABEL, CostEstimate, GpuKernelPlan, Grid, Occupancy, RegisterTile,
                 WorkGroupTile)

# ---- cost-model assumptions (not in the hardware description) -------------------------------
L1_BYTES_PER_CLOCK_PER_CU = 64        # one cache line per clock from the load/store (or texture) cache
LOCAL_BYTES_PER_CLOCK_PER_CU = 128    # on-chip __local SRAM (Adreno); Mali __local goes through L1
L2_BYTES_PER_CLOCK_PER_CU = 32        # aggregate L2 bandwidth scales with the number of compute units
DRAM_GBPS_DEFAULT = 25.0              # usable DRAM bandwidth when no SoC memory figure is known
MEMORY_LATENCY_CYCLES = 80            # one dependent global-load round trip (L1 miss, L2 hit)
LOCAL_LATENCY_CYCLES = 8
BARRIER_CYCLES = 30
BARRIER_ISSUE = 4.0                   # issue slots a barrier costs each work-item
LOAD_ISSUE_COST = 0.5                 # issue slots a load instruction takes relative to one FMA
LOOP_OVERHEAD_INSTR = 2.0             # index/compare/branch per unrolled reduction body
ADDRESS_REGISTERS = 6                 # pointers, indices, loop counters per work-item
LAUNCH_OVERHEAD_S = 20e-6
FULL_ALU_WAVES = 4                    # resident waves needed to hide ALU/issue latency (fewer: ALU derated)
MAX_REGISTERS_ADRENO = 96             # beyond this the compiler spills (assumption)
TOP_ALTERNATIVES = 5


@dataclass(frozen=True)
class GpuSynthesis:
    plan: GpuKernelPlan
    alternatives: tuple[GpuKernelPlan, ...]   # next best plans, best first (cost-model ranking)
    predicted_gflops: float                   # cost-model prediction, not a measurement
    synthesis_seconds: float
    candidates_evaluated: int

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


def _dram_gbps(hw) -> float:
    soc = getattr(hw, "soc", None)
    mem = getattr(soc, "memory", None) if soc is not None else getattr(hw, "memory", None)
    bw = getattr(mem, "peak_bandwidth_gbps", None) if mem is not None else None
    if bw is None and isinstance(mem, dict):
        bw = mem.get("peak_bandwidth_gbps")
    return 0.85 * float(bw) if bw else DRAM_GBPS_DEFAULT


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


# ---- candidate geometry ----------------------------------------------------------------------

@dataclass(frozen=True)
class _Stream:
    """A load issued per reduction step by every work-item, described by its address pattern."""
    count: float        # load instructions per work-item per reduction step
    lane_bytes: int     # bytes one work-item loads per instruction
    stride_x: int       # elements between the addresses of neighbouring work-items along x (0 = broadcast)
    vary_y: bool        # different addresses for different work-item rows
    space: str          # 'global' | 'local'


@dataclass(frozen=True)
class _Candidate:
    rows: int
    cols: int
    vec: int
    wx: int
    wy: int
    depth: int          # __local staging depth, 0 = none
    k_unroll: int
    registers: int
    local_bytes: int
    steps: int          # reduction steps per work-item
    fma_per_step: float  # FMA instructions per step (packed fp16 counts half)
    streams: tuple
    staged_lines_per_wg: float  # global lines one work-group loads into __local over the whole reduction
    wg_bytes: float             # global bytes one work-group needs if L1 captures intra-group reuse
    working_set: float          # bytes of L1 one work-group needs for that reuse
    global_size: tuple
    outputs_exec: int           # outputs computed including ragged waste
    constants: tuple
    flags: tuple
    copy_issue_per_step: float = 0.0  # staging: global load + __local store + barrier share per step


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _work_group_shapes(gpu, cap: int):
    warp = int(gpu.warp_width)
    half = int(gpu.half_warp_width or warp)
    if gpu.family == "mali":
        # Arm guidance: at most 64 (the preferred size) work-items; barriers stop the driver
        # from merging/splitting groups, so never go above the preferred size.
        top = min(cap, int(gpu.preferred_work_group_size))
        low = min(warp, top)
    else:
        top = cap
        low = min(half, top)
    sizes = [s for s in (4, 8, 16, 32, 64, 128, 256, 512, 1024) if low <= s <= top] or [top]
    shapes = []
    for size in sizes:
        for wy in (1, 2, 4, 8, 16):
            wx = size // wy
            if wx * wy == size and wx >= 4:
                shapes.append((wx, wy))
    return shapes, top


def _matmul_candidates(spec: MatmulSpec, gpu, cap, half: bool, eb: int, line: int):
    m, n, k, b = spec.m, spec.n, spec.k, spec.batch
    shapes, _ = _work_group_shapes(gpu, cap)
    staging_depths = [0] + [d for d in (8, 16, 32) if d <= max(8, k)]
    vecs = (1, 2, 4, 8) if half else (1, 2, 4)
    for tm in (1, 2, 4, 8):
        for vec in vecs:
            if vec > n:
                continue
            for nv in (1, 2):
                tn = vec * nv
                acc = tm * tn
                regs = (acc + tm + tn + 1) // (2 if half else 1) + ADDRESS_REGISTERS
                for wx, wy in shapes:
                    bm, bn = tm * wy, tn * wx
                    if bm > 2 * _ceil(m, 1) + 8 or bn > 2 * n + 8 * vec:
                        continue
                    gx, gy = _ceil(n, bn) * wx, _ceil(m, bm) * wy
                    ku = min(4, k)
                    for depth in staging_depths:
                        if depth:
                            local = (bm + bn) * depth * eb
                            if local > gpu.local_memory_kib * 1024:
                                continue
                            streams = (_Stream(tm, eb, 0, True, "local"),
                                       _Stream(nv, vec * eb, vec, False, "local"))
                            rounds = _ceil(k, depth)
                            staged = rounds * (bm * _ceil(depth * eb, line) + depth * _ceil(bn * eb, line))
                            r = regs + 2
                        else:
                            local = 0
                            streams = (_Stream(tm, eb, 0, True, "global"),
                                       _Stream(nv, vec * eb, vec, False, "global"))
                            staged = 0
                            r = regs
                        flags = (("clamp_m", m % bm != 0), ("clamp_n", n % bn != 0),
                                 ("partial_vector", n % vec != 0),
                                 ("a_bounds", bool(depth) and (m % bm != 0 or k % depth != 0)),
                                 ("b_bounds", bool(depth) and (n % bn != 0 or k % depth != 0)))
                        consts = (("BATCH", b), ("M", m), ("N", n), ("K", k), ("TM", tm), ("VEC", vec),
                                  ("NV", nv), ("TN", tn), ("WX", wx), ("WY", wy), ("BM", bm), ("BN", bn),
                                  ("TKS", depth), ("KU", ku))
                        yield _Candidate(
                            rows=tm, cols=tn, vec=vec, wx=wx, wy=wy, depth=depth, k_unroll=ku, registers=r,
                            local_bytes=local, steps=k, fma_per_step=acc / (2 if half else 1),
                            streams=streams, staged_lines_per_wg=staged,
                            wg_bytes=k * (bm + bn) * eb, working_set=bm * line + bn * eb * 4,
                            global_size=(gx, gy, b), outputs_exec=gx // wx * bn * gy // wy * bm * b,
                            constants=consts, flags=flags,
                            copy_issue_per_step=(2.0 * (bm + bn) / (wx * wy) + 2.0 * BARRIER_ISSUE / depth)
                            if depth else 0.0)


def _conv_candidates(spec: Conv2dSpec, gpu, cap, half: bool, eb: int, line: int):
    oh, ow = spec.out_h, spec.out_w
    p = oh * ow
    red = spec.c * spec.r * spec.s
    shapes, _ = _work_group_shapes(gpu, cap)
    padded = any((spec.pad_top, spec.pad_left, spec.pad_bottom, spec.pad_right))
    for tk in (1, 2, 4, 8):
        for tp in (1, 2, 4, 8):
            acc = tk * tp
            # accumulators, weights, inputs, and per-pixel input row/column origins
            regs = (acc + tk + tp + 1) // (2 if half else 1) + 2 * tp + ADDRESS_REGISTERS
            for wx, wy in shapes:
                bk, bp = tk * wy, tp * wx
                if bk > 2 * spec.k + 8 or bp > 2 * p + 8 * wx:
                    continue
                gx, gy = _ceil(p, bp) * wx, _ceil(spec.k, bk) * wy
                depths = [0] + [d for d in (1, 2, 4, 8, 16) if d <= spec.c]
                rows_span = min(spec.h, (_ceil(bp, ow) + 1) * spec.stride_h + spec.r)
                in_bytes = spec.c * rows_span * spec.w * eb
                for ct in depths:
                    if ct:
                        local = bk * ct * spec.r * spec.s * eb
                        if local > gpu.local_memory_kib * 1024:
                            continue
                        streams = (_Stream(tk, eb, 0, True, "local"),
                                   _Stream(tp, eb, spec.stride_w, False, "global"))
                        staged = _ceil(spec.c, ct) * bk * _ceil(ct * spec.r * spec.s * eb, line)
                        r = regs + 2
                    else:
                        local = 0
                        streams = (_Stream(tk, eb, 0, True, "global"),
                                   _Stream(tp, eb, spec.stride_w, False, "global"))
                        staged = 0
                        r = regs
                    flags = (("padded", padded), ("clamp_p", p % bp != 0), ("clamp_k", spec.k % bk != 0),
                             ("c_tail", bool(ct) and spec.c % ct != 0))
                    consts = (("NB", spec.n), ("C", spec.c), ("H", spec.h), ("W", spec.w), ("K", spec.k),
                              ("R", spec.r), ("S", spec.s), ("SH", spec.stride_h), ("SW", spec.stride_w),
                              ("PT", spec.pad_top), ("PL", spec.pad_left), ("DH", spec.dilation_h),
                              ("DW", spec.dilation_w), ("OH", oh), ("OW", ow), ("P", p), ("TK", tk), ("TP", tp),
                              ("WX", wx), ("WY", wy), ("BK", bk), ("BP", bp), ("CT", ct),
                              ("KU", min(4, spec.s)))
                    yield _Candidate(
                        rows=tk, cols=tp, vec=1, wx=wx, wy=wy, depth=ct, k_unroll=min(4, spec.s), registers=r,
                        local_bytes=local, steps=red, fma_per_step=acc / (2 if half else 1), streams=streams,
                        staged_lines_per_wg=staged,
                        wg_bytes=bk * red * eb + in_bytes,
                        working_set=bk * line + spec.r * (bp * spec.stride_w * eb + line),
                        global_size=(gx, gy, spec.n), outputs_exec=(gx // wx) * bp * (gy // wy) * bk * spec.n,
                        constants=consts, flags=flags,
                        copy_issue_per_step=(2.0 * bk / (wx * wy) + 2.0 * BARRIER_ISSUE / (ct * spec.r * spec.s))
                        if ct else 0.0)


def _depthwise_candidates(spec: DepthwiseSpec, gpu, cap, half: bool, eb: int, line: int):
    oh, ow = spec.out_h, spec.out_w
    shapes, _ = _work_group_shapes(gpu, cap)
    padded = any((spec.pad_top, spec.pad_left, spec.pad_bottom, spec.pad_right))
    # The R*S weights stay in registers, unless they alone overflow the full-occupancy register
    # budget (7x7 windows on Mali): then one window row of weights (S registers) is loaded at a
    # time, again for every output row of the tile.
    per_row_modes = (False, True) if spec.r > 1 and spec.r * spec.s > int(gpu.registers_per_thread_full_occupancy) \
        else (False,)
    for ty, tx, per_row in itertools.product((1, 2, 4), (1, 2, 4, 8), per_row_modes):
        span = (tx - 1) * spec.stride_w + (spec.s - 1) * spec.dilation_w + 1
        weight_regs = spec.s if per_row else spec.r * spec.s
        regs = (ty * tx + weight_regs + span + 1) // (2 if half else 1) + ADDRESS_REGISTERS
        for wx, wy in shapes:
            bx, by = tx * wx, ty * wy
            if bx > 2 * ow + 8 * wx or by > 2 * oh + 4 * wy:
                continue
            gx, gy = _ceil(ow, bx) * wx, _ceil(oh, by) * wy
            ragged_x, ragged_y = ow % tx != 0 or ow % bx != 0, oh % ty != 0 or oh % by != 0
            flags = (("checks", padded or ragged_x or ragged_y), ("ragged_x", ragged_x),
                     ("ragged_y", ragged_y), ("weights_per_row", per_row))
            consts = (("NB", spec.n), ("C", spec.c), ("H", spec.h), ("W", spec.w), ("R", spec.r),
                      ("S", spec.s), ("SH", spec.stride_h), ("SW", spec.stride_w), ("PT", spec.pad_top),
                      ("PL", spec.pad_left), ("DH", spec.dilation_h), ("DW", spec.dilation_w), ("OH", oh),
                      ("OW", ow), ("TY", ty), ("TX", tx), ("SPAN", span), ("WX", wx), ("WY", wy))
            in_rows = by * spec.stride_h + spec.r
            in_cols = bx * spec.stride_w + spec.s
            yield _Candidate(
                rows=ty, cols=tx, vec=1, wx=wx, wy=wy, depth=0, k_unroll=1, registers=regs, local_bytes=0,
                steps=1, fma_per_step=ty * tx * spec.r * spec.s / (2 if half else 1),
                streams=(_Stream(ty * spec.r * span, eb, tx * spec.stride_w, True, "global"),
                         _Stream(spec.r * spec.s * (ty if per_row else 1) / max(1, ty * tx), eb, 0, False,
                                 "global")),
                staged_lines_per_wg=0, wg_bytes=in_rows * in_cols * eb + spec.r * spec.s * eb,
                working_set=in_rows * in_cols * eb,
                global_size=(gx, gy, spec.n * spec.c),
                outputs_exec=(gx // wx) * bx * (gy // wy) * by * spec.n * spec.c,
                constants=consts, flags=flags)


# ---- the cost model --------------------------------------------------------------------------

def _occupancy(gpu, regs: int, wg_size: int, local_bytes: int, half: bool):
    """(waves resident, budget, limiter, groups per CU) or None when the candidate cannot run."""
    warp = int(gpu.warp_width)
    max_waves = int(gpu.max_waves_per_cu or 32)
    budget = int(gpu.registers_per_thread_full_occupancy)
    if gpu.family == "adreno" and gpu.register_file_bytes_per_cu:
        if regs > MAX_REGISTERS_ADRENO:
            return None
        waves = min(int(gpu.register_file_bytes_per_cu) // (warp * regs * 4), max_waves)
        budget = max(1, int(gpu.register_file_bytes_per_cu) // (warp * max_waves * 4))
        limiter = "registers" if waves < max_waves else "max waves per compute unit"
    else:
        if regs <= budget:
            waves, limiter = max_waves, "max waves per compute unit"
        elif regs <= 2 * budget:
            waves, limiter = max_waves // 2, f"registers (> {budget} halves occupancy)"
        else:
            return None  # would spill
    if waves < 1:
        return None
    wg_waves = _ceil(wg_size, warp)
    groups = waves // wg_waves
    if groups < 1:
        return None
    if local_bytes and gpu.local_memory_on_chip:
        by_local = int(gpu.local_memory_kib * 1024) // local_bytes
        if by_local < groups:
            groups, limiter = by_local, "local memory capacity"
    if groups < 1:
        return None
    return waves, groups * wg_waves, budget, limiter, groups


def _lines_per_warp_load(s: _Stream, tx: int, ty: int, eb: int, line: int) -> tuple[float, float]:
    """(cache lines, distinct bytes) one warp-wide load instruction touches."""
    rows = ty if s.vary_y else 1
    if s.stride_x == 0:
        span_lines = _ceil(s.lane_bytes, line)
        distinct = s.lane_bytes
    else:
        span = (tx - 1) * s.stride_x * eb + s.lane_bytes
        span_lines = min(_ceil(span, line), tx * _ceil(s.lane_bytes, line))
        distinct = tx * s.lane_bytes
    return span_lines * rows, distinct * rows


def _evaluate(cand: _Candidate, spec, gpu, half: bool, eb: int, line: int, dram_gbps: float):
    wg = cand.wx * cand.wy
    occ = _occupancy(gpu, cand.registers, wg, cand.local_bytes, half)
    if occ is None:
        return None
    waves_cap, waves_res, budget, limiter, groups_per_cu = occ
    warp = int(gpu.warp_width)
    cu = int(gpu.compute_units)
    clock = float(gpu.max_clock_mhz) * 1e6
    work_groups = (cand.global_size[0] // cand.wx) * (cand.global_size[1] // cand.wy) * cand.global_size[2]
    wg_waves = _ceil(wg, warp)
    waves_total = work_groups * wg_waves
    cu_active = min(cu, work_groups)
    lane_util = wg / (wg_waves * warp)
    tx = min(cand.wx, warp)
    ty = max(1, min(cand.wy, warp // max(1, cand.wx)))

    # ALU: executed FLOPs (ragged waste included) at the issue efficiency of the inner loop
    flop_rate = gpu.fp16_flop_per_clock_per_cu if half else gpu.fp32_flop_per_clock_per_cu
    loads = sum(s.count for s in cand.streams)
    issue = cand.fma_per_step / (cand.fma_per_step + LOAD_ISSUE_COST * loads + cand.copy_issue_per_step
                                 + LOOP_OVERHEAD_INSTR / cand.k_unroll)
    flops_exec = 2.0 * cand.outputs_exec * spec.reduction_size
    hide = min(1.0, waves_res / FULL_ALU_WAVES)
    t_alu = flops_exec / (cu_active * flop_rate * clock * issue * lane_util * hide)

    # L1 / local: per warp-wide load instruction, lines (cache) or distinct bytes (local SRAM)
    l1_lines = 0.0
    local_bytes = 0.0
    for s in cand.streams:
        lines, distinct = _lines_per_warp_load(s, tx, ty, eb, line)
        instr = waves_total * cand.steps * s.count
        if s.space == "local" and gpu.local_memory_on_chip:
            local_bytes += instr * distinct
        else:
            l1_lines += instr * lines
    staged_lines = cand.staged_lines_per_wg * work_groups
    if cand.depth and not gpu.local_memory_on_chip:
        l1_lines += 2 * staged_lines       # global read + __local write, both through the same cache
    else:
        l1_lines += staged_lines
    t_l1 = l1_lines / (cu_active * (L1_BYTES_PER_CLOCK_PER_CU / line) * clock)
    t_local = local_bytes / (cu_active * LOCAL_BYTES_PER_CLOCK_PER_CU * clock)

    # L2: staged groups load their block once; otherwise the L1 keeps intra-group reuse only if
    # the working set of the resident groups fits
    global_request_bytes = sum(
        waves_total * cand.steps * s.count * _lines_per_warp_load(s, tx, ty, eb, line)[0] * line
        for s in cand.streams if s.space == "global")
    group_level = cand.wg_bytes * work_groups
    if global_request_bytes:
        hit = min(1.0, gpu.l1_kib_per_cu * 1024 / max(1.0, cand.working_set * groups_per_cu))
        l2_bytes = min(global_request_bytes, group_level) \
            + (1 - hit) * max(0.0, global_request_bytes - group_level)
    else:
        hit = 1.0
        l2_bytes = 0.0
    l2_bytes += staged_lines * line
    t_l2 = l2_bytes / (cu * L2_BYTES_PER_CLOCK_PER_CU * clock)

    unique = sum(math.prod(s) for s in spec.input_shapes) * eb + math.prod(spec.output_shape) * eb
    t_dram = unique / (dram_gbps * 1e9)

    # latency: dependent round trips of one work-item, times the rounds of resident groups
    rounds = _ceil(work_groups, cu * groups_per_cu)
    if cand.depth:
        chain = _ceil(spec.reduction_size, cand.depth) * (MEMORY_LATENCY_CYCLES + 2 * BARRIER_CYCLES) \
            + cand.steps / cand.k_unroll * (LOCAL_LATENCY_CYCLES if gpu.local_memory_on_chip
                                            else MEMORY_LATENCY_CYCLES)
        if any(s.space == "global" for s in cand.streams):
            chain += cand.steps / cand.k_unroll * MEMORY_LATENCY_CYCLES / 2
    else:
        chain = max(1.0, cand.steps / cand.k_unroll) * MEMORY_LATENCY_CYCLES
    t_lat = rounds * chain / clock

    terms = (("alu", t_alu), ("l1", t_l1), ("local", t_local), ("l2", t_l2), ("dram", t_dram),
             ("latency", t_lat))
    bound, worst = max(terms, key=lambda t: t[1])
    seconds = worst + LAUNCH_OVERHEAD_S
    cost = CostEstimate(seconds=seconds, bound=bound, terms=terms, gflops=spec.flops / seconds / 1e9)
    occupancy = Occupancy(registers=cand.registers, register_budget=budget, waves_resident=waves_res,
                          max_waves=int(gpu.max_waves_per_cu or 32), limiter=limiter,
                          work_groups_per_cu=groups_per_cu)
    info = {"hit": hit, "l2_bytes": l2_bytes, "l1_lines": l1_lines}
    return cost, occupancy, info


# ---- plan construction ----------------------------------------------------------------------

_TEMPLATES = {"matmul": ("matmul.cl.j2", "gemm", "M", "N"),
              "conv2d": ("conv2d.cl.j2", "implicit_gemm", "out-channels", "pixels"),
              "depthwise": ("depthwise.cl.j2", "direct_depthwise", "rows", "cols")}


def _plan(spec, cand: _Candidate, cost, occ, hw_name, gpu, dtype, cap, cap_reason, decisions) -> GpuKernelPlan:
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
    return GpuKernelPlan(spec=spec, hardware_name=hw_name, gpu_name=gpu_name, family=gpu.family, dtype=dtype,
                         variant=variant, lowering=lowering, template=template, kernel_name=kname,
                         register_tile=rt, work_group=wgt, grid=grid, constants=cand.constants, flags=cand.flags,
                         occupancy=occ, cost=cost, limits=limits, decisions=tuple(decisions),
                         header_lines=header, version=__version__)


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
               f"{_ceil(wg, int(gpu.warp_width))} wave(s) of {gpu.warp_width} per group")
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
                   max_work_group_size: Optional[int] = None) -> GpuSynthesis:
    """Pick register, work-group and grid tiles for spec on hw's GPU. Pure and deterministic."""
    start = time.perf_counter()
    hw_name, gpu = gpu_of(hw)
    if not isinstance(spec, (MatmulSpec, Conv2dSpec, DepthwiseSpec)):
        raise OperatorError(f"GPU synthesis does not support operator {getattr(spec, 'name', spec)!r}")
    if gpu.family not in ("mali", "adreno"):
        raise HardwareError(f"GPU family '{gpu.family}' of '{hw_name}' is not supported (expected mali or adreno)")
    cap = _check_request(gpu, hw_name, dtype, max_work_group_size)
    _, top = _work_group_shapes(gpu, cap)
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
    dram = _dram_gbps(hw)
    gen = {"matmul": _matmul_candidates, "conv2d": _conv_candidates, "depthwise": _depthwise_candidates}[spec.name]
    scored = []
    n = 0
    for cand in gen(spec, gpu, cap_eff, half, eb, line):
        n += 1
        res = _evaluate(cand, spec, gpu, half, eb, line, dram)
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
