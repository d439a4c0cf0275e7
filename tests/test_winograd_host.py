"""Winograd kernels (templates/cpu/winograd.c.j2, and winograd_cv.c.j2 for vectors over channels)
built with the host gcc for every host ISA, both vector axes and every tile size m, checked against the float64 direct reference under the derived Winograd bound
(xfc.ops.winograd.check_winograd_output), through both entry points (weights transformed per call,
and pre-packed once: the two must agree bitwise), with 1 and 2 or 3 threads (bitwise equal too).

Shapes: output sizes that are not multiples of m, padding 0 / 1 / asymmetric, batch > 1, channel
counts just around the register tiles (M = K_out around MR, N = tiles around NR, C around KC), a
single channel, large magnitudes. Kernels of an ISA this CPU lacks are compiled only (recorded).
"""
from __future__ import annotations

import numpy as np
import pytest

import support
from support import ALL_HOST_ISAS, RUNNABLE_ISAS, conv, host_kernel, host_march
from xfc.cpu.codegen import render_cpu_kernel
from xfc.cpu.winograd import hand_winograd_plan
from xfc.errors import OperatorError
from xfc.ops.reference import make_inputs
from xfc.ops.reference import check_winograd_output

pytestmark = pytest.mark.host

# Small tiles so that M, N and C all end in ragged tails and the blocking runs several KC slices
# and MC / NC blocks.
TILES = {
    "avx512": dict(mr=6, nr=32, kc=16, mc=12, nc=64),
    "avx2": dict(mr=5, nr=16, kc=16, mc=10, nc=32),
    "generic": dict(mr=3, nr=8, kc=16, mc=6, nc=16),
}

CASES = [
    # id, spec, parallel axis of the 2-thread build
    ("ragged_b2_asym", conv(37, 13, 11, 21, 3, 3, n=2, pad=(1, 0, 2, 1), bias=True, act="relu"), "n"),
    ("pad0_relu6", conv(17, 9, 15, 7, 3, 3, pad=0, bias=True, act="relu6"), "m"),
    ("pad1_k_mr", conv(33, 16, 16, 13, 3, 3, pad=1), "m"),         # K = 13: MR +- 1 for the tiles above
    ("c1_k1_tiny", conv(1, 3, 4, 1, 3, 3, pad=(0, 1, 0, 1), bias=True), "n"),
]


def _kernel(spec, m, isa, threads, axis, tag, build_dir, vectors="tiles"):
    plan = hand_winograd_plan(spec, m, isa, threads, gcc_march=host_march(isa), vectors=vectors,
                              parallel_axis=axis if threads > 1 else None,
                              function_name=f"wino_{tag}_m{m}_{isa}_{vectors}_t{threads}", **TILES[isa])
    rendered = render_cpu_kernel(plan)
    if isa not in RUNNABLE_ISAS:
        support.compile_if_sampled(rendered, build_dir)
        return None
    support.record(isa, "ran")
    return host_kernel(rendered, build_dir)


def _check(kernel, spec, m, a, b, bias):
    packed = kernel.prepack(b)
    got = kernel(a, b, bias)
    got_packed = kernel.run_packed(a, packed, bias)
    for what, out in (("normal", got), ("pre-packed", got_packed)):
        verdict = check_winograd_output(spec, m, out, a, b, bias)
        assert verdict.ok, f"{kernel.rendered.function_name} {what}: {verdict.describe()}"
    assert np.array_equal(got, got_packed), "pre-packed and normal entry points differ"
    return got


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("xfc_winograd_build")


# generic spells the same code with 4-lane vectors and no masks: two cases keep the compile count low
GENERIC_SUBSET = {"ragged_b2_asym", "c1_k1_tiny"}
HOST_CASES = [pytest.param(*case, isa, id=f"{case[0]}-{isa}") for case in CASES for isa in ALL_HOST_ISAS
              if isa != "generic" or case[0] in GENERIC_SUBSET]


@pytest.mark.matrix(every=3)
@pytest.mark.parametrize("vectors", ("tiles", "channels"))
@pytest.mark.parametrize("m", (2, 4, 6))
@pytest.mark.parametrize("tag,spec,axis,isa", HOST_CASES)
def test_winograd_host(tag, spec, axis, isa, m, vectors, build_dir):
    """axis: the GEMM's split at 2 threads; with vectors over tiles 'n' splits tiles, over
    channels 'm' does (each case's axis exercises the other split in the other orientation).
    The 2-thread build is made for m=4 only: the split does not depend on m (it divides GEMM rows
    or tiles), and test_winograd_three_threads_split_mid_row splits m=2 and m=4 over both axes."""
    a, b, bias = make_inputs(spec, seed=7)
    outs = []
    for threads in ((1, 2) if m == 4 else (1,)):
        kernel = _kernel(spec, m, isa, threads, axis, tag, build_dir, vectors)
        if kernel is not None:
            outs.append(_check(kernel, spec, m, a, b, bias))
    if len(outs) == 2:
        assert np.array_equal(outs[0], outs[1]), "1-thread and 2-thread builds differ"


@pytest.mark.parametrize("vectors", ("tiles", "channels"))
@pytest.mark.parametrize("m", (2, 4, 6))
def test_winograd_large_magnitudes(m, vectors, build_dir):
    isa = RUNNABLE_ISAS[0]
    spec = conv(40, 10, 12, 9, 3, 3, n=2, pad=1, bias=True)
    kernel = _kernel(spec, m, isa, 1, "n", "large", build_dir, vectors)
    a, b, bias = make_inputs(spec, seed=9)
    _check(kernel, spec, m, a * np.float32(3e4), b * np.float32(2e3), bias * np.float32(1e7))


@pytest.mark.parametrize("vectors", ("tiles", "channels"))
@pytest.mark.parametrize("m", (2, 4))
def test_winograd_kernel_wrong_weights_fail(m, vectors, build_dir):
    """The check is not vacuous: the kernel's output for other weights fails it."""
    isa = RUNNABLE_ISAS[0]
    spec = CASES[0][1]
    kernel = _kernel(spec, m, isa, 1, "n", "wrong", build_dir, vectors)
    a, b, bias = make_inputs(spec, seed=7)
    b2 = b.copy()
    b2[3, 5, 1, 2] += 0.5
    assert not check_winograd_output(spec, m, kernel(a, b2, bias), a, b, bias).ok


def test_winograd_plan_refuses_other_shapes():
    with pytest.raises(OperatorError, match="stride"):
        hand_winograd_plan(conv(4, 9, 9, 4, 3, 3, stride=2), 2, "avx2")
    with pytest.raises(OperatorError, match="m=3"):
        hand_winograd_plan(conv(4, 9, 9, 4, 3, 3), 3, "avx2")


@pytest.mark.matrix(every=2)   # each split axis, m and vector axis stays in the sample
@pytest.mark.parametrize("vectors", ("tiles", "channels"))
@pytest.mark.parametrize("axis", ("n", "m"))
@pytest.mark.parametrize("m", (2, 4))
def test_winograd_three_threads_split_mid_row(axis, m, vectors, build_dir):
    """Three threads: with the tile-owned split ('n' over tiles, 'm' over channels) the threads'
    panels of tiles start and end in the middle of tile rows (the panel does not divide the row's
    tile count), and the last thread's range holds the short last panel; the block of tiles (NC
    over tiles, MC over channels) is one panel, so each thread runs its share as several blocks
    (transform, GEMMs, output per block). The output equals the 1-thread build's bitwise."""
    isa = RUNNABLE_ISAS[0]
    spec = conv(11, 29, 23, 10, 3, 3, n=2, pad=1, bias=True, act="relu")
    a, b, bias = make_inputs(spec, seed=11)
    block = dict(mc=TILES[isa]["mr"]) if vectors == "channels" else dict(nc=TILES[isa]["nr"])
    outs = []
    for threads in (1, 3):
        plan = hand_winograd_plan(spec, m, isa, threads, gcc_march=host_march(isa), vectors=vectors,
                                  parallel_axis=axis if threads > 1 else None,
                                  function_name=f"wino_mid_m{m}_{axis}_{vectors}_t{threads}",
                                  **dict(TILES[isa], **block))
        kernel = host_kernel(render_cpu_kernel(plan), build_dir)
        outs.append(_check(kernel, spec, m, a, b, bias))
    assert np.array_equal(outs[0], outs[1]), "1-thread and 3-thread builds differ"
