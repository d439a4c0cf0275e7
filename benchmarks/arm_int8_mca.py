#!/usr/bin/env python3
"""ARM int8 static benchmark (issue 13): llvm-mca-16 on the inner dot-product loop of the ARM int8
kernels (xfc/cpu/int8_arm.py), the int8 companion of benchmarks/arm_mca.py.

    .venv/bin/python benchmarks/arm_int8_mca.py        # Cortex-A55 and A76 (sdot), A715 and A510 (smmla)
    .venv/bin/python benchmarks/arm_int8_mca.py --depthwise   # the 'channels' depthwise loop, MobileNetV2 shapes

For each core and suite GEMM/conv workload the int8 plan (threads=1) is rendered, compiled with xfc's
ARM build flags plus -S (xfc.analysis.mca.compile_to_assembly), and the innermost loop holding the most
sdot/smmla instructions is run through llvm-mca-16 with the core's model (xfc.analysis.mca.model_for) for N
and 2N iterations; cycles per iteration are the steady state (cycles(2N) - cycles(N)) / N. Reported
beside the planner's issue-model cycles per k group, so the two estimates can be compared. Static
analysis: no timing, deterministic. The model caveats of xfc.analysis.mca.MODELS apply (no A76 model in
LLVM 16: the A710-class Neoverse-N2 model is the proxy; the A55 model does not capture the 128-bit
load blocking the in-order variant is built around).

Results: a table on stdout and benchmarks/results/arm_int8_mca.json (atomic, xfc-owned).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import machine_facts  # noqa: E402
from xfc.analysis import mca  # noqa: E402
from xfc.cpu.int8_arm import plan_arm_int8  # noqa: E402
from xfc.cpu.int8_codegen import render_int8_kernel  # noqa: E402
from xfc.cpu.int8_synth import plan_int8  # noqa: E402
from xfc.hardware import load  # noqa: E402
from xfc.ops.quant import QuantParams  # noqa: E402
from xfc.ops.spec import make_spec  # noqa: E402
from xfc.ops.workloads import MOBILENETV2_DEPTHWISE, suite_spec  # noqa: E402
from xfc.outputs import write_json_result  # noqa: E402

DEFAULT_OUT = REPO / "benchmarks" / "results" / "arm_int8_mca.json"
CORES = ("cortex-a55", "cortex-a76", "cortex-a715", "cortex-a510")
WORKLOADS = ("mm_512", "conv_r18_l1")
SPLIT_ROWS = (("cortex-a55", "mm_512"),)     # the split-load variant, for the record (not chosen by the planner)
DOT_MNEMONICS = {"sdot": 32, "smmla": 64}     # int8 ops (multiply + add) per 128-bit instruction
# --depthwise: MobileNetV2's depthwise layers in the 'channels' layout (16 channels in the lanes, sdot
# on quads of adjacent taps): its loop over a row's output pixels, per 16 outputs of one pixel
DEPTHWISE = {name: (shape, kw) for name, (_op, shape, kw) in MOBILENETV2_DEPTHWISE.items()
             if name in ("dw_mbv2_c960_7_s1", "dw_mbv2_c576_14_s2", "dw_mbv2_c384_14_s1", "dw_mbv2_c144_56_s1")}


def dot_loop(asm: str) -> tuple[mca.AsmLoop, str, int]:
    """The innermost loop with the most sdot/smmla instructions: (loop, mnemonic, count)."""
    best = None
    for function in mca.parse_functions(asm):
        for loop in mca.innermost_loops(function):
            for name in DOT_MNEMONICS:
                n = sum(i.mnemonic == name for i in loop.instructions)
                if n and (best is None or n > best[2]):
                    best = (loop, name, n)
    if best is None:
        raise SystemExit("arm_int8_mca: no innermost loop with sdot/smmla instructions")
    return best


def steady_cycles(loop, model) -> float:
    """Cycles per iteration of a loop in llvm-mca's steady state: (cycles(2N) - cycles(N)) / N."""
    n = mca.MCA_ITERATIONS
    cycles = [mca.run_llvm_mca(loop.mca_input(), model.mcpu, it)["CodeRegions"][0]["SummaryView"]["TotalCycles"]
              for it in (n, 2 * n)]
    return (cycles[1] - cycles[0]) / n


def measure(core_name: str, workload: str, split_loads: bool = False) -> dict:
    hw = load(core_name)
    core = hw.cluster().core
    plan = plan_int8(suite_spec(workload), QuantParams(), hw, threads=1)
    if split_loads:   # the forced-only split-load variant of the same tile (xfc/cpu/int8_arm.py)
        plan = plan_arm_int8(suite_spec(workload), QuantParams(), hw, threads=1, force_tile=(plan.mr, plan.nv),
                             force_split_loads=True)
    rendered = render_int8_kernel(plan)
    loop, mnemonic, dots = dot_loop(mca.compile_to_assembly(rendered))
    model = mca.model_for(core)
    per_iteration = steady_cycles(loop, model)
    groups = dots / (plan.mr * plan.nv if mnemonic == "sdot" else plan.mr // 2 * plan.nv)  # k groups per iteration
    counts = mca.count_instructions(loop)
    return {"core": core_name, "workload": workload, "instruction": mnemonic, "tile": f"{plan.mr}x{plan.nr}",
            "k_depth": plan.k_depth, "split_loads": plan.split_loads, "model": model.mcpu,
            "scheduling_model": model.scheduling_model, "reliable_for_fp32": model.reliable,
            "instructions_per_iteration": len(loop.instructions), "dot_instructions_per_iteration": dots,
            "k_groups_per_iteration": groups, "cycles_per_iteration": round(per_iteration, 3),
            "dot_per_cycle": round(dots / per_iteration, 3),
            "int8_ops_per_cycle": round(dots * DOT_MNEMONICS[mnemonic] / per_iteration, 2),
            "issue_model_cycles_per_group": round(plan.ops_per_cycle and
                                                  2 * plan.mr * plan.nr * plan.k_depth / plan.ops_per_cycle, 3),
            "issue_model_ops_per_cycle": round(plan.ops_per_cycle, 2),
            "mca_cycles_per_group": round(per_iteration / groups, 3),
            "loads_by_class": dict(counts.loads_by_class), "spill_stores": counts.spill_stores,
            "stack_reloads": counts.stack_reloads, "other_instructions": dict(counts.other)}


def plane_mac_loop(spec, hw, model):
    """The 'plane' layout's (the one before) hottest loop on the same layer: the innermost loop with
    the most smlal/smlal2 (int16 x int16 into 4 int32 lanes each), its cycles per 16 outputs' taps
    (lane MACs per iteration / taps per output); its requantization and staging not included. None
    when no such loop is left (a row short enough to be unrolled)."""
    plan = plan_int8(spec, QuantParams(a_zero_point=128, out_zero_point=128), hw, threads=1, force_layout="plane")
    best = None
    for function in mca.parse_functions(mca.compile_to_assembly(render_int8_kernel(plan))):
        for loop in mca.innermost_loops(function):
            macs = sum(i.mnemonic in ("smlal", "smlal2") for i in loop.instructions)
            if macs and (best is None or macs > best[1]):
                best = (loop, macs)
    if best is None:
        return None
    loop, macs = best
    outputs = macs * 4 / (spec.r * spec.s)
    return round(steady_cycles(loop, model) / outputs * 16, 2)


def measure_depthwise(core_name: str, workload: str) -> dict:
    """The 'channels' depthwise kernel's sdot loop (a row's output pixels): cycles per iteration, and
    per 16 outputs of one pixel against the issue ceiling (R x ceil(S/4) x 4 sdot at the FMA rate)."""
    hw = load(core_name)
    core = hw.cluster().core
    shape, kw = DEPTHWISE[workload]
    spec = make_spec("depthwise", shape, bias=True, activation="relu6", **kw)
    plan = plan_int8(spec, QuantParams(a_zero_point=128, out_zero_point=128), hw, threads=1, force_layout="channels")
    loop, mnemonic, dots = dot_loop(mca.compile_to_assembly(render_int8_kernel(plan)))
    model = mca.model_for(core)
    per_iteration = steady_cycles(loop, model)
    per_pixel = spec.r * -(-spec.s // 4) * 4          # sdot per 16 outputs of one pixel
    pixels = dots / per_pixel
    counts = mca.count_instructions(loop)
    ops = 2 * spec.r * spec.s * 16 * pixels
    plane = plane_mac_loop(spec, hw, model)
    return {"core": core_name, "workload": workload, "layout": plan.depthwise_layout, "instruction": mnemonic,
            "plane_mac_loop_cycles_per_16_outputs": plane,
            "pixels_per_block": plan.nv, "model": model.mcpu, "scheduling_model": model.scheduling_model,
            "instructions_per_iteration": len(loop.instructions), "sdot_per_iteration": dots,
            "pixels_per_iteration": pixels, "cycles_per_iteration": round(per_iteration, 2),
            "cycles_per_16_outputs": round(per_iteration / pixels, 2),
            "issue_ceiling_cycles_per_16_outputs": round(per_pixel / core.fma_per_cycle, 2),
            "sdot_per_cycle": round(dots / per_iteration, 3),
            "int8_ops_per_cycle": round(ops / per_iteration, 1),
            "spill_stores": counts.spill_stores, "stack_reloads": counts.stack_reloads}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cores", default=",".join(CORES))
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--depthwise", action="store_true",
                    help="MobileNetV2 depthwise layers in the channels layout instead of the GEMM workloads")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    mca.require_tools()
    if args.depthwise:
        rows = [measure_depthwise(c, w) for c in args.cores.split(",") for w in DEPTHWISE]
        print(f"{'core':12s} {'workload':20s} {'px/blk':>6s} {'cyc/16 out':>10s} {'ceiling':>7s} {'sdot/cyc':>8s} "
              f"{'ops/cyc':>7s} {'spills':>6s} {'plane MACs only':>15s}")
        for r in rows:
            plane = r["plane_mac_loop_cycles_per_16_outputs"]
            print(f"{r['core']:12s} {r['workload']:20s} {r['pixels_per_block']:6d} {r['cycles_per_16_outputs']:10.2f} "
                  f"{r['issue_ceiling_cycles_per_16_outputs']:7.2f} {r['sdot_per_cycle']:8.2f} "
                  f"{r['int8_ops_per_cycle']:7.1f} {r['spill_stores']:>3}/{r['stack_reloads']:<2} "
                  f"{'-' if plane is None else f'{plane:.2f}':>15s}")
        out = args.out if args.out != DEFAULT_OUT else DEFAULT_OUT.with_name("arm_int8_dw_mca.json")
        write_json_result(out, {
            "what": "llvm-mca-16 static analysis of the ARM int8 'channels' depthwise kernel's sdot loop (a row's "
                    "output pixels, requantization included; the transposes and quad building around it not), beside "
                    "the 'plane' layout's hottest multiply-accumulate loop (its requantization and staging not "
                    "included); estimates, not timings; deterministic",
            "machine": {**machine_facts(), "note": "the machine that compiled and analysed the loops"},
            "compiler": mca.compiler_version(), "llvm_mca": mca.llvm_mca_version(), "rows": rows,
            "command": "benchmarks/arm_int8_mca.py " + " ".join(argv if argv is not None else sys.argv[1:])},
            kind="arm_int8_mca")
        print(f"results in {out}")
        return 0
    rows = [measure(c, w) for c in args.cores.split(",") for w in args.only.split(",")]
    rows += [measure(c, w, split_loads=True) for c, w in SPLIT_ROWS]
    print(f"{'core':12s} {'workload':12s} {'instr':5s} {'tile':6s} {'split':5s} {'mca cyc/grp':>11s} "
          f"{'model cyc/grp':>13s} {'mca ops/cyc':>11s} {'model ops/cyc':>13s} spills")
    for r in rows:
        print(f"{r['core']:12s} {r['workload']:12s} {r['instruction']:5s} {r['tile']:6s} {str(r['split_loads']):5s} "
              f"{r['mca_cycles_per_group']:11.2f} {r['issue_model_cycles_per_group']:13.2f} "
              f"{r['int8_ops_per_cycle']:11.1f} {r['issue_model_ops_per_cycle']:13.1f} "
              f"{r['spill_stores']}/{r['stack_reloads']}")
    write_json_result(args.out, {
        "what": "llvm-mca-16 static analysis of the inner sdot/smmla loop of the ARM int8 kernels (threads=1), "
                "beside xfc's int8 issue model; estimates, not timings; deterministic",
        "machine": {**machine_facts(), "note": "the machine that compiled and analysed the loops; llvm-mca figures do "
                                               "not depend on it or on its load"},
        "compiler": mca.compiler_version(), "llvm_mca": mca.llvm_mca_version(), "rows": rows}, kind="arm_int8_mca")
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
