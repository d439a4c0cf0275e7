"""GEMM kernels on the shapes tests/support/cases.py derives from their own tiles: every row/column tail
corner and K around the unroll and the KC slices, on every host ISA (run where this CPU can,
compiled otherwise) and on NEON under qemu. Verified against the float64 reference."""
from __future__ import annotations

import pytest

import support
from support.cases import gemm_cases
from support import qemu_run
from xfc.toolchain.cpu import build_arm
from xfc.cpu.codegen import render_cpu_kernel
from xfc.cpu.isa import isa_row
from xfc.cpu.plans import hand_plan
from xfc.ops.reference import make_inputs
from xfc.ops.spec import make_spec

KC = 24        # small slices, so that K crosses several of them on small shapes
K_UNROLL = 4


def _plan_cases(isa: str, mr: int, nr: int):
    lanes = isa_row(isa).hand_lanes
    return [(isa, mr, nr, case) for case in gemm_cases(mr, nr, lanes, KC, K_UNROLL)]


HOST_CASES = [c for isa in support.ALL_HOST_ISAS for c in _plan_cases(isa, *isa_row(isa).hand_tile)]
NEON_CASES = _plan_cases("neon", 7, 8)


def _spec(case):
    return make_spec("matmul", dict(m=case.m, n=case.n, k=case.k), bias=case.bias, activation=case.activation)


@pytest.mark.host
@pytest.mark.parametrize("isa,mr,nr,case", HOST_CASES, ids=[f"{c[0]}-{c[3].id}" for c in HOST_CASES])
def test_host_gemm_edge_cases(isa, mr, nr, case, tmp_path):
    spec = _spec(case)
    # MC of two row tiles and NC of one column tile: the outer blocking loops run several times too
    plan = support.host_plan(spec, isa, 1, mr=mr, nr=nr, kc=KC, k_unroll=K_UNROLL, mc=2 * mr, nc=nr,
                             function_name=f"xfc_case_{isa}")
    support.run_host_plan(plan, tmp_path, seed=5, what=f"{isa} {case.why}")


@pytest.mark.emulated
@pytest.mark.skipif(not support.HAVE_ARM, reason="aarch64-linux-gnu-gcc and qemu-aarch64 needed")
@pytest.mark.parametrize("case", NEON_CASES[::2], ids=[c[3].id for c in NEON_CASES[::2]])
def test_neon_gemm_edge_cases(case, tmp_path):
    _, mr, nr, case = case
    spec = _spec(case)
    plan = hand_plan(spec, "neon", 1, mr=mr, nr=nr, kc=KC, k_unroll=K_UNROLL, mc=2 * mr, nc=nr, a_load_bits=128,
                     gcc_march="armv8.2-a+fp16+dotprod", qemu_cpu="cortex-a76", function_name="xfc_case_neon")
    binary = build_arm(render_cpu_kernel(plan), tmp_path)
    a, b, bias = make_inputs(spec, seed=5)
    out = qemu_run(binary, spec, a, b, bias, qemu_cpu=plan.qemu_cpu, repeats=1).output
    support.assert_verified(spec, out, a, b, bias, f"neon {case.why}")
    support.record("neon (qemu)", "ran")


@pytest.mark.unit
def test_cases_cover_every_tail():
    lanes, mr, nr = 16, 14, 32
    cases = gemm_cases(mr, nr, lanes, KC, K_UNROLL)
    assert {c.m % mr for c in cases} >= {0, 1, mr - 1} and any(c.m < mr for c in cases)
    assert {c.n % nr for c in cases} >= {0, lanes, nr - 1, 1} and any(c.n < lanes for c in cases)
    assert {c.k for c in cases} == {1, K_UNROLL - 1, K_UNROLL + 1, KC - 1, KC, KC + 1, 2 * KC + K_UNROLL + 1}
    assert len({(c.m, c.n) for c in cases}) == len(cases) and any(c.bias for c in cases)
