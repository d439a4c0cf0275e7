#!/usr/bin/env python3
"""Refit the Winograd model's constants offline against plans benchmarks/regret.py already timed.

Each row of a regret file (its winograd_rows: one layer at one thread count, the chosen plan and
its neighbours, each with its measured time) is planned again with the constants of every point of
a grid (--set NAME=V1,V2,...: CostConstants fields), as regret.py planned it (the same tile database
inputs, weights from memory where the file says --plan-weights memory), and the plan chosen is looked
up among the plans that row timed. Its regret is its screening time against the fastest screening time
of the row (the twin left out); a plan the row did not time counts as 'untimed' and is left out of the
means, so a grid point that moves plans off the timed ones is judged on fewer layers and says so.
Points are ranked on the fitting set alone (untimed plans, mean, max; ties to the least change from the
constants in use); the held-out set is reported beside it, to judge the choice, never to make it.

    .venv/bin/python benchmarks/winograd_refit.py benchmarks/results/regret_winograd_zen5_cold_memory_1t.json \
        benchmarks/results/regret_winograd_zen5_cold_memory_2t.json \
        --set winograd_cold_stream_efficiency=0.4,0.6,0.8,1.0 --set winograd_cold_stream_exposed=0,0.5,1 \
        [--out-name NAME]

Timings are the files' (their machine); planning runs here, so run it on the machine that timed them
(the host description is the probe's). Writes benchmarks/results/NAME (default winograd_refit.json).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from dataclasses import fields, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from machine import machine_facts  # noqa: E402
from regret import TWIN, describe_plan, winograd_spec  # noqa: E402


def parse_grid(items: list[str], names: set[str]) -> dict[str, list[float]]:
    grid = {}
    for item in items:
        name, _, values = item.partition("=")
        if name not in names or not values:
            raise ValueError(f"--set {item!r}: expected NAME=V1,V2,... with NAME a CostConstants field "
                             f"({', '.join(sorted(names))})")
        grid[name] = [float(v) for v in values.split(",")]
    return grid


def row_regret(row: dict, plan_text: str):
    """(regret, timed): the plan's screening time against the row's fastest (twin left out)."""
    timed = {p["plan"]: p["measured_ms"] for p in row["plans"] if p["label"] != TWIN}
    if plan_text not in timed:
        return None, False
    return max(0.0, timed[plan_text] / min(timed.values()) - 1), True


def summarize(results: list[dict]) -> dict:
    out = {}
    for r in results:
        key = f"{r['set']} {r['threads']}T"
        entry = out.setdefault(key, {"layers": 0, "untimed": 0, "regrets": []})
        entry["layers"] += 1
        if r["regret"] is None:
            entry["untimed"] += 1
        else:
            entry["regrets"].append(r["regret"])
    return {k: {"layers": v["layers"], "untimed": v["untimed"],
                "mean": sum(v["regrets"]) / len(v["regrets"]) if v["regrets"] else None,
                "max": max(v["regrets"]) if v["regrets"] else None} for k, v in out.items()}


def load_rows(paths: list[Path]) -> list[tuple[dict, bool, str]]:
    """(row, weights from memory, file name) of every winograd_rows entry of regret.py results;
    ValueError naming a file that is not one."""
    rows = []
    for path in paths:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from None
        if not data.get("winograd_rows"):
            raise ValueError(f"{path}: no winograd_rows (a benchmarks/regret.py --part winograd result)")
        memory = data.get("plan_weights") == "memory"
        rows += [(row, memory, path.name) for row in data["winograd_rows"]]
    return rows


def plan_rows(rows, hw, evaluator, constants) -> list[dict]:
    """Each row's layer planned again under `constants`, its plan looked up among the plans the row timed."""
    from xfc.cpu.synth import synthesize_cpu
    results = []
    for row, memory, source in rows:
        spec = winograd_spec(row["shape"])
        plan = synthesize_cpu(spec, hw, threads=row["threads"], evaluator=evaluator, constants=constants,
                              weights_from_memory=memory).plan
        text = describe_plan(plan)
        regret, _timed = row_regret(row, text)
        results.append({"layer": row["layer"], "set": row["set"], "threads": row["threads"], "file": source,
                        "plan": text, "regret": regret})
    return results


def summary_line(summary: dict) -> str:
    return "  ".join(f"{k}: {v['mean']:.1%}/{v['max']:.1%}" + (f" ({v['untimed']} untimed)" if v["untimed"] else "")
                     if v["mean"] is not None else f"{k}: -" for k, v in sorted(summary.items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path, help="regret.py results with winograd_rows")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=V1,V2,...")
    ap.add_argument("--out-name", default="winograd_refit.json")
    ap.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args(argv)
    from xfc.cpu.cost_model import DEFAULT_CONSTANTS, CostConstants
    from xfc.outputs import write_json_result
    from xfc.tiledb.evaluators import synthesis_inputs
    from xfc.tiledb.hostdesc import load_hardware
    try:
        grid = parse_grid(args.set, {f.name for f in fields(CostConstants)})
    except ValueError as exc:
        print(f"winograd-refit: {exc}", file=sys.stderr)
        return 2
    try:
        rows = load_rows(args.files)
    except ValueError as exc:
        print(f"winograd-refit: {exc}", file=sys.stderr)
        return 2
    say = lambda m: print(f"winograd-refit: {m}", file=sys.stderr, flush=True)  # noqa: E731
    hw = load_hardware("host", os.environ, warn=say)
    evaluator, constants, entry = synthesis_inputs("auto", hw, None, os.environ, say)
    base = constants or DEFAULT_CONSTANTS
    names = list(grid)
    points = []
    try:
        for values in itertools.product(*(grid[n] for n in names)) if names else [()]:
            override = dict(zip(names, values))
            consts = replace(base, **override)
            results = plan_rows(rows, hw, evaluator, consts)
            summary = summarize(results)
            points.append({"constants": override, "summary": summary, "rows": results})
            print(f"{override}  {summary_line(summary)}", flush=True)
    finally:
        if evaluator is not None:
            evaluator.close()

    def fitting_key(point):
        fit = [v for k, v in point["summary"].items() if k.startswith("fitting") and v["mean"] is not None]
        untimed = sum(v["untimed"] for k, v in point["summary"].items() if k.startswith("fitting"))
        change = sum(abs(v - getattr(base, n)) / max(abs(getattr(base, n)), 1e-9) for n, v in point["constants"].items())
        # ties (several points make the same plans) go to the least change from the constants in use
        return (untimed, round(sum(v["mean"] for v in fit) / max(len(fit), 1), 6),
                round(max((v["max"] for v in fit), default=0), 6), change)
    best = min(points, key=fitting_key)
    print(f"best on the fitting set: {best['constants']}")
    for k, v in sorted(best["summary"].items()):
        if v["mean"] is not None:
            print(f"  {k}: mean {v['mean']:.1%}, max {v['max']:.1%}, {v['untimed']} untimed of {v['layers']}")
    out = args.results / args.out_name
    write_json_result(out, {"benchmark": "Winograd constants refit offline on timed regret rows",
                            "machine": machine_facts(), "files": [str(p) for p in args.files],
                            "base_constants": f"{entry['constants']} ({entry.get('path')})", "grid": grid,
                            "best_on_fitting": best["constants"], "points": points,
                            "command": "benchmarks/winograd_refit.py "
                                       + " ".join(argv if argv is not None else sys.argv[1:])},
                      kind="winograd-refit")
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
