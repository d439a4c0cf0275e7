#!/usr/bin/env python3
"""A planner rule on and off, timed in whole networks (issue 32; not run in CI).

Two rules (--rule):

packed_panel (the default): where a convolution's packed B panel lives.

A convolution lowered to implicit GEMM (NCHW, vectors along output pixels) packs its B operand, the
im2col matrix of the input activation, into a KC x NC panel on every call and reads it back at
once. xfc.cpu.synth.grow_gemm sizes NC so that the panel fits PACKED_B_L2_FILL of the per-core L2
(the round trip stays in L2). Before that rule NC was sized to the shared cache (L3): a 1x1 layer
at 112x112 packed all 12,544 columns into one 1.6 MB panel. Timed kernel by kernel, weights hot,
the two were the same (benchmarks/pointwise_packing.py, its nc_l2 column); this times what users
run, the whole network.

  l2_panel      `xfc model NET --hw host --emit lib` as xfc synthesizes it today
  l3_panel      the same with the rule switched off (PACKED_B_L2_FILL set to 1e6, beyond any L2): NC from
                the shared cache, as before; every other decision unchanged

next_panel_prefetch: the row tiles of a GEMM block prefetch the next weight panel into L2
(xfc.cpu.decide.next_panel_prefetch_lines); a network's weights come from memory, and without it
the first row tile of each panel waits for the panel alone.

  prefetch      as xfc synthesizes it today
  no_prefetch   NEXT_PANEL_PREFETCH_DIALECTS emptied: no kernel prefetches the next panel

int8_next_panel_prefetch: the same for the int8 GEMMs whose weights are the column panels (matmul and
the 'channels' conv layout, xfc.cpu.int8_synth.next_panel_prefetch); with --quantize qdq|qoperator
(the networks quantized by onnxruntime.quantization first, as benchmarks/net_bench.py does).

  prefetch      as xfc synthesizes it today
  no_prefetch   INT8_PREFETCH_DIALECTS emptied

Per network (benchmarks/nets.py, exported at run time with seeded random weights) and thread count,
in this process, the two variants:

Both libraries' benchmark programs are built with the CMakeLists.txt xfc emits beside them, their
outputs on the same random input compared byte for byte (the panel width changes no summation
order, so they must be identical), then run alternately for --rounds rounds of --runs runs with
--profile: the median of the round medians per variant, and the sum of the per-step medians over
the steps whose kernel source differs (the other steps run the same code in both: their
differences are the machine's noise, large at 2 threads on a shared 2-vCPU VM).

    .venv/bin/python benchmarks/packed_panel.py [--rule next_panel_prefetch] [--only mobilenet_v2,...]
        [--threads 1,2] [--rounds 6] [--quantize qdq|qoperator] [--out-name NAME.json]

Writes a table and benchmarks/results/<rule>.json (or --out-name; the machine named). Needs torch
(export) and cmake. Exit 0, 1 when the two variants' outputs differ, 3 without torch.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import machine_facts, warn_if_loaded
from nets import ALL, export, networks_or_status

import xfc.cpu.decide as cpu_decide
import xfc.cpu.int8_synth as cpu_int8_synth
import xfc.cpu.synth as cpu_synth
from xfc.cli.main import main as xfc_main
from xfc.outputs import write_json_result

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
# rule: (module, setting, {variant: value}); the first variant is the rule as xfc has it today
RULES = {
    "packed_panel": (cpu_synth, "PACKED_B_L2_FILL",
                     {"l2_panel": cpu_synth.PACKED_B_L2_FILL, "l3_panel": 1e6}),   # 1e6 x L2: never below L3
    "next_panel_prefetch": (cpu_decide, "NEXT_PANEL_PREFETCH_DIALECTS",
                            {"prefetch": cpu_decide.NEXT_PANEL_PREFETCH_DIALECTS, "no_prefetch": ()}),
    "int8_next_panel_prefetch": (cpu_int8_synth, "INT8_PREFETCH_DIALECTS",
                                 {"prefetch": cpu_int8_synth.INT8_PREFETCH_DIALECTS, "no_prefetch": ()}),
}


def emit(onnx: Path, threads: int, rule: str, value, out: Path) -> None:
    """`xfc model --emit lib` in this process with the rule's setting (its report is not needed)."""
    module, setting, _ = RULES[rule]
    saved = getattr(module, setting)
    setattr(module, setting, value)
    stdout = io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout):
            status = xfc_main(["model", str(onnx), "--hw", "host", "--threads", str(threads), "--emit", "lib",
                               "-o", str(out)])
    finally:
        setattr(module, setting, saved)
    if status != 0:
        raise SystemExit(f"packed-panel: xfc model {onnx.name} exited {status}: {stdout.getvalue()[-400:]}")


def build(out: Path, name: str) -> Path:
    build_dir = out / "build"
    for argv in (["cmake", "-S", str(out), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release"],
                 ["cmake", "--build", str(build_dir)]):
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"packed-panel: {' '.join(argv[:2])} failed: {proc.stderr[-800:]}")
    return build_dir / f"benchmark_{name}"


def run(exe: Path, *extra: str) -> dict:
    proc = subprocess.run([str(exe), "--random", "--seed", "0", *extra], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"packed-panel: {exe.name} exited {proc.returncode}: {proc.stderr[-400:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def changed_steps(outs: list[Path]) -> list[int]:
    """Indexes of the program steps whose kernel source differs between the variants' libraries
    (manifest.json names each step's function; its source is <function>.c beside it)."""
    manifests = [json.loads((out / "manifest.json").read_text())["steps"] for out in outs]
    changed = []
    for index, step in enumerate(manifests[0]):
        function = step.get("function")
        if function and len({(out / f"{function}.c").read_bytes() for out in outs}) > 1:
            changed.append(index)
    return changed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(ALL), help="comma-separated networks (default: all of "
                        + ", ".join(ALL) + ")")
    parser.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds (default 6)")
    parser.add_argument("--runs", type=int, default=40, help="timed runs per round (default 40)")
    parser.add_argument("--size", type=int, default=224, help="input height and width (default 224)")
    parser.add_argument("--rule", choices=sorted(RULES), default="packed_panel",
                        help="the rule timed on and off (default packed_panel)")
    parser.add_argument("--out-name", help="the results file's name in benchmarks/results (default <rule>.json)")
    parser.add_argument("--quantize", choices=("qdq", "qoperator"),
                        help="quantize each network first (int8, onnxruntime.quantization)")
    args = parser.parse_args(argv)
    variants = RULES[args.rule][2]
    on, off = list(variants)
    archs = networks_or_status("packed-panel", args.only)
    if isinstance(archs, int):
        return archs
    rows, status = [], 0
    with tempfile.TemporaryDirectory(prefix="xfc-packed-panel-") as tmp:
        tmp = Path(tmp)
        for arch in archs:
            onnx = tmp / f"{arch}.onnx"
            export(arch, onnx, args.size)
            if args.quantize:
                from xfc.model.quantized_peer import quantize_with_onnxruntime
                onnx = quantize_with_onnxruntime(onnx, tmp / f"{arch}_{args.quantize}.onnx", args.quantize)
            for threads in [int(t) for t in args.threads.split(",")]:
                exes = {}
                for variant, value in variants.items():
                    out = tmp / f"{arch}-t{threads}-{variant}"
                    emit(onnx, threads, args.rule, value, out)
                    exes[variant] = build(out, onnx.stem)   # CMake puts the weights file beside it
                changed = changed_steps([tmp / f"{arch}-t{threads}-{v}" for v in variants])
                outputs = {}
                for variant, exe in exes.items():
                    (exe.parent / "out").mkdir(exist_ok=True)
                    run(exe, "--runs", "1", "--warmup", "0", "--threads", str(threads), "--outputs",
                        str(exe.parent / "out"))
                    outputs[variant] = sorted((p.name, p.read_bytes()) for p in (exe.parent / "out").glob("*.f32"))
                identical = outputs[on] == outputs[off]
                if not identical:
                    status = 1
                timed = {v: [] for v in exes}
                for _ in range(args.rounds):
                    for variant, exe in exes.items():
                        timed[variant].append(run(exe, "--runs", str(args.runs), "--warmup", "5", "--threads",
                                                  str(threads), "--profile"))
                medians = {v: statistics.median(r["median_ms"] for r in rs) for v, rs in timed.items()}
                steps = {v: [statistics.median(r["steps_ms"][i] for r in rs) for i in range(len(rs[0]["steps_ms"]))]
                         for v, rs in timed.items()}
                changed_ms = {v: sum(steps[v][i] for i in changed) for v in steps}
                rows.append({"net": arch, "threads": threads, "changed_steps": changed,
                             "outputs_identical": identical,
                             f"{on}_median_ms": medians[on], f"{off}_median_ms": medians[off],
                             "speedup": medians[off] / medians[on],
                             f"changed_steps_{on}_ms": changed_ms[on], f"changed_steps_{off}_ms": changed_ms[off],
                             "changed_steps_speedup": changed_ms[off] / changed_ms[on] if changed else None,
                             "round_medians_ms": {v: [r["median_ms"] for r in rs] for v, rs in timed.items()},
                             "steps_ms": steps})
                r = rows[-1]
                print(f"{arch:14s} t{threads}: network {on} {medians[on]:7.2f} ms  {off} {medians[off]:7.2f} ms  "
                      f"x{r['speedup']:.3f};  the {len(changed)} steps whose kernel differs {changed_ms[on]:7.2f} ms "
                      f"vs {changed_ms[off]:7.2f} ms  x{r['changed_steps_speedup'] or 1:.3f}  "
                      f"(outputs {'identical' if identical else 'DIFFER'})", flush=True)
    load = warn_if_loaded()
    module, setting, _ = RULES[args.rule]
    doc = {"benchmark": args.rule, "machine": machine_facts(), "load_average_at_end": load,
           "rounds": args.rounds, "runs_per_round": args.runs, "size": args.size, "quantize": args.quantize,
           setting.lower(): getattr(module, setting), "rows": rows,
           "command": "benchmarks/packed_panel.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    for threads in sorted({r["threads"] for r in rows}):
        for key, what in (("speedup", "whole network"), ("changed_steps_speedup", "the steps whose kernel differs")):
            s = [r[key] for r in rows if r["threads"] == threads and r[key]]
            geo = math.exp(sum(map(math.log, s)) / len(s))
            doc[f"geomean_{key}_t{threads}"] = geo
            print(f"threads {threads}, {what}: geomean x{geo:.3f} ({on} over {off}), min x{min(s):.3f}")
    out_path = RESULTS / (args.out_name or f"{args.rule}.json")
    write_json_result(out_path, doc, kind=args.rule)
    print(f"wrote {out_path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
