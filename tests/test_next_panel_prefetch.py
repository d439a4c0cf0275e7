"""Prefetching the next weight panel (decide.next_panel_prefetch_lines): the row tiles of a block
share the next KC x NR panel of B between them and fetch all of it by their last k step; the rule
is on only where it was timed (x86, weights as B, the BLIS order, the intrinsics loop); kernels
with it compute the same numbers, pre-packed or not, on ragged shapes, K slices and 1 and 2 threads."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import support
from support import ALL_HOST_ISAS, host_description, recorded_host, run_host_plan
from xfc.cpu import decide
from xfc.cpu.codegen import render_cpu_kernel
from xfc.cpu.isa import isa_row
from xfc.cpu.synth import synthesize_cpu
from xfc.errors import OperatorError
from xfc.ops.spec import make_spec

import xfc

PREFETCH_ISAS = [isa for isa in ALL_HOST_ISAS if isa in decide.NEXT_PANEL_PREFETCH_DIALECTS]


def _pointwise(c, side, k, **kw):
    return make_spec("conv2d", dict(n=1, c=c, h=side, w=side, k=k, r=1, s=1), bias=True, activation="relu", **kw)


def _lines(isa="avx512", transposed=True, m=49, mr=14, nr=32, kc=2048, mc=56, ku=4, order="jr_ir",
           ukernel="intrinsics", spec=None):
    spec = spec or _pointwise(2048, 7, 512)
    return decide.next_panel_prefetch_lines(isa_row(isa), spec, transposed, m, mr, nr, kc, mc, ku, order, ukernel,
                                            isa_row(isa).elem_bytes)


@pytest.mark.unit
@pytest.mark.parametrize("m,mr,nr,kc,mc,ku", [(49, 14, 32, 2048, 56, 4), (49, 14, 32, 320, 56, 4),
                                               (196, 14, 32, 256, 224, 4), (96, 6, 16, 64, 96, 4),
                                               (20, 14, 32, 96, 28, 4), (97, 6, 16, 37, 96, 4)])
def test_the_row_tiles_of_a_block_fetch_the_whole_next_panel(m, mr, nr, kc, mc, ku):
    """Tiles x unrolled steps x lines covers the panel, and one line fewer per step would not (when
    more than one)."""
    lines = _lines(m=m, mr=mr, nr=nr, kc=kc, mc=mc, ku=ku)
    tiles, steps = math.ceil(min(mc, m) / mr), kc // ku
    panel_bytes = kc * nr * 4
    assert tiles * steps * lines * decide.CACHE_LINE_BYTES >= panel_bytes
    if lines > 1:
        assert tiles * steps * (lines - 1) * decide.CACHE_LINE_BYTES < panel_bytes


@pytest.mark.unit
def test_resnet50_last_stage_pointwise_conv_prefetches_two_lines_a_step():
    """The layer the rule was timed on (4 row tiles of 14 pixels, KC 2048, NR 32): 4096 lines over
    4 x 512 steps."""
    assert _lines() == 2


@pytest.mark.unit
def test_off_where_not_timed_or_not_weights_as_b():
    assert _lines(isa="neon") == 0                          # NEON cores were not timed
    assert _lines(isa="generic") == 0
    assert _lines(transposed=False) == 0                    # a conv's weights are A
    assert _lines(order="ir_jr") == 0                       # B panels are not passed in turn
    assert _lines(ukernel="asm_out_of_order") == 0          # the asm loop has no slot for it
    assert _lines(kc=3) == 0                                # no unrolled step
    assert _lines(m=14) == 0 and _lines(m=5) == 0           # one row tile streams its panel anyway
    assert _lines(m=28) == 4                                # two: 4096 lines over 2 x 512 steps
    assert _lines(m=16 * 14, mc=16 * 14) > 0                # sixteen
    assert _lines(m=17 * 14, mc=17 * 14) == 0               # seventeen: the first tile's wait is small
    assert _lines(m=784, mc=56) > 0                         # the tiles of one MC block count


@pytest.mark.unit
def test_split_over_rows_counts_the_row_tiles_of_one_threads_share():
    """ResNet-18's 14x14 Winograd GEMMs at 2 threads: 16 rows in 2 row tiles of 9, one per thread."""
    spec = make_spec("matmul", dict(m=16, n=256, k=256))
    args = (isa_row("avx512"), spec, False, 16, 9, 32, 128, 18, 4, "jr_ir", "intrinsics", 4)
    assert decide.next_panel_prefetch_lines(*args) > 0
    assert decide.next_panel_prefetch_lines(*args, threads=2, parallel_axis="m") == 0
    assert decide.next_panel_prefetch_lines(*args, threads=2, parallel_axis="n") > 0   # each thread all rows
    wide = (isa_row("avx512"), spec, False, 64, 8, 32, 128, 64, 4, "jr_ir", "intrinsics", 4)
    assert decide.next_panel_prefetch_lines(*wide, threads=2, parallel_axis="m") > 0   # 4 row tiles each
    matmul = make_spec("matmul", dict(m=49, n=512, k=2048))
    assert _lines(transposed=False, spec=matmul) == 2       # a matmul's weights are B


@pytest.mark.unit
def test_synthesized_host_plan_carries_it_and_the_kernel_spells_it():
    result = synthesize_cpu(_pointwise(2048, 7, 512), recorded_host("avx512"), threads=1)
    plan = result.plan
    assert plan.lowering == "implicit_gemm_t" and plan.gemm.prefetch_next_panel_lines == 2
    assert "prefetch the next B micro-panel into L2 (2 line(s) per unrolled k step" in result.explain()
    source = render_cpu_kernel(plan).source
    assert "#define XFC_NEXT_PANEL_LINES 2" in source and "XFC_PREFETCH_L2(pf + 1 * XFC_LINE_ELEMS)" in source
    off = dataclasses.replace(plan, gemm=dataclasses.replace(plan.gemm, prefetch_next_panel_lines=0))
    assert "XFC_PREFETCH_L2" not in render_cpu_kernel(off).source.split("#define XFC_PREFETCH_L2")[1]


@pytest.mark.unit
@pytest.mark.parametrize("hw_name", ["cortex-a76", "cortex-a55"])
def test_neon_plans_do_not_prefetch_the_next_panel(hw_name):
    plan = synthesize_cpu(_pointwise(512, 7, 512), xfc.load_hardware(hw_name), threads=1).plan
    assert plan.gemm.prefetch_next_panel_lines == 0


@pytest.mark.unit
def test_a_plan_that_prefetches_in_the_other_loop_order_is_refused():
    plan = synthesize_cpu(_pointwise(2048, 7, 512), recorded_host("avx512"), threads=1).plan
    bad = dataclasses.replace(plan, gemm=dataclasses.replace(plan.gemm, loop_order="ir_jr"))
    with pytest.raises(OperatorError, match="prefetch_next_panel_lines"):
        render_cpu_kernel(bad)


# Ragged: M not a multiple of MR (a short last row tile; a second MC block with fewer tiles), N not
# a multiple of NR (a partial last panel), K in several KC slices or not a multiple of the unroll;
# 1 and 2 threads. Hand plans (MC of four row tiles), so that the rule's window holds on any host.
RAGGED = [("conv", dict(c=61, h=9, w=9, k=83), dict(kc=24), 1), ("conv", dict(c=130, h=7, w=7, k=45), {}, 2),
          ("conv", dict(c=37, h=13, w=11, k=100), dict(kc=16), 2),
          ("matmul", dict(m=23, n=70, k=101), dict(kc=32), 1), ("matmul", dict(m=50, n=33, k=64), {}, 2)]


def _ragged_plan(isa, kind, shape, tiles, threads):
    mr, nr = isa_row(isa).hand_tile
    if kind == "conv":
        spec = make_spec("conv2d", dict(n=1, r=1, s=1, **shape), bias=True, activation="relu6")
    else:
        spec = make_spec("matmul", shape, bias=True, activation="relu6")
    return support.host_plan(spec, isa, threads, mr=mr, nr=nr, mc=4 * mr, transposed=kind == "conv", **tiles,
                             function_name=f"xfc_next_panel_{isa}")


@pytest.mark.host
@pytest.mark.parametrize("isa", PREFETCH_ISAS)
@pytest.mark.parametrize("kind,shape,tiles,threads", RAGGED,
                         ids=[f"{k}-{'x'.join(map(str, s.values()))}-t{t}" for k, s, _, t in RAGGED])
def test_kernels_that_prefetch_the_next_panel_are_exact(isa, kind, shape, tiles, threads, tmp_path):
    plan = _ragged_plan(isa, kind, shape, tiles, threads)
    assert plan.gemm.prefetch_next_panel_lines > 0, plan.gemm
    kernel, out = run_host_plan(plan, tmp_path, seed=11, what=f"{isa} next-panel prefetch {plan.header_lines}")
    if kernel is None:
        return
    a, b, bias = support.make_inputs(plan.spec, seed=11)
    packed = kernel.run_packed(a, kernel.prepack(b), bias)    # the network's path: weights packed once
    np.testing.assert_array_equal(packed, out)


# Winograd over channels: U (the weights) is the GEMMs' B operand, and its panels are prefetched the same way.
WINOGRAD = [(conv_spec, m, threads) for conv_spec in (dict(c=37, h=25, w=23, k=45), dict(c=20, h=21, w=30, k=70))
            for m, threads in ((2, 1), (4, 2))]


def _winograd_plan(isa, shape, m, threads):
    from xfc.cpu.winograd import hand_winograd_plan
    mr, nr = isa_row(isa).hand_tile
    spec = make_spec("conv2d", dict(n=1, r=3, s=3, **shape), pad=1, bias=True, activation="relu")
    return hand_winograd_plan(spec, m, isa, threads, gcc_march=support.host_march(isa), vectors="channels",
                              mr=mr, nr=nr, kc=16, mc=3 * mr, nc=2 * nr,
                              function_name=f"xfc_next_panel_wino{m}_{isa}_t{threads}")


@pytest.mark.unit
def test_winograd_plans_prefetch_u_over_channels_only():
    from xfc.cpu.winograd import hand_winograd_plan
    spec = make_spec("conv2d", dict(n=1, c=64, h=14, w=14, k=64, r=3, s=3), pad=1)
    channels = hand_winograd_plan(spec, 2, "avx512", vectors="channels", mr=6, nr=32, mc=18)
    assert channels.gemm.prefetch_next_panel_lines > 0
    assert "XFC_PREFETCH_L2(pf)" in render_cpu_kernel(channels).source
    assert hand_winograd_plan(spec, 2, "avx512", vectors="tiles").gemm.prefetch_next_panel_lines == 0
    bad = dataclasses.replace(channels, winograd_vectors="tiles",
                              gemm=dataclasses.replace(channels.gemm, a_pack="packed"))
    with pytest.raises(OperatorError, match="prefetch the next panel of U"):
        render_cpu_kernel(bad)


@pytest.mark.host
@pytest.mark.parametrize("isa", PREFETCH_ISAS)
@pytest.mark.parametrize("shape,m,threads", WINOGRAD,
                         ids=[f"{'x'.join(map(str, s.values()))}-m{m}-t{t}" for s, m, t in WINOGRAD])
def test_winograd_kernels_that_prefetch_u_are_within_their_bound(isa, shape, m, threads, tmp_path):
    from xfc.ops.reference import check_winograd_output
    plan = _winograd_plan(isa, shape, m, threads)
    assert plan.gemm.prefetch_next_panel_lines > 0, plan.gemm
    rendered = render_cpu_kernel(plan)
    if isa not in support.RUNNABLE_ISAS:
        support.compile_if_sampled(rendered, tmp_path)
        return
    kernel = support.host_kernel(rendered, tmp_path)
    support.record(isa, "ran")
    a, b, bias = support.make_inputs(plan.spec, seed=13)
    for what, out in (("normal", kernel(a, b, bias)), ("pre-packed", kernel.run_packed(a, kernel.prepack(b), bias))):
        verdict = check_winograd_output(plan.spec, m, out, a, b, bias)
        assert verdict.ok, f"{isa} {what}: {verdict.describe()}"
