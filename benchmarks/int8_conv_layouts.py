#!/usr/bin/env python3
"""int8 conv2d column layouts and depthwise layouts on this host: the planner's choice against each forced.

For ResNet-18's four 3x3 stride-1 stages, its stride-2 convolutions (3x3 and the 1x1 shortcuts, the
7x7 stem), MobileNetV2's 1x1 convolutions at 56x56, 14x14 and 7x7 (expansions and projections) and its
3x3 stride-2 stem, each
kernel is planned five or six ways (the planner's choice; force_layout='rows'; 'flat' for stride 1,
and 'flat_both_pads': flat rows staged with both side paddings, as before one padding run served
both; 'im2col' for stride 2; 'channels': the GEMM turned around, output channels in the lanes, its
row tiles read in place from the staged input, and 'channels_gathered': the same with the rows gathered
into panels per call, as before session 59),
built, verified byte for byte against the exact reference and timed with weights pre-packed in
its C timing loop, 1 thread, best of --rounds medians (rounds interleave the variants). Kernel
figures, not whole networks (benchmarks/net_bench.py --quantize measures those).
With --op depthwise: MobileNetV2's ten depthwise layers and MobileNetV3-style ones (5x5, channel counts
off a multiple of 16), each planned as the planner chooses, 'tap_pairs' (planes of int16 tap pairs) and
'channels' (16 channels in the lanes; needs avx512vbmi), uint8 activations with a zero point of 128,
bias and ReLU6.

    .venv/bin/python benchmarks/int8_conv_layouts.py [--op conv2d|depthwise] [--rounds 3] [--only LAYER,...]
                                                     [--threads 1] [--out-name NAME]

writes benchmarks/results/int8_conv_layouts.json or NAME (the machine named), with the planner's regret
per layer (how much slower its choice ran than the fastest variant of the same run) and its mean and max.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from machine import machine_facts  # noqa: E402
from xfc.ops.workloads import MOBILENETV2_DEPTHWISE  # noqa: E402

LAYERS = {   # name -> (h = w, c, k, r = s, pad, stride)
    "r18_56x56_c64": (56, 64, 64, 3, 1, 1),
    "r18_28x28_c128": (28, 128, 128, 3, 1, 1),
    "r18_14x14_c256": (14, 256, 256, 3, 1, 1),
    "r18_7x7_c512": (7, 512, 512, 3, 1, 1),
    "r18_stem_7x7_s2": (224, 3, 64, 7, 3, 2),
    "r18_56_to_28_s2": (56, 64, 128, 3, 1, 2),
    "r18_28_to_14_s2": (28, 128, 256, 3, 1, 2),
    "r18_14_to_7_s2": (14, 256, 512, 3, 1, 2),
    "r18_shortcut_56_to_28_1x1_s2": (56, 64, 128, 1, 0, 2),
    "r18_shortcut_28_to_14_1x1_s2": (28, 128, 256, 1, 0, 2),
    "r18_shortcut_14_to_7_1x1_s2": (14, 256, 512, 1, 0, 2),
    "mbv2_stem_3x3_s2": (224, 3, 32, 3, 1, 2),
    "mbv2_56x56_1x1_c24_k144": (56, 24, 144, 1, 0, 1),
    # MobileNetV2's projections: few output channels, so staging the input is a large share
    "mbv2_56x56_1x1_c144_k24": (56, 144, 24, 1, 0, 1),
    "mbv2_28x28_1x1_c192_k32": (28, 192, 32, 1, 0, 1),
    "mbv2_14x14_1x1_c576_k96": (14, 576, 96, 1, 0, 1),
    "mbv2_14x14_1x1_c96_k576": (14, 96, 576, 1, 0, 1),
    "mbv2_7x7_1x1_c320_k1280": (7, 320, 1280, 1, 0, 1),
    "mbv2_7x7_1x1_c960_k160": (7, 960, 160, 1, 0, 1),
    "mbv2_7x7_1x1_c160_k960": (7, 160, 960, 1, 0, 1),
}
VARIANTS = {1: {"planner": {}, "rows": {"force_layout": "rows"}, "flat": {"force_layout": "flat"},
                # the flat rows staged with both side paddings (before one padding run served both)
                "flat_both_pads": {"force_layout": "flat", "flat_padding": "both"},
                "channels": {"force_layout": "channels", "force_channels_rows": "in_place"},
                "channels_gathered": {"force_layout": "channels", "force_channels_rows": "gathered"}},
            2: {"planner": {}, "rows": {"force_layout": "rows"}, "im2col": {"force_layout": "im2col"},
                "channels": {"force_layout": "channels", "force_channels_rows": "in_place"},
                "channels_gathered": {"force_layout": "channels", "force_channels_rows": "gathered"}}}
DEPTHWISE_LAYERS = {   # name -> (h = w, c, r = s, pad, stride): MobileNetV2's (xfc.ops.workloads) and V3-style
    **{name.replace("dw_", ""): (shape["h"], shape["c"], shape["r"], kw["pad"], kw["stride"])
       for name, (_op, shape, kw) in MOBILENETV2_DEPTHWISE.items()},
    "mbv3_c72_28_s1_5x5": (28, 72, 5, 2, 1),
    "mbv3_c120_28_s1_5x5": (28, 120, 5, 2, 1),
    "mbv3_c200_14_s1": (14, 200, 3, 1, 1),
    "mbv3_c184_14_s1": (14, 184, 3, 1, 1),
    "mbv3_c672_14_s2_5x5": (14, 672, 5, 2, 2),
    "mbv3_c960_7_s1_5x5": (7, 960, 5, 2, 1),
}
DEPTHWISE_VARIANTS = {"planner": {}, "tap_pairs": {"force_layout": "tap_pairs"},
                      "channels": {"force_layout": "channels"}}
REPEAT = 50


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", choices=("conv2d", "depthwise"), default="conv2d")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated layer names (default: all): "
                                                   + ", ".join([*LAYERS, *DEPTHWISE_LAYERS]))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out-name", default=None, help="the results file's name in --results (default "
                                                         "int8_conv_layouts.json, --op depthwise: int8_dw_layouts.json)")
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--regret-of", type=Path, metavar="FILE",
                        help="time nothing: print the planner's regret in FILE, a results file this tool wrote")
    args = parser.parse_args(argv)
    if args.regret_of:
        return print_regret(args.regret_of)
    layers = LAYERS if args.op == "conv2d" else DEPTHWISE_LAYERS
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in only if name not in layers]
    if unknown:
        print(f"int8-conv-layouts: --only: no {args.op} layer {', '.join(unknown)} (layers: {', '.join(layers)})",
              file=sys.stderr)
        return 2
    if args.threads < 1:
        print(f"int8-conv-layouts: --threads must be >= 1, got {args.threads}", file=sys.stderr)
        return 2
    out_name = args.out_name or ("int8_conv_layouts.json" if args.op == "conv2d" else "int8_dw_layouts.json")
    from xfc.cpu.int8_synth import plan_int8
    from xfc.errors import XfcError
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
        for name, geometry in layers.items():
            if only and name not in only:
                continue
            if args.op == "conv2d":
                size, c, k, r, pad, stride = geometry
                spec = make_spec("conv2d", dict(n=1, c=c, h=size, w=size, k=k, r=r, s=r), pad=(pad,) * 4,
                                 stride=(stride, stride), bias=True)
                variants = VARIANTS[stride]
            else:
                size, c, r, pad, stride = geometry
                spec = make_spec("depthwise", dict(n=1, c=c, h=size, w=size, r=r, s=r), pad=(pad,) * 4,
                                 stride=(stride, stride), bias=True, activation="relu6")
                variants = DEPTHWISE_VARIANTS
            for variant, forced in variants.items():
                try:
                    plan = plan_int8(spec, QuantParams(a_zero_point=128), hw,
                                     threads=args.threads, host_flags=flags, **forced)
                except XfcError as exc:      # a layout this machine cannot run (channels without avx512vbmi)
                    print(f"{name:28s} {variant:14s} not planned: {exc}", file=sys.stderr)
                    continue
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
        layout = plan.column_layout if args.op == "conv2d" else plan.depthwise_layout
        if plan.channels_rows_in_place:
            layout += " in place"
        rows.append({"layer": name, "variant": variant, "layout": layout, "dialect": plan.dialect,
                     "tile": [plan.mr, plan.nr], "verified": ok, "gops": round(best[(name, variant)], 1),
                     "us": round(plan.spec.flops / best[(name, variant)] / 1e3, 2) if best[(name, variant)] else None,
                     "spec": plan.spec.describe()})
        print(f"{name:28s} {variant:14s} {layout:9s} {plan.dialect:6s} {plan.mr:2d}x{plan.nr:<3d} "
              f"{'ok' if ok else 'WRONG'} {best[(name, variant)]:7.1f} GOP/s")
    regret = planner_regret(rows)
    show_regret(regret)
    out = args.results / out_name
    write_json_result(out, {"benchmark": f"int8 {args.op} layouts, kernel with pre-packed weights, C timing loop, "
                                         f"{args.threads} thread(s), best of the round medians",
                            "machine": machine_facts(), "rounds": args.rounds, "threads": args.threads,
                            "planner_regret": regret, "rows": rows,
                            "command": "benchmarks/int8_conv_layouts.py "
                                       + " ".join(argv if argv is not None else sys.argv[1:])},
                      kind="int8-conv-layouts")
    print(f"-> {out}")
    return 0 if all(r["verified"] for r in rows) else 1


def show_regret(regret: dict) -> None:
    for r in regret["layers"]:
        if r["regret"] > 0:
            print(f"planner regret {r['layer']:28s} {r['regret']:6.1%}  (planner {r['planner_gops']:.1f}, "
                  f"{r['best_variant']} {r['best_gops']:.1f} GOP/s)")
    print(f"planner regret over {len(regret['layers'])} layers: mean {regret['mean']:.1%}, max {regret['max']:.1%}")


def print_regret(path: Path) -> int:
    """--regret-of FILE: the planner's regret in a results file written by this tool (older files too)."""
    try:
        data = json.loads(path.read_text())
        rows = data["rows"]
    except (OSError, ValueError, KeyError) as exc:
        print(f"int8-conv-layouts: --regret-of {path}: not a results file of this tool ({exc})", file=sys.stderr)
        return 2
    show_regret(planner_regret(rows))
    return 0


def planner_regret(rows: list[dict]) -> dict:
    """Per layer, how much slower the planner's variant ran than the fastest variant of the same run
    (best GOP/s / planner GOP/s - 1; 0 where the planner's was the fastest), and the mean and max."""
    layers = []
    for name in dict.fromkeys(r["layer"] for r in rows):
        mine = [r for r in rows if r["layer"] == name]
        planner = next((r for r in mine if r["variant"] == "planner"), None)
        if planner is None or not planner["gops"]:
            continue
        best = max(mine, key=lambda r: r["gops"])
        layers.append({"layer": name, "planner_gops": planner["gops"], "best_variant": best["variant"],
                       "best_gops": best["gops"], "regret": round(max(0.0, best["gops"] / planner["gops"] - 1), 4)})
    regrets = [r["regret"] for r in layers] or [0.0]
    return {"layers": layers, "mean": round(sum(regrets) / len(regrets), 4), "max": max(regrets)}


if __name__ == "__main__":
    sys.exit(main())
