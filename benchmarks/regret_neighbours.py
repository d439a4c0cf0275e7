#!/usr/bin/env python3
"""How one neighbour of the chosen plan fared in saved regret runs: per row, the cost model's ratio of
chosen to neighbour and the measured ratio (screening times, the row's rounds), and a summary per file.
A predicted ratio of 1.000 is a tie the model cannot break; a measured ratio above 1 means the neighbour
ran faster. Nothing is built or timed.

    .venv/bin/python benchmarks/regret_neighbours.py benchmarks/results/regret_winograd_zen4_1t_s65.json \
        --neighbour nr-16 [--ties-only] [--out-name NAME]

Neighbour labels are those of regret.py's winograd_rows (nr-16, nr+16, mr-1, mr+1, kc/2, 'split m ...',
'best m=4', 'best direct', ...): the label's prefix is matched.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from machine import machine_facts  # noqa: E402

TIE = 1e-3   # predicted ratios closer to 1 than this are ties


def neighbour_rows(data: dict, label: str, ties_only: bool) -> list[dict]:
    rows = []
    for row in data.get("winograd_rows", []):
        plans = {p["label"]: p for p in row["plans"]}
        chosen = plans.get("chosen")
        other = next((p for name, p in plans.items() if name.startswith(label) and name != "chosen"), None)
        if chosen is None or other is None:
            continue
        predicted = chosen["predicted_ms"] / other["predicted_ms"]
        if ties_only and abs(predicted - 1) > TIE:
            continue
        rows.append({"layer": row["layer"], "set": row["set"], "threads": row["threads"], "chosen": chosen["plan"],
                     "neighbour": other["plan"], "predicted_ratio": round(predicted, 4),
                     "measured_ratio": round(chosen["measured_ms"] / other["measured_ms"], 4)})
    return rows


def summary(rows: list[dict]) -> dict:
    if not rows:
        return {"rows": 0}
    measured = [r["measured_ratio"] for r in rows]
    return {"rows": len(rows), "neighbour_faster": sum(m > 1 for m in measured),
            "geomean_measured_ratio": round(math.exp(sum(math.log(m) for m in measured) / len(measured)), 4),
            "max_measured_ratio": max(measured), "min_measured_ratio": min(measured)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path, help="regret.py --part winograd results")
    ap.add_argument("--neighbour", required=True, metavar="LABEL", help="the neighbour's label (prefix), e.g. nr-16")
    ap.add_argument("--ties-only", action="store_true", help="only rows where the model predicts a tie")
    ap.add_argument("--out-name", help="also write the rows and summaries to benchmarks/results/NAME")
    ap.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args(argv)
    report = []
    for path in args.files:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"regret-neighbours: {path}: {exc}", file=sys.stderr)
            return 2
        rows = neighbour_rows(data, args.neighbour, args.ties_only)
        print(f"{path.name}")
        for r in rows:
            print(f"  {r['layer']:12s} {r['set']:9s} {r['threads']}T  predicted {r['predicted_ratio']:.3f}  "
                  f"measured {r['measured_ratio']:.3f}  {r['chosen']}  vs  {r['neighbour']}")
        s = summary(rows)
        if rows:
            print(f"  {s['rows']} rows: the neighbour ran faster in {s['neighbour_faster']}; chosen / neighbour measured "
                  f"geomean {s['geomean_measured_ratio']:.3f} (from {s['min_measured_ratio']:.3f} to "
                  f"{s['max_measured_ratio']:.3f})")
        report.append({"file": str(path), "rows": rows, "summary": s})
    if args.out_name:
        from xfc.outputs import write_json_result
        out = args.results / args.out_name
        write_json_result(out, {"benchmark": "a neighbour of the chosen Winograd plan in saved regret runs",
                                "machine": machine_facts(), "neighbour": args.neighbour, "ties_only": args.ties_only,
                                "files": report, "command": "benchmarks/regret_neighbours.py "
                                + " ".join(argv if argv is not None else sys.argv[1:])}, kind="regret-neighbours")
        print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
