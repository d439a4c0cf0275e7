"""fp16 CPU kernels (issue 13): FMLA .8h micro-kernels on AArch64 cores with FP16 arithmetic.

The fp32 synthesizer and templates are reused as they are; what changes is data:

  * the ISA row `neon_fp16` (isa.py): element type float16_t, 16-bit elements, 8 lanes per q
    register, the neon_fp16 dialect (templates/cpu/dialect_neon_fp16.h.j2); on cores with a
    description the full tile's K loop and the depthwise column blocks are neon_asm's inline
    assembly spelled in .8h (plan field `ukernel`), with the A registers in v0-v15 (the only
    registers FMLA .8h by element can index);
  * the micro-tiles carry 2-byte elements (tiles.MicroTile.elem_bytes), and A is loaded 8 (q) or
    4 (d) values at a time, the last load overlapping the one before (tiles.a_load_groups), so the
    register budget counts exactly the A registers the loop uses (MR=14: 2) and every cache
    footprint (KC, MC, NC) is in 2-byte units;
  * the core's FMA rate is its fp16 rate (CpuCore.fp16_fma_rate: `fp16_fma_per_cycle` of the
    description, else fma_per_cycle), and a FLOP count per FMA instruction of 2 x 8 lanes: the cost
    model asks xfc/cpu/config.py (fma_rate, gcc_march) and the description is never rewritten.

Operands, accumulators and outputs are fp16, accumulating in fp16 as XNNPACK's f16-gemm does;
bias and ReLU/ReLU6 are fused as for fp32. Winograd is never chosen (the direct lowering is forced:
its transforms would add fp16 roundings the derived bound of docs/winograd.md does not cover).
The verification bound is derived in xfc/ops/fp16.py (docs/fp16.md).

Refusals (one line, exit 2): a core without `fp16` in its features (Cortex-A53), and x86-64
hosts (no fp16 arithmetic here; xfc never labels an fp32 computation as fp16).
"""
from __future__ import annotations

from typing import Optional

from ..errors import OperatorError
from ..hardware.model import HardwareDescription
from ..ops.spec import OperatorSpec
from .cost_model import DEFAULT_CONSTANTS, CostConstants, StaticEvaluator
from .explain import CpuSynthesis
from .config import FP16_ISA, fp16_refusal as config_fp16_refusal



def fp16_refusal(hw: HardwareDescription, cluster_role: Optional[str]) -> Optional[str]:
    """Why hw's cluster cannot run fp16 kernels (one line), or None when it can (xfc/cpu/config.py)."""
    if hw.target_arch != "aarch64":
        return config_fp16_refusal(hw.clusters[0].core if hw.clusters else None, hw.target_arch, hw.name)
    cluster = hw.cluster(cluster_role)
    return config_fp16_refusal(cluster.core, hw.target_arch, f"{hw.name}, {cluster.role} cluster")


def check_fp16_target(hw: HardwareDescription, cluster_role: Optional[str] = None) -> None:
    """Raise the one-line OperatorError of fp16_refusal, if any."""
    reason = fp16_refusal(hw, cluster_role)
    if reason:
        raise OperatorError(reason)


def synthesize_fp16(spec: OperatorSpec, hw: HardwareDescription, cluster: Optional[str] = None,
                    threads: Optional[int] = None, constants: CostConstants = DEFAULT_CONSTANTS) -> CpuSynthesis:
    """An fp16 kernel plan for spec on hw's cluster (pure, deterministic). The static cost model
    scores the micro-tiles (the tile database holds fp32 rows only); the direct lowering always. The
    description is not rewritten: the synthesizer asks xfc/cpu/config.py for the fp16 FMA rate and
    -march of the neon_fp16 dialect."""
    check_fp16_target(hw, cluster)
    from .synth import synthesize_cpu   # synth imports explain, which this module also needs: no cycle
    return synthesize_cpu(spec, hw, cluster=cluster, threads=threads, evaluator=StaticEvaluator(),
                          isa=FP16_ISA, constants=constants, lowering="direct")
