"""The input transform's ragged groups (issue 19): a short tile row (fewer than LANES tiles left in
the row) and LANES tiles straddling two packed V panels are stored with lane-range stores straight
from the register on AVX-512, AVX2 (vmaskmovps) and NEON (single-lane stores), and through a lane
buffer with scalar stores on generic. The shapes below make both cases occur (checked here from
the plan's numbers) and the kernels verify under the Winograd bound; the NEON ones run in qemu."""
from __future__ import annotations

import math

import numpy as np
import pytest

import support
from support import RUNNABLE_ISAS, conv, host_kernel, host_march, needs_arm, qemu_run
from xfc.toolchain.cpu import build_arm
from xfc.cpu.codegen import render_cpu_kernel
from xfc.cpu.winograd import hand_winograd_plan
from xfc.ops.reference import check_winograd_output, make_inputs
from xfc.ops.winograd import tile_counts
from xfc.runners.qemu import qemu_cpu_models

# OH 19, OW 21 (pad 1): 11 tiles per row at m=2, 6 at m=4, 4 at m=6 (not multiples of the lanes)
SPEC = conv(11, 19, 21, 7, 3, 3, pad=1, bias=True, act="relu")
TILES = {"avx512": dict(mr=4, nr=16, kc=8, mc=8, nc=32, lanes=16),
         "avx2": dict(mr=4, nr=16, kc=8, mc=8, nc=32, lanes=8),
         "neon": dict(mr=4, nr=8, kc=8, mc=8, nc=16, lanes=4),
         "generic": dict(mr=3, nr=8, kc=8, mc=6, nc=16, lanes=4)}


def _plan(isa, m, threads=1):
    tiles = {k: v for k, v in TILES[isa].items() if k != "lanes"}
    return hand_winograd_plan(SPEC, m, isa, threads, gcc_march=host_march(isa) if isa != "neon" else "armv8.2-a",
                              function_name=f"wlane_{isa}_m{m}_t{threads}", **tiles)


def _ragged_groups(m, nr, lanes):
    """(short rows, straddling groups) among the input transform's groups of LANES tiles."""
    th, tw = tile_counts(SPEC, m)
    short = straddle = 0
    for row in range(th):
        for tw0 in range(0, tw, lanes):
            t, n = row * tw + tw0, min(lanes, tw - tw0)
            short += n < lanes
            straddle += t % nr + n > nr
    return short, straddle


@pytest.mark.unit
@pytest.mark.parametrize("isa", ("avx512", "avx2", "neon", "generic"))
@pytest.mark.parametrize("m", (2, 4))
def test_the_shape_has_both_ragged_cases_and_the_dialects_store_them_as_stated(isa, m):
    plan = _plan(isa, m)
    assert plan.vector_lanes == TILES[isa]["lanes"]
    short, straddle = _ragged_groups(m, plan.gemm.nr, plan.vector_lanes)
    assert short > 0 and straddle > 0
    source = render_cpu_kernel(plan).source
    if isa == "generic":
        assert "XFC_WSTORE_RANGE(" not in source and "lane_buf" in source
    else:
        assert "XFC_WSTORE_RANGE(dst" in source and "XFC_WSTORE_RANGE(next" in source and "lane_buf" not in source


def _check(spec, m, outs, a, b, bias, label):
    for out in outs:
        verdict = check_winograd_output(spec, m, out, a, b, bias)
        assert verdict.ok, f"{label}: {verdict.describe()}"
    assert np.array_equal(outs[0], outs[1]), f"{label}: pre-packed and normal entry points differ"


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("xfc_winograd_lanes")


@pytest.mark.host
@pytest.mark.matrix(every=2)   # each ISA and m stays in the sample
@pytest.mark.parametrize("isa", [i for i in ("avx512", "avx2", "generic") if i in RUNNABLE_ISAS])
@pytest.mark.parametrize("m", (2, 4, 6))
def test_ragged_groups_verify_on_the_host(isa, m, build_dir):
    a, b, bias = make_inputs(SPEC, seed=31)
    results = []
    for threads in (1, 2):
        kernel = host_kernel(render_cpu_kernel(_plan(isa, m, threads)), build_dir)
        support.record(isa, "ran")
        outs = [kernel(a, b, bias), kernel.run_packed(a, kernel.prepack(b), bias)]
        _check(SPEC, m, outs, a, b, bias, f"{isa} m={m} threads={threads}")
        results.append(outs[0])
    assert np.array_equal(results[0], results[1]), "1-thread and 2-thread builds differ"


@pytest.mark.emulated
@needs_arm
@pytest.mark.parametrize("m", (2, 4))
def test_ragged_groups_verify_on_neon_under_qemu(m, build_dir):
    plan = _plan("neon", m)
    rendered = render_cpu_kernel(plan)
    binary = build_arm(rendered, build_dir / f"neon_m{m}")
    cpu = "cortex-a76" if "cortex-a76" in qemu_cpu_models() else "max"
    a, b, bias = make_inputs(SPEC, seed=31)
    outs = [qemu_run(binary, SPEC, a, b, bias, qemu_cpu=cpu, prepacked=p, march=plan.gcc_march).output
            for p in (False, True)]
    _check(SPEC, m, outs, a, b, bias, f"neon m={m}")
    support.record("neon (qemu)", "ran")
    assert math.isfinite(float(np.abs(outs[0]).max()))
