"""int8 host kernel planning: which dialect, which register tile, how many threads.

Pure: (spec, quantization, hardware, cluster, threads, host flags) -> Int8Plan. The fp32 synthesizer
(synth.py) is not involved, so fp32 plans cannot change because of anything here.

Dialects (templates/cpu/int8_dialect.h.j2):
  vnni     AVX-512 VNNI vpdpbusd: one instruction = 16 lanes x 4 u8*s8 products into int32.
  avx2     vpmaddwd on int16 even/odd halves: 2 vpmaddwd + 2 vpaddd per 8 lanes x 4 products; the
           weights pre-packed as int16 pairs, the activations widened in the loop. Where every weight
           is within +-64 (QuantParams.narrow_weights: a model quantized with reduce_range),
           vpmaddubsw + vpmaddwd by ones + vpaddd instead (its int16 pair sums cannot saturate then).
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
from .decide import CACHE_LINE_BYTES, NEXT_PANEL_PREFETCH_TILES
from .dw_channels import CHANNEL_GROUP, channels_buffers
from .int8_plan import Int8Synthesis, Int8Plan, widened_to_int16  # noqa: F401  (the plan type lives in qplan.py, shared with qarm.py)

MAX_MR = 16
MAX_NV = 4
# u8 x s8 dot products (vpdpbusd, vpmaddwd on zero-extended bytes): int8 activations are made unsigned
# by x ^ 0x80 = x + 128 (QuantParams.shift), uint8 ones are used as they are.
DEPTHWISE_TARGET_PRAGMA = {"vnni": "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni", "avx2": "avx2,fma", "generic": ""}
VBMI_FLAG = "avx512vbmi"                # vpermb: the 'channels' depthwise layout builds its quads with it
DEPTHWISE_CHANNELS_PRAGMA = DEPTHWISE_TARGET_PRAGMA["vnni"] + ",avx512vbmi"
# Depthwise on x86 SIMD (layout 'tap_pairs', templates/cpu/int8_depthwise.c.j2): the vector widths each
# dialect may use (int32 lanes: 8 = ymm, 16 = zmm), and the issue model's per-vector counts.
DEPTHWISE_LANES = {"vnni": (8, 16), "avx2": (8,)}
DW_MAX_ROWS = 4
DW_MAX_VECTORS = 4
DW_EPILOGUE_UOPS = {8: 11, 16: 7}       # requantize + narrow + store one accumulator vector (xfc_store)
DW_STAGE_UOPS = {"direct": 5, "pairs": 12, "gather": 64}   # per 16 input columns of a staged row
DW_FIXED_REGISTERS = 3                  # bias, multiplier, one temporary
# Depthwise 'channels' layout (vnni with avx512_vbmi, dilation_w 1: int8_depthwise.c.j2): 16 channels in the
# lanes, so a vector is full on any plane; the price is moving every plane in and out of that layout.
# Instructions per 64-pixel chunk of 16 channels: the transpose in (16 loads, 64 unpacks, 64 stores of
# 16 bytes; 16 XORs more for int8 activations) and out (16 loads, 64 unpacks, one masked store per
# channel); per quad-plane column of an input row: load, vpermb, store; per output pixel: R x SQ
# vpdpbusd (their loads folded) and the requantization (DW_EPILOGUE_UOPS[16]) with its store.
DW_CHANNELS_IN_CHUNK_UOPS = 144
DW_CHANNELS_OUT_CHUNK_UOPS = 96
DW_CHANNELS_Q_COLUMN_UOPS = 3
DEPTHWISE_LAYOUTS = ("plane", "tap_pairs", "channels")     # Int8Plan.depthwise_layout
# im2col staging (int8_gemm.c.j2 stage_input): 4 bytes (one pixel of 4 channels) gathered and stored
# per iteration with a bounds check; 1 byte per cycle is what benchmarks/int8_conv_layouts.py's strided layers
# rank right with on a Zen 4 host (ranking only: a 28x28 stride-2 layer is a near tie)
STAGE_BYTES_PER_CYCLE = 1.0
# the 'channels' layout's row gather (int8_gemm.c.j2 pack_rows): a pixel's 4-channel k group is 4 adjacent
# bytes of the staged input, copied as one word: about a word per cycle (not fitted; with it the model
# ranks the layouts of benchmarks/int8_conv_layouts.py as a Zen 4 host ran them, docs/int8.md)
CHANNELS_GATHER_BYTES_PER_CYCLE = 4.0
# ... and its epilogue stores the outputs transposed into the channels' NCHW planes: the generic dialect
# a byte per cycle (with a short reduction, e.g. a 1x1 conv of 96 channels, that is a third of the
# kernel); the x86 SIMD dialects transpose 16 x 16 byte blocks in registers, about 4 bytes per cycle
CHANNELS_STORE_BYTES_PER_CYCLE = {"vnni": 4.0, "avx2": 4.0, "generic": 1.0}
# The issue of a GEMM k step (group_cycles): instructions per dot product where the step is known
# instruction by instruction (vnni: one vpdpbusd; + one broadcast per row, one load per column vector and
# the loop's own), over the core's decode width; the other dialects keep the dots-or-loads bound.
ISSUE_UOPS_PER_DOT = {"vnni": 1}
LOOP_UOPS_PER_GROUP = 2
COLUMN_LAYOUTS = ("rows", "flat", "im2col", "channels")   # Int8Plan.column_layout (conv2d)
CHANNELS_ROWS = ("gathered", "in_place")   # the 'channels' layout's row operand (Int8Plan.channels_rows_in_place)
# Next-panel prefetch (Int8Plan.prefetch_every_groups), the fp32 GEMMs' rule (decide.next_panel_prefetch_lines)
# for the int8 GEMMs whose weights are the column panels: in a network a layer's weights come from memory,
# and the first row tile of each panel waited for it alone. Each of the panel's row tiles prefetches an
# equal share of the next panel, spread evenly over its k groups. ResNet-18's int8 7x7 3x3 convs (7 row
# tiles of 7 pixels per panel) as steps of the network 256-258 -> 248-250 us, its 14 -> 7 stride-2 conv
# 137 -> 128, the whole network x1.013; MobileNetV2 (small weights) unchanged (benchmarks/packed_panel.py
# --rule int8_next_panel_prefetch --quantize qoperator, int8_next_panel_prefetch_zen5.json). x86 dialects
# only (the ARM cores were not timed).
INT8_PREFETCH_DIALECTS = ("vnni", "avx2")
FLAT_PADDINGS = ("shared", "both")      # flat_row_width: one padding run between rows, or both staged


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
    conv2d tiles each output row separately: OH runs of OW pixels); 4-deep k groups; the M rows as
    `m_runs` equal runs that row tiles do not cross (the 'channels' layout read in place: one run per
    output row)."""
    m: int
    run: int
    column_rows: int
    groups: int
    m_runs: int = 1
    tile_epilogue: bool = True    # each tile requantizes and stores its own output vectors (charged per tile,
                                  # tile_epilogue_cycles); False: the 'channels' layout, whose transposed
                                  # store is charged with its staging (channels_staging_seconds)

    def row_tiles(self, mr: int) -> int:
        return self.m_runs * math.ceil(self.m // self.m_runs / mr)


def gemm_shape(spec: OperatorSpec) -> GemmShape:
    m, n, k = gemm_view(spec)
    if isinstance(spec, Conv2dSpec):     # k groups: 4 input channels of one tap (int8_gemm.c.j2)
        return GemmShape(m, spec.out_w, spec.out_h, spec.r * spec.s * math.ceil(spec.c / 4))
    return GemmShape(m, n, 1, math.ceil(k / 4))


def flat_shape(spec: Conv2dSpec, padding: str = "shared") -> Optional[GemmShape]:
    """The 'flat' column layout of a stride-1 conv2d (Int8Plan.column_layout): the staged input's
    padded rows (flat_row_width pixels) read as one run, output rows one after another, so a vector
    does not stop at the end of a short output row; the padding columns in between are computed and
    dropped (waste counted in the run). Threads split (column tile, row block) pairs. None: strided."""
    if spec.stride_h != 1 or spec.stride_w != 1:
        return None
    return GemmShape(spec.k, spec.out_h * flat_row_width(spec, padding), 1,
                     spec.r * spec.s * math.ceil(spec.c / 4))


def im2col_shape(spec: Conv2dSpec) -> Optional[GemmShape]:
    """The 'im2col' column layout of a strided conv2d (Int8Plan.column_layout): every tap's input
    gathered per output pixel when the input is staged, so the columns are the OH x OW outputs as
    one run (no lane wasted at the end of a short output row) at the cost of staging R x S times the
    bytes (im2col_staging_seconds). None: stride 1 (the flat layout covers it without the copies)."""
    if spec.stride_h == 1 and spec.stride_w == 1:
        return None
    return GemmShape(spec.k, spec.out_h * spec.out_w, 1, spec.r * spec.s * math.ceil(spec.c / 4))


def im2col_staging_seconds(spec: Conv2dSpec, cluster: CpuCluster, threads: int = 1) -> float:
    """Writing the im2col staging: R x S x C (rounded up to 4) x OH x OW bytes at STAGE_BYTES_PER_CYCLE,
    split across the kernel's threads (per tap and channel group)."""
    staged = spec.r * spec.s * math.ceil(spec.c / 4) * 4 * spec.out_h * spec.out_w
    return staged / STAGE_BYTES_PER_CYCLE / (cluster.clock_ghz * 1e9) / max(1, threads)


def channels_shape(spec: Conv2dSpec) -> GemmShape:
    """The 'channels' column layout of a conv2d (Int8Plan.column_layout): the GEMM turned around, the
    output pixels as rows (gathered per call from the staged input) and the output channels in the
    vector lanes, for layers with few output pixels and many channels (a 7x7 stage) whose pixels fill
    vectors badly. The
    outputs are stored transposed into the NCHW planes. Threads split column tiles (channel blocks)."""
    return GemmShape(spec.out_h * spec.out_w, spec.k, 1, spec.r * spec.s * math.ceil(spec.c / 4), tile_epilogue=False)


def channels_in_place_shape(spec: Conv2dSpec) -> GemmShape:
    """The 'channels' layout with its rows read in place (Int8Plan.channels_rows_in_place): a row tile's
    pixels are consecutive pixels of one output row, so in the staged input (the padded image, a pixel's
    4 channels side by side) the k group of each is 4 x stride_w bytes after the previous one, and the
    kernel broadcasts them from there: no gather. Tiles do not cross output rows (one M run per output
    row, the last tile of a row partial: its rows past the row are computed and dropped), except where
    the staged rows follow one another with no gap (a 1x1 stride-1 conv: the whole image is one run)."""
    turned = channels_shape(spec)
    linear = spec.s == 1 and spec.stride_w == 1 and spec.stride_h == 1
    return GemmShape(turned.m, turned.run, turned.column_rows, turned.groups, 1 if linear else spec.out_h,
                     tile_epilogue=False)


def channels_staging_seconds(spec: Conv2dSpec, mr: int, cluster: CpuCluster, threads: int = 1,
                             dialect: str = "generic", gathered: bool = True) -> float:
    """Gathering the row operand per call (gathered): R x S x C (rounded up to 4) bytes per output pixel
    (rounded up to MR), copied from the staged input a 4-byte k group at a time
    (CHANNELS_GATHER_BYTES_PER_CYCLE), and the outputs stored transposed (CHANNELS_STORE_BYTES_PER_CYCLE of
    the dialect), split across the kernel's threads (per row block). Read in place (not gathered): the
    stores alone. Staging the input itself is not charged: every conv layout stages it."""
    blocks = math.ceil(spec.out_h * spec.out_w / mr)
    staged = spec.r * spec.s * math.ceil(spec.c / 4) * 4 * blocks * mr if gathered else 0
    stored = spec.out_h * spec.out_w * spec.k            # the outputs, transposed into the NCHW planes
    return ((staged / CHANNELS_GATHER_BYTES_PER_CYCLE + stored / CHANNELS_STORE_BYTES_PER_CYCLE[dialect])
            / (cluster.clock_ghz * 1e9) / max(1, min(threads, blocks)))


def flat_row_width(spec: Conv2dSpec, padding: str = "shared") -> int:
    """Pixels of a staged row in the flat layout (stride 1): the input row and its wider side padding.
    The narrower side's padding is not staged ('shared'): a tap reading past a row's end lands in
    the next row's left padding, which holds the same zero point, so one padding run serves both
    sides (a 14-wide row with pads 1, 1 is staged 15 wide, not 16: fewer computed and dropped lanes).
    That holds while the output row fits the staged one (min(pad_left, pad_right) <= (S-1) dw, which
    the spec's padding limit implies; checked all the same); padding='both' stages both paddings."""
    both = spec.w + spec.pad_left + spec.pad_right
    shared = spec.w + max(spec.pad_left, spec.pad_right)
    return shared if padding == "shared" and spec.out_w <= shared else both


def group_cycles(dialect: str, core, mr: int, nv: int) -> float:
    """Cycles per 4-deep k group of an MR x NV tile: the dot products on the FMA ports, the loads
    (MR row broadcasts, NV column vectors), the accumulators' latency and, vnni, the issue of every
    instruction of the step (ISSUE_UOPS_PER_DOT) over the core's decode width: a 16x16 tile (16
    broadcasts per vector load) ran at a median 0.79 of its dots-or-loads time over 16 layer-layout
    pairs (benchmarks/int8_tile_model.py, int8_tile_model_zen5.json)."""
    dots = core.fma_per_cycle * DOT_RATE[dialect]
    cycles = max(mr * nv / dots, (mr + nv) / core.load_rules.vector_loads_per_cycle, float(core.fma_latency_cycles))
    if dialect in ISSUE_UOPS_PER_DOT:
        uops = mr * nv * ISSUE_UOPS_PER_DOT[dialect] + mr + nv + LOOP_UOPS_PER_GROUP
        cycles = max(cycles, uops / core.decode_width)
    return cycles


def tile_epilogue_cycles(dialect: str, core, mr: int, nv: int) -> float:
    """Cycles a tile spends after its k loop: every output vector requantized, narrowed and stored
    (DW_EPILOGUE_UOPS, the depthwise kernels' count for the same requantization) over the decode
    width. A 1x1 conv with 6 k groups per tile (24 -> 144 channels at 56x56) spends as long there as in
    its dot products ('flat' ran 0.51-0.57 of a model without it: int8_tile_model_zen5.json)."""
    lanes = INT8_LANES[dialect]
    if dialect not in ISSUE_UOPS_PER_DOT or lanes not in DW_EPILOGUE_UOPS:
        return 0.0
    return mr * nv * DW_EPILOGUE_UOPS[lanes] / core.decode_width


def _tile_seconds(shape: GemmShape, mr: int, nr: int, cycles: float, clock_hz: float, threads: int,
                  rows: int = 1, split_rows: bool = False, epilogue_cycles: float = 0.0) -> float:
    """nr columns per tile, as `rows` output rows of nr / rows columns each (conv2d). split_rows:
    threads split (column tile, row block) pairs, not column tiles alone (the flat layout).
    epilogue_cycles: per tile, where the shape's tiles store their own outputs (tile_epilogue)."""
    column_tiles = math.ceil(shape.column_rows / rows) * math.ceil(shape.run / (nr // rows))
    tiles = shape.row_tiles(mr) * column_tiles
    per_tile = shape.groups * cycles + (epilogue_cycles if shape.tile_epilogue else 0.0)
    return tiles * per_tile / clock_hz / max(1, min(threads, tiles if split_rows else column_tiles))


def _retimed(tile: Int8Tile, shape: GemmShape, dialect: str, cluster: CpuCluster, threads: int,
             split_rows: bool = False) -> Int8Tile:
    """A forced register tile (one output row per column tile) timed on another layout's GEMM shape."""
    return Int8Tile(tile.mr, tile.nv, tile.lanes, tile.cycles_per_group,
                    _tile_seconds(shape, tile.mr, tile.nr, tile.cycles_per_group, cluster.clock_ghz * 1e9, threads, 1,
                                  split_rows, tile_epilogue_cycles(dialect, cluster.core, tile.mr, tile.nv)))


def choose_tile(dialect: str, shape: GemmShape, cluster: CpuCluster, threads: int,
                split_rows: bool = False) -> tuple[Int8Tile, int]:
    """The register tile with the shortest modelled time, and how many tiles were scored."""
    core = cluster.core
    lanes = INT8_LANES[dialect]
    clock_hz = cluster.clock_ghz * 1e9
    best, key_best, scored = None, None, 0
    for nv in range(1, MAX_NV + 1):
        for mr in range(1, MAX_MR + 1):
            if int8_registers(dialect, mr, nv) > core.vector_registers:
                continue
            cycles = group_cycles(dialect, core, mr, nv)
            epilogue = tile_epilogue_cycles(dialect, core, mr, nv)
            for rows in [r for r in range(1, nv + 1) if nv % r == 0 and (r == 1 or shape.column_rows > 1)]:
                scored += 1
                seconds = _tile_seconds(shape, mr, nv * lanes, cycles, clock_hz, threads, rows, split_rows, epilogue)
                key = (round(seconds * 1e12), -mr * nv, mr, rows)
                if key_best is None or key < key_best:
                    best, key_best = Int8Tile(mr, nv, lanes, cycles, seconds, rows), key
    if best is None:
        raise OperatorError(f"no int8 register tile fits {core.vector_registers} vector registers")
    return best, scored


@dataclass(frozen=True)
class DepthwiseBlock:
    """A depthwise block: `rows` output rows x `vectors` vectors of `lanes` pixels; its modelled time."""
    lanes: int
    vectors: int
    rows: int
    cycles_per_plane: float
    seconds: float
    bound: str                     # what limits the busiest block: 'madd', 'loads', 'issue' or 'latency'
    weights_in_registers: bool


DW_STAGING_REASONS = {
    "pairs": "stride 1: the pairs (V[i], V[i + dw]) interleaved from two loads of V (vpunpck{{l,h}}wd)",
    "direct": "stride 2, dilation 1: the pair (V[2i], V[2i + 1]) is V itself, stored as it is",
    "gather": "stride {sw}, dilation {dw}: no vector shuffle forms the pairs, gathered element by element"}


def depthwise_staging(spec: DepthwiseSpec) -> tuple[str, str]:
    """How a staged row's tap pairs are built from the int16 row V, and why: the horizontal geometry
    decides ('pairs', 'direct' or 'gather': DW_STAGING_REASONS)."""
    if spec.stride_w == 1:
        mode = "pairs"
    elif spec.stride_w == 2 and spec.dilation_w == 1:
        mode = "direct"
    else:
        mode = "gather"
    return mode, DW_STAGING_REASONS[mode].format(sw=spec.stride_w, dw=spec.dilation_w)


def _dw_block_cycles(spec: DepthwiseSpec, rows: int, vectors: int, core, fused_madd: bool, lanes: int,
                     weights_in_registers: bool) -> tuple[float, str]:
    """One block's cycles: max(madd instructions / rate, loads / load rate, instructions / issue width,
    the dependent chain of one accumulator).
    Every staged row the block touches is loaded once per tap slot and vector; a load read by one
    madd is folded into it, one read by several costs an instruction of its own."""
    pairs = math.ceil(spec.s / 2)
    offsets = [t * spec.stride_h + r * spec.dilation_h for t in range(rows) for r in range(spec.r)]
    distinct = len(set(offsets))
    madds = rows * vectors * spec.r * pairs
    loads = distinct * pairs * vectors + (0 if weights_in_registers else spec.r * pairs)
    shared = sum(1 for o in set(offsets) if offsets.count(o) > 1) * pairs * vectors
    instructions = madds * (1 if fused_madd else 2) + shared + rows * vectors * DW_EPILOGUE_UOPS[lanes]
    madd_rate = core.fma_per_cycle                           # vpmaddwd / vpdpwssd on the FMA ports (assumed)
    load_rate = core.load_rules.vector_loads_per_cycle * (2 if lanes == 8 and core.vector_bits == 512 else 1)
    chain = spec.r * pairs * (core.fma_latency_cycles if fused_madd else 1)   # one accumulator's dependent adds
    terms = {"madd": madds / madd_rate, "loads": loads / load_rate, "issue": instructions / core.decode_width,
             "latency": float(chain)}
    bound = max(terms, key=terms.get)
    return terms[bound], bound


def depthwise_block(spec: DepthwiseSpec, dialect: str, cluster: CpuCluster, threads: int, lanes: int, vectors: int,
                    rows: int) -> Optional[DepthwiseBlock]:
    """The modelled time of one (lanes, vectors, rows) block shape, None when its accumulators do not
    fit the registers. Per plane: the staging of its rows plus every block of the row/column tiling
    (ragged blocks counted as computed: a partial vector costs a whole one); planes split over threads."""
    core = cluster.core
    pairs = math.ceil(spec.s / 2)
    accumulators = rows * vectors + vectors + DW_FIXED_REGISTERS
    if accumulators > core.vector_registers:
        return None
    in_regs = accumulators + spec.r * pairs <= core.vector_registers
    vecs_per_row = math.ceil(spec.out_w / lanes)
    col_blocks = [(vectors, vecs_per_row // vectors)] + ([(vecs_per_row % vectors, 1)]
                                                         if vecs_per_row % vectors else [])
    row_blocks = [(rows, spec.out_h // rows)] + ([(spec.out_h % rows, 1)] if spec.out_h % rows else [])
    plane = spec.h * math.ceil(spec.w / 16) * DW_STAGE_UOPS[depthwise_staging(spec)[0]] / core.decode_width
    worst = ("issue", 0.0)
    for nrows, rcount in row_blocks:
        for nvec, ccount in col_blocks:
            if nrows == 0 or nvec == 0 or rcount * ccount == 0:
                continue
            cycles, bound = _dw_block_cycles(spec, nrows, nvec, core, dialect == "vnni", lanes, in_regs)
            plane += cycles * rcount * ccount
            if cycles * rcount * ccount > worst[1]:
                worst = (bound, cycles * rcount * ccount)
    planes = spec.n * spec.c
    used = max(1, min(threads, planes))
    seconds = math.ceil(planes / used) * plane / (cluster.clock_ghz * 1e9)
    return DepthwiseBlock(lanes, vectors, rows, plane, seconds, worst[0], in_regs)


@dataclass(frozen=True)
class DepthwiseChannels:
    """The 'channels' depthwise layout's modelled time: per group of 16 channels of one image."""
    pixels_per_block: int
    cycles_per_group: float
    seconds: float
    bound: str                     # 'issue' or 'dots'
    working_set_bytes: int         # T, Q and O of one group (one thread's buffers)


def depthwise_channels_block(spec: DepthwiseSpec, cluster: CpuCluster, threads: int,
                             int8_activations: bool = False) -> Optional[DepthwiseChannels]:
    """The 'channels' layout's modelled time (DW_CHANNELS_* instruction counts over the decode width, or
    the vpdpbusd count over the FMA rate, whichever is longer), None where it does not apply
    (dilation_w != 1: a quad is 4 adjacent input columns). Output pixels per block: up to 8 of a row,
    enough independent accumulators to cover the dot product's latency at two per cycle. The model
    counts no cache misses: _plan_depthwise takes the layout only where its working set (T, Q, O)
    fits the core's L2."""
    if spec.dilation_w != 1:
        return None
    core = cluster.core
    quads = math.ceil(spec.s / 4)
    buffers = channels_buffers(spec, aarch64=False)
    in_rows = max(0, min(spec.h, buffers.q_rows - spec.pad_top))
    pixels = spec.out_h * spec.out_w
    dots = pixels * spec.r * quads
    uops = (buffers.in_chunks * (DW_CHANNELS_IN_CHUNK_UOPS + (16 if int8_activations else 0))
            + buffers.out_chunks * DW_CHANNELS_OUT_CHUNK_UOPS
            + in_rows * buffers.q_cols * DW_CHANNELS_Q_COLUMN_UOPS + dots
            + pixels * (DW_EPILOGUE_UOPS[CHANNEL_GROUP] + 1))
    terms = {"issue": uops / core.decode_width, "dots": dots / core.fma_per_cycle}
    bound = max(terms, key=terms.get)
    groups = spec.n * math.ceil(spec.c / CHANNEL_GROUP)
    used = max(1, min(threads, groups))
    seconds = math.ceil(groups / used) * terms[bound] / (cluster.clock_ghz * 1e9)
    return DepthwiseChannels(min(8, spec.out_w), terms[bound], seconds, bound, buffers.bytes)


def choose_depthwise_block(spec: DepthwiseSpec, dialect: str, cluster: CpuCluster,
                           threads: int) -> tuple[DepthwiseBlock, int]:
    """The (lanes, vectors, rows) block with the shortest modelled time per call (depthwise_block),
    and how many were scored; ties to fewer lanes past the end of an output row (their epilogue,
    loads and stores are paid and dropped: on 7-wide rows 8-lane vectors ran 1.2-1.5x faster than
    16-lane ones the model ties them with, docs/int8.md), then wider vectors, then fewer accumulators,
    then fewer rows."""
    best, key_best, scored = None, None, 0
    for lanes in DEPTHWISE_LANES[dialect]:
        vecs_per_row = math.ceil(spec.out_w / lanes)
        for vectors in range(1, min(DW_MAX_VECTORS, vecs_per_row) + 1):
            for rows in range(1, min(DW_MAX_ROWS, spec.out_h) + 1):
                block = depthwise_block(spec, dialect, cluster, threads, lanes, vectors, rows)
                if block is None:
                    continue
                scored += 1
                wasted_lanes = vecs_per_row * lanes - spec.out_w
                key = (round(block.seconds * 1e12), wasted_lanes, -lanes, rows * vectors, rows)
                if key_best is None or key < key_best:
                    best, key_best = block, key
    return best, scored


@dataclass(frozen=True)
class NextPanelPrefetch:
    """Int8Plan.prefetch_every_groups / prefetch_lines_per_step: every this many k groups a row tile
    prefetches this many lines of its share of the next weight panel."""
    every_groups: int
    lines_per_step: int


def next_panel_prefetch(dialect: str, row_tiles: int, k_groups: int, panel_bytes: int) -> Optional[NextPanelPrefetch]:
    """How a row tile prefetches its share of the next weight panel, ceil(panel_bytes / (64 row_tiles))
    lines, so that the share is done by its last k group: a line every few groups, or several lines per
    group when the share outnumbers the groups. None where off: not an x86 dialect, or row tiles per
    panel outside decide.NEXT_PANEL_PREFETCH_TILES (one tile streams its panel whatever it does; past 16
    the first tile's wait is a small part of the panel's time)."""
    fewest, most = NEXT_PANEL_PREFETCH_TILES
    if dialect not in INT8_PREFETCH_DIALECTS or not fewest <= row_tiles <= most or k_groups < 1:
        return None
    share_lines = math.ceil(panel_bytes / (CACHE_LINE_BYTES * row_tiles))
    if share_lines <= k_groups:
        return NextPanelPrefetch(k_groups // share_lines, 1)
    return NextPanelPrefetch(1, math.ceil(share_lines / k_groups))


def plan_int8(spec: OperatorSpec, quant: QuantParams, hw: HardwareDescription, *, cluster: Optional[str] = None,
              threads: Optional[int] = None, host_flags: frozenset = frozenset(),
              function_name: Optional[str] = None, force_dialect: Optional[str] = None,
              force_tile: Optional[tuple[int, int]] = None, force_rows: Optional[int] = None,
              force_layout: Optional[str] = None, flat_padding: str = "shared",
              force_channels_rows: Optional[str] = None) -> Int8Plan:
    """The int8 plan. force_dialect / force_tile / force_rows / force_layout (tests, benchmarks): a
    narrower dialect than the core's, an explicit (MR, NV), output rows per conv2d column tile, the
    conv2d column layout ('rows'; 'flat' where the stride is 1; 'im2col' where it is not);
    flat_padding (benchmarks): 'both' stages both side paddings of a flat row (flat_row_width);
    force_channels_rows (with the 'channels' layout): its rows 'gathered' or read 'in_place'.
    AArch64 descriptions are planned by xfc.cpu.int8_arm (sdot / smmla)."""
    if hw.target_arch == "aarch64":
        if force_channels_rows:
            raise OperatorError("int8 channels rows: the 'channels' column layout is an x86 layout")
        from .int8_arm import plan_arm_int8
        return plan_arm_int8(spec, quant, hw, cluster=cluster, threads=threads, function_name=function_name,
                             force_dialect=force_dialect, force_tile=force_tile, force_rows=force_rows,
                             force_layout=force_layout)
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
        vbmi = VBMI_FLAG in set(cl.core.features) | set(host_flags)
        return _plan_depthwise(spec, quant, dialect, cl, threads, name, march, header, reasons, force_tile, force_rows,
                               force_layout, vbmi)
    m, n, k = gemm_view(spec)
    shape = gemm_shape(spec)
    if force_tile is not None:
        mr, nv = force_tile
        if int8_registers(dialect, mr, nv) > cl.core.vector_registers or not (1 <= mr <= 64 and 1 <= nv <= 8):
            raise OperatorError(f"int8 tile {mr}x{nv} vectors does not fit {cl.core.vector_registers} registers")
        cycles = group_cycles(dialect, cl.core, mr, nv)
        rows = force_rows if (force_rows and isinstance(spec, Conv2dSpec) and nv % force_rows == 0) else 1
        tile = Int8Tile(mr, nv, INT8_LANES[dialect], cycles,
                        _tile_seconds(shape, mr, nv * INT8_LANES[dialect], cycles, cl.clock_ghz * 1e9, threads, rows,
                                      epilogue_cycles=tile_epilogue_cycles(dialect, cl.core, mr, nv)), rows)
        reasons.append(f"register tile {mr}x{nv * INT8_LANES[dialect]} ({rows} output row(s)): forced by the caller")
    else:
        tile, scored = choose_tile(dialect, shape, cl, threads)
        reasons.append(
            f"register tile {tile.mr}x{tile.nr}{f' as {tile.tile_rows} output rows' if tile.tile_rows > 1 else ''} "
            f"({tile.mr * tile.nv} accumulators, "
            f"{int8_registers(dialect, tile.mr, tile.nv)} of {cl.core.vector_registers} registers): fastest of {scored} "
            f"by the issue model, {tile.cycles_per_group:.2f} cycles per 4-deep group "
            f"({cl.core.fma_per_cycle * DOT_RATE[dialect]:g} dot instructions/cycle, latency {cl.core.fma_latency_cycles})")
    layout, channels_in_place = "rows", False
    if force_layout not in (None, *COLUMN_LAYOUTS) or (force_layout not in (None, "rows")
                                                        and not isinstance(spec, Conv2dSpec)):
        raise OperatorError(f"int8 column layout '{force_layout}': {', '.join(COLUMN_LAYOUTS)} for conv2d "
                            f"(not {spec.name})")
    if flat_padding not in FLAT_PADDINGS:
        raise OperatorError(f"int8 flat padding '{flat_padding}': {', '.join(FLAT_PADDINGS)}")
    if force_channels_rows not in (None, *CHANNELS_ROWS) or (force_channels_rows and force_layout != "channels"):
        raise OperatorError(f"int8 channels rows '{force_channels_rows}': {', '.join(CHANNELS_ROWS)}, with the "
                            f"'channels' column layout")
    flat = (flat_shape(spec, flat_padding) if isinstance(spec, Conv2dSpec) and force_layout in (None, "flat")
            else None)
    if force_layout == "flat" and flat is None:
        raise OperatorError(f"{spec.describe()}: the flat column layout needs a stride-1 conv2d")
    gathered = im2col_shape(spec) if isinstance(spec, Conv2dSpec) and force_layout in (None, "im2col") else None
    if force_layout == "im2col" and gathered is None:
        raise OperatorError(f"{spec.describe()}: the im2col column layout is for strided conv2d (stride 1: flat)")
    if gathered is not None and (force_tile is None or force_layout == "im2col"):
        staging = im2col_staging_seconds(spec, cl, threads)
        g_tile, _ = (choose_tile(dialect, gathered, cl, threads, split_rows=True) if force_tile is None else
                     (_retimed(tile, gathered, dialect, cl, threads, split_rows=True), 0))
        g_seconds = g_tile.seconds + staging
        if g_seconds < tile.seconds or force_layout == "im2col":
            reasons.append(f"columns 'im2col': every tap gathered per output pixel when staged, the {spec.out_h} x "
                           f"{spec.out_w} outputs as one run, register tile {g_tile.mr}x{g_tile.nr}, "
                           f"{g_seconds * 1e6:.1f} us modelled ({staging * 1e6:.1f} of them staging) against "
                           f"{tile.seconds * 1e6:.1f} us for vectors within an output row ({spec.out_w} pixels)")
            tile = Int8Tile(g_tile.mr, g_tile.nv, g_tile.lanes, g_tile.cycles_per_group, g_seconds)
            shape, layout = gathered, "im2col"
        else:
            reasons.append(f"columns within output rows: {tile.seconds * 1e6:.1f} us modelled, 'im2col' "
                           f"{g_seconds * 1e6:.1f} us ({staging * 1e6:.1f} of them staging)")
    if flat is not None and (force_tile is None or force_layout == "flat"):
        flat_tile, flat_scored = (choose_tile(dialect, flat, cl, threads, split_rows=True) if force_tile is None else
                                  (_retimed(tile, flat, dialect, cl, threads, split_rows=True), 0))
        flat_width = flat_row_width(spec, flat_padding)
        valid = spec.out_w / flat_width
        if flat_tile.seconds < tile.seconds or force_layout == "flat":
            reasons.append(f"columns 'flat': the padded staged rows ({flat_width} pixels, {valid:.0%} of them "
                           f"outputs) as one run, register tile {flat_tile.mr}x{flat_tile.nr}, "
                           f"{flat_tile.seconds * 1e6:.1f} us modelled against {tile.seconds * 1e6:.1f} us for "
                           f"vectors within an output row ({spec.out_w} pixels)")
            tile, shape, layout = flat_tile, flat, "flat"
        else:
            reasons.append(f"columns within output rows: {tile.seconds * 1e6:.1f} us modelled, 'flat' (the padded rows "
                           f"as one run, {valid:.0%} outputs) {flat_tile.seconds * 1e6:.1f} us")
    if isinstance(spec, Conv2dSpec) and force_layout in (None, "channels") and (force_tile is None or
                                                                             force_layout == "channels"):
        options = []      # (seconds, in place, shape, tile, staging seconds): gathered rows, rows read in place
        for in_place in (False, True):
            if force_channels_rows and in_place != (force_channels_rows == "in_place"):
                continue
            turned = channels_in_place_shape(spec) if in_place else channels_shape(spec)
            if force_tile is None:
                c_tile, _ = choose_tile(dialect, turned, cl, threads)
            else:
                c_tile = _retimed(tile, turned, dialect, cl, threads)
            staging = channels_staging_seconds(spec, c_tile.mr, cl, threads, dialect, gathered=not in_place)
            options.append((c_tile.seconds + staging, in_place, turned, c_tile, staging))
        c_seconds, in_place, turned, c_tile, staging = min(options, key=lambda o: (o[0], not o[1]))
        others = "".join(f", {'in place' if o[1] else 'gathered'} {o[0] * 1e6:.1f} us" for o in options
                         if o[1] != in_place)
        how = ("read in place from the staged input, tiles within an output row" if in_place
               else "gathered per call")
        if c_seconds < tile.seconds or force_layout == "channels":
            reasons.append(f"columns 'channels': output pixels as rows ({how}), the {spec.k} output "
                           f"channels in the lanes, register tile {c_tile.mr}x{c_tile.nr}, {c_seconds * 1e6:.1f} us "
                           f"modelled ({staging * 1e6:.1f} of them {'storing' if in_place else 'gathering and storing'}"
                           f"{others}) against {tile.seconds * 1e6:.1f} us")
            tile = Int8Tile(c_tile.mr, c_tile.nv, c_tile.lanes, c_tile.cycles_per_group, c_seconds)
            shape, layout = turned, "channels"
            channels_in_place = in_place
        else:
            reasons.append(f"'channels' (pixels as rows, channels in the lanes, {how}): {c_seconds * 1e6:.1f} us "
                           f"modelled{others}")
    column_tiles = math.ceil(shape.column_rows / tile.tile_rows) * math.ceil(shape.run / (tile.nr // tile.tile_rows))
    threads = max(1, min(threads, column_tiles * (math.ceil(shape.m / tile.mr) if layout in ("flat", "im2col") else 1)))
    predicted = 2.0 * m * n * k / 1e9 / tile.seconds if tile.seconds > 0 else None   # per batch item = overall
    lowering = "gemm" if isinstance(spec, MatmulSpec) else "implicit_gemm_staged"
    header.append(f"{lowering}: M={m} N={n} K={k}, register tile MR={tile.mr} NR={tile.nr}"
                  + (f" ({tile.tile_rows} output rows)" if tile.tile_rows > 1 else "")
                  + (", flat columns (padded rows as one run)" if layout == "flat" else "")
                  + (", im2col columns (every tap gathered per output pixel)" if layout == "im2col" else "")
                  + (", channels in the lanes (pixels as rows)" if layout == "channels" else ""))
    row_operand = "activations" if isinstance(spec, MatmulSpec) or layout == "channels" else "weights"
    pair_sums = dialect == "avx2" and quant.narrow_weights
    prefetch = None
    if row_operand == "activations":     # the weights are the column panels: [N/NR][k groups][NR][4] bytes
        row_tiles = shape.row_tiles(tile.mr)
        col_bytes = 2 if widened_to_int16(dialect, pair_sums) else 1
        prefetch = next_panel_prefetch(dialect, row_tiles, shape.groups, shape.groups * 4 * tile.nr * col_bytes)
        if prefetch:
            reasons.append(f"next weight panel prefetched into L2 by its {row_tiles} row tiles, {prefetch.lines_per_step} "
                           f"line(s) every {prefetch.every_groups} k group(s) (a layer's weights come from memory in a "
                           f"network)")
    return Int8Plan(spec, quant, dialect, lowering, tile.mr, tile.nv, tile.lanes, threads, name, march, predicted,
                    tuple(header), tuple(reasons), tile.tile_rows, activation_offset=quant.shift,
                    prefetch_every_groups=prefetch.every_groups if prefetch else 0,
                    prefetch_lines_per_step=prefetch.lines_per_step if prefetch else 0, row_operand=row_operand,
                    column_layout=layout, pair_sums_int16=pair_sums, channels_rows_in_place=channels_in_place,
                    flat_row_pixels=flat_row_width(spec, flat_padding) if layout == "flat" else 0)


def _plan_depthwise(spec: DepthwiseSpec, quant: QuantParams, dialect: str, cl: CpuCluster, threads: int, name: str,
                    march: str, header: list, reasons: list, force_tile: Optional[tuple[int, int]] = None,
                    force_rows: Optional[int] = None, force_layout: Optional[str] = None,
                    vbmi: bool = False) -> Int8Plan:
    """Depthwise: the plane layout (generic), tap pairs (avx2, vnni) with the block the issue model
    picks, or channels in the lanes (vnni with vpermb) where the model times it shorter than the tap
    pairs; force_tile = (lanes, vectors) and force_rows = output rows (tests) fix the tap-pairs block,
    force_layout ('tap_pairs', 'channels') the layout."""
    threads = min(threads, spec.n * spec.c)
    pragma = DEPTHWISE_TARGET_PRAGMA[dialect]
    if force_layout not in (None, *DEPTHWISE_LAYOUTS):
        raise OperatorError(f"int8 depthwise layout '{force_layout}': {', '.join(DEPTHWISE_LAYOUTS)}")
    channels = depthwise_channels_block(spec, cl, threads, quant.act_type == "int8") \
        if dialect == "vnni" and vbmi else None
    l2_bytes = cl.l2.size_bytes // max(cl.l2.shared_by_cores, 1)
    # beyond the L2 the transposed planes and Q stream from further out, which the model does not count
    # (MobileNetV2's 32 x 112 x 112 layer, 1.2 MB: 0.90x the tap pairs on a Zen 5 host, int8_dw_layouts_zen5.json)
    channels_fit = channels is not None and channels.working_set_bytes <= l2_bytes
    if force_layout == "channels" and channels is None:
        raise OperatorError(f"{spec.describe()}: the channels depthwise layout needs the vnni dialect with "
                            f"avx512vbmi (here: {dialect}{'' if vbmi else ', no avx512vbmi'}) and dilation_w 1")
    if force_layout == "plane" and dialect in DEPTHWISE_LANES:
        raise OperatorError(f"int8 depthwise layout 'plane' is the generic dialect's; {dialect} plans "
                            f"'tap_pairs' or 'channels'")
    if force_layout == "tap_pairs" and dialect not in DEPTHWISE_LANES:
        raise OperatorError(f"int8 depthwise layout 'tap_pairs' needs the avx2 or vnni dialect; {dialect} plans "
                            f"'plane'")
    if force_layout == "channels" and (force_tile is not None or force_rows is not None):
        raise OperatorError("int8 depthwise: force_tile / force_rows fix a tap-pairs block; the channels layout "
                            "has none")
    if dialect not in DEPTHWISE_LANES:
        header.append("lowering: direct depthwise (int16 staged plane, int32 row accumulators)")
        reasons.append("depthwise: direct int32-accumulating loops, vectorized by the compiler along output rows")
        return Int8Plan(spec, quant, dialect, "direct_depthwise", 1, 1, INT8_LANES[dialect], threads, name, march, None,
                        tuple(header), tuple(reasons), target_pragma=pragma, parallel_axis="planes")
    if force_tile is not None or force_rows is not None:
        lanes, vectors = force_tile or (DEPTHWISE_LANES[dialect][0], 1)
        rows = force_rows or 1
        if lanes not in DEPTHWISE_LANES[dialect] or not (1 <= vectors <= DW_MAX_VECTORS) or not (1 <= rows <= DW_MAX_ROWS):
            raise OperatorError(f"depthwise block of {rows} row(s) x {vectors} x {lanes} lanes: the {dialect} dialect "
                                f"takes lanes {DEPTHWISE_LANES[dialect]}, 1..{DW_MAX_VECTORS} vectors, "
                                f"1..{DW_MAX_ROWS} rows")
        block = depthwise_block(spec, dialect, cl, threads, lanes, vectors, rows)
        if block is None:
            raise OperatorError(f"depthwise block of {rows} row(s) x {vectors} vector(s) does not fit "
                                f"{cl.core.vector_registers} registers")
        scored = 0
    else:
        block, scored = choose_depthwise_block(spec, dialect, cl, threads)
    if channels is not None and force_tile is None and force_rows is None and (
            force_layout == "channels" or (force_layout is None and channels_fit and channels.seconds < block.seconds)):
        return _plan_depthwise_channels(spec, quant, cl, threads, name, march, header, reasons, channels, block,
                                        forced=force_layout == "channels")
    staging, staging_why = depthwise_staging(spec)
    madd = "vpdpwssd" if dialect == "vnni" else "vpmaddwd + vpaddd"
    header.append(f"lowering: direct depthwise, tap pairs ({madd}), blocks of {block.rows} output row(s) x "
                  f"{block.vectors} x {block.lanes} pixels")
    reasons.append(f"depthwise: each plane staged as int16 (x - zp) pairs of adjacent taps "
                   f"({staging} staging), {spec.r} x {math.ceil(spec.s / 2)} {madd} per "
                   f"{block.lanes} outputs; compiled for `#pragma GCC target(\"{pragma}\")`")
    reasons.append(f"depthwise staging '{staging}': {staging_why}")
    chosen = f"fastest of {scored}" if scored else "forced by the caller,"
    reasons.append(f"depthwise block {block.rows} row(s) x {block.vectors} vector(s) of {block.lanes} lanes: {chosen} "
                   f"by the issue model ({block.cycles_per_plane:.0f} cycles per plane, bound by "
                   f"{block.bound}; weights {'in registers' if block.weights_in_registers else 'broadcast from memory'}); "
                   f"threads split the {spec.n * spec.c} planes")
    if channels is not None and not channels_fit:
        reasons.append(f"depthwise layout 'tap_pairs': 'channels' (16 channels in the lanes) would keep "
                       f"{channels.working_set_bytes / 1024:.0f} KiB per thread, more than the core's "
                       f"{l2_bytes / 1024:.0f} KiB L2")
    elif channels is not None:
        reasons.append(f"depthwise layout 'tap_pairs': {block.seconds * 1e6:.1f} us modelled, 'channels' (16 channels "
                       f"in the lanes) {channels.seconds * 1e6:.1f} us")
    ops = 2.0 * spec.n * spec.c * spec.out_h * spec.out_w * spec.r * spec.s
    return Int8Plan(spec, quant, dialect, "direct_depthwise", 1, block.vectors, block.lanes, threads, name, march,
                    ops / 1e9 / block.seconds if block.seconds > 0 else None, tuple(header), tuple(reasons),
                    tile_rows=block.rows, target_pragma=pragma, depthwise_layout="tap_pairs", parallel_axis="planes",
                    depthwise_staging=staging)


def _plan_depthwise_channels(spec: DepthwiseSpec, quant: QuantParams, cl: CpuCluster, threads: int, name: str,
                             march: str, header: list, reasons: list, channels: DepthwiseChannels,
                             block: Optional[DepthwiseBlock], forced: bool) -> Int8Plan:
    """The 'channels' depthwise plan (int8_depthwise.c.j2): groups of 16 channels, threads split them."""
    groups = spec.n * math.ceil(spec.c / CHANNEL_GROUP)
    threads = max(1, min(threads, groups))
    quads = math.ceil(spec.s / 4)
    header.append(f"lowering: direct depthwise, 16 channels in the lanes (vpdpbusd on quads of adjacent taps, "
                  f"{spec.r} x {quads} per output pixel), {channels.pixels_per_block} output pixels per block")
    reasons.append(f"depthwise: groups of 16 channels transposed into the lanes and back in registers, quads of "
                   f"4 adjacent input columns built with vpermb; compiled for `#pragma GCC target(\"{DEPTHWISE_CHANNELS_PRAGMA}\")`")
    why = "forced by the caller" if forced else (
        f"{channels.seconds * 1e6:.1f} us modelled against {block.seconds * 1e6:.1f} us for tap pairs "
        f"({block.rows} row(s) x {block.vectors} x {block.lanes} pixels)")
    reasons.append(f"depthwise layout 'channels': {why} ({channels.cycles_per_group:.0f} cycles per group, bound by "
                   f"{channels.bound}); threads split the {groups} channel groups")
    ops = 2.0 * spec.n * spec.c * spec.out_h * spec.out_w * spec.r * spec.s
    return Int8Plan(spec, quant, "vnni", "direct_depthwise", 1, channels.pixels_per_block, CHANNEL_GROUP, threads,
                    name, march,
                    ops / 1e9 / channels.seconds if channels.seconds > 0 else None, tuple(header), tuple(reasons),
                    target_pragma=DEPTHWISE_CHANNELS_PRAGMA, depthwise_layout="channels",
                    parallel_axis="channel_groups")


def explain(plan: Int8Plan) -> str:
    return Int8Synthesis(plan).explain()

