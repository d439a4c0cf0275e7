#!/usr/bin/env python3
"""The x86 inline-assembly K loop (xfc/cpu/x86_asm.py) against the intrinsics one, on this host.

    .venv/bin/python benchmarks/x86_asm.py                     # threads 1,2, every layer below
    .venv/bin/python benchmarks/x86_asm.py --threads 1 --only mbv2_pw_16_96

For each layer the plan `xfc synth --hw host` synthesizes (the probed host description, the tile
database as synth uses it) is built twice, differing only in the plan's `ukernel` field:
'intrinsics' (GCC allocates the registers) and 'asm_out_of_order' (registers from the plan). Both
are verified against numpy and timed with the weights pre-packed, in interleaved rounds; each keeps
its fastest run per round and the median of the rounds is reported (contention only slows).
The layers: MobileNetV2's 1x1 convolutions (the large-image ones where it lost to onnxruntime and
the 7x7 ones), a ResNet 3x3 in implicit GEMM and in Winograd, the first 3x3 stride-2 layer of most
CNNs and a 512^3 matmul. Output: a table and benchmarks/results/x86_asm.json (machine named).
Needs an AVX2 or AVX-512 host (the ISA the host plans use; synthesis chooses the assembly loop on
AVX2 only, x86_asm.CHOSEN_DIALECTS: run this on an AVX-512 core to decide whether it should there
too, e.g. with --out benchmarks/results/x86_asm_avx512.json); the figures are this machine's only.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
from pathlib import Path

import xfc
from xfc.cpu import x86_asm
from xfc.cpu.codegen import render_cpu_kernel
from xfc.ops.reference import check_output, make_inputs
from xfc.ops.spec import make_spec
from xfc.outputs import write_json_result
from xfc.pipeline import stages
from machine import machine_facts, warn_if_loaded

REPO = Path(__file__).resolve().parent.parent

LAYERS = {   # name: (operator, shape, options)
    "mbv2_pw_16_96": ("conv2d", "c=16,h=112,w=112,k=96,r=1,s=1", dict(bias=True, activation="relu6")),
    "mbv2_pw_32_16": ("conv2d", "c=32,h=112,w=112,k=16,r=1,s=1", dict(bias=True)),
    "mbv2_pw_144_24": ("conv2d", "c=144,h=56,w=56,k=24,r=1,s=1", dict(bias=True)),
    "mbv2_pw_96_576": ("conv2d", "c=96,h=14,w=14,k=576,r=1,s=1", dict(bias=True, activation="relu6")),
    "mbv2_pw_320_1280": ("conv2d", "c=320,h=7,w=7,k=1280,r=1,s=1", dict(bias=True, activation="relu6")),
    "stem_3x3_s2": ("conv2d", "c=3,h=224,w=224,k=32,r=3,s=3", dict(bias=True, activation="relu6", stride=(2, 2),
                                                                  pad=(1, 1, 1, 1))),
    "r18_3x3_direct": ("conv2d", "c=64,h=56,w=56,k=64,r=3,s=3", dict(pad=(1, 1, 1, 1), lowering="direct")),
    "r18_3x3_winograd": ("conv2d", "c=256,h=14,w=14,k=256,r=3,s=3", dict(pad=(1, 1, 1, 1), lowering="winograd")),
    "matmul_512": ("matmul", "m=512,n=512,k=512", {}),
}


def _spec(op: str, shape: str, opts: dict):
    kw = {k: v for k, v in opts.items() if k != "lowering"}
    return make_spec(op, {k: int(v) for k, v in (kv.split("=") for kv in shape.split(","))}, **kw)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--only", default="", help="comma-separated layer names: " + ", ".join(LAYERS))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=10, help="timed runs per kernel per round")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "x86_asm.json"))
    args = ap.parse_args(argv)
    say = lambda m: print(f"x86-asm: {m}", file=sys.stderr, flush=True)  # noqa: E731
    hw = xfc.load_hardware("host")
    names = [n for n in (args.only.split(",") if args.only else LAYERS) if n]
    unknown = [n for n in names if n not in LAYERS]
    if unknown:
        print(f"x86_asm.py: error: unknown layer(s) {', '.join(unknown)} (known: {', '.join(LAYERS)})", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="xfc-x86-asm-") as tmp:
        for name in names:
            op, shape, opts = LAYERS[name]
            spec = _spec(op, shape, opts)
            for t in (int(x) for x in args.threads.split(",")):
                plan = xfc.synthesize(spec, hw, threads=t, lowering=opts.get("lowering", "auto")).plan
                if plan.isa not in x86_asm.DIALECTS:
                    print(f"x86_asm.py: error: the host plan is isa {plan.isa}; this compares the "
                          f"{' / '.join(x86_asm.DIALECTS)} loops", file=sys.stderr)
                    return 2
                if x86_asm.register_count(plan.gemm.mr, plan.gemm.nr // plan.vector_lanes) > \
                        x86_asm.VECTOR_REGISTERS[plan.isa]:
                    say(f"{name} t{t}: the {plan.gemm.tiles()} tile does not fit the assembly loop; skipped")
                    continue
                a, b, bias = make_inputs(spec, seed=0)
                kernels = {}
                for ukernel in ("intrinsics", "asm_out_of_order"):
                    variant = dataclasses.replace(plan, gemm=dataclasses.replace(plan.gemm, ukernel=ukernel),
                                                  function_name=f"{plan.function_name}_{ukernel}")
                    kernel = stages.build(render_cpu_kernel(variant), Path(tmp) / f"{name}_t{t}_{ukernel}").host
                    ok, _, _ = check_output(spec, kernel(a, b, bias), a, b, bias)
                    kernels[ukernel] = (kernel, ok)
                best = {u: [] for u in kernels}
                for r in range(args.rounds):
                    for u, (kernel, _) in kernels.items():
                        m = kernel.time(a, b, bias, repeats=args.repeats, prepacked=True)
                        best[u].append(min(m.samples_s))
                ms = {u: statistics.median(v) * 1e3 for u, v in best.items()}
                gflops = {u: spec.flops / (v * 1e-3) / 1e9 for u, v in ms.items()}
                row = dict(layer=name, operator=op, shape=shape, threads=t, isa=plan.isa, lowering=plan.lowering,
                           tiles=plan.gemm.tiles(), intrinsics_ms=ms["intrinsics"], asm_ms=ms["asm_out_of_order"],
                           intrinsics_gflops=gflops["intrinsics"], asm_gflops=gflops["asm_out_of_order"],
                           speedup=ms["intrinsics"] / ms["asm_out_of_order"],
                           verified=all(ok for _, ok in kernels.values()))
                rows.append(row)
                say(f"{name} t{t}: intrinsics {row['intrinsics_ms']:.3f} ms, asm {row['asm_ms']:.3f} ms, "
                    f"x{row['speedup']:.2f}")
    print(f"{'layer':<18} {'T':>2} {'lowering':<15} {'intrin ms':>9} {'GFLOP/s':>7} {'asm ms':>8} {'GFLOP/s':>7} "
          f"{'speedup':>7}  ok")
    for r in rows:
        print(f"{r['layer']:<18} {r['threads']:>2} {r['lowering']:<15} {r['intrinsics_ms']:>9.3f} "
              f"{r['intrinsics_gflops']:>7.1f} {r['asm_ms']:>8.3f} {r['asm_gflops']:>7.1f} {r['speedup']:>6.2f}x  "
              f"{'yes' if r['verified'] else 'NO'}")
    summary = {}
    for t in sorted({r["threads"] for r in rows}):
        sp = [r["speedup"] for r in rows if r["threads"] == t]
        summary[f"t{t}"] = dict(geomean_speedup=statistics.geometric_mean(sp), min_speedup=min(sp),
                                max_speedup=max(sp), layers=len(sp))
        print(f"threads {t}: geomean x{summary[f't{t}']['geomean_speedup']:.2f}, min x{min(sp):.2f}, "
              f"max x{max(sp):.2f} over {len(sp)} layers")
    warn_if_loaded()
    write_json_result(Path(args.out), dict(machine=dict(machine_facts(), description=hw.marketing_name),
                                           host_notes=hw.notes, rounds=args.rounds, repeats=args.repeats,
                                           rows=rows, summary=summary,
                                           command="benchmarks/x86_asm.py " + " ".join(argv or sys.argv[1:])),
                      kind="x86_asm")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if all(r["verified"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
