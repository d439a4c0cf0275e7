#!/usr/bin/env python3
"""fp16 CPU kernels (issue 13) under qemu-aarch64: the suite and random shapes per operator, on the
Snapdragon 855's big (Cortex-A76) and little (Cortex-A55) clusters, each verified under the
derived fp16 bound (xfc/ops/fp16.py, docs/fp16.md) through both entry points (weights packed per
call and pre-packed; their outputs must agree bitwise). `make fp16-sweep` runs it.

    .venv/bin/python scripts/fp16_sweep.py [--cases 100] [--seed 13] [--clusters big,little]
                                           [--no-suite] [--out benchmarks/results/fp16_sweep.json]

--cases random shapes per operator and per core: matmul (batch 1-2, M and N 1-96, K 1-320 and now
and then up to 3000, past where the classical fp16 bound is vacuous), conv2d (C 1-48, H and W 3-28,
K 1-48, R and S 1/3/5, stride 1-2, padding up to 2 per side, dilation 1-2) and depthwise (C 1-48,
H and W 3-48, R and S 3/5/7, stride 1-2, padding, dilation), with bias and ReLU/ReLU6 drawn; most
sizes are not multiples of 8 lanes or of the register tile. Threads: 1 or 2. Correctness only: no
timing here. Output: one JSON row per case and a summary with the machine; exit 1 if any failed.
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

from xfc.errors import XfcError  # noqa: E402
from xfc.testing.fp16_run import run_fp16_case  # noqa: E402
from xfc.hardware.load import load  # noqa: E402
from xfc.ops.spec import make_spec  # noqa: E402
from xfc.ops.workloads import SUITE, suite_spec  # noqa: E402
from xfc.outputs import write_json_result  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from machine import machine_facts  # noqa: E402  (the CPU every result was taken on)

HARDWARE = "snapdragon-855"          # big: Cortex-A76, little: Cortex-A55
CLUSTERS = ("big", "little")
OPERATORS = ("matmul", "conv2d", "depthwise")


def _pad(rng: random.Random) -> tuple:
    choice = rng.choice([0, 1, "asym"])
    return tuple(rng.randint(0, 2) for _ in range(4)) if choice == "asym" else (choice,) * 4


def draw_case(op: str, rng: random.Random) -> dict:
    """A random case whose spec is valid (padding smaller than the window, a non-empty output)."""
    while True:
        case = _draw(op, rng)
        try:
            make_spec(case["op"], case["shape"], bias=case["bias"], activation=case["activation"], **case["options"])
            return case
        except XfcError:
            continue


def _draw(op: str, rng: random.Random) -> dict:
    epilogue = dict(bias=rng.random() < 0.5, activation=rng.choice(["none", "relu", "relu6"]))
    if op == "matmul":
        k = rng.randint(1000, 3000) if rng.random() < 0.1 else rng.randint(1, 320)
        shape = dict(batch=rng.choice([1, 1, 2]), m=rng.randint(1, 96), n=rng.randint(1, 96), k=k)
        return dict(op=op, shape=shape, options={}, **epilogue)
    r = rng.choice([1, 3, 3, 5]) if op == "conv2d" else rng.choice([3, 3, 5, 7])
    s = r if rng.random() < 0.8 else rng.choice([1, 3, 5] if op == "conv2d" else [3, 5])
    dil = rng.choice([1, 1, 1, 2])
    hmax = 28 if op == "conv2d" else 48
    shape = dict(n=rng.choice([1, 1, 2]), c=rng.randint(1, 48), h=rng.randint(max(3, r + (r - 1) * (dil - 1)), hmax),
                 w=rng.randint(max(3, s + (s - 1) * (dil - 1)), hmax), r=r, s=s)
    if op == "conv2d":
        shape["k"] = rng.randint(1, 48)
    options = dict(stride=rng.choice([1, 1, 2]), pad=_pad(rng), dilation=dil)
    return dict(op=op, shape=shape, options=options, **epilogue)


def run_one(case: dict, cluster: str, work: Path, threads: int) -> dict:
    spec = make_spec(case["op"], case["shape"], bias=case["bias"], activation=case["activation"], **case["options"])
    seed = zlib.crc32(repr(sorted((k, str(v)) for k, v in case.items())).encode()) & 0xFFFF
    result = run_fp16_case(spec, load(HARDWARE), work, cluster=cluster, threads=threads, seed=seed)
    return {**result.as_row(), "threads": threads}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=100, help="random shapes per operator and per core")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--clusters", default=",".join(CLUSTERS), help=f"clusters of {HARDWARE}")
    ap.add_argument("--no-suite", action="store_true", help="skip the suite workloads")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "fp16_sweep.json"))
    args = ap.parse_args(argv)
    hw = load(HARDWARE)
    cores = [c for c in args.clusters.split(",") if c]
    core_names = {role: hw.cluster(role).core.name for role in cores}
    rng = random.Random(args.seed)
    jobs = []
    if not args.no_suite:
        jobs += [(core, "suite", name, None) for core in cores for name in SUITE]
    for core in cores:
        for op in OPERATORS:
            jobs += [(core, "random", op, draw_case(op, rng)) for _ in range(args.cases)]
    rows, start = [], time.time()
    with tempfile.TemporaryDirectory(prefix="xfc-fp16-sweep-") as tmp:
        for index, (core, kind, name, case) in enumerate(jobs):
            work = Path(tmp) / f"case{index}"
            threads = 1 if kind == "suite" else rng.choice([1, 2])
            try:
                if kind == "suite":
                    result = run_fp16_case(suite_spec(name), hw, work, cluster=core, threads=1)
                    row = {**result.as_row(), "threads": 1}
                else:
                    row = run_one(case, core, work, threads)
            except XfcError as exc:
                row = {"ok": False, "failure": f"{type(exc).__name__}: {exc}"}
            operator = case["op"] if case else SUITE[name][0]
            rows.append({"case": index, "cluster": core, "core": core_names[core], "kind": kind, "operator": operator,
                         **({"workload": name} if kind == "suite" else {}), **row})
            if not row.get("ok", True) and "skipped" not in row:
                print(f"case {index} {core} {name}: FAILED {row.get('failure')}", flush=True)
            elif index % 25 == 0:
                print(f"[{index + 1}/{len(jobs)}] {core} {kind} {name}: ok ({time.time() - start:.0f} s)", flush=True)
    ran = [r for r in rows if "skipped" not in r]
    failed = [r for r in ran if not r["ok"]]
    by = {f"{core_names[core]}/{op}": sum(1 for r in ran if r["cluster"] == core and r["operator"] == op
                                          and r["kind"] == "random") for core in cores for op in OPERATORS}
    summary = {"cases": len(ran), "failed": len(failed), "seed": args.seed, "hardware": HARDWARE,
               "clusters": {role: core_names[role] for role in cores},
               "random_cases_by_core_and_operator": by,
               "suite_cases": sum(1 for r in ran if r["kind"] == "suite"),
               "worst_error_to_bound_ratio": max((r.get("error_to_bound_ratio") or 0.0) for r in ran) if ran else None,
               "cases_where_classical_bound_is_vacuous": sum(1 for r in ran if r.get("classical_vacuous")),
               "entry_points_equal": all(r.get("entry_points_equal", False) for r in ran),
               "seconds": round(time.time() - start, 1),
               "note": "correctness under qemu-aarch64 only; no timing. Bound: docs/fp16.md"}
    write_json_result(args.out, {"machine": machine_facts(), "summary": summary, "rows": rows}, kind="fp16_sweep")
    print(f"{len(ran)} cases, {len(failed)} failed, worst error/bound {summary['worst_error_to_bound_ratio']}; "
          f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
