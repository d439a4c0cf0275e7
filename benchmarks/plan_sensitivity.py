#!/usr/bin/env python3
"""How the plans of the Winograd regret layers move with one figure of the host description.

The probed host's figures (DRAM read, one core's L3 read, the past-L3 gain, the clock) move between
two probes of one machine, and with them any plan near a tie. This plans every layer of
benchmarks/regret.py's Winograd sets (or --only some) at each thread count with one figure scaled by
each factor, as `xfc synth --hw host` plans (--tile-db auto), and prints the chosen plan per factor,
marking the factors at which it differs from the plan at 1. Planning only: nothing is built or timed.

    .venv/bin/python benchmarks/plan_sensitivity.py --figure dram_gbps --scales 0.8,0.9,1,1.1,1.2
    .venv/bin/python benchmarks/plan_sensitivity.py --figure clock_ghz --only r18_l4,yolo_26 --threads 1

Writes benchmarks/results/NAME (default plan_sensitivity.json): the host figures, the scales and a
row per (layer, threads) with the plan at each scale.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

from xfc.cpu.synth import synthesize_cpu
from xfc.outputs import write_json_result
from xfc.tiledb.evaluators import synthesis_inputs
from xfc.tiledb.hostdesc import load_hardware
from machine import host_figures, machine_facts
from regret import LAYER_SETS, describe_plan, winograd_spec

REPO = Path(__file__).resolve().parent.parent
FIGURES = ("dram_gbps", "shared_cache_read_gbps", "l3_overflow_read_speedup", "clock_ghz")


def scaled(hw, figure: str, scale: float):
    """hw with one figure scaled (a figure the description lacks stays absent)."""
    if figure == "dram_gbps":
        return replace(hw, memory=replace(hw.memory, peak_bandwidth_gbps=hw.memory.peak_bandwidth_gbps * scale))
    if figure == "clock_ghz":
        clusters = tuple(replace(c, clock_ghz=c.clock_ghz * scale) for c in hw.clusters)
        return replace(hw, clusters=clusters)
    value = getattr(hw, figure)
    return hw if not value else replace(hw, **{figure: value * scale})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--figure", choices=FIGURES, default="dram_gbps")
    ap.add_argument("--scales", default="0.8,0.9,1,1.1,1.2", help="factors, 1 included (default %(default)s)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--only", default="", help="layer names (default: every layer of both sets)")
    ap.add_argument("--out-name", default="plan_sensitivity.json")
    args = ap.parse_args(argv)
    try:
        scales = sorted({float(s) for s in args.scales.split(",")} | {1.0})
        threads = [int(t) for t in args.threads.split(",")]
    except ValueError:
        ap.error("--scales and --threads take numbers separated by commas")
    say = lambda m: print(f"plan_sensitivity: {m}", file=sys.stderr, flush=True)  # noqa: E731
    hw = load_hardware("host", os.environ, warn=say)
    evaluator, constants, entry = synthesis_inputs("auto", hw, None, os.environ, say)
    layers = {(set_name, name): shape for set_name, layer_set in LAYER_SETS.items() for name, shape in layer_set.items()}
    only = {n for n in args.only.split(",") if n}
    unknown = only - {name for _, name in layers}
    if unknown:
        ap.error(f"--only: no layer {', '.join(sorted(unknown))}")
    rows = []
    print(f"{args.figure} x " + " ".join(f"{s:g}" for s in scales) + f" (at 1: {host_figures(hw).get(args.figure)})")
    for (set_name, name), shape in layers.items():
        if only and name not in only:
            continue
        spec = winograd_spec(shape)
        for t in threads:
            plans = [describe_plan(synthesize_cpu(spec, scaled(hw, args.figure, s), threads=t, evaluator=evaluator,
                                                  constants=constants).plan) for s in scales]
            at_one = plans[scales.index(1.0)]
            moved = [f"{s:g}" for s, p in zip(scales, plans) if p != at_one]
            rows.append(dict(layer=name, set=set_name, threads=t, plan_at_1=at_one, moved_at=moved,
                             plans={f"{s:g}": p for s, p in zip(scales, plans)}))
            print(f"{name:<12} {set_name:<9} {t}T  {at_one:<58} "
                  + (f"moves at x{', x'.join(moved)}" if moved else "no move"))
    out = REPO / "benchmarks" / "results" / args.out_name
    write_json_result(out, dict(machine=dict(machine_facts(), description=hw.marketing_name),
                                host_figures=host_figures(hw), constants=entry.get("constants"), figure=args.figure,
                                scales=scales, rows=rows,
                                command="benchmarks/plan_sensitivity.py " + " ".join(
                                    argv if argv is not None else sys.argv[1:])), kind="plan-sensitivity")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
