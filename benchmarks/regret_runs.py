#!/usr/bin/env python3
"""Several benchmarks/regret.py runs of the same code on the same machine, read together: each row's
(layer, threads) regret in every run, its median, and how many runs put it over issue 34's target.
Nothing is built or timed.

    .venv/bin/python benchmarks/regret.py --part winograd --layers all --threads 1 --out benchmarks/results/A.json
    ... the same again into B.json and C.json ...
    .venv/bin/python benchmarks/regret_runs.py benchmarks/results/{A,B,C}.json [--out-name NAME]

Why: on the project's VMs one run's maximum is set by the machine as much as by the planner. The chosen
plan timed against itself (its twin) reads up to 14% apart in single runs, and the rows over 5% differ
from run to run. A regret the plan space really holds shows in most runs; one the machine made shows
in one. The per-row median over an odd number of runs (three or more) is the figure that separates
them; the single runs' mean and max are reported beside it, never replaced.

The runs must come from one machine (the host description's fingerprint) and one set of constants,
and a row counts only where every run chose the same plan (else the runs planned it differently, and
the row is listed as 'differs'). Writes benchmarks/results/NAME (default regret_runs.json) and a table.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from machine import machine_facts  # noqa: E402
from regret import WINOGRAD_TARGETS, winograd_max_target  # noqa: E402


class RunsDiffer(ValueError):
    """The files are not runs of one experiment (another machine or other constants)."""


# What must be equal for two runs to be one experiment: (what it is, how to read it from a run).
SAME_IN_EVERY_RUN = (("host descriptions (their fingerprints)", lambda run: (run.get("host_figures") or {}).get("fingerprint")),
                     ("cost-model constants", lambda run: run.get("constant_values")))


def check_same_experiment(runs: list[tuple[str, dict]]) -> None:
    """Raise RunsDiffer naming the first file whose machine or constants differ from the first's."""
    first_name, first = runs[0]
    for name, data in runs[1:]:
        for what, read in SAME_IN_EVERY_RUN:
            if read(data) != read(first):
                raise RunsDiffer(f"{name}: not a run of the same experiment as {first_name} ({what} differ)")


def combine(runs: list[tuple[str, dict]]) -> list[dict]:
    """One entry per (layer, threads) found in every run: the chosen plans, the regrets in run order,
    their median, the twin's (noise) median, and the runs over the target."""
    keyed = []
    for _, data in runs:
        keyed.append({(r["layer"], r["threads"]): r for r in data.get("winograd_rows", [])})
    common = [key for key in keyed[0] if all(key in k for k in keyed[1:])]
    rows = []
    for key in common:
        per_run = [k[key] for k in keyed]
        chosen = [r["chosen"] for r in per_run]
        regrets = [r["regret"] for r in per_run]
        target = winograd_max_target(key[1])
        rows.append(dict(
            layer=key[0], set=per_run[0]["set"], threads=key[1], same_plan=len(set(chosen)) == 1,
            chosen=chosen[0] if len(set(chosen)) == 1 else chosen, regrets=regrets,
            median=statistics.median(regrets), runs_over_target=sum(x > target for x in regrets),
            null_median=statistics.median(r.get("null_regret", 0.0) for r in per_run),
            fastest=[r["fastest"] for r in per_run]))
    return rows


def summary(rows: list[dict], runs: int) -> dict:
    """Per 'set NT': the mean and max of the per-row medians (rows with one plan in every run), and
    each single run's mean and max over the same rows."""
    out = {}
    for group in sorted({f"{r['set']} {r['threads']}T" for r in rows}):
        mine = [r for r in rows if f"{r['set']} {r['threads']}T" == group]
        same = [r for r in mine if r["same_plan"]]
        entry = dict(layers=len(same), differs=[r["layer"] for r in mine if not r["same_plan"]])
        if same:
            medians = [r["median"] for r in same]
            entry.update(median_mean=sum(medians) / len(medians), median_max=max(medians),
                         median_max_layer=max(same, key=lambda r: r["median"])["layer"],
                         single_runs=[dict(mean=sum(r["regrets"][i] for r in same) / len(same),
                                           max=max(r["regrets"][i] for r in same)) for i in range(runs)])
        out[group] = entry
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path, help="regret.py result files (winograd part)")
    ap.add_argument("--out-name", default="regret_runs.json")
    ap.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args(argv)
    if len(args.files) < 2:
        print("error: give two or more regret.py result files (three or more for a median that outvotes one run)",
              file=sys.stderr)
        return 2
    runs = []
    for path in args.files:
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            print(f"error: {path}: {exc}", file=sys.stderr)
            return 2
        if not data.get("winograd_rows"):
            print(f"error: {path}: no winograd_rows (a regret.py --part winograd result?)", file=sys.stderr)
            return 2
        runs.append((str(path), data))
    try:
        check_same_experiment(runs)
    except RunsDiffer as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = combine(runs)
    print(f"{'layer':12} {'set':9} {'T':>2} {'median':>7} {'over':>5}  regrets per run")
    for r in rows:
        mark = "" if r["same_plan"] else "  (runs chose different plans)"
        print(f"{r['layer']:12} {r['set']:9} {r['threads']:2d} {r['median']:+7.1%} {r['runs_over_target']:3d}/{len(runs)}  "
              + " ".join(f"{x:+.1%}" for x in r["regrets"]) + mark)
    result = summary(rows, len(runs))
    for group, entry in result.items():
        if "median_mean" not in entry:
            continue
        singles = ", ".join(f"{s['mean']:.1%}/{s['max']:.1%}" for s in entry["single_runs"])
        print(f"{group}: {entry['layers']} layers, per-row median over {len(runs)} runs: mean {entry['median_mean']:.1%}, "
              f"max {entry['median_max']:.1%} ({entry['median_max_layer']}); single runs mean/max: {singles}"
              + (f"; left out (plans differ): {', '.join(entry['differs'])}" if entry["differs"] else ""))
    from xfc.outputs import write_json_result
    out = args.results / args.out_name
    write_json_result(out, {"benchmark": "several regret.py runs read together", "machine": machine_facts(),
                            "files": [name for name, _ in runs], "targets": WINOGRAD_TARGETS,
                            "summary": result, "rows": rows,
                            "command": "benchmarks/regret_runs.py " + " ".join(argv if argv is not None else sys.argv[1:])},
                      kind="regret-runs")
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
