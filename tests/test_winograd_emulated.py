"""Winograd kernels for NEON, synthesized for the Cortex-A55, A76 and X1 descriptions (each with
its own GEMM stage: register tile, in-order or out-of-order inline-assembly micro-kernel, thread
split) with the lowering forced per tile size m, cross-built and run under qemu-aarch64 through
both entry points, checked against the float64 direct reference under the derived Winograd bound."""
from __future__ import annotations

import numpy as np
import pytest

import support
from support import conv, needs_arm, qemu_run
from xfc.toolchain.cpu import build_arm
from xfc.cpu.codegen import render_cpu_kernel
from xfc.cpu.synth import synthesize_cpu
from xfc.cpu.winograd import hand_winograd_plan
from xfc.hardware.load import load
from xfc.ops.reference import check_winograd_output, make_inputs
from xfc.runners.qemu import qemu_cpu_models

pytestmark = [pytest.mark.emulated, needs_arm]

CORES = ("cortex-a55", "cortex-a76", "cortex-x1")
# ragged output (OH 11, OW 9 for pad (1,0,2,1)), batch 2, channels around the NEON tiles
SPEC = conv(19, 10, 10, 13, 3, 3, n=2, pad=(1, 0, 2, 1), bias=True, act="relu6")


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("xfc_winograd_neon")


@pytest.mark.matrix(every=2)   # each core and m stays in the sample
@pytest.mark.parametrize("m", (2, 4, 6))
@pytest.mark.parametrize("core", CORES)
def test_winograd_neon_qemu(core, m, build_dir):
    hw = load(core)
    result = synthesize_cpu(SPEC, hw, threads=min(2, hw.cluster().count), lowering="winograd", winograd_m=m)
    plan = result.plan
    assert plan.lowering == "winograd" and plan.winograd_m == m
    rendered = render_cpu_kernel(plan)
    out_dir = build_dir / f"{core}_m{m}"
    binary = build_arm(rendered, out_dir)
    _run_and_check(binary, plan, m, seed=23, what=f"{core} m={m} ({plan.gemm})")


def _run_and_check(binary, plan, m, seed, what):
    """Run both entry points under qemu; each verifies under the Winograd bound, and they agree."""
    cpu = plan.qemu_cpu if plan.qemu_cpu in qemu_cpu_models() else "max"
    a, b, bias = make_inputs(SPEC, seed=seed)
    outs = []
    for prepacked in (False, True):
        out = qemu_run(binary, SPEC, a, b, bias, qemu_cpu=cpu, prepacked=prepacked, march=plan.gcc_march).output
        verdict = check_winograd_output(SPEC, m, out, a, b, bias)
        assert verdict.ok, f"{what} prepacked={prepacked}: {verdict.describe()}"
        outs.append(out)
    assert np.array_equal(outs[0], outs[1]), "pre-packed and normal entry points differ"
    support.record("neon (qemu)", "ran")


@pytest.mark.parametrize("axis", ("m", "n"))
@pytest.mark.parametrize("m", (2, 4))
def test_winograd_neon_vectors_over_channels_qemu(m, axis, build_dir):
    """Vectors over channels (templates/cpu/winograd_cv.c.j2) render, build and verify for NEON too,
    at 2 threads split over tiles ('m') and over output channels ('n'); the synthesizer does not
    choose them on NEON yet (winograd.vector_axes)."""
    plan = hand_winograd_plan(SPEC, m, "neon", 2, vectors="channels", parallel_axis=axis, mr=5, nr=8, kc=8,
                              mc=10, nc=8, gcc_march="armv8.2-a", qemu_cpu="cortex-a76",
                              function_name=f"wino_cv_m{m}_{axis}")
    binary = build_arm(render_cpu_kernel(plan), build_dir / f"cv_m{m}_{axis}")
    _run_and_check(binary, plan, m, seed=29, what=f"channels m={m} split={axis}")
