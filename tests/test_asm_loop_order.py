"""Issue 12's last loop work: the depthwise asm loop's load order, the in-order conv loop's
offset read one k step ahead, and llvm-mca's steady-state cycles per iteration.

unit      interleave_row_halves (a permutation that alternates the two row halves), the koff-ahead
          K loop's instruction order, steady_state_run's arithmetic on recorded reports.
emulated  the suite's depthwise loops reach the Neoverse-N2 model's V-pipe bound (144 FMLA + 16
          stores on two V pipes = 80 cycles) in the steady state, and the koff-ahead conv loop
          keeps its planned loads. Numerics under qemu are in test_arm_asm_kernels.py.
"""
from __future__ import annotations

import shutil

import pytest

from support import needs_arm
from xfc.analysis import mca
from xfc.cpu import neon_asm
from xfc.cpu.codegen import render_cpu_kernel
from xfc.cpu.synth import synthesize_cpu
from xfc.cpu.tiles import a_load_groups
from xfc.errors import ToolchainError
from xfc.hardware import load
from xfc.ops.workloads import suite_spec

unit = pytest.mark.unit
emulated = pytest.mark.emulated
needs_mca = pytest.mark.skipif(shutil.which(mca.LLVM_MCA) is None, reason=f"{mca.LLVM_MCA} not installed")


def _loads(rows_of_each: list[int]) -> list[dict]:
    return [{"offset": 16 * k, "uses": [{"row": r, "vec": 0, "tap": 0}]} for k, r in enumerate(rows_of_each)]


@unit
def test_interleave_alternates_the_row_halves_and_keeps_every_load_once():
    loads = _loads([0, 0, 1, 2, 3, 3, 3, 2, 1])          # rows 0-1 top, 2-3 bottom (4 rows)
    out = neon_asm.interleave_row_halves(loads, 4)
    assert sorted(ld["offset"] for ld in out) == sorted(ld["offset"] for ld in loads)
    first = [min(u["row"] for u in ld["uses"]) for ld in out]
    assert first == [0, 2, 0, 3, 1, 3, 1, 3, 2]          # top, bottom, top, ... then the rest of bottom
    top = [ld["offset"] for ld in out if ld["uses"][0]["row"] < 2]
    assert top == sorted(top)                              # each half keeps its own order
    assert neon_asm.interleave_row_halves(loads, 1) == loads


@unit
def test_rendered_depthwise_loop_follows_the_interleaved_order():
    loads = _loads([0, 0, 0, 1, 1, 1])
    out = neon_asm.render_depthwise_asm(loads, 1, 2, 1, 4, 8, "none", "asm_out_of_order")
    offsets = [int(line.split("#")[-1].rstrip("]")) for line in out["lines"] if line.startswith("ldr q")]
    assert offsets == [0, 192, 64, 256, 128, 320]   # bytes: 4 x the float offsets


def _main_loop(lines: list[str]) -> list[str]:
    return lines[lines.index("1:") + 1: lines.index("b.ne 1b")]


@unit
def test_in_order_conv_loop_reads_the_next_offset_ahead():
    groups = a_load_groups("neon", 14, 64)
    loop = neon_asm.render_asm_kloop(14, 1, groups, "im2col_direct", 14, 4, "asm_in_order")
    assert loop["koff_ahead"]
    lines = loop["lines"]
    head = lines[:lines.index("cbz %[main], 2f")]
    assert head[-2:] == ["ldr %[t], [%[koff]], #8", "add %[t], %[ap], %[t], lsl #2"]   # step 0's address
    main = _main_loop(lines)
    steps = [i for i, line in enumerate(main) if "[%[bp]]" in line]   # each k step starts with its B load
    assert len(steps) == 4 and steps[0] == 0
    for a, b in zip(steps, steps[1:] + [len(main)]):
        step = main[a:b]
        offset_loads = [i for i, line in enumerate(step) if line == "ldr %[t2], [%[koff]], #8"]
        adds = [i for i, line in enumerate(step) if line == "add %[t], %[ap], %[t2], lsl #2"]
        a_loads = [i for i, line in enumerate(step) if "[%[t]" in line]
        fmas = [i for i, line in enumerate(step) if line.startswith("fmla")]
        assert len(offset_loads) == 1 and len(adds) == 1 and len(a_loads) == len(groups)
        assert fmas[0] < offset_loads[0] < adds[0]     # the offset load sits among the FMAs
        assert max(a_loads) < adds[0]                  # the next address only after this step's last A load
    assert not any(line.startswith("ldr %[t],") for line in main)   # no A address waits inside a step
    # the out-of-order loop and packed A are unchanged
    for a_pack, order in (("im2col_direct", "asm_out_of_order"), ("packed", "asm_in_order")):
        other = neon_asm.render_asm_kloop(14, 1, groups, a_pack, 14, 4, order)
        assert not other["koff_ahead"] and not any("%[t2]" in line for line in other["lines"])


def _report(cycles: int, iterations: int, n: int) -> dict:
    return {"CodeRegions": [{"Instructions": ["x"] * n,
                             "ResourcePressureView": {"ResourcePressureInfo": [
                                 {"InstructionIndex": n, "ResourceIndex": 0, "ResourceUsage": 2.0}]},
                             "SummaryView": {"BlockRThroughput": 2.0, "Iterations": iterations,
                                             "TotalCycles": cycles}}],
            "TargetInfo": {"CPUName": "cortex-a710", "Resources": ["N2UnitV0"]}}


@unit
def test_steady_state_is_the_cost_of_the_second_n_iterations():
    loop = mca.find_fma_loop("f:\n.L2:\n\tfmla\tv0.4s, v1.4s, v2.4s\n\tsubs\tx0, x0, 1\n\tb.ne\t.L2\n\tret\n")
    n = len(loop.instructions)
    run = mca.steady_state_run(_report(16029, 200, n), _report(32029, 400, n), loop)
    assert run.cycles_per_iteration == pytest.approx(80.0)
    assert run.cycles_per_iteration_with_fill == pytest.approx(80.145)
    assert run.fill_cycles == pytest.approx(29.0)
    with pytest.raises(ToolchainError):              # not a run of twice the iterations
        mca.steady_state_run(_report(16029, 200, n), _report(32029, 300, n), loop)


@emulated
@needs_arm
@needs_mca
@pytest.mark.parametrize("workload", ["dw_mbv2_s1", "dw_mbv2_s2"])
def test_suite_depthwise_loops_reach_the_v_pipe_bound(workload):
    synthesis = synthesize_cpu(suite_spec(workload), load("cortex-a710"), threads=1)
    r = mca.analyze_synthesis(synthesis)
    c = r.counts
    v_work = dict(r.pressure)["N2UnitV0"] + dict(r.pressure)["N2UnitV1"]
    assert v_work == pytest.approx(c.fma + c.stores)        # nothing but FMLA and stores on the V pipes
    assert r.cycles_per_iteration == pytest.approx(v_work / 2)   # steady state = the V-pipe bound
    assert r.fma_per_cycle == pytest.approx(2 * 9 / 10)     # 9 FMLA + 1 store per output vector
    assert r.fill_cycles > 0 and r.cycles_per_iteration_with_fill > r.cycles_per_iteration


@emulated
@needs_arm
@pytest.mark.parametrize("workload", ["conv_r18_c1", "conv_r18_l1"])
def test_in_order_conv_loop_has_one_offset_load_per_k_step(workload):
    # the implicit-GEMM loop (a 3x3 stride-1 layer would otherwise get a Winograd plan)
    plan = synthesize_cpu(suite_spec(workload), load("cortex-a55"), threads=1, lowering="direct").plan
    assert plan.gemm.a_pack == "im2col_direct" and plan.gemm.ukernel == "asm_in_order"
    source = render_cpu_kernel(plan).source
    assert "long koff[XFC_KC + 1];" in source and "koff[kc] = 0;" in source
    loop = mca.find_fma_loop(mca.compile_to_assembly(render_cpu_kernel(plan)))
    offsets = [i for i in loop.instructions if i.mnemonic == "ldr" and i.operands.startswith("x")]
    assert len(offsets) == plan.gemm.k_unroll
