#!/usr/bin/env python3
"""One 3x3 layer's Winograd plan in several GEMM-stage variants (register tile, KC, next-panel
prefetch), each built, verified and timed with its weights hot and cold, next to the cost model's
figure for each: how a model term for the cold stream is checked before it is written.

    .venv/bin/python benchmarks/winograd_variants.py --layer conv_r18_l3 \\
        --variant 6x64:kc=256 --variant 6x64:kc=128 --variant 6x64:kc=256:pf=0

The layers are benchmarks/regret.py's (FITTING and HELD_OUT), or a 3x3 layer given by its shape
(conv2d:c=16,h=14,w=14,k=40,r=3,s=3). The base plan is the one xfc plans
for the layer with its weights read from memory on every call (synthesize_cpu(weights_from_memory=
True), as `xfc model` plans a network whose weights pass the shared cache), at --m and --vectors
when given; a variant changes its register tile MRxNR and, optionally, KC (kc=) and the next-panel
prefetch (pf=: cache lines per unrolled k step, 0 = off; default: as the planner decides it for
that schedule, winograd.u_prefetch_lines). The row tiles per block stay as many as the base plan's.
Timing: interleaved rounds, each round timing every variant with its packed weights evicted from
the caches before each call (cold) and left where the call before left them (hot); each keeps
its fastest run. Output: a table and benchmarks/results/<--out-name> (JSON naming the machine).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from xfc.cpu import winograd
from xfc.cpu.codegen import render_cpu_kernel
from xfc.cpu.synth import synthesize_cpu
from xfc.errors import XfcError
from xfc.ops.reference import check_output, make_inputs
from xfc.outputs import write_json_result
from xfc.pipeline import stages
from xfc.tiledb.evaluators import synthesis_inputs
from xfc.tiledb.hostdesc import load_hardware
from machine import machine_facts, warn_if_loaded
import regret

REPO = Path(__file__).resolve().parent.parent


def parse_variant(text: str) -> dict:
    """'MRxNR[:kc=K][:pf=N]' -> dict(mr, nr, kc or None, pf or None); ValueError naming the part."""
    head, *options = text.split(":")
    mr, sep, nr = head.partition("x")
    if not sep or not mr.isdigit() or not nr.isdigit():
        raise ValueError(f"variant {text!r}: expected MRxNR first (e.g. 6x64)")
    out = dict(mr=int(mr), nr=int(nr), kc=None, pf=None)
    for option in options:
        name, sep, value = option.partition("=")
        if name not in ("kc", "pf") or not sep or not value.isdigit():
            raise ValueError(f"variant {text!r}: option {option!r} is not kc=N or pf=N")
        out[name] = int(value)
    return out


def variant_plan(base, cluster, variant: dict):
    """base with the variant's register tile, KC and prefetch; None where it is not a tile."""
    plan = regret._with_tile(base, cluster.core, variant["mr"], variant["nr"], variant["kc"] or base.gemm.kc)
    if plan is None:
        return None
    lines = variant["pf"]
    if lines and plan.gemm.ukernel != "intrinsics":
        raise ValueError(f"variant {variant['mr']}x{variant['nr']}: its K loop is the {plan.gemm.ukernel} one, "
                         "which does not prefetch (pf= needs the intrinsics loop)")
    if lines is None:
        return winograd.with_planned_prefetch(plan)
    return replace(plan, gemm=replace(plan.gemm, prefetch_next_panel_lines=lines))


def main(argv=None) -> int:
    layers = {**regret.FITTING, **regret.HELD_OUT}
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layer", required=True, metavar="NAME|conv2d:c=..,h=..,w=..,k=..,r=3,s=3",
                    help=f"one of {', '.join(sorted(layers))}, or a 3x3 layer's shape (regret.py --layer)")
    ap.add_argument("--variant", action="append", required=True, metavar="MRxNR[:kc=K][:pf=N]")
    ap.add_argument("--m", type=int, default=None, help="Winograd tile size (default: the planner's)")
    ap.add_argument("--vectors", choices=winograd.VECTOR_AXES, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=9, help="timed calls per variant per round")
    ap.add_argument("--out-name", default="winograd_variants.json")
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    try:
        variants = [parse_variant(v) for v in args.variant]
        if args.layer not in layers and ":" not in args.layer:
            raise ValueError(f"--layer {args.layer!r}: not one of regret.py's layers ({', '.join(sorted(layers))}) "
                             f"nor a shape such as conv2d:c=16,h=14,w=14,k=40,r=3,s=3")
        if args.layer not in layers:
            layers.update(regret.winograd_layers_from([args.layer]))
    except (ValueError, XfcError) as exc:
        ap.error(str(exc))
    say = lambda m: print(f"winograd_variants: {m}", file=sys.stderr, flush=True)  # noqa: E731
    hw = load_hardware("host", os.environ, warn=say)
    cluster = hw.cluster()
    evaluator, constants, entry = synthesis_inputs("auto", hw, None, os.environ, say)
    spec = regret.winograd_spec(layers[args.layer])
    try:
        base = synthesize_cpu(spec, hw, threads=args.threads, evaluator=evaluator, constants=constants,
                              lowering=winograd.LOWERING, winograd_m=args.m, winograd_vectors=args.vectors,
                              weights_from_memory=True).plan
    except XfcError as exc:
        print(f"winograd_variants: {exc}", file=sys.stderr)
        return 2
    a, b, bias = make_inputs(spec, seed=0)
    built = []
    with tempfile.TemporaryDirectory(prefix="xfc-wvariants-") as tmp:
        for i, (text, variant) in enumerate(zip(args.variant, variants)):
            try:
                plan = variant_plan(base, cluster, variant)
            except ValueError as exc:
                ap.error(str(exc))
            if plan is None:
                ap.error(f"variant {text!r} is not a register tile here")
            kernel = stages.build(render_cpu_kernel(plan), Path(tmp) / f"v{i}").host
            ok = bool(check_output(spec, kernel(a, b, bias), a, b, bias, winograd_m=plan.winograd_m).ok)
            predicted = {mode: regret.predicted_s(plan, hw, cluster, evaluator, constants, mode == "cold")
                         for mode in ("cold", "hot")}
            built.append(dict(variant=text, plan=plan, kernel=kernel, ok=ok, predicted=predicted,
                              samples={"cold": [], "hot": []}))
        for r in range(args.rounds):
            say(f"round {r + 1}/{args.rounds}: {len(built)} variants, cold and hot")
            for i in regret.round_order(r, len(built)):
                for mode in ("cold", "hot"):
                    m = built[i]["kernel"].time(a, b, bias, repeats=args.repeats, prepacked=True,
                                                cold_weights=mode == "cold")
                    built[i]["samples"][mode].append(min(m.samples_s) * 1e3)
    if evaluator is not None:
        evaluator.close()
    rows = [dict(variant=e["variant"], plan=regret.describe_plan(e["plan"]),
                 prefetch_next_panel_lines=e["plan"].gemm.prefetch_next_panel_lines, verified=e["ok"],
                 predicted_cold_ms=e["predicted"]["cold"] * 1e3, predicted_hot_ms=e["predicted"]["hot"] * 1e3,
                 cold_ms=min(e["samples"]["cold"]), hot_ms=min(e["samples"]["hot"]),
                 cold_rounds_ms=e["samples"]["cold"], hot_rounds_ms=e["samples"]["hot"]) for e in built]
    print(f"{args.layer} {spec.describe()}, {args.threads} thread(s); base plan "
          f"{regret.describe_plan(base)}")
    print(f"{'variant':<22} {'pf':>3} {'model cold':>10} {'cold ms':>8} {'model hot':>9} {'hot ms':>7}  plan")
    for r in rows:
        print(f"{r['variant']:<22} {r['prefetch_next_panel_lines']:>3} {r['predicted_cold_ms']:>10.3f} "
              f"{r['cold_ms']:>8.3f} {r['predicted_hot_ms']:>9.3f} {r['hot_ms']:>7.3f}  {r['plan']}"
              f"{'' if r['verified'] else '  NOT VERIFIED'}")
    warn_if_loaded()
    out = Path(args.results) / args.out_name
    write_json_result(out, dict(machine=dict(machine_facts(), description=hw.marketing_name), host_notes=hw.notes,
                                constants=f"{entry['constants']} ({entry.get('path')})", layer=args.layer,
                                spec=spec.describe(), threads=args.threads, rounds=args.rounds,
                                repeats=args.repeats, base_plan=regret.describe_plan(base), rows=rows,
                                load_average_at_end=os.getloadavg(),
                                command="benchmarks/winograd_variants.py " + " ".join(
                                    argv if argv is not None else sys.argv[1:])), kind="winograd_variants")
    print(f"wrote {out}", file=sys.stderr)
    return 0 if all(r["verified"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
