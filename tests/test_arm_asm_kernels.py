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
fp16:     the same loops in .8h (A in v0-v15, overlapping A loads the planner budgets): the generator
          (unit); the suite's fp16 loops on the A76, A710 and A55 without stack traffic, and >= 1.9
          FMLA/cycle (GEMM/conv; depthwise at its 1.8 ceiling) on the llvm-mca model of the A76
          and A710; hand plans on odd tiles under qemu through the chain (emulated).
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import subprocess
import sys
from collections import Counter

import pytest

import support
from support import conv, dw, mm, needs_arm
from xfc.analysis import mca
from xfc.toolchain.cpu import build_arm
from xfc.cpu import neon_asm
from xfc.cpu.codegen import depthwise_context, render_cpu_kernel, validate_plan
from xfc.cpu.fp16 import FP16_ISA, synthesize_fp16
from xfc.cpu.isa import isa_row
from xfc.cpu.plans import hand_plan
from xfc.cpu.tiles import a_load_groups, enumerate_micro_tiles
from xfc.errors import OperatorError
from xfc.ops.dtypes import FP16, make_operands
from xfc.ops.reference import make_inputs
from xfc.cpu.synth import synthesize_cpu
from xfc.pipeline import stages
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
    """Each core checks half the suite, alternating with the core before it in ARM_CORES (so every
    workload meets in-order and out-of-order cores of each generation; the compile to assembly is
    ~0.4 s per workload and core)."""
    hw = _core_hw(core_name)
    core = hw.cluster().core
    half = ARM_CORES.index(core_name) % 2
    for workload in sorted(SUITE)[half::2]:
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


@pytest.mark.matrix(every=2)
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
    plan = hand_plan(mm(8, 8, 8), "generic", 1)   # no assembly for the generic dialect
    with pytest.raises(OperatorError):
        validate_plan(dataclasses.replace(plan, gemm=dataclasses.replace(plan.gemm, ukernel="asm_out_of_order")))
    plan = hand_plan(mm(8, 8, 8), "neon", 1, mr=14, nr=8)   # 28 + 2 + 4 registers
    with pytest.raises(OperatorError):
        validate_plan(dataclasses.replace(plan, gemm=dataclasses.replace(plan.gemm, ukernel="asm_in_order")))
    with pytest.raises(OperatorError):
        validate_plan(dataclasses.replace(plan, gemm=dataclasses.replace(plan.gemm, ukernel="assembly")))


# ---------------------------------------------------------------------------------------------
# fp16 (FMLA .8h): the same loops spelled in .8h, A in v0-v15, overlapping A loads (issue 33)
# ---------------------------------------------------------------------------------------------

FP16_CORES = ("cortex-a76", "cortex-a710", "cortex-a55")   # 2-pipe A7x, A710 (Neoverse-N2 model), in-order
_FMLA_8H_BY_ELEMENT = re.compile(r"^fmla v(\d+)\.8h, v(\d+)\.8h, v(\d+)\.h\[(\d)\]$")


@unit
@pytest.mark.parametrize("core_name", FP16_CORES)
def test_fp16_planner_budgets_the_a_registers_the_loop_spells(core_name):
    """Every fp16 micro-tile the planner may choose: its register count is the asm loop's register
    map (A groups as spelled), every row is fed by exactly one group, no load reads past row MR-1."""
    tiles = enumerate_micro_tiles(_core_hw(core_name).cluster().core, FP16_ISA)
    assert tiles
    for t in tiles:
        groups = a_load_groups(FP16_ISA, t.mr, t.a_load_bits)
        assert t.registers(FP16_ISA) == neon_asm.register_count(t.mr, t.nr_vectors, groups), t
        assert sorted(r["row"] for g in groups for r in g["rows"]) == list(range(t.mr)), t
        for g in groups:
            assert g["offset"] + g["width"] <= t.mr and g["width"] * 16 <= t.a_load_bits, (t, g)
            assert all(r["lane"] == r["row"] - g["offset"] and 0 <= r["lane"] < g["width"] for r in g["rows"])
    # MR=14 with q loads: rows 0-7 and 6-13 (lanes 2-7 feed rows 8-13), 2 registers, not 8 + 4 + 1 + 1
    assert [(g["width"], g["offset"]) for g in a_load_groups(FP16_ISA, 14, 128)] == [(8, 0), (8, 6)]
    assert [(g["width"], g["offset"]) for g in a_load_groups(FP16_ISA, 6, 128)] == [(4, 0), (4, 2)]
    assert [(g["width"], g["offset"]) for g in a_load_groups(FP16_ISA, 3, 64)] == [(1, 0), (1, 1), (1, 2)]


@unit
@pytest.mark.parametrize("mr,nvec,bits,order", [(14, 2, 128, "asm_out_of_order"), (9, 3, 128, "asm_out_of_order"),
                                                (16, 1, 64, "asm_in_order"), (3, 4, 128, "asm_in_order")])
def test_fp16_kloop_is_8h_with_a_in_v0_v15(mr, nvec, bits, order):
    groups = a_load_groups(FP16_ISA, mr, bits)
    loop = neon_asm.render_asm_kloop(mr, nvec, groups, "packed", mr, 4, order, 16, isa_row(FP16_ISA).indexed_registers)
    main = loop["lines"][loop["lines"].index("1:") + 1: loop["lines"].index("b.ne 1b")]
    fmlas = [_FMLA_8H_BY_ELEMENT.match(line) for line in main if line.startswith("fmla")]
    assert len(fmlas) == 4 * mr * nvec and all(fmlas), main
    a_regs = {int(m.group(3)) for m in fmlas}
    assert a_regs == set(range(len(groups))) and max(a_regs) < 16        # the indexed operand: v0-v15 only
    assert all(int(m.group(4)) < 8 for m in fmlas)
    assert not any(".4s" in line or ".s[" in line for line in loop["lines"])
    assert loop["registers"] == mr * nvec + nvec + len(groups) <= 32
    kind = {8: "q", 4: "d", 1: "h"}
    a_loads = [line for line in main if line.startswith(("ldr", "ldur")) and "%[ap]" in line]
    assert Counter(line.split()[1][0] for line in a_loads) == Counter(kind[g["width"]] for g in groups * 4)
    assert sum(line.endswith(f"[%[ap]], #{2 * mr}") for line in a_loads) == 4   # A: 2-byte elements


@unit
def test_fp16_depthwise_loop_is_8h_with_the_pointers_it_uses():
    # one output row, two vectors of 8; taps at element offsets 0, 1, 2 (2 and 4 bytes past a q boundary)
    loads = [{"offset": 8 * j + s, "uses": [{"row": 0, "vec": j, "tap": s}]} for j in range(2) for s in range(3)]
    out = neon_asm.render_depthwise_asm(loads, 3, 1, 2, 8, 21, "relu6", "asm_out_of_order", 16)
    lines = out["lines"]
    assert (out["x_pointers"], out["y_pointers"], out["init_type"]) == (["x2", "x4"], [], "unsigned short")
    assert "ld1r {v2.8h}, [%[w]], #2" in lines and "fmov v6.8h, #6.0" in lines
    assert all(".8h" in line for line in lines if line.startswith(("fmla", "fmax", "fmin", "dup")))
    assert "add %[x0], %[x0], #32" in lines and not any(".4s" in line for line in lines)
    # fp32 keeps every residue pointer it always bound
    fp32 = neon_asm.render_depthwise_asm(loads, 3, 1, 2, 4, 21, "relu6", "asm_out_of_order")
    assert (fp32["x_pointers"], fp32["y_pointers"]) == (["x4", "x8", "x12"], ["y4", "y8", "y12"])


def _expected_fp16_gemm_loads(plan) -> Counter:
    g = plan.gemm
    kind = {8: "q", 4: "d", 1: "h"}
    per_step = Counter({"q": math.ceil(g.nr // plan.vector_lanes / 2)})
    per_step.update(kind[grp["width"]] for grp in a_load_groups(FP16_ISA, g.mr, g.a_load_bits))
    if g.a_pack == "im2col_direct":
        per_step["x"] += 1
    return Counter({k: v * g.k_unroll for k, v in per_step.items() if v})


@emulated
@needs_arm
@pytest.mark.parametrize("core_name", FP16_CORES)
def test_fp16_suite_inner_loops_have_no_stack_traffic_and_the_planned_loads(core_name):
    """The fp16 kernels the synthesizer chooses for the suite: their inner loop is the .8h asm loop,
    with no spill, reload or register move (GCC's intrinsics spilled 12-66 q registers per A76 loop)."""
    hw = _core_hw(core_name)
    core = hw.cluster().core
    for workload in sorted(SUITE):
        plan = synthesize_fp16(suite_spec(workload), hw, threads=1).plan
        where = f"{core_name} fp16 {workload}"
        loop = mca.find_fma_loop(mca.compile_to_assembly(render_cpu_kernel(plan)))
        counts = mca.count_instructions(loop)
        assert (counts.spill_stores, counts.stack_reloads, counts.gpr_stack_accesses) == (0, 0, 0), where
        assert counts.register_moves == 0, where
        assert all(".4s" not in ins.text for ins in loop.instructions if ins.is_fma), where
        loads = Counter(dict(counts.loads_by_class))
        order = "asm_in_order" if core.pipeline == "in_order" else "asm_out_of_order"
        if plan.gemm is not None:
            g = plan.gemm
            assert g.ukernel == order, where
            assert counts.fma == g.k_unroll * g.mr * (g.nr // plan.vector_lanes), where
            assert loads == _expected_fp16_gemm_loads(plan), (where, loads)
            assert counts.stores == 0, where
        else:
            d = plan.depthwise
            assert d.ukernel == order, where
            assert counts.fma == d.oh_rows * d.ow_vectors * 9, where
            assert loads == Counter({"q": len(depthwise_context(plan)["loads"])}), (where, loads)
            assert counts.stores == d.oh_rows * d.ow_vectors, where


@emulated
@needs_arm
@pytest.mark.skipif(shutil.which(mca.LLVM_MCA) is None, reason=f"{mca.LLVM_MCA} not installed")
@pytest.mark.parametrize("core_name", ["cortex-a76", "cortex-a710"])
def test_fp16_suite_loops_reach_the_fmla_rate_on_the_2_pipe_model(core_name):
    """llvm-mca-16 (the Neoverse-N2 model for both): GEMM and conv loops >= 1.9 FMLA .8h per cycle of
    2; depthwise at its ceiling, 9 FMLA and 1 q store per output vector on the 2 V pipes = 1.8
    (docs/arm-mca.md), so >= 1.78 (stride 2 loses 0.2 cycles per 40 in the steady state)."""
    hw = _core_hw(core_name)
    for workload in sorted(SUITE):
        r = mca.analyze_synthesis(synthesize_fp16(suite_spec(workload), hw, threads=1))
        where = f"{core_name} fp16 {workload}: {r.fma_per_cycle:.3f} FMLA/cycle"
        assert r.model == "cortex-a710" and r.reliable, where
        assert (r.counts.spill_stores, r.counts.stack_reloads) == (0, 0), where
        assert r.fma_per_cycle >= (1.78 if suite_spec(workload).name == "depthwise" else 1.9), where


# Hand plans put the .8h loop on tiles the synthesizer does not pick: overlapping q loads (MR 13, 9),
# overlapping d loads (MR 6, 7 with 64-bit loads), h loads (MR 3), a k remainder, KC slices,
# transposed conv with A read from the staged image, ragged depthwise rows whose output rows start
# at every 2-byte residue (OW odd), both orders.
FP16_HAND_CASES = (
    ("mm-13x16-a128", mm(29, 35, 45, bias=True, act="relu"), dict(mr=13, nr=16, kc=20, a_load_bits=128)),
    ("mm-9x24-a128", mm(20, 50, 37), dict(mr=9, nr=24, kc=128, a_load_bits=128)),
    ("mm-7x8-a64", mm(15, 27, 9, batch=2), dict(mr=7, nr=8, kc=128, a_load_bits=64)),
    ("mm-3x32-a128", mm(5, 40, 18, act="relu6"), dict(mr=3, nr=32, kc=7, a_load_bits=128)),
    ("conv-t-14x16", conv(6, 9, 14, 19, 3, 3, pad=1, bias=True, act="relu6"),
     dict(mr=14, nr=16, kc=23, a_load_bits=128, transposed=True)),
    ("conv-t-6x8-a64", conv(5, 7, 12, 9, 3, 3, stride=2, pad=1), dict(mr=6, nr=8, kc=16, a_load_bits=64,
                                                                       transposed=True)),
    ("dw-8x1-odd", dw(3, 19, 23, 3, 3, pad=1, bias=True, act="relu6"), dict(oh_rows=8, ow_vectors=1)),
    ("dw-3x2-s2", dw(2, 15, 41, 3, 3, stride=2, pad=(1, 1, 0, 2), act="relu"), dict(oh_rows=3, ow_vectors=2)),
)


@pytest.mark.matrix(every=2)
@emulated
@needs_arm
@pytest.mark.parametrize("order", neon_asm.ASM_UKERNELS)
@pytest.mark.parametrize("name,spec,overrides", FP16_HAND_CASES, ids=[c[0] for c in FP16_HAND_CASES])
def test_fp16_hand_plans_with_the_asm_loop_verify_under_qemu(name, spec, overrides, order, tmp_path):
    plan = hand_plan(spec, FP16_ISA, 2, qemu_cpu="cortex-a76", **overrides)
    if plan.gemm is not None:
        plan = dataclasses.replace(plan, gemm=dataclasses.replace(plan.gemm, ukernel=order))
    else:
        plan = dataclasses.replace(plan, depthwise=dataclasses.replace(plan.depthwise, ukernel=order))
    built = stages.realize(plan, tmp_path)
    assert "__asm__ volatile" in built.rendered.source and ".8h" in built.rendered.source, name
    outcome = stages.verify(built, make_operands(spec, FP16, seed=5), timeout_s=900)
    assert outcome.check.ok, (name, order, outcome.check.reason)
