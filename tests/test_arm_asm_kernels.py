"""The NEON inline-assembly micro-kernels (xfc/cpu/neon_asm.py), checked from the compiled assembly.

emulated: for every shipped ARM core description and every suite workload, the synthesized kernel
          is cross-compiled with xfc's ARM flags (-S) and its innermost FMA loop (xfc.analysis.mca's parser)
          has no stack traffic at all and exactly the loads the plan scored: per k step one q/d/s
          load per A load group (64-bit `ldr d` on in-order cores), B with ldp/ldr q, one koff load
          for A read from the staged image; depthwise one q load per distinct input vector and one
          q store per output vector. Kernels with ragged tails in every dimension and a k remainder
          are verified under qemu-aarch64 (with each core's -cpu model) against the numpy reference.
          Hand plans force the loop onto odd tiles, k remainders, KC slices, both orders (qemu).
unit:     the register map, the instruction forms of the assembly generator, refused plans.
"""
from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from collections import Counter

import pytest

import support
from support import conv, dw, mm, needs_arm
from xfc.analysis import mca
from xfc.toolchain.cpu import build_arm
from xfc.cpu import neon_asm
from xfc.cpu.codegen import a_load_groups, depthwise_context, render_cpu_kernel, validate_plan
from xfc.cpu.plans import hand_plan
from xfc.errors import OperatorError
from xfc.ops.reference import make_inputs
from xfc.cpu.synth import synthesize_cpu
from xfc.hardware.load import SHIPPED_ROOT, load_path
from xfc.ops.workloads import SUITE, suite_spec

unit = pytest.mark.unit
emulated = pytest.mark.emulated

ARM_CORES = sorted(p.stem for p in (SHIPPED_ROOT / "cpu").glob("*.yaml"))


def _core_hw(name: str):
    return load_path(SHIPPED_ROOT / "cpu" / f"{name}.yaml")


# ---------------------------------------------------------------------------------------------
# unit: the generator
# ---------------------------------------------------------------------------------------------

@unit
def test_register_map_uses_each_register_once_and_refuses_more_than_32():
    groups = a_load_groups("neon", 13, 128)
    regs = neon_asm.register_map(13, 2, groups)
    assert len(set(regs.used)) == len(regs.used) == 32
    assert [g["width"] for g in groups] == [4, 4, 4, 1]
    with pytest.raises(ValueError):
        neon_asm.register_map(14, 2, a_load_groups("neon", 14, 128))


@unit
def test_in_order_kloop_uses_64_bit_a_loads_post_incremented():
    groups = a_load_groups("neon", 16, 64)
    loop = neon_asm.render_asm_kloop(16, 1, groups, "packed", 16, 4, "asm_in_order")
    main = loop["lines"][loop["lines"].index("1:") + 1: loop["lines"].index("b.ne 1b")]
    kinds = Counter(line.split()[0] + " " + line.split()[1][0] for line in main if line.startswith(("ld", "fmla")))
    assert kinds == Counter({"fmla v": 64, "ldr q": 4, "ldr d": 4, "ldur d": 28}), kinds
    assert sum(line.endswith("], #64") for line in main) == 4      # A: one post-increment per k step
    assert sum(line.endswith("], #16") for line in main) == 4      # B: the same
    # in order: a k step starts B, A0, A1, then the next A load sits before the FMAs of A0
    assert [line.split()[0] for line in main[:5]] == ["ldr", "ldr", "ldur", "ldur", "fmla"]
    assert loop["registers"] == 16 + 1 + 8


@unit
def test_depthwise_loop_spreads_inputs_over_the_free_registers():
    loads = [{"offset": 4 * k, "uses": [{"row": 0, "vec": 0, "tap": k % 9}]} for k in range(9)]
    out = neon_asm.render_depthwise_asm(loads, 9, 1, 1, 4, 7, "relu6", "asm_out_of_order")
    assert out["registers"] == 32   # 9 taps + 1 accumulator + zero and six + 20 rotating inputs
    assert any(line.startswith("fmin") for line in out["lines"])
    with pytest.raises(ValueError):
        neon_asm.render_depthwise_asm(loads, 9, 11, 2, 4, 7, "none", "asm_out_of_order")


# ---------------------------------------------------------------------------------------------
# emulated: the compiled inner loops of the suite on every shipped core
# ---------------------------------------------------------------------------------------------

def _expected_gemm_loads(plan) -> Counter:
    g = plan.gemm
    nv = g.nr // plan.vector_lanes
    widths = Counter(grp["width"] for grp in a_load_groups("neon", g.mr, g.a_load_bits))
    per_step = Counter({"q": math.ceil(nv / 2) + widths[4], "d": widths[2], "s": widths[1]})
    if g.a_pack == "im2col_direct":
        per_step["x"] += 1
    return Counter({k: v * g.k_unroll for k, v in per_step.items() if v})


@emulated
@needs_arm
@pytest.mark.parametrize("core_name", ARM_CORES)
def test_suite_inner_loops_have_no_stack_traffic_and_the_planned_loads(core_name):
    hw = _core_hw(core_name)
    core = hw.cluster().core
    for workload in sorted(SUITE):
        # implicit-GEMM plans: the loop with the most FMAs of a Winograd kernel is its filter transform
        plan = synthesize_cpu(suite_spec(workload), hw, threads=1, lowering="direct").plan
        where = f"{core_name} {workload}"
        loop = mca.find_fma_loop(mca.compile_to_assembly(render_cpu_kernel(plan)))
        counts = mca.count_instructions(loop)
        assert (counts.spill_stores, counts.stack_reloads, counts.gpr_stack_accesses) == (0, 0, 0), where
        assert counts.register_moves == 0, where
        loads = Counter(dict(counts.loads_by_class))
        if plan.gemm is not None:
            g = plan.gemm
            assert g.ukernel == ("asm_in_order" if core.pipeline == "in_order" else "asm_out_of_order"), where
            if core.pipeline == "in_order":
                assert g.a_load_bits == 64, where
            assert counts.fma == g.k_unroll * g.mr * (g.nr // plan.vector_lanes), where
            assert loads == _expected_gemm_loads(plan), (where, loads)
            assert counts.stores == 0, where
        else:
            d = plan.depthwise
            assert d.ukernel != "intrinsics", where
            planned_loads = len(depthwise_context(plan)["loads"])   # distinct input vectors of one block
            assert counts.fma == d.oh_rows * d.ow_vectors * 9, where
            assert loads == Counter({"q": planned_loads}), (where, loads)
            assert counts.stores == d.oh_rows * d.ow_vectors, where


# Ragged in every dimension, a k remainder (k % k_unroll != 0), fused epilogues, both strides.
VERIFY_SHAPES = (
    ("matmul", "m=53,n=37,k=71", ()),
    ("conv2d", "c=13,h=17,w=16,k=21,r=3,s=3", ("--pad", "1", "--bias", "--activation", "relu6")),
    ("conv2d", "c=7,h=19,w=23,k=19,r=3,s=3", ("--stride", "2", "--bias")),
    ("depthwise", "n=2,c=5,h=37,w=41,r=3,s=3", ("--pad", "1", "--bias", "--activation", "relu6")),
    ("depthwise", "c=3,h=29,w=45,r=3,s=3", ("--stride", "2", "--pad", "1", "--activation", "relu")),
)


@emulated
@needs_arm
@pytest.mark.parametrize("core_name", ["cortex-a55", "cortex-a76", "cortex-x1"])   # in-order, A7x, X-class
def test_asm_kernels_verify_under_qemu(core_name, tmp_path):
    for i, (op, shape, extra) in enumerate(VERIFY_SHAPES):
        out = tmp_path / f"k{i}"
        proc = subprocess.run([sys.executable, "-m", "xfc", "synth", op, "--hw", core_name, "--shape", shape,
                               *extra, "-o", str(out), "--verify"],
                              capture_output=True, text=True, timeout=900, env=dict(os.environ))
        assert proc.returncode == 0, (core_name, op, shape, proc.stderr[-2000:])
        assert "verified: yes" in proc.stdout, (core_name, op, shape, proc.stdout[-2000:])
        assert "__asm__ volatile" in (out / f"xfc_{op}.c").read_text(), (core_name, op, shape)


# Hand plans force the assembly loop onto shapes the synthesizer would not pick: odd MR (one A
# group of each width), a k remainder, several KC slices (the accumulate path), transposed conv
# with A read from the staged image, two threads, both instruction orders and both A load widths.
HAND_CASES = (
    ("mm-13x8-a128", mm(29, 19, 45, bias=True, act="relu"), dict(mr=13, nr=8, kc=20, a_load_bits=128)),
    ("mm-7x12-a64", mm(15, 27, 9, batch=2), dict(mr=7, nr=12, kc=128, a_load_bits=64)),
    ("mm-1x16-a64", mm(3, 33, 18), dict(mr=1, nr=16, kc=7, a_load_bits=64)),
    ("conv-t-8x12", conv(6, 9, 16, 13, 3, 3, pad=1, bias=True, act="relu6"),
     dict(mr=8, nr=12, kc=23, a_load_bits=128, transposed=True)),
    ("conv-t-3x8-packed", conv(5, 7, 10, 9, 3, 3, stride=2, pad=1), dict(mr=3, nr=8, kc=16, a_load_bits=64,
                                                                            transposed=True)),
    ("conv-6x8", conv(4, 8, 9, 11, 1, 1, act="relu"), dict(mr=6, nr=8, kc=3, a_load_bits=128)),
    ("dw-5x2", dw(4, 13, 23, 3, 3, pad=1, bias=True, act="relu6"), dict(oh_rows=5, ow_vectors=2)),
    ("dw-3x3-s2", dw(3, 15, 37, 3, 3, stride=2, pad=(1, 1, 0, 2)), dict(oh_rows=3, ow_vectors=3)),
)


@emulated
@needs_arm
@pytest.mark.parametrize("order", neon_asm.ASM_UKERNELS)
@pytest.mark.parametrize("name,spec,overrides", HAND_CASES, ids=[c[0] for c in HAND_CASES])
def test_hand_plans_with_the_asm_loop_verify_under_qemu(name, spec, overrides, order, tmp_path):
    plan = hand_plan(spec, "neon", 2, gcc_march="armv8.2-a", qemu_cpu="cortex-a76", **overrides)
    if plan.gemm is not None:
        plan = dataclasses.replace(plan, gemm=dataclasses.replace(plan.gemm, ukernel=order))
    else:
        plan = dataclasses.replace(plan, depthwise=dataclasses.replace(plan.depthwise, ukernel=order))
    rendered = render_cpu_kernel(plan)
    assert "__asm__ volatile" in rendered.source, name
    binary = build_arm(rendered, tmp_path)
    a, b, bias = make_inputs(spec, seed=5)
    out = support.qemu_run(binary, spec, a, b, bias, qemu_cpu=plan.qemu_cpu).output
    support.assert_verified(spec, out, a, b, bias, f"{name} {order} on qemu cortex-a76")


@unit
def test_asm_ukernel_is_refused_where_it_cannot_be_spelled():
    plan = hand_plan(mm(8, 8, 8), "avx512", 1)
    with pytest.raises(OperatorError):
        validate_plan(dataclasses.replace(plan, gemm=dataclasses.replace(plan.gemm, ukernel="asm_out_of_order")))
    plan = hand_plan(mm(8, 8, 8), "neon", 1, mr=14, nr=8)   # 28 + 2 + 4 registers
    with pytest.raises(OperatorError):
        validate_plan(dataclasses.replace(plan, gemm=dataclasses.replace(plan.gemm, ukernel="asm_in_order")))
    with pytest.raises(OperatorError):
        validate_plan(dataclasses.replace(plan, gemm=dataclasses.replace(plan.gemm, ukernel="assembly")))
