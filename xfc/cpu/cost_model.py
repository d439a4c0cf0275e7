"""The static CPU cost model: the only place CPU times are predicted (docs/cost-model.md).

Two levels, both predictions from the hardware description, never measurements:

  StaticEvaluator   one k step of a micro-kernel: FMA pipes and latency, vector loads per cycle,
                    the in-order load rules (a tiles.MicroTileEvaluator; a measured tile database
                    implements the same interface and replaces it)
  gemm_estimate     a whole GEMM-lowered plan: a roofline over compute (with packing and C
                    passes), L2->L1 and shared-cache->L2 traffic, and DRAM
  depthwise_estimate  a direct depthwise plan: compute (FMA issue with load and staging overhead,
                    the busiest thread's share of the planes, the parallel region's fork/join)
                    against the memory level its tensors live in between calls (L2, L3/SLC or
                    DRAM, by the description's cache sizes)

The estimates read the plan's fields (tiles and code shape, e.g. the transposed store keys off
GemmSchedule.c_store), the same fields code generation renders from. The constants below are
the model's assumptions; each scales predictions only.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields, replace
from typing import Optional

from ..hardware.model import CpuCluster, CpuCore, HardwareDescription
from ..ops.spec import Conv2dSpec, DepthwiseSpec, MatmulSpec, OperatorSpec, gemm_view
from .config import element_fma_rate
from .ir import DepthwiseSchedule, GemmSchedule
from .isa import isa_row
from .tiles import FLOAT_BYTES, MicroTile, MicroTileScore, round_up

# The form of the model the constants below belong to. A calibration stores it beside the fitted
# constants and is used only by the same form (2: depthwise by memory level, staging rows, fork/join;
# 3: a chip-wide cap on the shared cache's bandwidth; 4: the Winograd transform constants, and the
# Winograd GEMM stage reading its transformed filter once from where it lives, xfc/cpu/winograd.py;
# 5: a per-core cap on how fast GEMMs stream operands from DRAM; 6: the Winograd cost per thread
# split (tiles crossing cores, tile blocks) and the share of the shorter of a Winograd plan's
# transforms and tile traffic not hidden behind the longer; 7: Winograd plans with vectors over
# channels, a filter transform larger than the shared cache charged in full from DRAM, its
# stream at the static DRAM efficiency; 8: that stream at one chip-wide fitted rate, whatever the
# threads, and added to the FMAs it does not overlap at every thread count; 9: only the part of a
# filter transform past the cache share streamed, also past the whole cache, and the share of that
# stream the FMAs do not hide fitted with its rate; 10: split over tiles, each thread streams that
# part of the filter transform itself, and holds all of it when it is to stay in L2; 11: split over
# output channels, the threads stream the part past the cache share faster by the host's measured
# l3_overflow_read_speedup, where the description has one; 12: a pointwise conv's A read in place a
# plane apart charged no wait with one column panel; 13: the Winograd filter stream at a measured
# sustained DRAM read as measured, not derated again; 14: Winograd plans priced with their own L2 and
# shared-cache rates, fitted on Winograd plans only; 15: a GEMM's A read from the shared cache once,
# not once per NC panel, when one thread's whole A stays in its L2 share).
COST_MODEL_VERSION = 15

# ---- bandwidths and cache shares ----------------------------------------------------------------
L2_BYTES_PER_CYCLE = 32.0            # per core, L2 -> L1 refill bandwidth
SHARED_CACHE_BYTES_PER_CYCLE = 16.0  # per core, L3/SLC -> L2
# All cores together draw at most this from the shared cache (bytes per cycle of the cluster clock;
# 0: no chip-wide cap, each core's port adds SHARED_CACHE_BYTES_PER_CYCLE). The descriptions give no
# such figure, so it stays uncapped until calibration measures one: on the 2-core host VM a
# stride-2 depthwise call living in L3 ran 1.5x faster on 2 threads than on 1, not 2x.
SHARED_CACHE_CHIP_BYTES_PER_CYCLE = 0.0
DRAM_FALLBACK_GBPS = 10.0            # when the description gives no memory bandwidth
DRAM_EFFICIENCY = 0.8                # share of the peak DRAM bandwidth a streaming kernel sustains
# How fast a Winograd GEMM stage streams a transformed filter U that lives in DRAM, all its threads
# together (bytes per cycle of the cluster clock; 0: the chip's figure at the static efficiency).
# Not the probe's read loop: on the AVX-512 host, 1 and 2 threads streamed the 38 MB U of F(4,3) on
# 512 channels at 7x7 in the same 0.82 ms (46 GB/s with 0.3 ms of FMAs beside it; the probe reads
# 42.8 GB/s), so the rate is the chip's, not a core's. (Part of a U just past the L3 is still there
# on the next call: since form 9 weights_memory charges only the part past the cache share.)
# Unknown without a measurement; calibration fits it.
WINOGRAD_STREAM_BYTES_PER_CYCLE = 0.0
# A transformed filter U read cold on every call (synthesize_cpu(weights_from_memory=True): a layer of
# a network whose weights exceed the shared cache). Its stream runs at this share of the description's
# DRAM figure (on the host, the probe's sustained single-thread read), and this share of the shorter
# of (GEMM compute, stream) adds to the longer. Chosen on the cold timings of benchmarks/regret.py's
# fitting layers only (regret_winograd_cold*.json, Zen 4 VM, both thread counts): 1.0 and 0 gave the
# lowest fitting regret (1.5% / 5.2% at 1 thread, 2.3% / 5.6% at 2); the static DRAM efficiency
# (0.8) put r18_l4 on F(2,3), 17% slower, and any exposure above 0 put vgg_5 and r18_l2 at 2
# threads on F(4,3), 14-16% slower. Two threads streamed U no faster than one on these layers.
COLD_STREAM_EFFICIENCY = 1.0
COLD_STREAM_EXPOSED = 0.0
# ... and on more than one thread. On the Zen 5 VM of session 57 (two 512-bit FMAs per cycle: the stream
# is what a cold Winograd GEMM stage waits for) the 2-thread plans of regret.py's fitting layers, each
# planned again offline at every rate and looked up among the timed plans
# (benchmarks/winograd_refit.py -> winograd_refit_zen5_cold.json), tied best at 0.4-0.7 of the
# probe's read figure with no exposure (1.0: mean 14% / max 48% regret on the fitting set, 0.7: 1.1% /
# 10.5%, no plan moved off the timed ones; 1.0 with an exposure of 0.25-0.5 ranked lower on 2 threads
# but moved a 1-thread plan off the timed ones, and any exposure put 2-thread plans 14-16% slower on
# the Zen 4 VM); the 1-thread plans are the same from 0.7 to 1.0 there (winograd_refit_zen5_cold_1t.json)
# and on the Zen 4 VM 0.8 put r18_l4 on F(2,3) at 1 thread, 17% slower: the one-thread rate stays.
# Timed afresh at 0.7 on 2 threads: regret_winograd_zen5_cold_memory_2t_eff07.json.
COLD_STREAM_PARALLEL_EFFICIENCY = 0.7
# Fraction of a cache level a tile may fill: the rest holds the other operands, C lines and
# whatever the hardware prefetcher brings in. Chosen from the host measurements in
# docs/host-kernel-notes.md and the usual BLIS practice of leaving about half of L1 free.
L1_FILL = 0.5
L2_FILL = 0.5
L3_FILL = 0.5
# ---- micro-kernel issue ---------------------------------------------------------------------------
NARROW_LOAD_SHARE = 0.5              # a 64-bit load takes half a vector-load slot (out-of-order cores)
# A KC x NR micro-panel of B larger than this share of L1d is not resident: it streams from L2 on
# every row tile (the deep transposed slices, the L2-streamed matmul slices).
L1_RESIDENT_FILL = 0.75
# The micro-kernel's FMA time and the time to stream its operands from L2 do not overlap
# perfectly: a k step costs their p-norm with this exponent (1 would add them, infinity is the
# roofline's max). Negligible while the stream needs under half the L2 bandwidth the FMAs leave;
# measured on the AVX2 host (issue 17, bench_cpu.py --isa avx2): a 2x32 transposed conv tile whose
# K-deep B micro-panel streams at the full L2 rate ran at ~60% of a 4x24 tile's rate.
L2_STREAM_OVERLAP_NORM = 4.0
# Out-of-order cores: the FMA pipes, the load ports and the FMA latency each bound a k step, but
# they are not independent. With exactly FMA latency x FMA pipes accumulators every FMA must issue
# the cycle its accumulator is ready, so any load or front-end delay costs directly; loads that
# nearly fill their ports delay the FMAs that wait on them. A k step costs the p-norm of the three
# bounds with this exponent: a bound under half the largest costs under 1.5%, two equal bounds
# ~19%. Measured on the AVX2 host (conv tiles, 16 ymm registers): 4x24 ~ 6x16 > 4x16 (8
# accumulators, -10%) > 8x8 and 14x8 (more loads than FMAs, -25..30%).
ISSUE_OVERLAP_NORM = 4.0
# ---- stores and packing (cycles or elements per cycle per core) -----------------------------------
SCALAR_TRANSPOSED_STORE_CYCLES = 1.0   # per element of a transposed C tile merged with scalar code
VECTOR_TRANSPOSED_STORE_CYCLES = 0.3   # per element through the 16x16 register transpose (c_store)
TRANSPOSE_PACK_RATE = 1                # A into MR-row panels (a matrix transpose)
IM2COL_PACK_RATE_PER_LANE = 0.25       # im2col runs (short contiguous copies): lanes / 4
ROW_COPY_RATE_PER_LANE = 0.5           # whole rows (pointwise input, staging the padded image): lanes / 2
# ---- depthwise ---------------------------------------------------------------------------------------
DEPTHWISE_LOAD_COST = 2              # FMA slots one input-vector load costs in the depthwise inner loop
# Staging a padded input row (elements per cycle per core). A contiguous run copies at
# ROW_COPY_RATE_PER_LANE; a stride-2 row is split into column phases, through a vector deinterleave
# where the dialect has one (the masked dialects: xfc_vload_stride2 in templates/cpu/common.h.j2),
# else one scalar element at a time.
STRIDED_STAGE_RATE_PER_LANE = 0.5    # vector deinterleave: one store per output vector, as a run copy
SCALAR_STAGE_RATE = 1.0              # scalar strided copy: one load and one store per element
STAGE_ROW_CYCLES = 4.0               # fixed cost of staging one row (loop, bounds test, ragged end)
# One OpenMP parallel region per call: waking the team and the closing barrier. A fixed cost that
# does not shrink with threads, so small multi-threaded calls scale less than their work does.
PARALLEL_REGION_S = 2e-6
# ---- Winograd transforms (xfc/cpu/winograd.py stage_costs; static guesses until calibrated) -------------
WINOGRAD_STORE_CYCLES = 1.0          # per vector store of a transform's output (one store port)
WINOGRAD_SCALAR_CYCLES = 1.0         # per element staged into the phase-split plane or scattered to the output
WINOGRAD_GROUP_CYCLES = 0.0          # fixed cycles per LANES-tile group of a transform (loop, addressing, ragged tiles)


@dataclass(frozen=True)
class CostConstants:
    """The model's per-hardware assumptions in one value: the defaults are the constants above;
    `xfc tiledb calibrate` fits some of them to measurements of one machine (xfc.tiledb.calibrate)
    and synthesis takes the fitted set as a parameter. Every field scales predictions only."""
    compute_efficiency: float = 1.0            # share of the micro-kernel's static FMA rate whole GEMMs sustain
    l2_bytes_per_cycle: float = L2_BYTES_PER_CYCLE
    shared_cache_bytes_per_cycle: float = SHARED_CACHE_BYTES_PER_CYCLE
    shared_cache_chip_bytes_per_cycle: float = SHARED_CACHE_CHIP_BYTES_PER_CYCLE   # 0: uncapped
    dram_efficiency: float = DRAM_EFFICIENCY
    pack_rate_scale: float = 1.0               # multiplies every packing/staging rate
    depthwise_load_cost: float = DEPTHWISE_LOAD_COST
    depthwise_efficiency: float = 1.0          # share of the depthwise FMA issue model the kernel sustains
    depthwise_stage_scale: float = 1.0         # multiplies the depthwise staging rates
    stage_row_cycles: float = STAGE_ROW_CYCLES     # fixed cycles per staged depthwise row
    parallel_region_s: float = PARALLEL_REGION_S   # fork/join of one parallel region (depthwise, threads > 1)
    winograd_transform_efficiency: float = 1.0     # share of the FMA issue rate the transform arithmetic sustains
    winograd_store_cycles: float = WINOGRAD_STORE_CYCLES
    winograd_scalar_cycles: float = WINOGRAD_SCALAR_CYCLES
    winograd_group_cycles: float = WINOGRAD_GROUP_CYCLES
    # share of the shorter of (transforms, their tile traffic) that the longer does not hide: 0, the
    # two overlap fully (the static guess), 1, they add up
    winograd_traffic_exposed: float = 0.0
    # share of the shorter of (the GEMMs' compute, streaming U from DRAM) that the longer does not
    # hide: 1, the FMAs wait for the stream; 0, they hide it. The static guess is between the two
    # VMs measured (chosen on benchmarks/regret.py's fitting layers, where every value up to 0.5
    # ranked alike and 1 did not; 0.5 is the nearest the session-28 VM). On the AVX-512 VM of
    # session 28 (an AMD EPYC at 4.25 GHz, two 512-bit FMAs per cycle), F(4,3)
    # GEMMs on 512 channels at 14x14 (U 38 MB) ran 1.76 ms on 1 thread and 1.13 ms on 2, with about
    # 1.18 and 0.59 ms of FMAs and the 0.52 ms stream of the same U at 7x7 (whose FMAs are 0.3 ms):
    # the sum, at both thread counts. On the Zen 4 VM of issue 34 (one 512-bit FMA per cycle) the
    # same GEMMs ran 2.92-3.04 ms at 14x14 with about 2.6 ms of FMAs beside a 0.87-0.96 ms stream
    # at 7x7 (benchmarks/results/winograd_stages_issue34*.json): mostly hidden. `xfc tiledb
    # calibrate` fits it with the stream's rate.
    winograd_stream_exposed: float = 0.5
    winograd_stream_bytes_per_cycle: float = WINOGRAD_STREAM_BYTES_PER_CYCLE   # 0: the chip's static rate
    # U read cold on every call (weights_from_memory): its rate as a share of the DRAM figure, and
    # the exposed share of the shorter of (compute, stream); see COLD_STREAM_EFFICIENCY
    winograd_cold_stream_efficiency: float = COLD_STREAM_EFFICIENCY
    winograd_cold_stream_exposed: float = COLD_STREAM_EXPOSED
    winograd_cold_stream_parallel_efficiency: float = COLD_STREAM_PARALLEL_EFFICIENCY   # the rate's share, threads > 1
    # The L2 and shared-cache rates of a Winograd plan's GEMMs and tile traffic (for_winograd). The
    # static values are the direct plans'; calibration fits them on Winograd plans alone (--winograd).
    # On the Zen 4 VM of session 65 every calibration fitted the direct plans' shared-cache rate at 8
    # bytes a cycle (half the static 16). Under model 13, which priced Winograd plans at that rate too,
    # the GEMMs of F(4,3) on 512 channels at 7x7 (r18_l4, its 21.7 MB U read from the L3) became
    # L3-bound and the layer went to F(2,3), 30% slower measured
    # (benchmarks/results/winograd_refit_l3_rate_zen4_s65_model13.json; ..._model14.json: no plan moves).
    winograd_l2_bytes_per_cycle: float = L2_BYTES_PER_CYCLE
    winograd_shared_cache_bytes_per_cycle: float = SHARED_CACHE_BYTES_PER_CYCLE

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def for_winograd(self) -> "CostConstants":
        """The constants a Winograd plan is priced with: its own L2 and shared-cache rates in place of
        the direct plans' (the same unless calibration fitted them apart). Idempotent."""
        if (self.l2_bytes_per_cycle == self.winograd_l2_bytes_per_cycle
                and self.shared_cache_bytes_per_cycle == self.winograd_shared_cache_bytes_per_cycle):
            return self
        return replace(self, l2_bytes_per_cycle=self.winograd_l2_bytes_per_cycle,
                       shared_cache_bytes_per_cycle=self.winograd_shared_cache_bytes_per_cycle)

    def shared_cache_bytes_per_s(self, clock_hz: float, threads: int, measured_gbps: Optional[float] = None) -> float:
        """What `threads` cores draw from the shared cache together: a port per core, up to the
        chip-wide cap when one is known. measured_gbps: one core's read rate where the description
        has it (hw.shared_cache_read_gbps, the host probe's); it lowers the port's rate, never
        raises it. A mesh L3 feeds a core far less than the port: on the Intel Xeon VM of session
        61 (2 MiB L2, 480 MiB L3) one core read 26-30 GB/s from the L3, 7 bytes per cycle at its
        4.05 GHz, and two cores twice that. The Zen VMs the constant was judged on read faster."""
        core_per_cycle = self.shared_cache_bytes_per_cycle
        if measured_gbps:
            core_per_cycle = min(core_per_cycle, measured_gbps * 1e9 / clock_hz)
        per_cycle = core_per_cycle * threads
        if self.shared_cache_chip_bytes_per_cycle > 0:
            per_cycle = min(per_cycle, self.shared_cache_chip_bytes_per_cycle)
        return per_cycle * clock_hz


DEFAULT_CONSTANTS = CostConstants()


@dataclass(frozen=True)
class CostEstimate:
    flops: int
    seconds_by_bound: tuple[tuple[str, float], ...]   # ('compute', s), ('L2', s), ...
    predicted_s: float
    bound: str

    @property
    def predicted_gflops(self) -> float:
        return self.flops / self.predicted_s / 1e9 if self.predicted_s > 0 else 0.0


class StaticEvaluator:
    """Static issue model of one k step of the micro-kernel (XFC's static analysis)."""

    def evaluate(self, tile: MicroTile, core: CpuCore, isa: str) -> MicroTileScore:
        return _static_score(tile, core, isa)


@functools.lru_cache(maxsize=4096)
def _static_score(tile: MicroTile, core: CpuCore, isa: str) -> MicroTileScore:
    # a pure function of its (frozen) arguments, asked for the same tiles by every ranking of a
    # synthesis (a Winograd conv ranks up to seven GEMM problems)
    fmas = tile.accumulator_registers
    wide_loads, narrow_loads = tile.loads_per_k(isa)
    fma_cycles = fmas / element_fma_rate(core, tile.elem_bytes)
    rules = core.load_rules
    if core.pipeline == "in_order" and not rules.ld128_dual_issues_with_fma:
        # 128-bit loads stall the FMA pipe; 64-bit loads pair with FMAs while slots last.
        stall = wide_loads * max(rules.ld128_blocking_cycles, 1)
        narrow_extra = max(0.0, narrow_loads - fma_cycles) if rules.ld64_dual_issues_with_fma else narrow_loads
        cycles = fma_cycles + stall + narrow_extra
        bound = "in-order load stalls" if stall + narrow_extra > 0 else "fma"
    else:
        load_cycles = (wide_loads + narrow_loads * NARROW_LOAD_SHARE) / rules.vector_loads_per_cycle
        if isa_row(isa).interference_model:
            bounds = (("fma", fma_cycles), ("load", load_cycles), ("latency", float(core.fma_latency_cycles)))
            bound = max(bounds, key=lambda b: b[1])[0]
            p = ISSUE_OVERLAP_NORM
            cycles = sum(c ** p for _, c in bounds) ** (1 / p)
            return MicroTileScore(cycles_per_k=cycles, efficiency=fma_cycles / cycles, bound=bound,
                                  source="static")
        cycles = max(fma_cycles, load_cycles)
        bound = "fma" if fma_cycles >= load_cycles else "load"
    # Each accumulator is updated once per k step: a step cannot finish faster than one
    # FMA latency, so too few accumulators leave the pipes idle.
    if core.fma_latency_cycles > cycles:
        cycles, bound = float(core.fma_latency_cycles), "latency"
    return MicroTileScore(cycles_per_k=cycles, efficiency=fma_cycles / cycles, bound=bound, source="static")


def split_imbalance(tiles: int, threads: int) -> float:
    """Work of the busiest thread relative to an even split, when `tiles` tiles go to `threads`."""
    return math.ceil(tiles / threads) * threads / tiles


def share_imbalance(extent: int, step: int, threads: int, unit: int = 1) -> float:
    """Work of the busiest thread relative to an even split when [0, extent) is cut into `step`-wide
    panels dealt out in contiguous runs, as the GEMM kernels split their axis (thread t takes panels
    [P t / T, P (t+1) / T)); each thread's share counts in `unit`s (columns padded to whole vectors).
    Unlike split_imbalance it sees that the last panel is short: 49 columns in panels of 16 on two
    threads are 32 and 17 columns, not two panels each."""
    if threads <= 1:
        return 1.0
    panels = math.ceil(extent / step)
    shares = []
    for t in range(threads):
        begin = min(extent, panels * t // threads * step)
        end = min(extent, panels * (t + 1) // threads * step)
        shares.append(round_up(end - begin, unit) if end > begin else 0)
    total = sum(shares)
    return max(shares) * threads / total if total else 1.0


def l2_per_core_bytes(cluster: CpuCluster) -> float:
    return cluster.l2.size_bytes / max(cluster.l2.shared_by_cores, 1)


def dram_bytes_per_second(hw: HardwareDescription, constants: CostConstants = DEFAULT_CONSTANTS) -> float:
    return (hw.memory.peak_bandwidth_gbps if hw.memory else DRAM_FALLBACK_GBPS) * 1e9 * constants.dram_efficiency


def overflow_stream_speedup(hw: HardwareDescription, cluster: CpuCluster, threads: int) -> float:
    """How many times faster `threads` threads together stream their shares of a buffer a little
    past the L3 than the DRAM figure prices one stream: the description's measured
    l3_overflow_read_speedup (every CPU of the cluster), in proportion to the share of the CPUs the
    threads are, never below 1; 1 where the description has no figure (every phone description;
    the probe measured less than 1.5). In proportion, not one per thread: the figure may already
    be net of a DRAM figure that every CPU read, which fewer threads do not reach; this may price
    a few threads of a many-core chip too slow, never too fast."""
    measured = hw.l3_overflow_read_speedup
    cores = max(cluster.count, 1)
    if not measured or threads <= 1:
        return 1.0
    return max(1.0, measured * min(threads, cores) / cores)


def winograd_stream_bytes_per_second(hw: HardwareDescription, cluster: CpuCluster,
                                     constants: CostConstants = DEFAULT_CONSTANTS, threads: int = 1) -> float:
    """How fast a Winograd GEMM stage streams the part of its transformed filter past the shared
    cache, all threads together: the fitted rate (winograd_stream_bytes_per_cycle) when there is
    one, else the chip's rate at the static dram_efficiency; with `threads` reading disjoint shares
    of it (a split over output channels; 1 for a split over tiles, where every thread reads all of
    it), times what those threads gain on such a stream where the host probe measured it
    (overflow_stream_speedup: on the Zen 4 VM of session 62 r18_l4's F(4,3), U 37.7 MB past a 32 MB
    L3, ran 0.93 ms on one thread and 0.58-0.61 on two, split over output channels, where one
    chip-wide rate predicted 0.99 ms on two; regret_winograd_zen4_2t_s62.json).
    Not the fitted dram_efficiency: calibration fits that on the direct and depthwise plans, whose
    DRAM traffic barely moves them, so it landed anywhere on a flat ridge (0.6 in one host run, 1.0
    in the next) and moved the prediction of a streamed filter by 1.7x."""
    if constants.winograd_stream_bytes_per_cycle > 0:
        # a fitted rate was fitted at the threads the calibration ran; the figure is relative to
        # the DRAM figure, not to it
        return constants.winograd_stream_bytes_per_cycle * cluster.clock_ghz * 1e9
    return sustained_dram_bytes_per_second(hw) * overflow_stream_speedup(hw, cluster, threads)


def sustained_dram_bytes_per_second(hw: HardwareDescription) -> float:
    """The DRAM rate a stream sustains: the description's figure as it is where the machine measured
    it as a sustained read (the host probe: MemoryDescription.measured_sustained_read), else the
    datasheet peak at the static dram_efficiency. Derating a measured read a second time priced the
    21.7 MB of r18_l4's F(4,3) U past half the Zen 4 VM's L3 at 0.94 ms on one thread, where its 36
    GEMMs ran in 0.87-0.96 ms with 0.66 ms of FMAs beside the stream, and after a re-probe that read
    29 GB/s F(2,3) was chosen, 25-34% slower at one thread, 23% at two (session 64,
    benchmarks/results/regret_winograd_zen4_{1,2}t_s64*.json). Not the fitted dram_efficiency, as
    winograd_stream_bytes_per_second says."""
    if hw.memory and hw.memory.measured_sustained_read:
        return hw.memory.peak_bandwidth_gbps * 1e9
    return dram_bytes_per_second(hw, DEFAULT_CONSTANTS)


def cold_stream_bytes_per_second(hw: HardwareDescription, constants: CostConstants = DEFAULT_CONSTANTS,
                                 threads: int = 1) -> float:
    """How fast a Winograd GEMM stage streams a transformed filter that every call reads from DRAM
    (weights_from_memory), all threads together: the description's DRAM figure at
    winograd_cold_stream_efficiency, on more than one thread at winograd_cold_stream_parallel_efficiency
    (COLD_STREAM_PARALLEL_EFFICIENCY)."""
    gbps = hw.memory.peak_bandwidth_gbps if hw.memory else DRAM_FALLBACK_GBPS
    share = (constants.winograd_cold_stream_efficiency if threads <= 1
             else constants.winograd_cold_stream_parallel_efficiency)
    return gbps * 1e9 * share


def _batch(spec: OperatorSpec) -> int:
    return spec.batch if isinstance(spec, MatmulSpec) else spec.n


def strided_a_bytes_per_k(spec: OperatorSpec, sched: GemmSchedule, transposed: bool, elem_bytes: int,
                          line_bytes: int) -> Optional[float]:
    """Bytes of A one k step of a micro-tile brings into L1 when A is read in place a channel plane
    apart: a 1x1 conv lowered transposed (im2col_direct; a strided one from its staged image) reads
    MR consecutive pixels of one plane per k step and the next step's pixels a plane further on,
    so every step fetches
    a whole line (two when the MR pixels straddle a line boundary: on average 1 + (MR - 1) elements
    / line), not the MR elements a packed panel streams. None for every other A."""
    if not (transposed and isinstance(spec, Conv2dSpec) and spec.r == spec.s == 1
            and sched.a_pack == "im2col_direct"):
        return None
    # a strided 1x1 conv reads the staged (zero-padded, column-phased) image: a staged plane apart
    plane_bytes = (spec.out_h * spec.out_w if spec.pointwise else
                   (spec.h + spec.pad_top + spec.pad_bottom) * (spec.w + spec.pad_left + spec.pad_right)) * elem_bytes
    if plane_bytes < line_bytes:   # planes smaller than a line: the steps stream consecutive bytes
        return float(max(plane_bytes, sched.mr * elem_bytes))
    return line_bytes * (1 + (sched.mr - 1) * elem_bytes / line_bytes)


def strided_a_wait_s(spec: Conv2dSpec, hw: HardwareDescription, cluster: CpuCluster, sched: GemmSchedule,
                     a_bytes_per_k: float, threads: int, constants: CostConstants = DEFAULT_CONSTANTS) -> float:
    """The busiest thread's wait for a pointwise conv's A read in place a plane apart
    (strided_a_bytes_per_k) where the ISA row has no interference model to charge it, when the
    image (staged, for a strided 1x1) is larger than the core's L2: every k step of every row tile,
    on each of the N / NR column panels, fetches its lines from the shared cache, a page or more
    after the previous step's, where no hardware prefetcher follows them, so the FMAs wait for them.
    On the Intel Xeon VM of session 61 (2 MiB L2; one core reads 25-30 GB/s from its L3), 256
    channels at 56x56 (3.2 MB), one thread: 64 output channels in place 1.32 ms, packed 0.88; 128
    channels 2.49 against 1.44; with 24 (one column panel) in place ran faster, 0.25 against 0.36
    (pointwise_a_intel_gnr_t1.json); strided by 2 to 512 channels, in place 3.20 ms, packed 1.79. An
    image that fits the L2 keeps most of its lines there: 512 channels at 28x28 (1.6 MB) strided by
    2 to 1024 ran 1.32 ms in place, 1.55 packed.

    With one column panel (the output channels within one register tile's columns) whose KC x NR
    micro-panel of B stays in L1 beside the KC lines of A a row tile reads (b_panel_resident), the
    image is read once, each channel's row front to back as the row tiles advance, and a line a row
    tile leaves is still in L1 for the next: the streams a prefetcher follows, no more lines than
    packing the image reads, so nothing is charged. Measured on the Zen 4 VM of session 63, one
    thread, 16 output channels: in place ran 0.101-0.368 ms where the packed-B plan ran 0.128-0.461
    at 24-96 channels at 112x112, and 0.088 against 0.108 at 96 channels 56x56 (benchmarks/regret.py
    --layer; regret_gemm_pointwise_*_zen4_s63.json). Where the micro-panel and the lines do not fit
    (256 channels to 64 in one 64-wide panel, above) the wait stays."""
    # one image: the kernel stages and multiplies the images of a batch one at a time
    image_bytes = spec.c * (spec.h + spec.pad_top + spec.pad_bottom) * (spec.w + spec.pad_left
                                                                        + spec.pad_right) * FLOAT_BYTES
    if image_bytes <= l2_per_core_bytes(cluster):
        return 0.0
    m, n, k = gemm_view(spec, True)
    rows, panels = math.ceil(m / sched.mr), math.ceil(n / sched.nr)
    if panels == 1 and b_panel_resident(cluster.core, sched, FLOAT_BYTES, sched.kc * a_bytes_per_k):
        return 0.0       # all output channels in one panel (not one panel per thread: not measured)
    # the busiest thread's row tiles or column panels (whole tiles per thread)
    if sched.parallel_axis == "m":
        rows = math.ceil(rows / max(threads, 1))
    else:
        panels = math.ceil(panels / max(threads, 1))
    line_bytes = _batch(spec) * rows * panels * k * a_bytes_per_k
    return line_bytes / constants.shared_cache_bytes_per_s(cluster.clock_ghz * 1e9, 1, hw.shared_cache_read_gbps)


def b_panel_resident(core: CpuCore, sched: GemmSchedule, elem_bytes: int, beside_bytes: float = 0.0) -> bool:
    """Whether a KC x NR micro-panel of B (with beside_bytes of other lines next to it) stays in L1
    across the row tiles that pass it (L1_RESIDENT_FILL of L1d)."""
    return sched.kc * sched.nr * elem_bytes + beside_bytes <= core.l1d.size_bytes * L1_RESIDENT_FILL


def l2_stream_factor(core: CpuCore, tile: MicroTile, score: MicroTileScore, sched: GemmSchedule,
                     constants: CostConstants = DEFAULT_CONSTANTS, a_bytes_per_k: Optional[float] = None) -> float:
    """How much slower the micro-kernel runs than its register-level score while it streams its
    operands from L2: the A micro-panel always (MR floats per k step; a_bytes_per_k where A is read
    in place a line or more per step apart: strided_a_bytes_per_k), the B micro-panel too when
    KC x NR does not stay resident in L1 (then every row tile re-reads it, NR floats per k step;
    strided A lines take their KC lines of L1 beside it). 1.0 when the stream is small against the
    FMA time; grows as it nears the L2 bandwidth."""
    a_bytes = tile.elem_bytes * sched.mr if a_bytes_per_k is None else a_bytes_per_k
    a_lines_bytes = 0 if a_bytes_per_k is None else sched.kc * a_bytes_per_k
    b_resident = b_panel_resident(core, sched, tile.elem_bytes, a_lines_bytes)
    bytes_per_k = a_bytes + (0 if b_resident else tile.elem_bytes * sched.nr)
    stream_cycles = bytes_per_k / constants.l2_bytes_per_cycle
    core_cycles = tile.accumulator_registers / element_fma_rate(core, tile.elem_bytes) / max(score.efficiency, 1e-9)
    p = L2_STREAM_OVERLAP_NORM
    return (core_cycles ** p + stream_cycles ** p) ** (1 / p) / core_cycles


def gemm_estimate(spec: OperatorSpec, hw: HardwareDescription, cluster: CpuCluster, tile: MicroTile,
                  score: MicroTileScore, sched: GemmSchedule, transposed: bool,
                  constants: CostConstants = DEFAULT_CONSTANTS,
                  tail_score: Optional[MicroTileScore] = None, interference: bool = False,
                  strided_a_waits: bool = False) -> CostEstimate:
    """Roofline over compute, L2->L1 and shared->L2 traffic, and DRAM for a GEMM-lowered plan.
    tail_score: the score of the column-tail micro-kernel (MR x the vectors left over when NR does
    not divide N); it has fewer accumulators, and on a 16-register core it can run well below the
    full tile (default: as fast as the full tile). interference: charge the L2 stream of the
    micro-kernel (l2_stream_factor; the ISA row's interference_model). strided_a_waits: without the
    interference terms, charge a pointwise conv's A read in place a plane apart as lines waited for
    (strided_a_wait_s; the x86 rows, whose broadcasts read A in place)."""
    core = cluster.core
    k_ = constants
    m, n, k = gemm_view(spec, transposed)
    batch = _batch(spec)
    conv = isinstance(spec, Conv2dSpec)
    mr, nr, kc, mc, nc, threads = sched.mr, sched.nr, sched.kc, sched.mc, sched.nc, sched.threads
    imbalance = (share_imbalance(n, nr, threads, tile.lanes) if sched.parallel_axis == "n"
                 else share_imbalance(m, mr, threads))
    clock_hz = cluster.clock_ghz * 1e9
    # Tail tiles have their own micro-kernels: no row padding, columns padded to whole vectors.
    n_full, n_tail = (n // nr) * nr, round_up(n % nr, tile.lanes)
    tail_efficiency = (tail_score or score).efficiency
    # FLOPs per FMA instruction scale with the lanes of the element type (fp16: twice fp32's);
    # the FMA instruction rate is the core's for that type (xfc/cpu/fp16.py passes the fp16 rate).
    peak_flops_per_core = (core.fp32_lanes * 2 * element_fma_rate(core, tile.elem_bytes) * (FLOAT_BYTES // tile.elem_bytes)
                           * clock_hz)
    compute_s = (2 * batch * m * k * (n_full / score.efficiency + n_tail / tail_efficiency)
                 / (peak_flops_per_core * k_.compute_efficiency * threads / imbalance))
    strided_a = strided_a_bytes_per_k(spec, sched, transposed, tile.elem_bytes, core.l1d.line_bytes)
    if interference:
        compute_s *= l2_stream_factor(core, tile, score, sched, k_, strided_a)
    elif strided_a is not None and strided_a_waits:
        compute_s += strided_a_wait_s(spec, hw, cluster, sched, strided_a, threads, k_)
    if sched.c_store != "direct":  # the transposed store, once per KC slice
        store_cycles_per_element = (VECTOR_TRANSPOSED_STORE_CYCLES if sched.c_store == "vector_transpose"
                                    else SCALAR_TRANSPOSED_STORE_CYCLES)
        compute_s *= 1 + store_cycles_per_element * tile.lanes / kc
    k_slices = math.ceil(k / kc)
    # Per KC slice: A block streamed from L2 once per NR column of B; B micro-panel from L2
    # once per MC block; C tile read+written once per KC slice.
    l2_bytes = batch * tile.elem_bytes * (m * k * math.ceil(n / nr) + k * n * math.ceil(m / mc)
                                      + 2 * m * n * k_slices)
    l2_s = l2_bytes / (k_.l2_bytes_per_cycle * clock_hz * threads)
    # A is read from the shared cache once per NC panel, unless the whole A of one thread (its rows
    # when the split is over M) stays in the L2 share: then the panels after the first re-read it there
    # (the L2 term counts those reads).
    a_rows_per_thread = math.ceil(m / threads) if sched.parallel_axis == "m" else m
    a_stays_in_l2 = tile.elem_bytes * a_rows_per_thread * k <= l2_per_core_bytes(cluster) * L2_FILL
    a_shared_passes = 1 if a_stays_in_l2 else math.ceil(n / nc)
    shared_bytes_moved = batch * tile.elem_bytes * (k * n + m * k * a_shared_passes + 2 * m * n * k_slices)
    shared_s = shared_bytes_moved / k_.shared_cache_bytes_per_s(clock_hz, threads, hw.shared_cache_read_gbps)
    # DRAM: every tensor once (inputs, weights, output).
    dram_bytes = tile.elem_bytes * (sum(math.prod(s) for s in spec.operand_shapes) + math.prod(spec.output_shape))
    dram_s = dram_bytes / dram_bytes_per_second(hw, k_)
    # Packing is extra work on the cores (rates in elements per cycle per core, see the constants).
    # Weights (matmul B, transposed filters) are assumed pre-packed and not charged.
    im2col_rate = max(tile.lanes * IM2COL_PACK_RATE_PER_LANE, 1) * k_.pack_rate_scale
    rows_rate = max(tile.lanes * ROW_COPY_RATE_PER_LANE, 1) * k_.pack_rate_scale
    a_pack_cycles = b_pack_cycles = stage_cycles = 0.0
    if sched.a_pack == "packed":  # A panels: the im2col rows (transposed conv) or a matrix transpose
        # (a pointwise conv's A, transposed, is the image's [C][H*W] matrix transposed into panels)
        a_pack_cycles = batch * m * k * math.ceil(n / nc) / (im2col_rate if transposed and not (conv and spec.pointwise)
                                                             else TRANSPOSE_PACK_RATE * k_.pack_rate_scale)
    if conv and not transposed:  # the B panel: input rows or im2col runs, every call
        b_pack_cycles = batch * k * n / (rows_rate if spec.pointwise else im2col_rate)
    if conv and not spec.pointwise:  # staging the zero-padded image once per call (pointwise: read in place)
        staged = batch * spec.c * (spec.h + spec.pad_top + spec.pad_bottom) * (spec.w + spec.pad_left + spec.pad_right)
        stage_cycles = staged / rows_rate
    # Each thread packs the A rows and B columns of its own share: the operand along the split
    # axis is divided among the threads, the other one is packed whole by every thread. The
    # staged image is written cooperatively.
    a_share = threads if sched.parallel_axis == "m" else 1
    b_share = threads if sched.parallel_axis == "n" else 1
    pack_s = (a_pack_cycles / a_share + b_pack_cycles / b_share + stage_cycles / threads) / clock_hz
    # Every KC slice after the first reads and writes C again; that traffic waits on the level C
    # lives in and does not overlap the FMAs of the tile it belongs to.
    c_bytes = batch * tile.elem_bytes * m * n
    c_bytes_per_s = (k_.l2_bytes_per_cycle * clock_hz * threads
                     if c_bytes <= l2_per_core_bytes(cluster) * threads * L2_FILL
                     else k_.shared_cache_bytes_per_s(clock_hz, threads, hw.shared_cache_read_gbps))
    c_pass_s = (k_slices - 1) * 2 * c_bytes / c_bytes_per_s
    parts = (("compute", compute_s + pack_s + c_pass_s), ("L2", l2_s), ("L3", shared_s), ("DRAM", dram_s))
    bound, worst = max(parts, key=lambda p: p[1])
    return CostEstimate(flops=batch * 2 * m * n * k, seconds_by_bound=parts, predicted_s=worst, bound=bound)


def depthwise_fmas_and_loads(spec: DepthwiseSpec, oh_rows: int, ow_vectors: int) -> tuple[int, int]:
    """(FMAs, vector loads) of one register tile: each distinct input vector is loaded once and
    feeds every tap that reads it."""
    fmas = oh_rows * ow_vectors * spec.r * spec.s
    loads = spec.window_rows(oh_rows) * spec.s * ow_vectors
    return fmas, loads


def depthwise_bytes(spec: DepthwiseSpec, elem_bytes: int = FLOAT_BYTES) -> int:
    """Bytes a depthwise call moves to and from memory: the input and output once, the filters."""
    return elem_bytes * (spec.n * spec.c * (spec.h * spec.w + spec.out_h * spec.out_w) + spec.c * spec.r * spec.s)


def depthwise_memory(spec: DepthwiseSpec, hw: HardwareDescription, cluster: CpuCluster, threads: int,
                     constants: CostConstants = DEFAULT_CONSTANTS, elem_bytes: int = FLOAT_BYTES) -> tuple[str, float]:
    """(level, seconds) to stream a depthwise call's tensors from where they live between calls.

    Threads take contiguous plane ranges, so each touches 1/threads of the tensors on every call.
    That share stays in the thread's own L2 when it fits the core's part of the L2 (the L2 size over
    the cores sharing it, at L2_FILL); else the whole set stays in the shared cache (L3, or the SLC)
    when it fits at L3_FILL; else it comes from DRAM. Private and shared caches have a port per core,
    so their bandwidth grows with threads (the shared cache's up to its chip-wide cap, when
    calibration found one); DRAM bandwidth is one figure for the whole chip."""
    k_ = constants
    moved = depthwise_bytes(spec, elem_bytes)
    clock_hz = cluster.clock_ghz * 1e9
    if moved / threads <= l2_per_core_bytes(cluster) * L2_FILL:
        return "L2", moved / (k_.l2_bytes_per_cycle * clock_hz * threads)
    shared_bytes = hw.l3_bytes or hw.slc_bytes or 0
    if moved <= shared_bytes * L3_FILL:
        return ("L3" if hw.l3_bytes else "SLC"), moved / k_.shared_cache_bytes_per_s(clock_hz, threads,
                                                                                     hw.shared_cache_read_gbps)
    return "DRAM", moved / dram_bytes_per_second(hw, k_)


def depthwise_stage_rate(sched: DepthwiseSchedule, lanes: int) -> float:
    """Elements per cycle per core that staging copies. The masked dialects (row_tail 'masked' or
    'half_width'; decide.row_tail) are exactly the ones with the stride-2 vector deinterleave."""
    if sched.stage_copy != "strided":
        return lanes * ROW_COPY_RATE_PER_LANE
    return lanes * STRIDED_STAGE_RATE_PER_LANE if sched.row_tail != "buffer" else SCALAR_STAGE_RATE


def depthwise_estimate(spec: DepthwiseSpec, hw: HardwareDescription, cluster: CpuCluster,
                       sched: DepthwiseSchedule, lanes: int,
                       constants: CostConstants = DEFAULT_CONSTANTS, elem_bytes: int = FLOAT_BYTES) -> CostEstimate:
    """The larger of compute and memory for a direct depthwise plan (elem_bytes: 2 for fp16).

    Compute, on the busiest thread: the vector FMAs the register tiles issue (rows padded to whole
    tiles, columns to whole vectors) at the core's FMA rate, slowed when the tile's input loads take
    more issue slots than its FMAs leave (depthwise_load_cost FMA slots per load), over the
    sustained share (depthwise_efficiency); plus staging every row block's padded input rows; plus
    the parallel region's fork/join when threads > 1. Memory: depthwise_memory (the level the
    tensors live in). Threads scale the compute by threads / imbalance and the cache levels by their
    ports, not DRAM, so a DRAM-bound call stops scaling where its bandwidth does."""
    core = cluster.core
    k_ = constants
    fmas, loads = depthwise_fmas_and_loads(spec, sched.oh_rows, sched.ow_vectors)
    threads = sched.threads
    planes = spec.n * spec.c
    blocks = math.ceil(spec.out_h / sched.oh_rows)
    clock_hz = cluster.clock_ghz * 1e9
    vector_fmas = planes * blocks * sched.oh_rows * math.ceil(spec.out_w / lanes) * spec.r * spec.s
    issue = max(1.0, loads / fmas * k_.depthwise_load_cost)
    fma_cycles = vector_fmas / element_fma_rate(core, elem_bytes) * issue / k_.depthwise_efficiency
    staged_rows = planes * blocks * spec.window_rows(sched.oh_rows)
    staged = staged_rows * (spec.w + spec.pad_left + spec.pad_right)
    stage_cycles = (staged_rows * k_.stage_row_cycles
                    + staged / (depthwise_stage_rate(sched, lanes) * k_.depthwise_stage_scale))
    per_thread_s = (fma_cycles + stage_cycles) * split_imbalance(planes, threads) / (threads * clock_hz)
    compute_s = per_thread_s + (k_.parallel_region_s if threads > 1 else 0.0)
    memory, memory_s = depthwise_memory(spec, hw, cluster, threads, k_, elem_bytes)
    parts = (("compute", compute_s), (memory, memory_s))
    bound, worst = max(parts, key=lambda p: p[1])
    return CostEstimate(flops=spec.flops, seconds_by_bound=parts, predicted_s=worst, bound=bound)
