#!/usr/bin/env python3
"""What packing the activation costs the 1x1 convolutions of MobileNetV2 (issue 32; not in CI).

xfc runs a 1x1 convolution in NCHW as a GEMM whose B operand is the input activation, packed into
NR-column panels on every call (the filters, A, are packed once). onnxruntime runs the same layers
on its NCHWc blocked layout, which its kernels read without a packing pass. Per layer, at 1 thread,
weights pre-packed, timed interleaved in one process (best of --rounds rounds of --repeats runs):

  chosen          the plan xfc synthesizes (`xfc synth --hw host`), B packed per call
  nc_l2           where one MC block holds all of M (no packed B block is reused by a second MC
                  block): the same plan with the packed B block sized to half the per-core L2
                  (nc), so the packed panels stay in L2 instead of going through L3. Timed here,
                  kernel by kernel with hot caches, it changed nothing; in whole networks it
                  pays (benchmarks/packed_panel.py), and synthesis now sizes the panel to a
                  quarter of L2 itself, so this column repeats the chosen plan (the committed
                  results predate that rule)
  transposed      the best-predicted plan of the other GEMM view among the cost model's top 10
                  (candidate_syntheses): lowering implicit_gemm_t, M = pixels, N = filters, the
                  input read in place as A (no packing pass when a_pack is im2col_direct), C
                  stored through a transposed tile ("-" when the top 10 has none)
  b_prepacked     the same GEMM as a matmul (M = filters, N = pixels, K = channels), as xfc plans
                  that matmul, with B pre-packed once and untimed, as the weights are: no packing
                  pass at all. What a layout that needs no packing could save, roughly (its plan
                  is the matmul's and may differ from the convolution's)

Every kernel is checked against the float64 reference. Writes a table and
benchmarks/results/pointwise_packing.json (the machine named).

    .venv/bin/python benchmarks/pointwise_packing.py [--rounds 7] [--repeats 20]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from machine import machine_facts, warn_if_loaded
from xfc.cpu.codegen import render_cpu_kernel
from xfc.cpu.cost_model import L2_FILL
from xfc.cpu.synth import candidate_syntheses, l2_per_core_bytes, synthesize_cpu
from xfc.ops.reference import check_output, make_inputs
from xfc.ops.spec import make_spec
from xfc.outputs import write_json_result
from xfc.pipeline import stages
from xfc.tiledb.hostdesc import load_hardware

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "results" / "pointwise_packing.json"
# MobileNetV2's distinct 1x1 convolutions at 224x224 (channels in, spatial size, channels out)
LAYERS = [(32, 112, 16), (16, 112, 96), (24, 56, 144), (144, 56, 24), (32, 28, 192), (192, 28, 32),
          (64, 14, 384), (384, 14, 64), (96, 14, 576), (576, 14, 96), (160, 7, 960), (960, 7, 160),
          (320, 7, 1280)]


def describe(plan) -> str:
    g = plan.gemm
    return f"{plan.lowering} mr={g.mr} nr={g.nr} kc={g.kc} mc={g.mc} nc={g.nc} A={g.a_pack} C={g.c_store}"


PLAN_COLUMN = 72


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    warn_if_loaded()
    hw = load_hardware("host", os.environ)
    cluster = hw.cluster()
    rows = []
    print(f"{'layer':<16} {'plan':<{PLAN_COLUMN}} {'chosen':>8} {'nc_l2':>8} {'b_prepacked':>11} "
          f"{'transposed':>10}   ms, 1 thread")
    with tempfile.TemporaryDirectory(prefix="xfc-pointwise-") as tmp:
        for c, hw_px, k in LAYERS:
            conv = make_spec("conv2d", dict(c=c, h=hw_px, w=hw_px, k=k, r=1, s=1), bias=True)
            gemm = make_spec("matmul", dict(m=k, n=hw_px * hw_px, k=c))
            chosen = synthesize_cpu(conv, hw, threads=1).plan
            g = chosen.gemm
            one_block = g.mc >= k   # M (the filters) in one MC block
            nc_l2 = max(g.nr, min(g.nc, int(l2_per_core_bytes(cluster) * L2_FILL // (g.kc * 4)) // g.nr * g.nr)) \
                if one_block else g.nc
            other_view = [c.plan for c in candidate_syntheses(conv, hw, cluster.role, 1, top=10)
                          if c.plan.lowering != chosen.lowering]
            variants = [("chosen", conv, chosen), ("nc_l2", conv, replace(chosen, gemm=replace(g, nc=nc_l2))),
                        ("b_prepacked", gemm, synthesize_cpu(gemm, hw, threads=1).plan)]
            if other_view:
                variants.append(("transposed", conv, other_view[0]))
            built = []
            for i, (label, spec, plan) in enumerate(variants):
                kernel = stages.build(render_cpu_kernel(plan), Path(tmp) / f"{c}_{hw_px}_{k}_{i}").host
                a, b, bias = make_inputs(spec, seed=0)
                ok = check_output(spec, kernel(a, b, bias), a, b, bias).ok
                built.append((label, kernel, (a, b, bias), bool(ok)))
            best = [math.inf] * len(built)
            for _ in range(args.rounds):
                for i, (_, kernel, inputs, _) in enumerate(built):
                    best[i] = min(best[i], min(kernel.time(*inputs, repeats=args.repeats, prepacked=True).samples_s))
            name = f"{c}->{k} @{hw_px}"
            plan_text = describe(chosen)
            other = f"{best[3] * 1e3:10.3f}" if len(best) > 3 else f"{'-':>10}"
            print(f"{name:<16} {plan_text:<{PLAN_COLUMN}} {best[0] * 1e3:8.3f} {best[1] * 1e3:8.3f} "
                  f"{best[2] * 1e3:11.3f} {other}")
            rows.append(dict(layer=name, channels_in=c, size=hw_px, channels_out=k, flops=conv.flops, plan=plan_text,
                             nc_l2=nc_l2, verified=all(e[3] for e in built),
                             transposed_plan=describe(other_view[0]) if other_view else None,
                             **{f"{label}_ms": round(t * 1e3, 4) for (label, *_), t in zip(built, best)}))
    total = {key: round(sum(r[f"{key}_ms"] for r in rows), 3) for key in ("chosen", "nc_l2", "b_prepacked")}
    # the faster of the chosen plan and the other view, per layer: what choosing between them could give
    total["faster_of_chosen_and_transposed"] = round(sum(min(r["chosen_ms"], r.get("transposed_ms", math.inf))
                                                         for r in rows), 3)
    print(f"{'sum':<16} {'':<{PLAN_COLUMN}} {total['chosen']:8.3f} {total['nc_l2']:8.3f} {total['b_prepacked']:11.3f}"
          f"   faster of chosen and transposed: {total['faster_of_chosen_and_transposed']:.3f}")
    write_json_result(args.out, {"benchmark": "pointwise_packing", "machine": machine_facts(), "threads": 1,
                                 "rounds": args.rounds, "repeats": args.repeats, "rows": rows, "sum_ms": total,
                                 "command": "benchmarks/pointwise_packing.py"}, kind="pointwise_packing")
    print(f"-> {args.out}")
    return 0 if all(r["verified"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
