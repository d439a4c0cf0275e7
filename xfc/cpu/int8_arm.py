"""ARM int8 planning (issue 13): which dot-product instruction and which MR x NR register tile.

Pure: (spec, quantization, hardware, cluster, threads) -> Int8Plan (xfc.cpu.int8_synth), rendered by the
same templates as the host path (templates/cpu/int8_gemm.c.j2 with the `sdot` / `smmla` pieces of
int8_dialect.h.j2; depthwise: int8_depthwise.c.j2 compiled for the core's -march).

Instructions (both signed x signed, int32 accumulation):
  sdot   (dotprod, Armv8.2+): SDOT Vd.4S, Vn.16B, Vm.4B[lane]: 4 int32 lanes, each += a 4-deep dot
         product. The k axis is packed in 4-deep groups: a column vector holds 4 columns x 4 k bytes,
         a row register 4 rows x 4 k bytes, and the lane index picks the row (vdotq_laneq_s32).
         Registers: MR*NV accumulators + NV column vectors + MR/4 row vectors (MR a multiple of 4).
  smmla  (i8mm, Armv8.6+ / Armv9): SMMLA Vd.4S, Vn.16B, Vm.16B: a 2x8 by 8x2 int8 product added to a
         2x2 int32 block. The k axis is packed in 8-deep groups: one row register = 2 rows x 8 k, one
         column register = 2 columns x 8 k; MR/2 x NR/2 accumulators (each a 2x2 block), MR/2 row and
         NR/2 column registers.
Activations: uint8 x is made signed by x ^ 0x80 = x - 128 (int8 x is used as is), so every product
is s8 x s8 and sum (x - zp) * w = sum x_s * w - (zp - s) * sum w with s = 128 (uint8) or 0 (int8):
the pre-pack step sums every output channel's weights once and the epilogue adds
bias - (zp - s) * sum w. |x_s * w| <= 128 * 128, so a 4-deep SDOT lane or an 8-deep SMMLA element
never leaves int32, and neither does the whole reduction (K <= 65536, xfc/ops/quant.py).

Issue model, per k group of the register tile (one instruction per accumulator register):
  instructions = sdot: MR*NV, smmla: MR/2 * NR/2;  loads = row registers + column registers
  out-of-order: cycles = max(instructions / rate, loads / vector_loads_per_cycle, latency)
  in-order (pipeline: in_order, ld128 not dual-issued with the SIMD pipe, e.g. A55 / A510):
           cycles = max(instructions / rate + loads * ld128_blocking_cycles, latency)
    the split-load variant (only when forced: force_split_loads): each 128-bit operand is loaded
    as `ldr d` + `ldr x` + `ins` (templates/cpu/int8_gemm.c.j2, xfc_ld128), the A55 trick of
    onnxruntime's hand-written kernel, and would cost
           cycles = max(instructions / rate + loads + max(0, 2 * loads - instructions) / 2, latency)
    if every 64-bit load issued beside a dot product. gcc schedules the three instructions of each
    load together at the top of the k step, so they do not pair: llvm-mca-16's A55 model gives
    53 cycles per 8x12 group against 40 with 128-bit loads (benchmarks/arm_int8_mca.py). The
    planner therefore scores 128-bit loads only; a hand-scheduled loop is the way to the pairing.
  rate = core.sdot_per_cycle / core.smmla_per_cycle (fma_per_cycle when the description gives
  none, and said so); latency = core.fma_latency_cycles (each accumulator is one dependency chain
  per group). On an in-order core a 128-bit load stalls the pipe, so the tile that needs the
  fewest loads per instruction wins; out of order the loads hide behind the dot products and ties
  go to the narrower MR. The problem's time is tiles x groups x cycles / clock / threads (ragged
  tiles count as waste); the fastest (instruction, tile) wins.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Optional

from ..errors import OperatorError
from ..hardware.model import CpuCluster, CpuCore, HardwareDescription
from ..ops.quant import QuantParams, check_spec, resolve_out_scale, validate
from ..ops.spec import Conv2dSpec, DepthwiseSpec, MatmulSpec, OperatorSpec, gemm_view
from .config import ARM_DOTS, ArmDot, arm_dots, dot_rate
from .dw_channels import CHANNEL_GROUP, channels_buffers
from .int8_plan import Int8Plan


MR_CHOICES = {"sdot": tuple(range(4, 25, 4)), "smmla": tuple(range(2, 17, 2))}
MAX_NV = 8
DEPTHWISE_MACS_PER_SMLAL = 4   # int16 x int16 products one smlal / smlal2 accumulates into int32 lanes


def in_order(core: CpuCore) -> bool:
    return core.pipeline == "in_order" and not core.load_rules.ld128_dual_issues_with_fma


def split_load_choices(core: CpuCore) -> tuple[bool, ...]:
    """Load variants the planner scores: 128-bit loads only (the split variant's pairing is not
    what gcc schedules; module docstring)."""
    return (False,)


def group_cycles(core: CpuCore, dot: ArmDot, mr: int, nv: int, split_loads: bool = False) -> float:
    rate, _ = dot_rate(core, dot)
    instructions = dot.instructions(mr, nv)
    loads = nv + mr // dot.row_lanes
    latency = float(core.fma_latency_cycles)
    if in_order(core) and split_loads:
        return max(instructions / rate + loads + max(0, 2 * loads - instructions) / 2, latency)
    if in_order(core):
        return max(instructions / rate + loads * core.load_rules.ld128_blocking_cycles, latency)
    return max(instructions / rate, loads / core.load_rules.vector_loads_per_cycle, latency)


@dataclass(frozen=True)
class ArmShape:
    """M rows; N as `column_rows` runs of `run` columns (conv2d: OH rows of OW pixels); k groups."""
    m: int
    run: int
    column_rows: int
    groups: int


def arm_shape(spec: OperatorSpec, dot: ArmDot) -> ArmShape:
    m, n, k = gemm_view(spec)
    if isinstance(spec, Conv2dSpec):     # a k group: k_depth input channels of one (r, s) tap
        return ArmShape(m, spec.out_w, spec.out_h, spec.r * spec.s * math.ceil(spec.c / dot.k_depth))
    return ArmShape(m, n, 1, math.ceil(k / dot.k_depth))


@dataclass(frozen=True)
class ArmTile:
    dot: ArmDot
    mr: int
    nv: int
    rows: int                 # conv2d: output rows a column tile spans
    cycles_per_group: float
    seconds: float
    split_loads: bool = False  # in-order variant: 128-bit operands loaded as two 64-bit halves

    @property
    def nr(self) -> int:
        return self.nv * self.dot.col_lanes

    @property
    def ops_per_cycle(self) -> float:
        return 2.0 * self.mr * self.nr * self.dot.k_depth / self.cycles_per_group

    def describe(self, core: CpuCore) -> str:
        return (f"{self.dot.name} {self.mr}x{self.nr}" + (f" ({self.rows} output rows)" if self.rows > 1 else "")
                + (" with split 64-bit loads" if self.split_loads else "")
                + f": {self.dot.k_depth}-deep k groups, {self.dot.registers(self.mr, self.nv)} of "
                  f"{core.vector_registers} registers, {self.cycles_per_group:.2f} cycles/group, "
                  f"{self.ops_per_cycle:.1f} int8 ops/cycle, {self.seconds * 1e6:.1f} us predicted")


def _seconds(shape: ArmShape, mr: int, nr: int, rows: int, cycles: float, clock_hz: float, threads: int) -> float:
    column_tiles = math.ceil(shape.column_rows / rows) * math.ceil(shape.run / (nr // rows))
    tiles = math.ceil(shape.m / mr) * column_tiles
    return tiles * shape.groups * cycles / clock_hz / max(1, min(threads, column_tiles))


def score(spec: OperatorSpec, cluster: CpuCluster, threads: int, dot: ArmDot, mr: int, nv: int,
          rows: int = 1, split_loads: bool = False) -> ArmTile:
    cycles = group_cycles(cluster.core, dot, mr, nv, split_loads)
    seconds = _seconds(arm_shape(spec, dot), mr, nv * dot.col_lanes, rows, cycles, cluster.clock_ghz * 1e9, threads)
    return ArmTile(dot, mr, nv, rows, cycles, seconds, split_loads)


def candidates(spec: OperatorSpec, cluster: CpuCluster, threads: int, dots) -> list[ArmTile]:
    """Every (instruction, MR, NV, rows) that fits the register file, best first."""
    core = cluster.core
    conv_rows = isinstance(spec, Conv2dSpec) and spec.out_h > 1
    out = []
    for dot in dots:
        for mr in MR_CHOICES[dot.name]:
            for nv in range(1, MAX_NV + 1):
                if dot.registers(mr, nv) > core.vector_registers:
                    continue
                for rows in [r for r in range(1, nv + 1) if nv % r == 0 and (r == 1 or conv_rows)]:
                    for split in split_load_choices(core):
                        out.append(score(spec, cluster, threads, dot, mr, nv, rows, split))
    # fastest; ties: more accumulator registers, then the narrower MR, fewer rows, the instruction order
    order = {d.name: i for i, d in enumerate(dots)}
    out.sort(key=lambda t: (round(t.seconds * 1e12), -t.dot.instructions(t.mr, t.nv), t.mr, t.rows,
                            order[t.dot.name], t.split_loads))
    return out


DW_CHANNEL_GROUP = CHANNEL_GROUP   # the 'channels' depthwise layout: channels per group (4 sdot parts of 4 lanes)
# ... and the vector instructions that requantize one pixel's 16 outputs: per 4-lane part scvtf, fmul,
# fmax, fmin, fcvtns, add; 3 narrowing steps (the compiled loop: benchmarks/arm_int8_mca.py --depthwise,
# where they outnumber the sdot 27 to 12 on a 3x3 filter)
DW_NEON_REQUANT_OPS = 27


def _pixels_per_block(spec: DepthwiseSpec, core) -> int:
    """Output pixels per block of the 'channels' layout: 4 accumulator registers each, beside the
    weight quads (4 registers per filter row and quad), 4 data registers and the 8 of the bias and
    the multipliers, within the core's vector registers; where the weights cannot all stay, 2 pixels
    and the weights reloaded. On MobileNetV2's 3x3 layers that is 2: llvm-mca (arm_int8_mca.py
    --depthwise) had 26.0 cycles per 16 outputs on the A76 model and 82.5-84 on the A55 with 2, no
    stack traffic, against 26.8-27.0 and 86-89 with 4 (37 stack reloads per row on 7x7)."""
    weights = spec.r * math.ceil(spec.s / 4) * 4
    room = core.vector_registers - 4 - weights - 8
    return max(1, min(spec.out_w, room // 4 if room >= 8 else 2))


def _depthwise_channels(spec: DepthwiseSpec, cluster, threads: int) -> Optional[tuple[int, bool]]:
    """(bytes of the 'channels' layout's per-thread buffers T, Q and O; whether they fit the core's
    L2), or None where the layout does not apply (dilation_w != 1). The layout is taken where they
    fit: on the host the same layout ran 1.2-5.4x the tap pairs wherever its buffers fit the L2
    (benchmarks/results/int8_dw_layouts_zen5.json); ARM cores are not timed here."""
    if spec.dilation_w != 1:
        return None
    total = channels_buffers(spec, aarch64=True).bytes
    l2_bytes = cluster.l2.size_bytes // max(cluster.l2.shared_by_cores, 1)
    return total, total <= l2_bytes


def plan_arm_int8(spec: OperatorSpec, quant: QuantParams, hw: HardwareDescription, *, cluster: Optional[str] = None,
                  threads: Optional[int] = None, function_name: Optional[str] = None,
                  force_dialect: Optional[str] = None, force_tile: Optional[tuple[int, int]] = None,
                  force_rows: Optional[int] = None, force_split_loads: Optional[bool] = None,
                  force_layout: Optional[str] = None):
    """The ARM int8 plan. force_dialect ('sdot' on an i8mm core), force_tile (MR, NV), force_rows,
    force_split_loads (the in-order load variant; any core, it only changes how operands load),
    force_layout (depthwise: 'plane' or 'channels'): tests and sweeps. A depthwise layer has no GEMM
    micro-tile: force_dialect / force_tile / force_rows do not apply to it (its channels layout uses
    sdot, which every ARM int8 core has; scripts/int8_arm_sweep.py forces smmla on i8mm cores for
    every operator)."""
    check_spec(spec)
    quant = validate(resolve_out_scale(spec, quant))
    cl = hw.cluster(cluster)
    core = cl.core
    dots = arm_dots(core)
    if force_dialect is not None:
        allowed = [d.name for d in dots]
        if force_dialect not in allowed:
            raise OperatorError(f"int8 instruction '{force_dialect}' is not available on {core.name} "
                                f"(available: {', '.join(allowed)})")
        dots = (ARM_DOTS[force_dialect],)
    threads = threads or cl.count
    if threads < 1:
        raise OperatorError(f"--threads must be >= 1, got {threads}")
    kind = "in-order" if in_order(core) else "out-of-order"
    header = [f"xfc int8 CPU kernel: {spec.describe()}", f"quantization: {quant.describe()}",
              f"core {core.name} ({cl.role} cluster, {kind}), -march={core.gcc_march}, threads={threads}"]
    reasons = [f"instructions available: {', '.join(f'{d.name} ({d.feature})' for d in arm_dots(core))}"]
    base = "xfc_q_" + re.sub(r"[^A-Za-z0-9_]", "_", spec.key()) + f"_{quant.act_type}"
    if force_layout not in (None, "plane", "channels") or (force_layout and not isinstance(spec, DepthwiseSpec)):
        raise OperatorError(f"int8 layout '{force_layout}': ARM depthwise takes 'plane' or 'channels'")
    if isinstance(spec, DepthwiseSpec):
        channels = _depthwise_channels(spec, cl, threads)
        if force_layout == "channels" and channels is None:
            raise OperatorError(f"{spec.describe()}: the channels depthwise layout reads 4 adjacent columns per quad "
                                f"(dilation_w 1)")
        if channels is not None and (force_layout == "channels" or (force_layout is None and channels[1])):
            groups = spec.n * math.ceil(spec.c / DW_CHANNEL_GROUP)
            used = min(threads, groups)
            name = function_name or f"{base}_sdot_t{threads}"
            quads = math.ceil(spec.s / 4)
            header.append(f"lowering: direct depthwise, {DW_CHANNEL_GROUP} channels in the lanes (sdot on quads of "
                          f"adjacent taps, {spec.r} x {quads} x 4 per output pixel), {_pixels_per_block(spec, core)} "
                          f"output pixels per block")
            reasons.append(f"depthwise: groups of {DW_CHANNEL_GROUP} channels transposed into the lanes and back in "
                           f"registers, quads of 4 adjacent input columns built with tbl, so every lane holds an output "
                           f"whatever the plane's width; " + (f"forced by the caller ({channels[0] / 1024:.0f} KiB of "
                                                              f"buffers per thread)" if force_layout else
                                                              f"its buffers, {channels[0] / 1024:.0f} KiB per thread, "
                                                              f"fit the core's L2"))
            # issue model (ranking and network prediction only): per output pixel, its sdot and the
            # requantization's vector instructions at the FMA pipes' rate; transposes and quads not counted
            vector_ops = spec.r * quads * 4 + DW_NEON_REQUANT_OPS
            ops_per_s = (2.0 * DW_CHANNEL_GROUP * spec.r * spec.s / (vector_ops / core.fma_per_cycle)
                         * cl.clock_ghz * 1e9 * used)
            predicted = ops_per_s / 1e9
            reasons.append(f"predicted {predicted:.1f} GOP/s: {spec.r * quads * 4} sdot and {DW_NEON_REQUANT_OPS} "
                           f"requantization instructions per {DW_CHANNEL_GROUP} outputs, {core.fma_per_cycle:g} per cycle, "
                           f"{used} thread(s) (an issue-rate ceiling); threads split the {groups} channel groups")
            return Int8Plan(spec, quant, "sdot", "direct_depthwise", 1, _pixels_per_block(spec, core), DW_CHANNEL_GROUP, used,
                            name, core.gcc_march, predicted, tuple(header), tuple(reasons), qemu_cpu=core.qemu_cpu,
                            target_arch="aarch64", parallel_axis="channel_groups", depthwise_layout="channels")
        name = function_name or f"{base}_neon_t{threads}"
        header.append("lowering: direct depthwise (int16 staged plane, int32 row accumulators, NEON by the compiler)")
        if channels is not None and not force_layout:
            reasons.append(f"depthwise layout 'plane': 'channels' would keep {channels[0] / 1024:.0f} KiB per thread, "
                           f"more than the core's L2")
        reasons.append("depthwise: no reduction across channels, so no dot-product instruction applies; direct "
                       "int16 x int16 -> int32 loops along output rows, vectorized by gcc for the core's -march")
        used = min(threads, spec.n * spec.c)
        # issue model (ranking and network prediction only): smlal / smlal2 multiply 4 int16 pairs into
        # int32 lanes, one per FMA pipe per cycle; staging, loads and requantization not counted
        ops_per_s = 2.0 * DEPTHWISE_MACS_PER_SMLAL * core.fma_per_cycle * cl.clock_ghz * 1e9 * used
        predicted = ops_per_s / 1e9
        reasons.append(f"predicted {predicted:.1f} GOP/s: {DEPTHWISE_MACS_PER_SMLAL} int16 MACs per smlal, "
                       f"{core.fma_per_cycle:g} per cycle, {used} thread(s) (an issue-rate ceiling)")
        return Int8Plan(spec, quant, "neon", "direct_depthwise", 1, 1, 4, used, name,
                        core.gcc_march, predicted, tuple(header), tuple(reasons), qemu_cpu=core.qemu_cpu,
                        target_arch="aarch64", parallel_axis="planes")
    m, n, k = gemm_view(spec)
    if force_tile is not None:
        mr, nv = force_tile
        dot = dots[0]
        if mr not in MR_CHOICES[dot.name] or not 1 <= nv <= MAX_NV or dot.registers(mr, nv) > core.vector_registers:
            raise OperatorError(f"int8 {dot.name} tile MR={mr} NV={nv} is not one of the tiles this path renders "
                                f"(MR in {MR_CHOICES[dot.name]}, 1 <= NV <= {MAX_NV}, "
                                f"<= {core.vector_registers} registers)")
        rows = force_rows if (force_rows and isinstance(spec, Conv2dSpec) and nv % force_rows == 0) else 1
        tile = score(spec, cl, threads, dot, mr, nv, rows, bool(force_split_loads))
        reasons.append(f"register tile forced by the caller: {tile.describe(core)}")
    else:
        scored = candidates(spec, cl, threads, dots)
        ranked = scored
        if force_split_loads is not None:
            ranked = [t for t in scored if t.split_loads == force_split_loads] or scored
        tile = ranked[0]
        if force_split_loads and not tile.split_loads:     # the planner scores 128-bit loads only
            tile = score(spec, cl, threads, tile.dot, tile.mr, tile.nv, tile.rows, True)
        rate, source = dot_rate(core, tile.dot)
        reasons.append(f"chosen: {tile.describe(core)}")
        reasons.append(f"  model ({kind}): {tile.dot.name} at {rate:g}/cycle ({source}), "
                       f"{core.load_rules.vector_loads_per_cycle:g} vector loads/cycle"
                       + (f", a 128-bit load blocks the pipe {core.load_rules.ld128_blocking_cycles} cycles"
                          if in_order(core) else "")
                       + f", latency {core.fma_latency_cycles}; {len(ranked)} tiles scored")
        if len(split_load_choices(core)) > 1:   # the in-order load variant, same tile
            other = next(t for t in scored if (t.dot, t.mr, t.nv, t.rows) == (tile.dot, tile.mr, tile.nv, tile.rows)
                         and t.split_loads != tile.split_loads)
            reasons.append(f"  {'split 64-bit loads' if tile.split_loads else '128-bit loads'}: "
                           f"{tile.cycles_per_group:.2f} cycles/group against {other.cycles_per_group:.2f} with "
                           f"{'split 64-bit loads' if other.split_loads else '128-bit loads'} (ld64 dual-issues with "
                           f"the SIMD pipe, a 128-bit load blocks it {core.load_rules.ld128_blocking_cycles} cycles)")
        shown, seen = 0, {(tile.dot.name, tile.mr, tile.nv)}
        for other in ranked[1:]:                  # the next-fastest other register tiles
            key = (other.dot.name, other.mr, other.nv)
            if key in seen:
                continue
            seen.add(key)
            slower = other.seconds / tile.seconds if tile.seconds else 1.0
            why = (f"{slower:.2f}x the time" if slower >= 1.005 else
                   "same predicted time; ties go to more accumulators, then the narrower MR")
            reasons.append(f"  beat {other.describe(core)} ({why})")
            shown += 1
            if shown == 3:
                break
        for dot in dots:                          # the best tile of an instruction that lost
            if dot is not tile.dot:
                best = next(t for t in ranked if t.dot is dot)
                reasons.append(f"  best {dot.name} tile: {best.describe(core)} "
                               f"({best.seconds / tile.seconds:.2f}x the time)")
    threads = max(1, min(threads, math.ceil(arm_shape(spec, tile.dot).column_rows / tile.rows)
                         * math.ceil(arm_shape(spec, tile.dot).run / (tile.nr // tile.rows))))
    name = function_name or f"{base}_{tile.dot.name}_t{threads}"
    predicted = 2.0 * m * n * k / 1e9 / tile.seconds if tile.seconds > 0 else None
    lowering = "gemm" if isinstance(spec, MatmulSpec) else "implicit_gemm_staged"
    header.append(f"{lowering}: M={m} N={n} K={k}, {tile.dot.name} register tile MR={tile.mr} NR={tile.nr}, "
                  f"{tile.dot.k_depth}-deep k groups" + (f" ({tile.rows} output rows)" if tile.rows > 1 else "")
                  + (", split 64-bit operand loads (in-order variant)" if tile.split_loads else ""))
    reasons.append("k loops not unrolled: copies of the k step interleaved by the scheduler spill operands "
                   "(llvm-mca, benchmarks/arm_int8_mca.py)")
    return Int8Plan(spec, quant, tile.dot.name, lowering, tile.mr, tile.nv, tile.dot.col_lanes, threads, name,
                    core.gcc_march, predicted, tuple(header), tuple(reasons), tile.rows, k_depth=tile.dot.k_depth,
                    qemu_cpu=core.qemu_cpu, target_arch="aarch64", split_loads=tile.split_loads,
                    ops_per_cycle=tile.ops_per_cycle,
                    registers=(tile.dot.registers(tile.mr, tile.nv), core.vector_registers),
                    activation_offset=signed_offset(quant), k_unroll=1,
                    row_operand="activations" if isinstance(spec, MatmulSpec) else "weights")


def signed_offset(quant: QuantParams) -> int:
    """s8 x s8 dot products (sdot, smmla): uint8 activations are made signed by x ^ 0x80 = x - 128."""
    return -128 if quant.act_type == "uint8" else 0
