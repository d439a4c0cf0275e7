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

With --quantize qdq|qoperator the network is quantized first (onnxruntime.quantization, as
benchmarks/net_bench.py does) and every step of xfc's int8 network (layers and runtime ops; there is
no per-layer "alone" column for int8 models) is set beside onnxruntime's profiled node of the same
name in the quantized model, each conv with its GOP/s.

Layers are sorted by how much slower xfc runs in the network than onnxruntime's node. The sums say how
much the network costs beyond its kernels alone (cache state, cross-core traffic, the steps between
kernels). Each `xfc model` run is a separate process; the machine's noise is in every column (compare
the two whole-network figures the profile run prints with it). Writes
benchmarks/results/net_steps_<net>[_<format>]_t<threads>.json, or --out-name (machine named). Needs torch
(`make bench-setup`).
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


def whole_network(network_report: dict) -> dict:
    """The benchmark program's median, onnxruntime's session median and their ratio."""
    bench = network_report["network_bench"]
    return dict(xfc_median_ms=bench["xfc"]["median_ms"], onnxruntime_median_ms=bench["onnxruntime"]["median_ms"],
                speedup=bench["speedup"])


def whole_network_text(whole: dict) -> str:
    return (f"Whole network: xfc {whole['xfc_median_ms']:.3f} ms, onnxruntime {whole['onnxruntime_median_ms']:.3f} ms "
            f"(x{whole['speedup']:.2f})")


def write_result(path: Path, payload: dict) -> None:
    """The results file (the machine named), and its path on stderr."""
    write_json_result(path, dict(machine=machine_facts(), **payload), kind="net-steps")
    print(f"-> {path}", file=sys.stderr)


def onnxruntime_texts(in_network_ms: float, onnxruntime_ms) -> tuple[str, str]:
    """onnxruntime's node time and xfc's gap to it, as the tables print them ('-' and '': no node)."""
    if onnxruntime_ms is None:
        return "-", ""
    return f"{onnxruntime_ms:.3f}", f"{in_network_ms - onnxruntime_ms:+.3f}"


def onnxruntime_node_ms(model: Path, threads: int, repeat: int, tmp: Path) -> dict[str, tuple[float, str]]:
    """{node name: (median ms of its kernel time, op type)} from onnxruntime's profiler over `repeat`
    runs of the session (same random input as xfc's benchmark program draws: the values do not
    change the time). onnxruntime renames some nodes (a '_token_N' suffix): it is dropped."""
    import re
    import numpy as np
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp / "ort-profile")
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    feeds = {}
    for arg in session.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in arg.shape]
        feeds[arg.name] = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for _ in range(repeat):
        session.run(None, feeds)
    events = json.loads(Path(session.end_profiling()).read_text())
    per_node: dict[str, list] = {}
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            name = re.sub(r"_token_\d+$", "", event["name"][:-len("_kernel_time")])
            per_node.setdefault(name, []).append((event["dur"], event.get("args", {}).get("op_name", "")))
    return {name: (float(np.median([d for d, _ in runs])) / 1e3, runs[0][1]) for name, runs in per_node.items()}


def quantized_rows(network_report: dict, nodes: dict) -> list[dict]:
    """One row per step of xfc's int8 network, onnxruntime's node of the same name beside it."""
    rows = []
    for step in network_report["network_bench"]["profile"]["steps"]:
        node = nodes.get(step["name"])
        rows.append(dict(step=step["step"], node=step["name"], what=step["what"], in_network_ms=step["ms"],
                         gops=step.get("gflops"), onnxruntime_ms=None if node is None else node[0],
                         onnxruntime_op=None if node is None else node[1]))
    return rows


def main_quantized(args) -> int:
    from xfc.model.quantized_peer import quantize_with_onnxruntime
    with tempfile.TemporaryDirectory(prefix="xfc-net-steps-") as tmp_name:
        tmp = Path(tmp_name)
        path = tmp / f"{args.net}.onnx"
        export(args.net, path, args.size)
        print(f"[net-steps] quantizing {args.net} ({args.quantize}) with onnxruntime.quantization", file=sys.stderr)
        model = quantize_with_onnxruntime(path, tmp / f"{args.net}_{args.quantize}.onnx", args.quantize)
        network = xfc_model(model, args.threads, args.repeat, tmp / "lib", ["--emit", "lib", "--profile"])
        nodes = onnxruntime_node_ms(model, args.threads, args.repeat, tmp)
    rows = quantized_rows(network, nodes)
    matched = {r["node"] for r in rows}
    unmatched = {name: ms for name, (ms, _op) in nodes.items() if name not in matched}
    rows.sort(key=lambda r: -(r["in_network_ms"] - (r["onnxruntime_ms"] or 0.0)))
    print(f"{'step':>4} {'in net ms':>9} {'ort ms':>7} {'net-ort':>8} {'GOP/s':>6}  step")
    for r in rows[:args.top]:
        ort_text, gap_text = onnxruntime_texts(r["in_network_ms"], r["onnxruntime_ms"])
        gops_text = "" if r["gops"] is None else f"{r['gops']:.0f}"
        print(f"{r['step']:>4} {r['in_network_ms']:>9.3f} {ort_text:>7} {gap_text:>8} {gops_text:>6}  {r['what'][:80]}")
    sums = dict(in_network_ms=sum(r["in_network_ms"] for r in rows),
                onnxruntime_matched_ms=sum(r["onnxruntime_ms"] or 0.0 for r in rows),
                onnxruntime_unmatched_ms=sum(unmatched.values()))
    whole = whole_network(network)
    print(f"{len(rows)} steps in the network {sums['in_network_ms']:.3f} ms; onnxruntime's nodes of the same names "
          f"{sums['onnxruntime_matched_ms']:.3f} ms (profiled: the profiler adds to every node), its other nodes "
          f"{sums['onnxruntime_unmatched_ms']:.3f} ms. {whole_network_text(whole)}")
    write_result(args.results / (args.out_name or f"net_steps_{args.net}_{args.quantize}_t{args.threads}.json"),
                 dict(net=args.net, format=args.quantize, threads=args.threads, size=args.size, repeat=args.repeat,
                      sums=sums, whole_network=whole, rows=rows, onnxruntime_unmatched_ms=unmatched,
                      command=f"benchmarks/net_steps.py --net {args.net} --quantize {args.quantize} "
                              f"--threads {args.threads}"))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--net", default="mobilenet_v2", help="one network: " + ", ".join(ALL))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--size", type=int, default=224, help="input height and width (default 224)")
    parser.add_argument("--repeat", type=int, default=30, help="timed runs per layer / per round (default 30)")
    parser.add_argument("--top", type=int, default=20, help="rows printed (default 20; the JSON has all)")
    parser.add_argument("--quantize", choices=("qdq", "qoperator"),
                        help="quantize the network first (int8) and compare every step with onnxruntime's node")
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--out-name", help="the results file's name in --results (default "
                                           "net_steps_<net>[_<format>]_t<threads>.json): another machine's "
                                           "file of the default name is kept by naming this run's")
    args = parser.parse_args(argv)
    archs = networks_or_status("net-steps", args.net)
    if isinstance(archs, int):
        return archs
    if len(archs) != 1:
        print(f"net-steps: --net takes one network, not {args.net}", file=sys.stderr)
        return 2
    if args.quantize:
        return main_quantized(args)
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
        ort_text, gap_text = onnxruntime_texts(r["in_network_ms"], r["onnxruntime_ms"])
        print(f"{r['step']:>4} {r['alone_ms']:>9.3f} {r['in_network_ms']:>9.3f} {ort_text:>7} {gap_text:>8}"
              f"  {r['what'][:90]}")
    sums = dict(alone_ms=sum(r["alone_ms"] for r in rows), in_network_ms=sum(r["in_network_ms"] for r in rows),
                onnxruntime_ms=sum(r["onnxruntime_ms"] or 0.0 for r in rows), other_steps_in_network_ms=others)
    whole = whole_network(network)
    print(f"{len(rows)} layers: alone {sums['alone_ms']:.3f} ms, in the network {sums['in_network_ms']:.3f} ms, "
          f"onnxruntime's nodes {sums['onnxruntime_ms']:.3f} ms; other steps in the network "
          f"{others:.3f} ms. {whole_network_text(whole)}")
    write_result(args.results / (args.out_name or f"net_steps_{args.net}_t{args.threads}.json"),
                 dict(net=args.net, threads=args.threads, size=args.size, repeat=args.repeat,
                      onnxruntime=alone["bench"]["onnxruntime"], sums=sums, whole_network=whole, rows=rows,
                      command=f"benchmarks/net_steps.py --net {args.net} --threads {args.threads}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
