#!/usr/bin/env python3
"""`make model-bench`: xfc model on real architectures (not run in CI).

Builds MobileNetV2 and ResNet-18 (benchmarks/nets.py: the papers' layer tables, torchvision's
layer shapes; --only takes the other families of benchmarks/nets.py too) with seeded random weights, exports them to ONNX at run time (nothing is downloaded) and runs `xfc model NET.onnx ... --verify --json` on each for
each target:

    host      --hw host --verify --bench --threads 1: xfc's per-layer times against onnxruntime's
              per-node profiler times (1 intra-op thread), summed over the covered part
    sd865     --hw snapdragon-865 --verify: the layers as aarch64 kernels under qemu-aarch64
    adreno    --hw snapdragon-865 --target gpu --verify: Adreno 650 kernels on PoCL
    mali      --hw dimensity-1200 --target gpu --verify: Mali-G77 kernels on PoCL
    sd865_fp16  --hw snapdragon-865 --emit lib --dtype fp16 --verify: the whole network in fp16 (the
              network runtime, neon_fp16 kernels) under qemu, checked step by step and against the
              fp32 model in onnxruntime
    sd865_int8  --hw snapdragon-865 --emit lib --verify on the model quantized by onnxruntime's
              quantize_static (QDQ, per-channel 7-bit weights, uint8 activations): the int8 network
              (sdot kernels) under qemu, every step byte for byte against xfc's oracle, the output
              against onnxruntime on the same quantized model
    sd8g2_int8  the same for snapdragon-8-gen-2 (smmla kernels: i8mm cores)
    sd865_lib the whole fp32 network (--emit lib --verify: the network runtime, NEON kernels) under
              qemu-aarch64, every step checked and the outputs against onnxruntime on the fp32 model
    device_lib  the same on an ADB device (--device SERIAL), e.g. the virtual device below
    device_int8 the same as sd865_int8 on an ADB device, --device SERIAL (and --adb-port): e.g. the
              virtual device (`python -m android_runner.virtual_device --port 5599 --soc
              snapdragon-865 &`, then `adb connect 127.0.0.1:5599`; it runs the program under
              qemu-aarch64: emulated, never a phone)

and writes each report to benchmarks/results/model_<arch>_<target>.json (replaced only when xfc
wrote the file before, see xfc/outputs.py). Timings are only meaningful on a quiet machine; qemu
and PoCL runs are correctness runs (emulated / host CPU), never phone timings. Needs torch
(`make bench-setup` installs it), which is not an xfc dependency.

Exit status: 0 when every model verified, 3 when torch is missing, else the first
failing `xfc model` status.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from nets import ALL, ARCHS, export, torch_missing
from machine import machine_facts

REPO = Path(__file__).resolve().parent.parent
TARGETS = {   # name -> xfc model arguments after NET.onnx
    "host": ["--hw", "host", "--verify", "--bench"],
    "sd865": ["--hw", "snapdragon-865", "--verify"],
    "adreno": ["--hw", "snapdragon-865", "--target", "gpu", "--verify"],
    "mali": ["--hw", "dimensity-1200", "--target", "gpu", "--verify"],
    "sd865_fp16": ["--hw", "snapdragon-865", "--emit", "lib", "--dtype", "fp16", "--verify"],
    "sd865_int8": ["--hw", "snapdragon-865", "--emit", "lib", "--verify"],
    "sd8g2_int8": ["--hw", "snapdragon-8-gen-2", "--emit", "lib", "--verify"],
    "device_int8": ["--hw", "snapdragon-865", "--emit", "lib", "--verify"],     # + --device (the options)
    "sd865_lib": ["--hw", "snapdragon-865", "--emit", "lib", "--verify"],
    "device_lib": ["--hw", "snapdragon-865", "--emit", "lib", "--verify"],      # + --device (the options)
}
DEVICE_TARGETS = ("device_int8", "device_lib")
QUANTIZED_TARGETS = ("sd865_int8", "sd8g2_int8", "device_int8")   # run on the model quantized by onnxruntime (QDQ)
RUN_TIMEOUT_S = 4 * 3600


def run_target(arch: str, target: str, path: Path, tmp: Path, args) -> int:
    """One `xfc model` run; its report goes to benchmarks/results/model_<arch>_<target>.json."""
    from xfc.outputs import write_json_result
    extra = ["--threads", str(args.threads), "--repeat", str(args.repeat)] if target == "host" else []
    if target in DEVICE_TARGETS:
        extra = ["--device", args.device] + (["--adb-port", str(args.adb_port)] if args.adb_port else [])
    if target in QUANTIZED_TARGETS:
        from xfc.model.quantized_peer import quantize_with_onnxruntime
        quantized = tmp / f"{arch}_qdq.onnx"
        if not quantized.exists():
            print(f"[model-bench] quantizing {arch} (QDQ) with onnxruntime.quantization", file=sys.stderr)
            quantize_with_onnxruntime(path, quantized, "qdq")
        path = quantized
    argv = [sys.executable, "-m", "xfc", "model", str(path), *TARGETS[target], *extra, "--json",
            "-o", str(tmp / f"{arch}-{target}-out")]
    print(f"[model-bench] {' '.join(argv[2:])}", file=sys.stderr)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=str(REPO))
    sys.stderr.write(proc.stderr)
    if not proc.stdout.strip():
        return proc.returncode or 1
    report = json.loads(proc.stdout)
    report["model"] = (f"benchmarks/nets.py {arch}, random weights (seed 0), exported at run time (opset 17)"
                       + ("; quantized by onnxruntime quantize_static (QDQ, per-channel 7-bit weights, uint8 "
                          "activations, 4 random calibration inputs)" if target in QUANTIZED_TARGETS else ""))
    report.pop("output_dir", None)
    report["machine"] = machine_facts()
    out = args.results / f"model_{arch}_{target}.json"
    write_json_result(out, report, kind="model-bench")
    v = report["verification"] or {}
    if "flops" in report:
        line = (f"{arch} [{target}]: covered {report['flops']['covered_share'] * 100:.1f}% of "
                f"{report['flops']['total'] / 1e6:.0f} MFLOP, {report['nodes']['distinct_layers']} distinct layers "
                f"synthesized in {report['synthesis_seconds'] * 1e3:.0f} ms, verified: "
                f"{'yes' if v.get('verified') else 'NO'} on {v.get('verified_on', '?')}")
    else:   # a quantized model: the int8 network's report
        line = (f"{arch} [{target}]: int8 ({report['quantized']['read']}), {len(report['int8_kernels'])} distinct "
                f"kernels, verified: {'yes' if v.get('verified') else 'NO'} on {v.get('verified_on', '?')}")
    if v.get("steps") and v.get("dtype") == "int8":
        line += f"; {len(v['steps']) - len(v['layers_failed'])} of {len(v['steps'])} steps equal to the oracle byte for byte"
    elif v.get("steps"):
        line += (f"; {len(v['steps']) - len(v['layers_failed'])} of {len(v['steps'])} steps within their local bound "
                 f"(worst {v['worst_layer_ratio']:.3g}x)")
    for a in v.get("agreement_with_onnxruntime", ()) if v.get("dtype") == "int8" else ():
        line += f"; vs onnxruntime: largest difference {a['max_lsb']:g} LSB, argmax {a.get('argmax_agree')}/{a.get('argmax_rows')}"
    for a in v.get("agreement_with_fp32", ()):
        line += (f"; vs the fp32 model: largest error {a['relative_to_largest_output'] * 100:.2g}% of the largest "
                 f"|output|, argmax {a.get('argmax_agree')}/{a.get('argmax_rows')}")
    bench = report.get("bench")
    if bench:
        line += (f"; {bench['layers_matched']}/{bench['layers']} layers matched to onnxruntime nodes: xfc "
                 f"{bench['xfc_matched_seconds'] * 1e3:.3f} ms vs onnxruntime {bench['onnxruntime_matched_seconds'] * 1e3:.3f} ms "
                 f"({bench['threads']} thread{'s' if bench['threads'] != 1 else ''})")
    print(f"{line} -> {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")
    return proc.returncode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(ARCHS), help="comma-separated: " + ", ".join(ALL))
    parser.add_argument("--size", type=int, default=224, help="input height and width (default 224)")
    parser.add_argument("--targets", default=",".join(t for t in TARGETS if t not in DEVICE_TARGETS + ("sd865_lib",)),
                        help="comma-separated: " + ", ".join(TARGETS) + " (default: all but device_int8, sd865_lib "
                             "and device_lib)")
    parser.add_argument("--threads", type=int, default=1, help="threads on the host target (default 1)")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per layer on the host (default 20)")
    parser.add_argument("--device", help="the ADB serial the device_int8 and device_lib targets run on")
    parser.add_argument("--adb-port", type=int, help="the adb server's port (device targets)")
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args(argv)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    needs_device = [t for t in targets if t in DEVICE_TARGETS]
    if needs_device and not args.device:
        print(f"model-bench: --targets {needs_device[0]} needs --device SERIAL", file=sys.stderr)
        return 2
    for target in targets:
        if target not in TARGETS:
            print(f"model-bench: unknown target '{target}' (known: {', '.join(TARGETS)})", file=sys.stderr)
            return 2
    if torch_missing("model-bench", "make bench-setup"):
        return 3
    status = 0
    with tempfile.TemporaryDirectory(prefix="xfc-model-bench-") as tmp:
        for arch in [a.strip() for a in args.only.split(",") if a.strip()]:
            if arch not in ALL:
                print(f"model-bench: unknown architecture '{arch}' (known: {', '.join(ALL)})", file=sys.stderr)
                return 2
            path = Path(tmp) / f"{arch}.onnx"
            print(f"[model-bench] exporting {arch} (random weights) to ONNX", file=sys.stderr)
            export(arch, path, args.size)
            for target in targets:
                code = run_target(arch, target, path, Path(tmp), args)
                status = status or code
    return status


if __name__ == "__main__":
    sys.exit(main())
