#!/usr/bin/env python3
"""How far the int8 planner's model is from the kernels it ranks, tile by tile, on this host.

For each layer (benchmarks/int8_conv_layouts.py's table) and each conv2d column layout the planner
scores ('flat' or 'rows', 'channels' with its rows read in place), a handful of register tiles are
forced, built, verified byte for byte and timed with weights pre-packed in their C timing loop, 1 thread,
best of --rounds medians (rounds interleave the kernels). Each row sets the modelled time beside the
measured one: a layout whose ratio (modelled / measured) sits well below the others' is one the
planner over-rates, whatever the layer. Kernel figures, not whole networks.

    .venv/bin/python benchmarks/int8_tile_model.py [--only LAYER,...] [--rounds 3] [--out-name NAME]

writes benchmarks/results/int8_tile_model.json or NAME (the machine named).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from int8_conv_layouts import LAYERS  # noqa: E402
from machine import machine_facts  # noqa: E402

DEFAULT_LAYERS = ("r18_56x56_c64", "r18_14x14_c256", "mbv2_56x56_1x1_c24_k144", "mbv2_14x14_1x1_c96_k576",
                  "mbv2_14x14_1x1_c576_k96", "mbv2_7x7_1x1_c960_k160")
TILES = ((4, 4), (8, 3), (8, 2), (12, 2), (14, 2), (7, 2), (16, 1))   # (MR, vectors)
REPEAT = 50


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(DEFAULT_LAYERS),
                        help="comma-separated layer names (benchmarks/int8_conv_layouts.py's; default: "
                             + ", ".join(DEFAULT_LAYERS) + ")")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out-name", default="int8_tile_model.json")
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in only if name not in LAYERS]
    if unknown or args.rounds < 1:
        print(f"int8-tile-model: {'unknown layer ' + ', '.join(unknown) if unknown else '--rounds must be >= 1'} "
              f"(layers: {', '.join(LAYERS)})", file=sys.stderr)
        return 2
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
    built = {}
    with tempfile.TemporaryDirectory(prefix="xfc-int8-tile-model-") as tmp:
        for name in only:
            size, c, k, r, pad, stride = LAYERS[name]
            spec = make_spec("conv2d", dict(n=1, c=c, h=size, w=size, k=k, r=r, s=r), pad=(pad,) * 4,
                             stride=(stride, stride), bias=True)
            vector_layouts = ("flat",) if stride == 1 else ("rows",)
            for layout in (*vector_layouts, "channels"):
                for tile in TILES:
                    forced = dict(force_layout=layout, force_tile=tile)
                    if layout == "channels":
                        forced["force_channels_rows"] = "in_place"
                    try:
                        plan = plan_int8(spec, QuantParams(a_zero_point=128), hw, threads=1, host_flags=flags, **forced)
                    except XfcError:
                        continue      # a tile this core's registers cannot hold
                    kernel = stages.realize(plan, Path(tmp) / f"{name}_{layout}_{tile[0]}x{tile[1]}")
                    operands = make_operands(spec, INT8, seed=0, quant=plan.quant)
                    ok = stages.verify(kernel, operands).ok
                    built[(name, layout, tile)] = (plan, kernel, operands, ok)
        best = {key: 0.0 for key in built}
        for round_index in range(args.rounds):
            for key, (plan, kernel, operands, ok) in built.items():
                best[key] = max(best[key], stages.run(kernel, operands, prepacked=True, repeat=REPEAT, warmup=5).gflops)
            print(f"[int8-tile-model] round {round_index + 1} of {args.rounds}", file=sys.stderr, flush=True)
    rows = []
    for (name, layout, tile), (plan, _kernel, _operands, ok) in built.items():
        measured_us = plan.spec.flops / best[(name, layout, tile)] / 1e3
        modelled_us = plan.spec.flops / plan.predicted_gops / 1e3
        rows.append({"layer": name, "layout": layout, "tile": [plan.mr, plan.nr], "verified": ok,
                     "measured_us": round(measured_us, 2), "modelled_us": round(modelled_us, 2),
                     "model_over_measured": round(modelled_us / measured_us, 3), "spec": plan.spec.describe()})
        print(f"{name:26s} {layout:9s} {plan.mr:2d}x{plan.nr:<3d} {'ok' if ok else 'WRONG'} measured "
              f"{measured_us:8.1f} us  modelled {modelled_us:8.1f} us  ratio {modelled_us / measured_us:.2f}")
    summary = {}
    for layout in sorted({row["layout"] for row in rows}):
        ratios = [row["model_over_measured"] for row in rows if row["layout"] == layout]
        summary[layout] = {"median_ratio": round(statistics.median(ratios), 3), "min_ratio": min(ratios),
                           "max_ratio": max(ratios), "kernels": len(ratios)}
        print(f"{layout:9s} modelled / measured: median {summary[layout]['median_ratio']:.2f}, "
              f"{min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} kernels")
    out = args.results / args.out_name
    write_json_result(out, {"benchmark": "int8_tile_model", "machine": machine_facts(), "rounds": args.rounds,
                            "threads": 1, "rows": rows, "summary": summary,
                            "command": "benchmarks/int8_tile_model.py " + " ".join(argv if argv is not None
                                                                                   else sys.argv[1:])},
                      kind="int8-tile-model")
    print(f"-> {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")
    return 0 if all(row["verified"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
