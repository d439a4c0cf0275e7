#!/usr/bin/env python3
"""Add up the shards of the differential-fuzzing soak (`make soak SOAK_SEED=... SOAK_OUT=...`).

    .venv/bin/python scripts/soak_summary.py                       # benchmarks/results/soak/*.json
    .venv/bin/python scripts/soak_summary.py a.json b.json --target 10000

Each shard is an `xfc fuzz --out` file with its own seed. Prints one line per shard (seed, cases,
failures, machine, xfc version) and the totals by dtype and target (from the variant keys:
'target/isa/dtype', 'target/isa' for fp32 on CPUs, 'pocl/dtype'); exit 1 if any shard has a failure or two shards share a seed (the same cases
twice), 0 otherwise. With --target N it also says whether the shards reach N cases.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARDS = REPO / "benchmarks" / "results" / "soak"
DTYPES = ("fp32", "fp16", "int8")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help=f"shard files (default: {SHARDS.relative_to(REPO)}/*.json)")
    ap.add_argument("--target", type=int, default=10000, help="cases the soak should reach (default 10000)")
    args = ap.parse_args(argv)
    files = [Path(f) for f in args.files] or sorted(SHARDS.glob("*.json"))
    if not files:
        print(f"soak_summary.py: error: no shard files (looked in {SHARDS})", file=sys.stderr)
        return 2
    cases = failures = 0
    seeds: Counter = Counter()
    by_dtype: Counter = Counter()
    by_target: Counter = Counter()
    for path in files:
        try:
            shard = json.loads(path.read_text())
            shard_cases, shard_failures, seed = int(shard["cases"]), int(shard["failures"]), shard["seed"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"soak_summary.py: error: {path}: not an xfc fuzz result ({exc})", file=sys.stderr)
            return 2
        cases += shard_cases
        failures += shard_failures
        seeds[seed] += 1
        for variant, row in shard.get("by_variant", {}).items():
            # target/isa/dtype on CPUs (fp32 CPU cases as target/isa), target/dtype on PoCL
            parts = variant.split("/")
            target, dtype = parts[0], parts[-1] if parts[-1] in DTYPES else "fp32"
            by_dtype[dtype] += row["cases"]
            by_target[target] += row["cases"]
        machine = shard.get("machine", {})
        print(f"{path.name}: seed {seed}, {shard_cases} cases, {shard_failures} failed, "
              f"{shard.get('duration_s', 0) / 60:.0f} min, {machine.get('cpu', '?')}, "
              f"xfc {shard.get('xfc_version', '?')}")
    repeated = [s for s, n in seeds.items() if n > 1]
    print(f"total: {cases} cases, {failures} failed, {len(files)} shard(s); by dtype: "
          + ", ".join(f"{k} {v}" for k, v in sorted(by_dtype.items()))
          + "; by target: " + ", ".join(f"{k} {v}" for k, v in sorted(by_target.items())))
    print(f"target {args.target} cases: {'reached' if cases >= args.target else f'{args.target - cases} to go'}")
    if repeated:
        print(f"soak_summary.py: error: seed(s) {', '.join(map(str, repeated))} used by more than one shard "
              "(the same cases twice)", file=sys.stderr)
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
