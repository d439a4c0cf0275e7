#!/usr/bin/env python3
"""int8 conv2d column layouts on this host: the planner's choice against each layout forced.

For ResNet-18's four 3x3 stride-1 stages, its stride-2 convolutions (3x3 and the 1x1 shortcuts, the
7x7 stem), MobileNetV2's 1x1 convolutions at 56x56, 14x14 and 7x7 (expansions and projections) and its
3x3 stride-2 stem, each
kernel is planned four or five ways (the planner's choice; force_layout='rows'; 'flat' for stride 1,
and 'flat_both_pads': flat rows staged with both side paddings, as before one padding run served
both; 'im2col' for stride 2; 'channels': the GEMM turned around, output channels in the lanes),
built, verified byte for byte against the exact reference and timed with weights pre-packed in
its C timing loop, 1 thread, best of --rounds medians (rounds interleave the variants). Kernel
figures, not whole networks (benchmarks/net_bench.py --quantize measures those).

    .venv/bin/python benchmarks/int8_conv_layouts.py [--rounds 3] [--only LAYER,...] [--out-name NAME]

writes benchmarks/results/int8_conv_layouts.json or NAME (the machine named).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from machine import machine_facts  # noqa: E402

LAYERS = {   # name -> (h = w, c, k, r = s, pad, stride)
    "r18_56x56_c64": (56, 64, 64, 3, 1, 1),
    "r18_28x28_c128": (28, 128, 128, 3, 1, 1),
    "r18_14x14_c256": (14, 256, 256, 3, 1, 1),
    "r18_7x7_c512": (7, 512, 512, 3, 1, 1),
    "r18_stem_7x7_s2": (224, 3, 64, 7, 3, 2),
    "r18_56_to_28_s2": (56, 64, 128, 3, 1, 2),
    "r18_28_to_14_s2": (28, 128, 256, 3, 1, 2),
    "r18_14_to_7_s2": (14, 256, 512, 3, 1, 2),
    "r18_shortcut_14_to_7_1x1_s2": (14, 256, 512, 1, 0, 2),
    "mbv2_stem_3x3_s2": (224, 3, 32, 3, 1, 2),
    "mbv2_56x56_1x1_c24_k144": (56, 24, 144, 1, 0, 1),
    # MobileNetV2's projections: few output channels, so staging the input is a large share
    "mbv2_56x56_1x1_c144_k24": (56, 144, 24, 1, 0, 1),
    "mbv2_28x28_1x1_c192_k32": (28, 192, 32, 1, 0, 1),
    "mbv2_14x14_1x1_c576_k96": (14, 576, 96, 1, 0, 1),
    "mbv2_14x14_1x1_c96_k576": (14, 96, 576, 1, 0, 1),
    "mbv2_7x7_1x1_c320_k1280": (7, 320, 1280, 1, 0, 1),
}
VARIANTS = {1: {"planner": {}, "rows": {"force_layout": "rows"}, "flat": {"force_layout": "flat"},
                # the flat rows staged with both side paddings (before one padding run served both)
                "flat_both_pads": {"force_layout": "flat", "flat_padding": "both"},
                "channels": {"force_layout": "channels"}},
            2: {"planner": {}, "rows": {"force_layout": "rows"}, "im2col": {"force_layout": "im2col"},
                "channels": {"force_layout": "channels"}}}
REPEAT = 50


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated layer names (default: all): " + ", ".join(LAYERS))
    parser.add_argument("--out-name", default="int8_conv_layouts.json", help="the results file's name in --results")
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in only if name not in LAYERS]
    if unknown:
        print(f"int8-conv-layouts: --only: no layer {', '.join(unknown)} (layers: {', '.join(LAYERS)})",
              file=sys.stderr)
        return 2
    from xfc.cpu.int8_synth import plan_int8
    from xfc.hardware.host import read_flags
    from xfc.ops.dtypes import INT8, make_operands
    from xfc.ops.quant import QuantParams
    from xfc.ops.spec import make_spec
    from xfc.outputs import write_json_result
    from xfc.pipeline import stages
    from xfc.tiledb.hostdesc import load_hardware
    hw = load_hardware("host", os.environ)
    flags = frozenset(read_flags())
    built, rows = {}, []
    with tempfile.TemporaryDirectory(prefix="xfc-int8-layouts-") as tmp:
        for name, (size, c, k, r, pad, stride) in LAYERS.items():
            if only and name not in only:
                continue
            spec = make_spec("conv2d", dict(n=1, c=c, h=size, w=size, k=k, r=r, s=r), pad=(pad,) * 4,
                             stride=(stride, stride), bias=True)
            for variant, forced in VARIANTS[stride].items():
                plan = plan_int8(spec, QuantParams(a_zero_point=128), hw, threads=1, host_flags=flags, **forced)
                kernel = stages.realize(plan, Path(tmp) / f"{name}_{variant}")
                operands = make_operands(spec, INT8, seed=0, quant=plan.quant)
                ok = stages.verify(kernel, operands).ok
                built[(name, variant)] = (plan, kernel, operands, ok)
        best = {key: 0.0 for key in built}
        for round_index in range(args.rounds):
            for key, (plan, kernel, operands, ok) in built.items():
                m = stages.run(kernel, operands, prepacked=True, repeat=REPEAT, warmup=5)
                best[key] = max(best[key], m.gflops)
            print(f"[int8-conv-layouts] round {round_index + 1} of {args.rounds}", file=sys.stderr, flush=True)
    for (name, variant), (plan, _kernel, _operands, ok) in built.items():
        rows.append({"layer": name, "variant": variant, "column_layout": plan.column_layout, "dialect": plan.dialect,
                     "tile": [plan.mr, plan.nr], "verified": ok, "gops": round(best[(name, variant)], 1),
                     "spec": plan.spec.describe()})
        print(f"{name:28s} {variant:14s} {plan.column_layout:8s} {plan.dialect:6s} {plan.mr:2d}x{plan.nr:<3d} "
              f"{'ok' if ok else 'WRONG'} {best[(name, variant)]:7.1f} GOP/s")
    out = args.results / args.out_name
    write_json_result(out, {"benchmark": "int8 conv2d column layouts, kernel with pre-packed weights, C timing loop, "
                                         "1 thread, best of the round medians",
                            "machine": machine_facts(), "rounds": args.rounds, "rows": rows,
                            "command": "benchmarks/int8_conv_layouts.py "
                                       + " ".join(argv if argv is not None else sys.argv[1:])},
                      kind="int8-conv-layouts")
    print(f"-> {out}")
    return 0 if all(r["verified"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
