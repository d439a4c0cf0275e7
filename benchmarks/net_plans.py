#!/usr/bin/env python3
"""The plans `xfc model --emit lib` makes for the benchmark networks, written down and compared
(not run in CI; nothing is built or timed).

    .venv/bin/python benchmarks/net_plans.py --out /tmp/before.json              # at one commit
    .venv/bin/python benchmarks/net_plans.py --compare /tmp/before.json          # at another: what moved
    .venv/bin/python benchmarks/net_plans.py --only mobilenet_v2 --threads 1 --hw host:avx2 --out F

scripts/plan_snapshot.py proves that a change moves no plan of the suite's shapes; the layers users
run are those of networks. This exports benchmarks/nets.py's networks (seeded random weights, at
run time) and plans every distinct kernel of each, per thread count, exactly as the network library
does (xfc.model.runtime.network.lower_and_synthesize: the network's kernels, planned with their
weights read from memory when the network's weights exceed the shared cache), on the static model.
Each kernel's plan is recorded as its tiles line and a digest of every plan field; --compare lists
every kernel whose plan differs from the file's, with both tiles lines, and exits 1 when any does.
Needs torch (`pip install torch`), which is not an xfc dependency: without it, exit 3.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from machine import machine_facts
from nets import ALL, export, networks_or_status

REPO = Path(__file__).resolve().parent.parent


def plan_digest(plan) -> str:
    """sha256 of every field of a plan (as JSON), 16 hex digits."""
    text = json.dumps(dataclasses.asdict(plan), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def network_plans(path: Path, arch: str, hw, threads: int) -> dict:
    """{kernel spec described: {lowering, tiles, digest}} for one network at one thread count."""
    from xfc.model.load import load_model
    from xfc.model.runtime.network import lower_and_synthesize
    from xfc.model.runtime.program import spec_of
    _lowered, syntheses = lower_and_synthesize(load_model(path), arch, hw, threads=threads)
    plans = {}
    for key, synthesis in syntheses.items():
        plan = synthesis.result.plan
        plans[spec_of(key).describe()] = dict(lowering=plan.lowering, tiles=synthesis.tiles, digest=plan_digest(plan))
    return plans


def compare(before: dict, after: dict) -> list[str]:
    """One line per kernel whose plan differs (or that only one side has)."""
    lines = []
    for net_key in sorted(set(before) | set(after)):
        old, new = before.get(net_key, {}), after.get(net_key, {})
        for kernel in sorted(set(old) | set(new)):
            a, b = old.get(kernel), new.get(kernel)
            if a is None or b is None:
                lines.append(f"{net_key}: {kernel}: {'only after' if a is None else 'only before'}")
            elif a["digest"] != b["digest"]:
                lines.append(f"{net_key}: {kernel}:\n    before {a['lowering']} {a['tiles']}\n"
                             f"    after  {b['lowering']} {b['tiles']}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(ALL), help="comma-separated: " + ", ".join(ALL))
    parser.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    parser.add_argument("--size", type=int, default=224, help="input height and width (default 224)")
    parser.add_argument("--hw", default="host", help="hardware description (default host)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--out", type=Path, help="write the plans to this JSON file")
    what.add_argument("--compare", type=Path, help="plan again and list every kernel whose plan differs from FILE's")
    args = parser.parse_args(argv)
    try:
        thread_counts = [int(t) for t in args.threads.split(",") if t.strip()]
    except ValueError:
        parser.error(f"--threads takes comma-separated integers, not {args.threads!r}")
    previous = None
    if args.compare:
        try:
            previous = json.loads(args.compare.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            print(f"net-plans: --compare {args.compare}: cannot read it: {exc}", file=sys.stderr)
            return 2
        if previous.get("xfc_output", {}).get("kind") != "net-plans":
            print(f"net-plans: --compare {args.compare}: not a file net_plans.py wrote", file=sys.stderr)
            return 2
    archs = networks_or_status("net-plans", args.only)
    if isinstance(archs, int):
        return archs
    from xfc.errors import XfcError
    from xfc.tiledb.hostdesc import load_hardware
    try:
        hw = load_hardware(args.hw, os.environ)
    except XfcError as exc:
        print(f"net-plans: --hw {args.hw}: {exc}", file=sys.stderr)
        return 2
    plans = {}
    with tempfile.TemporaryDirectory(prefix="xfc-net-plans-") as tmp:
        for arch in archs:
            path = Path(tmp) / f"{arch}.onnx"
            print(f"[net-plans] exporting {arch} ({args.size}x{args.size}) and planning it", file=sys.stderr)
            export(arch, path, args.size)
            for threads in thread_counts:
                try:
                    plans[f"{arch} t{threads}"] = network_plans(path, arch, hw, threads)
                except XfcError as exc:
                    print(f"net-plans: {arch} at {threads} thread(s) on {args.hw}: {exc}", file=sys.stderr)
                    return 2
    kernels = sum(len(p) for p in plans.values())
    if previous is not None:
        lines = compare(previous["plans"], plans)
        print("\n".join(lines) if lines else "no plan differs")
        print(f"{kernels} kernel plans compared: {len(lines)} differ")
        return 1 if lines else 0
    from xfc.outputs import write_json_result
    write_json_result(args.out, {"hw": args.hw, "size": args.size, "machine": machine_facts(), "plans": plans},
                      kind="net-plans")
    print(f"{kernels} kernel plans of {len(archs)} networks -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
