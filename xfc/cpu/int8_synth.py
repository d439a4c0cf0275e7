"""int8 host kernel planning: which dialect, which register tile, how many threads.

Pure: (spec, quantization, hardware, cluster, threads, host flags) -> Int8Plan. The fp32 synthesizer
(synth.py) is not involved, so fp32 plans cannot change because of anything here.

Dialects (templates/cpu/int8_dialect.h.j2):
  vnni     AVX-512 VNNI vpdpbusd: one instruction = 16 lanes x 4 u8*s8 products into int32.
  avx2     vpmaddwd on even/odd bytes widened in place: 2 vpmaddwd + 2 vpaddd per 8 lanes x 4
           products (vpmaddubsw would saturate its int16 pair sums, so it is not used).
  generic  plain C (modular uint32 accumulators), compiled for the description's -march.
An AVX-512 core without avx512_vnni gets the avx2 dialect (it runs AVX2), and says so.

Register tile (MR rows x NV vectors): every (MR, NV) whose registers fit the core's vector
registers (accumulators MR*NV, column vectors NV (avx2: 2*NV, the even/odd halves), the broadcast
row value(s), one temporary) is scored with a per-4-deep-group issue model:

    cycles/group = max(MR*NV / dots_per_cycle, (MR + NV) / loads_per_cycle, latency)
    dots_per_cycle = core.fma_per_cycle x DOT_RATE[dialect]

DOT_RATE (dot-product instructions per FMA slot): vnni 1 (vpdpbusd issues on the FMA ports with
the FMA's throughput: uops.info, Ice Lake / Cascade Lake ZMM rows; assumed, not measured here),
avx2 0.5 (two vpmaddwd per group on the same ports), generic 0.25 (scalar-ish C; ranking only).
latency: core.fma_latency_cycles (vpdpbusd latency 5 on Ice Lake; every accumulator is one
dependency chain per group). The whole problem's time is tiles x groups x cycles / clock / threads
(padding of ragged M and N counted as waste); the fastest tile wins, ties to more accumulators
then smaller MR. The int8 ops count is 2 x M x N x K (multiply and add), like fp32 FLOPs.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Optional

from ..errors import OperatorError
from ..hardware.model import CpuCluster, HardwareDescription
from ..ops.quant import QuantParams, check_spec, resolve_out_scale, validate
from ..ops.spec import Conv2dSpec, DepthwiseSpec, MatmulSpec, OperatorSpec, gemm_view
from .config import DOT_RATE, INT8_DIALECTS, INT8_LANES, int8_dialect, int8_registers
from .int8_plan import Int8Synthesis, Int8Plan  # noqa: F401  (the plan type lives in qplan.py, shared with qarm.py)

MAX_MR = 16
MAX_NV = 4
# u8 x s8 dot products (vpdpbusd, vpmaddwd on zero-extended bytes): int8 activations are made unsigned
# by x ^ 0x80 = x + 128 (QuantParams.shift), uint8 ones are used as they are.
DEPTHWISE_TARGET_PRAGMA = {"vnni": "avx2,fma,avx512f,avx512bw,avx512vl", "avx2": "avx2,fma", "generic": ""}


@dataclass(frozen=True)
class Int8Tile:
    mr: int
    nv: int
    lanes: int
    cycles_per_group: float
    seconds: float
    tile_rows: int = 1          # conv2d: output rows a column tile spans (nv / tile_rows vectors per row)

    @property
    def nr(self) -> int:
        return self.nv * self.lanes


@dataclass(frozen=True)
class GemmShape:
    """What the tile search needs: M rows; N columns as `column_rows` runs of `run` columns (a
    conv2d tiles each output row separately: OH runs of OW pixels); 4-deep k groups."""
    m: int
    run: int
    column_rows: int
    groups: int


def gemm_shape(spec: OperatorSpec) -> GemmShape:
    m, n, k = gemm_view(spec)
    if isinstance(spec, Conv2dSpec):     # k groups: 4 input channels of one tap (int8_gemm.c.j2)
        return GemmShape(m, spec.out_w, spec.out_h, spec.r * spec.s * math.ceil(spec.c / 4))
    return GemmShape(m, n, 1, math.ceil(k / 4))


def _tile_seconds(shape: GemmShape, mr: int, nr: int, cycles: float, clock_hz: float, threads: int,
                  rows: int = 1) -> float:
    """nr columns per tile, as `rows` output rows of nr / rows columns each (conv2d)."""
    column_tiles = math.ceil(shape.column_rows / rows) * math.ceil(shape.run / (nr // rows))
    tiles = math.ceil(shape.m / mr) * column_tiles
    return tiles * shape.groups * cycles / clock_hz / max(1, min(threads, column_tiles))


def choose_tile(dialect: str, shape: GemmShape, cluster: CpuCluster, threads: int) -> tuple[Int8Tile, int]:
    """The register tile with the shortest modelled time, and how many tiles were scored."""
    core = cluster.core
    lanes = INT8_LANES[dialect]
    dots = core.fma_per_cycle * DOT_RATE[dialect]
    loads = core.load_rules.vector_loads_per_cycle
    clock_hz = cluster.clock_ghz * 1e9
    best, key_best, scored = None, None, 0
    for nv in range(1, MAX_NV + 1):
        for mr in range(1, MAX_MR + 1):
            if int8_registers(dialect, mr, nv) > core.vector_registers:
                continue
            cycles = max(mr * nv / dots, (mr + nv) / loads, float(core.fma_latency_cycles))
            for rows in [r for r in range(1, nv + 1) if nv % r == 0 and (r == 1 or shape.column_rows > 1)]:
                scored += 1
                seconds = _tile_seconds(shape, mr, nv * lanes, cycles, clock_hz, threads, rows)
                key = (round(seconds * 1e12), -mr * nv, mr, rows)
                if key_best is None or key < key_best:
                    best, key_best = Int8Tile(mr, nv, lanes, cycles, seconds, rows), key
    if best is None:
        raise OperatorError(f"no int8 register tile fits {core.vector_registers} vector registers")
    return best, scored


def plan_int8(spec: OperatorSpec, quant: QuantParams, hw: HardwareDescription, *, cluster: Optional[str] = None,
              threads: Optional[int] = None, host_flags: frozenset = frozenset(),
              function_name: Optional[str] = None, force_dialect: Optional[str] = None,
              force_tile: Optional[tuple[int, int]] = None, force_rows: Optional[int] = None) -> Int8Plan:
    """The int8 plan. force_dialect / force_tile / force_rows (tests, benchmarks): a narrower
    dialect than the core's, an explicit (MR, NV), output rows per conv2d column tile.
    AArch64 descriptions are planned by xfc.cpu.int8_arm (sdot / smmla)."""
    if hw.target_arch == "aarch64":
        from .int8_arm import plan_arm_int8
        return plan_arm_int8(spec, quant, hw, cluster=cluster, threads=threads, function_name=function_name,
                             force_dialect=force_dialect, force_tile=force_tile, force_rows=force_rows)
    check_spec(spec)
    quant = validate(resolve_out_scale(spec, quant))
    cl = hw.cluster(cluster)
    dialect, why = int8_dialect(cl.core, host_flags)
    if force_dialect is not None:
        allowed = INT8_DIALECTS[INT8_DIALECTS.index(dialect):]
        if force_dialect not in allowed:
            raise OperatorError(f"int8 dialect '{force_dialect}' is not available on {hw.name} "
                                f"(available: {', '.join(allowed)})")
        dialect, why = force_dialect, f"forced by the caller (core offers {dialect})"
    threads = threads or cl.count
    if threads < 1:
        raise OperatorError(f"--threads must be >= 1, got {threads}")
    march = cl.core.gcc_march
    name = function_name or ("xfc_q_" + re.sub(r"[^A-Za-z0-9_]", "_", spec.key()) + f"_{quant.act_type}_{dialect}_t{threads}")
    header = [f"xfc int8 CPU kernel: {spec.describe()}", f"quantization: {quant.describe()}",
              f"dialect={dialect} ({why}) threads={threads}"]
    reasons = [f"dialect: {why}"]
    if isinstance(spec, DepthwiseSpec):
        header.append("lowering: direct depthwise (int16 staged plane, int32 row accumulators)")
        reasons.append("depthwise: direct int32-accumulating loops, vectorized by the compiler along output rows")
        pragma = DEPTHWISE_TARGET_PRAGMA[dialect]
        if pragma:
            reasons.append(f"depthwise rows vectorized by gcc for `#pragma GCC target(\"{pragma}\")` (the {dialect} "
                           f"dialect's instructions)")
        return Int8Plan(spec, quant, dialect, "direct_depthwise", 1, 1, INT8_LANES[dialect], min(threads, spec.n * spec.c),
                        name, march, None, tuple(header), tuple(reasons), target_pragma=pragma)
    m, n, k = gemm_view(spec)
    shape = gemm_shape(spec)
    if force_tile is not None:
        mr, nv = force_tile
        if int8_registers(dialect, mr, nv) > cl.core.vector_registers or not (1 <= mr <= 64 and 1 <= nv <= 8):
            raise OperatorError(f"int8 tile {mr}x{nv} vectors does not fit {cl.core.vector_registers} registers")
        cycles = max(mr * nv / (cl.core.fma_per_cycle * DOT_RATE[dialect]), float(cl.core.fma_latency_cycles))
        rows = force_rows if (force_rows and isinstance(spec, Conv2dSpec) and nv % force_rows == 0) else 1
        tile = Int8Tile(mr, nv, INT8_LANES[dialect], cycles,
                     _tile_seconds(shape, mr, nv * INT8_LANES[dialect], cycles, cl.clock_ghz * 1e9, threads, rows), rows)
        reasons.append(f"register tile {mr}x{nv * INT8_LANES[dialect]} ({rows} output row(s)): forced by the caller")
    else:
        tile, scored = choose_tile(dialect, shape, cl, threads)
        reasons.append(
            f"register tile {tile.mr}x{tile.nr}{f' as {tile.tile_rows} output rows' if tile.tile_rows > 1 else ''} "
            f"({tile.mr * tile.nv} accumulators, "
            f"{int8_registers(dialect, tile.mr, tile.nv)} of {cl.core.vector_registers} registers): fastest of {scored} "
            f"by the issue model, {tile.cycles_per_group:.2f} cycles per 4-deep group "
            f"({cl.core.fma_per_cycle * DOT_RATE[dialect]:g} dot instructions/cycle, latency {cl.core.fma_latency_cycles})")
    threads = max(1, min(threads, math.ceil(shape.column_rows / tile.tile_rows)
                         * math.ceil(shape.run / (tile.nr // tile.tile_rows))))
    predicted = 2.0 * m * n * k / 1e9 / tile.seconds if tile.seconds > 0 else None   # per batch item = overall
    lowering = "gemm" if isinstance(spec, MatmulSpec) else "implicit_gemm_staged"
    header.append(f"{lowering}: M={m} N={n} K={k}, register tile MR={tile.mr} NR={tile.nr}"
                  + (f" ({tile.tile_rows} output rows)" if tile.tile_rows > 1 else ""))
    return Int8Plan(spec, quant, dialect, lowering, tile.mr, tile.nv, tile.lanes, threads, name, march, predicted,
                    tuple(header), tuple(reasons), tile.tile_rows, activation_offset=quant.shift,
                    row_operand="activations" if isinstance(spec, MatmulSpec) else "weights")


def explain(plan: Int8Plan) -> str:
    return Int8Synthesis(plan).explain()

