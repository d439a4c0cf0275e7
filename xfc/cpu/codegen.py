"""CPU code generation: a CpuKernelPlan -> C source of the kernel and of its harness.

Spelling only: every decision is a field of the plan (ir.py) or of the ISA row (isa.py); this
module turns them into the numbers and lists the Jinja templates under templates/cpu/ paste (the
"render context"), and the templates only spell those out. ISA dialects are data: each ISA row
names a prelude template that defines the same small macro vocabulary (XFC_VLOAD, XFC_VFMA,
XFC_ALOADw, XFC_AFMAw, ...), and the GEMM / depthwise templates are written against it.

C entry point of every kernel (dimensions are compile-time constants):

    int <function_name>(const float *in0, const float *in1, const float *bias, float *out);

with in0/in1/bias/out laid out as OperatorSpec.operand_shapes / output_shape (C order). Returns 0,
or 1 when scratch memory cannot be allocated. The harness adds

    int <function_name>_bench(in0, in1, bias, out, int warmup, int repeats, double *samples);

and, unless compiled with -DXFC_NO_MAIN, a main() that works on raw fp32 files (for qemu).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Optional

import jinja2

from ..errors import OperatorError
from ..ops.spec import NETWORK_ACTIVATIONS, Conv2dSpec, DepthwiseSpec, MatmulSpec, gemm_view
from ..ops.dtypes import kernel_abi
from ..paths import TEMPLATES_DIR
from . import neon_asm, winograd, x86_asm
from .ir import A_PACKS, C_STORES, LOOP_ORDERS, ROW_TAILS, STAGE_COPIES, UKERNELS, CpuKernelPlan
from .isa import ISA_TABLE, ISAS
from .tiles import a_load_groups   # the planner's A-load groups (tiles.py budgets their registers)

TEMPLATE_DIR = TEMPLATES_DIR

_C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SCRATCH_SLOTS = 3   # a kernel's scratch buffers: 0 packed A (or Winograd's U), 1 packed B, 2 staged input / work


@dataclass(frozen=True)
class RenderedKernel:
    source: str            # kernel translation unit (C)
    harness_source: str    # harness translation unit (C): timing loop + optional main()
    function_name: str
    isa: str
    plan: CpuKernelPlan

    @property
    def bench_name(self) -> str:
        return f"{self.function_name}_bench"

    @property
    def abi(self):
        """The entry points' operands and output as a runner sees them (xfc.ops.dtypes.KernelAbi)."""
        return kernel_abi(self.plan.spec, self.plan.dtype, getattr(self.plan, "quant", None))


def _environment() -> jinja2.Environment:
    if not (TEMPLATE_DIR / "cpu").is_dir():
        raise OperatorError(f"CPU templates not found in {TEMPLATE_DIR / 'cpu'} (expected the xfc repository layout)")
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


_ENV: jinja2.Environment | None = None


def _env() -> jinja2.Environment:
    global _ENV
    if _ENV is None:
        _ENV = _environment()
    return _ENV


# ---------------------------------------------------------------------------------------------
# Plan validation
# ---------------------------------------------------------------------------------------------

def validate_plan(plan: CpuKernelPlan) -> None:
    """Raise OperatorError (one line) if the plan cannot be rendered."""
    spec = plan.spec
    if plan.isa not in ISAS:
        raise OperatorError(f"plan isa '{plan.isa}' is not one of {', '.join(ISAS)}")
    row = ISA_TABLE[plan.isa]
    lanes = plan.vector_lanes
    if row.lanes is not None and lanes not in row.lanes:
        raise OperatorError(f"plan vector_lanes={lanes} does not match isa {plan.isa} "
                            f"(expected {row.lanes[0]})")
    if lanes < 1 or lanes & (lanes - 1):
        raise OperatorError(f"plan vector_lanes={lanes} must be a power of two")
    if not _C_IDENT.match(plan.function_name or ""):
        raise OperatorError(f"plan function_name '{plan.function_name}' is not a C identifier")
    allowed = {MatmulSpec: ("gemm",), Conv2dSpec: ("implicit_gemm", "implicit_gemm_t", winograd.LOWERING),
               DepthwiseSpec: ("direct_depthwise",)}[type(spec)]
    if plan.lowering not in allowed:
        raise OperatorError(f"plan lowering '{plan.lowering}' does not fit {spec.name} "
                            f"(expected {' or '.join(repr(a) for a in allowed)})")
    if spec.epilogue.extended and row.elem_type != "float":
        raise OperatorError(f"epilogue '{spec.epilogue.describe()}' is for fp32 kernels (isa {plan.isa})")
    if spec.epilogue.residual and plan.lowering == "direct_depthwise":
        raise OperatorError("a residual epilogue is fused into GEMM and Winograd kernels, not depthwise ones")
    expected = plan.lowering
    if expected == winograd.LOWERING:
        winograd.validate(plan)
        return
    if expected == "direct_depthwise":
        d = plan.depthwise
        if d is None:
            raise OperatorError("plan lowering 'direct_depthwise' needs a DepthwiseSchedule (plan.depthwise is None)")
        for name in ("ow_vectors", "oh_rows", "threads"):
            if getattr(d, name) < 1:
                raise OperatorError(f"depthwise schedule {name}={getattr(d, name)} must be >= 1")
        _one_of("depthwise schedule row_tail", d.row_tail, ROW_TAILS)
        _one_of("depthwise schedule stage_copy", d.stage_copy, STAGE_COPIES[1:])
        if d.row_tail == "masked" and not row.has_mask:
            raise OperatorError(f"depthwise row_tail 'masked' needs masked stores, which isa {plan.isa} lacks")
        if d.row_tail == "half_width" and not (row.half_vectors and row.has_mask
                                                and spec.out_w % (d.ow_vectors * lanes)):
            raise OperatorError(f"depthwise row_tail 'half_width' needs half-width vectors and masks (isa {plan.isa}) "
                                f"and a ragged row (OW={spec.out_w}, blocks of {d.ow_vectors * lanes})")
        _check_stage_copy(d.stage_copy, spec.stride_w, staged=True)
        _one_of("depthwise schedule ukernel", d.ukernel, UKERNELS)
        if d.ukernel != "intrinsics":
            regs = neon_asm.depthwise_registers(spec.r * spec.s, d.oh_rows, d.ow_vectors, spec.epilogue.activation)
            if (not (row.asm_ukernels and row.target_arch == "aarch64") or regs > neon_asm.VECTOR_REGISTERS
                    or spec.out_w < d.ow_vectors * lanes):
                raise OperatorError(f"depthwise schedule ukernel '{d.ukernel}' needs isa neon or neon_fp16, at most "
                                    f"{neon_asm.VECTOR_REGISTERS} vector registers and one whole column block "
                                    f"(isa {plan.isa}, {regs} registers, OW={spec.out_w})")
        return
    g = plan.gemm
    if g is None:
        raise OperatorError(f"plan lowering '{plan.lowering}' needs a GemmSchedule (plan.gemm is None)")
    for name in ("mr", "nr", "k_unroll", "kc", "mc", "nc", "threads"):
        if getattr(g, name) < 1:
            raise OperatorError(f"gemm schedule {name}={getattr(g, name)} must be >= 1")
    if g.nr % lanes:
        raise OperatorError(f"gemm schedule nr={g.nr} is not a multiple of the {lanes} vector lanes")
    if g.mc % g.mr:
        raise OperatorError(f"gemm schedule mc={g.mc} is not a multiple of mr={g.mr}")
    if g.nc % g.nr:
        raise OperatorError(f"gemm schedule nc={g.nc} is not a multiple of nr={g.nr}")
    _one_of("gemm schedule a_pack", g.a_pack, A_PACKS)
    _one_of("gemm schedule c_store", g.c_store, C_STORES)
    _one_of("gemm schedule loop_order", g.loop_order, LOOP_ORDERS)
    _one_of("gemm schedule stage_copy", g.stage_copy, STAGE_COPIES)
    if g.prefetch_b_distance < 0 or g.pack_a_kb < 1:
        raise OperatorError(f"gemm schedule prefetch_b_distance={g.prefetch_b_distance} must be >= 0 and "
                            f"pack_a_kb={g.pack_a_kb} >= 1")
    transposed = plan.lowering == "implicit_gemm_t"
    if g.prefetch_next_panel_lines < 0 or (g.prefetch_next_panel_lines and g.loop_order != "jr_ir"):
        raise OperatorError(f"gemm schedule prefetch_next_panel_lines={g.prefetch_next_panel_lines} must be >= 0, "
                            f"and 0 unless the loop order is jr_ir (it prefetches the panel after the current one)")
    if (g.c_store == "direct") == transposed:
        raise OperatorError(f"gemm schedule c_store '{g.c_store}' does not fit lowering '{plan.lowering}' "
                            f"({'a transposed C is stored through a tile' if transposed else 'C is stored directly'})")
    if g.c_store == "vector_transpose" and not (row.transpose16 and g.mr <= 16 and lanes == 16):
        raise OperatorError(f"gemm schedule c_store 'vector_transpose' needs a 16x16 register transpose "
                            f"(isa {plan.isa}, 16 lanes) and MR <= 16 (MR={g.mr})")
    staged = isinstance(spec, Conv2dSpec) and not spec.pointwise   # pointwise: the input is read in place
    _check_stage_copy(g.stage_copy, getattr(spec, "stride_w", 1), staged)
    if plan.lowering == "implicit_gemm_t":
        if g.a_pack == "direct":
            raise OperatorError("lowering 'implicit_gemm_t' reads A (im2col rows) packed or from the staged image: "
                                "a_pack must be 'packed' or 'im2col_direct'")
        if g.a_pack == "im2col_direct" and spec.out_w % g.mr and not spec.pointwise:
            raise OperatorError(f"a_pack 'im2col_direct' needs MR={g.mr} to divide the output width {spec.out_w} "
                                "(a tile's pixels must lie in one output row of the staged image)")
    elif g.a_pack == "im2col_direct":
        raise OperatorError("a_pack 'im2col_direct' is only for lowering 'implicit_gemm_t'")
    if g.parallel_axis not in ("n", "m"):
        raise OperatorError(f"gemm schedule parallel_axis '{g.parallel_axis}' must be 'n' or 'm'")
    if row.lane_indexed and g.a_load_bits not in (64, 128):
        raise OperatorError(f"gemm schedule a_load_bits={g.a_load_bits} must be 64 or 128 for neon")
    _one_of("gemm schedule ukernel", g.ukernel, UKERNELS)
    if g.ukernel != "intrinsics" and plan.isa in x86_asm.DIALECTS:
        regs = x86_asm.register_count(g.mr, g.nr // lanes)
        if g.ukernel != "asm_out_of_order" or regs > x86_asm.VECTOR_REGISTERS[plan.isa]:
            raise OperatorError(f"gemm schedule ukernel '{g.ukernel}' on isa {plan.isa} needs 'asm_out_of_order' and "
                                f"at most {x86_asm.VECTOR_REGISTERS[plan.isa]} vector registers ({regs})")
    elif g.ukernel != "intrinsics":
        groups = a_load_groups(plan.isa, g.mr, g.a_load_bits)
        regs = neon_asm.register_count(g.mr, g.nr // lanes, groups)
        if (not (row.asm_ukernels and row.target_arch == "aarch64") or g.a_pack == "direct"
                or regs > neon_asm.VECTOR_REGISTERS or len(groups) > row.indexed_registers):
            raise OperatorError(f"gemm schedule ukernel '{g.ukernel}' needs isa neon or neon_fp16, A packed or "
                                f"im2col_direct, at most {neon_asm.VECTOR_REGISTERS} vector registers and the A "
                                f"registers in v0-v{row.indexed_registers - 1} (isa {plan.isa}, a_pack {g.a_pack}, "
                                f"{regs} registers, {len(groups)} for A)")
    if g.mr > 64 or g.nr // lanes > 16:
        raise OperatorError(f"gemm register tile {g.mr}x{g.nr} is too large to unroll")


def _one_of(what: str, value, allowed) -> None:
    if value not in allowed:
        raise OperatorError(f"{what} '{value}' must be one of {', '.join(map(str, allowed))}")


def _check_stage_copy(stage_copy: str, stride_w: int, staged: bool) -> None:
    if staged != (stage_copy != "none"):
        raise OperatorError(f"stage_copy '{stage_copy}' does not fit this plan (the input is "
                            f"{'staged' if staged else 'not staged'})")
    if stage_copy == "run" and stride_w != 1:
        raise OperatorError(f"stage_copy 'run' copies contiguous runs, which needs stride 1 (stride_w={stride_w})")


# ---------------------------------------------------------------------------------------------
# Render context
# ---------------------------------------------------------------------------------------------

def _conv_geometry(spec) -> dict:
    return {"c": spec.c, "h": spec.h, "w": spec.w, "r": spec.r, "s": spec.s,
            "sh": spec.stride_h, "sw": spec.stride_w, "pt": spec.pad_top, "pl": spec.pad_left,
            "dh": spec.dilation_h, "dw": spec.dilation_w, "oh": spec.out_h, "ow": spec.out_w}


def _common_context(plan: CpuKernelPlan, template_name: str) -> dict:
    spec = plan.spec
    row = ISA_TABLE[plan.isa]
    return {
        "header_lines": list(plan.header_lines) or [f"xfc kernel {plan.function_name}: {spec.describe()}"],
        "template_name": template_name,
        "function_name": plan.function_name,
        "lanes": plan.vector_lanes,
        "elem": row.elem_type,   # C element type of every operand ('float'; 'float16_t' for fp16)
        "threads": plan.threads,
        "dialect_template": row.prelude,
        "has_mask": row.has_mask,
        "has_bias": spec.epilogue.bias,
        "activation": spec.epilogue.activation,
        "alpha": f"{spec.epilogue.alpha!r}f",   # leakyrelu's slope as a C float literal
        "network_activation": spec.epilogue.activation in NETWORK_ACTIVATIONS,
        "residual": spec.epilogue.residual,
        "threads_symbol": None,   # render_cpu_kernel(threads_symbol=...): the thread count is a variable
        "scratch_symbol": None,   # render_cpu_kernel(scratch_symbol=...): the network's shared scratch
        "scratch_slots": SCRATCH_SLOTS,
        "epilogue_text": spec.epilogue.describe(),
        "problem_text": spec.describe(),
        "arg_doc": {"matmul": "in0=A[batch,M,K], in1=B[batch,K,N], bias[N], out=C[batch,M,N]",
                    "conv2d": "in0=input[N,C,H,W], in1=weight[K,C,R,S], bias[K], out[N,K,OH,OW]",
                    "depthwise": "in0=input[N,C,H,W], in1=weight[C,1,R,S], bias[C], out[N,C,OH,OW]"}[spec.name],
    }


def micro_kernel_variants(plan: CpuKernelPlan, m: int, n: int, lda: int) -> list[dict]:
    """The register-tile shapes that occur: full MR x NR, plus the row tail (M % MR rows), the
    column tail (N % NR columns) and their corner. Column tails use ceil(cols / LANES) vectors;
    a partial last vector is masked where the dialect can, else computed into a local tile."""
    g, lanes = plan.gemm, plan.vector_lanes
    has_mask = ISA_TABLE[plan.isa].has_mask
    via_local_tile = g.c_store != "direct"  # every tile of a transposed C is stored through a local tile
    row_stride = lda if g.a_pack == "direct" else 1
    rows_options = [g.mr] + ([m % g.mr] if m % g.mr else [])
    cols_options = [g.nr] + ([n % g.nr] if n % g.nr else [])
    variants = []
    for rows in rows_options:
        for cols in cols_options:
            full = rows == g.mr and cols == g.nr
            partial = cols % lanes
            name = "xfc_ukernel" if full else f"xfc_ukernel_{rows}x{cols}"
            variants.append({
                "name": name, "full": full, "rows": rows, "cols": cols,
                "nvec": -(-cols // lanes), "mask_lanes": partial if partial and has_mask and not via_local_tile else 0,
                "via_tile": bool(partial and not has_mask) or via_local_tile,
                # a transposed C merged by scalar code (c_store 'tile'): bias (one per column) and the
                # activation are applied in registers when no earlier slice or residual comes first,
                # on whole vectors only (a partial last vector would load bias past N)
                "epilogue_in_registers": g.c_store == "tile" and not partial,
                "a_groups": a_load_groups(plan.isa, rows, g.a_load_bits, row_stride),
            })
            variants[-1]["asm"] = _asm_kloop(plan, variants[-1]) if full else None
    return variants


def a_kstep(g) -> int:
    """Floats between consecutive k values of one A row: MR when A is packed [k][MR], else 1."""
    return g.mr if g.a_pack == "packed" else 1


def _asm_kloop(plan: CpuKernelPlan, variant: dict) -> Optional[dict]:
    """The inline-assembly K loop of the full tile when the plan asks for one (neon_asm.py)."""
    g = plan.gemm
    if g.ukernel == "intrinsics":
        return None
    row = ISA_TABLE[plan.isa]
    if plan.isa in x86_asm.DIALECTS:
        kloop = x86_asm.render_x86_kloop(plan.isa, variant["rows"], variant["nvec"], variant["a_groups"], g.a_pack,
                                         a_kstep(g), g.nr, g.k_unroll)
        return {**kloop, "order": g.ukernel, "elem": row.elem_type}
    kloop = neon_asm.render_asm_kloop(variant["rows"], variant["nvec"], variant["a_groups"], g.a_pack, g.mr,
                                      g.k_unroll, g.ukernel, row.elem_bits, row.indexed_registers)
    return {**kloop, "order": g.ukernel, "elem": row.elem_type}


def conv_stage_geometry(spec) -> dict:
    """Size of the zero-padded, column-phase-split input the im2col packer reads (see gemm.c.j2)."""
    rows = spec.window_rows(spec.out_h)
    cols = spec.out_w + ((spec.s - 1) * spec.dilation_w) // spec.stride_w
    return {"rows": rows, "cols": cols}


def gemm_context(plan: CpuKernelPlan) -> dict:
    spec, g = plan.spec, plan.gemm
    ctx = _common_context(plan, "cpu/gemm.c.j2")
    transposed = plan.lowering == "implicit_gemm_t"
    m, n, lda = gemm_view(spec, transposed)   # transposed: rows are output pixels, columns output channels
    ctx.update({
        "mr": g.mr, "nr": g.nr, "nv": g.nr // plan.vector_lanes, "ku": g.k_unroll,
        "kc": g.kc, "mc": g.mc, "nc": g.nc, "parallel_axis": g.parallel_axis,
        "a_pack": g.a_pack, "a_kstep": a_kstep(g),
        "a_pack_text": {"packed": "packed into MR-row panels [kc][MR], zero-padded",
                        "direct": "read in place (row-major, one broadcast per row and k step)",
                        "im2col_direct": ("read in place from the image: MR consecutive pixels at the k row's "
                                          "offset koff[k]" if isinstance(spec, Conv2dSpec) and spec.pointwise else
                                          "read from the staged image: MR consecutive pixels of one output row "
                                          "at the k row's offset koff[k]")}[g.a_pack],
        "variants": micro_kernel_variants(plan, m, n, lda),
        "loop_order": g.loop_order,
        "prefetch_c": g.prefetch_c,
        "prefetch_b_distance": g.prefetch_b_distance,
        "prefetch_next_panel_lines": g.prefetch_next_panel_lines,
        "elem_bytes": ISA_TABLE[plan.isa].elem_bytes,
        "pack_a_kb": g.pack_a_kb,
        "stage_copy": g.stage_copy,
        "ldc": m if transposed else n,   # floats between output rows of C (C transposed: rows are channels)
    })
    m_padded, n_padded = -(-m // g.mr) * g.mr, -(-n // g.nr) * g.nr
    if isinstance(spec, MatmulSpec):
        packed_floats = spec.batch * spec.k * n_padded
        packed_text = f"B as {spec.batch} x K x NPAD panels"
    elif transposed:
        packed_floats, packed_text = lda * n_padded, "filters transposed, as K x NPAD panels"
    elif g.a_pack == "packed":
        packed_floats, packed_text = m_padded * lda, "filters as MPAD x K panels"
    else:
        packed_floats, packed_text = m * lda, "filters as given (read in place)"
    ctx.update({"m_padded": m_padded, "n_padded": n_padded, "packed_floats": packed_floats,
                "packed_text": packed_text, "transposed": transposed,
                "vector_transpose": g.c_store == "vector_transpose",
                "weights_operand": "b" if isinstance(spec, MatmulSpec) or transposed else "a",
                "b_pre_batch_stride": spec.k * n_padded if isinstance(spec, MatmulSpec) else 0})
    if isinstance(spec, MatmulSpec):
        ctx.update({
            "m": spec.m, "n": spec.n, "k": spec.k, "batch": spec.batch, "lda": spec.k,
            "a_batch_stride": spec.m * spec.k,
            "b_batch_stride": spec.k * spec.n, "c_batch_stride": spec.m * spec.n,
            "a_source": "matrix", "b_pack": "rows", "ldb": spec.n, "bias_axis": "n",
            "bias_axis_text": "one value per output column n", "staged_input": False, "stage_geometry": False,
        })
    elif transposed:
        geo = _conv_geometry(spec)
        ctx.update({
            "m": m, "n": n, "k": lda, "batch": spec.n, "lda": lda,
            "a_batch_stride": spec.c * spec.h * spec.w, "b_batch_stride": 0,
            "c_batch_stride": spec.k * spec.out_h * spec.out_w,
            "a_source": "im2col", "b_pack": "weights_t", "ldb": lda, "conv": geo,
            "stage": conv_stage_geometry(spec), "staged_input": not spec.pointwise, "stage_geometry": True,
            "bias_axis": "n", "bias_axis_text": "one value per output channel (GEMM column n)",
        })
    else:
        geo = _conv_geometry(spec)
        crs = spec.c * spec.r * spec.s
        pointwise = spec.pointwise
        ctx.update({
            "m": spec.k, "n": spec.out_h * spec.out_w, "k": crs, "batch": spec.n, "lda": crs,
            "a_batch_stride": 0,
            "b_batch_stride": spec.c * spec.h * spec.w, "c_batch_stride": spec.k * spec.out_h * spec.out_w,
            "a_source": "matrix", "b_pack": "rows" if pointwise else "im2col", "ldb": spec.h * spec.w, "conv": geo,
            "stage": conv_stage_geometry(spec), "staged_input": not pointwise, "stage_geometry": not pointwise,
            "bias_axis": "m", "bias_axis_text": "one value per output channel (GEMM row m)",
        })
    return ctx


def depthwise_context(plan: CpuKernelPlan) -> dict:
    spec, d = plan.spec, plan.depthwise
    lanes = plan.vector_lanes
    geo = _conv_geometry(spec)
    ow_block = d.ow_vectors * lanes
    oh_padded = math.ceil(spec.out_h / d.oh_rows) * d.oh_rows
    ow_padded = math.ceil(spec.out_w / ow_block) * ow_block
    sw = spec.stride_w
    max_off = ((spec.s - 1) * spec.dilation_w) // sw
    phase_width = max(ow_padded + max_off, math.ceil((spec.w + spec.pad_left) / sw))
    phase_width = math.ceil(phase_width / lanes) * lanes
    block_rows = spec.window_rows(d.oh_rows)
    row_stride = sw * phase_width
    taps = []
    for r in range(spec.r):
        for s in range(spec.s):
            col = s * spec.dilation_w
            phase, off = col % sw, col // sw
            offsets = [(i * spec.stride_h + r * spec.dilation_h) * row_stride + phase * phase_width + off
                       for i in range(d.oh_rows)]
            taps.append({"index": r * spec.s + s, "r": r, "s": s, "row_offsets": offsets})
    # Each distinct input vector of the register tile is loaded once and feeds every (output
    # row, tap) that reads it: with oh_rows rows a loaded row serves up to R taps, so loads per
    # FMA drop from 1 to about (oh_rows + R - 1) / (oh_rows * R).
    by_offset: dict[int, list[dict]] = {}
    for tap_number, t in enumerate(taps):
        for i in range(d.oh_rows):
            for j in range(d.ow_vectors):
                by_offset.setdefault(t["row_offsets"][i] + j * lanes, []).append(
                    {"row": i, "vec": j, "tap": tap_number})
    loads = [{"offset": off, "uses": uses} for off, uses in sorted(by_offset.items())]
    # The last block of a row when OW is not a multiple of the block (row_tail 'half_width'): per
    # vector, the lanes that hold outputs; vectors with at most half the lanes valid run at half
    # width, empty ones are skipped.
    tail = None
    if d.row_tail == "half_width":
        tail_ow0 = (spec.out_w // ow_block) * ow_block
        valid = [max(0, min(lanes, spec.out_w - tail_ow0 - j * lanes)) for j in range(d.ow_vectors)]
        # a load may feed several vectors (taps shifted by a whole vector): split it per vector
        tail_loads = [{"offset": ld["offset"], "vec": j, "uses": [u for u in ld["uses"] if u["vec"] == j]}
                      for ld in loads for j in sorted({u["vec"] for u in ld["uses"]}) if valid[j]]
        tail = {"ow0": tail_ow0, "loads": tail_loads,
                "vectors": [{"vec": j, "valid": v, "half": 0 < v <= lanes // 2} for j, v in enumerate(valid)]}
    dw_asm = None
    if d.ukernel != "intrinsics":
        row = ISA_TABLE[plan.isa]
        dw_asm = {**neon_asm.render_depthwise_asm(loads, len(taps), d.oh_rows, d.ow_vectors, lanes, spec.out_w,
                                                  spec.epilogue.activation, d.ukernel, row.elem_bits),
                  "elem": row.elem_type}
    ctx = _common_context(plan, "cpu/depthwise.c.j2")
    ctx.update({
        "dw_asm": dw_asm, "dw_asm_blocks": spec.out_w // ow_block,
        "loads": loads, "tail": tail, "row_tail": d.row_tail, "stage_copy": d.stage_copy,
        "batch": spec.n, "conv": geo, "oh_rows": d.oh_rows, "ow_vectors": d.ow_vectors,
        "ow_block": ow_block, "oh_padded": oh_padded, "ow_padded": ow_padded,
        "block_rows": block_rows, "phase_width": phase_width, "row_stride": row_stride, "taps": taps,
    })
    return ctx


def render_context(plan: CpuKernelPlan) -> tuple[str, dict]:
    validate_plan(plan)
    if plan.lowering == "direct_depthwise":
        return "cpu/depthwise.c.j2", depthwise_context(plan)
    if plan.lowering == winograd.LOWERING:
        template, m, n, lda = winograd.render_view(plan)
        return template, winograd.context(plan, _common_context(plan, template), micro_kernel_variants(plan, m, n, lda))
    return "cpu/gemm.c.j2", gemm_context(plan)


def render_cpu_kernel(plan: CpuKernelPlan, threads_symbol: Optional[str] = None,
                      scratch_symbol: Optional[str] = None) -> RenderedKernel:
    """Render the kernel and harness C sources for a plan (deterministic: same plan, same text).
    threads_symbol: the name of a thread-local `int` (defined elsewhere, e.g. by the network runtime,
    which sets it to the thread count chosen at create) that replaces the plan's constant thread count
    in the OpenMP regions; None: the plan's count. scratch_symbol: the prefix of the thread-local
    scratch arrays `<symbol>_ptr[SCRATCH_SLOTS]` (void *) and `<symbol>_cap[SCRATCH_SLOTS]` (size_t)
    the network runtime defines, shared by all its kernels; None: the kernel's own."""
    template_name, ctx = render_context(plan)
    for what, symbol in (("threads_symbol", threads_symbol), ("scratch_symbol", scratch_symbol)):
        if symbol is not None:
            if not _C_IDENT.match(symbol):
                raise OperatorError(f"{what} '{symbol}' is not a C identifier")
            ctx[what] = symbol
    env = _env()
    try:
        source = env.get_template(template_name).render(**ctx)
        spec = plan.spec
        harness_ctx = {
            "header_lines": ctx["header_lines"], "template_name": "cpu/harness.c.j2",
            "function_name": plan.function_name, "bench_name": f"{plan.function_name}_bench",
            "in_elems": [math.prod(shape) for shape in spec.operand_shapes],
            "out_elems": math.prod(spec.output_shape), "elem": ctx["elem"],
        }
        harness = env.get_template("cpu/harness.c.j2").render(**harness_ctx)
    except jinja2.TemplateError as exc:  # a template bug, not a user error; still one line
        raise OperatorError(f"rendering {template_name} for {plan.function_name} failed: {exc}") from exc
    return RenderedKernel(source=source, harness_source=harness, function_name=plan.function_name,
                          isa=plan.isa, plan=plan)
