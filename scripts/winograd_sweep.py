#!/usr/bin/env python3
"""Random 3x3 stride-1 conv2d shapes through the Winograd lowering, verified under the derived
bound on the host (every host ISA this CPU runs) and under qemu-aarch64 (Cortex-A55, A76, X1
descriptions). `make winograd-sweep` runs 240 cases (issue 19 asks for >= 200).

    .venv/bin/python scripts/winograd_sweep.py [--cases 240] [--seed 19] [--targets host,qemu]
                                               [--out benchmarks/results/winograd_sweep.json]

Each case draws batch 1-2, input/output channels 1-96, H and W 3-40, padding 0, 1 or asymmetric
(0-2 per side), bias and activation, and a tile size m among those admissible for its channels;
it is synthesized with --lowering winograd for that m (host:<isa> or the core's description) and
a vector axis (tiles or channels, alternating round by round over the targets: NEON's synthesizer
does not choose channels itself, so this is where those plans meet random shapes under qemu),
built, run through both entry points (the outputs must agree bitwise) and checked against the
float64 direct reference (xfc.ops.reference.check_winograd_output). Targets and ISAs rotate over
the cases. Output: one JSON row per case and a summary; exit 1 if any case failed. Not a timing.
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from xfc.cpu.synth import synthesize_cpu  # noqa: E402
from xfc.cpu.winograd import VECTOR_AXES  # noqa: E402
from xfc.errors import XfcError  # noqa: E402
from xfc.hardware.host import available_isas  # noqa: E402
from xfc.hardware.load import load  # noqa: E402
from xfc.ops.dtypes import FP32, make_operands  # noqa: E402
from xfc.ops.spec import make_spec  # noqa: E402
from xfc.ops.winograd import admissible_tile_sizes  # noqa: E402
from xfc.outputs import write_json_result  # noqa: E402
from xfc.pipeline import stages  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from machine import machine_facts  # noqa: E402  (the CPU every result was taken on)

QEMU_CORES = ("cortex-a55", "cortex-a76", "cortex-x1")
RUN_TIMEOUT_S = 600


def draw_case(rng: random.Random) -> dict:
    pad = rng.choice([0, 1, "asym"])
    pads = (tuple(rng.randint(0, 2) for _ in range(4)) if pad == "asym" else (pad,) * 4)
    c = rng.choice([1, 3, 4, 7, 8, 15, 16, 17, 31, 32, 33, 48, 64, 65, 96])
    shape = dict(n=rng.randint(1, 2), c=c, h=rng.randint(3, 40), w=rng.randint(3, 40),
                 k=rng.choice([1, 2, 5, 8, 12, 13, 16, 17, 24, 31, 32, 33, 48, 64, 96]), r=3, s=3)
    return dict(shape=shape, pad=pads, bias=rng.random() < 0.5, act=rng.choice(["none", "relu", "relu6"]),
                m=rng.choice(admissible_tile_sizes(c)))


def run_case(case: dict, target: str, work: Path, vectors: str) -> dict:
    spec = make_spec("conv2d", case["shape"], pad=case["pad"], bias=case["bias"], activation=case["act"])
    if spec.out_h < 1 or spec.out_w < 1:
        return {"skipped": "empty output"}
    hw = load(target)
    threads = min(2, hw.cluster().count)
    result = synthesize_cpu(spec, hw, threads=threads, lowering="winograd", winograd_m=case["m"],
                            winograd_vectors=vectors)
    plan = result.plan
    seed = zlib.crc32(repr(sorted(case.items())).encode()) & 0xFFFF
    built = stages.realize(plan, work)        # the chain: a host .so, or the aarch64 harness under qemu
    outcome = stages.verify(built, make_operands(spec, FP32, seed=seed), timeout_s=RUN_TIMEOUT_S)
    outs = [m.output for m in outcome.runs.values()]
    verdict = outcome.check
    return {"spec": spec.describe(), "threads": threads, "vectors": plan.winograd_vectors,
            "tiles": plan.gemm.tiles(), "ukernel": plan.gemm.ukernel,
            "ok": verdict.ok and bool(np.array_equal(outs[0], outs[1])),
            "entry_points_equal": bool(np.array_equal(outs[0], outs[1])),
            "max_abs_error": verdict.report["max_abs_error"],
            "error_to_bound_ratio": verdict.worst_ratio,
            "failure": verdict.reason}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=240)
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--targets", default="host,qemu")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "winograd_sweep.json"))
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    targets = []
    if "host" in args.targets:
        targets += [f"host:{isa}" for isa in available_isas()]
    if "qemu" in args.targets:
        targets += list(QEMU_CORES)
    rows, start = [], time.time()
    with tempfile.TemporaryDirectory(prefix="xfc-wino-sweep-") as tmp:
        for index in range(args.cases):
            case = draw_case(rng)
            target = targets[index % len(targets)]
            vectors = VECTOR_AXES[index // len(targets) % len(VECTOR_AXES)]
            try:
                row = run_case(case, target, Path(tmp) / f"case{index}", vectors)
            except XfcError as exc:
                row = {"ok": False, "failure": f"{type(exc).__name__}: {exc}"}
            rows.append({"case": index, "target": target, "m": case["m"], **row})
            if not row.get("ok", True) and "skipped" not in row:
                print(f"case {index} {target}: FAILED {row.get('failure')}", flush=True)
            elif index % 20 == 0:
                print(f"[{index + 1}/{args.cases}] {target} m={case['m']}: ok", flush=True)
    ran = [r for r in rows if "skipped" not in r]
    failed = [r for r in ran if not r["ok"]]
    summary = {"cases": len(ran), "failed": len(failed), "seed": args.seed, "targets": targets,
               "worst_error_to_bound_ratio": max((r.get("error_to_bound_ratio") or 0.0) for r in ran) if ran else None,
               "by_m": {m: sum(1 for r in ran if r["m"] == m) for m in (2, 4, 6)},
               "by_vectors": {v: sum(1 for r in ran if r.get("vectors") == v) for v in VECTOR_AXES},
               "seconds": round(time.time() - start, 1)}
    write_json_result(args.out, {"machine": machine_facts(), "summary": summary, "rows": rows}, kind="winograd_sweep")
    print(f"{len(ran)} cases, {len(failed)} failed, worst error/bound {summary['worst_error_to_bound_ratio']}; "
          f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
