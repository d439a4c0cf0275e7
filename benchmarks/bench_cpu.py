#!/usr/bin/env python3
"""Host CPU benchmark: xfc kernels vs numpy (OpenBLAS), PyTorch (oneDNN) and onnxruntime.

    .venv/bin/python benchmarks/bench_cpu.py                 # all workloads, 1 and 2 threads
    .venv/bin/python benchmarks/bench_cpu.py --only mm_512,dw_mbv2_s1 --threads 1
    .venv/bin/python benchmarks/bench_cpu.py --plans hand    # hand plans instead of the synthesizer
    .venv/bin/python benchmarks/bench_cpu.py --sweep conv_r18_l1   # tile-parameter sweep (notes table)
    .venv/bin/python benchmarks/bench_cpu.py --isa avx2      # xfc's AVX2 kernels vs peers held to AVX2

--isa avx2 (or generic) targets `--hw host:avx2` and holds the peers to that ISA where they have a
switch: oneDNN (PyTorch) through ONEDNN_MAX_CPU_ISA, OpenBLAS (numpy) through OPENBLAS_CORETYPE.
onnxruntime's MLAS chooses its kernels from CPUID and has no such switch: it runs unrestricted and
the results say so (HELD_TO below). On a machine that lacks AVX-512, plain runs are AVX2 already.

Every peer runs in its own child process (one per library and thread count) with
OPENBLAS_NUM_THREADS / OMP_NUM_THREADS set before import, so thread pools never compete with each
other or with our kernels; our kernels are timed in this process, whose own OpenBLAS is pinned to
one thread (it is only used by the float64 reference check). OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE,
which can force a slow OpenBLAS kernel, are removed from the benchmark's environment (re-exec).
Timing: warm-up calls, then the median of repeats (at least MIN_REPEATS, about TARGET_S seconds).
Results: a table on stdout and benchmarks/results/cpu_host.json (written atomically; an existing --out
file is replaced only if xfc wrote it, see xfc/outputs.py).
"""
from __future__ import annotations

import os
import sys

_SCRUB = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
if any(v in os.environ for v in _SCRUB) and os.environ.get("XFC_BENCH_REEXEC") != "1":
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env["XFC_BENCH_REEXEC"] = "1"
    env["XFC_BENCH_SCRUBBED"] = ",".join(f"{k}={os.environ[k]}" for k in _SCRUB if k in os.environ)
    os.execve(sys.executable, [sys.executable, *sys.argv], env)
if "--peer-child" not in sys.argv:
    os.environ["OPENBLAS_NUM_THREADS"] = "1"  # this process only uses BLAS for the reference check

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

from xfc.ops.workloads import SUITE  # noqa: E402
from xfc.errors import XfcError  # noqa: E402
from xfc.ops.reference import check_output, make_inputs
from xfc.ops.spec import make_spec  # noqa: E402
from machine import warn_if_loaded  # noqa: E402

TARGET_S = 0.6
MIN_REPEATS = 10
WARMUP = 3

WORKLOADS = SUITE  # the suite is defined once, in xfc/workloads.py

# Hand-tuned plans for this AVX-512 host (see docs/notes/host-kernels.md); used with --plans hand.
HAND_TILES = {
    "mm_512": dict(mr=14, nr=32, kc=256),
    "mm_1024": dict(mr=14, nr=32, kc=256),
    "mm_bert": dict(mr=6, nr=64, kc=256),
    "conv_r18_c1": dict(mr=8, nr=48),
    "conv_r18_l1": dict(mr=8, nr=48),
    "conv_r18_l3": dict(mr=16, nr=16),
    "conv_pw": dict(mr=16, nr=16),
    "conv_s2": dict(mr=16, nr=16),
    "dw_mbv2_s1": dict(ow_vectors=2, oh_rows=4),
    "dw_mbv2_s2": dict(ow_vectors=2, oh_rows=4),
}


def spec_of(name):
    op, shape, kw = WORKLOADS[name]
    return make_spec(op, shape, **kw)


def time_fn(fn, flops):
    for _ in range(WARMUP):
        fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-6)
    repeats = max(MIN_REPEATS, min(500, int(TARGET_S / one)))
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    med = statistics.median(samples)
    return {"median_s": med, "min_s": min(samples), "gflops": flops / med / 1e9, "repeats": repeats}


# ---------------------------------------------------------------------------------------------
# Peers (each in a child process)
# ---------------------------------------------------------------------------------------------

def _peer_numpy(names, threads):
    out = {}
    for name in names:
        spec = spec_of(name)
        if spec.name != "matmul":
            continue
        a, b, _ = make_inputs(spec)
        # (OPENBLAS_CORETYPE, when set by --isa, is read by OpenBLAS when numpy loads it)
        a2, b2 = a[0], b[0]
        out[name] = time_fn(lambda: a2 @ b2, spec.flops)
    info = {}
    try:
        import threadpoolctl
        info = [{k: p.get(k) for k in ("internal_api", "version", "num_threads", "architecture")}
                for p in threadpoolctl.threadpool_info() if p.get("user_api") == "blas"]
    except ImportError:
        info = "threadpoolctl not installed"
    try:
        cfg = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        info = {"threadpoolctl": info, "numpy_blas": {k: cfg.get(k) for k in ("name", "version")}}
    except Exception:  # noqa: BLE001 - older numpy
        pass
    return out, info


def _peer_torch(names, threads):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    out = {}
    with torch.no_grad():
        for name in names:
            spec = spec_of(name)
            a, b, _ = (torch.from_numpy(x) for x in make_inputs(spec))
            if spec.name == "matmul":
                a2, b2 = a[0], b[0]
                out[name] = time_fn(lambda: torch.matmul(a2, b2), spec.flops)
            else:
                kw = dict(stride=(spec.stride_h, spec.stride_w), dilation=(spec.dilation_h, spec.dilation_w))
                symmetric = spec.pad_top == spec.pad_bottom and spec.pad_left == spec.pad_right
                assert symmetric, "benchmark workloads use symmetric padding"
                groups = spec.c if spec.name == "depthwise" else 1
                pad = (spec.pad_top, spec.pad_left)
                out[name] = time_fn(lambda: F.conv2d(a, b, padding=pad, groups=groups, **kw), spec.flops)
    info = {"version": torch.__version__, "mkldnn": torch.backends.mkldnn.is_available(),
            "threads": torch.get_num_threads()}
    return out, info


def _onnx_model(spec):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    a, b, _ = make_inputs(spec)
    if spec.name == "matmul":
        node = helper.make_node("MatMul", ["A", "B"], ["Y"])
        x_shape, y_shape, feed = [spec.m, spec.k], [spec.m, spec.n], a[0]
        init = numpy_helper.from_array(b[0], "B")
    else:
        groups = spec.c if spec.name == "depthwise" else 1
        node = helper.make_node("Conv", ["A", "B"], ["Y"], group=groups, kernel_shape=[spec.r, spec.s],
                                strides=[spec.stride_h, spec.stride_w], dilations=[spec.dilation_h, spec.dilation_w],
                                pads=[spec.pad_top, spec.pad_left, spec.pad_bottom, spec.pad_right])
        x_shape, y_shape, feed = list(spec.operand_shapes[0]), list(spec.output_shape), a
        init = numpy_helper.from_array(b, "B")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, y_shape)], initializer=[init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString(), feed


def _peer_onnxruntime(names, threads):
    import onnxruntime as ort
    out = {}
    for name in names:
        spec = spec_of(name)
        blob, feed = _onnx_model(spec)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])
        out[name] = time_fn(lambda: sess.run(None, {"A": feed}), spec.flops)
    return out, {"version": ort.__version__, "note": "weights are initializers (prepacked by onnxruntime)"}


PEERS = {"numpy": _peer_numpy, "torch": _peer_torch, "onnxruntime": _peer_onnxruntime}


# How each peer is held to a narrower ISA: environment for its child process, or None when it
# cannot be held (it then runs unrestricted, and the results record that).
HELD_TO = {
    "avx2": {"numpy": {"OPENBLAS_CORETYPE": "Haswell"}, "torch": {"ONEDNN_MAX_CPU_ISA": "AVX2"}, "onnxruntime": None},
    "generic": {"numpy": {"OPENBLAS_CORETYPE": "Prescott"}, "torch": {"ONEDNN_MAX_CPU_ISA": "SSE41"},
                "onnxruntime": None},
}


def peer_isa_note(isa: str | None, peer: str) -> str:
    if isa is None:
        return "unrestricted"
    held = HELD_TO[isa][peer]
    if held is None:
        return f"unrestricted: {peer} has no switch to hold it to {isa} (it picks kernels from CPUID)"
    return "held to " + isa + " by " + ", ".join(f"{k}={v}" for k, v in held.items())


def run_peer_child(peer, names, threads, timeout=900, isa=None):
    env = dict(os.environ)
    env.pop("XFC_BENCH_REEXEC", None)
    held = (HELD_TO[isa][peer] or {}) if isa else {}
    env.update(held)
    if held:
        env["XFC_BENCH_REEXEC"] = "1"   # the child keeps OPENBLAS_CORETYPE (the scrub at the top is for users' leftovers)
    return run_json_child(Path(__file__), ["--peer-child", peer, "--threads", str(threads), "--only", ",".join(names)],
                          threads, env, timeout)


def run_json_child(script: Path, args: list, threads: int, env: dict, timeout: float):
    """Run a benchmark script as a child process (its own thread-count variables set before any
    library loads) and read (results, info) from the JSON on its last stdout line; on a timeout
    or a failure, ({}, {"error": one line})."""
    env = dict(env)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    argv = [sys.executable, str(Path(script).resolve()), *args]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {}, {"error": f"timed out after {timeout} s"}
    if proc.returncode != 0:
        return {}, {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:300]}
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return data["results"], data["info"]


# ---------------------------------------------------------------------------------------------
# Ours
# ---------------------------------------------------------------------------------------------

def synthesis_inputs(choice: str, hw, say):
    """(evaluator or None, constants or None, JSON entry) for --tile-db PATH|auto|off, as `xfc synth`
    resolves it (xfc.tiledb.evaluators.synthesis_evaluator; a missing database is the static model)."""
    from xfc.tiledb.evaluators import synthesis_evaluator
    if choice == "off":
        return None, None, {"choice": choice, "constants": "static"}
    evaluator = synthesis_evaluator(choice, hw, None, os.environ, say)
    if evaluator is None:
        return None, None, {"choice": choice, "constants": "static"}
    constants = evaluator.constants()
    entry = {"choice": choice, "path": str(evaluator.db.path) if evaluator.db is not None else None,
             "constants": "calibrated" if evaluator.calibrated else "static", "constant_values": constants.as_dict()}
    return evaluator, constants, entry


def get_planner(kind, isa=None, tile_db="auto"):
    """(plan_fn(name, spec, threads) -> plan, description, tile-db entry). The host as
    `xfc synth --hw host` sees it: measured by the host probe (xfc.tiledb.hostdesc), `host:<isa>`
    with --isa, and the tile database's micro-tile scores and calibrated constants (--tile-db)."""
    from xfc.cpu.cost_model import DEFAULT_CONSTANTS
    from xfc.cpu.plans import hand_plan
    from xfc.cpu.synth import synthesize_cpu
    from xfc.tiledb.hostdesc import load_hardware
    if kind != "hand":
        say = (lambda m: print(f"bench_cpu: {m}", file=sys.stderr))
        hw = load_hardware(f"host:{isa}" if isa else "host", os.environ, warn=say)
        evaluator, constants, entry = synthesis_inputs(tile_db, hw, say)
        return ((lambda name, spec, threads: synthesize_cpu(spec, hw, threads=threads, evaluator=evaluator,
                                                            constants=constants or DEFAULT_CONSTANTS).plan),
                f"xfc.cpu.synth.synthesize_cpu ({hw.name}; {hw.notes})", entry)

    if isa not in (None, "avx512"):
        raise XfcError(f"--plans hand: the hand plans are AVX-512 tiles; use --plans synth with --isa {isa}")

    def hand(name, spec, threads):
        return hand_plan(spec, "avx512", threads, **HAND_TILES.get(name, {}))
    return hand, "hand plans (benchmarks/bench_cpu.py HAND_TILES)", {"choice": "not used (hand plans)"}


def run_ours(name, spec, threads, planner, build_root):
    from xfc.pipeline import stages
    from xfc.cpu.codegen import render_cpu_kernel
    t0 = time.perf_counter()
    plan = planner(name, spec, threads)
    synth_s = time.perf_counter() - t0
    rendered = render_cpu_kernel(plan)
    kernel = stages.build(rendered, build_root / f"{name}_t{threads}").host   # the chain's host build
    a, b, bias = make_inputs(spec)
    ok, max_err, ratio = check_output(spec, kernel(a, b, bias), a, b, bias)
    ok_packed, _, ratio_packed = check_output(spec, kernel.run_packed(a, kernel.prepack(b), bias), a, b, bias)
    m = kernel.time(a, b, bias, repeats=max(MIN_REPEATS, 1), warmup=WARMUP)
    repeats = max(MIN_REPEATS, min(500, int(TARGET_S / max(m.median_s, 1e-6))))
    # Weights pre-packed once (as onnxruntime does for initializers), then packing per call.
    m = kernel.time(a, b, bias, repeats=repeats, warmup=WARMUP, prepacked=True)
    per_call = kernel.time(a, b, bias, repeats=repeats, warmup=WARMUP)
    tiles = (dict(mr=plan.gemm.mr, nr=plan.gemm.nr, k_unroll=plan.gemm.k_unroll, kc=plan.gemm.kc, mc=plan.gemm.mc,
                  nc=plan.gemm.nc, split=plan.gemm.parallel_axis, a_pack=plan.gemm.a_pack,
                  lowering=plan.lowering) if plan.gemm else
             dict(oh_rows=plan.depthwise.oh_rows, ow_vectors=plan.depthwise.ow_vectors))
    return {"gflops": m.gflops, "median_s": m.median_s, "min_s": m.min_s, "repeats": len(m.samples_s),
            "weights": "pre-packed once (untimed)", "gflops_packing_per_call": per_call.gflops,
            "median_s_packing_per_call": per_call.median_s,
            "verified": bool(ok and ok_packed), "error_ratio": max(ratio, ratio_packed), "synthesis_s": synth_s, "isa": plan.isa, "tiles": tiles,
            "where": m.where}


# The committed results predate the "xfc_output" key; files with all of these keys are ours too.
RESULT_LEGACY_KEYS = ("geomean_ratio_1t_matmul_conv", "workloads", "machine")


def machine_facts() -> dict:
    """The CPU the figures were measured on (model, ISAs, core count), so results from different
    machines are never compared by mistake."""
    from xfc.hardware.host import available_isas, parse_cpuinfo
    try:
        cpuinfo = parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        cpuinfo = {}
    return {"cpu_model": cpuinfo.get("model name", platform.processor() or "unknown"),
            "host_isas": list(available_isas(cap=None)), "cpus": os.cpu_count(), "platform": platform.platform()}


def write_results(path: Path, data):
    """Atomic, and never over a file xfc did not write (xfc.outputs)."""
    from xfc.outputs import write_json_result
    write_json_result(path, data, kind="bench_cpu_host", option="--out", legacy_keys=RESULT_LEGACY_KEYS,
                      sort_keys=True)


def sweep(names, build_root):
    """Tile-parameter sweep with hand plans (the tables in docs/host-kernel-notes.md)."""
    from xfc.pipeline import stages
    from xfc.cpu.plans import hand_plan
    from xfc.cpu.codegen import render_cpu_kernel
    grid = [dict(mr=14, nr=32), dict(mr=12, nr=32), dict(mr=8, nr=48), dict(mr=6, nr=64), dict(mr=16, nr=16),
            dict(mr=28, nr=16), dict(mr=14, nr=32, kc=128), dict(mr=14, nr=32, kc=512),
            dict(mr=14, nr=32, k_unroll=1), dict(mr=14, nr=32, loop_order="ir_jr"),
            dict(mr=14, nr=32, prefetch_c=False), dict(mr=6, nr=16, isa="avx2"),
            dict(mr=4, nr=24, isa="avx2")]
    for name in names:
        spec = spec_of(name)
        a, b, bias = make_inputs(spec)
        rows = grid if spec.name != "depthwise" else [
            dict(oh_rows=r, ow_vectors=v) for r in (1, 2, 4, 6) for v in (1, 2, 3)]
        for ov in rows:
            ov = dict(ov)
            isa = ov.pop("isa", "avx512")
            if isa == "avx2" and spec.name != "depthwise":
                ov.setdefault("gcc_march", "native")  # same compiler, 8-lane dialect
            rendered = render_cpu_kernel(hand_plan(spec, isa, 1, **ov))
            kernel = stages.build(rendered, build_root / "sweep").host   # the chain's host build
            ok = check_output(spec, kernel(a, b, bias), a, b, bias)[0]
            m = kernel.time(a, b, bias, repeats=max(MIN_REPEATS, int(TARGET_S / kernel.time(a, b, bias, 2, 1).median_s)),
                            warmup=WARMUP)
            print(f"| {name} | {isa} | {', '.join(f'{k}={v}' for k, v in ov.items())} | {m.gflops:.1f} |"
                  + ("" if ok else " WRONG"), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated workload names")
    ap.add_argument("--threads", default="1,2", help="thread counts, e.g. 1,2")
    ap.add_argument("--plans", choices=("auto", "synth", "hand"), default="auto")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--rounds", type=int, default=3,
                    help="measure everything (peers and ours alike) this many times, interleaved, and keep each "
                         "one's best median: bursts of load from other VMs on the host then hit no single side "
                         "(default 3)")
    ap.add_argument("--peer-child", choices=tuple(PEERS), help=argparse.SUPPRESS)
    ap.add_argument("--sweep", default="", help="run the tile sweep for these workloads instead")
    ap.add_argument("--tile-db", default="auto", metavar="PATH|auto|off",
                    help="micro-tile scores and cost-model constants for synthesis, as `xfc synth --tile-db` "
                         "(default auto: this machine's calibration when the per-user database has it)")
    ap.add_argument("--isa", choices=("avx2", "generic"),
                    help="xfc targets host:<isa> and the peers are held to that ISA where they can be "
                         "(default: the widest the CPU has, peers unrestricted)")
    ap.add_argument("--out", help="result file (default benchmarks/results/cpu_host.json, "
                                  "cpu_host_<isa>.json with --isa)")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = str(REPO / "benchmarks" / "results" / (f"cpu_host_{args.isa}.json" if args.isa else "cpu_host.json"))
    names = [n for n in args.only.split(",") if n] or list(WORKLOADS)
    for n in names:
        if n not in WORKLOADS:
            ap.error(f"unknown workload '{n}' (choose from {', '.join(WORKLOADS)})")
    thread_counts = [int(t) for t in args.threads.split(",")]

    if args.peer_child:
        results, info = PEERS[args.peer_child](names, thread_counts[0])
        print(json.dumps({"results": results, "info": info}))
        return 0

    if not args.sweep:   # refuse a foreign --out now, not after minutes of measuring
        from xfc.outputs import claim_file, json_is_ours
        try:
            claim_file(Path(args.out), json_is_ours(RESULT_LEGACY_KEYS), option="--out")
        except XfcError as exc:
            print(f"bench_cpu: error: {exc}", file=sys.stderr)
            return 2

    # A private build directory (never a fixed shared path: two users or two runs must not meet),
    # removed when the interpreter exits (finalizer of TemporaryDirectory).
    build_dir = tempfile.TemporaryDirectory(prefix="xfc-bench-cpu-")
    build_root = Path(build_dir.name)
    if args.sweep:
        sweep(args.sweep.split(","), build_root)
        return 0

    def best_of_rounds(results: list[dict]) -> dict:
        """The round with the highest GFLOP/s, plus every round's figure; a kernel that failed
        verification in any round stays failed."""
        best = dict(max(results, key=lambda r: r.get("gflops") or 0.0))
        best["round_gflops"] = [r.get("gflops") for r in results]
        if "verified" in best:
            best["verified"] = all(r["verified"] for r in results)
        return best

    rounds = max(1, args.rounds)
    try:
        planner, planner_desc, tile_db = get_planner(args.plans, args.isa, args.tile_db)
    except XfcError as exc:
        print(f"bench_cpu: error: {exc}", file=sys.stderr)
        return 2
    peer_rounds, our_rounds, peer_info = {}, {}, {}
    for round_no in range(1, rounds + 1):
        tag = f"[round {round_no}/{rounds}] "
        if not args.no_peers:
            for peer in PEERS:
                for t in thread_counts:
                    print(f"{tag}measuring {peer} ({t} thread{'s' if t > 1 else ''}) ...", file=sys.stderr, flush=True)
                    res, info = run_peer_child(peer, names, t, isa=args.isa)
                    if isinstance(info, dict):
                        info = {**info, "isa": peer_isa_note(args.isa, peer)}
                    peer_info[f"{peer}_t{t}"] = info
                    for name, r in res.items():
                        peer_rounds.setdefault((name, str(t), peer), []).append(r)
        for name in names:
            spec = spec_of(name)
            for t in thread_counts:
                print(f"{tag}measuring xfc {name} ({t}T) ...", file=sys.stderr, flush=True)
                our_rounds.setdefault((name, str(t)), []).append(run_ours(name, spec, t, planner, build_root))
    peers, ours = {}, {}
    for (name, t, peer), results in peer_rounds.items():
        peers.setdefault(name, {}).setdefault(t, {})[peer] = best_of_rounds(results)
    for (name, t), results in our_rounds.items():
        ours.setdefault(name, {})[t] = best_of_rounds(results)

    # table
    header = ("workload", "ours 1T", "best peer 1T", "ratio", "ours 2T", "2T/1T", "peer 2T", "1T pack/call",
              "synth s", "ok")
    rows, ratios_mm, ratios_dw = [], [], []
    for name in names:
        o1 = ours[name].get("1", {}).get("gflops")
        o2 = ours[name].get("2", {}).get("gflops")
        # With --isa only the peers held to that ISA are compared (an unrestricted one would
        # compare AVX-512 code with AVX2 code); they stay in the JSON.
        comparable = (lambda peer: args.isa is None or HELD_TO[args.isa][peer] is not None)
        p1 = {k: v for k, v in peers.get(name, {}).get("1", {}).items() if comparable(k)}
        p2 = {k: v for k, v in peers.get(name, {}).get("2", {}).items() if comparable(k)}
        best1 = max(p1.items(), key=lambda kv: kv[1]["gflops"]) if p1 else None
        best2 = max(p2.items(), key=lambda kv: kv[1]["gflops"]) if p2 else None
        ratio = o1 / best1[1]["gflops"] if (o1 and best1) else None
        if ratio:
            (ratios_dw if WORKLOADS[name][0] == "depthwise" else ratios_mm).append(ratio)
        ok = all(v["verified"] for v in ours[name].values())
        synth = max(v["synthesis_s"] for v in ours[name].values())
        rows.append((name, f"{o1:.1f}" if o1 else "-",
                     f"{best1[1]['gflops']:.1f} ({best1[0]})" if best1 else "-",
                     f"{ratio:.2f}x" if ratio else "-", f"{o2:.1f}" if o2 else "-",
                     f"{o2 / o1:.2f}x" if (o1 and o2) else "-",
                     f"{best2[1]['gflops']:.1f} ({best2[0]})" if best2 else "-",
                     f"{ours[name]['1']['gflops_packing_per_call']:.1f}" if "1" in ours[name] else "-",
                     f"{synth:.3f}", "yes" if ok else "NO"))
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    geo = math.exp(sum(map(math.log, ratios_mm)) / len(ratios_mm)) if ratios_mm else None
    warn_if_loaded()
    print("ours = weights pre-packed once (untimed), like onnxruntime's initializers; "
          "'1T pack/call' = the same kernel packing its weights on every call")
    if args.isa:
        for peer in PEERS:
            print(f"{peer}: {peer_isa_note(args.isa, peer)}")
    if geo:
        print(f"geometric mean ours/best-peer (matmul+conv, 1T): {geo:.2f}x; "
              f"min {min(ratios_mm):.2f}x" + (f"; depthwise min {min(ratios_dw):.2f}x" if ratios_dw else ""))

    data = {
        "machine": machine_facts(),
        "plans": planner_desc,
        "tile_db": tile_db,
        "isa": args.isa or "widest available",
        "peer_isa": {peer: peer_isa_note(args.isa, peer) for peer in PEERS},
        "scrubbed_env": os.environ.get("XFC_BENCH_SCRUBBED", ""),
        "load_average_at_end": os.getloadavg(),
        "note": "this 2-core VM may be shared; a load average above the thread count means contended timings",
        "timing": (f"median of >= {MIN_REPEATS} repeats after {WARMUP} warm-up calls (~{TARGET_S} s per point); "
                   f"best median of {rounds} interleaved round(s) for every library and ours alike "
                   "(round_gflops lists each round)"),
        "peer_info": peer_info,
        "workloads": {name: {"spec": spec_of(name).describe(), "flops": spec_of(name).flops,
                             "ours": ours.get(name, {}), "peers": peers.get(name, {})} for name in names},
        "geomean_ratio_1t_matmul_conv": geo,
    }
    try:
        write_results(Path(args.out), data)
    except XfcError as exc:
        print(f"bench_cpu: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
