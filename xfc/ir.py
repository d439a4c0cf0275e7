"""The tile-based IR: a kernel as nested tiles with explicit levels, plus what codegen needs.

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
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .ops.spec import OperatorSpec

ISAS = ("avx512", "avx2", "neon", "generic")


@dataclass(frozen=True)
class GemmSchedule:
    """Tile sizes of the GEMM loop nest (see module docstring). All counts in elements."""

    mr: int          # register tile rows (elements of A broadcast per k step)
    nr: int          # register tile columns (a multiple of the vector lanes)
    k_unroll: int    # k steps unrolled in the micro-kernel body
    kc: int          # reduction slice kept hot in L1 (B micro-panel KC x NR)
    mc: int          # rows of the packed A block kept in L2 (multiple of mr)
    nc: int          # columns of the packed B panel (multiple of nr)
    threads: int     # OpenMP threads
    parallel_axis: str  # 'n' (split jc/jr columns) or 'm' (split ic rows) across threads
    a_load_bits: int = 128  # NEON: width of A loads feeding lane-indexed FMAs (64 on in-order A53/A55)
    a_pack: str = "packed"  # 'packed' (MR-row panels, one vector load feeds MR lanes) or 'direct'
                            # (broadcast straight from row-major A: no packing pass)


@dataclass(frozen=True)
class DepthwiseSchedule:
    ow_vectors: int   # output vectors along OW held in registers per row
    oh_rows: int      # output rows computed together (reuses loaded input rows)
    threads: int      # OpenMP threads, split over (batch x channel) planes


@dataclass(frozen=True)
class CpuKernelPlan:
    """Everything the C templates need; templates never decide anything themselves."""

    spec: OperatorSpec
    isa: str                      # one of ISAS
    vector_lanes: int             # fp32 lanes per SIMD register (16 avx512, 8 avx2, 4 neon)
    lowering: str                 # 'gemm' (matmul), 'implicit_gemm' (conv2d), 'direct_depthwise'
    gemm: Optional[GemmSchedule]
    depthwise: Optional[DepthwiseSchedule]
    function_name: str            # exported C symbol
    header_lines: tuple[str, ...]  # comment lines naming hardware, operator, shape, tiles, version
    hardware_name: str = ""
    gcc_march: str = ""           # e.g. 'armv8.2-a+fp16+dotprod' or 'x86-64-v4'; '' for generic
    qemu_cpu: str = ""            # for ARM plans: the qemu-aarch64 -cpu value
    extra: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # free-form notes for reports
