#!/usr/bin/env python3
"""Host int8 benchmark: xfc int8 kernels vs onnxruntime's QLinearMatMul / QLinearConv.

    .venv/bin/python benchmarks/bench_int8.py                       # suite, 1 and 2 threads, 3 rounds
    .venv/bin/python benchmarks/bench_int8.py --only mm_512 --threads 1 --rounds 1
    .venv/bin/python benchmarks/bench_int8.py --quick               # one tiny shape, one round: checks it runs
    .venv/bin/python benchmarks/bench_int8.py --peak                # also the int8 ceiling (int8_peak.py)

Both sides compute the same thing on the same data (xfc.ops.quant.make_qinputs): uint8 activations
with zero point 128, int8 weights (zero point 0, per-tensor scale; --per-channel: one per output
channel) held as initializers (onnxruntime pre-packs them; xfc pre-packs once, untimed), uint8
output with zero point 128; conv2d / depthwise add an int32 bias (QLinearMatMul has none); no
activation (ONNX QLinear ops fuse none). onnxruntime's outputs are also compared with xfc's exact
reference: the exact-match share says whether both implement the same requantization (onnxruntime
forms the multiplier in fp32 arithmetic, xfc rounds the float64 product once, so a rare 1 LSB
difference is expected).

As in benchmarks/bench_cpu.py: onnxruntime runs in its own child process per thread count with
OMP_NUM_THREADS / intra_op_num_threads set; xfc kernels are timed in this process (C timing
loop); everything is measured --rounds times, interleaved, and the best median of each is kept.
The ops count is 2 x MACs (spec.flops); GOP/s. Results: a table and benchmarks/results/
int8_host.json (atomic, xfc-owned); the ratio columns and the geometric mean over the suite's
matmul + conv2d workloads at 1 thread are what issue 13 asks for. Run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_cpu  # noqa: E402  (time_fn, run_json_child)

import numpy as np  # noqa: E402

from xfc.errors import XfcError  # noqa: E402
from xfc.ops.quant import QuantParams, check_qoutput, make_qinputs, qreference, resolve_out_scale  # noqa: E402
from xfc.ops.spec import make_spec  # noqa: E402
from xfc.ops.workloads import MOBILENETV2_DEPTHWISE, SUITE  # noqa: E402

TARGET_S = 0.6
MIN_REPEATS = 10
WARMUP = 3
QUICK = {"tiny_mm": ("matmul", dict(m=8, n=16, k=32), {}),
         "tiny_conv": ("conv2d", dict(c=4, h=6, w=6, k=8, r=3, s=3), dict(pad=1))}


GROUPS = {"suite": SUITE, "mbv2_dw": MOBILENETV2_DEPTHWISE}


def workloads(quick: bool, group: str = "suite") -> dict:
    return QUICK if quick else GROUPS[group]


def spec_of(name: str, quick: bool = False):
    op, shape, kw = QUICK[name] if quick else {**SUITE, **MOBILENETV2_DEPTHWISE}[name]
    return make_spec(op, shape, bias=op != "matmul", **kw)


def quant_of(spec, per_channel: bool) -> QuantParams:
    return resolve_out_scale(spec, QuantParams(act_type="uint8", a_zero_point=128, per_channel=per_channel,
                                               out_zero_point=128))


def time_fn(fn, ops):
    """bench_cpu.time_fn, its rate named for int8 (GOP/s)."""
    timed = bench_cpu.time_fn(fn, ops)
    timed["gops"] = timed.pop("gflops")
    return timed


# ---------------------------------------------------------------------------------------------
# onnxruntime (child process)
# ---------------------------------------------------------------------------------------------

def onnx_model(spec, q: QuantParams, w, bias):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w_scale = (q.w_scale if not q.per_channel else None)
    from xfc.ops.quant import weight_scales
    scales = weight_scales(spec, q).astype(np.float32)
    inits = [numpy_helper.from_array(np.array(q.a_scale, np.float32), "x_scale"),
             numpy_helper.from_array(np.array(q.a_zero_point, np.uint8), "x_zp"),
             numpy_helper.from_array(np.array(q.out_scale, np.float32), "y_scale"),
             numpy_helper.from_array(np.array(q.out_zero_point, np.uint8), "y_zp")]
    if w_scale is not None:
        inits += [numpy_helper.from_array(np.array(w_scale, np.float32), "w_scale"),
                  numpy_helper.from_array(np.array(0, np.int8), "w_zp")]
    else:
        inits += [numpy_helper.from_array(scales, "w_scale"),
                  numpy_helper.from_array(np.zeros(scales.shape, np.int8), "w_zp")]
    if spec.name == "matmul":
        inits.append(numpy_helper.from_array(np.ascontiguousarray(w[0]), "W"))
        node = helper.make_node("QLinearMatMul", ["X", "x_scale", "x_zp", "W", "w_scale", "w_zp", "y_scale", "y_zp"],
                                ["Y"])
        x_shape, y_shape = [spec.m, spec.k], [spec.m, spec.n]
    else:
        inits += [numpy_helper.from_array(w, "W"), numpy_helper.from_array(bias.astype(np.int32), "B")]
        group = spec.c if spec.name == "depthwise" else 1
        node = helper.make_node("QLinearConv", ["X", "x_scale", "x_zp", "W", "w_scale", "w_zp", "y_scale", "y_zp", "B"],
                                ["Y"], group=group, kernel_shape=[spec.r, spec.s], strides=[spec.stride_h, spec.stride_w],
                                dilations=[spec.dilation_h, spec.dilation_w],
                                pads=[spec.pad_top, spec.pad_left, spec.pad_bottom, spec.pad_right])
        x_shape, y_shape = list(spec.operand_shapes[0]), list(spec.output_shape)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.UINT8, x_shape)],
                              [helper.make_tensor_value_info("Y", TensorProto.UINT8, y_shape)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def peer_onnxruntime(names, threads, per_channel, quick):
    import onnxruntime as ort
    out = {}
    for name in names:
        spec = spec_of(name, quick)
        q = quant_of(spec, per_channel)
        x, w, bias = make_qinputs(spec, q, seed=0)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(onnx_model(spec, q, w, bias), so, providers=["CPUExecutionProvider"])
        feed = {"X": x[0] if spec.name == "matmul" else x}
        got = sess.run(None, feed)[0].reshape(spec.output_shape)
        verdict = check_qoutput(spec, q, got, x, w, bias, expected=qreference(spec, q, x, w, bias))
        out[name] = {**time_fn(lambda: sess.run(None, feed), spec.flops),
                     "vs_xfc_reference": {"exact_share": verdict.exact_share, "max_lsb": verdict.max_lsb}}
        if spec.name != "matmul":
            out[name]["operator_node"] = profiled_operator(ort, spec, onnx_model(spec, q, w, bias), feed, threads)
    return out, {"version": ort.__version__, "note": "weights are initializers (pre-packed by onnxruntime); "
                                                     "uint8 activations, int8 weights"}


def profiled_operator(ort, spec, model: bytes, feed, threads: int, runs: int = 200) -> dict:
    """onnxruntime's own per-node profiler on the same model: the median kernel time of the
    QLinearConv node alone. onnxruntime runs its int8 convolutions channels-last, so the session
    above also times the NCHW <-> NHWC Transpose nodes it inserts around the operator (a whole
    channels-last network would not pay them); this figure leaves them out. The profiler reports
    whole microseconds."""
    with tempfile.TemporaryDirectory(prefix="xfc-ort-profile-") as tmp:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "ort")
        sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        for _ in range(WARMUP + runs):
            sess.run(None, feed)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    per_op: dict[str, list[float]] = {}
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            per_op.setdefault(event.get("args", {}).get("op_name", "?"), []).append(float(event["dur"]) * 1e-6)
    conv = [op for op in per_op if "Conv" in op]
    if len(conv) != 1:
        return {"error": f"expected one convolution node in the profile, found {sorted(per_op)}"}
    samples = per_op[conv[0]]
    samples = samples[len(samples) * WARMUP // (WARMUP + runs):]
    med = statistics.median(samples)
    return {"op": conv[0], "median_s": med, "gops": spec.flops / med / 1e9, "runs": len(samples),
            "other_nodes": {op: statistics.median(v) for op, v in per_op.items() if op != conv[0]}}


def run_peer_child(names, threads, per_channel, quick, group="suite", timeout=1800):
    args = (["--peer-child", "--threads", str(threads), "--group", group, "--only", ",".join(names)]
            + (["--per-channel"] if per_channel else []) + (["--quick"] if quick else []))
    return bench_cpu.run_json_child(Path(__file__), args, threads, dict(os.environ), timeout)


# ---------------------------------------------------------------------------------------------
# xfc (this process)
# ---------------------------------------------------------------------------------------------

def run_ours(name, threads, per_channel, quick, hw, build_root):
    from xfc.cpu.int8_synth import plan_int8
    from xfc.hardware.host import read_flags
    from xfc.ops.dtypes import INT8, make_operands
    from xfc.pipeline import stages
    spec = spec_of(name, quick)
    q = quant_of(spec, per_channel)
    t0 = time.perf_counter()
    plan = plan_int8(spec, q, hw, threads=threads, host_flags=frozenset(read_flags()))
    built = stages.realize(plan, build_root / f"{name}_t{threads}")
    build_s = time.perf_counter() - t0
    operands = make_operands(spec, INT8, seed=0, quant=plan.quant)
    outcome = stages.verify(built, operands)
    verdict = {"ok": outcome.ok, **outcome.check.report}
    probe = stages.run(built, operands, prepacked=False, repeat=MIN_REPEATS, warmup=WARMUP)
    repeats = max(MIN_REPEATS, min(500, int(TARGET_S / max(probe.median_s, 1e-6))))
    m = stages.run(built, operands, prepacked=True, repeat=repeats, warmup=WARMUP)
    per_call = stages.run(built, operands, prepacked=False, repeat=repeats, warmup=WARMUP)
    return {"gops": m.gflops, "median_s": m.median_s, "min_s": m.min_s, "repeats": repeats,
            "weights": "pre-packed once (untimed)", "gops_packing_per_call": per_call.gflops,
            "verified": bool(verdict["ok"]), "exact_share": verdict["exact_share"], "dialect": plan.dialect,
            "tile": [plan.mr, plan.nr], "lowering": plan.lowering, "threads_used": plan.threads,
            "build_s": build_s, "where": m.where}


def best_of_rounds(results: list[dict]) -> dict:
    best = dict(max(results, key=lambda r: r.get("gops") or 0.0))
    best["round_gops"] = [r.get("gops") for r in results]
    if "verified" in best:
        best["verified"] = all(r["verified"] for r in results)
    return best


def median_of_rounds(ours: list[dict], peers: list[dict], node: bool = False) -> Optional[float]:
    """The median over rounds of xfc / onnxruntime measured back to back in the same round (the
    figure that survives a loaded machine best: both sides of a pair see the same load). node:
    against onnxruntime's profiled QLinearConv node alone (profiled_operator)."""
    def peer_gops(p):
        return ((p or {}).get("operator_node") or {}).get("gops") if node else (p or {}).get("gops")
    pairs = [o["gops"] / peer_gops(p) for o, p in zip(ours, peers) if o.get("gops") and peer_gops(p)]
    return statistics.median(pairs) if pairs else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated workload names")
    ap.add_argument("--group", choices=sorted(GROUPS), default="suite",
                    help="the workloads: suite (xfc.ops.workloads.SUITE) or mbv2_dw (MobileNetV2's depthwise layers)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; in each, every workload is timed on both sides "
                                                          "back to back")
    ap.add_argument("--per-channel", action="store_true", help="per-output-channel weight scales on both sides")
    ap.add_argument("--quick", action="store_true", help="one tiny shape, one round, 1 thread: checks the script runs")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--peak", action="store_true", help="also measure the int8 ceiling (benchmarks/int8_peak.py)")
    ap.add_argument("--peer-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help="result file (default benchmarks/results/int8_host.json, --group "
                                                "mbv2_dw: int8_mbv2_dw_host.json; --quick: a temporary file unless given)")
    args = ap.parse_args(argv)
    table = workloads(args.quick, args.group)
    names = [n for n in args.only.split(",") if n] or (["tiny_mm"] if args.quick else list(table))
    for n in names:
        if n not in table:
            ap.error(f"unknown workload '{n}' (choose from {', '.join(table)})")
    threads = [int(t) for t in args.threads.split(",")]
    if args.quick:
        threads, args.rounds = threads[:1], 1
    if args.peer_child:
        results, info = peer_onnxruntime(names, threads[0], args.per_channel, args.quick)
        print(json.dumps({"results": results, "info": info}))
        return 0
    from machine import machine_facts
    from xfc.outputs import claim_file, json_is_ours, write_json_result
    from xfc.tiledb.hostdesc import load_hardware
    default_name = "int8_host.json" if args.group == "suite" else f"int8_{args.group}_host.json"
    out_path = Path(args.out) if args.out else (
        Path(tempfile.gettempdir()) / f"xfc-int8-quick-{os.getpid()}.json" if args.quick
        else REPO / "benchmarks" / "results" / default_name)
    try:
        claim_file(out_path, json_is_ours(()), option="--out")
        hw = load_hardware("host", os.environ, warn=lambda m: print(f"bench_int8: {m}", file=sys.stderr))
    except XfcError as exc:
        print(f"bench_int8: error: {exc}", file=sys.stderr)
        return 2
    build_dir = tempfile.TemporaryDirectory(prefix="xfc-bench-int8-")
    build_root = Path(build_dir.name)
    peer_rounds, our_rounds, peer_info = {}, {}, {}
    load_seen = []
    for round_no in range(1, max(1, args.rounds) + 1):
        tag = f"[round {round_no}/{args.rounds}] "
        for name in names:          # each workload on both sides back to back: the pair sees the same load
            for t in threads:
                load_seen.append(os.getloadavg()[0])
                if not args.no_peers:
                    print(f"{tag}measuring onnxruntime {name} ({t}T) ...", file=sys.stderr, flush=True)
                    res, info = run_peer_child([name], t, args.per_channel, args.quick, args.group)
                    peer_info[f"onnxruntime_t{t}"] = info
                    peer_rounds.setdefault((name, t), []).append(res.get(name))
                print(f"{tag}measuring xfc {name} ({t}T) ...", file=sys.stderr, flush=True)
                try:
                    our_rounds.setdefault((name, t), []).append(
                        run_ours(name, t, args.per_channel, args.quick, hw, build_root))
                except XfcError as exc:
                    our_rounds.setdefault((name, t), []).append({"gops": None, "verified": False, "error": str(exc)})
    rows, ratios = [], []
    results = {}
    for name in names:
        entry = results.setdefault(name, {"operator": table[name][0]})
        for t in threads:
            ours = best_of_rounds(our_rounds[(name, t)])
            peer_list = [p for p in peer_rounds.get((name, t), []) if p]
            peer = best_of_rounds(peer_list) if peer_list else None
            ratio = ours["gops"] / peer["gops"] if (peer and ours.get("gops")) else None
            paired = median_of_rounds(our_rounds[(name, t)], peer_rounds.get((name, t), []))
            paired_node = median_of_rounds(our_rounds[(name, t)], peer_rounds.get((name, t), []), node=True)
            entry[str(t)] = {"xfc": ours, "onnxruntime": peer, "ratio": ratio, "ratio_median_of_rounds": paired,
                             "ratio_vs_operator_node_median_of_rounds": paired_node,
                             "round_ratios": [(o["gops"] / p["gops"]) if (o.get("gops") and p and p.get("gops"))
                                              else None
                                              for o, p in zip(our_rounds[(name, t)], peer_rounds.get((name, t), []))]}
            if t == 1 and ratio and table[name][0] in ("matmul", "conv2d"):
                ratios.append(ratio)
            rows.append((name, str(t), f"{ours['gops']:.1f}" if ours.get("gops") else "-",
                         f"{peer['gops']:.1f}" if peer else "-", f"{ratio:.2f}x" if ratio else "-",
                         f"{paired:.2f}x" if paired else "-", f"{paired_node:.2f}x" if paired_node else "-",
                         f"{ours.get('gops_packing_per_call', 0):.1f}", ours.get("dialect", "-"),
                         "yes" if ours.get("verified") else "NO",
                         f"{peer['vs_xfc_reference']['exact_share']:.4f}" if peer else "-"))
    header = ("workload", "T", "xfc GOP/s", "ort GOP/s", "ratio", "paired", "paired node", "xfc pack/call", "dialect", "exact",
              "ort==ref")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    print("ratio: best median of xfc / best median of onnxruntime's session over the rounds; paired: the median over "
          "rounds of that ratio measured back to back; paired node: the same against onnxruntime's profiled "
          "convolution node alone (without the layout Transposes its session runs around it)")
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
    data = {"machine": machine_facts(), "hardware_notes": hw.notes, "threads": threads, "rounds": args.rounds,
            "group": args.group, "command": " ".join(["benchmarks/bench_int8.py", *(argv if argv is not None
                                                                                     else sys.argv[1:])]),
            "load_average_1min_during_run": {"min": min(load_seen), "max": max(load_seen),
                                             "median": statistics.median(load_seen)} if load_seen else None,
            "per_channel": args.per_channel, "quick": args.quick, "peers": peer_info, "workloads": results,
            "geomean_ratio_1t_matmul_conv": geo, "min_ratio_1t_matmul_conv": min(ratios) if ratios else None,
            "quantization": "uint8 activations zp 128, int8 weights zp 0, uint8 output zp 128, out_scale auto"}
    if args.peak:
        from int8_peak import measure
        data["int8_peak"] = measure(quick=args.quick)
    write_json_result(out_path, data, kind="bench_int8_host", sort_keys=True)
    if geo:
        print(f"geometric mean xfc/onnxruntime at 1 thread over matmul + conv2d: {geo:.2f}x (min {min(ratios):.2f}x)")
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
