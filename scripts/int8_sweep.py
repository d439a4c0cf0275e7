#!/usr/bin/env python3
"""int8 verification sweep (issue 13): the suite and >= 100 random shapes per operator, built and
run natively, compared byte for byte with the exact reference (xfc.ops.quant).

    .venv/bin/python scripts/int8_sweep.py                 # make int8-sweep
    .venv/bin/python scripts/int8_sweep.py --cases 20 --dialects all --out /tmp/s.json

Random cases draw: ragged sizes, stride / padding / dilation, batch, uint8 or int8 activations,
activation and output zero points at either end of the type's range or inside it, per-tensor or
per-channel weight scales, bias, none / ReLU / ReLU6, 1 or 2 threads, an output scale from the
'auto' spread down to 1/16 of it (heavy saturation), and, every LARGE_K_EVERY-th case, a reduction
of at least 16384 with the extreme inputs (|acc| near K x 255 x 128). Each random case runs on
one of the dialects this machine has, in turn (--dialects all: on every one); the suite shapes
run on every dialect. Correctness only: nothing is timed. Results: a summary on stdout and
benchmarks/results/int8_sweep.json (written atomically, xfc-owned); exit 1 if any case differs.
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from xfc.errors import XfcError  # noqa: E402
from xfc.hardware.host import available_isas  # noqa: E402
from xfc.hardware.load import load  # noqa: E402
from xfc.ops.quant import TYPE_RANGE, QuantParams, resolve_out_scale  # noqa: E402
from xfc.ops.spec import make_spec  # noqa: E402
from xfc.ops.workloads import SUITE  # noqa: E402
from xfc.outputs import write_json_result  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from machine import machine_facts  # noqa: E402  (the CPU every result was taken on)
from xfc.cpu.int8_synth import plan_int8  # noqa: E402
from xfc.hardware.host import read_flags  # noqa: E402
from xfc.ops.dtypes import INT8, make_operands  # noqa: E402
from xfc.pipeline import stages  # noqa: E402

LARGE_K_EVERY = 10
OPS = ("matmul", "conv2d", "depthwise")


def dialects(flags) -> list[tuple[str, str]]:
    """(host description, dialect) pairs this machine runs."""
    out = []
    isas = available_isas()
    if "avx512" in isas and "avx512_vnni" in flags:
        out.append(("host:avx512", "vnni"))
    if "avx2" in isas:
        out.append(("host:avx2", "avx2"))
    out.append(("host:generic", "generic"))
    return out


def _zero_point(rng: random.Random, act: str) -> int:
    """An end of the range in 2 of 5 draws, else anywhere in the middle half."""
    lo, hi = TYPE_RANGE[act]
    quarter = (hi - lo) // 4
    return rng.choice([lo, hi, *(rng.randint(lo + quarter, hi - quarter) for _ in range(3))])


def random_case(rng: random.Random, op: str, index: int) -> dict:
    large = index % LARGE_K_EVERY == LARGE_K_EVERY - 1
    if op == "matmul":
        shape = {"m": rng.randint(1, 70), "n": rng.randint(1, 90), "k": rng.randint(1, 300),
                 "batch": rng.choice([1, 1, 2])}
        if large:
            shape.update(m=rng.randint(1, 6), n=rng.randint(1, 40), k=rng.randint(16384, 20000))
        geometry = {}
    else:
        r, s = rng.randint(1, 5), rng.randint(1, 5)
        dh, dw = rng.choice([1, 1, 2]), rng.choice([1, 1, 2])
        ph = rng.randint(0, dh * (r - 1))
        pw = rng.randint(0, dw * (s - 1))
        h = rng.randint(max(1, dh * (r - 1) + 1 - 2 * ph), 20)
        w = rng.randint(max(1, dw * (s - 1) + 1 - 2 * pw), 20)
        shape = {"c": rng.randint(1, 24), "h": h, "w": w, "r": r, "s": s, "n": rng.choice([1, 1, 2])}
        if op == "conv2d":
            shape["k"] = rng.randint(1, 40)
            if large:
                shape.update(c=rng.randint(1900, 2200), r=3, s=3, h=rng.randint(3, 5), w=rng.randint(3, 5),
                             k=rng.randint(1, 20), n=1)
                dh = dw = 1
                ph = pw = 1
        geometry = {"stride": f"{rng.choice([1, 1, 2])},{rng.choice([1, 1, 2, 3])}",
                    "pad": f"{ph},{pw}", "dilation": f"{dh},{dw}"}
    act = rng.choice(["uint8", "int8"])
    return {"op": op, "shape": shape, "geometry": geometry, "bias": rng.random() < 0.7,
            "activation": rng.choice(["none", "relu", "relu6"]), "act": act, "a_zp": _zero_point(rng, act),
            "out_zp": _zero_point(rng, act), "per_channel": rng.random() < 0.5, "threads": rng.choice([1, 2]),
            "out_scale_divisor": rng.choice([1, 1, 2, 16]), "mode": "extreme" if large else "random",
            "seed": rng.randint(0, 2 ** 31)}


def suite_cases() -> list[dict]:
    cases = []
    for i, (name, (op, shape, options)) in enumerate(SUITE.items()):
        act = "uint8" if i % 2 == 0 else "int8"
        cases.append({"name": name, "op": op, "shape": shape, "geometry": {k: str(v) for k, v in options.items()},
                      "bias": True, "activation": ("relu", "relu6", "none")[i % 3], "act": act,
                      "a_zp": TYPE_RANGE[act][i % 2], "out_zp": TYPE_RANGE[act][(i + 1) % 2] // 2,
                      "per_channel": True, "threads": 2, "out_scale_divisor": 1, "mode": "random", "seed": i})
    return cases


def layout_counts(rows: list[dict]) -> tuple[dict, dict]:
    """({"op layout": cases}, the same of the cases whose outputs nearly all clamp): which layouts the
    cases exercised (the planner's choice per case), and where a wrong sum could have passed."""
    layouts, clamped = {}, {}
    for r in rows:
        key = f"{r['op']} {r.get('layout', '?')}"
        layouts[key] = layouts.get(key, 0) + 1
        if r.get("saturated_share", 0) > 0.9:   # nearly every output at a clamp bound
            clamped[key] = clamped.get(key, 0) + 1
    return layouts, clamped


def run_case(case: dict, hw_name: str, dialect: str, flags) -> dict:
    spec = make_spec(case["op"], case["shape"], bias=case["bias"], activation=case["activation"], **case["geometry"])
    q = QuantParams(act_type=case["act"], a_zero_point=case["a_zp"], out_zero_point=case["out_zp"],
                    per_channel=case["per_channel"])
    q = resolve_out_scale(spec, q)
    q = replace(q, out_scale=q.out_scale / case["out_scale_divisor"])
    if case["mode"] == "extreme":   # the extreme accumulators land inside the output range
        q = replace(q, a_scale=1.0, w_scale=1.0, out_scale=float(spec.reduction_size * 255 * 128 / 90))
    row = {**case, "key": spec.key(), "dialect": dialect, "hardware": hw_name, "reduction": spec.reduction_size,
           "quantization": q.as_dict()}
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="xfc-int8-sweep-") as tmp:
            plan = plan_int8(spec, q, load(hw_name), threads=case["threads"], host_flags=flags, force_dialect=dialect)
            outcome = stages.verify(stages.realize(plan, Path(tmp)),
                                    make_operands(spec, INT8, seed=case["seed"], quant=plan.quant, mode=case["mode"]))
        row.update(ok=outcome.ok, reason=outcome.check.reason or None, **outcome.check.report,
                   entry_points=list(stages.ENTRY_POINTS), tile=[plan.mr, plan.nr],
                   layout=plan.depthwise_layout if case["op"] == "depthwise" else
                   plan.column_layout + (" in place" if plan.channels_rows_in_place else ""))
    except XfcError as exc:
        row.update(ok=False, reason=f"{type(exc).__name__}: {exc}")
    row["seconds"] = round(time.perf_counter() - start, 3)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--cases", type=int, default=100, help="random shapes per operator (default 100)")
    ap.add_argument("--seed", type=int, default=20261123)
    ap.add_argument("--dialects", choices=("rotate", "all"), default="rotate")
    ap.add_argument("--no-suite", action="store_true", help="skip the suite shapes")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "int8_sweep.json"))
    args = ap.parse_args(argv)
    flags = frozenset(read_flags())
    pairs = dialects(flags)
    rng = random.Random(args.seed)
    jobs = []
    if not args.no_suite:
        jobs += [(case, hw, d) for case in suite_cases() for hw, d in pairs]
    for op in OPS:
        for i in range(args.cases):
            case = random_case(rng, op, i)
            targets = pairs if args.dialects == "all" else [pairs[i % len(pairs)]]
            jobs += [(case, hw, d) for hw, d in targets]
    rows = []
    for n, (case, hw, d) in enumerate(jobs, 1):
        row = run_case(case, hw, d, flags)
        rows.append(row)
        status = "ok" if row.get("ok") else f"FAILED: {row.get('reason')}"
        print(f"[{n}/{len(jobs)}] {d:8s} {row['key']} {case['act']} zp={case['a_zp']}/{case['out_zp']} "
              f"exact={row.get('exact_share', 0):.4f} sat={row.get('saturated_share', 0):.2f} {status}", flush=True)
    failures = [r for r in rows if not r.get("ok")]
    layouts, clamped = layout_counts(rows)
    summary = {"cases": len(rows), "failures": len(failures), "layouts": layouts,
               "layouts_with_over_90pct_outputs_clamped": clamped,
               "random_shapes_per_operator": {op: len({(str(r["shape"]), str(r["geometry"])) for r in rows
                                                       if r["op"] == op and "name" not in r}) for op in OPS},
               "dialects": [d for _, d in pairs], "all_exact": all(r.get("exact_share") == 1.0 for r in rows),
               "max_reduction": max(r["reduction"] for r in rows),
               "mean_saturated_share": sum(r.get("saturated_share", 0) for r in rows) / max(1, len(rows))}
    write_json_result(args.out, {"machine": machine_facts(), "summary": summary, "seed": args.seed,
                                 "cpu_flags_vnni": "avx512_vnni" in flags,
                                 "cases": rows}, kind="int8_sweep")
    print(f"{len(rows) - len(failures)}/{len(rows)} cases exact ({sum(clamped.values())} of them with over 90% of "
          f"the outputs at a clamp bound); results in {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
