"""Bottom-up CPU synthesis: register micro-tiles first, then L1, L2, outer tiles, then cores.

Pure and deterministic: (spec, hardware, cluster role, threads) -> CpuSynthesis. No clock,
environment or file access happens here (the caller times it).

  (a) enumerate micro-tiles whose accumulators + operand registers fit the core's SIMD
      registers; score each through a MicroTileEvaluator (tiles.py; the static issue model of
      cost_model.py, or a measured tile database);
  (b) grow the best micro-tiles into cache tiles: KC so the B micro-panel and the streaming
      A micro-panel fit L1, MC so the packed A block fits the core's L2, NC so the packed B
      panel fits the shared L3 (or what is left of L2);
  (c) split across the cluster's cores along the axis with the least load imbalance, and take
      the code-shape decisions (decide.py);
  (d) rank complete programs with the roofline cost model (cost_model.py) and pick the fastest;
      ties break on a stable key.
Growth (this module) and cost (cost_model.py) are separate: a grown GemmSchedule is handed to
the cost model, which reads only its fields.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

from ..errors import OperatorError
from ..hardware.model import CpuCluster, HardwareDescription
from ..wording import counted
from ..ops.spec import Conv2dSpec, DepthwiseSpec, MatmulSpec, OperatorSpec, gemm_view
from . import decide, winograd
from .cost_model import (DEFAULT_CONSTANTS, L1_FILL, L2_FILL, L3_FILL, CostConstants, CostEstimate,
                         StaticEvaluator, depthwise_estimate,
                         depthwise_fmas_and_loads, gemm_estimate, l2_per_core_bytes, share_imbalance)
from .explain import CpuSynthesis, GemmReasons, TileLevel, depthwise_levels, gemm_levels, plan_header
from .ir import CpuKernelPlan, DepthwiseSchedule, GemmSchedule
from .config import gcc_march
from .isa import IsaRow, isa_for, isa_row
from .tiles import (FLOAT_BYTES, RANK_BUCKET, MicroTile, MicroTileEvaluator, MicroTileScore, rank_micro_tiles,
                    round_down, round_up)

L1_FILL_WIDE = 0.75              # a second KC candidate per micro-tile: three quarters of L1d
L2_STREAM_FILL = 0.25            # deep-KC candidates: both micro-panels within this share of L2
B_REUSE_FOR_L2_STREAM = 8        # row tiles that must reuse a B micro-panel before it may live in L2
PACKED_B_L2_FILL = 0.25          # conv: the KC x NC panel of B packed on every call, within this share of L2
K_STEP_ALIGN = 8                 # KC is a multiple of this (keeps the unrolled body whole)
K_UNROLL = 4                     # k steps unrolled in the micro-kernel (when K allows)
PACKED_SPLIT_TOLERANCE = 1.10    # prefer the axis that splits the per-call packed operand within 10%
TOP_MICRO_TILES = 6              # micro-tiles expanded per orientation
DEPTHWISE_MAX_ROWS = 8           # output rows of a depthwise register tile
DEPTHWISE_MAX_VECTORS = 8        # output vectors per row of a depthwise register tile
DEPTHWISE_INPUT_REGISTERS = 2    # registers a depthwise tile keeps for input vectors


def _shared_cache_bytes(hw: HardwareDescription, cluster: CpuCluster) -> tuple[int, str]:
    if hw.l3_bytes:
        return hw.l3_bytes, "L3"
    if hw.slc_bytes:
        return hw.slc_bytes, "SLC"
    return cluster.l2.size_bytes * cluster.count, "L2 (no shared L3 described)"


def a_rows_per_l1_set(mr: int, lda: int, l1d, elem_bytes: int = FLOAT_BYTES) -> int:
    """Most of MR rows, lda elements apart, whose cache lines map to the same L1 set."""
    sets = max(1, l1d.size_bytes // (l1d.line_bytes * l1d.ways))
    counts: dict[int, int] = {}
    for row in range(mr):
        index = (row * lda * elem_bytes // l1d.line_bytes) % sets
        counts[index] = counts.get(index, 0) + 1
    return max(counts.values())


# ---------------------------------------------------------------------------------------------
# (b)-(c) growth of a GEMM schedule.
# ---------------------------------------------------------------------------------------------

def grow_gemm(tile: MicroTile, spec: OperatorSpec, hw: HardwareDescription, cluster: CpuCluster, threads: int,
              row: IsaRow, kc_fill: float = L1_FILL, transposed: bool = False,
              stream_b_from_l2: bool = False, store_once: bool = True) -> tuple[GemmSchedule, GemmReasons]:
    """Grow one micro-tile into a full GEMM schedule (tiles, thread split, code shape) and say why."""
    core = cluster.core
    m, n, k = gemm_view(spec, transposed)
    conv = isinstance(spec, Conv2dSpec)
    mr, nr = tile.mr, tile.nr
    k_unroll = K_UNROLL if k >= K_UNROLL else 1
    # L1: the KC x NR micro-panel of B is reused by every A micro-panel; it and the streaming
    # MR x KC micro-panel of A must fit the L1 share.
    l1_budget = core.l1d.size_bytes * kc_fill
    elem_bytes = tile.elem_bytes   # 4 (fp32) or 2 (fp16): every cache footprint below
    kc_cap = int(l1_budget // ((mr + nr) * elem_bytes))
    l2_per_core = l2_per_core_bytes(cluster)
    if transposed and store_once and (mr + nr) * k * elem_bytes <= l2_per_core * L2_FILL:
        # A transposed tile is stored through a local tile (and merged into C) once per KC slice:
        # store it once, streaming both micro-panels (whole K) from L2 instead of L1.
        kc, kc_reason = k, "transposed C tile stored once: both K-deep micro-panels fit the L2 share"
    elif stream_b_from_l2:
        # Deep slices streamed from L2: fewer passes over a large C, for micro-panels that many
        # row tiles reuse (the caller only offers this when they do).
        kc_cap_l2 = int(l2_per_core * L2_STREAM_FILL // ((mr + nr) * elem_bytes))
        slices = math.ceil(k / max(round_down(kc_cap_l2, K_STEP_ALIGN), 1))
        kc = min(k, round_up(math.ceil(k / slices), K_STEP_ALIGN))
        kc_reason = (f"micro-panels streamed from L2 ({L2_STREAM_FILL:.0%} of the L2 share), {slices} slice(s) "
                     f"of K={k}: fewer passes over C")
    elif kc_cap >= k:
        kc, kc_reason = k, "whole reduction K fits the L1 share"
    else:
        # As many slices as the cap needs, then equal slices: K=147 under a cap of 72 gives 3 x 56
        # rather than 72 + 72 + 3 (a 3-deep slice costs a whole pass over C for 3 k steps).
        slices = math.ceil(k / max(round_down(kc_cap, K_STEP_ALIGN), 1))
        kc = round_up(math.ceil(k / slices), K_STEP_ALIGN)
        kc_reason = f"L1 capacity ({kc_fill:.0%} of L1d), {slices} equal slices of K={k}"
    kc = max(kc, 1)
    # L2: the packed MC x KC block of A is reused across the whole NC panel.
    mc_cap = int(l2_per_core * L2_FILL // (kc * elem_bytes))
    m_padded = round_up(m, mr)
    if mc_cap >= m_padded:
        mc, mc_reason = m_padded, "whole M fits the L2 share"
    else:
        mc, mc_reason = round_down(mc_cap, mr), f"L2 capacity ({L2_FILL:.0%} of per-core L2)"
    # Outer: the KC x NC panel of B stays in the shared cache while every MC block uses it.
    shared_bytes, shared_name = _shared_cache_bytes(hw, cluster)
    nc_cap = int(shared_bytes * L3_FILL // (kc * elem_bytes))
    n_padded = round_up(n, nr)
    if nc_cap >= n_padded:
        nc, nc_reason = n_padded, f"whole N fits the {shared_name} share"
    else:
        nc, nc_reason = round_down(nc_cap, nr), f"{shared_name} capacity ({L3_FILL:.0%})"
    if conv and not transposed:
        # B is the im2col panel, packed on every call and read back at once: sized to a share of
        # L2 beside the A block, that round trip stays in L2 instead of passing through the shared
        # cache. Timed in six emitted networks (benchmarks/packed_panel.py): the convolutions it
        # changes 1.01-1.7x faster (geomean 1.13x at 1 thread, 1.12x at 2), never slower.
        nc_l2 = max(round_down(int(l2_per_core * PACKED_B_L2_FILL // (kc * elem_bytes)), nr), nr)
        if nc_l2 < nc:
            nc, nc_reason = nc_l2, f"B packed on every call: its KC x NC panel in {PACKED_B_L2_FILL:.0%} of the L2 share"

    # (c) Cores: split the axis whose tiles divide most evenly; prefer (within 10%) the axis that
    # also splits the operand packed on every call (conv: the im2col matrix, B or, transposed, A),
    # since splitting the other axis makes every thread pack all of it.
    imbalance_n = share_imbalance(n, nr, threads, tile.lanes)
    imbalance_m = share_imbalance(m, mr, threads)
    axis = "n" if imbalance_n <= imbalance_m else "m"
    packed_axis = ("m" if transposed else "n") if conv else None
    split_reason = "fewest idle tiles"
    if packed_axis and axis != packed_axis:
        packed_imbalance = imbalance_m if packed_axis == "m" else imbalance_n
        if packed_imbalance <= PACKED_SPLIT_TOLERANCE * min(imbalance_n, imbalance_m):
            axis, split_reason = packed_axis, "splits the input operand packed on every call (no duplicated packing)"
    imbalance = imbalance_n if axis == "n" else imbalance_m
    if threads == 1:
        axis, imbalance = "n", 1.0
    # A operand (decide.py), then the L1 check: rows of A read in place are lda floats apart; when
    # that stride is a multiple of the L1 set span, many rows fall into one set and evict each other
    # (lda = 1024 floats on an 8-way, 64-set L1 puts all MR rows in one set). Then packing pays for itself.
    a_pack, a_reason = decide.default_a_pack(row, transposed, mr, spec.out_w if conv else None,
                                             pointwise=conv and spec.pointwise)
    if a_pack == "direct":
        crowded = a_rows_per_l1_set(mr, k, core.l1d, elem_bytes)
        if crowded > core.l1d.ways // 2:
            a_pack, a_reason = "packed", f"{crowded} of {mr} rows in place would share one L1 set"
    order, order_reason = decide.loop_order(row, transposed, k, kc, mr, min(mc, m), nc,
                                            (spec.batch if isinstance(spec, MatmulSpec) else spec.n)
                                            * m * n * elem_bytes / threads,
                                            l2_per_core * L2_FILL, elem_bytes)
    ukernel = decide.gemm_ukernel(row, core if row.asm_ukernels else None, tile.registers(row.name))
    sched = GemmSchedule(mr=mr, nr=nr, k_unroll=k_unroll, kc=kc, mc=mc, nc=nc, threads=threads,
                         parallel_axis=axis, a_load_bits=tile.a_load_bits if row.lane_indexed else 128,
                         a_pack=a_pack, **decide.gemm_code_shape(row, spec, transposed, mr, ukernel=ukernel,
                                                                 order=order),
                         prefetch_next_panel_lines=decide.next_panel_prefetch_lines(
                             row, spec, transposed, m, mr, nr, kc, mc, k_unroll, order, ukernel, elem_bytes,
                             threads, axis))
    reasons = GemmReasons(kc=kc_reason, mc=mc_reason, nc=nc_reason, split=split_reason, a_pack=a_reason,
                          loop_order=order_reason, imbalance=imbalance, shared_bytes=shared_bytes, shared_name=shared_name)
    return sched, reasons


@dataclass(frozen=True)
class Candidate:
    """One complete GEMM program: a grown schedule with its estimate."""

    transposed: bool
    tile: MicroTile
    score: MicroTileScore
    fill: float
    sched: GemmSchedule
    reasons: GemmReasons
    estimate: CostEstimate
    cluster: CpuCluster
    isa: str

    @property
    def levels(self) -> tuple[TileLevel, ...]:
        """The explanation's levels; built on demand (a synthesis ranks hundreds of candidates
        and explains one: building them all took a tenth of a Winograd conv's synthesis)."""
        return gemm_levels(self.tile, self.score, self.sched, self.reasons, self.cluster, self.isa)

    @property
    def predicted_s(self) -> float:
        return self.estimate.predicted_s

    @property
    def compute_s(self) -> float:
        """The core-cycle part of the estimate (what the time would be if every memory level kept up)."""
        return dict(self.estimate.seconds_by_bound).get("compute", self.predicted_s)

    def rank_key(self, fastest: float) -> tuple:
        """Times within RANK_BUCKET of each other tie; then the lower compute time wins (when a
        memory bound ties candidates, the one that wastes fewer FMAs on padding is faster as soon
        as the bound is looser than modelled, and never slower), then plain orientation, more
        accumulators, smaller MR, NR and L1 fill."""
        return (round((self.predicted_s / fastest - 1) / RANK_BUCKET),
                round((self.compute_s / fastest - 1) / RANK_BUCKET), self.transposed, -self.tile.accumulator_registers, self.tile.mr, self.tile.nr, self.fill)

    def summary(self) -> str:
        return f"{'transposed ' if self.transposed else ''}{self.sched.mr}x{self.sched.nr} kc={self.sched.kc}"


def _column_tail_score(tile: MicroTile, n: int, cluster: CpuCluster, isa: str,
                       evaluator: MicroTileEvaluator) -> Optional[MicroTileScore]:
    """The score of the micro-kernel that computes the last N % NR columns (None: no tail, or
    the ISA row does not model it)."""
    tail_vectors = math.ceil((n % tile.nr) / tile.lanes)
    if tail_vectors == 0 or not isa_row(isa).interference_model:
        return None
    return evaluator.evaluate(MicroTile(mr=tile.mr, nr_vectors=tail_vectors, lanes=tile.lanes,
                                        a_load_bits=tile.a_load_bits, elem_bytes=tile.elem_bytes), cluster.core, isa)


def _gemm_candidates(spec, hw, cluster, threads, isa, evaluator, constants) -> list[Candidate]:
    """Expand the best few micro-tiles (and two L1 fill targets) in each orientation the operator
    allows. Conv2d may put vectors along output pixels (implicit_gemm) or along output channels
    (implicit_gemm_t, no waste when the pixel count is ragged)."""
    row = isa_row(isa)
    orientations = (False, True) if isinstance(spec, Conv2dSpec) else (False,)
    candidates = []
    for transposed in orientations:
        m, n, k = gemm_view(spec, transposed)
        for tile, score, _ in rank_micro_tiles(cluster.core, isa, evaluator, m, n)[:TOP_MICRO_TILES]:
            tail_score = _column_tail_score(tile, n, cluster, isa, evaluator)   # the tile's, whatever the blocking
            options = [(L1_FILL, False, True), (L1_FILL_WIDE, False, True)]
            # Transposed: the K-deep slice (C stored once) streams B from L2, which a narrow tile
            # may not sustain; L1-sized slices pay the transposed store per slice instead (only
            # where the cost model charges that stream: the ISA row's interference_model).
            if transposed and row.interference_model:
                options += [(L1_FILL, False, False), (L1_FILL_WIDE, False, False)]
            # Deep L2-streamed slices only for matmul, whose B is pre-packed once: a conv packs its
            # im2col panel (KC x NC) on every call, and a deep one falls out of cache (measured:
            # conv_r18_l1 kc=576 about 4% slower than kc=88 on the AVX-512 host).
            if isinstance(spec, MatmulSpec) and math.ceil(m / tile.mr) >= B_REUSE_FOR_L2_STREAM:
                options.append((1.0, True, True))
            for fill, stream, store_once in options:
                sched, reasons = grow_gemm(tile, spec, hw, cluster, threads, row, fill, transposed,
                                           stream_b_from_l2=stream, store_once=store_once)
                variants = [(sched, reasons)]
                # A pointwise conv's A read in place costs a line per k step of every row tile
                # (cost_model.strided_a_bytes_per_k), on every one of the N / NR column panels;
                # packed, it costs one transpose of the image. The model prices both where it
                # charges the L2 stream (the ISA row's interference_model), and on the other
                # broadcast rows (AVX-512) where the image is larger than the core's L2
                # (cost_model.strided_a_wait_s). Packed goes first, so it wins a tie: every layer
                # of benchmarks/results/pointwise_a.json that the model prices within about 2% both
                # ways ran 1.09-1.64x faster packed.
                if (sched.a_pack == "im2col_direct" and isinstance(spec, Conv2dSpec) and spec.pointwise
                        and not row.lane_indexed):
                    variants.insert(0, (replace(sched, a_pack="packed"),
                                        replace(reasons, a_pack="the image transposed into MR-pixel panels once per "
                                                                "call, not a line per k step of every row tile")))
                for sched, reasons in variants:
                    estimate = gemm_estimate(spec, hw, cluster, tile, score, sched, transposed, constants,
                                             tail_score=tail_score, interference=row.interference_model,
                                             strided_a_waits=not row.lane_indexed)
                    candidates.append(Candidate(transposed, tile, score, fill, sched, reasons, estimate, cluster, isa))
    return candidates


# ---------------------------------------------------------------------------------------------
# Depthwise.
# ---------------------------------------------------------------------------------------------

def grow_depthwise(spec: DepthwiseSpec, cluster: CpuCluster, threads: int, row: IsaRow, lanes: int
                   ) -> tuple[DepthwiseSchedule, int]:
    """The register tile with the best FMA/load ratio and the fewest wasted lanes; returns the
    schedule and the registers the window weights take."""
    core = cluster.core
    window = spec.r * spec.s
    # Registers: the R x S weights stay in registers when they fit, plus the input vectors.
    weight_regs = window if window <= core.vector_registers // 2 else 0
    free = core.vector_registers - weight_regs - DEPTHWISE_INPUT_REGISTERS
    ow_vectors_needed = math.ceil(spec.out_w / lanes)
    best = None
    for oh_rows in range(1, DEPTHWISE_MAX_ROWS + 1):
        for ow_vectors in range(1, min(ow_vectors_needed, DEPTHWISE_MAX_VECTORS) + 1):
            if oh_rows * ow_vectors > free:
                continue
            fmas, loads = depthwise_fmas_and_loads(spec, oh_rows, ow_vectors)
            waste = math.ceil(spec.out_w / (ow_vectors * lanes)) * ow_vectors * lanes / spec.out_w
            key = (-(fmas / loads) / waste, -oh_rows * ow_vectors, oh_rows)
            if best is None or key < best[0]:
                best = (key, oh_rows, ow_vectors)
    _, oh_rows, ow_vectors = best
    threads_used = max(1, min(threads, spec.n * spec.c))
    sched = DepthwiseSchedule(ow_vectors=ow_vectors, oh_rows=oh_rows, threads=threads_used,
                              **decide.depthwise_code_shape(
                                  row, spec, lanes, ow_vectors,
                                  ukernel=decide.depthwise_ukernel(row, core if row.asm_ukernels else None, spec,
                                                                   lanes, oh_rows, ow_vectors)))
    return sched, weight_regs


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
        raise OperatorError(f"--threads {threads} exceeds the {counted(cluster.count, 'core')} of {hw.name}'s "
                            f"{cluster.role} cluster")
    return cluster, threads


def synthesize_cpu(spec: OperatorSpec, hw: HardwareDescription, cluster: Optional[str] = None,
                   threads: Optional[int] = None, evaluator: Optional[MicroTileEvaluator] = None,
                   isa: Optional[str] = None, constants: CostConstants = DEFAULT_CONSTANTS,
                   lowering: str = "auto", winograd_m: Optional[int] = None,
                   winograd_vectors: Optional[str] = None, weights_from_memory: bool = False) -> CpuSynthesis:
    """Construct a CPU kernel for spec on hw's cluster, bottom-up. Pure and deterministic.
    constants: the cost model's assumptions (default: the static ones; a calibrated set from the
    tile database changes predictions and, where it changes which bound dominates, choices).
    lowering: 'auto' (3x3 stride-1 conv2d: the faster of the best implicit-GEMM and the best
    Winograd plan, xfc/cpu/winograd.py), 'direct' (no Winograd) or 'winograd' (forced; one-line
    OperatorError where it does not apply). winograd_m: consider only this Winograd tile size
    (it must be admissible for the input channels: xfc.ops.winograd.admissible_tile_sizes).
    winograd_vectors: consider only this vector axis of the Winograd plans (winograd.VECTOR_AXES).
    weights_from_memory: every call reads its weights from memory (a layer of a network whose weights
    exceed the shared cache), not from what the call before left in the caches (the default: a
    kernel called again and again); it changes the Winograd plans' price of their transformed
    filter (winograd.weights_memory; the direct plans already charge their weights from DRAM)."""
    if lowering not in winograd.LOWERINGS:
        raise OperatorError(f"--lowering must be one of {', '.join(winograd.LOWERINGS)}, got {lowering!r}")
    if lowering == winograd.LOWERING:
        winograd.check_applicable(spec)
    chosen, threads = _check_request(spec, hw, cluster, threads)
    core = chosen.core
    isa = isa or isa_for(core)
    row = isa_row(isa)
    if row.name.startswith("neon") and hw.target_arch != "aarch64":
        raise OperatorError(f"isa neon needs an AArch64 description, {hw.name} is {hw.target_arch}")
    evaluator = evaluator or StaticEvaluator()
    lanes = row.synthesis_lanes(core)
    header_common = plan_header(hw, chosen, spec)
    if isinstance(spec, DepthwiseSpec):
        sched, weight_regs = grow_depthwise(spec, chosen, threads, row, lanes)
        estimate = depthwise_estimate(spec, hw, chosen, sched, lanes, constants, row.elem_bytes)
        fmas, loads = depthwise_fmas_and_loads(spec, sched.oh_rows, sched.ow_vectors)
        levels = depthwise_levels(spec, sched, chosen, lanes, weight_regs, fmas, loads, row.elem_bytes)
        tiles_line = f"tiles: oh_rows={sched.oh_rows} ow_vectors={sched.ow_vectors} lanes={lanes} threads={sched.threads}"
        plan = CpuKernelPlan(
            spec=spec, isa=isa, vector_lanes=lanes, lowering="direct_depthwise", gemm=None, depthwise=sched,
            function_name="xfc_depthwise", header_lines=tuple(header_common + [tiles_line, f"isa: {isa}"]),
            hardware_name=hw.name, gcc_march=gcc_march(core, isa), qemu_cpu=core.qemu_cpu)
        return CpuSynthesis(spec=spec, hardware=hw.name, cluster=chosen, plan=plan, levels=levels,
                            estimate=estimate, gemm_shape=None)

    candidates = ranked_gemm_candidates(spec, hw, chosen, threads, isa, evaluator, constants)
    best = candidates[0]
    seen, alternatives = {(best.transposed, best.sched)}, []
    for c in candidates[1:]:
        if (c.transposed, c.sched) not in seen:
            seen.add((c.transposed, c.sched))
            alternatives.append((c.summary(), c.predicted_s))
    direct = _gemm_synthesis(spec, hw, chosen, isa, best, tuple(alternatives))
    if lowering == "direct" or not isinstance(spec, Conv2dSpec) or winograd.wmath.not_applicable(spec):
        return direct
    winograds = winograd.synthesize_winograd(spec, hw, chosen, threads, isa, evaluator, constants, header_common,
                                             ranked_gemm_candidates, winograd_m, winograd_vectors,
                                             weights_from_memory)
    if lowering == winograd.LOWERING and not winograds:
        raise OperatorError(f"--lowering winograd: no tile size keeps the error bound within "
                            f"{winograd.wmath.RELATIVE_TOLERANCE:g} at C={spec.c}")
    return winograd.choose(spec, direct, winograds, lowering)


def ranked_gemm_candidates(spec, hw, cluster, threads, isa, evaluator, constants) -> list[Candidate]:
    """Every GEMM candidate, best first (the synthesizer's order)."""
    candidates = _gemm_candidates(spec, hw, cluster, threads, isa, evaluator, constants)
    fastest = min(c.predicted_s for c in candidates)
    candidates.sort(key=lambda c: c.rank_key(fastest))
    return candidates


def _gemm_synthesis(spec, hw, chosen, isa, best: Candidate, alternatives: tuple) -> CpuSynthesis:
    core = chosen.core
    row = isa_row(isa)
    sched, transposed = best.sched, best.transposed
    view = gemm_view(spec, transposed)
    header_common = plan_header(hw, chosen, spec)
    tiles_line = (f"tiles: mr={sched.mr} nr={sched.nr} k_unroll={sched.k_unroll} kc={sched.kc} mc={sched.mc} "
                  f"nc={sched.nc} threads={sched.threads} split={sched.parallel_axis} A={sched.a_pack}"
                  + (f" a_load_bits={sched.a_load_bits}" if row.lane_indexed else ""))
    lowering = "gemm" if isinstance(spec, MatmulSpec) else ("implicit_gemm_t" if transposed else "implicit_gemm")
    gemm_line = f"lowered: {lowering} M={view.m} N={view.n} K={view.k}"
    plan = CpuKernelPlan(
        spec=spec, isa=isa, vector_lanes=row.synthesis_lanes(core), lowering=lowering, gemm=sched, depthwise=None,
        function_name=f"xfc_{spec.name}", header_lines=tuple(header_common + [gemm_line, tiles_line, f"isa: {isa}"]),
        hardware_name=hw.name, gcc_march=gcc_march(core, isa), qemu_cpu=core.qemu_cpu)
    return CpuSynthesis(spec=spec, hardware=hw.name, cluster=chosen, plan=plan, levels=best.levels,
                        estimate=best.estimate, gemm_shape=tuple(view), alternatives=alternatives,
                        micro_tile_source=best.score.source)


def candidate_syntheses(spec: OperatorSpec, hw: HardwareDescription, cluster: Optional[str] = None,
                        threads: Optional[int] = None, evaluator: Optional[MicroTileEvaluator] = None,
                        isa: Optional[str] = None, constants: CostConstants = DEFAULT_CONSTANTS,
                        top: int = 10) -> list[CpuSynthesis]:
    """The cost model's `top` best distinct GEMM programs for spec, best first (the first is what
    synthesize_cpu(lowering='direct') returns; Winograd plans are not among them). For measuring
    how much the ranking leaves on the table (regret)."""
    chosen, threads = _check_request(spec, hw, cluster, threads)
    if isinstance(spec, DepthwiseSpec):
        raise OperatorError("candidate_syntheses: depthwise plans have no ranked GEMM candidates")
    isa = isa or isa_for(chosen.core)
    out, seen = [], set()
    for c in ranked_gemm_candidates(spec, hw, chosen, threads, isa, evaluator or StaticEvaluator(), constants):
        if (c.transposed, c.sched) in seen:
            continue
        seen.add((c.transposed, c.sched))
        out.append(_gemm_synthesis(spec, hw, chosen, isa, c, ()))
        if len(out) == top:
            break
    return out
