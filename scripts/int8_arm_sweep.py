#!/usr/bin/env python3
"""ARM int8 verification sweep (issue 13): the suite and >= 100 random shapes per operator, built
static for AArch64 and run under qemu-aarch64 with each core's qemu_cpu, compared byte for byte
with the exact reference (xfc.ops.quant). Correctness only: nothing is timed.

    .venv/bin/python scripts/int8_arm_sweep.py                       # make int8-arm-sweep
    .venv/bin/python scripts/int8_arm_sweep.py --cases 10 --out /tmp/s.json

The cases are scripts/int8_sweep.py's (ragged sizes, stride / padding / dilation, batch, both
activation types, zero points at either end of the range, per-channel scales, bias, ReLU / ReLU6,
1-2 threads, heavy saturation, and every 10th case a reduction >= 16384 with extreme inputs).
Every case runs on every target (description, instruction): by default Cortex-A76 (sdot,
out-of-order), Cortex-A55 (sdot, in-order tiles and split loads), Cortex-A715 (smmla; the
Snapdragon 8 Gen 2 big core) and Cortex-A510 (smmla, in-order; its little core). The tile is the planner's choice for each target. Results: a summary on stdout and
benchmarks/results/int8_arm_sweep.json (written atomically, xfc-owned); exit 1 if any case differs.
"""
from __future__ import annotations

import argparse
import random
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "benchmarks"))

from int8_sweep import OPS, layout_counts, random_case, run_case, suite_cases  # noqa: E402  (the same cases as the host sweep)
from machine import machine_facts  # noqa: E402
from xfc.outputs import write_json_result  # noqa: E402

TARGETS = ("cortex-a76:sdot", "cortex-a55:sdot", "cortex-a715:smmla", "cortex-a510:smmla")


def qemu_version() -> str:
    try:
        out = subprocess.run(["qemu-aarch64", "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.splitlines()[0].strip() if out else "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--cases", type=int, default=100, help="random shapes per operator (default 100)")
    ap.add_argument("--seed", type=int, default=20261124)
    ap.add_argument("--targets", default=",".join(TARGETS), help="description:instruction pairs, comma separated")
    ap.add_argument("--no-suite", action="store_true", help="skip the suite shapes")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "int8_arm_sweep.json"))
    args = ap.parse_args(argv)
    targets = [tuple(t.split(":", 1)) for t in args.targets.split(",") if t]
    rng = random.Random(args.seed)
    cases = [] if args.no_suite else suite_cases()
    cases += [random_case(rng, op, i) for op in OPS for i in range(args.cases)]
    jobs = [(case, hw, instr) for case in cases for hw, instr in targets]
    rows = []
    for n, (case, hw, instr) in enumerate(jobs, 1):
        row = run_case(case, hw, instr, frozenset())
        rows.append(row)
        status = "ok" if row.get("ok") else f"FAILED: {row.get('reason')}"
        print(f"[{n}/{len(jobs)}] {hw:12s} {instr:5s} {row['key']} {case['act']} zp={case['a_zp']}/{case['out_zp']} "
              f"tile={row.get('tile')} exact={row.get('exact_share', 0):.4f} sat={row.get('saturated_share', 0):.2f} "
              f"{status}", flush=True)
    failures = [r for r in rows if not r.get("ok")]
    layouts, clamped = layout_counts(rows)
    summary = {"cases": len(rows), "failures": len(failures), "layouts": layouts,
               "layouts_with_over_90pct_outputs_clamped": clamped,
               "targets": [f"{hw}:{instr}" for hw, instr in targets],
               "random_shapes_per_operator_per_target": {
                   op: len({(str(r["shape"]), str(r["geometry"])) for r in rows if r["op"] == op and "name" not in r
                            and r["hardware"] == targets[0][0]}) for op in OPS},
               "all_exact": all(r.get("exact_share") == 1.0 for r in rows),
               "max_reduction": max(r["reduction"] for r in rows),
               "mean_saturated_share": sum(r.get("saturated_share", 0) for r in rows) / max(1, len(rows))}
    write_json_result(args.out, {"machine": machine_facts(), "emulator": qemu_version(),
                                 "note": "run under qemu-aarch64 with each core's qemu_cpu: correctness only",
                                 "summary": summary, "seed": args.seed, "cases": rows}, kind="int8_arm_sweep")
    print(f"{len(rows) - len(failures)}/{len(rows)} cases exact ({sum(clamped.values())} of them with over 90% of "
          f"the outputs at a clamp bound); results in {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
