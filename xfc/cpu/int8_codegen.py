"""int8 code generation: a Int8Plan -> C source of the kernel (templates/cpu/int8_gemm.c.j2 or
int8_depthwise.c.j2, dialect pieces in int8_dialect.h.j2) and of its harness (harness_int8.c.j2: the timing
entry points, and a main speaking the CPU harness protocol of xfc/runners/base.py).

C entry points (dimensions and quantization constants are compile-time; scales are not):

    long <fn>_packed_bytes(void);
    int  <fn>_prepack(const int8_t *w, uint8_t *packed);        weights -> packed layout + sums
    int  <fn>_packed(const void *x, const uint8_t *packed, const int32_t *bias, const float *mult, void *out);
    int  <fn>(const void *x, const int8_t *w, const int32_t *bias, const float *mult, void *out);
    int  <fn>_bench / <fn>_bench_packed(..., int warmup, int repeats, double *samples);

x: uint8 or int8 activations (spec.operand_shapes[0]); w: int8 (operand_shapes[1]); bias: int32 per
output channel (NULL: none); mult: fp32 per output channel (xfc.ops.quant.multipliers); out: the
activation type, spec.output_shape. Return 0, or 1 when scratch memory cannot be allocated.
"""
from __future__ import annotations

import math
from typing import Optional

import jinja2
import numpy as np

from ..errors import OperatorError
from ..ops.quant import NARROW_WEIGHT_MAX, channels, clamp_bounds, np_type
from ..ops.spec import Conv2dSpec, DepthwiseSpec, gemm_view
from ..paths import TEMPLATES_DIR
from .codegen import SCRATCH_SLOTS, RenderedKernel
from .dw_channels import CHANNEL_GROUP, channels_buffers, channels_q_step
from .int8_plan import Int8Plan, widened_to_int16
from .int8_synth import channels_in_place_shape


_ENV = None


def _env() -> jinja2.Environment:
    global _ENV
    if _ENV is None:
        _ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)), undefined=jinja2.StrictUndefined,
                                  trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)
    return _ENV


ARG_DOC = {"matmul": "in0=x[batch,M,K], in1=w[batch,K,N] int8, bias[N] int32, mult[N] fp32, out[batch,M,N]",
           "conv2d": "in0=x[N,C,H,W], in1=w[K,C,R,S] int8, bias[K] int32, mult[K] fp32, out[N,K,OH,OW]",
           "depthwise": "in0=x[N,C,H,W], in1=w[C,1,R,S] int8, bias[C] int32, mult[C] fp32, out[N,C,OH,OW]"}


STAGE_PAD_MAX_BYTES = 64 * 1024   # the stride-2 staging's padded rows on the stack (templates/cpu/int8_gemm.c.j2)


def _conv(spec) -> dict:
    return {"c": spec.c, "h": spec.h, "w": spec.w, "r": spec.r, "s": spec.s, "sh": spec.stride_h, "sw": spec.stride_w,
            "pt": spec.pad_top, "pl": spec.pad_left, "dh": spec.dilation_h, "dw": spec.dilation_w,
            "oh": spec.out_h, "ow": spec.out_w}


def _shift(plan: Int8Plan) -> tuple[int, int]:
    """(XOR applied to every activation byte, the zero point in the shifted domain): the plan's
    activation_offset spelled (an XOR with 0x80 adds or subtracts 128)."""
    return (0x80 if plan.activation_offset else 0), plan.quant.a_zero_point + plan.activation_offset


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _tap_pairs_context(plan: Int8Plan) -> dict:
    """The geometry of the 'tap_pairs' depthwise layout (int8_depthwise.c.j2) for the plan's block.
    Slot j of a filter row holds taps (2j, 2j + 1); its input column, sw * ow + 2j * dw, is
    sw * (ow + q) + p: phase p of the staged row, pair ow + q."""
    spec, lanes = plan.spec, plan.lanes
    sw, dw, sh, dh = spec.stride_w, spec.dilation_w, spec.stride_h, spec.dilation_h
    pairs = math.ceil(spec.s / 2)
    cols = [(2 * j * dw) % sw for j in range(pairs)], [(2 * j * dw) // sw for j in range(pairs)]
    phases = sorted(set(cols[0]))
    slots = [{"phase": p, "phase_index": phases.index(p), "q": q} for p, q in zip(*cols)]
    vecs = math.ceil(spec.out_w / lanes)
    wph = vecs * lanes + max(cols[1])                 # pairs a row's vector loads reach
    wpha = _round_up(wph, 16)
    staging = plan.depthwise_staging
    if staging == "direct":
        row = _round_up(max(wph, -(-(spec.pad_left + spec.w) // 2)), 16)
        vlen = 2 * row                                # the row is V itself
    else:
        row = len(phases) * wpha
        reads = wpha + dw if staging == "pairs" else sw * (wpha - 1) + max(phases) + dw + 1
        vlen = _round_up(max(reads, spec.pad_left + spec.w), 32)
    fpre = _round_up(spec.pad_left, 16)
    flen = fpre + max(spec.h * spec.w, 16) + vlen
    partial = spec.out_w % lanes
    nv = plan.nv
    if partial:
        col_groups = (vecs - 1) // nv
        col_tail = vecs - col_groups * nv
    else:
        col_groups, col_tail = vecs // nv, vecs % nv
    rb = plan.tile_rows
    row_uses = {}
    for rows in {rb, spec.out_h % rb} - {0}:
        uses: dict[int, list] = {}
        for t in range(rows):
            for r in range(spec.r):
                uses.setdefault(t * sh + r * dh, []).append((t, r))
        row_uses[rows] = sorted(uses.items())
    return {"L": lanes, "NV": nv, "RB": rb, "SJ": pairs, "NPH": len(phases), "phases": phases, "slots": slots,
            "WPHA": wpha, "ROW": row, "VLEN": vlen, "FPRE": fpre, "FLEN": flen, "staging": staging, "row_uses": row_uses,
            "col_groups": col_groups, "col_tail_vecs": col_tail, "col_last": partial or lanes,
            "row_groups": spec.out_h // rb, "row_tail": spec.out_h % rb,
            "vp": "_mm512" if lanes == 16 else "_mm256", "vnni_madd": plan.dialect == "vnni"}


def _mask64(bits: int) -> str:
    """A __mmask64 literal of the low `bits` bits."""
    return f"(__mmask64){(1 << bits) - 1:#x}ULL"


def _channels_context(plan: Int8Plan) -> dict:
    """The geometry of the 'channels' depthwise layout (int8_depthwise.c.j2): Q's rows and columns,
    its columns that touch the padding (and the mask of the quad bytes there), T's extent, the
    64-pixel chunks, the output pixels per block."""
    spec = plan.spec
    if spec.dilation_w != 1:
        raise OperatorError(f"{plan.function_name}: the channels depthwise layout reads 4 adjacent columns per "
                            f"quad (dilation_w 1), not {spec.dilation_w}")
    lanes = CHANNEL_GROUP
    quads = math.ceil(spec.s / 4)
    buffers = channels_buffers(spec, plan.target_arch == "aarch64")
    q_rows, q_cols = buffers.q_rows, buffers.q_cols
    step = channels_q_step(spec)
    edges, inner = [], []
    for j in range(q_cols):            # Q column j: the quad at input column j * step - pad_left
        bad = [k for k in range(4) if not 0 <= j * step - spec.pad_left + k < spec.w]
        if bad:
            edges.append((j, "(__mmask64)%#xULL" % sum(0x1111111111111111 << k for k in bad)))
        else:
            inner.append(j)
    # the inner columns are one run (a column inside the row has every column between it and the row's
    # other inner columns inside too); the edge ones are unrolled with their masks
    inner_run = (inner[0], inner[-1] + 1) if inner else (0, 0)
    assert len(inner) == inner_run[1] - inner_run[0]
    hw_in, hw_out = spec.h * spec.w, spec.out_h * spec.out_w
    in_chunks, out_chunks = buffers.in_chunks, buffers.out_chunks
    # lane c byte k of a Q entry <- byte 16 k + c of T's 64 bytes (_mm512_set_epi8 lists byte 63 first)
    quad_index = ", ".join(str(16 * (b % 4) + b // 4) for b in reversed(range(64)))
    pb = plan.nv
    shift = plan.quant.shift       # x86 (u8 x s8): int8 activations made u8 by an XOR with 0x80 (x + 128)
    flip = plan.quant.act_type == "uint8"   # AArch64 (s8 x s8): uint8 activations made s8 by it (x - 128)
    # part p (channels 4p .. 4p + 3) of a Q entry: byte 4c' + k <- byte 16k + 4p + c' of T's 64 bytes
    neon_quad_index = [[16 * (i % 4) + 4 * p + i // 4 for i in range(16)] for p in range(4)]
    return {"CL": lanes, "groups": math.ceil(spec.c / lanes), "SQ": quads, "QH": q_rows, "QW": q_cols,
            "q_in_rows": max(0, min(spec.h, q_rows - spec.pad_top)), "q_edges": edges, "q_inner": inner_run,
            "pad_rows": [r for r in range(q_rows) if not spec.pad_top <= r < spec.pad_top + spec.h],
            "in_chunks": in_chunks, "out_chunks": out_chunks, "TPRE": buffers.t_pre, "TLEN": buffers.t_pixels,
            # x86: the last 64-pixel chunk's bytes
            "in_last_mask": _mask64(hw_in - 64 * (in_chunks - 1)) if buffers.chunk_pixels == 64 else "",
            "out_last_mask": _mask64(hw_out - 64 * (out_chunks - 1)) if buffers.chunk_pixels == 64 else "",
            "quad_index": quad_index, "PB": pb, "pb_groups": spec.out_w // pb, "pb_tail": spec.out_w % pb,
            "shift": shift, "zu": plan.quant.a_zero_point + shift, "QSTEP": step,
            "ow_cols": spec.stride_w // step, "quad_cols": 4 // step,
            "flip": flip, "zs": plan.quant.a_zero_point - (128 if flip else 0), "TH": buffers.t_rows,
            "TW": buffers.t_cols,
            "neon_quad_index": neon_quad_index}


def render_context(plan: Int8Plan, threads_symbol: Optional[str] = None,
                   scratch_symbol: Optional[str] = None) -> tuple[str, dict]:
    """(template, context). threads_symbol: a thread-local `int` defined by the network runtime (the
    count chosen at create) that the OpenMP regions read instead of the plan's thread count.
    scratch_symbol: the prefix of the network runtime's per-thread scratch arrays (codegen.SCRATCH_SLOTS
    of them), shared by every kernel of the network; None: each call allocates its own."""
    spec, q = plan.spec, plan.quant
    qlo, qhi = clamp_bounds(spec, q)
    x86 = plan.target_arch != "aarch64"
    parallel = plan.threads > 1 or threads_symbol is not None
    ctx = {"fn": plan.function_name, "header_lines": list(plan.header_lines), "isa": plan.dialect, "op": spec.name,
           "arg_doc": ARG_DOC[spec.name], "threads": threads_symbol or plan.threads, "parallel": parallel,
           "threads_symbol": threads_symbol, "scratch_symbol": scratch_symbol, "scratch_slots": SCRATCH_SLOTS,
           "x86": x86, "march": plan.gcc_march,
           "out_zp": q.out_zero_point, "qlo": qlo, "qhi": qhi, "out_signed": q.out_type == "int8",
           "act_signed": q.act_type == "int8", "za": q.a_zero_point, "k_unroll": plan.k_unroll,
           "target_pragma": plan.target_pragma}
    if isinstance(spec, DepthwiseSpec):
        ctx.update({"conv": _conv(spec), "batch": spec.n, "hp": spec.h + spec.pad_top + spec.pad_bottom,
                    "wp": spec.w + spec.pad_left + spec.pad_right, "layout": plan.depthwise_layout})
        if plan.depthwise_layout == "tap_pairs":
            if plan.parallel_axis != "planes":
                raise OperatorError(f"{plan.function_name}: the depthwise template splits planes only, "
                                    f"not {plan.parallel_axis}")
            if plan.depthwise_staging not in ("pairs", "direct", "gather"):
                raise OperatorError(f"{plan.function_name}: unknown depthwise staging '{plan.depthwise_staging}'")
            ctx.update(_tap_pairs_context(plan))
            ctx["packed_bytes"] = spec.c * spec.r * ctx["SJ"] * 4        # int32 tap pairs [C][R][SJ]
        elif plan.depthwise_layout == "channels":
            if plan.dialect not in ("vnni", "sdot") or plan.parallel_axis != "channel_groups":
                raise OperatorError(f"{plan.function_name}: the channels depthwise layout is for the vnni and sdot "
                                    f"dialects, threads splitting channel groups (not {plan.dialect}, "
                                    f"{plan.parallel_axis})")
            if (plan.dialect == "sdot") != (plan.target_arch == "aarch64"):
                raise OperatorError(f"{plan.function_name}: the {plan.dialect} channels layout does not render for "
                                    f"{plan.target_arch}")
            ctx.update(_channels_context(plan))
            # per group: R x SQ weight quads of 64 bytes; then one int32 tap sum per channel of every group
            ctx["packed_bytes"] = ctx["groups"] * (spec.r * ctx["SQ"] * 64 + ctx["CL"] * 4)
        else:
            ctx["packed_bytes"] = spec.c * spec.r * spec.s                # the int8 taps as they are
        return "cpu/int8_depthwise.c.j2", ctx
    m, n, k = gemm_view(spec)
    kd = plan.k_depth
    k4 = math.ceil(k / kd) * kd
    row_is_act = plan.row_operand == "activations"
    conv_rows = plan.column_layout == "channels"
    if conv_rows and (not isinstance(spec, Conv2dSpec) or not row_is_act or not x86):
        raise OperatorError(f"{plan.function_name}: the 'channels' column layout is an x86 conv2d layout with the "
                            f"activations as rows")
    if conv_rows:      # column layout 'channels': output pixels as rows, output channels in the lanes
        m, n = spec.out_h * spec.out_w, spec.k
        k4 = spec.r * spec.s * math.ceil(spec.c / kd) * kd
    flip, za_shifted = _shift(plan)
    mb, nb = math.ceil(m / plan.mr), math.ceil(n / plan.nr)
    in_place = conv_rows and plan.channels_rows_in_place
    if in_place and plan.dialect not in ("vnni", "avx2", "generic"):
        raise OperatorError(f"{plan.function_name}: rows read in place are for the x86 dialects' k steps "
                            f"(a_row), not {plan.dialect}")
    if in_place:       # row tiles within one output row (or the whole image, 1x1 stride 1): int8_synth
        mb = channels_in_place_shape(spec).row_tiles(plan.mr)
    # avx2 filter rows: pre-packed as int16, each k group's even and odd bytes as two int32 words of
    # int16 pairs (what vpmaddwd takes), so the k loop broadcasts them as they are; widening them in
    # the loop took three shifts per row and k group on the two shift ports the adds need
    # (int8_dialect.h.j2).
    widen = widened_to_int16(plan.dialect, plan.pair_sums_int16, kd)
    row_bytes_per_k = 2 if (widen and not row_is_act) else 1
    # likewise the weights when they are the columns (matmul, the 'channels' conv layout): per k group
    # and vector, the even bytes of its lanes as int16 pairs, then the odd ones: two loads, no shifts
    col_bytes_per_k = 2 if (widen and row_is_act) else 1
    if plan.parallel_axis != "columns":
        raise OperatorError(f"{plan.function_name}: the int8 templates split column tiles only, not {plan.parallel_axis}")
    ctx.update({"M": m, "N": n, "K": k, "K4": k4, "KG": k4 // kd, "KD": kd, "split_loads": plan.split_loads, "MR": plan.mr, "NR": plan.nr, "NV": plan.nv,
                "L": plan.lanes, "MB": mb, "NB": nb, "row_is_act": row_is_act, "col_unsigned": not row_is_act,
                "za_u": za_shifted, "act_flip": flip,
                "sums_len": (nb * plan.nr) if row_is_act else (mb * plan.mr),
                "channels": n if row_is_act else m,
                "batch": spec.batch if row_is_act and not conv_rows else spec.n,
                "w_batches": spec.batch if row_is_act and not conv_rows else 1,
                "conv": _conv(spec) if isinstance(spec, Conv2dSpec) else None, "row_k4": k4,
                "boffs": [v * plan.lanes * kd * col_bytes_per_k for v in range(plan.nv)], "conv_rows": conv_rows,
                "AKD": kd * row_bytes_per_k, "wide_rows": row_bytes_per_k == 2,
                "BKD": kd * col_bytes_per_k, "wide_cols": col_bytes_per_k == 2,
                "pair_sums": plan.pair_sums_int16, "narrow_weight_max": NARROW_WEIGHT_MAX,
                "prefetch_every": plan.prefetch_every_groups, "prefetch_lines": plan.prefetch_lines_per_step,
                "in_place": False, "A_ROW": kd})
    if conv_rows:
        rs_hp, rs_wp = spec.h + spec.pad_top + spec.pad_bottom, spec.w + spec.pad_left + spec.pad_right
        taps_rs = [(r * spec.dilation_h, s * spec.dilation_w) for r in range(spec.r) for s in range(spec.s)]
        cg = math.ceil(spec.c / kd)
        ctx.update({"TAPS": spec.r * spec.s, "CG": cg,
                    # the padded image the rows are gathered from (templates: stage_rows_input)
                    "RS_HP": rs_hp, "RS_WP": rs_wp, "taps_rs": taps_rs, "RS_SLACK": 0})
        if in_place:
            ctx.update(_in_place_context(plan, rs_hp, rs_wp, taps_rs, cg))
    elif isinstance(spec, Conv2dSpec):
        sw = spec.stride_w
        rv, vpr = plan.tile_rows, plan.nv // plan.tile_rows
        run = vpr * plan.lanes
        owc, ohc = math.ceil(spec.out_w / run), math.ceil(spec.out_h / rv)
        max_off = ((spec.s - 1) * spec.dilation_w) // sw
        wph = max(owc * run + max_off, math.ceil((spec.w + spec.pad_left) / sw))
        # tiles past the last output row read staged rows up to this (memset to the zero point)
        hp = max(spec.h + spec.pad_top + spec.pad_bottom, (ohc * rv - 1) * spec.stride_h + (spec.r - 1) * spec.dilation_h + 1)
        row_bytes = sw * wph * kd
        taps = []
        for r in range(spec.r):
            for s in range(spec.s):
                col = s * spec.dilation_w
                taps.append(((r * spec.dilation_h * sw + col % sw) * wph + col // sw) * kd)
        cg = math.ceil(spec.c / kd)
        # the staged rows and column phases some tap reads (a 1x1 stride-2 conv reads every other row of
        # one phase): the stride-2 SIMD staging skips the others (they keep the zero point)
        read = {oh * spec.stride_h + r * spec.dilation_h for oh in range(spec.out_h) for r in range(spec.r)}
        rows_read = [ih + spec.pad_top in read for ih in range(spec.h)]
        # SSE2 / NEON staging (stride 1, 2); at stride 2 through a padded copy of 4 rows on the stack, so
        # only where that copy stays small (an image thousands of pixels wide keeps the scalar loop)
        simd_stage = kd == 4 and (ctx["x86"] or plan.dialect == "sdot")
        ctx.update({"simd_stage": simd_stage and (sw != 2 or 4 * (2 * wph + 16) <= STAGE_PAD_MAX_BYTES),
                    "stage_rows_read": None if all(rows_read) else rows_read,
                    "stage_phases": sorted({(s * spec.dilation_w) % sw for s in range(spec.s)})})
        ctx.update({"CG": cg, "TAPS": spec.r * spec.s, "HP": hp, "WPH": wph, "OWC": owc, "OHC": ohc, "RV": rv,
                    "VPR": vpr, "tap_offs": taps, "row_k4": spec.r * spec.s * cg * kd, "flat": False, "im2col": False,
                    "boffs": [(v // vpr) * spec.stride_h * row_bytes + (v % vpr) * plan.lanes * kd
                              for v in range(plan.nv)]})
        if plan.column_layout == "flat":
            ctx.update(_flat_context(plan))
        elif plan.column_layout == "im2col":
            ctx.update(_im2col_context(plan))
    # per weight batch: the weights' int32 sums, then the packed weight panel
    panel = ctx["NB"] * plan.nr * k4 * col_bytes_per_k if row_is_act else mb * plan.mr * ctx["row_k4"] * row_bytes_per_k
    ctx["packed_bytes"] = ctx["w_batches"] * (ctx["sums_len"] * 4 + panel)
    return "cpu/int8_gemm.c.j2", ctx


def _in_place_context(plan: Int8Plan, rs_hp: int, rs_wp: int, taps_rs: list, cg: int) -> dict:
    """The 'channels' layout read in place (Int8Plan.channels_rows_in_place): IP_RUNS runs of IP_RUN pixels
    (an output row each, or the whole image for a 1x1 stride-1 conv), IP_RUN_BYTES apart in the staged
    input, each cut into OWT row tiles of MR pixels, a pixel's k group A_ROW bytes after the previous
    one's; tap t's k groups start RS_TAP_OFF[t] bytes after the tile's first pixel, channel group g
    RS_PLANE g bytes further. The last tile of a run reads past it (its extra rows are computed and
    dropped): RS_SLACK bytes past the staged planes hold the zero point for the last one."""
    spec, kd = plan.spec, plan.k_depth
    shape = channels_in_place_shape(spec)
    run = shape.m // shape.m_runs
    owt = math.ceil(run / plan.mr)
    a_row = kd * spec.stride_w
    run_bytes = spec.stride_h * rs_wp * kd if shape.m_runs > 1 else 0
    tap_offs = [(dr * rs_wp + ds) * kd for dr, ds in taps_rs]
    plane = rs_hp * rs_wp * kd
    last_read = (shape.m_runs - 1) * run_bytes + (owt * plan.mr - 1) * a_row + (cg - 1) * plane + max(tap_offs) + kd
    return {"in_place": True, "IP_RUNS": shape.m_runs, "IP_RUN": run, "IP_RUN_BYTES": run_bytes, "OWT": owt, "A_ROW": a_row,
            "rs_tap_offs": tap_offs, "RS_SLACK": max(0, last_read - cg * plane)}


def _flat_context(plan: Int8Plan) -> dict:
    """The 'flat' column layout (Int8Plan.column_layout, stride 1): staged rows of WPH =
    plan.flat_row_pixels (the input width and its wider side padding: int8_synth.flat_row_width);
    column tile nt covers staged positions [nt NR, nt NR + NR) of the plane read as one row, lane j
    being output (q / WPH, q % WPH) when q % WPH < OW (else padding: computed, dropped).
    Staged rows below the image hold the zero point so that the last tile's taps stay in the plane."""
    spec, kd = plan.spec, plan.k_depth
    wph = plan.flat_row_pixels
    tiles = math.ceil(spec.out_h * wph / plan.nr)
    reach = tiles * plan.nr + (spec.r - 1) * spec.dilation_h * wph + (spec.s - 1) * spec.dilation_w
    # a row staged without its right padding (flat_row_width) reads it in the next row; the last
    # padded row's reads land in the row below it, which the reach includes ((S-1) dw >= 1 there)
    hp = max(spec.h + spec.pad_top + spec.pad_bottom, math.ceil(reach / wph))
    taps = [(r * spec.dilation_h * wph + s * spec.dilation_w) * kd for r in range(spec.r) for s in range(spec.s)]
    return {"flat": True, "WPH": wph, "HP": hp, "NT": tiles, "tap_offs": taps,
            "boffs": [v * plan.lanes * kd for v in range(plan.nv)]}


def _im2col_context(plan: Int8Plan) -> dict:
    """The 'im2col' column layout (Int8Plan.column_layout, strided convs): the input staged as
    [taps][C/KD][NQP][KD], position q = oh OW + ow of tap t holding the KD channels at
    (oh sh - pt + r dh, ow sw - pl + s dw) (the zero point outside the image); NQP = the tiles' reach.
    It is read as the flat layout without padding columns (WPH = OW): column tile nt covers outputs
    [nt NR, nt NR + NR)."""
    spec, kd = plan.spec, plan.k_depth
    positions = spec.out_h * spec.out_w
    tiles = math.ceil(positions / plan.nr)
    plane = tiles * plan.nr * kd
    cg = math.ceil(spec.c / kd)
    return {"flat": True, "im2col": True, "WPH": spec.out_w, "HP": spec.out_h, "NT": tiles, "NQP": tiles * plan.nr,
            "IM2COL_PLANE": plane, "tap_offs": [t * cg * plane for t in range(spec.r * spec.s)],
            "taps_rs": [(r * spec.dilation_h, s * spec.dilation_w) for r in range(spec.r) for s in range(spec.s)],
            "boffs": [v * plan.lanes * kd for v in range(plan.nv)]}


def packed_bytes(plan: Int8Plan) -> int:
    """Bytes of the kernel's pre-packed weights (what <fn>_packed_bytes() returns)."""
    return int(render_context(plan)[1]["packed_bytes"])


def render_int8_kernel(plan: Int8Plan, threads_symbol: Optional[str] = None,
                       scratch_symbol: Optional[str] = None) -> RenderedKernel:
    """Kernel and harness sources for a plan (deterministic: same plan, same text). The harness
    (templates/cpu/harness_int8.c.j2) holds the timing loops and, for a program (the static aarch64
    build run under qemu, or a host harness program), a main speaking every CPU harness's protocol.
    threads_symbol, scratch_symbol: as render_context."""
    template, ctx = render_context(plan, threads_symbol, scratch_symbol)
    spec = plan.spec
    try:
        source = _env().get_template(template).render(**ctx)
        harness = _env().get_template("cpu/harness_int8.c.j2").render(
            fn=plan.function_name, x_bytes=int(np.prod(spec.operand_shapes[0])),
            w_bytes=int(np.prod(spec.operand_shapes[1])), channels=channels(spec),
            out_bytes=int(np.prod(spec.output_shape)))
    except jinja2.TemplateError as exc:
        raise OperatorError(f"rendering {template} for {plan.function_name} failed: {exc}") from exc
    return RenderedKernel(source, harness, plan.function_name, plan.dialect, plan)


def output_dtype(plan: Int8Plan):
    return np_type(plan.quant.out_type)
