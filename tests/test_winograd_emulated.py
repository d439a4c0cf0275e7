"""Winograd kernels for NEON, synthesized for the Cortex-A55, A76 and X1 descriptions (each with
its own GEMM stage: register tile, in-order or out-of-order inline-assembly micro-kernel, thread
split) with the lowering forced per tile size m, cross-built and run under qemu-aarch64 through
both entry points, checked against the float64 direct reference under the derived Winograd bound."""
from __future__ import annotations

import numpy as np
import pytest

import support
from support import conv, needs_arm, qemu_run
from xfc.build.cpu import build_arm
from xfc.cpu.codegen import render_cpu_kernel
from xfc.cpu.synth import synthesize_cpu
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
    cpu = plan.qemu_cpu if plan.qemu_cpu in qemu_cpu_models() else "max"
    a, b, bias = make_inputs(SPEC, seed=23)
    outs = []
    for prepacked in (False, True):
        out = qemu_run(binary, SPEC, a, b, bias, qemu_cpu=cpu, prepacked=prepacked, march=plan.gcc_march).output
        verdict = check_winograd_output(SPEC, m, out, a, b, bias)
        assert verdict.ok, f"{core} m={m} prepacked={prepacked}: {verdict.describe()} ({plan.gemm})"
        outs.append(out)
    assert np.array_equal(outs[0], outs[1]), "pre-packed and normal entry points differ"
    support.record("neon (qemu)", "ran")
