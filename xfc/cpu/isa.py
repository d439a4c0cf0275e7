"""The floating-point dialects xfc generates CPU code in: one row per dialect (fp32: avx512, avx2,
neon, generic; fp16: neon_fp16). With xfc/cpu/config.py (what a core runs for each dtype: these
rows, the int8 dialects and dot-product instructions, rates and -march) this is where ISA facts live.

Every `isa == ...` question in synthesis, planning and code generation is a field of this table:

  dialect prelude     templates/cpu/dialect_<isa>.h.j2: the one macro vocabulary (XFC_VLOAD, XFC_VFMA,
                      XFC_ALOADw/XFC_AFMAw, ...) the GEMM and depthwise templates are written against
  lanes               fp32 lanes a plan may use (None: any power of two: the generic dialect is plain
                      GCC vector extensions); `fixed_lanes` when synthesis ignores the core's width
  has_mask            XFC_VLOAD_TAIL / XFC_VSTORE_TAIL: partial vectors without touching the lanes past
                      the end, so column tails need no scalar merge
  a_operand           how the MR values of A at one k step reach the FMAs: 'lane_indexed' (one vector
                      load feeds MR rows through lane-indexed FMAs; needs A packed as [k][MR]) or
                      'broadcast' (one broadcast per row)
  a_load_bits         the A load widths micro-tiles are enumerated with
  transpose16         a 16x16 in-register transpose (xfc_transpose16): transposed C tiles are stored
                      with vector code instead of a scalar loop
  half_vectors        half-width vectors (xfc_hv): a row tail of at most half the lanes at half cost
  required_features   what a core must list to run the dialect (most specific ISA first in ISAS)
  hand_*              what hand plans (plans.py) choose when the caller does not: tile and -march
  elem_type, elem_bits the C element type of inputs, weights, outputs and accumulators ('float', 32; the
                      fp16 row: 'float16_t', 16, fp16 arithmetic throughout as in mobile libraries)
  asm_ukernels        whether the NEON inline-assembly loops (neon_asm.py: .4s, and .8h for fp16) may be chosen
  a_load_overlap      lane-indexed A loads: False, pieces of decreasing width that tile MR exactly (4 + 2 + 1);
                      True, ceil(MR / w) loads of one width, the last overlapping (tiles.a_load_groups)
  indexed_registers   the v registers a lane-indexed FMA can take its indexed operand (A) from: 32, or 16
                      for FMLA .8h by element (its Rm field has 4 bits: v0-v15)
  interference_model  the cost model's interference terms (cost_model.py: issue bounds as a 4-norm,
                      B micro-panels streamed from L2, column-tail tiles at their own score) apply;
                      measured on the 16-register x86 dialects (issue 17), the others keep the
                      plain roofline of the micro-kernel until measured
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import OperatorError
from ..hardware.model import CpuCore


@dataclass(frozen=True)
class IsaRow:
    name: str
    prelude: str                          # dialect template, relative to templates/
    lanes: Optional[tuple[int, ...]]      # lanes the dialect supports; None = any power of two
    fixed_lanes: Optional[int]            # lanes synthesis uses regardless of the core (generic: 4)
    has_mask: bool
    a_operand: str                        # 'lane_indexed' | 'broadcast'
    a_load_bits: tuple[int, ...]          # A load widths micro-tiles are enumerated with
    transpose16: bool
    half_vectors: bool
    required_features: tuple[str, ...]
    hand_lanes: int                       # lanes of hand plans
    hand_tile: tuple[int, int]            # (MR, NR) of hand plans
    hand_depthwise_rows: int              # oh_rows of hand depthwise plans
    hand_depthwise_vectors: int           # ow_vectors of hand depthwise plans
    hand_march: str                       # -march of hand plans ('' = the compiler's default)
    interference_model: bool = False      # cost_model's measured interference terms apply
    elem_type: str = "float"              # C element type of every operand and accumulator
    elem_bits: int = 32                   # its width: lanes per register = vector bits / elem_bits
    asm_ukernels: bool = True             # neon_asm's inline-assembly loops may be chosen
    a_load_overlap: bool = False          # A loads of one width, the last overlapping (tiles.a_load_groups)
    indexed_registers: int = 32           # v0..v(n-1) may be the indexed operand of a lane-indexed FMA
    target_arch: str = "x86_64"           # what the dialect's code runs on ('aarch64': NEON)

    @property
    def elem_bytes(self) -> int:
        return self.elem_bits // 8

    @property
    def lane_indexed(self) -> bool:
        return self.a_operand == "lane_indexed"

    def synthesis_lanes(self, core: CpuCore) -> int:
        """Lanes of the vectors synthesis builds tiles from on this core (fp32: 4 on NEON; fp16: 8)."""
        return self.fixed_lanes or core.fp32_lanes * 32 // self.elem_bits


ISAS = ("avx512", "avx2", "neon", "generic", "neon_fp16")

ISA_TABLE: dict[str, IsaRow] = {
    "avx512": IsaRow(
        name="avx512", prelude="cpu/dialect_avx512.h.j2", lanes=(16,), fixed_lanes=None, has_mask=True,
        a_operand="broadcast", a_load_bits=(32,), transpose16=True, half_vectors=True,
        required_features=("avx512f",), hand_lanes=16, hand_tile=(14, 32), hand_depthwise_rows=4,
        hand_depthwise_vectors=2, hand_march="native"),
    "avx2": IsaRow(
        name="avx2", prelude="cpu/dialect_avx2.h.j2", lanes=(8,), fixed_lanes=None, has_mask=False,
        a_operand="broadcast", a_load_bits=(32,), transpose16=False, half_vectors=False,
        required_features=("avx2", "fma"), hand_lanes=8, hand_tile=(6, 16), hand_depthwise_rows=2,
        hand_depthwise_vectors=2, hand_march="x86-64-v3", interference_model=True),
    "neon": IsaRow(
        name="neon", prelude="cpu/dialect_neon.h.j2", lanes=(4,), fixed_lanes=None, has_mask=False,
        a_operand="lane_indexed", a_load_bits=(128, 64), transpose16=False, half_vectors=False,
        required_features=("neon",), hand_lanes=4, hand_tile=(6, 8), hand_depthwise_rows=4,
        hand_depthwise_vectors=4, hand_march="armv8.2-a", target_arch="aarch64"),
    "generic": IsaRow(
        name="generic", prelude="cpu/dialect_generic.h.j2", lanes=None, fixed_lanes=4, has_mask=False,
        a_operand="broadcast", a_load_bits=(32,), transpose16=False, half_vectors=False,
        required_features=(), hand_lanes=4, hand_tile=(4, 8), hand_depthwise_rows=2,
        hand_depthwise_vectors=4, hand_march="", interference_model=True),
    # fp16 storage and fp16 arithmetic (FMLA .8h; docs/fp16.md): chosen only by --dtype fp16
    # (xfc/cpu/fp16.py), never by isa_for. neon_asm spells its loops in .8h; A registers in v0-v15.
    "neon_fp16": IsaRow(
        name="neon_fp16", prelude="cpu/dialect_neon_fp16.h.j2", lanes=(8,), fixed_lanes=None, has_mask=False,
        a_operand="lane_indexed", a_load_bits=(128, 64), transpose16=False, half_vectors=False,
        required_features=("neon", "fp16"), hand_lanes=8, hand_tile=(6, 16), hand_depthwise_rows=4,
        hand_depthwise_vectors=2, hand_march="armv8.2-a+fp16", elem_type="float16_t", elem_bits=16,
        a_load_overlap=True, indexed_registers=16, target_arch="aarch64"),
}

# Which dialect a core gets: the first whose features it lists (most specific first).
_PREFERENCE = ("neon", "avx512", "avx2", "generic")


def isa_row(isa: str) -> IsaRow:
    """The row of `isa`, or a one-line OperatorError naming the known ones."""
    row = ISA_TABLE.get(isa)
    if row is None:
        raise OperatorError(f"isa '{isa}' is not one of {', '.join(ISAS)}")
    return row


def isa_for(core: CpuCore) -> str:
    """The dialect that fits a core: neon, avx512, avx2 or generic."""
    features = set(core.features)
    return next(isa for isa in _PREFERENCE if set(ISA_TABLE[isa].required_features) <= features)
