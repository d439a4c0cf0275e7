"""What a core runs for each dtype: the one place the CPU target's instruction-set facts live.

A CpuConfig is filled from the hardware description for one (core, dtype) pair, the way XNNPACK
fills one gemm config type for every datatype: the dialect the kernels are written in, the lanes
and registers it works with, the multiply-accumulate instruction and its issue rate on this core,
the -march the code is compiled with. The hardware description itself is never rewritten for a
dtype: planners ask this module (fma_rate, gcc_march, int8_dialect, arm_dots) instead.

  fp32   the core's dialect (xfc/cpu/isa.py rows: avx512, avx2, neon, generic), FMA at
         core.fma_per_cycle
  fp16   the neon_fp16 row (FMLA .8h, fp16 accumulation) on AArch64 cores that list `fp16`, at the
         core's fp16 rate (`fp16_fma_per_cycle`, else fma_per_cycle), -march with +fp16 (armv9-a does
         not imply FEAT_FP16 in GCC); refused on x86 and on cores without FP16 arithmetic
  int8   x86: vnni (AVX-512 VNNI vpdpbusd; the host flags must list avx512_vnni), avx2 (vpmaddwd on
         even/odd bytes, exact), generic (plain C); AArch64: smmla (i8mm), sdot (dotprod), refused
         without dotprod (the int8 planners: xfc/cpu/int8_synth.py, int8_arm.py)

DOT_RATE (x86 int8 dot-product instructions per FMA slot): vnni 1 (vpdpbusd issues on the FMA ports
with the FMA's throughput: uops.info, Ice Lake / Cascade Lake ZMM rows; assumed, not measured here),
avx2 0.5 (two vpmaddwd per 4-deep group on the same ports), generic 0.25 (scalar-ish C; ranking only).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import OperatorError
from ..hardware.model import CpuCore
from ..ops.dtypes import FP16, FP32, INT8, DType, dtype_named
from .isa import ISA_TABLE, isa_for, isa_row

# ---- fp16 ---------------------------------------------------------------------------------------

FP16_ISA = "neon_fp16"
FP16_MARCH_EXTENSION = "+fp16"


def fma_rate(core: CpuCore, isa: str) -> float:
    """Vector FMA instructions per cycle of the dialect's arithmetic on this core (fp16: the core's
    fp16 rate; every fp32 dialect: core.fma_per_cycle)."""
    return element_fma_rate(core, isa_row(isa).elem_bytes)


def element_fma_rate(core: CpuCore, elem_bytes: int) -> float:
    """The FMA rate of arithmetic on elem_bytes-wide floats (2: fp16, 4: fp32) on this core."""
    if elem_bytes == 2 and core.fp16_fma_rate is not None:
        return core.fp16_fma_rate
    return core.fma_per_cycle


def gcc_march(core: CpuCore, isa: str) -> str:
    """The -march a dialect's kernels are compiled with on this core (fp16 adds +fp16 if missing)."""
    if isa_row(isa).elem_bits == 16 and "fp16" not in core.gcc_march:
        return core.gcc_march + FP16_MARCH_EXTENSION
    return core.gcc_march


def fp16_refusal(core: CpuCore, target_arch: str, where: str) -> Optional[str]:
    """Why this core cannot run fp16 kernels (one line, naming `where`), or None when it can."""
    if target_arch != "aarch64":
        return (f"--dtype fp16: no fp16 CPU kernels for {where} ({target_arch}): they need an AArch64 core with "
                f"FP16 arithmetic (FMLA .8h), e.g. --hw snapdragon-865 (xfc does not run fp32 arithmetic under an "
                f"fp16 label)")
    missing = [f for f in isa_row(FP16_ISA).required_features if f not in core.features]
    if missing:
        return (f"--dtype fp16: {core.name} ({where}) lacks the '{missing[0]}' feature (FP16 arithmetic, "
                f"Armv8.2-A FEAT_FP16) the fp16 kernels need")
    return None


# ---- int8 on x86 --------------------------------------------------------------------------------

INT8_DIALECTS = ("vnni", "avx2", "generic")
INT8_LANES = {"vnni": 16, "avx2": 8, "generic": 4}      # int32 lanes per vector
DOT_RATE = {"vnni": 1.0, "avx2": 0.5, "generic": 0.25}
VNNI_FLAG = "avx512_vnni"
INT8_INSTRUCTION = {"vnni": "vpdpbusd", "avx2": "vpmaddwd (even/odd bytes)", "generic": "C (modular uint32)"}


def int8_registers(dialect: str, mr: int, nv: int) -> int:
    """Vector registers an x86 int8 register tile of MR rows x NV vectors needs."""
    if dialect == "avx2":
        return mr * nv + 2 * nv + 2 + 1       # even/odd column halves, even/odd row value, the vpmaddwd result
    return mr * nv + nv + 1 + 1                # column vectors, the broadcast row value, one spare


def int8_dialect(core: CpuCore, host_flags: frozenset = frozenset()) -> tuple[str, str]:
    """(x86 int8 dialect, why). host_flags: /proc/cpuinfo flags when the core is this machine (the
    host description lists only the features of its fp32 path, so VNNI is read from the flags)."""
    isa = isa_for(core)
    features = set(core.features) | set(host_flags)
    if isa == "avx512":
        if VNNI_FLAG in features:
            return "vnni", "AVX-512 core with avx512_vnni: vpdpbusd"
        return "avx2", "AVX-512 core without avx512_vnni: the AVX2 vpmaddwd dialect"
    if isa == "avx2":
        return "avx2", "AVX2 core: vpmaddwd on even/odd bytes (exact, no int16 saturation)"
    return "generic", "no x86 SIMD dialect for this core: plain C"


# ---- int8 on AArch64 ----------------------------------------------------------------------------

@dataclass(frozen=True)
class ArmDot:
    """One dot-product instruction and the packing it needs."""
    name: str            # "sdot" | "smmla"
    feature: str         # the core feature that has it
    k_depth: int         # k elements per group (packing depth)
    col_lanes: int       # output columns per column register
    row_lanes: int       # output rows per row register
    macs: int            # multiply-accumulates per instruction

    def instructions(self, mr: int, nv: int) -> int:
        return mr * nv if self.name == "sdot" else (mr // 2) * nv

    def registers(self, mr: int, nv: int) -> int:
        return self.instructions(mr, nv) + nv + mr // self.row_lanes


SDOT = ArmDot("sdot", "dotprod", 4, 4, 4, 16)
SMMLA = ArmDot("smmla", "i8mm", 8, 2, 2, 32)
ARM_DOTS = {"sdot": SDOT, "smmla": SMMLA}


def dot_rate(core: CpuCore, dot: ArmDot) -> tuple[float, str]:
    """(instructions per cycle, where the figure comes from)."""
    if dot.name == "smmla" and core.smmla_per_cycle is not None:
        return float(core.smmla_per_cycle), "smmla_per_cycle"
    if core.sdot_per_cycle is not None:
        return float(core.sdot_per_cycle), ("sdot_per_cycle (no smmla_per_cycle given)" if dot.name == "smmla"
                                            else "sdot_per_cycle")
    return float(core.fma_per_cycle), "fma_per_cycle (no sdot_per_cycle given)"


def arm_dots(core: CpuCore) -> tuple[ArmDot, ...]:
    """The instructions this core has, best first; a core without dotprod is refused (exit 2)."""
    if "dotprod" not in core.features:
        raise OperatorError(f"--dtype int8 on {core.name}: the core lacks 'dotprod' (SDOT, Armv8.2); "
                            f"ARM int8 kernels need it (features: {', '.join(core.features)})")
    return (SMMLA, SDOT) if "i8mm" in core.features else (SDOT,)


# ---- the per-core, per-dtype view ---------------------------------------------------------------

@dataclass(frozen=True)
class CpuConfig:
    """One core's configuration for one dtype: what its kernels of that dtype are written in and run at."""

    dtype: DType
    dialect: str               # fp32/fp16: the isa.py row; int8: vnni, avx2, generic, smmla or sdot
    lanes: int                 # elements per vector the kernels compute with (int8: int32 accumulator lanes)
    vector_registers: int
    instruction: str           # the multiply-accumulate instruction
    issue_per_cycle: float     # that instruction per cycle on this core
    gcc_march: str
    why: str = ""              # how the dialect was chosen

    def as_dict(self) -> dict:
        return {"dtype": self.dtype.name, "dialect": self.dialect, "lanes": self.lanes,
                "vector_registers": self.vector_registers, "instruction": self.instruction,
                "issue_per_cycle": self.issue_per_cycle, "gcc_march": self.gcc_march, "why": self.why}


FP_INSTRUCTION = {"avx512": "vfmadd231ps zmm", "avx2": "vfmadd231ps ymm", "neon": "FMLA .4s",
                  "generic": "C vector extensions (the compiler's FMA)", FP16_ISA: "FMLA .8h"}


def cpu_config(core: CpuCore, dtype, *, target_arch: str = "", host_flags: frozenset = frozenset()) -> CpuConfig:
    """The configuration of core for dtype (a one-line OperatorError when the core cannot run it).
    target_arch: 'aarch64' or 'x86_64' (default: from the core's fp32 dialect)."""
    dtype = dtype_named(dtype)
    isa = isa_for(core)
    arch = target_arch or ISA_TABLE[isa].target_arch
    if dtype is FP32:
        row = ISA_TABLE[isa]
        return CpuConfig(FP32, isa, row.synthesis_lanes(core), core.vector_registers, FP_INSTRUCTION[isa],
                         core.fma_per_cycle, core.gcc_march, f"the {isa} dialect: the core lists {', '.join(row.required_features) or 'no SIMD feature'}")
    if dtype is FP16:
        reason = fp16_refusal(core, arch, core.name)
        if reason:
            raise OperatorError(reason)
        row = ISA_TABLE[FP16_ISA]
        return CpuConfig(FP16, FP16_ISA, row.synthesis_lanes(core), core.vector_registers, FP_INSTRUCTION[FP16_ISA],
                         fma_rate(core, FP16_ISA), gcc_march(core, FP16_ISA), "FP16 arithmetic (FEAT_FP16)")
    if dtype is INT8 and arch == "aarch64":
        dot = arm_dots(core)[0]
        rate, source = dot_rate(core, dot)
        return CpuConfig(INT8, dot.name, 4, core.vector_registers, dot.name.upper(), rate, core.gcc_march,
                         f"{dot.feature}: {dot.name.upper()} ({source})")
    dialect, why = int8_dialect(core, host_flags)
    return CpuConfig(INT8, dialect, INT8_LANES[dialect], core.vector_registers, INT8_INSTRUCTION[dialect],
                     core.fma_per_cycle * DOT_RATE[dialect], core.gcc_march, why)
