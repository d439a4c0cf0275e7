#!/usr/bin/env python3
"""Where a whole network spends its time, layer by layer, three ways, in one run on this host:

    .venv/bin/python benchmarks/net_steps.py --net mobilenet_v2 --threads 1
    .venv/bin/python benchmarks/net_steps.py --net mobilenet_v3 --threads 2 --top 15

  alone        the layer's kernel timed in its own C loop, weights pre-packed, its operands hot
               (`xfc model NET --bench`: planned as `xfc synth` plans it, which for a network planned
               from memory, report field network.weights_planned_from, can be another Winograd plan
               than the network's; none of benchmarks/nets.py's networks on the Zen 4 host)
  in network   the same layer as a step of the emitted network's benchmark program (`xfc model NET
               --emit lib --bench --profile`): its inputs are what the step before wrote, its output
               goes to the arena, its weights come from wherever the last inference left them
  onnxruntime  onnxruntime's per-node profiler time of the node(s) the layer covers, same thread
               count (from the first run; fused nodes matched to layers as `xfc model --bench` does;
               the profiler adds its own cost to every node, so these sum to more than session.run)

Layers are sorted by how much slower xfc runs in the network than onnxruntime's node. The sums say how
much the network costs beyond its kernels alone (cache state, cross-core traffic, the steps between
kernels). Each `xfc model` run is a separate process; the machine's noise is in every column (compare
the two whole-network figures the profile run prints with it). Writes
benchmarks/results/net_steps_<net>_t<threads>.json (machine named). Needs torch (`make bench-setup`).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import machine_facts
from nets import ALL, export, networks_or_status

from xfc.outputs import write_json_result

REPO = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 3600


def xfc_model(path: Path, threads: int, repeat: int, out: Path, extra: list[str]) -> dict:
    argv = [sys.executable, "-m", "xfc", "model", str(path), "--hw", "host", "--threads", str(threads),
            "--bench", "--repeat", str(repeat), "--json", "-o", str(out), *extra]
    print(f"[net-steps] xfc model {' '.join(argv[4:])}", file=sys.stderr, flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=str(REPO))
    if proc.returncode != 0 or not proc.stdout.strip():
        sys.stderr.write(proc.stderr[-3000:])
        raise SystemExit(proc.returncode or 1)
    return json.loads(proc.stdout)


def join(layers_report: dict, network_report: dict) -> tuple[list[dict], float]:
    """One row per covered layer (alone, in network, onnxruntime), and the in-network time of the
    steps that are not layers (runtime ops)."""
    steps = network_report["network_bench"]["profile"]["steps"]
    layers = {layer["node"]: layer for layer in layers_report["layers"]
              if layer["node"] and layer.get("measured_seconds") is not None}
    rows, joined = [], set()
    for step in steps:   # a step per layer (by its ONNX node); every other step (runtime ops) apart
        layer = layers.get(step["name"])
        if layer is None or step["name"] in joined:
            continue
        joined.add(step["name"])
        ort = layer.get("onnxruntime_seconds")
        rows.append(dict(step=step["step"], node=layer["node"], what=step["what"],
                         alone_ms=layer["measured_seconds"] * 1e3, in_network_ms=step["ms"],
                         onnxruntime_ms=None if ort is None else ort * 1e3))
    matched = {r["step"] for r in rows}
    others = sum(s["ms"] for s in steps if s["step"] not in matched)
    return rows, others


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--net", default="mobilenet_v2", help="one network: " + ", ".join(ALL))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--size", type=int, default=224, help="input height and width (default 224)")
    parser.add_argument("--repeat", type=int, default=30, help="timed runs per layer / per round (default 30)")
    parser.add_argument("--top", type=int, default=20, help="rows printed (default 20; the JSON has all)")
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args(argv)
    archs = networks_or_status("net-steps", args.net)
    if isinstance(archs, int):
        return archs
    if len(archs) != 1:
        print(f"net-steps: --net takes one network, not {args.net}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="xfc-net-steps-") as tmp_name:
        tmp = Path(tmp_name)
        path = tmp / f"{args.net}.onnx"
        export(args.net, path, args.size)
        alone = xfc_model(path, args.threads, args.repeat, tmp / "layers", [])
        network = xfc_model(path, args.threads, args.repeat, tmp / "lib", ["--emit", "lib", "--profile"])
    rows, others = join(alone, network)
    rows.sort(key=lambda r: -(r["in_network_ms"] - (r["onnxruntime_ms"] or 0.0)))
    print(f"{'step':>4} {'alone ms':>9} {'in net ms':>9} {'ort ms':>7} {'net-ort':>8}  layer")
    for r in rows[:args.top]:
        ort = r["onnxruntime_ms"]
        ort_text = "-" if ort is None else f"{ort:.3f}"
        gap_text = "" if ort is None else f"{r['in_network_ms'] - ort:+.3f}"
        print(f"{r['step']:>4} {r['alone_ms']:>9.3f} {r['in_network_ms']:>9.3f} {ort_text:>7} {gap_text:>8}"
              f"  {r['what'][:90]}")
    sums = dict(alone_ms=sum(r["alone_ms"] for r in rows), in_network_ms=sum(r["in_network_ms"] for r in rows),
                onnxruntime_ms=sum(r["onnxruntime_ms"] or 0.0 for r in rows), other_steps_in_network_ms=others)
    bench = network["network_bench"]
    whole = dict(xfc_median_ms=bench["xfc"]["median_ms"], onnxruntime_median_ms=bench["onnxruntime"]["median_ms"],
                 speedup=bench["speedup"])
    print(f"{len(rows)} layers: alone {sums['alone_ms']:.3f} ms, in the network {sums['in_network_ms']:.3f} ms, "
          f"onnxruntime's nodes {sums['onnxruntime_ms']:.3f} ms; other steps in the network "
          f"{others:.3f} ms. Whole network: xfc {whole['xfc_median_ms']:.3f} ms, onnxruntime "
          f"{whole['onnxruntime_median_ms']:.3f} ms (x{whole['speedup']:.2f})")
    out = args.results / f"net_steps_{args.net}_t{args.threads}.json"
    write_json_result(out, dict(machine=machine_facts(), net=args.net, threads=args.threads, size=args.size,
                                repeat=args.repeat, onnxruntime=alone["bench"]["onnxruntime"],
                                sums=sums, whole_network=whole, rows=rows,
                                command=f"benchmarks/net_steps.py --net {args.net} --threads {args.threads}"),
                      kind="net-steps")
    print(f"-> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
