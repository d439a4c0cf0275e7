"""Code-shape decisions: the choices of a CPU kernel's shape that follow from the ISA row, the
operator and the tiles. The synthesizer (synth.py) and hand plans (plans.py) both take them from
here, so there is one planner; code generation only spells what the plan records.

Loop order, C prefetch, B prefetch distance and the A-packing block were measured on the AVX-512
host (docs/host-kernel-notes.md) and are the same for every ISA; the others follow from the
dialect's capabilities (xfc/cpu/isa.py) and the operator's geometry.
"""
from __future__ import annotations

import math
from typing import Optional

from ..hardware.model import CpuCore
from ..ops.spec import Conv2dSpec, DepthwiseSpec, MatmulSpec, OperatorSpec
from . import neon_asm, x86_asm
from .isa import IsaRow

LOOP_ORDER = "jr_ir"          # BLIS order: the KC x NR B micro-panel stays in L1 while every A panel passes
PREFETCH_C = True             # prefetch the C tile for writing before the k loop
PREFETCH_B_DISTANCE = 0       # k steps ahead to prefetch packed B: off (the hardware prefetcher keeps up)
PACK_A_KB = 16                # k values per row copied together when packing A (blocked transpose)
VECTOR_TRANSPOSE_MAX_MR = 16  # xfc_transpose16 transposes 16 rows: MR beyond that uses the scalar merge


def c_store(row: IsaRow, transposed: bool, mr: int) -> str:
    """How full tiles of C are stored: 'direct', or for a transposed C (implicit_gemm_t) through a
    local tile, transposed in registers where the dialect has a 16x16 transpose and MR fits it."""
    if not transposed:
        return "direct"
    return "vector_transpose" if row.transpose16 and mr <= VECTOR_TRANSPOSE_MAX_MR else "tile"


def default_a_pack(row: IsaRow, transposed: bool, mr: int, out_w: Optional[int],
                   pointwise: bool = False) -> tuple[str, str]:
    """(a_pack, reason) before the cache check of the synthesizer (synth.py may still pack a direct
    A whose rows would crowd one L1 set).

    Transposed conv: MR pixels of one output row are consecutive floats of the staged image, read
    in place when MR divides OW, else packed im2col rows; a pointwise conv reads the image itself,
    where any MR consecutive pixels are consecutive floats, so A is always read in place. Otherwise:
    lane-indexed FMAs read MR rows per vector load, which needs A packed as [k][MR]; with broadcasts
    every row is its own load anyway, so A is read in place and the packing pass disappears.
    """
    if transposed:
        if pointwise:
            return "im2col_direct", f"MR={mr} consecutive pixels read in place from the image"
        if out_w % mr == 0:  # a tile's pixels lie in one output row: consecutive staged floats
            return "im2col_direct", f"MR={mr} pixels of one output row read from the staged image"
        return "packed", f"im2col rows of output pixels (MR={mr} does not divide OW={out_w})"
    if row.lane_indexed:
        return "packed", "lane-indexed FMAs read MR rows per load"
    return "direct", "one broadcast per row either way"


def stage_copy(spec: OperatorSpec, transposed: bool) -> str:
    """How the zero-padded input is staged: 'none' (matmul; a pointwise conv, either lowering: the
    input is the GEMM operand, or its own staged image, read in place), 'run' (one contiguous copy
    per row: stride 1) or 'strided' (column phases)."""
    if isinstance(spec, MatmulSpec):
        return "none"
    if isinstance(spec, Conv2dSpec) and spec.pointwise:
        return "none"
    return "run" if spec.stride_w == 1 else "strided"


def gemm_ukernel(row: IsaRow, core: Optional[CpuCore], registers: int) -> str:
    """How the full tile's K loop is written. On a NEON core with a description, inline assembly
    with registers allocated from the plan (GCC's allocation spills large tiles and turns 64-bit A
    loads into scalar loads: ../shared/reference/arm-mca.md), ordered for the core's pipeline; on an
    AVX2 core likewise (GCC spills accumulators and reloads B inside the FMAs of tiles that fill
    the 16-register file; x86_asm.CHOSEN_DIALECTS says why not yet AVX-512), out of order. The
    tile must fit the register file with nothing left to the compiler. Else intrinsics."""
    if core is None:
        return "intrinsics"
    if row.name in x86_asm.DIALECTS:
        if row.name not in x86_asm.CHOSEN_DIALECTS:
            return "intrinsics"
        fits = registers <= min(core.vector_registers, x86_asm.VECTOR_REGISTERS[row.name])
        return "asm_out_of_order" if fits else "intrinsics"
    if not row.lane_indexed or registers > min(core.vector_registers, 32):
        return "intrinsics"
    return "asm_in_order" if core.pipeline == "in_order" else "asm_out_of_order"


# Dialects whose cores were timed writing a cold C in both loop orders (the x86 host; NEON was not).
ROW_STREAM_ORDER_DIALECTS = ("avx512", "avx2")


def loop_order(row: IsaRow, transposed: bool, k: int, kc: int, mr: int, mc: int, nc: int,
               c_bytes_per_thread: float, l2_share_bytes: float, elem_bytes: int) -> tuple[str, str]:
    """(loop_order, reason). The BLIS order (jr outside ir) keeps the KC x NR micro-panel of B in L1
    while every row tile of the MC block passes, so it writes MC rows of C at a time, NR floats
    each. Where C is written once (one KC slice) into memory past the L2 share (a large output of a
    layer with a short reduction, the first write in a network finds its lines in no cache), those
    MC concurrent row streams each wait on their own line fills: the output of MobileNetV3's
    112x112 pointwise layer (K=16, 64 rows) took 0.52 ms as a step of the network, 0.30 ms with ir
    outside jr (MR streams, each row tile sweeping the NC columns; `xfc model --emit lib --bench
    --profile`, docs/host-kernel-notes.md). That order re-reads the KC x NC block of B once per row
    tile, so only while it stays in the L2 share."""
    if row.name not in ROW_STREAM_ORDER_DIALECTS or transposed:
        return LOOP_ORDER, "BLIS order"
    if kc < k or mc <= mr:
        return LOOP_ORDER, "BLIS order" + (": C is revisited per KC slice" if kc < k else ": one row tile")
    if c_bytes_per_thread <= l2_share_bytes:
        return LOOP_ORDER, "BLIS order: C fits the L2 share"
    if kc * nc * elem_bytes > l2_share_bytes:
        return LOOP_ORDER, "BLIS order: the KC x NC block of B would leave L2"
    return "ir_jr", (f"C written once past L2: each row tile sweeps the NC columns ({mr} row streams, "
                     f"not {mc}); the KC x NC block of B stays in L2")


# Dialects whose kernels were timed with the weights streamed from memory, as a network runs them
# (the x86 host; NEON cores were not).
NEXT_PANEL_PREFETCH_DIALECTS = ("avx512", "avx2")
CACHE_LINE_BYTES = 64
# Row tiles per panel where it pays. One tile streams its panel whatever it does (a matrix-vector
# layer: a classifier lost 6-10% to the extra instructions); past 16 the first tile's wait is a
# small part of the panel's time (56x56 and 28x28 layers, 36 or more tiles, lost 0-2%), at 9-14 tiles
# (14x14 layers) it gained 1-10%, at 4 (7x7) 20-35%: benchmarks/packed_panel.py --rule
# next_panel_prefetch, docs/host-kernel-notes.md.
NEXT_PANEL_PREFETCH_TILES = (2, 16)


def busiest_thread_rows(rows: int, tile_rows: int, threads: int) -> int:
    """The rows the busiest thread gets when `threads` threads deal `rows` out in whole register
    tiles of `tile_rows` (the kernels' split over rows: whole panels per thread)."""
    return min(rows, math.ceil(math.ceil(rows / tile_rows) / max(threads, 1)) * tile_rows)


def next_panel_prefetch_lines(row: IsaRow, spec: OperatorSpec, transposed: bool, m: int, mr: int, nr: int,
                              kc: int, mc: int, k_unroll: int, order: str, ukernel: str, elem_bytes: int,
                              threads: int = 1, parallel_axis: str = "n") -> int:
    """Cache lines of the next weight micro-panel (B at jr + NR) each unrolled k step prefetches into
    L2; 0 = off. In the BLIS order the row tiles of a block pass one KC x NR panel of B in turn, and
    only the first finds it missing: in a network the weights of a layer come from memory (every
    other layer's data passed through the caches since its last call), so that tile runs at the rate
    memory delivers the panel while the others run at the FMA rate. Prefetching the next panel
    during the current one's tiles spreads the stream over all of them: ResNet-50's 1x1 convs at 7x7
    (4 row tiles of 14 pixels) took 0.63-0.64 ms as steps of the network without it, 0.40-0.45 ms
    with it, 0.42 ms timed alone with their weights hot (docs/host-kernel-notes.md, rule 7). Each
    tile takes an equal share of the panel, at this many lines per unrolled step, so that the shares
    are done by the tile's last step.
    On where the weights are B (a transposed conv, a matmul), in the BLIS order with the intrinsics
    loop, and NEXT_PANEL_PREFETCH_TILES row tiles per panel in one thread's block: split over rows (M),
    each thread passes the panels with its own share of the row tiles (ResNet-18's Winograd GEMMs at
    2 threads, one row tile of 16 tiles each, ran 8-15% slower with it)."""
    weights_are_b = isinstance(spec, MatmulSpec) or transposed
    rows = m if parallel_axis != "m" else busiest_thread_rows(m, mr, threads)
    tiles = max(1, math.ceil(min(mc, rows) / mr))
    fewest, most = NEXT_PANEL_PREFETCH_TILES
    if (row.name not in NEXT_PANEL_PREFETCH_DIALECTS or not weights_are_b or order != "jr_ir"
            or ukernel != "intrinsics" or kc < k_unroll or not fewest <= tiles <= most):
        return 0
    panel_lines = math.ceil(kc * nr * elem_bytes / CACHE_LINE_BYTES)
    return max(1, math.ceil(panel_lines / (tiles * (kc // k_unroll))))


def gemm_code_shape(row: IsaRow, spec: OperatorSpec, transposed: bool, mr: int,
                    ukernel: str = "intrinsics", order: str = LOOP_ORDER) -> dict:
    """The code-shape fields of a GemmSchedule (ir.GemmSchedule.CODE_SHAPE_FIELDS)."""
    return {"c_store": c_store(row, transposed, mr), "loop_order": order, "prefetch_c": PREFETCH_C,
            "prefetch_b_distance": PREFETCH_B_DISTANCE, "pack_a_kb": PACK_A_KB,
            "stage_copy": stage_copy(spec, transposed), "ukernel": ukernel}


def depthwise_tail_vectors(lanes: int, out_w: int, ow_vectors: int) -> list[int]:
    """Valid outputs per vector of the last (ragged) block of a row; [] when OW fills whole blocks."""
    block = ow_vectors * lanes
    if out_w % block == 0:
        return []
    ow0 = (out_w // block) * block
    return [max(0, min(lanes, out_w - ow0 - j * lanes)) for j in range(ow_vectors)]


def row_tail(row: IsaRow, lanes: int, out_w: int, ow_vectors: int) -> str:
    """The ragged right edge of a depthwise row: a separate block with half-width vectors where the
    dialect has them and some vector of the tail holds at most half the lanes (a half-width FMA costs
    half on cores that split wide FMAs); else masked stores where the dialect has them, else a small
    buffer."""
    if row.half_vectors and any(0 < v <= lanes // 2 for v in depthwise_tail_vectors(lanes, out_w, ow_vectors)):
        return "half_width"
    return "masked" if row.has_mask else "buffer"


def depthwise_ukernel(row: IsaRow, core: Optional[CpuCore], spec: DepthwiseSpec, lanes: int, oh_rows: int,
                      ow_vectors: int) -> str:
    """How the whole column blocks of a depthwise plane are written: on a NEON core with a
    description, inline assembly (registers from the plan; GCC spills the intrinsics loop:
    ../shared/reference/arm-mca.md) when taps, accumulators, activation constants and two input
    vectors fit the register file and every offset encodes in one q load/store; else intrinsics."""
    if core is None or not row.lane_indexed or spec.epilogue.extended:   # the asm loop spells relu / relu6 only
        return "intrinsics"
    regs = neon_asm.depthwise_registers(spec.r * spec.s, oh_rows, ow_vectors, spec.epilogue.activation)
    block = ow_vectors * lanes
    # the staged rows one row block reads (an upper bound of the stage's row stride), and C rows
    stage_cols = spec.stride_w * (math.ceil((spec.w + spec.pad_left + spec.pad_right) / spec.stride_w)
                                  + block + spec.s * spec.dilation_w + lanes)
    in_bytes = row.elem_bytes * spec.window_rows(oh_rows) * stage_cols
    out_bytes = row.elem_bytes * oh_rows * spec.out_w + 16 * ow_vectors
    if (regs > min(core.vector_registers, neon_asm.VECTOR_REGISTERS) or spec.out_w < block
            or max(in_bytes, out_bytes) > neon_asm.DW_MAX_OFFSET_BYTES):
        return "intrinsics"
    return "asm_in_order" if core.pipeline == "in_order" else "asm_out_of_order"


def depthwise_code_shape(row: IsaRow, spec: DepthwiseSpec, lanes: int, ow_vectors: int,
                         ukernel: str = "intrinsics") -> dict:
    """The code-shape fields of a DepthwiseSchedule (ir.DepthwiseSchedule.CODE_SHAPE_FIELDS). The
    half-width tail spells relu / relu6 only: an extended epilogue (Epilogue.extended) takes the
    masked or buffered tail."""
    tail = row_tail(row, lanes, spec.out_w, ow_vectors)
    if tail == "half_width" and spec.epilogue.extended:
        tail = "masked" if row.has_mask else "buffer"
    return {"row_tail": tail,
            "stage_copy": "run" if spec.stride_w == 1 else "strided", "ukernel": ukernel}
