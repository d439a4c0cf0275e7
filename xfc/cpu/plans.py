"""Hand-written CPU plans (tests, benchmarks, the tile database's micro-kernel driver).

hand_plan picks reasonable tiles for an ISA without a hardware description and takes every field
as an override. Its defaults for the code shape and the A operand come from the functions the
synthesizer uses (decide.py), and its plans are validated like synthesized ones when rendered.
"""
from __future__ import annotations

import re
from typing import Optional

from ..ops.spec import Conv2dSpec, DepthwiseSpec, MatmulSpec, gemm_view
from . import decide
from .ir import CpuKernelPlan, DepthwiseSchedule, GemmSchedule
from .isa import isa_row

HAND_KC = 256
HAND_MC_ROWS = 240      # MC: the largest multiple of MR up to this
HAND_NC_COLUMNS = 3072  # NC: the largest multiple of NR up to this


def hand_plan(spec, isa: str = "avx512", threads: int = 1, *, mr: Optional[int] = None, nr: Optional[int] = None,
              k_unroll: int = 4, kc: Optional[int] = None, mc: Optional[int] = None, nc: Optional[int] = None,
              parallel_axis: Optional[str] = None, a_load_bits: int = 128, a_pack: Optional[str] = None,
              ow_vectors: Optional[int] = None, oh_rows: Optional[int] = None, gcc_march: Optional[str] = None,
              qemu_cpu: str = "", transposed: bool = False, function_name: Optional[str] = None,
              loop_order: str = decide.LOOP_ORDER, prefetch_c: bool = decide.PREFETCH_C,
              prefetch_b_distance: int = decide.PREFETCH_B_DISTANCE, pack_a_kb: int = decide.PACK_A_KB,
              prefetch_next_panel_lines: Optional[int] = None, ukernel: str = "intrinsics",
              extra: tuple = ()) -> CpuKernelPlan:
    """A reasonable hand-picked plan; every field can be overridden (used by tests and benchmarks)."""
    row = isa_row(isa)
    lanes = row.hand_lanes
    march = gcc_march if gcc_march is not None else row.hand_march
    fname = function_name or ("xfc_" + re.sub(r"[^A-Za-z0-9_]", "_", spec.key()) + f"_{isa}_t{threads}")
    header = (f"xfc CPU kernel: {spec.describe()}", f"isa={isa} lanes={lanes} threads={threads}",
              "plan: hand_plan (xfc.cpu.plans)")
    if isinstance(spec, DepthwiseSpec):
        ow_vectors = ow_vectors or row.hand_depthwise_vectors
        d = DepthwiseSchedule(ow_vectors=ow_vectors, oh_rows=oh_rows or row.hand_depthwise_rows, threads=threads,
                              **decide.depthwise_code_shape(row, spec, lanes, ow_vectors))
        header += (f"depthwise tile: {d.oh_rows} rows x {d.ow_vectors} vectors",)
        return CpuKernelPlan(spec=spec, isa=isa, vector_lanes=lanes, lowering="direct_depthwise", gemm=None,
                             depthwise=d, function_name=fname, header_lines=header, gcc_march=march,
                             qemu_cpu=qemu_cpu, extra=tuple(extra))
    mr = mr or row.hand_tile[0]
    nr = nr or row.hand_tile[1]
    kc = kc or HAND_KC
    mc = mc or max(mr, (HAND_MC_ROWS // mr) * mr)
    nc = nc or max(nr, (HAND_NC_COLUMNS // nr) * nr)
    transposed = transposed and isinstance(spec, Conv2dSpec)
    if parallel_axis is None:
        m_size, n_size, _ = gemm_view(spec, transposed)
        parallel_axis = "n" if n_size >= m_size else "m"
    if a_pack is None:
        conv = isinstance(spec, Conv2dSpec)
        a_pack, _ = decide.default_a_pack(row, transposed, mr, spec.out_w if conv else None,
                                          pointwise=conv and spec.pointwise)
    if prefetch_next_panel_lines is None:
        m_size = gemm_view(spec, transposed)[0]
        prefetch_next_panel_lines = decide.next_panel_prefetch_lines(row, spec, transposed, m_size, mr, nr, kc, mc,
                                                                     k_unroll, loop_order, ukernel, row.elem_bytes,
                                                                     threads, parallel_axis)
    g = GemmSchedule(mr=mr, nr=nr, k_unroll=k_unroll, kc=kc, mc=mc, nc=nc, threads=threads,
                     parallel_axis=parallel_axis, a_load_bits=a_load_bits, a_pack=a_pack,
                     **{**decide.gemm_code_shape(row, spec, transposed, mr), "loop_order": loop_order,
                        "prefetch_c": prefetch_c, "prefetch_b_distance": prefetch_b_distance, "pack_a_kb": pack_a_kb,
                        "prefetch_next_panel_lines": prefetch_next_panel_lines, "ukernel": ukernel})
    header += (f"gemm tile: MR={mr} NR={nr} KU={k_unroll} KC={kc} MC={mc} NC={nc} split={parallel_axis} "
               f"A={g.a_pack}",)
    lowering = "gemm" if isinstance(spec, MatmulSpec) else ("implicit_gemm_t" if transposed else "implicit_gemm")
    return CpuKernelPlan(spec=spec, isa=isa, vector_lanes=lanes, lowering=lowering, gemm=g, depthwise=None,
                         function_name=fname, header_lines=header, gcc_march=march, qemu_cpu=qemu_cpu,
                         extra=tuple(extra))
