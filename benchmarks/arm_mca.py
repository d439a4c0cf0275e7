#!/usr/bin/env python3
"""ARM static benchmark: llvm-mca-16 on the inner FMA loop of every shipped core's kernels.

    .venv/bin/python benchmarks/arm_mca.py                       # every cpu/*.yaml x every suite workload
    .venv/bin/python benchmarks/arm_mca.py --cores cortex-a710,cortex-x3 --only mm_512,dw_mbv2_s1
    .venv/bin/python benchmarks/arm_mca.py --dtype fp16      # fp16 kernels (FMLA .8h) on the A55, A76 and A710

For each shipped core description (hardware_descriptions/cpu/*.yaml) and each workload of the
suite (xfc/ops/workloads.py), the kernel is synthesized for one thread, rendered, compiled with
xfc's ARM build flags (-S) and its innermost FMA loop analysed by xfc.analysis.mca under the core's LLVM 16
model (xfc.analysis.mca.MODELS). Static analysis: no timing, no emulator, deterministic, so the figures
do not depend on how busy this machine is. Predicted GFLOP/s = FMA per cycle on the core's pipes
x lanes (4 fp32, 8 fp16) x 2 FLOP x the core's clock: what the loop alone would sustain, an upper bound for the
operator (packing, tails and C write-back are outside the loop). Where the synthesizer chooses a
Winograd plan (3x3 stride-1 convolutions), the loop is its GEMM stage's micro-kernel
(xfc.analysis.mca.gemm_stage_kernel; the transforms are not in the figure).

Results: a table on stdout and benchmarks/results/arm_mca.json (atomic; an existing file is
replaced only if xfc wrote it, see xfc/outputs.py). --dtype fp16: the fp16 kernels (xfc/cpu/fp16.py,
8 lanes; default cores cortex-a55, cortex-a76 and cortex-a710) into
benchmarks/results/arm_mca_fp16.json, against issue 33's fp16 targets (FP16_TARGETS).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

from xfc.analysis import mca
from xfc.cpu.synth import synthesize_cpu
from xfc.errors import XfcError
from xfc.hardware import SHIPPED_ROOT, load
from xfc.ops.workloads import SUITE, suite_spec

REPO = Path(__file__).resolve().parent.parent

DEFAULT_OUT = REPO / "benchmarks" / "results" / "arm_mca.json"
DEFAULT_OUT_FP16 = REPO / "benchmarks" / "results" / "arm_mca_fp16.json"
FP16_CORES = ("cortex-a55", "cortex-a76", "cortex-a710")
KIND = "arm_mca"

# The targets of issue 12 (after the loop work): A710-class model GEMM/conv >= 1.95 FMA/cycle,
# depthwise >= 1.8, no spills, X-class rescaled to 4 pipes >= 3.8 for GEMM/conv.
TARGETS = {"gemm_conv_fma_per_cycle_2pipe": 1.95, "depthwise_fma_per_cycle_2pipe": 1.8,
           "gemm_conv_fma_per_cycle_4pipe": 3.8, "spills": 0}

# The fp16 targets of issue 33 (item 4): no spills and >= 1.9 FMLA .8h per cycle on the 2-pipe model
# (A76 and A710 both run on the Neoverse-N2 model). Depthwise cannot pass 1.8 on that model (9 FMLA
# and 1 q store per output vector on the two V pipes, NOTES["depthwise_ceiling_2pipe"]): its target is
# that ceiling, which the stride-2 loop misses by 0.2 cycles per 40 (see NOTES["fp16"]).
FP16_TARGETS = {"gemm_conv_fma_per_cycle_2pipe": 1.9, "depthwise_fma_per_cycle_2pipe": 1.8, "spills": 0}

IN_ORDER = ("cortex-a53", "cortex-a55", "cortex-a510")

# Why depthwise cannot pass 1.80 on the A710-class model, and the A55 hand count (issue 12 asks for both).
NOTES = {
    "depthwise_ceiling_2pipe": "a 3x3 depthwise output vector takes 9 FMLA and 1 q store, and the Neoverse-N2 "
                               "model issues both on the two V pipes (a stored q register costs one V-pipe slot, "
                               "as llvm-mca-16 reports for str/stp/st1 q): at most 9 / 10 x 2 = 1.80 FMLA/cycle, "
                               "which both depthwise loops reach in the steady state (V0 = V1 = 80 cycles per "
                               "144 FMLA + 16 stores; dup, pointer adds and the counter run on M0/M1/S/B). "
                               "Stride 2 was 80.67 until the loads of the tile's two row halves were interleaved "
                               "(neon_asm.interleave_row_halves): in offset order too few accumulator chains were "
                               "open for the model's 160-entry ROB",
    "method": "cycles per iteration are the steady state (cycles(2N) - cycles(N)) / N for every loop; "
              "cycles(N) / N, the method before, also holds llvm-mca's fixed pipeline fill (fill_cycles, "
              "1-44 cycles) spread over the arbitrary N = 200 and is kept as cycles_per_iteration_with_fill "
              "and fma_per_cycle_with_fill",
    "a55_hand_count": "A55 matmul 16x4, k_unroll 4, 64-bit A loads: per k step 16 FMLA (1 per cycle), 8 ldr d "
                      "that co-issue with FMLA and 1 ldr q of B that holds the pipe 2 cycles without pairing "
                      "(hardware_descriptions/cpu/cortex-a55.yaml load_rules) = 18 cycles per 16 FMLA = 0.89 "
                      "FMA/cycle; the evaluator's corrected figure is 72 cycles per 4 k steps = 0.89",
    "machine_load": "llvm-mca figures are static: the compile and the scheduling model do not depend on how busy "
                    "the analysing machine is (it was shared with other jobs when this file was written)",
}

FP16_NOTE = ("fp16 kernels run neon_asm's loops spelled in .8h (plan field ukernel) with the A registers in v0-v15, "
             "the only registers FMLA .8h by element can index, and A loaded 8 (q) or 4 (d) values at a time, the "
             "last load overlapping the one before (tiles.a_load_groups), so the planner budgets exactly the "
             "registers the loop uses. Before (GCC intrinsics, A grouped 8 + 4 + 1 + 1 at render time against a "
             "budget of ceil(MR / 8)): 12-66 spill stores and 16-81 stack reloads per A76/A710 GEMM/conv loop and "
             "0.85-1.63 FMLA/cycle on the Neoverse-N2 model (depthwise 1.31-1.33 with 7-10 spills), 0.2-0.5 on "
             "the A55 model. Depthwise 8x1 (fp16 vectors of 8 fit OW = 56 and 28 "
             "whole): 72 FMLA + 8 q stores = 40 V-pipe cycles per block, 1.80 at stride 1; stride 2 takes 40.2 "
             "in the steady state (1.79)")


def shipped_cores() -> list[str]:
    return sorted(p.stem for p in (SHIPPED_ROOT / "cpu").glob("*.yaml"))


def tile_text(plan) -> str:
    if plan.gemm:
        g = plan.gemm
        return f"{g.mr}x{g.nr} ku{g.k_unroll} A{g.a_load_bits}"
    d = plan.depthwise
    return f"{d.oh_rows}rows x {d.ow_vectors}vec"


def measure(core_name: str, workload: str, dtype: str = "fp32") -> dict:
    hw = load(core_name)
    if dtype == "fp16":
        from xfc.cpu.fp16 import synthesize_fp16
        synthesis = synthesize_fp16(suite_spec(workload), hw, threads=1)
    else:
        synthesis = synthesize_cpu(suite_spec(workload), hw, threads=1)
    plan, cluster = synthesis.plan, synthesis.cluster
    result = mca.analyze_synthesis(synthesis)
    c = result.counts
    row = {
        "core": core_name, "workload": workload, **({"dtype": dtype} if dtype != "fp32" else {}),
        "operator": synthesis.spec.name, "lowering": plan.lowering,
        "tile": tile_text(plan), "ukernel": plan.schedule.ukernel, "model": result.model, "scheduling_model": result.scheduling_model,
        "reliable": result.reliable, "function": result.function, "loop_label": result.loop_label,
        "instructions_per_iteration": c.instructions, "fma_per_iteration": c.fma,
        "cycles_per_iteration": round(result.cycles_per_iteration, 3),
        "cycles_per_iteration_with_fill": round(result.cycles_per_iteration_with_fill, 3),
        "fill_cycles": round(result.fill_cycles, 3),
        "fma_per_cycle_with_fill": round(c.fma / result.cycles_per_iteration_with_fill, 3),
        "block_rthroughput": result.block_rthroughput,
        "fma_per_cycle": round(result.fma_per_cycle, 3), "core_fma_per_cycle": result.core_fma_per_cycle,
        "pipe_share": round(result.pipe_share, 4), "pipes_scale": result.pipes_scale,
        "scaled_fma_per_cycle": None if result.scaled_fma_per_cycle is None else round(result.scaled_fma_per_cycle, 3),
        "scaled_arithmetic": result.scaled_arithmetic,
        "estimate_pipe_share": round(result.estimate_pipe_share, 4),
        "predicted_gflops": round(mca.predicted_gflops(result, cluster.clock_ghz, plan.vector_lanes), 2),
        "clock_ghz": cluster.clock_ghz, "bottleneck": result.bottleneck,
        "bottleneck_cycles_per_iteration": result.bottleneck_cycles,
        "spill_stores": c.spill_stores, "stack_reloads": c.stack_reloads, "register_moves": c.register_moves,
        "loads_by_class": dict(c.loads_by_class), "other_instructions": dict(c.other),
    }
    if plan.gemm:   # an independent check of the extraction: FMAs = MR x NR / lanes x k_unroll
        g = plan.gemm
        row["expected_fma_per_iteration"] = g.mr * (g.nr // plan.vector_lanes) * g.k_unroll
    return row


def criteria(rows: list[dict], targets: dict = TARGETS) -> dict:
    """Where the targets stand (issue 12's for fp32, FP16_TARGETS for fp16)."""
    def worst(pred, key):
        vals = [r[key] for r in rows if pred(r) and r[key] is not None]
        return min(vals) if vals else None
    gemm_conv = lambda r: r["operator"] in ("matmul", "conv2d")  # noqa: E731
    two_pipe = lambda r: r["model"] == "cortex-a710" and r["pipes_scale"] == 1  # noqa: E731
    return {
        "targets": targets,
        "min_gemm_conv_fma_per_cycle_2pipe": worst(lambda r: gemm_conv(r) and two_pipe(r), "fma_per_cycle"),
        "min_depthwise_fma_per_cycle_2pipe": worst(lambda r: r["operator"] == "depthwise" and two_pipe(r),
                                                   "fma_per_cycle"),
        # the same two figures with llvm-mca's pipeline fill over MCA_ITERATIONS left in (the old method)
        "min_gemm_conv_fma_per_cycle_2pipe_with_fill": worst(lambda r: gemm_conv(r) and two_pipe(r),
                                                             "fma_per_cycle_with_fill"),
        "min_depthwise_fma_per_cycle_2pipe_with_fill": worst(lambda r: r["operator"] == "depthwise" and two_pipe(r),
                                                             "fma_per_cycle_with_fill"),
        "min_gemm_conv_fma_per_cycle_4pipe": worst(lambda r: gemm_conv(r) and r["pipes_scale"] == 2,
                                                   "scaled_fma_per_cycle"),
        "loops_with_spills": sum(1 for r in rows if r["spill_stores"] or r["stack_reloads"]),
        "loops_with_register_moves": sum(1 for r in rows if r["register_moves"]),
        "in_order_loops_without_64_bit_a_loads": sum(
            1 for r in rows if r["core"] in IN_ORDER and r["operator"] != "depthwise"
            and not r["loads_by_class"].get("d")),
        "loops": len(rows),
    }


def print_table(rows: list[dict]) -> None:
    header = ["core", "workload", "tile", "model", "FMA/cyc", "% pipes", "scaled", "% scaled", "GFLOP/s",
              "spill st/ld", "moves", "bottleneck", "note"]
    table = []
    for r in rows:
        scaled = r["scaled_fma_per_cycle"]
        table.append([r["core"], r["workload"], r["tile"], r["model"], f"{r['fma_per_cycle']:.2f}",
                      f"{r['pipe_share']:.0%}", "-" if scaled is None else f"{scaled:.2f}",
                      "-" if scaled is None else f"{r['estimate_pipe_share']:.0%}", f"{r['predicted_gflops']:.1f}",
                      f"{r['spill_stores']}/{r['stack_reloads']}", str(r["register_moves"]), r["bottleneck"],
                      "" if r["reliable"] else "UNRELIABLE"])
    widths = [max(len(str(x[i])) for x in [header] + table) for i in range(len(header))]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    print("  ".join("-" * w for w in widths))
    for t in table:
        print("  ".join(str(x).ljust(w) for x, w in zip(t, widths)).rstrip())


def _host_cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cores", help="comma-separated core descriptions "
                                    "(default: every hardware_descriptions/cpu/*.yaml)")
    ap.add_argument("--only", help="comma-separated suite workloads (default: all)")
    ap.add_argument("--out", type=Path, default=None, help=f"results JSON (default {DEFAULT_OUT}, or "
                                                            f"{DEFAULT_OUT_FP16} with --dtype fp16)")
    ap.add_argument("--dtype", choices=("fp32", "fp16"), default="fp32", help="kernel element type (default fp32)")
    args = ap.parse_args(argv)
    fp16 = args.dtype == "fp16"
    args.out = args.out or (DEFAULT_OUT_FP16 if fp16 else DEFAULT_OUT)
    try:
        cores = args.cores.split(",") if args.cores else (list(FP16_CORES) if fp16 else shipped_cores())
        workloads = args.only.split(",") if args.only else list(SUITE)
        unknown = [w for w in workloads if w not in SUITE]
        if unknown:
            raise XfcError(f"--only: unknown workload(s) {', '.join(unknown)} (available: {', '.join(SUITE)})")
        mca.require_tools()
        rows = []
        for core in cores:
            for workload in workloads:
                rows.append(measure(core, workload, args.dtype))
                print(f"[arm_mca] {core} {workload}: {rows[-1]['fma_per_cycle']:.2f} FMA/cycle", file=sys.stderr,
                      flush=True)
        print_table(rows)
        crit = criteria(rows, FP16_TARGETS if fp16 else TARGETS)
        print("\n" + "; ".join(f"{k} {v}" for k, v in crit.items() if k != "targets"))
        what = "" if not fp16 else " (fp16 kernels: FMLA .8h, 8 lanes; xfc/cpu/fp16.py)"
        data = {
            "what": "llvm-mca-16 static analysis of the innermost FMA loop of each kernel (threads=1); a scheduling-"
                    "model estimate, not a timing; deterministic" + what,
            "method": "xfc.analysis.mca: the kernel compiled with xfc's ARM build flags plus -S; the innermost loop with the "
                      "most FMAs; llvm-mca-16 -mtriple=aarch64 -mcpu=<model> -json, run with -iterations="
                      f"N={mca.MCA_ITERATIONS} and 2N; cycles per iteration = the steady state (cycles(2N) - "
                      "cycles(N)) / N for every loop (the pipeline fill is fill_cycles; cycles(N) / N is "
                      "cycles_per_iteration_with_fill); predicted GFLOP/s = FMA/cycle on the core's pipes x lanes x 2 x "
                      "clock",
            "tools": {"compiler": mca.compiler_version(), "llvm_mca": mca.llvm_mca_version()},
            "machine": {"analysed_on": platform.platform(), "cpu_model": _host_cpu_model(), "cpus": os.cpu_count(),
                        "note": "static analysis for the ARM cores named per row; the host CPU only runs the tools"},
            "models": {core: {"mcpu": m.mcpu, "scheduling_model": m.scheduling_model,
                              "model_fma_per_cycle": m.model_fma_per_cycle, "pipes_scale": m.pipes_scale,
                              "reliable": m.reliable, "why": m.why} for core, m in mca.MODELS.items()},
            "criteria": crit,
            "notes": {**NOTES, **({"fp16": FP16_NOTE} if fp16 else {})},
            "rows": rows,
        }
        from xfc.outputs import write_json_result
        write_json_result(args.out, data, kind=KIND + ("_fp16" if fp16 else ""), option="--out")
        print(f"wrote {args.out}", file=sys.stderr)
    except XfcError as exc:
        print(f"arm_mca: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
