"""xfc.analysis.mca: the llvm-mca-16 evaluator of generated AArch64 kernels.

unit:     the assembly parser and loop extraction on hand-written snippets (rotated, nested, none,
          calls, numeric labels), spill / move / load classification, the llvm-mca JSON reader,
          the 4-pipe and A55 rescaling arithmetic, the core -> model table, and the one-line
          refusals (--mca on host / GPU: exit 2; llvm-mca-16 or the cross compiler missing: exit 3).
emulated: real kernels cross-compiled and analysed: the FMAs per loop iteration equal what the plan
          implies (MR x NR / lanes x k_unroll; depthwise rows x vectors x taps), the model table's
          claims re-measured on llvm-mca itself, `xfc synth --mca`, the tile-DB evaluator, and a
          kernel synthesized with the llvm-mca evaluator verified under qemu against numpy.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from xfc.analysis import mca
from xfc.errors import OperatorError, XfcError
from xfc.hardware import SHIPPED_ROOT, load

REPO = Path(__file__).resolve().parent.parent
unit = pytest.mark.unit
emulated = pytest.mark.emulated


def run_xfc(*args, env=None, timeout=600):
    base = {k: v for k, v in os.environ.items() if k != "XFC_DEBUG"}
    base["PYTHONPATH"] = str(REPO) + os.pathsep + base.get("PYTHONPATH", "")
    base.update(env or {})
    return subprocess.run([sys.executable, "-m", "xfc", *args], capture_output=True, text=True, timeout=timeout,
                          env=base)


def assert_one_line_error(proc, contains: str, code: int):
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("xfc: error")]
    assert len(errors) == 1, proc.stderr
    assert contains in errors[0], errors[0]


def core(name: str):
    return load(name).cluster().core


# ---------------------------------------------------------------------------------------------
# The parser on hand-written assembly.
# ---------------------------------------------------------------------------------------------

ROTATED = """\
\t.text
\t.type\tkern, %function
kern:
.LFB0:
\tmov\tx2, 0
\tb\t.L3
\t.p2align 3,,7
.L4:
\tfmla\tv0.4s, v1.4s, v2.s[0]   // accumulate
\tfmla\tv3.4s, v1.4s, v2.s[1]
\tadd\tx2, x2, 1
.L3:
\tldr\tq1, [x0], 16
\tcmp\tx2, x1
\tbne\t.L4
\tret
\t.size\tkern, .-kern
"""

NESTED = """\
outer_and_inner:
\tmov\tx3, 0
.L10:
\tmov\tx4, 0
\tldr\tq9, [x0]
.L11:
\tfmla\tv0.4s, v9.4s, v8.s[0]
\tfmla\tv1.4s, v9.4s, v8.s[1]
\tfmla\tv2.4s, v9.4s, v8.s[2]
\tadd\tx4, x4, 1
\tcmp\tx4, 8
\tb.ne\t.L11
\tfmla\tv5.4s, v9.4s, v8.s[3]
\tadd\tx3, x3, 1
\tcbnz\tx3, .L10
\tret
second:
.L20:
\tfmla\tv0.4s, v1.4s, v2.4s
\tsubs\tx5, x5, 1
\tb.ne\t.L20
.L30:
\tfmla\tv0.4s, v1.4s, v2.4s
\tfmla\tv1.4s, v1.4s, v2.4s
\tfmla\tv2.4s, v1.4s, v2.4s
\tfmla\tv3.4s, v1.4s, v2.4s
\tbl\tmemcpy
\ttbnz\tw5, 3, .L30
\tret
"""

NO_LOOP = """\
straight:
\tldr\tq0, [x0]
\tfmla\tv1.4s, v0.4s, v0.s[0]
\tcbz\tx1, .L9
\tfmla\tv2.4s, v0.4s, v0.s[1]
.L9:
\tstr\tq1, [x2]
\tret
"""


@unit
def test_rotated_loop_is_found_with_its_second_label_inside():
    loop = mca.find_fma_loop(ROTATED)
    assert (loop.function, loop.label) == ("kern", ".L4")
    assert [i.mnemonic for i in loop.instructions] == ["fmla", "fmla", "add", "ldr", "cmp", "bne"]
    assert loop.fma_count == 2
    # the llvm-mca input: head label, instructions without directives or comments, back-branch
    text = loop.mca_input()
    assert text.splitlines()[0] == ".L4:" and text.splitlines()[-1] == "\tbne\t.L4"
    assert "//" not in text and ".p2align" not in text and ".L3" not in text


@unit
def test_nested_loops_give_the_inner_loop_and_calls_disqualify_a_body():
    functions = mca.parse_functions(NESTED)
    assert [f.name for f in functions] == ["outer_and_inner", "second"]
    inner = mca.innermost_loops(functions[0])
    assert [(lp.label, lp.fma_count) for lp in inner] == [(".L11", 3)]      # the outer .L10 holds a branch
    second = mca.innermost_loops(functions[1])
    assert [(lp.label, lp.fma_count) for lp in second] == [(".L20", 1)]     # .L30's body calls memcpy
    best = mca.find_fma_loop(NESTED)
    assert (best.function, best.label, best.fma_count) == ("outer_and_inner", ".L11", 3)


@unit
def test_the_loop_with_the_most_fmas_wins_wherever_it_is():
    small = "a:\n.L1:\n\tfmla\tv0.4s, v1.4s, v2.4s\n\tsubs\tx0, x0, 1\n\tb.ne\t.L1\n\tret\n"
    big = "b:\n.L2:\n" + "".join(f"\tfmla\tv{i}.4s, v30.4s, v31.s[{i % 4}]\n" for i in range(6)) \
          + "\tbic\tx3, x3, x4\n\tbsl\tv29.16b, v28.16b, v27.16b\n\tsubs\tx0, x0, 1\n\tb.ne\t.L2\n\tret\n"
    loop = mca.find_fma_loop(small + big)
    # bic / bsl start with 'b' but are not branches: the body stays innermost
    assert (loop.function, loop.fma_count, len(loop.instructions)) == ("b", 6, 10)


@unit
def test_numeric_local_labels_of_hand_written_kernels():
    asm = "k:\n1:\n\tldr\tq0, [x1], 16\n\tfmla\tv8.4s, v0.4s, v1.s[0]\n\tfmla\tv9.4s, v0.4s, v1.s[1]\n" \
          "\tsubs\tx0, x0, 1\n\tb.hs\t1b\n2:\n\tfmla\tv8.4s, v0.4s, v1.s[0]\n\tb\t3f\n3:\n\tret\n"
    loop = mca.find_fma_loop(asm)
    assert (loop.label, loop.fma_count) == ("1", 2)
    # llvm-mca does not resolve '1b' (it drops the branch with an error): the head gets a name
    text = loop.mca_input().splitlines()
    assert text[0] == ".Lxfc_loop_1:" and text[-1] == "\tb.hs\t.Lxfc_loop_1" and len(text) == 6


@unit
def test_no_loop_is_one_line_error():
    with pytest.raises(XfcError) as info:
        mca.find_fma_loop(NO_LOOP)
    assert "no innermost loop with FMA" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(XfcError):   # a loop without FMAs is not an FMA loop either
        mca.find_fma_loop("f:\n.L1:\n\tadd\tx0, x0, 1\n\tcmp\tx0, 9\n\tbne\t.L1\n\tret\n")


SPILLY = """\
f:
.L7:
\tldp\tq2, q1, [x1]
\tldr\ts30, [x5], 8
\tldp\ts31, s17, [x6, 48]
\tstr\ts17, [sp, 160]
\tstp\tq24, q5, [sp, 160]
\tldr\tq4, [sp, 176]
\tldp\td1, d2, [sp]
\tstr\tx9, [sp, 8]
\tldr\tx15, [x2], 8
\tld1\t{v3.4s, v4.4s}, [x7], 32
\tfmla\tv4.4s, v8.4s, v28.s[3]
\tfmadd\ts1, s2, s3, s1
\tmov\tv0.16b, v26.16b
\tfmov\ts13, s0
\tmov\tx1, x2
\tmovi\tv7.4s, 0
\tmov\tv6.s[1], v5.s[0]
\tstr\tq6, [x0, 32]
\tadd\tx1, x1, 128
\tcmp\tx1, x3
\tbls\t.L7
"""


@unit
def test_spills_moves_and_loads_are_classified():
    loop = mca.find_fma_loop(SPILLY)
    c = mca.count_instructions(loop)
    assert c.instructions == 21 and c.fma == 2 and c.overhead == 19
    assert c.spill_stores == 2                  # str s17 and stp q24, q5 to [sp ...]
    assert c.stack_reloads == 2                 # ldr q4 and ldp d1, d2 from [sp ...]
    assert c.gpr_stack_accesses == 1            # str x9, [sp, 8] is not an FP/SIMD spill
    assert c.loads == 7 and c.stores == 4
    assert dict(c.loads_by_class) == {"q": 3, "s": 2, "d": 1, "x": 1}
    assert c.register_moves == 3                # mov v.16b, fmov s, mov v.s[1] (not mov x, not movi)
    assert dict(c.other) == {"mov": 3, "fmov": 1, "movi": 1, "add": 1, "cmp": 1, "bls": 1}
    assert c.loads + c.stores + sum(n for _, n in c.other) == c.overhead


# ---------------------------------------------------------------------------------------------
# The llvm-mca report and the rescaling arithmetic.
# ---------------------------------------------------------------------------------------------

def recorded_report(loop: mca.AsmLoop, v_pressure: float, load_pressure: float, cycles: int) -> dict:
    """A report shaped like llvm-mca-16 -json (only the fields xfc reads), for a loop."""
    resources = ["N2UnitB.\x00", "N2UnitB.\x01", "N2UnitL01.\x00", "N2UnitL01.\x01", "N2UnitV0", "N2UnitV1"]
    info = []
    for i, ins in enumerate(loop.instructions):
        if ins.is_fma:
            info += [{"InstructionIndex": i, "ResourceIndex": 4, "ResourceUsage": 0.5},
                     {"InstructionIndex": i, "ResourceIndex": 5, "ResourceUsage": 0.5}]
    n = len(loop.instructions)
    info += [{"InstructionIndex": n, "ResourceIndex": 0, "ResourceUsage": 0.5},
             {"InstructionIndex": n, "ResourceIndex": 2, "ResourceUsage": load_pressure},
             {"InstructionIndex": n, "ResourceIndex": 3, "ResourceUsage": load_pressure - 0.01},
             {"InstructionIndex": n, "ResourceIndex": 4, "ResourceUsage": v_pressure},
             {"InstructionIndex": n, "ResourceIndex": 5, "ResourceUsage": v_pressure}]
    return {"CodeRegions": [{"Instructions": [i.text for i in loop.instructions],
                             "ResourcePressureView": {"ResourcePressureInfo": info},
                             "SummaryView": {"BlockRThroughput": v_pressure, "Iterations": 200,
                                             "TotalCycles": cycles}}],
            "TargetInfo": {"CPUName": "cortex-a710", "Resources": resources}}


def gemm_like_loop(accumulators: int, k_steps: int, extra_v_ops: int = 0) -> mca.AsmLoop:
    lines = ["g:", ".L5:"]
    for k in range(k_steps):
        lines.append(f"\tldr\tq31, [x1, {16 * k}]")
        lines += [f"\tfmla\tv{a}.4s, v31.4s, v30.s[{a % 4}]" for a in range(accumulators)]
    lines += [f"\tstr\tq{a}, [sp, {16 * a}]" for a in range(extra_v_ops)]
    lines += ["\tsubs\tx0, x0, 1", "\tb.ne\t.L5", "\tret"]
    return mca.find_fma_loop("\n".join(lines) + "\n")


@unit
def test_the_json_total_row_gives_pressure_and_fma_units():
    loop = gemm_like_loop(26, 4)
    run = mca.parse_mca_json(recorded_report(loop, 56.0, 15.5, 11210), loop)
    assert run.cycles_per_iteration == pytest.approx(56.05)
    assert dict(run.pressure) == {"N2UnitB.0": 0.5, "N2UnitL01.0": 15.5, "N2UnitL01.1": 15.49,
                                  "N2UnitV0": 56.0, "N2UnitV1": 56.0}
    assert run.fma_resources == ("N2UnitV0", "N2UnitV1")
    with pytest.raises(XfcError):   # a report of some other loop is refused
        mca.parse_mca_json(recorded_report(gemm_like_loop(4, 1), 2.0, 1.0, 400), loop)


@unit
def test_four_pipe_rescaling_arithmetic():
    # 104 FMAs and 8 spill stores on a 2-pipe model: V work 2 x 56 = 112 pipe-cycles.
    loop = gemm_like_loop(26, 4, extra_v_ops=8)
    run = mca.parse_mca_json(recorded_report(loop, 56.0, 15.5, 11210), loop)
    counts = mca.count_instructions(loop)
    x3 = core("cortex-x3")
    cycles, work, text = mca._rescale(run, loop, counts, mca.MODELS["cortex-x3"], x3)
    assert work == pytest.approx(112.0)
    assert cycles == pytest.approx(28.0)               # max(112 / 4, 15.5 busiest other unit, 4 x 4 chain)
    assert "/ 4 pipes = 28.00" in text and "104 / 28.00 = 3.71 FMA/cycle" in text
    # a loop whose accumulators carry long chains is bound by latency instead
    chained = gemm_like_loop(2, 16)                     # 2 accumulators, 16 FMAs each per iteration
    run = mca.parse_mca_json(recorded_report(chained, 16.0, 8.0, 13000), chained)
    cycles, _, text = mca._rescale(run, chained, mca.count_instructions(chained), mca.MODELS["cortex-x1"],
                                   core("cortex-x1"))
    assert cycles == pytest.approx(16 * x3.fma_latency_cycles) and "chain 16 x 4 = 64" in text
    # scale 1: nothing to rescale
    assert mca._rescale(run, chained, counts, mca.MODELS["cortex-a710"], core("cortex-a710"))[0] is None


@unit
def test_a55_correction_never_speeds_the_model_up():
    loop = gemm_like_loop(16, 4)                        # 64 FMAs
    a55 = core("cortex-a55")
    model = mca.MODELS["cortex-a55"]
    # the A55 model with 2 FMA units at 32 cycles each: corrected to 64 FMAs on 1 pipe
    report = recorded_report(loop, 32.0, 10.0, 200 * 40)
    report["TargetInfo"]["Resources"][4:6] = ["CortexA55UnitFPMAC.\x00", "CortexA55UnitFPMAC.\x01"]
    run = mca.parse_mca_json(report, loop)
    cycles, _, text = mca._rescale(run, loop, mca.count_instructions(loop), model, a55)
    assert cycles == pytest.approx(64.0) and "corrected 64.00" in text
    slow = recorded_report(loop, 32.0, 10.0, 200 * 89)   # the model already slower than 1 pipe: kept
    slow["TargetInfo"]["Resources"][4:6] = ["CortexA55UnitFPMAC.\x00", "CortexA55UnitFPMAC.\x01"]
    run = mca.parse_mca_json(slow, loop)
    assert mca._rescale(run, loop, mca.count_instructions(loop), model, a55)[0] == pytest.approx(89.0)


# ---------------------------------------------------------------------------------------------
# The core -> model table.
# ---------------------------------------------------------------------------------------------

SHIPPED_CORES = sorted(p.stem for p in (SHIPPED_ROOT / "cpu").glob("*.yaml"))


@unit
def test_every_shipped_core_has_a_model_consistent_with_its_description():
    assert sorted(mca.MODELS) == SHIPPED_CORES
    for name in SHIPPED_CORES:
        c, m = core(name), mca.MODELS[name]
        assert m.pipes_scale == pytest.approx(c.fma_per_cycle / m.model_fma_per_cycle), name
        # unreliable: the in-order models (the A55 model has twice the pipes of A55/A510; the A53
        # model falls far short of its own FMA rate, see the model-claims test)
        assert m.reliable == (c.pipeline == "out_of_order"), name
        assert mca.model_for(c) is m
    assert {n for n, m in mca.MODELS.items() if m.pipes_scale == 2} == {"cortex-x1", "cortex-x2", "cortex-x3"}
    assert mca.MODELS["cortex-a55"].reliable is False and "2 q-form FMLA" in mca.MODELS["cortex-a55"].why


@unit
def test_docs_carry_the_model_table():
    text = (REPO / "docs" / "arm-mca.md").read_text()
    begin, end = "<!-- mca-models:begin -->", "<!-- mca-models:end -->"
    block = text[text.index(begin) + len(begin):text.index(end)].strip()
    assert block == mca.models_markdown(), "regenerate the table in docs/arm-mca.md from xfc.analysis.mca.models_markdown()"


@unit
def test_a_core_outside_the_table_gets_its_class_default():
    mine = dataclasses.replace(core("cortex-x3"), name="my-x9", fma_per_cycle=6)
    m = mca.model_for(mine)
    assert m.mcpu == "cortex-a710" and m.pipes_scale == 3 and m.reliable and "not in the model table" in m.why
    little = dataclasses.replace(core("cortex-a55"), name="my-little")
    assert mca.model_for(little).reliable is False
    with pytest.raises(OperatorError):
        mca.model_for(load("host").cluster().core)


# ---------------------------------------------------------------------------------------------
# One-line refusals.
# ---------------------------------------------------------------------------------------------

@pytest.mark.subprocess
def test_mca_on_host_or_gpu_is_exit_2_one_line(tmp_path):
    out = tmp_path / "o"
    assert_one_line_error(run_xfc("synth", "matmul", "--hw", "host", "--shape", "m=8,n=8,k=8", "--mca",
                                  "-o", str(out)), "--mca", 2)
    assert_one_line_error(run_xfc("synth", "matmul", "--hw", "snapdragon-8-gen-2", "--target", "gpu", "--shape",
                                  "m=8,n=8,k=8", "--mca", "-o", str(out)), "--target gpu", 2)
    assert not out.exists()


@pytest.mark.subprocess
def test_missing_llvm_mca_or_cross_compiler_is_exit_3_one_line(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    out = tmp_path / "o"
    proc = run_xfc("synth", "matmul", "--hw", "cortex-a710", "--shape", "m=8,n=8,k=8", "--mca", "-o", str(out),
                   env={"PATH": str(empty)})
    assert_one_line_error(proc, "llvm-mca-16", 3)
    assert "llvm-16" in proc.stderr
    proc = run_xfc("tiledb", "build", "--hw", "cortex-a710", "--evaluators", "llvm-mca", "--db",
                   str(tmp_path / "t.sqlite"), env={"PATH": str(empty)})
    assert_one_line_error(proc, "llvm-16", 3)
    tool = shutil.which(mca.LLVM_MCA)
    if tool is None:
        pytest.skip("llvm-mca-16 is not installed")
    (empty / mca.LLVM_MCA).symlink_to(tool)     # llvm-mca present, the cross compiler absent
    proc = run_xfc("synth", "matmul", "--hw", "cortex-a710", "--shape", "m=8,n=8,k=8", "--mca", "-o", str(out),
                   env={"PATH": str(empty)})
    assert_one_line_error(proc, "aarch64-linux-gnu-gcc", 3)
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# Real kernels (cross-compiled, analysed by llvm-mca-16).
# ---------------------------------------------------------------------------------------------

def synthesized(core_name: str, op: str, shape: dict, **options):
    from xfc.ops import make_spec
    from xfc.cpu.synth import synthesize_cpu
    return synthesize_cpu(make_spec(op, shape, **options), load(core_name), threads=1)


@emulated
@pytest.mark.parametrize("core_name,op,shape,options", [
    ("cortex-a710", "matmul", dict(m=512, n=512, k=512), {}),
    ("cortex-a55", "matmul", dict(m=130, n=70, k=99), {}),
    ("cortex-x3", "conv2d", dict(c=64, h=56, w=56, k=64, r=3, s=3), dict(pad=1)),
    # a Winograd plan: its transforms have FMA loops too (77 FMAs in one on the A55, more than the
    # micro-kernel's 64); the figure is its GEMM stage's micro-kernel
    ("cortex-a55", "conv2d", dict(c=64, h=56, w=56, k=64, r=3, s=3), dict(pad=1)),
])
def test_gemm_loop_figures_are_plausible(core_name, op, shape, options):
    s = synthesized(core_name, op, shape, **options)
    g, lanes = s.plan.gemm, s.plan.vector_lanes
    r = mca.analyze_synthesis(s)
    winograd = s.plan.lowering == "winograd"
    assert ("GEMM stage of the Winograd" in r.scope) == winograd and (r.scope in "\n".join(r.summary_lines()))
    assert ("scope" in r.as_dict()) == winograd
    # the K loop of the full-size micro-kernel: MR x NR / lanes FMAs per k step, k_unroll steps
    assert r.counts.fma == g.mr * (g.nr // lanes) * g.k_unroll
    model = mca.MODELS[core_name]
    assert r.model == model.mcpu and r.source == f"llvm-mca:{model.mcpu}"
    # cannot beat the model's FMA pipes, cannot be slower than issuing every instruction alone
    assert r.counts.fma / model.model_fma_per_cycle <= r.cycles_per_iteration + 0.01
    assert r.cycles_per_iteration <= 4 * r.counts.instructions
    assert 0 < r.fma_per_cycle <= model.model_fma_per_cycle + 1e-9
    assert r.pipe_share == pytest.approx(r.fma_per_cycle / s.cluster.core.fma_per_cycle)
    assert r.counts.instructions > r.counts.fma and r.counts.loads >= 1
    assert r.bottleneck in dict(r.pressure) and r.bottleneck_cycles == max(p for _, p in r.pressure)
    assert set(r.fma_resources) <= set(dict(r.pressure))
    if model.pipes_scale > 1:
        assert r.fma_per_cycle < r.scaled_fma_per_cycle <= s.cluster.core.fma_per_cycle + 1e-9
        assert f"/ {s.cluster.core.fma_per_cycle:g} pipes" in r.scaled_arithmetic
    elif model.pipes_scale < 1:
        assert not r.reliable and r.scaled_cycles_per_iteration >= r.cycles_per_iteration
        assert r.estimate_pipe_share <= 1 + 1e-9
    else:
        assert r.scaled_cycles_per_iteration is None and r.estimate_pipe_share == r.pipe_share
    assert "spill" in " ".join(r.summary_lines())


@emulated
def test_depthwise_loop_is_the_column_block_loop():
    s = synthesized("cortex-a710", "depthwise", dict(c=144, h=56, w=56, r=3, s=3), pad=1)
    d = s.plan.depthwise
    r = mca.analyze_synthesis(s)
    assert r.counts.fma == d.oh_rows * d.ow_vectors * 3 * 3   # one block of one channel: rows x vectors x taps
    assert 0 < r.fma_per_cycle <= 2 and r.bottleneck.startswith("N2Unit")
    assert r.counts.loads >= d.ow_vectors   # at least the input vectors are loaded


@emulated
def test_model_table_claims_hold_for_this_llvm_mca():
    """Each entry's -mcpu selects the scheduling model it names, at the q-form FMLA rate it names;
    and the proxies are needed: LLVM 16 maps A76/A77/A78/X1 to the 1-FMLA/cycle A57 model."""
    prefixes = {"A53Unit": "CortexA53Model", "CortexA55Unit": "CortexA55Model", "A57Unit": "CortexA57Model",
                "N2Unit": "NeoverseN2Model"}
    probe = "p:\n.L1:\n" + "".join(f"\tfmla\tv{i}.4s, v30.4s, v31.s[{i % 4}]\n" for i in range(24)) \
            + "\tsubs\tx0, x0, 1\n\tb.ne\t.L1\n\tret\n"

    def model_of(mcpu):
        report = mca.run_llvm_mca(mca.find_fma_loop(probe).mca_input(), mcpu, 10)
        names = {r.split(".")[0] for r in report["TargetInfo"]["Resources"]}
        found = {m for p, m in prefixes.items() if any(n.startswith(p) for n in names)}
        assert len(found) == 1, (mcpu, names)
        fmla = report["CodeRegions"][0]["InstructionInfoView"]["InstructionList"][0]
        return found.pop(), 1 / fmla["RThroughput"]

    for name, m in mca.MODELS.items():
        assert model_of(m.mcpu) == (m.scheduling_model, m.model_fma_per_cycle), name
    # the A53 model's own rate on 24 independent FMLAs: well short of its 1 per cycle (hence unreliable)
    a53 = mca.run_llvm_mca(mca.find_fma_loop(probe).mca_input(), "cortex-a53", 200)["CodeRegions"][0]
    assert 24 / (a53["SummaryView"]["TotalCycles"] / 200) < 0.8
    assert a53["InstructionInfoView"]["InstructionList"][0]["Latency"] == 10
    for own in ("cortex-a75", "cortex-a76", "cortex-a77", "cortex-a78", "cortex-x1"):
        assert model_of(own) == ("CortexA57Model", 1), own
    assert model_of("cortex-a510")[0] == "CortexA55Model"
    assert model_of("cortex-x3")[0] == model_of("cortex-a715")[0] == "NeoverseN2Model"


@emulated
def test_synth_mca_reports_and_keeps_the_loop(tmp_path):
    out = tmp_path / "k"
    proc = run_xfc("synth", "matmul", "--hw", "cortex-a76", "--shape", "m=61,n=45,k=37", "--threads", "1",
                   "--mca", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "llvm-mca (cortex-a710" in proc.stdout and "FMA/cycle" in proc.stdout and "spills" in proc.stdout
    report = json.loads((out / "report.json").read_text())
    m = report["mca"]
    g = report["tiles"]
    assert m["fma_per_iteration"] == g["mr"] * g["nr"] // 4 * g["k_unroll"]
    assert m["source"] == "llvm-mca:cortex-a710" and m["core"] == "cortex-a76" and m["reliable"] is True
    assert m["pipe_share"] == pytest.approx(m["fma_per_cycle"] / 2, abs=1e-3)
    assert (out / "mca_loop.s").read_text() == mca.find_fma_loop((out / "mca_loop.s").read_text()).mca_input()


@emulated
def test_llvm_mca_evaluator_in_synthesis_and_the_kernel_verifies_under_qemu(tmp_path):
    from support import qemu_run
    from xfc.toolchain.cpu import build_arm
    from xfc.cpu.codegen import render_cpu_kernel
    from xfc.ops import check_output, make_inputs, make_spec
    from xfc.cpu.synth import synthesize_cpu
    from xfc.tiledb.evaluators import McaMicroKernelEvaluator
    hw = load("cortex-a710")
    ev = McaMicroKernelEvaluator()
    spec = make_spec("matmul", dict(m=37, n=29, k=45), bias=True, activation="relu")
    s = synthesize_cpu(spec, hw, threads=1, evaluator=ev)
    assert s.micro_tile_source == "llvm-mca:cortex-a710"
    assert "llvm-mca:cortex-a710" in s.explain()
    compiled = ev.compiles
    assert compiled >= 20                                  # every tile that fits was analysed once
    again = synthesize_cpu(make_spec("matmul", dict(m=64, n=40, k=19)), hw, threads=1, evaluator=ev)
    assert ev.compiles == compiled and again.micro_tile_source == "llvm-mca:cortex-a710"   # cached
    binary = build_arm(render_cpu_kernel(s.plan), tmp_path)
    a, b, bias = make_inputs(spec, 3)
    out = qemu_run(binary, spec, a, b, bias, qemu_cpu=s.plan.qemu_cpu).output
    verdict = check_output(spec, out, a, b, bias)
    assert verdict.ok, verdict.reason
    ref = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0)
    assert np.max(np.abs(out - ref)) < 1e-3


@emulated
def test_tiledb_build_with_llvm_mca_names_the_model_per_cluster(tmp_path):
    db = tmp_path / "t.sqlite"
    proc = run_xfc("tiledb", "build", "--hw", "snapdragon-8-gen-2", "--evaluators", "llvm-mca", "--tiles", "8x12",
                   "--db", str(db), "--quiet")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(run_xfc("tiledb", "show", "--db", str(db), "--json").stdout)
    hw = load("snapdragon-8-gen-2")
    from xfc.tiledb.fingerprint import fingerprint
    by_fp = {fingerprint(hw, c): c for c in hw.clusters}
    assert len(rows) == 2 * len(hw.clusters)               # 8x12 with 64- and 128-bit A loads per cluster
    for row in rows:
        cluster = by_fp[row["fingerprint"]]
        model = mca.MODELS[cluster.core.name]
        assert row["source"] == model.source and row["origin"] == "" and row["emulated"] is False
        cond = json.loads(row["conditions"])
        assert "static estimate" in cond["what"] and cond["mcpu"] == model.mcpu
        assert cond["scheduling_model"] == model.scheduling_model and cond["reliable"] == model.reliable
        assert cond["fma_per_iteration"] == 8 * 3 * cond["k_steps_per_iteration"]
        assert row["cycles_per_k"] == pytest.approx(cond["cycles_per_iteration"] / cond["k_steps_per_iteration"])
        assert row["compiler"].startswith("aarch64-linux-gnu-gcc")
    sources = {r["source"] for r in rows}
    assert sources == {"llvm-mca:cortex-a710", "llvm-mca:cortex-a55"}   # X3 and A715; A510
    again = run_xfc("tiledb", "build", "--hw", "snapdragon-8-gen-2", "--evaluators", "llvm-mca", "--tiles", "8x12",
                    "--db", str(db), "--quiet")
    assert again.returncode == 0 and "0 evaluated" in again.stdout
