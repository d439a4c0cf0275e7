#!/usr/bin/env python3
"""Whole networks in C against onnxruntime on this machine (issue 32; not run in CI).

Builds the CNN families of benchmarks/nets.py with seeded random weights (MobileNetV2, ResNet-18,
MobileNetV3-Large with squeeze-excitation and hard-swish, ResNet-50's bottlenecks, ShuffleNet v1
with grouped convolutions and channel shuffle, a small U-Net with Concat and nearest upsampling),
exports each to ONNX at run time (nothing is downloaded) and runs, per thread count,

    xfc model NET.onnx --hw host --emit lib --bench --threads T --repeat RUNS [--verify] --json

which synthesizes the network's kernels for T threads, builds the library and its benchmark program,
and times the program (its own C loop, median of RUNS after 3 warm-ups) alternately with
onnxruntime's whole session.run (same inputs, intra_op_num_threads = T, default optimizations),
three rounds each; the medians of the round medians are compared (speedup = onnxruntime / xfc).
With more than one thread both runtimes keep their defaults (--thread-wait spin: idle threads spin a
while, then sleep; --thread-wait passive for a shared, loaded machine: xfc/model/runtime/bench.py).
Before and after each run with more than one thread, benchmarks/cpu_share.py's probes record where
the machine's CPUs were (`cpu_share_before`/`cpu_share_after` in the JSON): on the project's VMs the
host sometimes runs the two vCPUs on core complexes that share no cache (the probes' handoff ratio
~13x instead of ~3.5x), where both runtimes at 2 threads run about as fast as at 1; the state changes
within tens of seconds, so the probes around a run catch some of it, not all
(benchmarks/net_states.py files every round under the state it ran in).
--verify (the first thread count) checks the C network's outputs against onnxruntime under the
derived bound and every step on its own inputs.

int8 (issue 33): --quantize qdq,qoperator quantizes each exported network with onnxruntime's
quantize_static (xfc.model.quantized_peer: per-channel int8 weights with reduce_range (7-bit, which
onnxruntime's u8 x s8 kernels sum exactly without VNNI), uint8 activations, a small random calibration set) and runs the quantized model instead: xfc's int8 network (every step checked byte
for byte against xfc's oracle with --verify) against onnxruntime running the same quantized model.
--hw host:avx2 plans xfc's kernels for AVX2 on an AVX-512 host (the int8 kernels then use vpmaddwd,
not VNNI); onnxruntime is not restricted.

    .venv/bin/python benchmarks/net_bench.py --only mobilenet_v2,resnet18 --quantize qdq,qoperator \
        --threads 1 --out-name int8_net_bench.json

Writes benchmarks/results/net_bench.json (the machine named: CPU model, ISAs, cores, load) and prints
a table with the geometric mean speedup per thread count. Figures from a shared, loaded machine are
noisy: the alternation keeps the comparison fair, not the absolute times quiet. Needs torch
(`pip install torch`), which is not an xfc dependency.

Exit status: 0 when every network built, verified and ran; 3 without torch; else the first failing
`xfc model` status.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import machine_facts
from nets import ALL, export, networks_or_status

REPO = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 3 * 3600


def run_one(arch: str, path: Path, threads: int, verify: bool, args, tmp: Path) -> tuple[int, dict]:
    argv = [sys.executable, "-m", "xfc", "model", str(path), "--hw", args.hw, "--emit", "lib", "--bench",
            "--threads", str(threads), "--repeat", str(args.runs), "--thread-wait", args.thread_wait, "--json",
            "-o", str(tmp / f"{path.stem}-t{threads}")]
    if verify:
        argv.append("--verify")
    if args.profile:
        argv.append("--profile")
    print(f"[net-bench] {' '.join(argv[2:])}", file=sys.stderr, flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=str(REPO))
    if proc.returncode != 0 or not proc.stdout.strip():
        sys.stderr.write(proc.stderr[-3000:])
        return proc.returncode or 1, {}
    return 0, json.loads(proc.stdout)


def row(arch: str, threads: int, report: dict, fmt: str = "fp32", hw: str = "host") -> dict:
    b, net = report["network_bench"], report["network"]
    v = report.get("verification")
    agreed = (v or {}).get("agreement_with_onnxruntime") or [{}]
    return {"net": arch, "format": fmt, "hw": hw, "threads": threads, "xfc_median_ms": b["xfc"]["median_ms"],
            "xfc_round_medians_ms": b["xfc"]["round_medians_ms"], "xfc_p10_ms": b["xfc"]["p10_ms"],
            "xfc_p90_ms": b["xfc"]["p90_ms"], "onnxruntime_median_ms": b["onnxruntime"]["median_ms"],
            "onnxruntime_round_medians_ms": b["onnxruntime"]["round_medians_ms"], "speedup": b["speedup"],
            "arena_bytes": net["arena_bytes"], "arena_lower_bound_bytes": net["arena_lower_bound_bytes"],
            "arena_to_lower_bound": net["arena_to_lower_bound"], "packed_weight_bytes": net["packed_weight_bytes"],
            "steps": net["steps"], "kernel_calls": net["kernel_calls"], "runtime_ops": net["runtime_ops"],
            "fusions": len([f for f in net["fusions"] if "fused" in f]),
            "verified": None if v is None else v["verified"],
            "output_bound_kind": None if v is None else sorted({c["bound_kind"] for c in v["outputs"]}),
            "worst_step_ratio": None if v is None else v["worst_layer_ratio"],
            "onnxruntime": b["onnxruntime"]["label"], "thread_wait": b["thread_wait"],
            "flops": report["flops"]["total"] if "flops" in report else None,
            "int8_dialects": sorted({k["dialect"] for k in report.get("int8_kernels", ())}) or None,
            "int8_max_lsb_vs_onnxruntime": agreed[0].get("max_lsb"),
            # --profile: the slowest steps of the program's per-step timing (a separate set of runs)
            "slowest_steps": sorted(b["profile"]["steps"], key=lambda s: -s["ms"])[:8] if b.get("profile") else None}


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(ALL), help="comma-separated: " + ", ".join(ALL))
    parser.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    parser.add_argument("--size", type=int, default=224, help="input height and width (default 224)")
    parser.add_argument("--runs", type=int, default=20, help="timed runs per round (default 20)")
    parser.add_argument("--no-verify", action="store_true", help="skip --verify")
    parser.add_argument("--profile", action="store_true",
                        help="also time every step (xfc model --profile): the slowest eight per row in the JSON")
    parser.add_argument("--out-name", default="net_bench.json",
                        help="the results file's name in --results (default net_bench.json)")
    parser.add_argument("--thread-wait", choices=("spin", "passive"), default="spin",
                        help="idle threads of both runtimes spin a while (spin, default: the runtimes' defaults) or "
                             "sleep at once (passive; xfc model --thread-wait)")
    parser.add_argument("--quantize", default="",
                        help="comma-separated quantized formats to run instead of fp32: qdq, qoperator (int8)")
    parser.add_argument("--hw", default="host", help="host (default) or host:avx2 (xfc's kernels for AVX2)")
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args(argv)
    formats = [f.strip() for f in args.quantize.split(",") if f.strip()] or ["fp32"]
    if any(f not in ("fp32", "qdq", "qoperator") for f in formats):
        print(f"net-bench: --quantize takes qdq and qoperator, not {args.quantize}", file=sys.stderr)
        return 2
    archs = networks_or_status("net-bench", args.only)
    if isinstance(archs, int):
        return archs
    thread_counts = [int(t) for t in args.threads.split(",") if t.strip()]
    rows, status = [], 0
    with tempfile.TemporaryDirectory(prefix="xfc-net-bench-") as tmp:
        tmp = Path(tmp)
        for arch in archs:
            path = tmp / f"{arch}.onnx"
            print(f"[net-bench] exporting {arch} (random weights, {args.size}x{args.size}) to ONNX", file=sys.stderr)
            export(arch, path, args.size)
            for fmt in formats:
                model = path
                if fmt != "fp32":
                    from xfc.model.quantized_peer import quantize_with_onnxruntime
                    print(f"[net-bench] quantizing {arch} ({fmt}) with onnxruntime.quantization", file=sys.stderr)
                    model = quantize_with_onnxruntime(path, tmp / f"{arch}_{fmt}.onnx", fmt)
                status = run_format(arch, fmt, model, thread_counts, args, tmp, rows) or status
    summary = {}
    for threads in thread_counts:
        for fmt in formats:
            speedups = [r["speedup"] for r in rows if r["threads"] == threads and r["format"] == fmt]
            if speedups:
                key = f"t{threads}" if formats == ["fp32"] else f"{fmt}_t{threads}"
                summary[key] = {"geomean_speedup": geomean(speedups), "min_speedup": min(speedups),
                                "networks": len(speedups)}
                print(f"{fmt} threads {threads}: geomean x{geomean(speedups):.3f}, min x{min(speedups):.3f} over "
                      f"{len(speedups)} networks")
    from xfc.outputs import write_json_result
    out = args.results / args.out_name
    write_json_result(out, {"benchmark": "whole network: xfc --emit lib benchmark program vs onnxruntime session.run",
                            "machine": machine_facts(), "size": args.size, "runs_per_round": args.runs,
                            "hw": args.hw, "formats": formats,
                            "rows": rows, "summary": summary, "command": "benchmarks/net_bench.py "
                            + " ".join(argv if argv is not None else sys.argv[1:]),
                            "weights": "random, seeded (benchmarks/nets.py), exported at run time (opset 17)"
                                       + ("; quantized by onnxruntime.quantization.quantize_static (per-channel "
                                          "int8 weights with reduce_range (7-bit), uint8 activations, 4 random calibration inputs)"
                                          if formats != ["fp32"] else "")},
                      kind="net-bench")
    print(f"-> {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")
    return status


def measure_share(tmp: Path) -> dict:
    import cpu_share
    exe = tmp / "cpu_share_probe"
    if not exe.exists():
        cpu_share.build_probe(tmp)
    return cpu_share.measure(exe)


def run_format(arch: str, fmt: str, model: Path, thread_counts, args, tmp: Path, rows: list) -> int:
    """Every thread count of one network in one format; rows appended; the first failing status."""
    status = 0
    for i, threads in enumerate(thread_counts):
        # Several threads: whether the CPUs ran side by side just before and after (benchmarks/cpu_share.py).
        share_before = measure_share(tmp) if threads > 1 else None
        code, report = run_one(arch, model, threads, verify=i == 0 and not args.no_verify, args=args, tmp=tmp)
        if code:
            status = status or code
            continue
        rows.append(row(arch, threads, report, fmt, args.hw))
        r = rows[-1]
        if share_before is not None:
            r["cpu_share_before"], r["cpu_share_after"] = share_before, measure_share(tmp)
            print(f"  cpus before: {share_before['verdict']} (fma x2 {share_before['fma_ratio']:.2f}, handoff x{share_before['handoff_ratio']:.1f}, pingpong "
                  f"{share_before['pingpong_roundtrip_us']:.2f} us); after: {r['cpu_share_after']['verdict']} "
                  f"(fma x2 {r['cpu_share_after']['fma_ratio']:.2f}, handoff x{r['cpu_share_after']['handoff_ratio']:.1f})", flush=True)
        print(f"{arch:14s} {fmt:9s} t{threads}: xfc {r['xfc_median_ms']:8.2f} ms  onnxruntime "
              f"{r['onnxruntime_median_ms']:8.2f} ms  x{r['speedup']:.2f}  arena {r['arena_bytes'] / 2**20:6.2f} "
              f"MiB (x{r['arena_to_lower_bound']:.3f} of the lower bound)"
              + (f"  verified: {'yes' if r['verified'] else 'NO'}" if r["verified"] is not None else ""),
              flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
