"""The AVX2 / AVX-512 inline-assembly K loops (xfc/cpu/x86_asm.py).

unit: the register map and its refusals, the instruction forms and counts of the generator, the
      plans validate_plan refuses, and that synthesis chooses the loop on AVX2 hosts only.
host: hand plans force the loop onto odd tiles (MR 1..6, one to three B vectors), k remainders,
      several KC slices (the accumulate path), A packed, read in place and read from the staged
      image, fused epilogues and two threads; compiled for both ISAs everywhere, run where this CPU
      runs the ISA, and checked against numpy under the K-derived bound.
"""
from __future__ import annotations

import dataclasses

import pytest

import support
from support import RUNNABLE_ISAS, conv, host_plan, mm, run_host_plan
from xfc.cpu import decide, x86_asm
from xfc.cpu.codegen import render_cpu_kernel, validate_plan
from xfc.cpu.isa import isa_row
from xfc.cpu.plans import hand_plan
from xfc.cpu.tiles import a_load_groups
from xfc.errors import OperatorError

unit = pytest.mark.unit
host = pytest.mark.host


@unit
def test_register_map_fills_the_file_and_refuses_past_it():
    regs = x86_asm.register_map("avx2", 4, 3)           # 12 accumulators + 3 B + 1 A = 16
    assert [r for row in regs["acc"] for r in row] == list(range(12))
    assert regs["b"] == [12, 13, 14] and regs["a"] == [15]
    regs = x86_asm.register_map("avx2", 6, 2)           # 15: one register left for a second A
    assert regs["a"] == [14, 15]
    assert x86_asm.register_map("avx512", 14, 2)["a"] == [30, 31]   # 28 + 2 + 1 = 31 of 32, one spare
    with pytest.raises(ValueError):
        x86_asm.register_map("avx2", 5, 3)              # 15 + 3 + 1 = 19 > 16
    with pytest.raises(ValueError):
        x86_asm.register_map("generic", 4, 1)


@unit
@pytest.mark.parametrize("a_pack", ["packed", "direct", "im2col_direct"])
def test_the_loop_has_the_planned_instructions(a_pack):
    rows, nvec, ku = 4, 3, 4
    stride = 96 if a_pack == "direct" else 1
    loop = x86_asm.render_x86_kloop("avx2", rows, nvec, a_load_groups("avx2", rows, 128, stride), a_pack,
                                    rows if a_pack == "packed" else 1, nvec * 8, ku)
    lines = loop["lines"]
    body = lines[lines.index("1:"):lines.index("jnz 1b")]
    assert sum(ln.startswith("vfmadd231ps") for ln in body) == ku * rows * nvec
    assert sum(ln.startswith("vmovups") for ln in body) == ku * nvec
    assert sum(ln.startswith("vbroadcastss") for ln in body) == ku * rows
    assert sum(ln.startswith("movq") for ln in body) == (ku if a_pack == "im2col_direct" else 0)
    assert not any("rsp" in ln for ln in lines)
    if a_pack == "direct":   # row r of A at r x lda floats, k step u at u floats
        assert "vbroadcastss 388(%[ap]), %%ymm15" in body
    stores = [ln for ln in lines if ln.startswith("vmovups %%ymm")]
    assert stores == [f"vmovups %%ymm{r}, {32 * r}(%[acc])" for r in range(rows * nvec)]
    assert loop["clobbers"] == [f"xmm{r}" for r in range(16)] and loop["registers"] == 16


@unit
def test_plans_the_loop_cannot_spell_are_refused():
    plan = hand_plan(mm(8, 8, 8), "avx2", 1, mr=5, nr=24)        # 15 + 3 + 1 registers
    with pytest.raises(OperatorError):
        validate_plan(dataclasses.replace(plan, gemm=dataclasses.replace(plan.gemm, ukernel="asm_out_of_order")))
    plan = hand_plan(mm(8, 8, 8), "avx2", 1, mr=4, nr=16)
    with pytest.raises(OperatorError):   # the in-order order is NEON's
        validate_plan(dataclasses.replace(plan, gemm=dataclasses.replace(plan.gemm, ukernel="asm_in_order")))
    validate_plan(dataclasses.replace(plan, gemm=dataclasses.replace(plan.gemm, ukernel="asm_out_of_order")))


@unit
def test_synthesis_chooses_the_loop_on_avx2_only():
    avx2_core = support.host_description("avx2").cluster().core
    assert decide.gemm_ukernel(isa_row("avx2"), avx2_core, 16) == "asm_out_of_order"
    assert decide.gemm_ukernel(isa_row("avx2"), avx2_core, 17) == "intrinsics"
    assert decide.gemm_ukernel(isa_row("avx2"), None, 16) == "intrinsics"     # hand plans
    avx512_core = support.host_description("avx512").cluster().core
    assert decide.gemm_ukernel(isa_row("avx512"), avx512_core, 31) == "intrinsics"   # not measured yet
    assert decide.gemm_ukernel(isa_row("generic"), avx2_core, 12) == "intrinsics"


# Odd tiles, a k remainder (k % k_unroll), several KC slices, every A operand, epilogues, threads.
HAND_CASES = (
    ("mm-4x24-kc-slices", mm(29, 53, 71, bias=True, act="relu"), dict(mr=4, nr=24, kc=20)),
    ("mm-1x8", mm(3, 17, 9), dict(mr=1, nr=8, kc=9)),
    ("mm-6x16-batch-packed", mm(15, 35, 13, batch=2, bias=True), dict(mr=6, nr=16, kc=128, a_pack="packed")),
    ("mm-5x16-direct-ragged", mm(11, 19, 33, act="relu6"), dict(mr=5, nr=16, kc=16)),
    ("conv-1x1-3x24", conv(16, 7, 9, 31, 1, 1, bias=True, act="relu6"), dict(mr=3, nr=24, kc=7)),
    ("conv-t-4x16-staged", conv(6, 9, 16, 13, 3, 3, pad=1, bias=True, act="relu6"),
     dict(mr=4, nr=16, kc=23, transposed=True)),
    ("conv-t-3x16-packed", conv(5, 7, 10, 9, 3, 3, stride=2, pad=1), dict(mr=3, nr=16, kc=16, transposed=True)),
)


@host
@pytest.mark.parametrize("isa", x86_asm.DIALECTS)
@pytest.mark.parametrize("name,spec,overrides", HAND_CASES, ids=[c[0] for c in HAND_CASES])
def test_hand_plans_with_the_asm_loop_verify(name, spec, overrides, isa, tmp_path):
    lanes = 16 if isa == "avx512" else 8
    overrides = dict(overrides, nr=overrides["nr"] * lanes // 8)   # the same number of vectors
    plan = host_plan(spec, isa, 2, ukernel="asm_out_of_order", **overrides)
    assert "__asm__ volatile" in render_cpu_kernel(plan).source
    kernel, out = run_host_plan(plan, tmp_path, seed=3, what=f"{name} {isa} asm")
    assert (out is not None) == (isa in RUNNABLE_ISAS)
