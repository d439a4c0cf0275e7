"""`xfc model NET.onnx`: synthesize (and verify) xfc kernels for the layers of an ONNX network."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..errors import OperatorError
from .adb_options import add_adb_server_options
from .arg_types import non_negative_int

DEFAULT_REPEAT = 20      # --bench: timed runs per layer, or rounds of the network with --emit lib

DEFAULT_OUT_ROOT = Path("xfc-out")
TOOLCHAIN_ENV = ("ANDROID_NDK_HOME", "XFC_ANDROID_API")   # --emit lib: the NDK's clang for arm64-v8a


def default_out_dir(hw, model_path: str, target: str = "cpu") -> Path:
    from .hardware import output_folder_name
    return DEFAULT_OUT_ROOT / f"{output_folder_name(hw)}-{target}" / f"model-{Path(model_path).stem}"


def _device_runner(args, hw, say):
    """For --device SERIAL: the ADB runner, after checking the device can run hw's kernels
    (as `xfc bench` does); None for no device or qemu."""
    if args.device is None or args.device == "qemu" or args.target == "gpu" or hw.target_arch == "x86_64":
        return None
    from ..hardware.identity import check_description, match_identity
    from ..runners import get_runner
    runner = get_runner(args.device, adb_host=args.adb_host, adb_port=args.adb_port,
                        start_server=not args.no_start_server)
    identity = runner.read_identity()
    for note in check_description(identity, hw, hw.cluster(args.cluster), match_identity(identity)):
        say(f"note: {note}")
    say(f"running the layers on {runner.where}")
    return runner


def cmd_model(args) -> int:
    from .hardware import load_for_command_line as load
    from ..model.load import parse_input_shapes
    from ..model.pipeline import raise_if_unverified, run_model
    from ..model.report import format_report
    from ..model.pipeline import check_request
    if args.repeat is not None and not args.bench:
        raise OperatorError("--repeat sets the timed runs of --bench: add --bench")
    repeat = DEFAULT_REPEAT if args.repeat is None else args.repeat
    if repeat < 1:
        raise OperatorError(f"--repeat must be >= 1, got {repeat}")
    if args.seed is not None and not (args.verify or args.bench or args.device is not None):
        raise OperatorError("--seed seeds the random inputs of --verify and --bench: add one of them")
    if args.thread_wait is not None and not (args.emit == "lib" and args.bench):
        raise OperatorError("--thread-wait sets how the benchmark program's threads wait: add --emit lib --bench")
    if args.profile and not (args.emit == "lib" and args.bench):
        raise OperatorError("--profile times the steps of the network's benchmark program: add --emit lib --bench")
    if args.embed_weights and args.emit != "lib":
        raise OperatorError("--embed-weights compiles the weights into the network library: add --emit lib")
    input_shapes = parse_input_shapes(args.input_shape)
    hw = load(args.hw)
    check_request(hw, args.target, args.device, args.emit, args.bench, args.dtype)
    out_dir = Path(args.output) if args.output else default_out_dir(hw, args.model, args.target)
    progress = None if args.json else (lambda msg: print(f"[xfc] {msg}", file=sys.stderr, flush=True))
    runner = _device_runner(args, hw, progress or (lambda msg: None))
    report = run_model(args.model, hw, out_dir, input_shapes=input_shapes, cluster=args.cluster,
                       threads=args.threads, verify=args.verify or args.device is not None, explain=args.explain,
                       force=args.force, seed=args.seed or 0, target=args.target, device=args.device, runner=runner,
                       emit=args.emit, toolchain_env={k: os.environ[k] for k in TOOLCHAIN_ENV if k in os.environ},
                       bench=args.bench, repeat=repeat, progress=progress, embed_weights=args.embed_weights,
                       thread_wait=args.thread_wait or "spin", profile=args.profile, dtype=args.dtype)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(format_report(report, explain=args.explain))
    raise_if_unverified(report)
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "model", help="synthesize kernels for every layer of an ONNX network xfc can cover (and verify it)",
        description="Read an ONNX model, map its Conv / Gemm / MatMul nodes (with folded BatchNormalization and "
                    "fused Relu / Clip(0,6)) to xfc operators, synthesize each distinct layer once, build the "
                    "kernels, and report per layer the tiles, FLOPs and predicted time, the covered share of the "
                    "model's FLOPs and the nodes not covered. --verify runs the whole network (xfc kernels: on the "
                    "host, under qemu-aarch64 or on an ADB device for ARM descriptions, on PoCL for --target gpu; "
                    "other nodes: onnx.reference) and compares it with onnxruntime. A quantized model (QDQ or "
                    "QOperator) builds with --emit lib as an int8 network, every step checked byte for byte "
                    "against xfc's int8 oracle (docs/int8.md).",
        epilog="Outputs: like 'xfc synth' (a new, empty or xfc-owned directory, replaced atomically; --force writes "
               "beside foreign files, never replacing them). Exit status: 0 ok, 2 bad model or request, 3 missing "
               "toolchain or onnxruntime, 4 the network differs from onnxruntime beyond the stated bound, 130/143 "
               "interrupted.")
    p.add_argument("model", metavar="NET.onnx", help="the ONNX model file")
    p.add_argument("--hw", required=True, metavar="HW",
                   help="hardware: a shipped name (snapdragon-865), a file (snapdragon.yaml, ./my.yaml), or 'host'")
    p.add_argument("--target", choices=("cpu", "gpu"), default="cpu", help="cpu, or gpu (the description's Adreno / Mali GPU; OpenCL run on PoCL on this machine, "
                        "never a phone GPU timing)")
    p.add_argument("--cluster", choices=("prime", "big", "mid", "little"), default=None,
                   help="CPU cluster to target (default: big)")
    p.add_argument("--threads", type=int, default=None, help="threads (default: every core of the cluster)")
    p.add_argument("--dtype", choices=("fp32", "fp16"), default="fp32",
                   help="element type of the network: fp32, or fp16 (--emit lib on an AArch64 core with FP16 "
                        "arithmetic, e.g. --hw snapdragon-865: every tensor, weight and kernel in fp16; the C API "
                        "still takes and returns fp32)")
    p.add_argument("--input-shape", action="append", metavar="NAME=DIMS",
                   help="fix a dynamic input shape, e.g. input=1x3x224x224 (repeatable; NAME= may be left out "
                        "when the model has one dynamic input)")
    p.add_argument("-o", "--output", metavar="DIR",
                   help=f"output directory (default: {DEFAULT_OUT_ROOT}/<hw>-<target>/model-<name>)")
    p.add_argument("--force", action="store_true",
                   help="write into a directory holding files xfc did not write (beside them, never replacing them)")
    p.add_argument("--verify", action="store_true",
                   help="run the network with xfc's kernels (host, qemu-aarch64 for ARM descriptions, a device with "
                        "--device, PoCL for --target gpu) and compare with onnxruntime")
    p.add_argument("--seed", type=non_negative_int, default=None,
                   help="seed of the random inputs for --verify and --bench (default 0)")
    p.add_argument("--bench", action="store_true",
                   help="--hw host: time every covered layer (weights pre-packed) and compare with onnxruntime's "
                        "per-node profiler times (same thread count; fused nodes matched to layers); with --emit lib: "
                        "the whole network's benchmark program against onnxruntime's session.run (host), under qemu "
                        "(ARM, emulated) or on --device")
    p.add_argument("--repeat", type=int, default=None,
                   help=f"timed runs per layer (per round of the network with --emit lib) for --bench "
                        f"(default {DEFAULT_REPEAT})")
    p.add_argument("--device", metavar="SERIAL|qemu", default=None,
                   help="ARM descriptions: run the layers under qemu-aarch64 ('qemu', the default for --verify) or on "
                        "an ADB device (a serial, see 'xfc devices'; implies --verify). The virtual device's and "
                        "qemu's figures are emulated")
    add_adb_server_options(p)
    p.add_argument("--emit", choices=("kernels", "lib"), default="kernels",
                   help="kernels (one per distinct layer, with its harness; default) or lib (the whole network in C: "
                        "a static library lib<xfc_model>-<abi>.a for the description's ABI with its C API header, the "
                        "weights file, the benchmark program's source, CMakeLists.txt and manifest.json, written into "
                        "DIR itself, beside report.json; --verify / --bench then run the network's benchmark program: "
                        "natively, under qemu-aarch64 for ARM descriptions (emulated) or on --device); a quantized "
                        "model (QDQ / QOperator) runs as an int8 network")
    p.add_argument("--thread-wait", choices=("spin", "passive"), default=None,
                   help="with --emit lib --bench and more than one thread: how idle threads wait, the same for xfc "
                        "and onnxruntime: spin (default: both runtimes' defaults, what an app gets: they spin a while, "
                        "then sleep) or passive (they sleep at once, OMP_WAIT_POLICY=passive and onnxruntime without "
                        "spinning: for a shared machine whose cores are busy; each parallel region then pays a wake-up)")
    p.add_argument("--profile", action="store_true",
                   help="with --emit lib --bench: one more set of runs with the benchmark program's --profile (a "
                        "timestamp after every step) and the time of each step in the report: where the network's time "
                        "goes (the timed rounds run without it)")
    p.add_argument("--embed-weights", action="store_true",
                   help="with --emit lib: compile the weights into the library (<name>_create_embedded)")
    p.add_argument("--explain", action="store_true",
                   help="print each distinct layer's tile program and the constraint behind each level")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.set_defaults(func=cmd_model)
