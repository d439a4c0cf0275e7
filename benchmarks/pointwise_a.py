#!/usr/bin/env python3
"""A pointwise (1x1) conv lowered transposed reads its A operand, the image, either in place or
packed: in place, every k step of every row tile reads MR consecutive pixels of one channel plane,
the next step a plane further on (a whole cache line per step, on each of the N / NR column
panels); packed, the image is transposed into MR-pixel panels once per call. This times both, with
the same register tile and blocking, interleaved in one process, on pointwise layers of the
benchmark networks, and prints what the cost model predicts for each and which plan the
synthesizer chooses (xfc/cpu/cost_model.py strided_a_bytes_per_k; not run in CI).

    .venv/bin/python benchmarks/pointwise_a.py [--layers C,HW,K;...] [--rounds 5] [--out FILE]

Default layers: the 1x1 convolutions of MobileNetV2's last stages and of ResNet-50's 7x7 and 14x14
stages, and MobileNetV2's 56x56 projections (few output channels: in place should win there).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from xfc.cpu.codegen import render_cpu_kernel
from xfc.cpu.cost_model import DEFAULT_CONSTANTS, StaticEvaluator
from xfc.cpu.synth import _gemm_synthesis, ranked_gemm_candidates, synthesize_cpu
from xfc.ops.reference import check_output, make_inputs
from xfc.ops.spec import make_spec
from xfc.outputs import write_json_result
from xfc.pipeline import stages
from xfc.tiledb.hostdesc import load_hardware
from machine import machine_facts, warn_if_loaded

DEFAULT_LAYERS = ("320,7,1280;960,7,320;960,7,160;160,7,960;576,14,96;384,14,64;96,56,24;144,56,24;"
                  "2048,7,512;512,7,2048;1024,14,256;256,14,1024;1024,14,512")
RESULTS = Path(__file__).resolve().parent / "results"


def parse_layers(text: str) -> list[tuple[int, int, int]]:
    try:
        layers = [tuple(int(v) for v in item.split(",")) for item in text.split(";") if item.strip()]
    except ValueError:
        raise SystemExit(f"pointwise_a: --layers wants C,HW,K;C,HW,K;... (integers), got {text!r}")
    if not layers or any(len(t) != 3 or min(t) < 1 for t in layers):
        raise SystemExit(f"pointwise_a: --layers wants C,HW,K;C,HW,K;... (positive integers), got {text!r}")
    return layers


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", default=DEFAULT_LAYERS, help="C,HW,K;... (1x1 conv, square image)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per plan and round")
    parser.add_argument("--out", default=str(RESULTS / "pointwise_a.json"))
    args = parser.parse_args(argv)
    layers = parse_layers(args.layers)
    warn_if_loaded()
    hw = load_hardware("host", os.environ, warn=lambda line: print(line, file=sys.stderr))
    cluster = hw.cluster()
    rows = []
    with tempfile.TemporaryDirectory(prefix="xfc-pointwise-a-") as tmp:
        for c, hw_px, k in layers:
            spec = make_spec("conv2d", dict(c=c, h=hw_px, w=hw_px, k=k, r=1, s=1), bias=True)
            chosen = synthesize_cpu(spec, hw, threads=args.threads).plan
            ranked = ranked_gemm_candidates(spec, hw, cluster, args.threads, chosen.isa, StaticEvaluator(),
                                            DEFAULT_CONSTANTS)
            transposed = [cand for cand in ranked if cand.transposed]
            if not transposed:
                print(f"{c},{hw_px},{k}: no transposed plan", file=sys.stderr)
                continue
            base = transposed[0]
            predicted = {}
            for cand in ranked:   # the model's price of the same tile and blocking, both ways
                g = cand.sched
                if cand.transposed and replace(g, a_pack=base.sched.a_pack) == base.sched:
                    predicted.setdefault(g.a_pack, cand.predicted_s)
            plan = _gemm_synthesis(spec, hw, cluster, chosen.isa, base, ()).plan
            variants = {"in_place": replace(plan, gemm=replace(plan.gemm, a_pack="im2col_direct")),
                        "packed": replace(plan, gemm=replace(plan.gemm, a_pack="packed"))}
            a, b, bias = make_inputs(spec, seed=0)
            kernels = {}
            for name, p in variants.items():
                kernel = stages.build(render_cpu_kernel(p), Path(tmp) / f"{c}_{hw_px}_{k}_{name}").host
                ok, _, _ = check_output(spec, kernel(a, b, bias), a, b, bias)
                if not ok:
                    raise SystemExit(f"pointwise_a: {name} plan of {spec.key()} failed verification")
                kernels[name] = kernel
            medians = {name: [] for name in kernels}
            for r in range(args.rounds):
                order = list(kernels) if r % 2 == 0 else list(reversed(kernels))
                for name in order:
                    m = kernels[name].time(a, b, bias, repeats=args.repeats, prepacked=True)
                    medians[name].append(statistics.median(m.samples_s) * 1e3)
            g = plan.gemm
            row = dict(layer=dict(c=c, hw=hw_px, k=k), tile=f"{g.mr}x{g.nr}", kc=g.kc,
                       column_panels=-(-k // g.nr),
                       in_place_ms=min(medians["in_place"]), packed_ms=min(medians["packed"]),
                       round_medians_ms=medians,
                       predicted_ms={("in_place" if key == "im2col_direct" else key): v * 1e3
                                     for key, v in predicted.items()},
                       chosen=dict(lowering=chosen.lowering, a_pack=chosen.gemm.a_pack if chosen.gemm else None,
                                   tiles=f"{chosen.gemm.mr}x{chosen.gemm.nr} kc={chosen.gemm.kc}" if chosen.gemm else None))
            row["packed_speedup"] = row["in_place_ms"] / row["packed_ms"]
            rows.append(row)
            pred = row["predicted_ms"]
            print(f"{c:5d} {hw_px:3d} {k:5d}  {row['tile']:>5} kc={g.kc:<4d} in place {row['in_place_ms']:.3f} ms"
                  f"  packed {row['packed_ms']:.3f} ms  ({row['packed_speedup']:.2f}x)"
                  f"  model {pred.get('in_place', float('nan')):.3f} / {pred.get('packed', float('nan')):.3f}"
                  f"  chosen {chosen.lowering} {row['chosen']['a_pack']} {row['chosen']['tiles']}", flush=True)
    out = write_json_result(Path(args.out), dict(
        machine=machine_facts(), threads=args.threads, rounds=args.rounds, repeats=args.repeats,
        command=" ".join(["benchmarks/pointwise_a.py"] + (argv if argv is not None else sys.argv[1:])),
        how="both plans built from the first transposed candidate (same tile, KC, MC, NC), verified, timed "
            "interleaved with the weights pre-packed; each figure is the lowest of the rounds' medians",
        rows=rows), kind="pointwise-a")
    print(f"-> {args.out}")
    return 0 if out else 1


if __name__ == "__main__":
    sys.exit(main())
