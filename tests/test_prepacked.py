"""Pre-packed weights: <fn>_prepack / <fn>_packed must compute exactly what <fn> computes.

For every host ISA (avx512 / avx2 / generic: compiled everywhere, run where the CPU allows), matmul and conv2d plans with
A read in place (a_pack='direct') and packed into MR-row panels (a_pack='packed'), 1 and 2
threads, small tiles (KC=16, MC = 2 MR, NC = 2 NR) so that M, N and K all end in ragged tails and
the five-loop nest runs several blocks and KC slices: run_packed(in0, prepack(in1), bias) is
checked against the numpy reference (K-derived bound) and must be bitwise equal to the normal
call (same micro-kernels, same summation order; only where the weights are read from differs).
The 1- and 2-thread builds must agree bitwise too (a thread split never changes a tile's shape).

NEON plans are cross-compiled and run under qemu-aarch64 with the harness's 'prepacked' argument.
Tests that need a missing tool are skipped with the reason; kernels of an ISA the CPU lacks are
compiled only, and the end-of-run coverage report says so.
"""
from __future__ import annotations

import numpy as np
import pytest

import support
from support import ALL_HOST_ISAS, RUNNABLE_ISAS, assert_samples_positive, conv, dw, host_plan, mm, needs_arm
from support import host_kernel, qemu_run
from xfc.toolchain.cpu import build_arm
from xfc.errors import OperatorError
from xfc.runners.base import Measurement
from xfc.runners.qemu import qemu_cpu_models
from xfc.cpu.plans import hand_plan
from xfc.cpu.codegen import render_cpu_kernel
from xfc.ops.reference import make_inputs


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("xfc_prepacked_build")


# Small tiles per ISA: KC=16 and MC/NC of two register tiles force several ic / jc blocks and
# KC slices; MR values that divide none of the M below give row tails, NR of two or more vectors
# gives column tails with a full vector plus a partial (masked / local-tile) one.
TILES = {
    "avx512": dict(mr=6, nr=32, kc=16, mc=12, nc=64),
    "avx2": dict(mr=5, nr=16, kc=16, mc=10, nc=32),
    "generic": dict(mr=3, nr=8, kc=16, mc=6, nc=16),
}

# (id, spec, parallel axis of the 2-thread build). M, N, K are ragged for every tile set above
# unless noted; ow is the output width (the im2col packer splits NR-pixel panels into row runs).
GEMM_CASES = [
    ("mm_b2_ragged", mm(23, 45, 53, batch=2, bias=True, act="relu6"), "n"),
    ("mm_b2_ragged_msplit", mm(31, 80, 40, batch=2, act="relu"), "m"),   # avx512: tail of one whole vector
    ("mm_tiny", mm(2, 5, 3, bias=True), "n"),                                # M < MR, N < NR, K < KC
    ("conv_s1_b2", conv(5, 9, 11, 13, 3, 3, n=2, pad=1, bias=True, act="relu"), "m"),   # K = 45, ow 11
    ("conv_s2_asym", conv(4, 12, 13, 9, 3, 3, stride=2, pad=(1, 0, 0, 1), bias=True), "n"),  # ow 6
    ("conv_dil2", conv(3, 11, 12, 7, 3, 3, pad=(2, 1, 0, 2), dilation=2, act="relu6"), "n"),
    ("conv_pointwise_b2", conv(19, 5, 7, 11, 1, 1, n=2, bias=True, act="relu6"), "m"),  # 'rows' packer
    ("conv_stem7x7_s2", conv(3, 21, 19, 10, 7, 7, stride=2, pad=3, bias=True, act="relu"), "n"),  # ow 10
    ("conv_wide_ow41", conv(2, 3, 41, 8, 3, 3, pad=1, bias=True), "n"),      # ow 41 > NR of every ISA
    ("conv_ow1", conv(4, 9, 1, 6, 3, 1, n=2, pad=(1, 0, 1, 0), act="relu"), "m"),  # ow 1: one run per pixel
    ("conv_ow1_s2", conv(6, 13, 3, 7, 3, 3, stride=2, pad=(1, 0, 0, 0), bias=True), "n"),  # ow 1, stride 2
]


def _build(plan, build_dir):
    """The loaded kernel, or None after compiling it only (this CPU cannot run the plan's ISA)."""
    rendered = render_cpu_kernel(plan)
    if plan.isa not in RUNNABLE_ISAS:
        support.compile_if_sampled(rendered, build_dir)
        return None
    support.record(plan.isa, "ran")
    return host_kernel(rendered, build_dir)


def _host_kernel(build_dir, tag, spec, isa, a_pack, threads, axis, **tiles):
    tiles = {**TILES[isa], **tiles}
    plan = host_plan(spec, isa, threads, a_pack=a_pack, parallel_axis=axis if threads > 1 else None,
                     function_name=f"pp_{tag}_{isa}_{a_pack}_t{threads}", **tiles)
    assert plan.gemm.a_pack == a_pack
    return _build(plan, build_dir)


def _assert_ok(spec, out, a, b, bias, what):
    support.assert_verified(spec, out, a, b, bias, what)


def _check_prepacked(kernel, spec, seeds=(11, 12)):
    """Normal and pre-packed calls agree bitwise and with numpy, for several inputs sharing one
    packed weight buffer; the weight array passed in is not modified by prepack. Returns the last
    normal output."""
    _, b, bias = make_inputs(spec, seed=seeds[0])
    b_copy = b.copy()
    packed = kernel.prepack(b)
    assert packed.dtype == np.float32 and packed.ndim == 1
    np.testing.assert_array_equal(b, b_copy)
    assert np.array_equal(kernel.prepack(b), packed), "prepack is not deterministic"
    outs = []
    for seed in seeds:
        a = make_inputs(spec, seed=seed)[0]
        what = f"{kernel.rendered.function_name} seed={seed}"
        got_packed = kernel.run_packed(a, packed, bias)
        got = kernel(a, b, bias)  # normal call after the packed one: scratch state must not leak
        _assert_ok(spec, got_packed, a, b, bias, what + " run_packed")
        _assert_ok(spec, got, a, b, bias, what + " normal")
        assert np.array_equal(got, got_packed), f"{what}: run_packed differs from the normal call"
        outs.append(got)
    return outs[-1]


# generic goes through the same local-tile tail path as avx2 (4 lanes instead of 8): a subset
# keeps the compile count (~0.7 s each) within budget.
GENERIC_SUBSET = {"mm_b2_ragged", "mm_tiny", "conv_s2_asym", "conv_pointwise_b2", "conv_ow1"}
HOST_CASES = [pytest.param(*case, isa, id=f"{case[0]}-{isa}") for case in GEMM_CASES for isa in ALL_HOST_ISAS
              if isa != "generic" or case[0] in GENERIC_SUBSET]


@pytest.mark.matrix(every=2)
@pytest.mark.host
@pytest.mark.parametrize("a_pack", ["direct", "packed"])
@pytest.mark.parametrize("tag,spec,axis,isa", HOST_CASES)
def test_gemm_prepacked_host(tag, spec, axis, isa, a_pack, build_dir):
    """The 2-thread build alternates between the A operands case by case (the split divides the
    same block loops whichever way A is read): each A operand meets both split axes."""
    outs = []
    index = [case[0] for case in GEMM_CASES].index(tag)
    for threads in ((1, 2) if index % 2 == ("direct", "packed").index(a_pack) else (1,)):
        kernel = _host_kernel(build_dir, tag, spec, isa, a_pack, threads, axis)
        if kernel is not None:
            outs.append(_check_prepacked(kernel, spec))
    if len(outs) == 2:
        assert np.array_equal(outs[0], outs[1]), "1-thread and 2-thread builds differ"


def _unpack_panels(packed, rows, cols, kc, width):
    """Inverse of the documented pre-packed layout (gemm.c.j2): for KC slice pc, the panel holding
    columns [x, x + width) starts at pc * PAD + x * kc and is [kc][width], zero-padded; returns the
    [rows (the reduction), cols] matrix and checks that the padding is zero."""
    pad = -(-cols // width) * width
    assert packed.size == rows * pad
    out = np.empty((rows, cols), np.float32)
    for pc in range(0, rows, kc):
        kb = min(kc, rows - pc)
        for x in range(0, pad, width):
            panel = packed[pc * pad + x * kb: pc * pad + (x + width) * kb].reshape(kb, width)
            n = min(width, cols - x)
            out[pc:pc + kb, x:x + n] = panel[:, :n]
            assert not panel[:, n:].any(), "padding of a pre-packed panel is not zero"
    return out


@pytest.mark.host
@pytest.mark.parametrize("isa", RUNNABLE_ISAS)
def test_packed_layout(isa, build_dir):
    """What prepack returns: B as NR-column panels per KC slice (matmul, per batch item), filters as
    MR-row panels (conv, a_pack='packed'), or a plain copy of the filters (conv, a_pack='direct')."""
    t = TILES[isa]
    cases = dict((tag, spec) for tag, spec, _ in GEMM_CASES)
    spec = cases["mm_b2_ragged"]
    b = make_inputs(spec, seed=4)[1]
    packed = _host_kernel(build_dir, "layout_mm", spec, isa, "direct", 1, None).prepack(b)
    per_item = packed.reshape(spec.batch, -1)
    for item in range(spec.batch):
        assert np.array_equal(_unpack_panels(per_item[item], spec.k, spec.n, t["kc"], t["nr"]), b[item])

    spec = cases["conv_stem7x7_s2"]  # K = 147: ten KC slices, the last one ragged; M = 10 filters
    b = make_inputs(spec, seed=5)[1]
    filters = b.reshape(spec.k, -1)
    packed = _host_kernel(build_dir, "layout_conv", spec, isa, "packed", 1, None).prepack(b)
    assert np.array_equal(_unpack_panels(packed, filters.shape[1], spec.k, t["kc"], t["mr"]), filters.T)
    copied = _host_kernel(build_dir, "layout_conv", spec, isa, "direct", 1, None).prepack(b)
    assert np.array_equal(copied, b.ravel())


@pytest.mark.host
@pytest.mark.parametrize("isa", ALL_HOST_ISAS)
def test_depthwise_prepacked_host(isa, build_dir):
    spec = dw(6, 13, 19, 3, 3, n=2, stride=2, pad=(1, 0, 1, 1), bias=True, act="relu6")
    kernel = _build(host_plan(spec, isa, 2, function_name=f"pp_dw_{isa}_t2"), build_dir)
    if kernel is None:
        return
    _, b, _ = make_inputs(spec, seed=21)
    assert np.array_equal(kernel.prepack(b), b.ravel()), "depthwise pre-packing is a plain copy"
    _check_prepacked(kernel, spec, seeds=(21, 22))


@pytest.mark.host
def test_wrong_packed_size_is_one_line_error(build_dir):
    isa = RUNNABLE_ISAS[0]
    spec = dict((c[0], c[1]) for c in GEMM_CASES)["conv_s1_b2"]
    kernel = _host_kernel(build_dir, "errors", spec, isa, "packed", 1, None)
    a, b, bias = make_inputs(spec)
    packed = kernel.prepack(b)
    for bad in (packed[:-1], np.concatenate([packed, packed[:1]]), b.ravel(), np.zeros(0, np.float32)):
        with pytest.raises(OperatorError) as err:
            kernel.run_packed(a, bad, bias)
        text = str(err.value)
        assert "\n" not in text and kernel.rendered.function_name in text and str(packed.size) in text
    with pytest.raises(OperatorError, match="in1"):
        kernel.prepack(b[:, :-1])
    with pytest.raises(OperatorError, match="in0"):
        kernel.run_packed(a[:, :-1], packed, bias)
    # the kernel still works after the rejected calls
    _assert_ok(spec, kernel.run_packed(a, packed, bias), a, b, bias, "after errors")


@pytest.mark.host
def test_time_prepacked(build_dir):
    isa = RUNNABLE_ISAS[0]
    spec = GEMM_CASES[0][1]  # mm_b2_ragged
    kernel = _host_kernel(build_dir, "timing", spec, isa, "direct", 2, "n")
    a, b, bias = make_inputs(spec)
    m = kernel.time(a, b, bias, repeats=3, warmup=1, prepacked=True)
    assert isinstance(m, Measurement) and len(m.samples_s) == 3 and "pre-packed" in m.where
    assert_samples_positive(m.samples_s)
    per_call = kernel.time(a, b, bias, repeats=2, warmup=0)
    assert per_call.where == "host" and len(per_call.samples_s) == 2
    assert_samples_positive(per_call.samples_s)


@pytest.mark.host
def test_time_with_cold_weights_evicts_them_and_still_computes_the_layer(build_dir):
    """cold_weights=True evicts the packed weights before every timed call (a layer as a network
    meets it): the calls still read the right weights (the output checked against the oracle, the
    guards after the calls), and it needs pre-packed weights."""
    isa = RUNNABLE_ISAS[0]
    spec = GEMM_CASES[0][1]  # mm_b2_ragged
    kernel = _host_kernel(build_dir, "timing_cold", spec, isa, "direct", 2, "n")
    a, b, bias = make_inputs(spec, seed=5)
    m = kernel.time(a, b, bias, repeats=3, warmup=1, prepacked=True, cold_weights=True)
    assert len(m.samples_s) == 3 and "evicted" in m.where
    assert_samples_positive(m.samples_s)
    _assert_ok(spec, m.output, a, b, bias, "cold weights")
    with pytest.raises(OperatorError, match="prepacked=True"):
        kernel.time(a, b, bias, repeats=1, cold_weights=True)


# ---------------------------------------------------------------------------------------------
# Regression: conv input staging once read past the row when W + PL < SW (C division rounding
# toward zero made the last valid staged column 0 instead of -1)
# ---------------------------------------------------------------------------------------------

@pytest.mark.host
@pytest.mark.parametrize("isa", ALL_HOST_ISAS)
@pytest.mark.parametrize("a_pack", ["direct", "packed"])
def test_conv_narrow_input_stride2(a_pack, isa, build_dir):
    # W=1, stride 2, pad right 1: tap s=1 reads padded column 1 (phase 1), which must be zero
    spec = conv(3, 9, 1, 5, 3, 2, stride=2, pad=(1, 0, 1, 1), bias=True)
    kernel = _host_kernel(build_dir, "narrow_w", spec, isa, a_pack, 1, None)
    if kernel is not None:
        _check_prepacked(kernel, spec)


# ---------------------------------------------------------------------------------------------
# NEON under qemu: the harness's 'prepacked' argument
# ---------------------------------------------------------------------------------------------

NEON_CASES = [
    ("mm_b2_ragged", mm(13, 21, 37, batch=2, bias=True, act="relu"), "packed", 2),      # MR 6, NR 8: both tails
    ("mm_direct", mm(9, 30, 20, act="relu6"), "direct", 1),
    ("conv_s2_pad", conv(5, 9, 13, 7, 3, 3, n=2, stride=2, pad=(1, 1, 0, 1), bias=True), "packed", 2),  # N 4x7
    ("conv_s2_direct", conv(4, 10, 9, 11, 3, 3, stride=2, pad=1, act="relu"), "direct", 2),
    ("conv_pointwise", conv(18, 3, 5, 7, 1, 1, bias=True, act="relu6"), "packed", 1),
    ("dw_s2", dw(5, 9, 11, 3, 3, stride=2, pad=1, bias=True, act="relu6"), None, 2),
]


@pytest.mark.emulated
@needs_arm
@pytest.mark.parametrize("tag,spec,a_pack,threads", NEON_CASES, ids=[c[0] for c in NEON_CASES])
def test_neon_prepacked_qemu(tag, spec, a_pack, threads, build_dir):
    cpu = "cortex-a76" if "cortex-a76" in qemu_cpu_models() else "max"
    tiles = {} if a_pack is None else dict(mr=6, nr=8, kc=16, mc=12, nc=16, a_pack=a_pack)
    plan = hand_plan(spec, "neon", threads, gcc_march="armv8.2-a", qemu_cpu=cpu,
                     function_name=f"pp_neon_{tag}", **tiles)
    binary = build_arm(render_cpu_kernel(plan), build_dir)
    a, b, bias = make_inputs(spec, seed=31)
    meas = qemu_run(binary, spec, a, b, bias, qemu_cpu=cpu, repeats=2, prepacked=True)
    packed_out = meas.output
    _assert_ok(spec, packed_out, a, b, bias, f"neon {tag} prepacked")
    assert "emulated" in meas.where and len(meas.samples_s) == 2
    assert_samples_positive(meas.samples_s)
    out = qemu_run(binary, spec, a, b, bias, qemu_cpu=cpu).output
    _assert_ok(spec, out, a, b, bias, f"neon {tag}")
    assert np.array_equal(out, packed_out), f"neon {tag}: prepacked run differs from the normal run"
    support.record("neon (qemu)", "ran")



# ---------------------------------------------------------------------------------------------
# Transposed implicit GEMM (lowering 'implicit_gemm_t'): vectors along output channels, im2col
# rows of output pixels packed as A, filters transposed as B, every tile stored transposed.
# ---------------------------------------------------------------------------------------------

TRANSPOSED_CASES = [
    ("t_s1_b2", conv(5, 9, 11, 21, 3, 3, n=2, pad=1, bias=True, act="relu"), "m"),   # 21 channels: column tail
    ("t_s2_asym", conv(4, 12, 13, 40, 3, 3, stride=2, pad=(1, 0, 0, 1), bias=True), "n"),
    ("t_dil2", conv(3, 11, 12, 17, 3, 3, pad=(2, 1, 0, 2), dilation=2, act="relu6"), "n"),
    ("t_pointwise", conv(19, 5, 7, 33, 1, 1, bias=True), "m"),
    ("t_ow1", conv(4, 9, 1, 6, 3, 1, n=2, pad=(1, 0, 1, 0), act="relu"), "m"),
]


# im2col rows read straight from the staged image (a_pack 'im2col_direct'): output widths that
# every ISA's MR (6, 5, 3 above) divides, so a tile's pixels lie in one output row.
DIRECT_CASES = [
    ("d_s1_b2", conv(3, 8, 30, 21, 3, 3, n=2, pad=1, bias=True, act="relu"), "m"),          # OW 30
    ("d_s2", conv(4, 9, 59, 40, 3, 3, stride=2, pad=1, bias=True), "n"),                    # OW 30
    ("d_dil2_asym", conv(2, 10, 30, 17, 3, 3, pad=(2, 2, 1, 2), dilation=2, act="relu6"), "m"),  # OW 30
    ("d_stem7x7", conv(3, 15, 65, 33, 7, 7, stride=2, pad=3, bias=True), "n"),              # OW 33: 3 only
]


@pytest.mark.matrix(every=2)
@pytest.mark.host
@pytest.mark.parametrize("isa", ALL_HOST_ISAS)
@pytest.mark.parametrize("tag,spec,axis", TRANSPOSED_CASES + DIRECT_CASES,
                         ids=[c[0] for c in TRANSPOSED_CASES + DIRECT_CASES])
def test_transposed_conv_host(tag, spec, axis, isa, build_dir):
    """Each case's 2-thread build is made for one ISA, rotating with the case (the split divides the
    same loops on every ISA): every ISA meets both split axes, both A operands and a batch of two."""
    outs = []
    index = [c[0] for c in TRANSPOSED_CASES + DIRECT_CASES].index(tag)
    for threads in ((1, 2) if ALL_HOST_ISAS[index % len(ALL_HOST_ISAS)] == isa else (1,)):
        plan = host_plan(spec, isa, threads, transposed=True, parallel_axis=axis if threads > 1 else None,
                         function_name=f"pp_{tag}_{isa}_t{threads}", **TILES[isa])
        assert plan.lowering == "implicit_gemm_t"
        # a pointwise conv reads its image in place whatever MR; otherwise MR must divide OW
        direct = spec.pointwise or spec.out_w % plan.gemm.mr == 0
        assert plan.gemm.a_pack == ("im2col_direct" if direct else "packed")
        kernel = _build(plan, build_dir)
        if kernel is not None:
            outs.append(_check_prepacked(kernel, spec))
    if len(outs) == 2:
        assert np.array_equal(outs[0], outs[1]), f"{tag}: 1- and 2-thread results differ"


@pytest.mark.emulated
@needs_arm
@pytest.mark.parametrize("tag,spec", [
    ("t_neon_s2", conv(5, 9, 13, 10, 3, 3, n=2, stride=2, pad=(1, 1, 0, 1), bias=True, act="relu")),
    ("t_neon_s1", conv(3, 7, 6, 9, 3, 3, pad=1, act="relu6")),
], ids=["t_neon_s2", "t_neon_s1"])
def test_transposed_conv_neon_qemu(tag, spec, build_dir):
    cpu = "cortex-a76" if "cortex-a76" in qemu_cpu_models() else "max"
    plan = hand_plan(spec, "neon", 2, transposed=True, gcc_march="armv8.2-a", qemu_cpu=cpu,
                     function_name=f"pp_{tag}", mr=6, nr=8, kc=16, mc=12, nc=16)
    binary = build_arm(render_cpu_kernel(plan), build_dir)
    a, b, bias = make_inputs(spec, seed=41)
    out = qemu_run(binary, spec, a, b, bias, qemu_cpu=cpu).output
    _assert_ok(spec, out, a, b, bias, f"neon {tag}")
    packed_out = qemu_run(binary, spec, a, b, bias, qemu_cpu=cpu, prepacked=True).output
    assert np.array_equal(out, packed_out), f"neon {tag}: prepacked run differs from the normal run"
    support.record("neon (qemu)", "ran")




@pytest.mark.emulated
@needs_arm
def test_transposed_conv_im2col_direct_neon_qemu(build_dir):
    cpu = "cortex-a76" if "cortex-a76" in qemu_cpu_models() else "max"
    spec = conv(5, 9, 23, 10, 3, 3, n=2, stride=2, pad=(1, 1, 0, 1), bias=True, act="relu")  # OW 12
    plan = hand_plan(spec, "neon", 2, transposed=True, gcc_march="armv8.2-a", qemu_cpu=cpu,
                     function_name="pp_d_neon", mr=6, nr=8, kc=16, mc=12, nc=16)
    assert plan.gemm.a_pack == "im2col_direct"
    binary = build_arm(render_cpu_kernel(plan), build_dir)
    a, b, bias = make_inputs(spec, seed=43)
    out = qemu_run(binary, spec, a, b, bias, qemu_cpu=cpu).output
    _assert_ok(spec, out, a, b, bias, "neon im2col_direct")
    packed_out = qemu_run(binary, spec, a, b, bias, qemu_cpu=cpu, prepacked=True).output
    assert np.array_equal(out, packed_out)
    support.record("neon (qemu)", "ran")
