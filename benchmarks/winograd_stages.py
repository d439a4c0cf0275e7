#!/usr/bin/env python3
"""Winograd plans stage by stage on this host: each tile size's plan (forced, as benchmarks/winograd.py
builds it) timed whole and with only one of its stages running (input transform, GEMMs, output
transform), next to the cost model's figure for that stage. This is how the stage terms of the model
were checked (docs/winograd.md); a stage far from its figure is where the model or the kernel is
wrong.

    .venv/bin/python benchmarks/winograd_stages.py                          # every layer, 1 thread
    .venv/bin/python benchmarks/winograd_stages.py --only vgg_4,r18_l3 --threads 1,2 --m 4,6
    .venv/bin/python benchmarks/winograd_stages.py --only tiny --rounds 1   # smoke run

The stage builds define XFC_WINO_STAGES (templates/cpu/winograd*.c.j2) to skip the other stages;
their output is not the convolution, so only the whole kernel is verified (both entry points,
against the float64 reference under its derived bound). Times are medians of --repeats calls with
the weights pre-packed, the best of --rounds interleaved rounds. A stage alone runs with its inputs
wherever the previous call left them, so the stages need not add up to the whole: the difference
is what they cost each other (tiles written by one stage and read by the next). The model's
"traffic" is its tile-traffic term, charged only in part (winograd_traffic_exposed).

Output: a table and benchmarks/results/winograd_stages.json (with the machine's facts).
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # BLAS only checks the result here

import argparse  # noqa: E402
import tempfile  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_cpu  # noqa: E402
from machine import machine_facts  # noqa: E402
from winograd import ALL, OPTS, layer_names  # noqa: E402
from xfc.errors import XfcError  # noqa: E402
from xfc.ops.reference import check_output, make_inputs  # noqa: E402
from xfc.ops.spec import make_spec  # noqa: E402
from xfc.ops.winograd import admissible_tile_sizes  # noqa: E402

# the cost model's part for each stage (winograd.WinogradStages.parts)
MODEL_PARTS = {"input": "input transform", "gemms": "GEMMs", "output": "output transform"}


def build(spec, m: int, threads: int, hw, root: Path, evaluator, constants, vectors) -> dict:
    """label -> loaded kernel, for the plan synthesized with tile size m; the whole one verified."""
    from xfc.pipeline import stages
    from xfc.cpu.codegen import render_cpu_kernel
    from xfc.cpu.synth import synthesize_cpu
    from xfc.cpu.winograd import STAGE_BITS, stage_only_source
    synthesis = synthesize_cpu(spec, hw, threads=threads, evaluator=evaluator, constants=constants,
                               lowering="winograd", winograd_m=m, winograd_vectors=vectors)
    rendered = render_cpu_kernel(synthesis.plan)
    kernels = {}
    for label in STAGE_BITS:
        variant = replace(rendered, source=stage_only_source(rendered.source, label))
        kernels[label] = stages.build(variant, root / label).host   # the chain's host build
    a, b, bias = make_inputs(spec)
    whole = kernels["whole"]
    verdicts = [check_output(spec, out, a, b, bias, winograd_m=m)
                for out in (whole(a, b, bias), whole.run_packed(a, whole.prepack(b), bias))]
    if not all(v.ok for v in verdicts):
        raise XfcError(f"winograd_stages: {spec.describe()} m={m}: the whole kernel differs from the reference")
    return {"synthesis": synthesis, "kernels": kernels}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated layers of benchmarks/winograd.py (default: all)")
    ap.add_argument("--threads", default="1", help="comma-separated thread counts (default 1)")
    ap.add_argument("--m", default="", help="comma-separated tile sizes (default: every admissible one)")
    ap.add_argument("--vectors", choices=("auto", "tiles", "channels"), default="auto",
                    help="the plans' vector axis (default: the synthesizer's choice)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=15, help="timed calls per kernel per round")
    ap.add_argument("--tile-db", default="auto", help="as `xfc synth --tile-db` (default auto)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "winograd_stages.json"))
    args = ap.parse_args(argv)
    names = layer_names(ap, args.only)
    try:
        thread_counts = [int(t) for t in args.threads.split(",")]
        sizes = [int(m) for m in args.m.split(",") if m]
    except ValueError:
        ap.error("--threads and --m take comma-separated integers")
    if any(t < 1 for t in thread_counts):
        ap.error("--threads: counts start at 1")

    from xfc.cpu.cost_model import DEFAULT_CONSTANTS
    from xfc.outputs import claim_file, json_is_ours, write_json_result
    from xfc.tiledb.hostdesc import load_hardware
    say = (lambda msg: print(msg, file=sys.stderr, flush=True))
    try:
        claim_file(Path(args.out), json_is_ours(), option="--out")
        hw = load_hardware("host", os.environ, warn=lambda m: say(f"winograd_stages: {m}"))
    except XfcError as exc:
        print(f"winograd_stages: error: {exc}", file=sys.stderr)
        return 2
    evaluator, constants, tile_db = bench_cpu.synthesis_inputs(args.tile_db, hw, say)
    constants = constants or DEFAULT_CONSTANTS
    vectors = None if args.vectors == "auto" else args.vectors
    build_dir = tempfile.TemporaryDirectory(prefix="xfc-bench-winograd-stages-")
    cases = []
    try:
        for name in names:
            spec = make_spec("conv2d", ALL[name][0], **OPTS)
            admissible = admissible_tile_sizes(spec.c)
            for m in sizes or admissible:
                if m not in admissible:
                    say(f"winograd_stages: {name}: m={m} is not admissible at C={spec.c}; skipped")
                    continue
                for t in thread_counts:
                    say(f"building {name} m={m} {t}T ...")
                    built = build(spec, m, t, hw, Path(build_dir.name) / f"{name}_m{m}_t{t}", evaluator, constants,
                                  vectors)
                    cases.append(dict(name=name, spec=spec, m=m, threads=t, **built))
        best: dict = {}
        for round_no in range(1, max(1, args.rounds) + 1):
            say(f"[round {round_no}/{args.rounds}] timing {len(cases)} plans, each whole and stage by stage ...")
            for index, case in enumerate(cases):
                a, b, bias = make_inputs(case["spec"])
                for label, kernel in case["kernels"].items():
                    seconds = kernel.time(a, b, bias, repeats=args.repeats, warmup=bench_cpu.WARMUP,
                                          prepacked=True).median_s
                    best[(index, label)] = min(best.get((index, label), seconds), seconds)
    except XfcError as exc:
        print(f"winograd_stages: error: {exc}", file=sys.stderr)
        return 2
    finally:
        build_dir.cleanup()

    rows = []
    for index, case in enumerate(cases):
        estimate = case["synthesis"].estimate
        parts = dict(estimate.seconds_by_bound)
        plan = case["synthesis"].plan
        g = plan.gemm
        rows.append({
            "layer": case["name"], "shape": case["spec"].describe(), "m": case["m"], "threads": case["threads"],
            "plan": f"vectors={plan.winograd_vectors} {g.mr}x{g.nr} kc={g.kc} mc={g.mc} nc={g.nc} split={g.parallel_axis}",
            "measured_ms": {label: best[(index, label)] * 1e3 for label in case["kernels"]},
            "model_ms": {"whole": estimate.predicted_s * 1e3, **{label: parts[part] * 1e3 for label, part in
                                                                MODEL_PARTS.items()},
                         "traffic": parts["tile traffic"] * 1e3},
        })
    print("milliseconds, measured / model; 'alone': the sum of the three stages timed alone")
    print(f"{'layer':<8} {'m':>2} {'T':>2}  {'whole':>15} {'input':>15} {'gemms':>15} {'output':>15} {'alone':>7} "
          f"{'traffic':>7}  plan")
    for r in rows:
        meas, model = r["measured_ms"], r["model_ms"]
        cells = " ".join(f"{meas[k]:>7.3f}/{model[k]:<7.3f}" for k in ("whole", *MODEL_PARTS))
        alone = sum(meas[k] for k in MODEL_PARTS)
        print(f"{r['layer']:<8} {r['m']:>2} {r['threads']:>2}  {cells} {alone:>7.3f} {model['traffic']:>7.3f}  {r['plan']}")
    write_json_result(Path(args.out), {"machine": machine_facts(), "tile_db": tile_db, "rounds": args.rounds,
                                       "repeats": args.repeats, "vectors": args.vectors, "rows": rows},
                      kind="winograd_stages")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
