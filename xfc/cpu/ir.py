"""The CPU plan: a kernel as nested tiles with explicit levels, plus every code-shape choice.

CPU programs built on GEMM (matmul, conv2d lowered to implicit GEMM) follow the classic
five-loop blocking, outermost first:

    CORES  split of the N (or M) tile loop across the cluster's cores      (threads)
    L3/NC  jc loop: NC columns of the packed B panel                        (nc)
    KC     pc loop: KC-deep slices of the reduction; packed B (KC x NC)     (kc)
    L2/MC  ic loop: MC rows; packed A block (MC x KC) stays in L2           (mc)
    L1     jr loop: one NR-wide B micro-panel (KC x NR) stays in L1         (nr)
    REG    ir loop: MR x NR accumulators in SIMD registers, k unrolled      (mr, nr, k_unroll)

Depthwise is memory-bound and uses its own direct scheme: each channel plane is copied once
into a zero-padded (and, for stride 2, phase-split) staging buffer in L1/L2, then swept by a
register tile of OH_ROWS x OW_VECTORS output vectors.

A plan holds every decision: the tile sizes (TILE_FIELDS: what the cost model ranks and the tile
database stores) and the code-shape choices (CODE_SHAPE_FIELDS) that the synthesizer or a hand
plan makes and code generation only spells (xfc/cpu/decide.py makes them for both).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

from ..ops.spec import OperatorSpec
from ..ops.dtypes import FP16, FP32, DType
from .isa import ISAS, isa_row  # noqa: F401  (ISAS re-exported: the ISAs a plan may name)

C_STORES = ("direct", "tile", "vector_transpose")
LOOP_ORDERS = ("jr_ir", "ir_jr")
STAGE_COPIES = ("none", "run", "strided")
ROW_TAILS = ("masked", "buffer", "half_width")
UKERNELS = ("intrinsics", "asm_out_of_order", "asm_in_order")
A_PACKS = ("packed", "direct", "im2col_direct")


@dataclass(frozen=True)
class GemmSchedule:
    """Tile sizes of the GEMM loop nest (see module docstring; counts in elements) and the code
    shape of the kernel that runs it."""

    mr: int          # register tile rows (elements of A broadcast per k step)
    nr: int          # register tile columns (a multiple of the vector lanes)
    k_unroll: int    # k steps unrolled in the micro-kernel body
    kc: int          # reduction slice kept hot in L1 (B micro-panel KC x NR)
    mc: int          # rows of the packed A block kept in L2 (multiple of mr)
    nc: int          # columns of the packed B panel (multiple of nr)
    threads: int     # OpenMP threads
    parallel_axis: str  # 'n' (split jc/jr columns) or 'm' (split ic rows) across threads
    a_load_bits: int = 128  # NEON: width of A loads feeding lane-indexed FMAs (64 on in-order A53/A55)
    a_pack: str = "packed"  # 'packed' (MR-row panels, one vector load feeds MR lanes), 'direct'
                            # (broadcast straight from row-major A: no packing pass) or 'im2col_direct'
                            # (transposed conv: MR pixels of one output row read from the staged image)
    # ---- code shape ----
    c_store: str = "direct"        # full tiles of C: 'direct' (vector stores into C), 'tile' (computed into a
                                   # local tile, merged with scalar code: C stored transposed) or
                                   # 'vector_transpose' (local tile transposed 16x16 in registers, masked stores)
    loop_order: str = "jr_ir"      # 'jr_ir' (BLIS: the B micro-panel stays in L1) or 'ir_jr'
    prefetch_c: bool = True        # prefetch the C tile for writing before the k loop
    prefetch_b_distance: int = 0   # k steps ahead to prefetch the packed B panel (0 = off)
    prefetch_next_panel_lines: int = 0  # cache lines of the next B micro-panel (the weights, jr + NR) each
                                        # unrolled k step prefetches into L2, spread over the row tiles that
                                        # read the current one (0 = off; decide.next_panel_prefetch_lines)
    pack_a_kb: int = 16            # k values per row copied together when packing A (blocked transpose)
    stage_copy: str = "none"       # staging the padded input: 'none' (not staged), 'run' (contiguous copies,
                                   # stride 1) or 'strided' (column phases of a strided window)
    ukernel: str = "intrinsics"    # the full tile's K loop: 'intrinsics' (dialect macros, the portable form) or
                                   # NEON inline assembly with registers from the plan, its instruction order
                                   # for the core: 'asm_out_of_order' or 'asm_in_order' (xfc/cpu/neon_asm.py)

    TILE_FIELDS: ClassVar[tuple[str, ...]] = ("mr", "nr", "k_unroll", "kc", "mc", "nc", "threads", "parallel_axis",
                                               "a_load_bits", "a_pack")
    CODE_SHAPE_FIELDS: ClassVar[tuple[str, ...]] = ("c_store", "loop_order", "prefetch_c", "prefetch_b_distance",
                                                     "prefetch_next_panel_lines", "pack_a_kb", "stage_copy",
                                                     "ukernel")

    def tiles(self) -> dict:
        return {k: getattr(self, k) for k in self.TILE_FIELDS}

    def code_shape(self) -> dict:
        return {k: getattr(self, k) for k in self.CODE_SHAPE_FIELDS}


@dataclass(frozen=True)
class DepthwiseSchedule:
    ow_vectors: int   # output vectors along OW held in registers per row
    oh_rows: int      # output rows computed together (reuses loaded input rows)
    threads: int      # OpenMP threads, split over (batch x channel) planes
    # ---- code shape ----
    row_tail: str = "buffer"    # the ragged right edge of a row: 'masked' (masked stores), 'buffer' (stored
                                # through a small buffer) or 'half_width' (a separate tail block whose vectors
                                # with at most half the lanes valid run at half width)
    stage_copy: str = "run"     # staging an input row: 'run' (one contiguous copy, stride 1) or 'strided'
    ukernel: str = "intrinsics"  # the whole column blocks of full row blocks: 'intrinsics', or NEON inline
                                 # assembly ('asm_out_of_order' / 'asm_in_order'; xfc/cpu/neon_asm.py)

    TILE_FIELDS: ClassVar[tuple[str, ...]] = ("ow_vectors", "oh_rows", "threads")
    CODE_SHAPE_FIELDS: ClassVar[tuple[str, ...]] = ("row_tail", "stage_copy", "ukernel")

    def tiles(self) -> dict:
        return {k: getattr(self, k) for k in self.TILE_FIELDS}

    def code_shape(self) -> dict:
        return {k: getattr(self, k) for k in self.CODE_SHAPE_FIELDS}


@dataclass(frozen=True)
class CpuKernelPlan:
    """Everything the C templates need; templates never decide anything themselves."""

    spec: OperatorSpec
    isa: str                      # one of ISAS
    vector_lanes: int             # fp32 lanes per SIMD register (16 avx512, 8 avx2, 4 neon)
    lowering: str                 # 'gemm' (matmul), 'implicit_gemm' (conv2d), 'implicit_gemm_t', 'direct_depthwise',
                                  # 'winograd' (3x3 stride-1 conv2d; gemm is its GEMM stage: xfc/cpu/winograd.py)
    gemm: Optional[GemmSchedule]
    depthwise: Optional[DepthwiseSchedule]
    function_name: str            # exported C symbol
    header_lines: tuple[str, ...]  # comment lines naming hardware, operator, shape, tiles, version
    hardware_name: str = ""
    gcc_march: str = ""           # e.g. 'armv8.2-a+fp16+dotprod' or 'x86-64-v4'; '' for generic
    qemu_cpu: str = ""            # for ARM plans: the qemu-aarch64 -cpu value
    extra: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # free-form notes for reports (never read
                                                                       # by code generation)
    winograd_m: int = 0           # lowering 'winograd': the output tile size m (2, 4 or 6); 0 otherwise
    winograd_vectors: str = "tiles"  # lowering 'winograd': what the vectors of the GEMMs and transforms run
                                  # over: 'tiles' (rows are output channels) or 'channels' (rows are tiles)

    @property
    def schedule(self):
        """The GEMM or depthwise schedule, whichever the lowering uses."""
        return self.gemm if self.gemm is not None else self.depthwise

    @property
    def target_arch(self) -> str:
        """'aarch64' (NEON dialects) or 'x86_64'. The portable generic dialect runs on either: an
        ARM core's plan names its ARM -march or qemu CPU model, a host plan neither."""
        if self.isa == "generic":
            return "aarch64" if self.gcc_march.startswith("armv") or self.qemu_cpu else "x86_64"
        return isa_row(self.isa).target_arch

    @property
    def dtype(self) -> DType:
        """fp32, or fp16 for the fp16 dialect (its elements are 16 bits wide)."""
        return FP16 if isa_row(self.isa).elem_bits == 16 else FP32

    @property
    def threads(self) -> int:
        return self.schedule.threads
