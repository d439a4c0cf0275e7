"""The Winograd lowering of 3x3 stride-1 conv2d on the CPU: plans, cost, choice and render context.

A Winograd plan (lowering 'winograd', CpuKernelPlan.winograd_m = m) runs four stages (the math is
xfc/ops/winograd.py), with its vectors over tiles (templates/cpu/winograd.c.j2) or over channels
(templates/cpu/winograd_cv.c.j2; CpuKernelPlan.winograd_vectors, VECTOR_AXES below):

  filter   U = G g G^T, once per weight tensor (the pre-pack entry point; per call otherwise)
  input    V = BT d BT^T of the (m+2)x(m+2) input tiles, fused with the zero padding, written
           into the GEMMs' packed B panels (over tiles) or as rows of V (over channels)
  GEMMs    (m+2)^2 independent GEMMs, an ordinary matmul problem (gemm_problem) whose register
           tile, KC/MC/NC blocking and thread split the synthesizer grows as for any GEMM
           (synth.ranked_gemm_candidates), then fits to the stage (rows_within, deeper_slices,
           streamed_in_one_slice, split_variants): M[xi] = U[xi] (K x C) V[xi] (C x tiles) over tiles,
           U pre-packed as A; M[xi] = V[xi] (tiles x C) U[xi] (C x K) over channels, V read in
           place as A and U pre-packed as B
  output   Y = AT M AT^T + bias, activation, written straight into the output

The cost model charges each stage (winograd_estimate): the transforms' vector arithmetic, loads
and stores, the scalar staging and scatter, the traffic of the transformed tiles through the
level they fit, the GEMMs' own roofline estimate times (m+2)^2, and U streamed from DRAM when it
does not stay on chip. The synthesizer compares the best Winograd plan over the admissible tile
sizes (xfc.ops.winograd.admissible_tile_sizes) and vector axes with the best implicit-GEMM plan
and keeps the faster (synth.synthesize_cpu, lowering='auto').
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Optional

from ..errors import OperatorError
from ..ops import winograd as wmath
from ..ops.spec import Conv2dSpec, MatmulSpec
from .cost_model import (DEFAULT_CONSTANTS, L2_FILL, L3_FILL, CostConstants, CostEstimate, StaticEvaluator,
                         b_panel_resident, cold_stream_bytes_per_second, dram_bytes_per_second, gemm_estimate,
                         l2_per_core_bytes, winograd_stream_bytes_per_second)
from .explain import CpuSynthesis, TileLevel
from .ir import LOOP_ORDERS, UKERNELS, CpuKernelPlan, GemmSchedule
from .isa import isa_row
from . import decide, x86_asm
from .plans import hand_plan
from .tiles import FLOAT_BYTES, ROW_TAIL_MIN_SHARE, MicroTile, round_up

LOWERING = "winograd"
LOWERINGS = ("auto", "direct", "winograd")   # what a caller may ask the synthesizer for
# What the vectors of the GEMM stage and of the transforms run over (CpuKernelPlan.winograd_vectors):
#   tiles     M[xi] (K x T) = U (K x C) V (C x T): rows are output channels, vectors run over tiles
#             (templates/cpu/winograd.c.j2); a layer with few tiles (7x7, 14x14) fills few lanes
#   channels  M[xi] (T x K) = V (T x C) U (C x K): rows are tiles, vectors run over channels
#             (templates/cpu/winograd_cv.c.j2); every lane is used however few tiles there are
VECTOR_AXES = ("tiles", "channels")
CACHE_LINE_FLOATS = 64 // FLOAT_BYTES   # 64-byte lines: every target's L1 (the x86 hosts, the Cortex-A cores)
# The GEMM candidates per (m, vector axis) whose whole Winograd stage is estimated: the matmul
# ranking's first ones (its order misses only what the stage adds: the column tail and U once).
# With two axes and three tile sizes, all of them took the cold synthesis of a 64-channel 56x56
# conv past 10 ms on the host; the first 6 changed no plan of the 13 layers x 2 thread counts x 2
# ISAs checked (the Winograd benchmark's and one ragged 48->80-channel 23x23 layer).
STAGE_CANDIDATES = 6
# A split over output channels (barriers between the stages, V crossing cores) is taken over a
# split over tiles only when predicted this much faster. The model prices both alike where the
# tiles live in the shared cache either way, but on the 2-vCPU host the K split ran as fast at
# best and far slower in the windows when the two vCPUs sit apart: r18_l1 F(4,3), vectors over
# channels, same tiles, interleaved: 0.206 vs 0.198 ms (K split vs tile split), then 0.387 vs
# 0.259 ms a minute earlier.
K_SPLIT_MARGIN = 0.10
# A transformed filter U larger than the whole shared cache streams from DRAM on every call; the
# choice among plans takes its predicted seconds as they are. (Until issue 34 they counted twice,
# DRAM_STREAM_RISK, a rule set after runs of the layers it was judged on: on the Zen 4 host, where
# the stream hides behind the FMAs, it kept F(2,3) on 512 -> 1024 channels at 13x13, 36% slower
# than the F(4,3) the model itself predicted faster. The stream's rate and how much of it shows
# are the machine's: `xfc tiledb calibrate` fits both.)
# The transforms' per-store, per-scalar-element and per-group cycles and their arithmetic's sustained
# share of the FMA rate are CostConstants fields (winograd_*): static guesses in cost_model.py until
# `xfc tiledb calibrate` fits them on the host (xfc/tiledb/calibrate.py, WINOGRAD_TRAINING_SHAPES).


def gemm_problem(spec: Conv2dSpec, m: int, vectors: str = "tiles") -> MatmulSpec:
    """One of the (m+2)^2 GEMMs, as a matmul problem (the synthesizer grows its schedule like any
    matmul's): vectors over tiles, M = output channels, N = tiles; over channels, M = tiles, N =
    output channels. K = input channels, batch = images."""
    th, tw = wmath.tile_counts(spec, m)
    if vectors == "channels":
        return MatmulSpec(m=th * tw, n=spec.k, k=spec.c, batch=spec.n)
    return MatmulSpec(m=spec.k, n=th * tw, k=spec.c, batch=spec.n)


def vector_axes(isa: str) -> tuple[str, ...]:
    """The vector axes the synthesizer weighs on isa. Not 'channels' on lane-indexed ISAs (NEON):
    there A (V, read in place) costs one broadcast load per row, which the NEON micro-tile
    scores (packed A, lane-indexed FMAs) do not model; such plans render and verify (tests), but
    are not chosen until a NEON score models them."""
    return ("tiles",) if isa_row(isa).lane_indexed else VECTOR_AXES


def split_penalty(sched: GemmSchedule, vectors: str) -> float:
    """The factor a plan's predicted time is weighed with when the synthesizer compares Winograd
    schedules: 1, or 1 + K_SPLIT_MARGIN for a split over output channels on more than one thread
    (the kernel's barriers, and every thread reading the V the others wrote)."""
    if sched.threads > 1 and not tile_split(vectors, sched.parallel_axis):
        return 1 + K_SPLIT_MARGIN
    return 1.0


def tile_split(vectors: str, parallel_axis: str) -> bool:
    """Whether the kernel's thread split is over tiles (each thread owns its tiles through all
    stages) rather than over output channels (barriers between the stages)."""
    return parallel_axis == ("m" if vectors == "channels" else "n")


def packed_floats(spec: Conv2dSpec, m: int, vectors: str, mr: int, nr: int) -> int:
    """Floats of the pre-packed filter transform U: (m+2)^2 x C x K, K padded to the register
    tile's rows (vectors over tiles) or columns (over channels)."""
    return (m + 2) ** 2 * round_up(spec.k, nr if vectors == "channels" else mr) * spec.c


def check_applicable(spec) -> None:
    """One-line OperatorError when the Winograd lowering cannot be used for spec."""
    why = wmath.not_applicable(spec)
    if why:
        raise OperatorError(f"--lowering winograd does not apply: {why}")


# ---------------------------------------------------------------------------------------------
# Cost
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WinogradStages:
    """Predicted seconds of each stage (they run one after another, separated by barriers)."""

    input_s: float
    gemm_s: float
    output_s: float
    traffic_s: float
    gemm_bound: str = "compute"      # what bounds the GEMM stage (its roofline: compute, L2, L3, or DRAM for U)
    traffic_level: str = "L2"        # where the transformed tiles live (L2, L3 or DRAM)
    weights_level: str = "L2"        # where the transformed filter U lives between calls (L2, L3 or DRAM)
    traffic_exposed: float = 0.0     # CostConstants.winograd_traffic_exposed

    def parts(self) -> tuple[tuple[str, float], ...]:
        return (("input transform", self.input_s), ("GEMMs", self.gemm_s), ("output transform", self.output_s),
                ("tile traffic", self.traffic_s))

    @property
    def total_s(self) -> float:
        # The tile traffic is the transforms' own loads and stores reaching the level the tiles
        # live in: it overlaps the transforms (whose issue cost already counts those loads and
        # stores), so the two take the larger, not the sum. Adding them counted the tiles twice:
        # on the host Winograd benchmark the sum over-predicted transform-heavy plans (C = 32, or
        # 2 threads) by 1.4-2.8x and the synthesizer kept direct plans that ran 1.3-1.5x slower.
        # How much of the shorter of the two still shows is fitted (winograd_traffic_exposed, 0
        # unless calibrated).
        transforms = self.input_s + self.output_s
        return (max(transforms, self.traffic_s) + self.traffic_exposed * min(transforms, self.traffic_s)
                + self.gemm_s)


def transform_cycles(spec: Conv2dSpec, m: int, core, lanes: int,
                     constants: CostConstants = DEFAULT_CONSTANTS, blocks: int = 1,
                     vectors: str = "tiles") -> tuple[float, float]:
    """(input, output) transform cycles of one image on one core, all channels.

    Per group of LANES tiles: the transform's vector arithmetic at the FMA rate over the sustained
    share (winograd_transform_efficiency), a^2 vector loads, the stores (a^2 into V, m^2 of the
    output) at winograd_store_cycles each, and a fixed winograd_group_cycles. Per element: the
    scalar staging of the zero-padded, phase-split plane (input) and the scatter into the output
    (output), winograd_scalar_cycles each. The four constants are what calibration fits.
    blocks: the ranges of tiles the image is transformed in (thread shares, tile blocks); each
    range past the first stages its first tile row and the halo below its last again.
    vectors: 'tiles' (a group is LANES tiles of one tile row of one channel: a row of fewer
    tiles leaves lanes idle) or 'channels' (a group is LANES channels of one tile; the staged
    rows are not phase-split)."""
    k_ = constants
    t = wmath.transforms(m)
    a = t.alpha
    ops = t.arithmetic()
    th, tw = wmath.tile_counts(spec, m)
    loads_per_cycle = core.load_rules.vector_loads_per_cycle
    arithmetic_rate = core.fma_per_cycle * k_.winograd_transform_efficiency
    staged_rows = th * m + a - m + (blocks - 1) * a
    if vectors == "channels":   # per channel: groups of LANES channels, counted per channel
        in_groups = th * tw * math.ceil(spec.c / lanes) / spec.c
        out_groups = th * tw * math.ceil(spec.k / lanes) / spec.k
        stage_elems = staged_rows * (tw * m + a - m)
    else:
        in_groups = out_groups = th * math.ceil(tw / lanes)     # LANES tiles per vector group
        stage_elems = staged_rows * m * (round_up(tw, lanes) + lanes)
    input_group = (ops["input"] / arithmetic_rate + a * a / loads_per_cycle + a * a * k_.winograd_store_cycles
                   + k_.winograd_group_cycles)
    output_group = (ops["output"] / arithmetic_rate + a * a / loads_per_cycle + m * m * k_.winograd_store_cycles
                    + k_.winograd_group_cycles)
    input_cycles = spec.c * (in_groups * input_group + stage_elems * k_.winograd_scalar_cycles)
    output_cycles = spec.k * (out_groups * output_group + spec.out_h * spec.out_w * k_.winograd_scalar_cycles)
    return input_cycles, output_cycles


def weights_memory(spec: Conv2dSpec, m: int, mr: int, hw, cluster, threads: int, tile_bytes: int,
                   constants: CostConstants = DEFAULT_CONSTANTS, vectors: str = "tiles",
                   nr: int = 1, from_memory: bool = False, owned: bool = False) -> tuple[str, float]:
    """(level, seconds) for the GEMMs to read the transformed filter U once per image from where it
    lives between calls, as a depthwise call's tensors (cost_model.depthwise_memory): the threads'
    L2 shares, else the shared cache with the transformed tiles beside it, else DRAM. Only DRAM is
    charged here: reads from L2 or the shared cache are in each GEMM's own L2 and L3 terms.
    from_memory: every call reads all of U from DRAM, whatever its size (a layer of a network whose
    weights exceed the shared cache: the other layers' weights pass between two calls of this one;
    `benchmarks/regret.py --weights cold` times plans that way), at the cold stream's own rate
    (cost_model.cold_stream_bytes_per_second).

    Each GEMM's roofline alone would charge DRAM for its U, V and M on every one of the a^2 GEMMs
    (gemm_estimate's "every tensor once"). V and M are written and read within the call (the tile
    traffic term), and U is read once: on the host the a^2 DRAM terms bounded the 2-thread GEMM
    stage at its 1-thread time (r18_l3 m=4, r18_l4 m=2: predicted 1.6-2.3x the measured time).

    owned (a split over tiles, tile_split): every thread multiplies its tiles by all of U, so each
    holds all of U in its own L2 share, and the part of U past the shared cache is streamed by each
    thread, not once: the threads do not run in step closely enough to share one stream (on the Zen 5
    VM at 2 threads, vgg_7 F(4,3), U 19 MB: split over tiles 0.415 ms, over output channels 0.362;
    regret_winograd_zen5_2t_before_split_copies.json, the fitting set). The cold stream (from_memory) keeps its fitted
    constants (session 52: two threads streaming a cold U no faster than one; session 57: slower, on the
    Zen 5 VM, cost_model.COLD_STREAM_PARALLEL_EFFICIENCY)."""
    u_bytes = FLOAT_BYTES * packed_floats(spec, m, vectors, mr, nr)
    if from_memory:
        return "DRAM", spec.n * u_bytes / cold_stream_bytes_per_second(hw, constants, threads)
    copies = max(threads, 1) if owned else 1
    if u_bytes * copies <= l2_per_core_bytes(cluster) * threads * L2_FILL:
        return "L2", 0.0
    capacity = hw.l3_bytes or hw.slc_bytes or 0
    shared = capacity * L3_FILL
    if u_bytes + tile_bytes <= shared:
        return "L3", 0.0
    # Past the share, only the part of U past the share (beside the tiles) comes from DRAM on each
    # call: the rest stays on chip between calls, also when U is larger than the whole cache (the
    # caches' adaptive replacement keeps part of a stream that does not fit, rather than none of it
    # as LRU would). Charging all of U put the host's r18_l4 F(2,3) (U 17 MB + 1 MB of tiles
    # against a 16 MB share of the 32 MB L3) at DRAM speed, and the direct plan, measured 7-10%
    # slower, was chosen. A U of 38 MB past a 32 MB L3 streamed at 1.4-1.6x the probe's read rate
    # on the issue-34 Zen 4 VM (r18_l4's F(4,3) GEMMs alone, 1 thread: 0.87-0.96 ms against 26.8
    # GB/s; benchmarks/results/winograd_stages_issue34*.json), and at 1.7x on the session-28 VM if
    # its stream added to the FMAs as that session found (0.52 ms against 42.8 GB/s): about the
    # part past the share at the probe's rate. Charging all of it (until issue 34) chose F(2,3) for
    # r18_l4 on the Zen 4 VM, 17% slower. Never more than U: the tiles' own traffic is the
    # tile-traffic term (and with no shared cache, all of U streams).
    dram_bytes = min(u_bytes, u_bytes + tile_bytes - shared) * copies
    # Split over output channels the threads stream disjoint parts of U, as the host probe's past-L3
    # read does (l3_overflow_read_speedup); split over tiles each streams all of it, which that
    # figure does not measure (on the Zen 5 VM such a split ran slower than the other at 2 threads).
    streams = 1 if owned else threads
    return "DRAM", spec.n * dram_bytes / winograd_stream_bytes_per_second(hw, cluster, constants, streams)


def u_owned_extra_bytes(spec: Conv2dSpec, m: int, mr: int, nr: int, vectors: str, cluster, threads: int,
                        share: int, block: int, charged_reads: int = 1) -> float:
    """Split over tiles: the bytes of U the busiest thread reads from the shared cache per image
    beyond the 1/threads share of what the GEMM estimate charges (charged_reads reads of U, all
    ports together: once where U is the GEMM's B, vectors over channels; once per NC block where
    it is A, vectors over tiles).
    Every thread multiplies its tiles by all of U, once per block of tiles, and each time the part
    of U past the core's L2 share comes from the shared cache: the block's a^2 GEMMs walk all of U,
    so that part is gone from L2 before the next block and before the next call (as weights_memory
    takes only the part of U past the shared cache from DRAM). On the Intel Xeon VM of session 61
    (one core reads 25-30 GB/s from its L3): vgg_7's F(4,3) (16 tiles, U 19 MB) at one thread in
    two blocks of 9 tiles 1.74 ms, in one block 1.08; r18_l4's F(2,3) (U 17 MB) on two threads split
    over tiles 0.79 ms, over output channels 0.54 (regret_winograd_intel_gnr_{1,2}t_base.json)."""
    u_bytes = FLOAT_BYTES * packed_floats(spec, m, vectors, mr, nr)
    past_l2 = u_bytes - l2_per_core_bytes(cluster) * L2_FILL
    if past_l2 <= 0:
        return 0.0
    return max(0.0, math.ceil(share / max(block, 1)) * past_l2 - u_bytes * charged_reads / max(threads, 1))


def stage_costs(spec: Conv2dSpec, m: int, hw, cluster, threads: int, lanes: int, nr: int,
                gemm_estimate: CostEstimate, constants: CostConstants = DEFAULT_CONSTANTS,
                mr: int = 1, parallel_axis: str = "n", nc: Optional[int] = None, vectors: str = "tiles",
                mc: Optional[int] = None, weights_from_memory: bool = False,
                u_prefetched: bool = True, u_l2_reads: float = 0.0) -> WinogradStages:
    """The stages of a Winograd plan (module docstring). gemm_estimate: one of the a^2 GEMMs
    (gemm_problem; its DRAM term is replaced by weights_memory, see there). The filter transform
    is not charged: the pre-pack entry point does it once per weight tensor, like the packed
    weights of a GEMM plan. parallel_axis: the GEMM's split (gemm_problem's axes); the kernel's
    thread split (templates/cpu/winograd.c.j2, winograd_cv.c.j2) follows from it (tile_split):
    over tiles, each thread owns whole register panels of tiles (NR columns, or MR rows with
    vectors over channels) through all three stages, in blocks of nc (or mc) tiles (default: one
    block per thread); over output channels, the input transform splits channels, the GEMMs
    output channels and the output transform output channels, with barriers between.
    u_prefetched: the GEMMs prefetch the next panel of U while they multiply the current one
    (u_prefetch_lines); without it a U read from memory on every call (weights_from_memory) is
    waited for, not hidden behind the FMAs. u_l2_reads: bytes of U one thread reads from L2 per
    image (u_l2_read_bytes), charged beside a U read from memory on every call."""
    a = m + 2
    clock_hz = cluster.clock_ghz * 1e9
    th, tw = wmath.tile_counts(spec, m)
    tiles = th * tw
    by_channels = vectors == "channels"
    panel = mr if by_channels else nr           # the tiles of one register panel
    # V's rows: tiles padded to whole panels (over tiles) or channels padded to whole vectors
    v_floats = spec.c * round_up(tiles, nr) if not by_channels else round_up(spec.c, lanes) * tiles
    m_floats = spec.k * tiles if not by_channels else round_up(spec.k, lanes) * tiles
    owned = tile_split(vectors, parallel_axis)
    if owned:
        # the busiest thread's share of the tiles: whole panels, as the kernel deals them
        panels = math.ceil(tiles / panel)
        share = decide.busiest_thread_rows(tiles, panel, threads)
        block = min(share, (mc if by_channels else nc) or share)
        starts = [min(tiles, panels * i // max(threads, 1) * panel) for i in range(max(threads, 1) + 1)]
        blocks = sum(math.ceil((end - begin) / block) for begin, end in zip(starts, starts[1:]))
        input_cycles, output_cycles = transform_cycles(spec, m, cluster.core, lanes, constants, max(blocks, 1),
                                                       vectors)
        busiest = share / tiles
        input_s = spec.n * input_cycles * busiest / clock_hz
        output_s = spec.n * output_cycles * busiest / clock_hz
        # what one core holds at a time: its block's V and M
        resident_bytes = FLOAT_BYTES * a * a * ((round_up(spec.c, lanes) + round_up(spec.k, lanes)) * block
                                                if by_channels else spec.c * round_up(block, nr) + spec.k * block)
    else:
        input_cycles, output_cycles = transform_cycles(spec, m, cluster.core, lanes, constants, vectors=vectors)
        work_units = (math.ceil(spec.c / lanes), math.ceil(spec.k / lanes)) if by_channels else (spec.c, spec.k)
        used = min(threads, max(work_units[0], 1)), min(threads, max(work_units[1], 1))
        input_s = spec.n * input_cycles / (clock_hz * used[0])
        output_s = spec.n * output_cycles / (clock_hz * used[1])
    # The transformed tiles: V written by the input transform, M written by the GEMMs and read
    # back by the output transform (the GEMMs' own reads of U and V are in their estimate).
    tile_bytes = FLOAT_BYTES * a * a * (v_floats + m_floats)
    moved = spec.n * tile_bytes * 1.5
    # Split over output channels on more than one thread, every thread's GEMMs read the V the
    # others wrote, and the output transform reads M rows other threads wrote: the tiles cross
    # cores through the shared cache, however small. Split over tiles, each thread's tiles stay
    # in its own caches.
    if not owned:
        resident_bytes = tile_bytes / max(threads, 1)
    crosses_cores = not owned and threads > 1
    if resident_bytes <= l2_per_core_bytes(cluster) * L2_FILL and not crosses_cores:
        level, traffic_s = "L2", moved / (constants.l2_bytes_per_cycle * clock_hz * threads)
    elif tile_bytes <= (hw.l3_bytes or hw.slc_bytes or cluster.l2.size_bytes) * L3_FILL:
        level, traffic_s = "L3", moved / constants.shared_cache_bytes_per_s(clock_hz, threads,
                                                                             hw.shared_cache_read_gbps)
    else:
        level, traffic_s = "DRAM", moved / dram_bytes_per_second(hw, constants)
    on_chip = [(name, s) for name, s in gemm_estimate.seconds_by_bound if name != "DRAM"]
    gemm_bound, per_gemm_s = max(on_chip, key=lambda p: p[1])
    weights_level, weights_s = weights_memory(spec, m, mr, hw, cluster, threads, tile_bytes, constants,
                                              vectors, nr, weights_from_memory, owned=owned)
    gemm_s = a * a * per_gemm_s
    if owned:
        gemm_s = max(gemm_s, a * a * dict(on_chip).get("L3", 0.0)
                     + spec.n * u_owned_extra_bytes(spec, m, mr, nr, vectors, cluster, threads, share, block,
                                                    1 if by_channels else math.ceil(tiles / (nc or tiles)))
                     / constants.shared_cache_bytes_per_s(clock_hz, 1, hw.shared_cache_read_gbps))
    if weights_from_memory and u_l2_reads:
        # A U streamed from memory and the row tiles' reads of it from L2 share the core's L1
        # misses (the prefetches into L2 and the panels' refills of L1): their times add. Where
        # the panel stays in L1 that is one read; where it does not, one per row tile. On the Zen 5
        # VM, conv_r18_l3 (F(4,3), 6x64 tiles, three row tiles, U 9.4 MB) ran 0.33 ms hot whatever
        # the KC, and cold 0.43 at KC 256 (a 64 KB panel, three L2 reads of U) against 0.35 at
        # KC 128 and 0.34 at 64 (32 and 16 KB panels).
        weights_s += spec.n * u_l2_reads / (constants.l2_bytes_per_cycle * clock_hz)
    if weights_s > 0:   # U streamed from DRAM while the GEMMs compute: the exposed share adds up
        hidden = min(gemm_s, weights_s)
        if weights_s > gemm_s:
            gemm_bound = "DRAM"
        exposed = (constants.winograd_cold_stream_exposed if weights_from_memory
                   else constants.winograd_stream_exposed)
        if weights_from_memory and not u_prefetched:
            # Nothing asks for the next panel ahead: each one arrives at the rate its first row
            # tile's misses fetch it, and with one row tile per panel (few tiles, or one thread's
            # share of them) that tile is all of the panel's FMAs. On the Zen 5 VM, U read cold on
            # every call: odd_17's F(6,3) (one row tile, 2.4 MB of U) 0.063 ms hot, 0.111 cold,
            # against 0.063 + its U at the probe's read rate (0.045); F(4,3) of odd_9 (one row
            # tile, 6.5 MB) 0.123 hot, 0.270 cold (+0.124 predicted); with two row tiles and the
            # prefetch, 1.0-1.1x of hot (regret.py --weights cold --plan-weights memory,
            # docs/winograd.md, session 60).
            exposed = 1.0
        gemm_s = max(gemm_s, weights_s) + exposed * hidden
    return WinogradStages(input_s=input_s, gemm_s=gemm_s, output_s=output_s, traffic_s=traffic_s,
                          gemm_bound=gemm_bound, traffic_level=level, weights_level=weights_level,
                          traffic_exposed=constants.winograd_traffic_exposed)


def column_tail_score(tile: MicroTile, n: int, cluster, isa: str, evaluator):
    """The score of the micro-kernel of the last N % NR columns of a Winograd GEMM, on every ISA
    (None: NR divides N). Its N is the tile count, often under 2 NR (49 tiles at 28x28, m=4; 16 at
    7x7, m=2), so the column tail is a large share of the stage, or all of it; the direct GEMMs
    charge it only where the ISA row models it (synth._column_tail_score)."""
    tail_vectors = math.ceil((n % tile.nr) / tile.lanes)
    if tail_vectors == 0:
        return None
    return evaluator.evaluate(MicroTile(mr=tile.mr, nr_vectors=tail_vectors, lanes=tile.lanes,
                                        a_load_bits=tile.a_load_bits), cluster.core, isa)


def plan_stages(spec: Conv2dSpec, m: int, hw, cluster, sched: GemmSchedule, lanes: int, isa: str,
                constants: CostConstants = DEFAULT_CONSTANTS, evaluator=None, vectors: str = "tiles",
                gemm: Optional[CostEstimate] = None, weights_from_memory: bool = False,
                u_prefetched: Optional[bool] = None) -> WinogradStages:
    """The stages of a Winograd plan with GEMM schedule sched. The GEMM stage is winograd_gemm's
    estimate (given as `gemm` when the caller has it: of the Winograd-only constants it depends on the
    plans' own cache rates alone, CostConstants.for_winograd).
    u_prefetched: whether the GEMMs prefetch the next panel of U (default: as make_plan decides it
    for sched, u_prefetch_lines)."""
    constants = constants.for_winograd()
    if gemm is None:
        gemm = winograd_gemm(spec, m, hw, cluster, sched, lanes, isa, constants, evaluator, vectors)
    cold = {}
    if weights_from_memory and isa_row(isa).name in COLD_TERMS_DIALECTS:   # stage_costs: u_prefetched, u_l2_reads
        cold = dict(u_prefetched=(u_prefetch_lines(spec, m, sched, isa, vectors) > 0 if u_prefetched is None
                                  else u_prefetched),
                    u_l2_reads=u_l2_read_bytes(spec, m, sched, cluster, vectors))
    return stage_costs(spec, m, hw, cluster, sched.threads, lanes, sched.nr, gemm, constants, mr=sched.mr,
                       parallel_axis=sched.parallel_axis, nc=sched.nc, vectors=vectors, mc=sched.mc,
                       weights_from_memory=weights_from_memory, **cold)


def winograd_gemm(spec: Conv2dSpec, m: int, hw, cluster, sched: GemmSchedule, lanes: int, isa: str,
                  constants: CostConstants = DEFAULT_CONSTANTS, evaluator=None, vectors: str = "tiles") -> CostEstimate:
    """One of a Winograd plan's a^2 GEMMs: the roofline estimate of gemm_problem under sched with A
    not packed on the call (U is pre-packed, or V is read in place), its column tail scored as its
    own micro-kernel; the micro-tiles are scored by evaluator (default: the static issue model)."""
    constants = constants.for_winograd()
    evaluator = evaluator or StaticEvaluator()
    tile = MicroTile(mr=sched.mr, nr_vectors=sched.nr // lanes, lanes=lanes, a_load_bits=sched.a_load_bits)
    score = evaluator.evaluate(tile, cluster.core, isa)
    problem = gemm_problem(spec, m, vectors)
    direct = sched if sched.a_pack == "direct" else replace(sched, a_pack="direct")
    gemm = gemm_estimate(problem, hw, cluster, tile, score, direct, False, constants,
                         tail_score=column_tail_score(tile, problem.n, cluster, isa, evaluator),
                         interference=isa_row(isa).interference_model)
    if vectors == "channels" and problem.m % sched.mr:
        # Rows are tiles, often under a few MR (16 at 7x7, m=2): the row tail's few accumulators
        # cannot hide the FMA latency, so it is charged as at least ROW_TAIL_MIN_SHARE of a full
        # tile (as rank_micro_tiles does; the estimate's compute term counts rows unpadded).
        full = problem.m // sched.mr * sched.mr
        factor = (full + max(problem.m - full, sched.mr * ROW_TAIL_MIN_SHARE)) / problem.m
        parts = tuple((name, t * factor if name == "compute" else t) for name, t in gemm.seconds_by_bound)
        gemm = replace(gemm, seconds_by_bound=parts, predicted_s=max(t for _, t in parts))
    return gemm


def stages_of_plan(plan: CpuKernelPlan, hw, cluster, constants: CostConstants = DEFAULT_CONSTANTS,
                   evaluator=None, gemm: Optional[CostEstimate] = None,
                   weights_from_memory: bool = False) -> WinogradStages:
    """plan_stages for a Winograd plan as it stands (its m, GEMM schedule, vector axis and prefetch)."""
    return plan_stages(plan.spec, plan.winograd_m, hw, cluster, plan.gemm, plan.vector_lanes, plan.isa, constants,
                       evaluator, plan.winograd_vectors, gemm, weights_from_memory,
                       u_prefetched=plan.gemm.prefetch_next_panel_lines > 0 and plan.gemm.ukernel == "intrinsics")


def gemm_of_plan(plan: CpuKernelPlan, hw, cluster, constants: CostConstants = DEFAULT_CONSTANTS,
                 evaluator=None) -> CostEstimate:
    """winograd_gemm for a Winograd plan as it stands."""
    return winograd_gemm(plan.spec, plan.winograd_m, hw, cluster, plan.gemm, plan.vector_lanes, plan.isa, constants,
                         evaluator, plan.winograd_vectors)


def winograd_estimate(spec: Conv2dSpec, stages: WinogradStages) -> CostEstimate:
    """A CostEstimate whose flops are the direct convolution's (effective GFLOP/s) and whose parts
    are the stages; the prediction is WinogradStages.total_s (the transforms overlapping their tile
    traffic, then the GEMMs). The bound is what limits the largest stage, in the vocabulary of the
    other plans: the GEMMs' own bound, 'compute' for a transform (core cycles), the level the
    transformed tiles live in for their traffic."""
    parts = stages.parts()
    largest = max(parts, key=lambda p: p[1])[0]
    bound = {"GEMMs": stages.gemm_bound, "tile traffic": stages.traffic_level}.get(largest, "compute")
    return CostEstimate(flops=spec.flops, seconds_by_bound=parts, predicted_s=stages.total_s, bound=bound)


# ---------------------------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------------------------

def winograd_schedule(sched: GemmSchedule, vectors: str = "tiles", isa: str = "") -> GemmSchedule:
    """A grown GEMM schedule as the Winograd GEMM stage runs it. Vectors over tiles: U arrives
    pre-packed as MR-row panels (a_pack 'packed') and V is written packed by the input transform.
    Over channels: V, written row by row by the input transform, is read in place (a_pack
    'direct') and U is pre-packed as NR-column panels (the B operand); the NEON inline-assembly
    K loop reads packed A only, so NEON takes the intrinsics there (the x86 one reads A in place
    too). Nothing is staged."""
    if vectors == "channels":
        ukernel = sched.ukernel if isa in x86_asm.DIALECTS else "intrinsics"
        return replace(sched, a_pack="direct", c_store="direct", stage_copy="none", ukernel=ukernel)
    return replace(sched, a_pack="packed", c_store="direct", stage_copy="none")


def split_variants(sched: GemmSchedule, spec: Conv2dSpec, m: int, cluster,
                   vectors: str = "tiles") -> list[GemmSchedule]:
    """sched; its split over tiles when sched splits output channels (the matmul ranking grows
    one split per register tile, and the Winograd kernel's two splits differ in what the GEMM's
    do not: barriers, and V crossing cores); and for each split over tiles the same schedule run
    in blocks of tiles whose transformed tiles (V and M of the block) fit the core's L2 share,
    when that is smaller than a thread's share: the block is transformed, multiplied and read
    back while it is in L2, at the price of reading U once per block (the GEMM estimate's U
    traffic per block) and of staging each block's halo rows again (transform_cycles). The
    blocks are NC tiles (vectors over tiles) or MC tiles (over channels: whole MR-row panels)."""
    tiles_axis = "m" if vectors == "channels" else "n"
    out = [sched] if tile_split(vectors, sched.parallel_axis) else [sched, replace(sched, parallel_axis=tiles_axis)]
    a = m + 2
    th, tw = wmath.tile_counts(spec, m)
    tiles = th * tw
    panel = sched.mr if vectors == "channels" else sched.nr
    share = decide.busiest_thread_rows(tiles, panel, sched.threads)
    per_tile_bytes = FLOAT_BYTES * a * a * (spec.c + spec.k)
    block = int(l2_per_core_bytes(cluster) * L2_FILL // per_tile_bytes) // panel * panel
    if block < panel or block >= share or (vectors == "channels" and block >= sched.mc):
        return out
    owned = out[-1]
    return out + [replace(owned, mc=block) if vectors == "channels" else replace(owned, nc=block)]


def streamed_in_one_slice(sched: GemmSchedule, spec: Conv2dSpec, m: int, hw, isa: str,
                          vectors: str) -> GemmSchedule:
    """sched with the whole reduction in one KC slice when U is larger than the shared cache (so
    mostly streamed from DRAM on every call; weights_memory), on x86. Measured on the session-28
    AVX-512 VM, 512 channels at 14x14, F(4,3), one thread, every tile 10x32, 8x32, 5x64: one slice
    2.09-2.17 ms, each further slice about 0.3 ms more (four: 3.09-3.19 ms). The L1 fit of KC had
    picked 128-176, and the model priced the slices alike then (deeper_slices now weighs depths for
    every plan). Not on NEON: not measured there, and its in-order cores' smaller L1 is what KC is
    sized for."""
    capacity = hw.l3_bytes or hw.slc_bytes or 0
    if (isa_row(isa).lane_indexed or not capacity or sched.kc >= spec.c
            or FLOAT_BYTES * packed_floats(spec, m, vectors, sched.mr, sched.nr) <= capacity):
        return sched
    return replace(sched, kc=spec.c)


def deeper_slices(sched: GemmSchedule, spec: Conv2dSpec, isa: str) -> list[GemmSchedule]:
    """sched with fewer, deeper reduction slices: half as many, a quarter, ..., one (the whole of C),
    equal slices rounded up to the K unroll as the matmul growth makes them (synth.grow_gemm); none
    when KC is already C, and none on lane-indexed ISAs (NEON). The growth sizes KC so a KC x NR
    micro-panel of B stays in L1, which suits a GEMM whose B panel many row tiles reuse; a Winograd
    GEMM over channels has few rows (the tiles: 16 at 7x7, m=2), each slice costs a pass over C and
    a restart of the streams of U and V, and the model prices a deeper slice (B then streaming from
    L2, cost_model.l2_stream_factor) as the cheaper. Measured on the Zen 4 host, one thread, 512
    channels at 7x7, F(2,3), tile 10x32: KC 64, 128, 256, 512 ran 1.92, 1.59, 1.45, 1.32 ms
    (benchmarks/regret.py). Not on NEON, as streamed_in_one_slice: not measured there, and KC is
    sized for the in-order cores' L1."""
    if isa_row(isa).lane_indexed or sched.kc >= spec.c:
        return []
    step = max(sched.k_unroll, 1)
    slices = math.ceil(spec.c / sched.kc)
    depths = []
    while slices > 1:
        slices = math.ceil(slices / 2)
        depths.append(min(spec.c, round_up(math.ceil(spec.c / slices), step)))
    return [replace(sched, kc=d) for d in dict.fromkeys(depths) if d > sched.kc]


def rows_within(sched: GemmSchedule, rows: int, isa: str, core) -> GemmSchedule:
    """sched with its register tile cut to the GEMM's rows when it has more (the tiles, over
    channels: 4 at 7x7 with m=4). A taller tile never runs its full micro-kernel, only the row-tail
    variant (no assembly K loop where the dialect has one, a dispatch per panel), and holds
    accumulators no row uses; the cut tile is the same arithmetic as the full kernel. The model
    prices the two alike; measured on the Zen 4 host, 512 channels at 7x7, F(4,3), KC 512: 4x64
    ran 0.93-0.97 ms where 5x64 and 6x64 ran 1.04-1.11 ms in every run (benchmarks/regret.py)."""
    if rows >= sched.mr or rows < 1:
        return sched
    row = isa_row(isa)
    tile = MicroTile(mr=rows, nr_vectors=sched.nr // max(row.synthesis_lanes(core), 1),
                     lanes=row.synthesis_lanes(core), a_load_bits=sched.a_load_bits)
    ukernel = sched.ukernel
    if ukernel != "intrinsics":    # the K loop written for the cut tile (registers are fewer: it still fits)
        ukernel = decide.gemm_ukernel(row, core if row.asm_ukernels else None, tile.registers(isa))
    return replace(sched, mr=rows, mc=rows, ukernel=ukernel)


def with_register_tile(sched: GemmSchedule, mr: int, nr: int, kc: int, isa: str, core,
                       vectors: str = "tiles") -> Optional[GemmSchedule]:
    """sched with GEMM-stage register tile mr x nr and reduction slice kc: the blocks keep their number
    of register tiles and the K loop is written as the planner writes it for that tile
    (decide.gemm_ukernel); None where it is not a tile (no rows, no whole vector)."""
    row = isa_row(isa)
    lanes = row.synthesis_lanes(core)
    if mr < 1 or nr < lanes or nr % lanes or kc < sched.k_unroll:
        return None
    tile = MicroTile(mr=mr, nr_vectors=nr // lanes, lanes=lanes, a_load_bits=sched.a_load_bits)
    ukernel = decide.gemm_ukernel(row, core if row.asm_ukernels else None, tile.registers(row.name))
    resized = replace(sched, mr=mr, nr=nr, kc=kc, mc=-(-sched.mc // sched.mr) * mr,
                      nc=-(-sched.nc // sched.nr) * nr, ukernel=ukernel)
    return winograd_schedule(resized, vectors, isa)


def narrower_on_tie(sched: GemmSchedule, key: float, price, isa: str, core, vectors: str, columns: int):
    """(schedule, its key, whether narrowed): sched's register tile one vector narrower when the stage
    model prices it no slower (NARROWER_ON_TIE) and it leaves no ragged column tail the wider tile did
    not (the rows measured had none), on the ISAs and the KC where that was measured
    (NARROWER_ON_TIE_ISAS, NARROWER_ON_TIE_MIN_KC). price(schedule) -> the key synthesize_winograd
    ranks by; columns: the GEMMs' N."""
    lanes = isa_row(isa).synthesis_lanes(core)
    if isa not in NARROWER_ON_TIE_ISAS or sched.nr <= lanes or sched.kc < NARROWER_ON_TIE_MIN_KC:
        return sched, key, False
    if columns % (sched.nr - lanes) and not columns % sched.nr:
        return sched, key, False
    narrower = with_register_tile(sched, sched.mr, sched.nr - lanes, sched.kc, isa, core, vectors)
    if narrower is None:
        return sched, key, False
    narrower_key = price(narrower)
    if narrower_key <= key * (1 + TIE_TOLERANCE):
        return narrower, narrower_key, True
    return sched, key, False


def u_l2_read_bytes(spec: Conv2dSpec, m: int, sched: GemmSchedule, cluster, vectors: str) -> float:
    """Bytes of U the busiest thread's GEMMs read from L2 per image under sched. Over channels U is
    B: each KC x NR panel is read once per MC block of rows, by its first row tile only where it
    stays in L1 (cost_model.b_panel_resident, as in the GEMM estimate) and by every row tile where
    it does not. Over tiles U is A: each MR x KC panel is read once per NR panel of tiles. A thread reads all of
    U for its tiles where the split is over tiles (tile_split), the busiest thread's share of the
    output channels for all tiles otherwise."""
    elem = FLOAT_BYTES
    threads = max(sched.threads, 1)
    u_bytes = elem * packed_floats(spec, m, vectors, sched.mr, sched.nr)
    th, tw = wmath.tile_counts(spec, m)
    tiles = th * tw
    tile_rows = sched.mr if vectors == "channels" else sched.nr          # the tiles of one register panel
    channel_rows = sched.nr if vectors == "channels" else sched.mr       # ... and its output channels
    if tile_split(vectors, sched.parallel_axis):
        tiles, share = decide.busiest_thread_rows(tiles, tile_rows, threads), 1.0
    else:
        channels = round_up(spec.k, channel_rows)
        share = decide.busiest_thread_rows(channels, channel_rows, threads) / channels
    if vectors == "channels":
        block = min(sched.mc, tiles)
        resident = b_panel_resident(cluster.core, sched, elem)
        passes = (math.ceil(tiles / block) if resident     # the first row tile of each MC block
                  else tiles // block * math.ceil(block / sched.mr) + math.ceil(tiles % block / sched.mr))
    else:
        passes = math.ceil(tiles / sched.nr)
    return u_bytes * share * passes


# Where the cold-U terms of stage_costs (u_prefetched, u_l2_reads) were measured: the dialects whose
# GEMMs prefetch the next panel of U (the x86 host, docs/winograd.md, session 60). Elsewhere (NEON:
# no software prefetch, no timing of a cold U) a cold U is priced as before them.
COLD_TERMS_DIALECTS = decide.NEXT_PANEL_PREFETCH_DIALECTS


def u_prefetch_lines(spec: Conv2dSpec, m: int, sched: GemmSchedule, isa: str, vectors: str) -> int:
    """Cache lines of the next panel of U the GEMMs' row tiles prefetch per unrolled k step (0:
    none) under the grown schedule sched, as the decision for a matmul takes it
    (decide.next_panel_prefetch_lines): over channels U is the B operand, the weights; over
    tiles it is A, and nothing prefetches it."""
    if vectors != "channels":
        return 0
    gemm = winograd_schedule(sched, vectors, isa)
    problem = gemm_problem(spec, m, vectors)
    row = isa_row(isa)
    return decide.next_panel_prefetch_lines(row, problem, False, problem.m, gemm.mr, gemm.nr, gemm.kc, gemm.mc,
                                            gemm.k_unroll, gemm.loop_order, gemm.ukernel, row.elem_bytes,
                                            gemm.threads, gemm.parallel_axis)


def with_planned_prefetch(plan: CpuKernelPlan) -> CpuKernelPlan:
    """plan with the next-panel prefetch make_plan gives its GEMM schedule (u_prefetch_lines): for a
    plan whose schedule was changed by hand (a benchmark's neighbour or variant)."""
    lines = u_prefetch_lines(plan.spec, plan.winograd_m, plan.gemm, plan.isa, plan.winograd_vectors)
    return replace(plan, gemm=replace(plan.gemm, prefetch_next_panel_lines=lines))


def make_plan(spec: Conv2dSpec, m: int, isa: str, lanes: int, sched: GemmSchedule, function_name: str,
              header_lines: tuple[str, ...], hardware_name: str = "", gcc_march: str = "",
              qemu_cpu: str = "", vectors: str = "tiles") -> CpuKernelPlan:
    """The plan; its GEMMs prefetch the next panel of U where the decision for a matmul would
    (decide.next_panel_prefetch_lines): over channels U is the B operand, the weights, streamed
    from memory by every call whose U passes the caches."""
    gemm = replace(winograd_schedule(sched, vectors, isa),
                   prefetch_next_panel_lines=u_prefetch_lines(spec, m, sched, isa, vectors))
    return CpuKernelPlan(spec=spec, isa=isa, vector_lanes=lanes, lowering=LOWERING,
                         gemm=gemm, depthwise=None, function_name=function_name,
                         header_lines=header_lines, hardware_name=hardware_name, gcc_march=gcc_march,
                         qemu_cpu=qemu_cpu, winograd_m=m, winograd_vectors=vectors)


def hand_winograd_plan(spec: Conv2dSpec, m: int, isa: str = "avx512", threads: int = 1, vectors: str = "tiles",
                       **overrides) -> CpuKernelPlan:
    """A hand-picked Winograd plan (tests): the GEMM stage from plans.hand_plan on gemm_problem."""
    check_applicable(spec)
    if m not in wmath.TILE_SIZES:
        raise OperatorError(f"winograd tile size m={m} must be one of {wmath.TILE_SIZES}")
    if vectors not in VECTOR_AXES:
        raise OperatorError(f"winograd vectors '{vectors}' must be one of {', '.join(VECTOR_AXES)}")
    a_pack = "direct" if vectors == "channels" else "packed"
    base = hand_plan(gemm_problem(spec, m, vectors), isa, threads, a_pack=a_pack, **overrides)
    name = overrides.get("function_name") or base.function_name.replace("xfc_matmul", f"xfc_wino{m}_conv")
    header = (f"xfc CPU kernel: {spec.describe()}", f"isa={isa} lanes={base.vector_lanes} threads={threads}",
              f"plan: hand_winograd_plan m={m} vectors={vectors} (xfc.cpu.winograd)", base.header_lines[-1])
    return make_plan(spec, m, isa, base.vector_lanes, base.gemm, name, header, gcc_march=base.gcc_march,
                     qemu_cpu=base.qemu_cpu, vectors=vectors)


def stage_levels(spec: Conv2dSpec, m: int, stages: WinogradStages, gemm_levels: tuple[TileLevel, ...],
                 lanes: int, vectors: str = "tiles", sched: Optional[GemmSchedule] = None,
                 grown: Optional[GemmSchedule] = None, kc_why: str = "") -> tuple[TileLevel, ...]:
    """The explanation's levels: the transforms around the GEMM stage's own levels (its thread
    split from sched: split_variants may have changed the matmul candidate's; its rows and KC:
    rows_within, streamed_in_one_slice and deeper_slices may have changed grown's, the matmul
    candidate's schedule, kc_why saying which set KC)."""
    grown = grown or sched
    threads = sched.threads if sched is not None else 1
    owned = sched is None or tile_split(vectors, sched.parallel_axis)
    a = m + 2
    th, tw = wmath.tile_counts(spec, m)
    problem = gemm_problem(spec, m, vectors)
    per_vector = f"{lanes} channels per vector" if vectors == "channels" else f"{lanes} tiles per vector"
    written = "written as rows of V" if vectors == "channels" else "written as packed B panels"
    return (
        TileLevel("FILTER", f"U = G g G^T: {a}x{a} per (K={spec.k}, C={spec.c}) pair, in double",
                  "once per weight tensor (pre-pack entry point)", "not charged: weights are pre-packed"),
        TileLevel("INPUT", f"V = BT d BT^T: {th}x{tw} tiles of {a}x{a}, {per_vector}",
                  f"{stages.input_s * 1e3:.3f} ms", f"fused with zero padding; {written}"),
        *(_stage_level(lv, sched, grown, spec, problem.m, kc_why) for lv in gemm_levels if lv.level != "CORES"),
        TileLevel("GEMM CORES", f"{threads} thread(s), split over {'tiles' if owned else 'output channels'}",
                  "each thread owns its tiles through all stages, no barriers" if owned
                  else "barriers between the stages; every thread reads all of V",
                  "single thread requested" if threads == 1 else
                  f"the faster predicted split (a split over output channels must win by {K_SPLIT_MARGIN:.0%})"),
        TileLevel("GEMMS", f"{a * a} GEMMs M={problem.m} N={problem.n} K={spec.c}", f"{stages.gemm_s * 1e3:.3f} ms",
                  f"the GEMM schedule and vector axis whose whole stage is fastest (vectors over {vectors}); "
                  f"U ({a * a}x{spec.k}x{spec.c}) lives in {stages.weights_level}"),
        TileLevel("OUTPUT", f"Y = AT M AT^T: {m}x{m} outputs per tile + bias, activation",
                  f"{stages.output_s * 1e3:.3f} ms", "written straight into the output (ragged tiles cropped)"),
    )


# Register tiles the stage model prices alike are not alike on the machine. Where the stage is bound
# by memory or the transforms, a tile and the same tile one vector narrower get the same time (the
# micro-kernel sustains the FMA rate either way), and the ranking kept the wider, the matmul
# ranking's first. On the Zen 4 VM (sessions 64-65) the narrower one (14x16 for 14x32, the
# regret.py neighbour 'nr-16') ran faster in 53 of the 63 one-thread rows where the model tied them
# (chosen / narrower 1.020-1.037 geomean per run, up to 1.16: yolo_52, vgg_2) and in 24 of 32 at two
# threads (1.008 and 1.038; vgg_7 at two threads the other way, 0.86)
# (benchmarks/regret_neighbours.py --neighbour nr-16 --ties-only: regret_neighbours_nr16_zen4_s65.json).
# One vector at a time, while the model still ties them: with one step, yolo_26 went 9x48 -> 9x32 and
# 9x16, tied with 9x32, ran 7-10% faster in both 1-thread runs (regret_winograd_zen4_1t_s65_narrower*.json).
# Measured on AVX-512 only: the other ISAs keep the wider tile. And only with KC of 32 or more (the
# shallowest slice of those rows: vgg_1 and vgg_2, KC 32): with 16 input channels (KC 16: 16 k steps per
# micro-kernel call, whose C tile loads and stores then weigh) 16 -> 40 channels at 14x14, F(2,3), two
# threads, narrowed to 5x16 ran 17-29% slower than 5x48 in three runs (15.2-18.2 against 12.0-14.8 us,
# cold and hot; 5x48 and 5x64 alike; winograd_variants_conv_w14_zen4_t2_s66*.json), and at one thread
# alike hot, 9% slower cold (..._t1_s66.json). U-Net's 16-channel layers (14x16 or 14x32) ran within 5%
# either way (winograd_variants_unet_k0*_s66.json).
TIE_TOLERANCE = 1e-6
NARROWER_ON_TIE_ISAS = ("avx512",)
NARROWER_ON_TIE_MIN_KC = 32
NARROWER_ON_TIE = ("one vector narrower than the ranking's tile: the stage model prices the two alike, and the "
                   "narrower ran faster on the AVX-512 host where they were timed (narrower_on_tie)")

# Why a Winograd GEMM stage's KC is not the matmul growth's L1 fit (the explanation's GEMM L1 level)
STREAMED_IN_ONE_SLICE = "U larger than the shared cache: the whole reduction in one slice (streamed_in_one_slice)"
DEEPER_SLICES = ("deeper slices predicted faster for the whole stage: fewer passes over the tiles' C, fewer "
                 "restarts of the streams of U and V (deeper_slices)")


def _stage_level(level: TileLevel, sched: Optional[GemmSchedule], grown: Optional[GemmSchedule],
                 spec: Conv2dSpec, rows: int, kc_why: str) -> TileLevel:
    """A GEMM level of the explanation as the Winograd stage runs it. The levels come from the
    matmul candidate (grown); where the stage cut its rows (rows_within) or changed its KC
    (kc_why), the REG, L1, L2 and L3 levels are restated with the stage's schedule."""
    same = TileLevel(f"GEMM {level.level}", level.tile, level.usage, level.decided_by)
    if sched is None or grown is None:
        return same
    g = sched
    if level.level == "REG" and g.mr != grown.mr:
        return TileLevel("GEMM REG", f"mr={g.mr} x nr={g.nr} (cut from {grown.mr} rows)",
                         f"{g.mr} of the {grown.mr}x{grown.nr} tile's accumulator rows",
                         f"the GEMM has {rows} rows: a taller tile never runs its full micro-kernel (rows_within)"
                         + (f"; {NARROWER_ON_TIE}" if g.nr != grown.nr else ""))
    if level.level == "REG" and g.nr != grown.nr:
        return TileLevel("GEMM REG", f"mr={g.mr} x nr={g.nr} (narrowed from {grown.nr} columns)",
                         f"{g.mr}x{g.nr} accumulators", NARROWER_ON_TIE)
    if g.kc == grown.kc or level.level not in ("L1", "L2", "L3"):
        return same
    if level.level == "L1":
        slices = math.ceil(spec.c / g.kc)
        return TileLevel("GEMM L1", f"kc={g.kc}: B micro-panel {g.kc}x{g.nr} + A micro-panel {g.mr}x{g.kc}",
                         f"{slices} slice(s) of C={spec.c} (the growth's L1 fit: kc={grown.kc})", kc_why)
    if level.level == "L2":
        return TileLevel("GEMM L2", f"mc={g.mc}: {'packed ' if g.a_pack == 'packed' else ''}A block {g.mc}x{g.kc}",
                         f"{FLOAT_BYTES * g.mc * g.kc / 1024:.1f} KiB", level.decided_by)
    return TileLevel("GEMM L3", f"nc={g.nc}: packed B panel {g.kc}x{g.nc}",
                     f"{FLOAT_BYTES * g.kc * g.nc / 1024:.1f} KiB", level.decided_by)


# ---------------------------------------------------------------------------------------------
# Validation and render context (codegen.py calls these for lowering 'winograd')
# ---------------------------------------------------------------------------------------------

def validate(plan: CpuKernelPlan) -> None:
    """Raise OperatorError (one line) if the Winograd plan cannot be rendered."""
    why = wmath.not_applicable(plan.spec)
    if why:
        raise OperatorError(f"plan lowering 'winograd': {why}")
    if plan.winograd_m not in wmath.TILE_SIZES:
        raise OperatorError(f"plan winograd_m={plan.winograd_m} must be one of {wmath.TILE_SIZES}")
    g = plan.gemm
    if g is None:
        raise OperatorError("plan lowering 'winograd' needs a GemmSchedule for its GEMM stage (plan.gemm is None)")
    for name in ("mr", "nr", "k_unroll", "kc", "mc", "nc", "threads"):
        if getattr(g, name) < 1:
            raise OperatorError(f"gemm schedule {name}={getattr(g, name)} must be >= 1")
    if g.nr % plan.vector_lanes or g.mc % g.mr or g.nc % g.nr:
        raise OperatorError(f"gemm schedule nr={g.nr}, mc={g.mc}, nc={g.nc} must be multiples of the "
                            f"{plan.vector_lanes} lanes, mr={g.mr} and nr={g.nr}")
    if plan.winograd_vectors not in VECTOR_AXES:
        raise OperatorError(f"plan winograd_vectors '{plan.winograd_vectors}' must be one of {', '.join(VECTOR_AXES)}")
    a_pack = "direct" if plan.winograd_vectors == "channels" else "packed"
    if (g.a_pack, g.c_store, g.stage_copy) != (a_pack, "direct", "none"):
        raise OperatorError(f"the winograd GEMM stage with vectors over {plan.winograd_vectors} reads A "
                            f"{'in place' if a_pack == 'direct' else 'packed'}, stores C directly and stages nothing "
                            f"(a_pack='{a_pack}', c_store='direct', stage_copy='none'), got {g.a_pack!r}, "
                            f"{g.c_store!r}, {g.stage_copy!r}")
    if g.loop_order not in LOOP_ORDERS or g.ukernel not in UKERNELS:
        raise OperatorError(f"gemm schedule loop_order '{g.loop_order}' / ukernel '{g.ukernel}' not known")
    if g.parallel_axis not in ("n", "m"):
        raise OperatorError(f"gemm schedule parallel_axis '{g.parallel_axis}' must be 'n' or 'm'")
    if g.prefetch_next_panel_lines and (plan.winograd_vectors != "channels" or g.loop_order != "jr_ir"
                                        or g.prefetch_next_panel_lines < 0):
        raise OperatorError(f"gemm schedule prefetch_next_panel_lines={g.prefetch_next_panel_lines}: the winograd "
                            f"GEMMs prefetch the next panel of U with vectors over channels in the jr_ir order only")
    if g.ukernel != "intrinsics" and plan.winograd_vectors == "channels" and plan.isa not in x86_asm.DIALECTS:
        raise OperatorError(f"gemm schedule ukernel '{g.ukernel}' reads packed A; the winograd GEMMs with vectors "
                            f"over channels read V in place (ukernel 'intrinsics')")
    if g.ukernel != "intrinsics" and plan.isa not in ("neon",) + x86_asm.DIALECTS:
        raise OperatorError(f"gemm schedule ukernel '{g.ukernel}' needs isa neon, "
                            f"{' or '.join(x86_asm.DIALECTS)} (isa {plan.isa})")
    if g.mr > 64 or g.nr // plan.vector_lanes > 16:
        raise OperatorError(f"gemm register tile {g.mr}x{g.nr} is too large to unroll")


def _terms(row) -> list[dict]:
    """The nonzero entries of one transform row as the template spells them."""
    out = []
    for index, x in enumerate(row):
        if x == 0:
            continue
        kind = "add" if x == 1 else ("sub" if x == -1 else "fma")
        out.append({"index": index, "kind": kind, "literal": f"{float(x)!r}f"})
    return out


def _point_text(p: Fraction) -> str:
    return str(p.numerator) if p.denominator == 1 else f"{p.numerator}/{p.denominator}"


# The stages a Winograd kernel runs (the XFC_WINO_STAGES bits of templates/cpu/winograd*.c.j2):
# all of them, unless a timing build asks for fewer (benchmarks/winograd_stages.py).
STAGE_BITS = {"whole": 7, "input": 1, "gemms": 2, "output": 4}


def stage_only_source(source: str, stage: str) -> str:
    """A rendered Winograd kernel's source running only `stage` (a STAGE_BITS key). Its output is
    not the convolution unless the stage is 'whole': for timing one stage, never for use."""
    if stage not in STAGE_BITS:
        raise ValueError(f"unknown Winograd stage '{stage}' (one of {', '.join(STAGE_BITS)})")
    return source if stage == "whole" else f"#define XFC_WINO_STAGES {STAGE_BITS[stage]}\n" + source


def plane_floats(floats: int) -> int:
    """The stride between two of the a^2 planes (one per xi) of V or of the GEMM output: floats
    rounded up to whole cache lines, an odd number of them. A tile's input transform stores one
    vector into every plane and the output transform loads one from every plane; planes a
    multiple of 4 KiB apart share one L1 set, and 36 or 64 of them overflow its ways. On the
    AVX-512 host, 256 channels at 14x14, F(4,3) (16 tiles, V planes 16 KiB apart), the input
    transform ran 2.2x its estimate before the planes were padded. With an odd number of lines
    between them, the planes' lines at one offset fall in distinct sets (up to 64 planes)."""
    lines = math.ceil(floats / CACHE_LINE_FLOATS)
    return (lines | 1) * CACHE_LINE_FLOATS


def render_view(plan: CpuKernelPlan) -> tuple[str, int, int, int]:
    """(template, GEMM rows, GEMM columns, A's row stride) of a Winograd plan, for codegen's
    micro-kernel variants: over channels A is V read in place, rows C rounded up to whole vectors
    apart (the c_vectors of context)."""
    problem = gemm_problem(plan.spec, plan.winograd_m, plan.winograd_vectors)
    if plan.winograd_vectors == "channels":
        return "cpu/winograd_cv.c.j2", problem.m, problem.n, round_up(plan.spec.c, plan.vector_lanes)
    return "cpu/winograd.c.j2", problem.m, problem.n, problem.k


def context(plan: CpuKernelPlan, common: dict, variants: list[dict]) -> dict:
    """The render context of templates/cpu/winograd.c.j2 (common: codegen's shared keys;
    variants: codegen.micro_kernel_variants of the GEMM stage)."""
    spec, g, m = plan.spec, plan.gemm, plan.winograd_m
    t = wmath.transforms(m)
    th, tw = wmath.tile_counts(spec, m)
    lanes = plan.vector_lanes
    ctx = dict(common)
    ctx.update({
        "wm": m, "wa": t.alpha, "k_out": spec.k, "batch": spec.n, "tiles_h": th, "tiles_w": tw, "tiles": th * tw,
        "conv": {"c": spec.c, "h": spec.h, "w": spec.w, "oh": spec.out_h, "ow": spec.out_w,
                 "pt": spec.pad_top, "pl": spec.pad_left},
        "stage_cols": round_up(tw, lanes) + lanes,
        # ragged groups of the input transform (a short tile row, tiles straddling two V panels):
        # lane-range stores straight from the register where the dialect has them, else scalar
        "lane_store": plan.isa if plan.isa in ("avx512", "avx2", "neon") else "",
        "points_text": ", ".join(_point_text(p) for p in t.points) + " and infinity",
        "bt_terms": [_terms(row) for row in t.bt_exact], "at_terms": [_terms(row) for row in t.at_exact],
        "g_rows": [[repr(float(x)) for x in row] for row in t.g_exact],
        "mr": g.mr, "nr": g.nr, "ku": g.k_unroll, "kc": g.kc, "mc": g.mc, "nc": g.nc,
        "m_padded": round_up(spec.k, g.mr),
        "n_padded": round_up(spec.k if plan.winograd_vectors == "channels" else th * tw, g.nr),
        "parallel_axis": g.parallel_axis, "loop_order": g.loop_order,
        "tile_split": tile_split(plan.winograd_vectors, g.parallel_axis),
        # vectors over channels (winograd_cv.c.j2): the rows of V and M, padded to whole vectors
        "c_vectors": round_up(spec.c, lanes), "k_vectors": round_up(spec.k, lanes),
        # the strides between the a^2 planes of V and M (plane_floats)
        "v_plane_floats": plane_floats(th * tw * round_up(spec.c, lanes) if plan.winograd_vectors == "channels"
                                       else round_up(th * tw, g.nr) * spec.c),
        "m_plane_floats": plane_floats(th * tw * round_up(spec.k, lanes)
                                       if plan.winograd_vectors == "channels" else spec.k * th * tw),
        # the micro-kernel macro's keys (gemm_ukernel.j2): C direct, epilogue never on
        "variants": variants, "a_pack": g.a_pack, "prefetch_c": g.prefetch_c,
        "prefetch_b_distance": g.prefetch_b_distance, "prefetch_next_panel_lines": g.prefetch_next_panel_lines,
        "elem_bytes": isa_row(plan.isa).elem_bytes, "transposed": False, "vector_transpose": False,
        "bias_axis": "m",
    })
    return ctx


def describe_choice(chosen: str, winograd_s: Optional[float], direct_s: float, m: Optional[int],
                    direct_summary: str, excluded: str = "") -> str:
    """One line: which lowering won and by how much (explain and reports)."""
    if winograd_s is None:
        return f"lowering choice: {chosen} ({excluded or 'winograd not considered'})"
    ratio = direct_s / winograd_s
    if chosen == LOWERING:
        return (f"lowering choice: winograd m={m} predicted {winograd_s * 1e3:.3f} ms vs best direct plan "
                f"({direct_summary}) {direct_s * 1e3:.3f} ms: {ratio:.2f}x faster")
    return (f"lowering choice: {chosen} predicted {direct_s * 1e3:.3f} ms ({direct_summary}) vs best winograd "
            f"m={m} {winograd_s * 1e3:.3f} ms: winograd {1 / ratio:.2f}x the time" + (f"; {excluded}" if excluded else ""))


# ---------------------------------------------------------------------------------------------
# Synthesis (synth.synthesize_cpu calls this for conv2d unless the caller asked for 'direct')
# ---------------------------------------------------------------------------------------------

def synthesize_winograd(spec: Conv2dSpec, hw, cluster, threads: int, isa: str, evaluator,
                        constants: CostConstants, header_common: list[str], ranked_gemm_candidates,
                        only_m: Optional[int] = None, only_vectors: Optional[str] = None,
                        weights_from_memory: bool = False) -> list:
    """The best Winograd program per admissible tile size: a list of (m, CpuSynthesis) sorted by
    predicted time (then m). Empty when no tile size is admissible for the input channels.
    ranked_gemm_candidates: synth.ranked_gemm_candidates (passed in: synth imports this module);
    only_m: consider this tile size only (OperatorError when it is not admissible); only_vectors:
    this vector axis only (VECTOR_AXES)."""
    if only_vectors is not None and only_vectors not in VECTOR_AXES:
        raise OperatorError(f"winograd vectors '{only_vectors}' must be one of {', '.join(VECTOR_AXES)}")
    axes = (only_vectors,) if only_vectors else vector_axes(isa)
    constants = constants.for_winograd()   # the GEMM candidates ranked at the Winograd plans' cache rates
    core = cluster.core
    lanes = isa_row(isa).synthesis_lanes(core)
    sizes = wmath.admissible_tile_sizes(spec.c)
    if only_m is not None:
        if only_m not in sizes:
            raise OperatorError(f"winograd tile size m={only_m} is not admissible at C={spec.c} (admissible: "
                                f"{', '.join(map(str, sizes)) or 'none'}; xfc/ops/winograd.py RELATIVE_TOLERANCE)")
        sizes = (only_m,)
    out = []

    def stages_for(trial: GemmSchedule, axis: str, memo: dict) -> WinogradStages:
        # One GEMM estimate per schedule: the candidates' split and slice variants share many, and
        # on one thread the split axis does not change it (no imbalance, nothing divided).
        key = (axis, replace(trial, parallel_axis="n") if threads == 1 and trial.parallel_axis != "n" else trial)
        if key not in memo:
            memo[key] = winograd_gemm(spec, m, hw, cluster, trial, lanes, isa, constants, evaluator, axis)
        return plan_stages(spec, m, hw, cluster, trial, lanes, isa, constants, evaluator, axis, gemm=memo[key],
                           weights_from_memory=weights_from_memory)

    for m in sizes:
        gemms: dict = {}
        # The GEMM schedule is the candidate whose whole Winograd stage is fastest (the first in
        # the matmul ranking on a tie), over both vector axes, not the matmul ranking's first: the
        # stage charges the column tail on every ISA and U once per call (plan_stages), which the
        # ranking does not.
        best, sched, stages, vectors, key = None, None, None, None, math.inf
        for axis in axes:
            problem = gemm_problem(spec, m, axis)
            ranked = ranked_gemm_candidates(problem, hw, cluster, threads, isa, evaluator, constants)
            for candidate in ranked[:STAGE_CANDIDATES]:
                grown = winograd_schedule(candidate.sched, axis, isa)
                base = rows_within(streamed_in_one_slice(grown, spec, m, hw, isa, axis), problem.m, isa, core)
                for trial in split_variants(base, spec, m, cluster, axis):
                    trial_stages = stages_for(trial, axis, gemms)
                    trial_key = trial_stages.total_s * split_penalty(trial, axis)
                    if stages is None or trial_key < key * (1 - 1e-9):
                        best, sched, stages, vectors, key = candidate, trial, trial_stages, axis, trial_key
        kc_why = STREAMED_IN_ONE_SLICE
        # Then the winner's reduction slices deepened (deeper_slices), kept where the stage is
        # predicted faster: the matmul growth sizes KC to L1 and never weighs deeper slices.
        for trial in deeper_slices(sched, spec, isa):
            trial_stages = stages_for(trial, vectors, gemms)
            trial_key = trial_stages.total_s * split_penalty(trial, vectors)
            if trial_key < key * (1 - 1e-9):
                sched, stages, key, kc_why = trial, trial_stages, trial_key, DEEPER_SLICES
        problem = gemm_problem(spec, m, vectors)
        narrowed = True
        while narrowed:   # one vector at a time, while the model still ties them
            sched, key, narrowed = narrower_on_tie(
                sched, key, lambda trial: stages_for(trial, vectors, gemms).total_s * split_penalty(trial, vectors),
                isa, core, vectors, problem.n)
            if narrowed:
                stages = stages_for(sched, vectors, gemms)
        th, tw = wmath.tile_counts(spec, m)
        a = m + 2
        lines = header_common + [
            f"lowered: winograd F({m}x{m},3x3): {a * a} GEMMs M={problem.m} N={problem.n} K={spec.c} "
            f"(vectors over {vectors})",
            f"tiles: m={m} mr={sched.mr} nr={sched.nr} k_unroll={sched.k_unroll} kc={sched.kc} mc={sched.mc} "
            f"nc={sched.nc} threads={sched.threads} split={sched.parallel_axis} A={sched.a_pack}",
            f"isa: {isa}"]
        plan = make_plan(spec, m, isa, lanes, sched, f"xfc_{spec.name}", tuple(lines), hardware_name=hw.name,
                         gcc_march=core.gcc_march, qemu_cpu=core.qemu_cpu, vectors=vectors)
        estimate = winograd_estimate(spec, stages)
        out.append((m, CpuSynthesis(spec=spec, hardware=hw.name, cluster=cluster, plan=plan,
                                    levels=stage_levels(spec, m, stages, best.levels, lanes, vectors, sched,
                                                        best.sched, kc_why),
                                    estimate=estimate, gemm_shape=tuple(gemm_view_of(problem)),
                                    micro_tile_source=best.score.source)))
    out.sort(key=lambda entry: (entry[1].estimate.predicted_s, entry[0]))
    return out


def gemm_view_of(problem: MatmulSpec) -> tuple[int, int, int]:
    return (problem.m, problem.n, problem.k)


def choose(spec: Conv2dSpec, direct, winograds: list, lowering: str):
    """The synthesis to return and the one-line reason (lowering 'auto' keeps the faster;
    'winograd' the best Winograd plan; the loser's summary goes to the runners-up)."""
    direct_summary = f"{direct.plan.lowering} {direct.tiles_line.split(' threads')[0]}"
    excluded = [m for m in wmath.TILE_SIZES if m not in wmath.admissible_tile_sizes(spec.c)]
    excluded_text = (f"m={','.join(map(str, excluded))} excluded: worst-case error bound above "
                     f"{wmath.RELATIVE_TOLERANCE:g} at C={spec.c}") if excluded else ""
    if not winograds:
        line = describe_choice(direct.plan.lowering, None, direct.estimate.predicted_s, None, direct_summary,
                               excluded_text)
        return replace(direct, decision=line)
    m, wbest = winograds[0]
    take_winograd = lowering == LOWERING or wbest.estimate.predicted_s < direct.estimate.predicted_s
    chosen = LOWERING if take_winograd else direct.plan.lowering
    line = describe_choice(chosen, wbest.estimate.predicted_s, direct.estimate.predicted_s, m, direct_summary,
                           excluded_text if take_winograd is False else "")
    others = tuple((f"winograd m={om}", s.estimate.predicted_s) for om, s in winograds[1:])
    if take_winograd:
        if excluded_text:
            line += f"; {excluded_text}"
        alternatives = ((f"direct {direct_summary}", direct.estimate.predicted_s),) + others
        return replace(wbest, alternatives=alternatives, decision=line)
    alternatives = ((f"winograd m={m}", wbest.estimate.predicted_s),) + others + direct.alternatives
    return replace(direct, alternatives=alternatives, decision=line)
