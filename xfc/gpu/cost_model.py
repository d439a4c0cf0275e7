"""The static GPU cost model: the only place GPU times are predicted (docs/gpu.md).

evaluate(candidate) = occupancy (registers, waves, work-groups per compute unit, local memory),
then a predicted time = the largest of the ALU, L1, local-memory, L2, DRAM and latency terms,
plus a launch overhead. Nothing is measured. The constants below are assumptions of the model
that the hardware description does not carry, not facts about a particular GPU.
"""
from __future__ import annotations

import math

from .candidates import Candidate, Stream, ceil_div
from .ir import CostEstimate, Occupancy

# ---- cost-model assumptions (not in the hardware description) -------------------------------
L1_BYTES_PER_CLOCK_PER_CU = 64        # one cache line per clock from the load/store (or texture) cache
LOCAL_BYTES_PER_CLOCK_PER_CU = 128    # on-chip __local SRAM (Adreno); Mali __local goes through L1
L2_BYTES_PER_CLOCK_PER_CU = 32        # aggregate L2 bandwidth scales with the number of compute units
DRAM_GBPS_DEFAULT = 25.0              # usable DRAM bandwidth when no SoC memory figure is known
MEMORY_LATENCY_CYCLES = 80            # one dependent global-load round trip (L1 miss, L2 hit)
LOCAL_LATENCY_CYCLES = 8
BARRIER_CYCLES = 30
LOAD_ISSUE_COST = 0.5                 # issue slots a load instruction takes relative to one FMA
LOOP_OVERHEAD_INSTR = 2.0             # index/compare/branch per unrolled reduction body
LAUNCH_OVERHEAD_S = 20e-6
FULL_ALU_WAVES = 4                    # resident waves needed to hide ALU/issue latency (fewer: ALU derated)
MAX_REGISTERS_ADRENO = 96             # beyond this the compiler spills (assumption)


def dram_gbps(hw) -> float:
    soc = getattr(hw, "soc", None)
    mem = getattr(soc, "memory", None) if soc is not None else getattr(hw, "memory", None)
    bw = getattr(mem, "peak_bandwidth_gbps", None) if mem is not None else None
    if bw is None and isinstance(mem, dict):
        bw = mem.get("peak_bandwidth_gbps")
    return 0.85 * float(bw) if bw else DRAM_GBPS_DEFAULT


def occupancy(gpu, regs: int, wg_size: int, local_bytes: int, half: bool):
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
    wg_waves = ceil_div(wg_size, warp)
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


def lines_per_warp_load(s: Stream, tx: int, ty: int, eb: int, line: int) -> tuple[float, float]:
    """(cache lines, distinct bytes) one warp-wide load instruction touches."""
    rows = ty if s.vary_y else 1
    if s.stride_x == 0:
        span_lines = ceil_div(s.lane_bytes, line)
        distinct = s.lane_bytes
    else:
        span = (tx - 1) * s.stride_x * eb + s.lane_bytes
        span_lines = min(ceil_div(span, line), tx * ceil_div(s.lane_bytes, line))
        distinct = tx * s.lane_bytes
    return span_lines * rows, distinct * rows


def evaluate(cand: Candidate, spec, gpu, half: bool, eb: int, line: int, dram_gbps: float,
             alu_efficiency: float = 1.0):
    """The candidate's time: the slowest of ALU, L1, local memory, L2, DRAM and latency terms.
    alu_efficiency: the share of the description's FP32/FP16 FLOP rate the GPU really issues
    (1.0 = the description; fitted from published measurements by xfc.tiledb.published)."""
    wg = cand.wx * cand.wy
    occ = occupancy(gpu, cand.registers, wg, cand.local_bytes, half)
    if occ is None:
        return None
    waves_cap, waves_res, budget, limiter, groups_per_cu = occ
    warp = int(gpu.warp_width)
    cu = int(gpu.compute_units)
    clock = float(gpu.max_clock_mhz) * 1e6
    work_groups = (cand.global_size[0] // cand.wx) * (cand.global_size[1] // cand.wy) * cand.global_size[2]
    wg_waves = ceil_div(wg, warp)
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
    t_alu = flops_exec / (cu_active * flop_rate * alu_efficiency * clock * issue * lane_util * hide)

    # L1 / local: per warp-wide load instruction, lines (cache) or distinct bytes (local SRAM)
    l1_lines = 0.0
    local_bytes = 0.0
    for s in cand.streams:
        lines, distinct = lines_per_warp_load(s, tx, ty, eb, line)
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
        waves_total * cand.steps * s.count * lines_per_warp_load(s, tx, ty, eb, line)[0] * line
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

    unique = sum(math.prod(s) for s in spec.operand_shapes) * eb + math.prod(spec.output_shape) * eb
    t_dram = unique / (dram_gbps * 1e9)

    # latency: dependent round trips of one work-item, times the rounds of resident groups
    rounds = ceil_div(work_groups, cu * groups_per_cu)
    if cand.depth:
        chain = ceil_div(spec.reduction_size, cand.depth) * (MEMORY_LATENCY_CYCLES + 2 * BARRIER_CYCLES) \
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
    resident = Occupancy(registers=cand.registers, register_budget=budget, waves_resident=waves_res,
                        max_waves=int(gpu.max_waves_per_cu or 32), limiter=limiter,
                        work_groups_per_cu=groups_per_cu)
    info = {"hit": hit, "l2_bytes": l2_bytes, "l1_lines": l1_lines}
    return cost, resident, info
