"""GPU candidate enumeration: every (register tile, work-group shape, __local staging depth) the
description allows for one operator, with the address pattern of its loads and the code-shape flags
its kernel needs (ragged edges, padding). What a candidate costs is cost_model.py's business.

  work_group_shapes     work-group sizes and shapes from the description (size cap, wave multiples)
  matmul_candidates, conv_candidates, depthwise_candidates
                        the candidates of each operator (generators of Candidate)
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..ops.spec import Conv2dSpec, DepthwiseSpec, MatmulSpec

ADDRESS_REGISTERS = 6                 # pointers, indices, loop counters per work-item (cost-model assumption)
BARRIER_ISSUE = 4.0                   # issue slots a barrier costs each work-item (cost-model assumption)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Stream:
    """A load issued per reduction step by every work-item, described by its address pattern."""
    count: float        # load instructions per work-item per reduction step
    lane_bytes: int     # bytes one work-item loads per instruction
    stride_x: int       # elements between the addresses of neighbouring work-items along x (0 = broadcast)
    vary_y: bool        # different addresses for different work-item rows
    space: str          # 'global' | 'local'


@dataclass(frozen=True)
class Candidate:
    rows: int
    cols: int
    vec: int
    wx: int
    wy: int
    depth: int          # __local staging depth, 0 = none
    k_unroll: int
    registers: int
    local_bytes: int
    steps: int          # reduction steps per work-item
    fma_per_step: float  # FMA instructions per step (packed fp16 counts half)
    streams: tuple
    staged_lines_per_wg: float  # global lines one work-group loads into __local over the whole reduction
    wg_bytes: float             # global bytes one work-group needs if L1 captures intra-group reuse
    working_set: float          # bytes of L1 one work-group needs for that reuse
    global_size: tuple
    outputs_exec: int           # outputs computed including ragged waste
    constants: tuple
    flags: tuple
    copy_issue_per_step: float = 0.0  # staging: global load + __local store + barrier share per step


def work_group_shapes(gpu, cap: int):
    warp = int(gpu.warp_width)
    half = int(gpu.half_warp_width or warp)
    if gpu.family == "mali":
        # Arm guidance: at most 64 (the preferred size) work-items; barriers stop the driver
        # from merging/splitting groups, so never go above the preferred size.
        top = min(cap, int(gpu.preferred_work_group_size))
        low = min(warp, top)
    else:
        top = cap
        low = min(half, top)
    sizes = [s for s in (4, 8, 16, 32, 64, 128, 256, 512, 1024) if low <= s <= top] or [top]
    shapes = []
    for size in sizes:
        for wy in (1, 2, 4, 8, 16):
            wx = size // wy
            if wx * wy == size and wx >= 4:
                shapes.append((wx, wy))
    return shapes, top


def matmul_candidates(spec: MatmulSpec, gpu, cap, half: bool, eb: int, line: int):
    m, n, k, b = spec.m, spec.n, spec.k, spec.batch
    shapes, _ = work_group_shapes(gpu, cap)
    staging_depths = [0] + [d for d in (8, 16, 32) if d <= max(8, k)]
    vecs = (1, 2, 4, 8) if half else (1, 2, 4)
    for tm in (1, 2, 4, 8):
        for vec in vecs:
            if vec > n:
                continue
            for nv in (1, 2):
                tn = vec * nv
                acc = tm * tn
                regs = (acc + tm + tn + 1) // (2 if half else 1) + ADDRESS_REGISTERS
                for wx, wy in shapes:
                    bm, bn = tm * wy, tn * wx
                    if bm > 2 * ceil_div(m, 1) + 8 or bn > 2 * n + 8 * vec:
                        continue
                    gx, gy = ceil_div(n, bn) * wx, ceil_div(m, bm) * wy
                    ku = min(4, k)
                    for depth in staging_depths:
                        if depth:
                            local = (bm + bn) * depth * eb
                            if local > gpu.local_memory_kib * 1024:
                                continue
                            streams = (Stream(tm, eb, 0, True, "local"),
                                       Stream(nv, vec * eb, vec, False, "local"))
                            rounds = ceil_div(k, depth)
                            staged = rounds * (bm * ceil_div(depth * eb, line) + depth * ceil_div(bn * eb, line))
                            r = regs + 2
                        else:
                            local = 0
                            streams = (Stream(tm, eb, 0, True, "global"),
                                       Stream(nv, vec * eb, vec, False, "global"))
                            staged = 0
                            r = regs
                        flags = (("clamp_m", m % bm != 0), ("clamp_n", n % bn != 0),
                                 ("partial_vector", n % vec != 0),
                                 ("a_bounds", bool(depth) and (m % bm != 0 or k % depth != 0)),
                                 ("b_bounds", bool(depth) and (n % bn != 0 or k % depth != 0)),
                                 ("k_tail", not depth and k % ku != 0))
                        consts = (("BATCH", b), ("M", m), ("N", n), ("K", k), ("TM", tm), ("VEC", vec),
                                  ("NV", nv), ("TN", tn), ("WX", wx), ("WY", wy), ("BM", bm), ("BN", bn),
                                  ("TKS", depth), ("KU", ku))
                        yield Candidate(
                            rows=tm, cols=tn, vec=vec, wx=wx, wy=wy, depth=depth, k_unroll=ku, registers=r,
                            local_bytes=local, steps=k, fma_per_step=acc / (2 if half else 1),
                            streams=streams, staged_lines_per_wg=staged,
                            wg_bytes=k * (bm + bn) * eb, working_set=bm * line + bn * eb * 4,
                            global_size=(gx, gy, b), outputs_exec=gx // wx * bn * gy // wy * bm * b,
                            constants=consts, flags=flags,
                            copy_issue_per_step=(2.0 * (bm + bn) / (wx * wy) + 2.0 * BARRIER_ISSUE / depth)
                            if depth else 0.0)


def conv_candidates(spec: Conv2dSpec, gpu, cap, half: bool, eb: int, line: int):
    oh, ow = spec.out_h, spec.out_w
    p = oh * ow
    red = spec.c * spec.r * spec.s
    shapes, _ = work_group_shapes(gpu, cap)
    padded = any((spec.pad_top, spec.pad_left, spec.pad_bottom, spec.pad_right))
    for tk in (1, 2, 4, 8):
        for tp in (1, 2, 4, 8):
            acc = tk * tp
            # accumulators, weights, inputs, and per-pixel input row/column origins
            regs = (acc + tk + tp + 1) // (2 if half else 1) + 2 * tp + ADDRESS_REGISTERS
            for wx, wy in shapes:
                bk, bp = tk * wy, tp * wx
                if bk > 2 * spec.k + 8 or bp > 2 * p + 8 * wx:
                    continue
                gx, gy = ceil_div(p, bp) * wx, ceil_div(spec.k, bk) * wy
                depths = [0] + [d for d in (1, 2, 4, 8, 16) if d <= spec.c]
                rows_span = min(spec.h, (ceil_div(bp, ow) + 1) * spec.stride_h + spec.r)
                in_bytes = spec.c * rows_span * spec.w * eb
                for ct in depths:
                    if ct:
                        local = bk * ct * spec.r * spec.s * eb
                        if local > gpu.local_memory_kib * 1024:
                            continue
                        streams = (Stream(tk, eb, 0, True, "local"),
                                   Stream(tp, eb, spec.stride_w, False, "global"))
                        staged = ceil_div(spec.c, ct) * bk * ceil_div(ct * spec.r * spec.s * eb, line)
                        r = regs + 2
                    else:
                        local = 0
                        streams = (Stream(tk, eb, 0, True, "global"),
                                   Stream(tp, eb, spec.stride_w, False, "global"))
                        staged = 0
                        r = regs
                    flags = (("padded", padded), ("clamp_p", p % bp != 0), ("clamp_k", spec.k % bk != 0),
                             ("c_tail", bool(ct) and spec.c % ct != 0))
                    consts = (("NB", spec.n), ("C", spec.c), ("H", spec.h), ("W", spec.w), ("K", spec.k),
                              ("R", spec.r), ("S", spec.s), ("SH", spec.stride_h), ("SW", spec.stride_w),
                              ("PT", spec.pad_top), ("PL", spec.pad_left), ("DH", spec.dilation_h),
                              ("DW", spec.dilation_w), ("OH", oh), ("OW", ow), ("P", p), ("TK", tk), ("TP", tp),
                              ("WX", wx), ("WY", wy), ("BK", bk), ("BP", bp), ("CT", ct),
                              ("KU", min(4, spec.s)))
                    yield Candidate(
                        rows=tk, cols=tp, vec=1, wx=wx, wy=wy, depth=ct, k_unroll=min(4, spec.s), registers=r,
                        local_bytes=local, steps=red, fma_per_step=acc / (2 if half else 1), streams=streams,
                        staged_lines_per_wg=staged,
                        wg_bytes=bk * red * eb + in_bytes,
                        working_set=bk * line + spec.r * (bp * spec.stride_w * eb + line),
                        global_size=(gx, gy, spec.n), outputs_exec=(gx // wx) * bp * (gy // wy) * bk * spec.n,
                        constants=consts, flags=flags,
                        copy_issue_per_step=(2.0 * bk / (wx * wy) + 2.0 * BARRIER_ISSUE / (ct * spec.r * spec.s))
                        if ct else 0.0)


def depthwise_candidates(spec: DepthwiseSpec, gpu, cap, half: bool, eb: int, line: int):
    oh, ow = spec.out_h, spec.out_w
    shapes, _ = work_group_shapes(gpu, cap)
    padded = any((spec.pad_top, spec.pad_left, spec.pad_bottom, spec.pad_right))
    # The R*S weights stay in registers, unless they alone overflow the full-occupancy register
    # budget (7x7 windows on Mali): then one window row of weights (S registers) is loaded at a
    # time, again for every output row of the tile.
    per_row_modes = (False, True) if spec.r > 1 and spec.r * spec.s > int(gpu.registers_per_thread_full_occupancy) \
        else (False,)
    for ty, tx, per_row in itertools.product((1, 2, 4), (1, 2, 4, 8), per_row_modes):
        span = (tx - 1) * spec.stride_w + (spec.s - 1) * spec.dilation_w + 1
        weight_regs = spec.s if per_row else spec.r * spec.s
        regs = (ty * tx + weight_regs + span + 1) // (2 if half else 1) + ADDRESS_REGISTERS
        for wx, wy in shapes:
            bx, by = tx * wx, ty * wy
            if bx > 2 * ow + 8 * wx or by > 2 * oh + 4 * wy:
                continue
            gx, gy = ceil_div(ow, bx) * wx, ceil_div(oh, by) * wy
            ragged_x, ragged_y = ow % tx != 0 or ow % bx != 0, oh % ty != 0 or oh % by != 0
            flags = (("checks", padded or ragged_x or ragged_y), ("ragged_x", ragged_x),
                     ("ragged_y", ragged_y), ("weights_per_row", per_row))
            consts = (("NB", spec.n), ("C", spec.c), ("H", spec.h), ("W", spec.w), ("R", spec.r),
                      ("S", spec.s), ("SH", spec.stride_h), ("SW", spec.stride_w), ("PT", spec.pad_top),
                      ("PL", spec.pad_left), ("DH", spec.dilation_h), ("DW", spec.dilation_w), ("OH", oh),
                      ("OW", ow), ("TY", ty), ("TX", tx), ("SPAN", span), ("WX", wx), ("WY", wy))
            in_rows = by * spec.stride_h + spec.r
            in_cols = bx * spec.stride_w + spec.s
            yield Candidate(
                rows=ty, cols=tx, vec=1, wx=wx, wy=wy, depth=0, k_unroll=1, registers=regs, local_bytes=0,
                steps=1, fma_per_step=ty * tx * spec.r * spec.s / (2 if half else 1),
                streams=(Stream(ty * spec.r * span, eb, tx * spec.stride_w, True, "global"),
                         Stream(spec.r * spec.s * (ty if per_row else 1) / max(1, ty * tx), eb, 0, False,
                                 "global")),
                staged_lines_per_wg=0, wg_bytes=in_rows * in_cols * eb + spec.r * spec.s * eb,
                working_set=in_rows * in_cols * eb,
                global_size=(gx, gy, spec.n * spec.c),
                outputs_exec=(gx // wx) * bx * (gy // wy) * by * spec.n * spec.c,
                constants=consts, flags=flags)


CANDIDATES = {"matmul": matmul_candidates, "conv2d": conv_candidates, "depthwise": depthwise_candidates}
