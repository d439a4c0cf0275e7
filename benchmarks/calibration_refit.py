#!/usr/bin/env python3
"""Judge a change to the calibration fit offline: refit saved calibration measurements, and look up how
the plans the fitted constants choose ran in saved regret runs. Nothing is built or timed.

Inputs, both from this machine (planning runs here, on the host description the files were timed with):
- measurement files of `xfc tiledb calibrate --save-measurements FILE` (one per calibration run);
- regret.py results with winograd_rows (benchmarks/regret.py --part winograd): every row timed the chosen
  plan and its neighbours, so a plan chosen under other constants has a measured time if it is one of them.

For each fit variant (--winograd: the Winograd-only constants fitted or kept static; --regularization:
the weight of the pull towards the static constants, per grid step; --pull: which fields it pulls,
'winograd' as `xfc tiledb calibrate` does, or 'all') the constants are
fitted to each measurement file alone and to all of them pooled (the fastest time of each operator). It
reports how far the single-file fits lie apart (grid steps between each pair, summed over the fields:
the run-to-run stability of the calibration) and the regret of each fitted set on the regret rows (mean /
max per set and thread count; plans the rows did not time are counted apart), beside the static constants.

    .venv/bin/python benchmarks/calibration_refit.py \
        --measurements benchmarks/results/calibration_measurements_zen4_s65_{1,2,3}.json \
        --regret benchmarks/results/regret_winograd_zen4_{1,2}t_s64_sustained.json \
        --regularization 2e-4,2e-3 --pull winograd,all --out-name calibration_refit.json

Writes benchmarks/results/NAME (default calibration_refit.json).
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from machine import machine_facts  # noqa: E402
from winograd_refit import load_rows, plan_rows, summarize, summary_line  # noqa: E402


def steps_apart(a, b) -> float:
    """Grid steps between two sets of fitted constants, summed over the fitted fields."""
    from xfc.tiledb.calibrate import GRIDS, _grid_position
    return sum(abs(_grid_position(grid, getattr(a, f)) - _grid_position(grid, getattr(b, f))) for f, grid in GRIDS.items())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measurements", nargs="+", type=Path, required=True, metavar="FILE",
                    help="calibration measurement files (xfc tiledb calibrate --save-measurements)")
    ap.add_argument("--regret", nargs="+", type=Path, required=True, metavar="FILE",
                    help="regret.py --part winograd results of this machine")
    ap.add_argument("--regularization", default="2e-4", metavar="R[,R...]",
                    help="pull weights per grid step to try (default 2e-4, the calibration's)")
    ap.add_argument("--pull", default="winograd", metavar="P[,P...]",
                    help="fields pulled: winograd (the calibration's), all")
    ap.add_argument("--winograd", default="yes,no", metavar="yes,no",
                    help="fit the Winograd-only constants (yes: `xfc tiledb calibrate --winograd`), keep them static "
                         "(no: the default calibration), or both as variants (default)")
    ap.add_argument("--fix", default="", metavar="FIELD[,FIELD...]",
                    help="fields kept at their static values (not searched), in every variant")
    ap.add_argument("--out-name", default="calibration_refit.json")
    ap.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args(argv)
    from xfc.cpu.cost_model import DEFAULT_CONSTANTS
    from xfc.errors import XfcError
    from xfc.outputs import write_json_result
    from xfc.tiledb.calibrate import GRIDS, fit, read_measurements
    from xfc.tiledb.evaluators import synthesis_inputs
    from xfc.tiledb.hostdesc import load_hardware
    say = lambda m: print(f"calibration-refit: {m}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        weights = [float(v) for v in args.regularization.split(",")]
        pulls = args.pull.split(",")
        winograd_choices = [{"yes": True, "no": False}[w] for w in args.winograd.split(",")]
        fixed = [f for f in args.fix.split(",") if f]
        if any(f not in GRIDS for f in fixed):
            raise ValueError(f"--fix {args.fix}: fitted fields are {', '.join(GRIDS)}")
        if any(p not in ("winograd", "all") for p in pulls):
            raise ValueError(f"--pull {args.pull}: each of winograd, all")
        rows = load_rows(args.regret)
    except KeyError as exc:
        print(f"calibration-refit: --winograd {args.winograd}: each of yes, no ({exc})", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"calibration-refit: {exc}", file=sys.stderr)
        return 2
    hw = load_hardware("host", os.environ, warn=say)
    cluster = hw.cluster()
    try:
        inputs = {path.name: read_measurements([path], hw, cluster, warn=say) for path in args.measurements}
        if len(args.measurements) > 1:
            inputs["pooled"] = read_measurements(args.measurements, hw, cluster, warn=say)
    except XfcError as exc:
        print(f"calibration-refit: {exc}", file=sys.stderr)
        return 2
    # the rows are planned as regret.py planned them: the tile database's evaluator, these constants
    evaluator, _constants, _entry = synthesis_inputs("auto", hw, None, os.environ, say)
    variants = []
    try:
        static = summarize(plan_rows(rows, hw, evaluator, DEFAULT_CONSTANTS))
        print(f"static constants: {summary_line(static)}", flush=True)
        for winograd, pull, weight in itertools.product(winograd_choices, pulls, weights):
            if not winograd and pull == "winograd" and (weight != weights[0]):
                continue   # the pull on the Winograd fields moves nothing when they are not fitted
            label = f"winograd {'fitted' if winograd else 'static'}, pull {pull} x{weight:g}"
            fits = {}
            for name, items in inputs.items():
                started = time.perf_counter()
                result = fit(items, hw, cluster, regularization=weight, pull=pull, fixed=fixed, winograd=winograd)
                regret = plan_rows(rows, hw, evaluator, result.constants)
                fits[name] = {"constants": result.constants.as_dict(), "error_after": result.error_after,
                              "worst_after": result.worst_after, "rank_after": list(result.rank_after),
                              "summary": summarize(regret), "rows": regret,
                              "fit_seconds": round(time.perf_counter() - started, 1), "_constants": result.constants}
                print(f"{label}, {name}: error {result.error_after:.1%} (worst {result.worst_after:.1%}); "
                      f"regret {summary_line(fits[name]['summary'])}", flush=True)
            singles = [n for n in fits if n != "pooled"]
            apart = {f"{a} / {b}": round(steps_apart(fits[a]["_constants"], fits[b]["_constants"]), 2)
                     for a, b in itertools.combinations(singles, 2)}
            moved = {f: [fits[n]["constants"][f] for n in singles] for f in GRIDS
                     if len({fits[n]["constants"][f] for n in singles}) > 1}
            print(f"{label}: single-file fits apart (grid steps) {apart}; fields that differ {moved}",
                  flush=True)
            for entry in fits.values():
                del entry["_constants"]
            variants.append({"winograd": winograd, "pull": pull, "regularization": weight, "fits": fits, "steps_apart": apart,
                             "fields_that_differ": moved})
    finally:
        if evaluator is not None:
            evaluator.close()
    out = args.results / args.out_name
    write_json_result(out, {"benchmark": "calibration refit offline: fitted constants' stability and Winograd regret",
                            "machine": machine_facts(), "measurements": [str(p) for p in args.measurements],
                            "regret_files": [str(p) for p in args.regret], "fixed": fixed, "static": static, "variants": variants,
                            "command": "benchmarks/calibration_refit.py " + " ".join(argv if argv is not None
                                                                                    else sys.argv[1:])},
                      kind="calibration-refit")
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
