"""Bottom-up CPU synthesis: register micro-tiles first, then L1, L2, outer tiles, then cores.

Pure and deterministic: (spec, hardware, cluster role, threads) -> CpuSynthesis. No clock,
environment or file access happens here (the caller times it).

  (a) enumerate micro-tiles whose accumulators + operand registers fit the core's SIMD
      registers; score each with a static per-k-step issue model (FMA pipes and latency,
      vector loads per cycle, in-order load rules) through a MicroTileEvaluator, which a
      measured tile database can replace;
  (b) expand the best micro-tiles into cache tiles: KC so the B micro-panel and the streaming
      A micro-panel fit L1, MC so the packed A block fits the core's L2, NC so the packed B
      panel fits the shared L3 (or what is left of L2);
  (c) split across the cluster's cores along the axis with the least load imbalance;
  (d) rank complete programs with a roofline-style cost model (compute, L1, L2, DRAM) and
      pick the fastest; ties break on a stable key.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Protocol

from ._version import __version__
from .errors import OperatorError
from .hardware.model import CpuCluster, CpuCore, HardwareDescription
from .ir import CpuKernelPlan, DepthwiseSchedule, GemmSchedule
from .ops.spec import Conv2dSpec, DepthwiseSpec, MatmulSpec, OperatorSpec, gemm_view

FLOAT_BYTES = 4
MAX_MR = 16
MAX_NR_VECTORS = 4

# Cost-model assumptions (described in docs/cost-model.md). They scale predictions only.
L2_BYTES_PER_CYCLE = 32.0        # per core, L2 -> L1 refill bandwidth
SHARED_CACHE_BYTES_PER_CYCLE = 16.0  # per core, L3/SLC -> L2
# Fraction of a cache level a tile may fill: the rest holds the other operands, C lines and
# whatever the hardware prefetcher brings in. Chosen from the host measurements in
# docs/host-kernel-notes.md and the usual BLIS practice of leaving about half of L1 free.
L1_FILL = 0.5
L2_FILL = 0.5
L3_FILL = 0.5
L2_STREAM_FILL = 0.25            # deep-KC candidates: both micro-panels within this share of L2
B_REUSE_FOR_L2_STREAM = 8        # row tiles that must reuse a B micro-panel before it may live in L2
RANK_BUCKET = 0.02               # relative score/time differences the model cannot resolve
K_STEP_ALIGN = 8                 # KC is a multiple of this (keeps the unrolled body whole)


# ---------------------------------------------------------------------------------------------
# (a) Micro-tiles and their evaluation.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MicroTile:
    mr: int
    nr_vectors: int
    lanes: int
    a_load_bits: int        # NEON: 64 or 128-bit loads of A feeding lane-indexed FMAs; x86: 32 (broadcast)

    @property
    def nr(self) -> int:
        return self.nr_vectors * self.lanes

    @property
    def accumulator_registers(self) -> int:
        return self.mr * self.nr_vectors

    def a_registers(self, isa: str) -> int:
        if isa == "neon":
            return math.ceil(self.mr / (self.a_load_bits // 32))
        return 1  # one broadcast register, reused row by row

    def registers(self, isa: str) -> int:
        return self.accumulator_registers + self.nr_vectors + self.a_registers(isa)

    def loads_per_k(self, isa: str) -> tuple[int, int]:
        """(128-bit-or-wider vector loads, narrow 64-bit loads) per k step."""
        if isa == "neon":
            a_loads = math.ceil(self.mr / (self.a_load_bits // 32))
            return (self.nr_vectors + (a_loads if self.a_load_bits == 128 else 0),
                    a_loads if self.a_load_bits == 64 else 0)
        return self.nr_vectors + self.mr, 0  # broadcasts from memory are load micro-ops


@dataclass(frozen=True)
class MicroTileScore:
    cycles_per_k: float      # predicted cycles per k step of the micro-kernel
    efficiency: float        # fraction of FMA peak the micro-kernel sustains
    bound: str               # 'fma', 'load', 'latency', 'in-order load stalls'
    source: str              # 'static' or e.g. 'tile_db:<file>'


class MicroTileEvaluator(Protocol):
    def evaluate(self, tile: MicroTile, core: CpuCore, isa: str) -> MicroTileScore: ...


class StaticEvaluator:
    """Static issue model of one k step of the micro-kernel (XFC's static analysis)."""

    def evaluate(self, tile: MicroTile, core: CpuCore, isa: str) -> MicroTileScore:
        fmas = tile.accumulator_registers
        wide_loads, narrow_loads = tile.loads_per_k(isa)
        fma_cycles = fmas / core.fma_per_cycle
        rules = core.load_rules
        if core.pipeline == "in_order" and not rules.ld128_dual_issues_with_fma:
            # 128-bit loads stall the FMA pipe; 64-bit loads pair with FMAs while slots last.
            stall = wide_loads * max(rules.ld128_blocking_cycles, 1)
            narrow_extra = max(0.0, narrow_loads - fma_cycles) if rules.ld64_dual_issues_with_fma else narrow_loads
            cycles = fma_cycles + stall + narrow_extra
            bound = "in-order load stalls" if stall + narrow_extra > 0 else "fma"
        else:
            load_cycles = (wide_loads + narrow_loads * 0.5) / rules.vector_loads_per_cycle
            cycles = max(fma_cycles, load_cycles)
            bound = "fma" if fma_cycles >= load_cycles else "load"
        # Each accumulator is updated once per k step: a step cannot finish faster than one
        # FMA latency, so too few accumulators leave the pipes idle.
        if core.fma_latency_cycles > cycles:
            cycles, bound = float(core.fma_latency_cycles), "latency"
        return MicroTileScore(cycles_per_k=cycles, efficiency=fma_cycles / cycles, bound=bound, source="static")


def isa_for(core: CpuCore) -> str:
    return core.isa_family


def enumerate_micro_tiles(core: CpuCore, isa: str) -> list[MicroTile]:
    lanes = core.fp32_lanes if isa != "generic" else 4
    a_widths = (128, 64) if isa == "neon" else (32,)
    tiles = []
    for nr_vectors in range(1, MAX_NR_VECTORS + 1):
        for mr in range(1, MAX_MR + 1):
            for a_bits in a_widths:
                tile = MicroTile(mr=mr, nr_vectors=nr_vectors, lanes=lanes, a_load_bits=a_bits)
                if tile.registers(isa) <= core.vector_registers:
                    tiles.append(tile)
    return tiles


def rank_micro_tiles(core: CpuCore, isa: str, evaluator: MicroTileEvaluator,
                     m: int, n: int) -> list[tuple[MicroTile, MicroTileScore, float]]:
    """Micro-tiles by useful throughput on this problem: efficiency x (1 - ragged-edge waste).

    Ties go to more FMAs per k step (more register reuse, less L1 traffic), then to a stable key.
    """
    ranked = []
    for tile in enumerate_micro_tiles(core, isa):
        score = evaluator.evaluate(tile, core, isa)
        # Tails have their own kernels: the row tail costs at least half a full tile (few
        # accumulators cannot hide FMA latency); columns are padded to whole vectors only.
        m_cost = (m // tile.mr) * tile.mr + (max(m % tile.mr, tile.mr / 2) if m % tile.mr else 0)
        n_cost = (n // tile.nr) * tile.nr + _round_up(n % tile.nr, tile.lanes)
        useful = (m * n) / (m_cost * n_cost)
        ranked.append((tile, score, score.efficiency * useful))
    # Differences under RANK_BUCKET are within the model's accuracy: there, more FMAs per k
    # step (more register reuse, fewer loads per FLOP) and wider tiles win.
    ranked.sort(key=lambda t: (-round(t[2] / RANK_BUCKET), -t[0].accumulator_registers,
                               -t[0].nr_vectors, t[0].mr, -t[0].a_load_bits))
    return ranked


# ---------------------------------------------------------------------------------------------
# The tile program that (b)-(d) build, and its explanation.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TileLevel:
    level: str        # 'REG', 'L1', 'L2', 'L3', 'CORES' (depthwise: 'REG', 'STAGE', 'CORES')
    tile: str         # what the tile is, e.g. 'mr=14 x nr=32, k unroll 4'
    usage: str        # the constraint it satisfies, e.g. 'registers 31 of 32'
    decided_by: str   # what stopped growth or picked the value


@dataclass(frozen=True)
class CostEstimate:
    flops: int
    seconds_by_bound: tuple[tuple[str, float], ...]   # ('compute', s), ('L1', s), ...
    predicted_s: float
    bound: str

    @property
    def predicted_gflops(self) -> float:
        return self.flops / self.predicted_s / 1e9 if self.predicted_s > 0 else 0.0


@dataclass(frozen=True)
class CpuSynthesis:
    spec: OperatorSpec
    hardware: str
    cluster: CpuCluster
    plan: CpuKernelPlan
    levels: tuple[TileLevel, ...]
    estimate: CostEstimate
    gemm_shape: Optional[tuple[int, int, int]]   # (M, N, K) of the lowered GEMM, per batch item
    alternatives: tuple[tuple[str, float], ...] = field(default_factory=tuple)  # (summary, predicted_s)
    micro_tile_source: str = "static"

    def explain(self) -> str:
        c = self.cluster
        lines = [f"xfc {__version__}: {self.spec.describe()}",
                 f"hardware: {self.hardware}, {c.role} cluster: {c.count}x {c.core.name} @ {c.clock_ghz:g} GHz "
                 f"({c.core.pipeline.replace('_', '-')}, {c.core.vector_bits}-bit SIMD x{c.core.vector_registers} "
                 f"registers, {c.core.fma_per_cycle:g} FMA/cycle, L1d {c.core.l1d.size_bytes // 1024} KiB, "
                 f"L2 {c.l2.size_bytes // 1024} KiB), isa {self.plan.isa}"]
        if self.gemm_shape:
            m, n, k = self.gemm_shape
            lines.append(f"lowering: {self.plan.lowering} as GEMM M={m} N={n} K={k}"
                         + (f" (x{self.spec.n} batch)" if isinstance(self.spec, Conv2dSpec) and self.spec.n > 1 else ""))
        else:
            lines.append(f"lowering: {self.plan.lowering}")
        width = [max(len(x) for x in col) for col in zip(*[(lv.level, lv.tile, lv.usage) for lv in self.levels])]
        for lv in self.levels:
            lines.append(f"  {lv.level.ljust(width[0])}  {lv.tile.ljust(width[1])}  {lv.usage.ljust(width[2])}"
                         f"  <- {lv.decided_by}")
        est = self.estimate
        parts = ", ".join(f"{name} {s * 1e3:.3f} ms" for name, s in est.seconds_by_bound)
        lines.append(f"predicted (static cost model, not a measurement): {est.predicted_s * 1e3:.3f} ms, "
                     f"{est.predicted_gflops:.1f} GFLOP/s, bound: {est.bound} ({parts})")
        if self.alternatives:
            lines.append("runners-up: " + "; ".join(f"{s} {t * 1e3:.3f} ms" for s, t in self.alternatives[:3]))
        return "\n".join(lines)

    def report(self) -> dict:
        plan = self.plan
        out = {
            "operator": self.spec.name, "shape": self.spec.describe(), "key": self.spec.key(),
            "hardware": self.hardware, "cluster": self.cluster.role, "core": self.cluster.core.name,
            "isa": plan.isa, "lowering": plan.lowering,
            "levels": [{"level": lv.level, "tile": lv.tile, "usage": lv.usage, "decided_by": lv.decided_by}
                       for lv in self.levels],
            "predicted_seconds": self.estimate.predicted_s, "predicted_gflops": self.estimate.predicted_gflops,
            "predicted_bound": self.estimate.bound, "prediction_note": "static cost model, not a measurement",
            "flops": self.spec.flops, "micro_tile_source": self.micro_tile_source,
        }
        if plan.gemm:
            out["tiles"] = {k: getattr(plan.gemm, k) for k in GemmSchedule.__dataclass_fields__}
        if plan.depthwise:
            out["tiles"] = {k: getattr(plan.depthwise, k) for k in DepthwiseSchedule.__dataclass_fields__}
        return out


# ---------------------------------------------------------------------------------------------
# (b)-(d) for GEMM-lowered operators.
# ---------------------------------------------------------------------------------------------

def _round_down(x: int, multiple: int) -> int:
    return max(multiple, (x // multiple) * multiple)


def _round_up(x: int, multiple: int) -> int:
    return math.ceil(x / multiple) * multiple


def _shared_cache_bytes(hw: HardwareDescription, cluster: CpuCluster) -> tuple[int, str]:
    if hw.l3_bytes:
        return hw.l3_bytes, "L3"
    if hw.slc_bytes:
        return hw.slc_bytes, "SLC"
    return cluster.l2.size_bytes * cluster.count, "L2 (no shared L3 described)"


def a_rows_per_l1_set(mr: int, lda: int, l1d) -> int:
    """Most of MR rows, lda floats apart, whose cache lines map to the same L1 set."""
    sets = max(1, l1d.size_bytes // (l1d.line_bytes * l1d.ways))
    counts: dict[int, int] = {}
    for row in range(mr):
        index = (row * lda * FLOAT_BYTES // l1d.line_bytes) % sets
        counts[index] = counts.get(index, 0) + 1
    return max(counts.values())


def _expand(tile: MicroTile, score: MicroTileScore, spec: OperatorSpec, hw: HardwareDescription,
            cluster: CpuCluster, threads: int, isa: str, kc_fill: float = L1_FILL, transposed: bool = False,
            stream_b_from_l2: bool = False):
    """Grow one micro-tile into a full GEMM schedule; return (schedule, levels, estimate)."""
    core = cluster.core
    m, n, k = gemm_view(spec, transposed)
    batch = spec.batch if isinstance(spec, MatmulSpec) else spec.n
    conv = isinstance(spec, Conv2dSpec)
    mr, nr = tile.mr, tile.nr
    k_unroll = 4 if k >= 4 else 1
    # L1: the KC x NR micro-panel of B is reused by every A micro-panel; it and the streaming
    # MR x KC micro-panel of A must fit the L1 share.
    l1_budget = core.l1d.size_bytes * kc_fill
    kc_cap = int(l1_budget // ((mr + nr) * FLOAT_BYTES))
    l2_per_core = cluster.l2.size_bytes / max(cluster.l2.shared_by_cores, 1)
    if transposed and (mr + nr) * k * FLOAT_BYTES <= l2_per_core * L2_FILL:
        # A transposed tile is stored through a scalar loop: store it once, streaming both
        # micro-panels (whole K) from L2 instead of L1.
        kc, kc_reason = k, "transposed C tile stored once: both K-deep micro-panels fit the L2 share"
    elif stream_b_from_l2:
        # Deep slices streamed from L2: fewer passes over a large C, for micro-panels that many
        # row tiles reuse (the caller only offers this when they do).
        kc_cap_l2 = int(l2_per_core * L2_STREAM_FILL // ((mr + nr) * FLOAT_BYTES))
        slices = math.ceil(k / max(_round_down(kc_cap_l2, K_STEP_ALIGN), 1))
        kc = min(k, _round_up(math.ceil(k / slices), K_STEP_ALIGN))
        kc_reason = (f"micro-panels streamed from L2 ({L2_STREAM_FILL:.0%} of the L2 share), {slices} slice(s) "
                     f"of K={k}: fewer passes over C")
    elif kc_cap >= k:
        kc, kc_reason = k, "whole reduction K fits the L1 share"
    else:
        # As many slices as the cap needs, then equal slices: K=147 under a cap of 72 gives 3 x 56
        # rather than 72 + 72 + 3 (a 3-deep slice costs a whole pass over C for 3 k steps).
        slices = math.ceil(k / max(_round_down(kc_cap, K_STEP_ALIGN), 1))
        kc = _round_up(math.ceil(k / slices), K_STEP_ALIGN)
        kc_reason = f"L1 capacity ({kc_fill:.0%} of L1d), {slices} equal slices of K={k}"
    kc = max(kc, 1)
    # L2: the packed MC x KC block of A is reused across the whole NC panel.
    mc_cap = int(l2_per_core * L2_FILL // (kc * FLOAT_BYTES))
    m_padded = _round_up(m, mr)
    if mc_cap >= m_padded:
        mc, mc_reason = m_padded, "whole M fits the L2 share"
    else:
        mc, mc_reason = _round_down(mc_cap, mr), f"L2 capacity ({L2_FILL:.0%} of per-core L2)"
    # Outer: the KC x NC panel of B stays in the shared cache while every MC block uses it.
    shared_bytes, shared_name = _shared_cache_bytes(hw, cluster)
    nc_cap = int(shared_bytes * L3_FILL // (kc * FLOAT_BYTES))
    n_padded = _round_up(n, nr)
    if nc_cap >= n_padded:
        nc, nc_reason = n_padded, f"whole N fits the {shared_name} share"
    else:
        nc, nc_reason = _round_down(nc_cap, nr), f"{shared_name} capacity ({L3_FILL:.0%})"

    # (c) Cores: split the axis whose tiles divide most evenly; prefer (within 10%) the axis that
    # also splits the operand packed on every call (conv: the im2col matrix, B or, transposed, A),
    # since splitting the other axis makes every thread pack all of it.
    n_tiles, m_tiles = math.ceil(n / nr), math.ceil(m / mr)
    imbalance_n = math.ceil(n_tiles / threads) * threads / n_tiles
    imbalance_m = math.ceil(m_tiles / threads) * threads / m_tiles
    axis = "n" if imbalance_n <= imbalance_m else "m"
    packed_axis = ("m" if transposed else "n") if conv else None
    split_reason = "fewest idle tiles"
    if packed_axis and axis != packed_axis:
        packed_imbalance = imbalance_m if packed_axis == "m" else imbalance_n
        if packed_imbalance <= 1.10 * min(imbalance_n, imbalance_m):
            axis, split_reason = packed_axis, "splits the input operand packed on every call (no duplicated packing)"
    imbalance = imbalance_n if axis == "n" else imbalance_m
    if threads == 1:
        axis, imbalance = "n", 1.0
    # A operand: NEON feeds MR rows from one vector load (lane-indexed FMAs), which needs A packed
    # as [k][MR]; elsewhere every row is its own broadcast load anyway, so A is read in place and
    # the packing pass disappears.
    a_pack, a_reason = ("packed", "lane-indexed FMAs read MR rows per load") if isa == "neon" else \
        ("direct", "one broadcast per row either way")
    if transposed:
        if spec.out_w % mr == 0:  # a tile's pixels lie in one output row: consecutive staged floats
            a_pack, a_reason = "im2col_direct", f"MR={mr} pixels of one output row read from the staged image"
        else:
            a_pack, a_reason = "packed", f"im2col rows of output pixels (MR={mr} does not divide OW={spec.out_w})"
    elif a_pack == "direct":
        # Rows of A read in place are lda floats apart; when that stride is a multiple of the L1
        # set span, many rows fall into one set and evict each other (lda = 1024 floats on an
        # 8-way, 64-set L1 puts all MR rows in one set). Then packing pays for itself.
        crowded = a_rows_per_l1_set(mr, k, core.l1d)
        if crowded > core.l1d.ways // 2:
            a_pack, a_reason = "packed", f"{crowded} of {mr} rows in place would share one L1 set"
    sched = GemmSchedule(mr=mr, nr=nr, k_unroll=k_unroll, kc=kc, mc=mc, nc=nc, threads=threads,
                         parallel_axis=axis, a_load_bits=tile.a_load_bits if isa == "neon" else 128,
                         a_pack=a_pack)

    # (d) Cost: roofline over compute, L2->L1 and shared->L2 traffic, DRAM.
    clock_hz = cluster.clock_ghz * 1e9
    # Tail tiles have their own micro-kernels: no row padding, columns padded to whole vectors.
    n_computed = (n // nr) * nr + _round_up(n % nr, tile.lanes)
    padded_flops = 2 * batch * m * n_computed * k
    peak_flops_per_core = core.fp32_flop_per_cycle * clock_hz
    compute_s = padded_flops / (peak_flops_per_core * score.efficiency * threads / imbalance)
    if transposed:  # the transposed store, once per KC slice: about one element per cycle in scalar
        # code, about a third of that through the AVX-512 16x16 register transpose (MR <= 16)
        store_cycles_per_element = 0.3 if isa == "avx512" and mr <= 16 else 1.0
        compute_s *= 1 + store_cycles_per_element * tile.lanes / kc
    k_slices = math.ceil(k / kc)
    # Per KC slice: A block streamed from L2 once per NR column of B; B micro-panel from L2
    # once per MC block; C tile read+written once per KC slice.
    l2_bytes = batch * FLOAT_BYTES * (m * k * math.ceil(n / nr) + k * n * math.ceil(m / mc)
                                      + 2 * m * n * k_slices)
    l2_s = l2_bytes / (L2_BYTES_PER_CYCLE * clock_hz * threads)
    shared_bytes_moved = batch * FLOAT_BYTES * (k * n + m * k * math.ceil(n / nc) + 2 * m * n * k_slices)
    shared_s = shared_bytes_moved / (SHARED_CACHE_BYTES_PER_CYCLE * clock_hz * threads)
    # DRAM: every tensor once (inputs, weights, output).
    dram_bytes = FLOAT_BYTES * (sum(math.prod(s) for s in spec.input_shapes) + math.prod(spec.output_shape))
    bandwidth = (hw.memory.peak_bandwidth_gbps if hw.memory else 10.0) * 1e9 * 0.8
    dram_s = dram_bytes / bandwidth
    # Packing is extra work on the cores: about one element per cycle per core for gathers.
    # (weights are assumed pre-packed: the transposed filters of implicit_gemm_t are not counted)
    # Packing is extra work on the cores. Rates (elements per cycle per core): a transposing copy
    # (A into MR-row panels) about 1; im2col runs (short contiguous copies) about lanes / 4; whole
    # rows (pointwise conv input) about lanes / 2; staging the padded image about lanes / 2.
    # Weights (matmul B, transposed filters) are assumed pre-packed and not charged.
    im2col_rate, rows_rate = max(tile.lanes / 4, 1), max(tile.lanes / 2, 1)
    pack_cycles = 0.0
    if a_pack == "packed":  # A panels: the im2col rows (transposed conv) or a matrix transpose
        pack_cycles += batch * m * k * math.ceil(n / nc) / (im2col_rate if transposed else 1)
    if conv and not transposed:  # the B panel: input rows or im2col runs, every call
        pack_cycles += batch * k * n / (rows_rate if spec.pointwise else im2col_rate)
    if conv and (transposed or not spec.pointwise):  # staging the zero-padded image once per call
        staged = batch * spec.c * (spec.h + spec.pad_top + spec.pad_bottom) * (spec.w + spec.pad_left + spec.pad_right)
        pack_cycles += staged / rows_rate
    pack_s = pack_cycles / (clock_hz * threads)
    # Every KC slice after the first reads and writes C again; that traffic waits on the level C
    # lives in and does not overlap the FMAs of the tile it belongs to.
    c_bytes = batch * FLOAT_BYTES * m * n
    c_rate = L2_BYTES_PER_CYCLE if c_bytes <= l2_per_core * threads * L2_FILL else SHARED_CACHE_BYTES_PER_CYCLE
    c_pass_s = (k_slices - 1) * 2 * c_bytes / (c_rate * clock_hz * threads)
    parts = (("compute", compute_s + pack_s + c_pass_s), ("L2", l2_s), ("L3", shared_s), ("DRAM", dram_s))
    bound, worst = max(parts, key=lambda p: p[1])
    estimate = CostEstimate(flops=batch * 2 * m * n * k, seconds_by_bound=parts, predicted_s=worst, bound=bound)

    regs = tile.registers(isa)
    a_note = (f", A packed ({a_reason})" + (f", via {tile.a_load_bits}-bit loads" if isa == "neon" else "")
              if a_pack == "packed" else f", A read in place ({a_reason}): no A packing")
    levels = (
        TileLevel("REG", f"mr={mr} x nr={nr} ({tile.nr_vectors} x {tile.lanes}-lane vectors), k unroll {k_unroll}",
                  f"registers {regs}/{core.vector_registers} (acc {tile.accumulator_registers} + B "
                  f"{tile.nr_vectors} + A {tile.a_registers(isa)}{a_note})",
                  f"micro-tile score {score.efficiency:.0%} of FMA peak ({score.bound}-bound, "
                  f"{score.cycles_per_k:.1f} cycles/k step, {score.source})"),
        TileLevel("L1", f"kc={kc}: B micro-panel {kc}x{nr} + A micro-panel {mr}x{kc}",
                  (f"{(mr + nr) * kc * FLOAT_BYTES / 1024:.1f} KiB of {cluster.l2.size_bytes // 1024} KiB L2 "
                   "(streamed through L1)" if kc_reason.startswith(("transposed", "micro-panels streamed")) else
                   f"{(mr + nr) * kc * FLOAT_BYTES / 1024:.1f} KiB of {core.l1d.size_bytes // 1024} KiB L1d"), kc_reason),
        TileLevel("L2", f"mc={mc}: {'packed ' if a_pack == 'packed' else ''}A block {mc}x{kc}",
                  f"{mc * kc * FLOAT_BYTES / 1024:.1f} KiB of {cluster.l2.size_bytes // 1024} KiB L2", mc_reason),
        TileLevel("L3", f"nc={nc}: packed B panel {kc}x{nc}",
                  f"{kc * nc * FLOAT_BYTES / 1024:.1f} KiB of {shared_bytes // 1024} KiB {shared_name.split()[0]}",
                  nc_reason),
        TileLevel("CORES", f"{threads} thread(s), split {'N columns' if axis == 'n' else 'M rows'}",
                  f"{threads} of {cluster.count} cores, load imbalance {imbalance:.2f}",
                  split_reason if threads > 1 else "single thread requested"),
    )
    return sched, levels, estimate


def _depthwise(spec: DepthwiseSpec, hw: HardwareDescription, cluster: CpuCluster, threads: int, isa: str):
    core = cluster.core
    lanes = core.fp32_lanes if isa != "generic" else 4
    window = spec.r * spec.s
    # Registers: the R x S weights stay in registers when they fit, plus one input vector.
    weight_regs = window if window <= core.vector_registers // 2 else 0
    free = core.vector_registers - weight_regs - 2
    ow_vectors_needed = math.ceil(spec.out_w / lanes)
    best = None
    for oh_rows in range(1, 9):
        for ow_vectors in range(1, min(ow_vectors_needed, 8) + 1):
            if oh_rows * ow_vectors > free:
                continue
            fmas = oh_rows * ow_vectors * window
            # each distinct input vector of the tile is loaded once and feeds every tap that reads it
            input_rows = spec.window_rows(oh_rows)
            loads = input_rows * spec.s * ow_vectors
            waste = math.ceil(spec.out_w / (ow_vectors * lanes)) * ow_vectors * lanes / spec.out_w
            key = (-(fmas / loads) / waste, -oh_rows * ow_vectors, oh_rows)
            if best is None or key < best[0]:
                best = (key, oh_rows, ow_vectors, fmas, loads)
    _, oh_rows, ow_vectors, fmas, loads = best
    planes = spec.n * spec.c
    threads_used = max(1, min(threads, planes))
    sched = DepthwiseSchedule(ow_vectors=ow_vectors, oh_rows=oh_rows, threads=threads_used)
    hp = spec.window_rows(oh_rows)  # rows staged per row block
    wp = spec.w + spec.pad_left + spec.pad_right
    stage_bytes = hp * _round_up(wp, lanes) * FLOAT_BYTES
    clock_hz = cluster.clock_ghz * 1e9
    compute_s = spec.flops / (core.fp32_flop_per_cycle * clock_hz * threads_used) * max(1.0, loads / fmas * 2)
    bytes_moved = FLOAT_BYTES * (spec.n * spec.c * (spec.h * spec.w + spec.out_h * spec.out_w) + spec.c * window)
    bandwidth = (hw.memory.peak_bandwidth_gbps if hw.memory else 10.0) * 1e9 * 0.8
    dram_s = bytes_moved / bandwidth
    blocks = math.ceil(spec.out_h / oh_rows)
    stage_s = spec.n * spec.c * blocks * hp * wp / (clock_hz * threads_used * lanes / 2)
    parts = (("compute", compute_s + stage_s), ("DRAM", dram_s))
    bound, worst = max(parts, key=lambda p: p[1])
    estimate = CostEstimate(flops=spec.flops, seconds_by_bound=parts, predicted_s=worst, bound=bound)
    where = "L1" if stage_bytes <= core.l1d.size_bytes * 0.75 else "L2"
    levels = (
        TileLevel("REG", f"{oh_rows} output rows x {ow_vectors} vectors of {lanes} ({oh_rows * ow_vectors} accumulators)",
                  f"registers {oh_rows * ow_vectors + weight_regs + 2}/{core.vector_registers} "
                  f"(acc {oh_rows * ow_vectors} + weights {weight_regs} + 2 input)",
                  f"best FMA/load ratio {fmas / loads:.2f} with the fewest wasted lanes"),
        TileLevel("STAGE", f"zero-padded{' phase-split' if spec.stride_w > 1 else ''} row block {hp}x{wp} "
                  f"(the input rows of {oh_rows} output rows)",
                  f"{stage_bytes / 1024:.1f} KiB in {where} ({core.l1d.size_bytes // 1024} KiB L1d, "
                  f"{cluster.l2.size_bytes // 1024} KiB L2)",
                  "one channel, one row block at a time: staged rows stay in L1, no boundary tests in the inner loop"),
        TileLevel("CORES", f"{threads_used} thread(s) over {planes} (batch x channel) planes",
                  f"{threads_used} of {cluster.count} cores", "planes are independent; memory-bound"),
    )
    return sched, levels, estimate


# ---------------------------------------------------------------------------------------------
# Entry point.
# ---------------------------------------------------------------------------------------------

def _check_request(spec: OperatorSpec, hw: HardwareDescription, cluster_role: Optional[str], threads: Optional[int]):
    cluster = hw.cluster(cluster_role)
    if threads is None:
        threads = cluster.count
    if not isinstance(threads, int) or threads < 1:
        raise OperatorError(f"--threads must be a positive integer, got {threads!r}")
    if threads > cluster.count:
        raise OperatorError(f"--threads {threads} exceeds the {cluster.count} cores of {hw.name}'s "
                            f"{cluster.role} cluster")
    return cluster, threads


def synthesize_cpu(spec: OperatorSpec, hw: HardwareDescription, cluster: Optional[str] = None,
                   threads: Optional[int] = None, evaluator: Optional[MicroTileEvaluator] = None,
                   isa: Optional[str] = None) -> CpuSynthesis:
    """Construct a CPU kernel for spec on hw's cluster, bottom-up. Pure and deterministic."""
    chosen, threads = _check_request(spec, hw, cluster, threads)
    core = chosen.core
    isa = isa or isa_for(core)
    if isa == "neon" and hw.target_arch != "aarch64":
        raise OperatorError(f"isa neon needs an AArch64 description, {hw.name} is {hw.target_arch}")
    evaluator = evaluator or StaticEvaluator()
    lanes = core.fp32_lanes if isa != "generic" else 4
    header_common = [
        f"Generated by xfc {__version__} - do not edit; regenerate with 'xfc synth'.",
        f"hardware: {hw.name} ({hw.marketing_name}), {chosen.role} cluster: {chosen.count}x {core.name} "
        f"@ {chosen.clock_ghz:g} GHz",
        f"operator: {spec.describe()}",
    ]
    if isinstance(spec, DepthwiseSpec):
        sched, levels, estimate = _depthwise(spec, hw, chosen, threads, isa)
        tiles_line = f"tiles: oh_rows={sched.oh_rows} ow_vectors={sched.ow_vectors} lanes={lanes} threads={sched.threads}"
        plan = CpuKernelPlan(
            spec=spec, isa=isa, vector_lanes=lanes, lowering="direct_depthwise", gemm=None, depthwise=sched,
            function_name="xfc_depthwise", header_lines=tuple(header_common + [tiles_line, f"isa: {isa}"]),
            hardware_name=hw.name, gcc_march=core.gcc_march, qemu_cpu=core.qemu_cpu)
        return CpuSynthesis(spec=spec, hardware=hw.name, cluster=chosen, plan=plan, levels=levels,
                            estimate=estimate, gemm_shape=None)

    # Expand the best few micro-tiles (and two L1 fill targets) in each orientation the operator
    # allows and let the cost model decide. Conv2d may put vectors along output pixels
    # (implicit_gemm) or along output channels (implicit_gemm_t, no waste when the pixel count is
    # ragged); ties keep the plain orientation.
    orientations = (False, True) if isinstance(spec, Conv2dSpec) else (False,)
    candidates = []
    for transposed in orientations:
        m, n, k = gemm_view(spec, transposed)
        for tile, score, _ in rank_micro_tiles(core, isa, evaluator, m, n)[:6]:
            options = [(L1_FILL, False), (0.75, False)]
            # Deep L2-streamed slices only for matmul, whose B is pre-packed once: a conv packs its
            # im2col panel (KC x NC) on every call, and a deep one falls out of cache (measured:
            # conv_r18_l1 kc=576 about 4% slower than kc=88 on the AVX-512 host).
            if isinstance(spec, MatmulSpec) and math.ceil(m / tile.mr) >= B_REUSE_FOR_L2_STREAM:
                options.append((1.0, True))
            for fill, stream in options:
                sched, levels, estimate = _expand(tile, score, spec, hw, chosen, threads, isa, fill, transposed,
                                                  stream_b_from_l2=stream)
                candidates.append((estimate.predicted_s, transposed, -tile.accumulator_registers, tile.mr, tile.nr,
                                   fill, sched, levels, estimate, score))
    fastest = min(c[0] for c in candidates)
    candidates.sort(key=lambda c: (round((c[0] / fastest - 1) / RANK_BUCKET), *c[1:6]))
    best = candidates[0]
    transposed, sched, levels, estimate, score = best[1], best[6], best[7], best[8], best[9]
    m, n, k = gemm_view(spec, transposed)
    seen, alternatives = {(transposed, sched)}, []
    for c in candidates[1:]:
        if (c[1], c[6]) not in seen:
            seen.add((c[1], c[6]))
            alternatives.append((f"{'transposed ' if c[1] else ''}{c[6].mr}x{c[6].nr} kc={c[6].kc}", c[0]))
    tiles_line = (f"tiles: mr={sched.mr} nr={sched.nr} k_unroll={sched.k_unroll} kc={sched.kc} mc={sched.mc} "
                  f"nc={sched.nc} threads={sched.threads} split={sched.parallel_axis} A={sched.a_pack}"
                  + (f" a_load_bits={sched.a_load_bits}" if isa == "neon" else ""))
    lowering = "gemm" if isinstance(spec, MatmulSpec) else ("implicit_gemm_t" if transposed else "implicit_gemm")
    gemm_line = f"lowered: {lowering} M={m} N={n} K={k}"
    plan = CpuKernelPlan(
        spec=spec, isa=isa, vector_lanes=lanes, lowering=lowering, gemm=sched, depthwise=None,
        function_name=f"xfc_{spec.name}", header_lines=tuple(header_common + [gemm_line, tiles_line, f"isa: {isa}"]),
        hardware_name=hw.name, gcc_march=core.gcc_march, qemu_cpu=core.qemu_cpu)
    return CpuSynthesis(spec=spec, hardware=hw.name, cluster=chosen, plan=plan, levels=levels, estimate=estimate,
                        gemm_shape=(m, n, k), alternatives=tuple(alternatives), micro_tile_source=score.source)


def plan_for(spec: OperatorSpec, hw: HardwareDescription, threads: Optional[int] = None) -> CpuKernelPlan:
    """Convenience for benchmarks: the chosen plan only."""
    return synthesize_cpu(spec, hw, threads=threads).plan
