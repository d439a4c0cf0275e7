"""`xfc synth`: parse the arguments, run the library pipeline (xfc.pipeline.run_cpu / run_gpu_synth)
and print its report.

Outputs are staged in a temporary directory beside the destination and moved into place only
when complete (xfc.outputs), so a failed or interrupted run never leaves a half-written kernel,
and xfc writes only into a directory that is new, empty or its own (`--force`: beside foreign
files, never replacing them).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..errors import OperatorError, XfcError
from ..ops.accuracy import format_ratio
from ..ops.spec import DTYPES, OPERATORS, make_spec, parse_shape
from ..pipeline import run_gpu_synth, run_synth

DEFAULT_OUT_ROOT = Path("xfc-out")
OUTPUT_RULE = ("xfc writes only into a directory that does not exist yet, is empty, or holds an earlier xfc output "
               "(marked by its .xfc-output file); the new output replaces that one atomically. An existing file, "
               "or a directory holding files xfc did not write, is refused (exit 2) unless --force, which writes "
               "xfc's files beside them and never deletes or replaces a file xfc did not write. '-o .' and other "
               "parents of the current directory are filled file by file, under the same rule.")


def spec_from_args(args):
    try:
        shape = parse_shape(args.op, args.shape)
    except XfcError:
        raise
    return make_spec(args.op, shape, stride=args.stride, pad=args.pad, dilation=args.dilation,
                     bias=args.bias, activation=args.activation)


def default_out_dir(hw, spec, args) -> Path:
    """xfc-out/<hw>-<target>/<op key>-<what else makes the kernel differ>: dtype, the CPU cluster and
    thread count, a forced lowering and int8 quantization parameters, so that two requests for
    different kernels never share (and silently replace) one folder."""
    from .hardware import output_folder_name
    parts = [spec.key(), args.dtype]
    if args.target == "cpu" and hw.clusters:
        cluster = hw.cluster(args.cluster)
        parts += [cluster.role, f"t{args.threads if args.threads is not None else cluster.count}"]
    if args.target == "cpu" and args.lowering != "auto":
        parts.append(args.lowering)
    if args.dtype == "int8" and args.quant:
        parts.append("q" + hashlib.sha256(args.quant.encode()).hexdigest()[:8])
    return DEFAULT_OUT_ROOT / f"{output_folder_name(hw)}-{args.target}" / "-".join(parts)


def _gflops_label(report: dict) -> str:
    return "effective GFLOP/s" if report.get("gflops_basis") == "effective" else "GFLOP/s"


def print_summary(report: dict) -> None:
    """A few lines for people, from the keys every report shares (pipeline.REPORT_CORE_KEYS)."""
    op = report["operator"]
    target = report["target"]
    int8 = report.get("dtype") == "int8"
    shape = " ".join(f"{k}={v}" for k, v in report["dims"].items()) if target == "gpu" else report["shape"]
    print(f"xfc synth {op}{' int8' if int8 else ''} for {report['hardware']} ({target}"
          + (f", {report['gpu']}" if report.get("gpu") else "") + f"): {shape}")
    tiles = report.get("tile_summary") or report.get("tiles")
    if int8 and tiles.get("layout") == "channels":   # depthwise, channels in the lanes: pixels per block
        print(f"  plan: {tiles['lowering']} (channels), {tiles['dialect']} dialect, groups of {tiles['lanes']} channels "
              f"in the lanes, blocks of {tiles['vectors']} output pixel(s), {tiles['threads']} thread(s)")
        tiles = None
    elif int8 and "layout" in tiles:   # depthwise: a block of output rows x vectors, no register tile
        print(f"  plan: {tiles['lowering']} ({tiles['layout']}), {tiles['dialect']} dialect, blocks of "
              f"{tiles['tile_rows']} output row(s) x {tiles['vectors']} vector(s) of {tiles['lanes']} pixels, "
              f"{tiles['threads']} thread(s)")
        tiles = None
    elif int8:
        print(f"  plan: {tiles['lowering']}, {tiles['dialect']} dialect, register tile {tiles['mr']}x{tiles['nr']}, "
              f"{tiles['threads']} thread(s)")
        if "k_depth" in tiles:   # ARM dot-product micro-tile (xfc/cpu/qarm.py)
            print(f"  micro-tile: {tiles['dialect']} {tiles['mr']}x{tiles['nr']}, {tiles['k_depth']}-deep k groups, "
                  f"{tiles['registers_used']} of {tiles['registers_available']} vector registers, "
                  f"{tiles['predicted_ops_per_cycle']:g} int8 ops/cycle predicted")
        tiles = None
    if isinstance(tiles, dict):
        tiles = " ".join(f"{k}={v}" for k, v in tiles.items())
    if tiles:
        print(f"  tiles: {tiles}" + (f" (lowering {report['lowering']})" if report.get("lowering") else ""))
    print(f"  synthesis: {report['synthesis_seconds'] * 1e3:.1f} ms"
          + (f", build: {report['build_seconds']:.2f} s" if report.get("build_seconds") is not None else ""))
    if int8:
        _print_int8(report)
    elif report.get("predicted_gflops") is not None:
        tdb = report.get("tile_db") or {}
        source = report.get("micro_tile_source", "static")
        model = ("cost model calibrated on this machine" if tdb.get("constants") == "calibrated" else "static cost model")
        if source != "static":
            model += f", micro-tiles from {source}"
        print(f"  predicted: {report['predicted_gflops']:.1f} {_gflops_label(report)} "
              f"({report.get('predicted_bound', '?')}-bound; {model}; not a measurement)")
        if report.get("gflops_basis") == "effective":
            print(f"             effective GFLOP/s: the direct convolution's FLOPs over the time; Winograd "
                  f"multiplies less, so this may exceed the peak of {report['peak_gflops']:.1f} GFLOP/s "
                  f"({report['threads']} core(s))")
    if report.get("verified") is not None and not int8:
        ratio = report.get("error_to_bound_ratio")
        where = report.get("verified_on") or (f"PoCL on the host CPU ({report.get('run_variant', 'fp32')} variant)"
                                              if target == "gpu" else "?")
        print(f"  verified: {'yes' if report['verified'] else 'NO'} on {where} "
              f"(max abs error {report['max_abs_error']:.3g}"
              + (f", {format_ratio(ratio)}x of the bound)" if ratio is not None else ")"))
    if report.get("dtype") == "fp16" and report.get("bound") and target == "cpu":
        b = report["bound"]
        classical = "vacuous" if b["classical_vacuous"] else f"{b['classical_gamma']:.3g}"
        print(f"  fp16: fp16 operands and accumulation; bound: {b['kind']}"
              + (f" (kernel order, KC={b['kc']})" if b.get("kc") else "")
              + f", u = 2^-11; classical gamma_(K+2) = {classical} (docs/fp16.md)")
    if report.get("measurement") and target == "gpu":
        m = report["measurement"]
        print(f"  timed: median {m['median_s'] * 1e3:.3f} ms over {m['repeats']} runs "
              f"[{report.get('timing_label', 'PoCL on the host CPU - not a phone GPU timing')}]")
    elif report.get("measurement"):
        m = report["measurement"]
        print(f"  measured: {m['gflops']:.2f} {'GOP/s' if int8 else _gflops_label(report)}, median {m['median_s'] * 1e3:.3f} ms over "
              f"{m['repeats']} runs [{m['where']}]")
        if report.get("measurement_packing_per_call"):
            p = report["measurement_packing_per_call"]
            print(f"            {p['gflops']:.2f} {'GOP/s' if int8 else _gflops_label(report)}, median {p['median_s'] * 1e3:.3f} ms with "
                  f"the weights packed inside every call")
    for line in (report.get("mca") or {}).get("summary", []):
        print(f"  {line}")
    print(f"  output: {report['output_dir']}")


def _print_int8(report: dict) -> None:
    """The int8 lines: prediction, verdict (byte for byte), quantization."""
    if report.get("predicted_gflops") is not None:
        print(f"  predicted: {report['predicted_gflops']:.1f} GOP/s (int8 issue model; not a measurement)")
    if report.get("verified") is not None:
        print(f"  verified: {'yes' if report['verified'] else 'NO'} on {report.get('verified_on', '?')}")
    q = report["quantization"]
    print(f"  int8: {report['dialect']} dialect, {q['act_type']} activations (zp {q['a_zero_point']}), int8 weights "
          f"({'per-channel' if q['per_channel'] else 'per-tensor'} scales), output zp {q['out_zero_point']}")
    if report.get("verified") is not None and report.get("exact_share") is not None:
        print(f"  exact match: {report['exact_share'] * 100:.2f}% of outputs (max {report['max_lsb']} LSB off; "
              f"{report.get('saturated_share', 0) * 100:.1f}% at the clamp bounds)")


def cmd_synth(args) -> int:
    import sys
    from .hardware import load_for_command_line
    if args.repeat < 1:   # as 'xfc bench' and 'xfc model' say it
        raise OperatorError(f"--repeat must be >= 1, got {args.repeat}")
    hw = load_for_command_line(args.hw)
    spec = spec_from_args(args)
    out_dir = Path(args.output) if args.output else default_out_dir(hw, spec, args)
    quiet = args.json
    if args.mca:
        if args.target != "cpu" or hw.target_arch != "aarch64":
            raise OperatorError(f"--mca analyses AArch64 CPU kernels with llvm-mca-16; not available for "
                                f"{'--target gpu' if args.target != 'cpu' else f'{hw.name} ({hw.target_arch})'}")
        from ..analysis.mca import require_tools
        require_tools()
    progress = None if quiet else (lambda msg: print(f"[xfc] {msg}", file=sys.stderr, flush=True))
    if args.quant is not None and args.dtype != "int8":
        raise OperatorError("--quant applies to --dtype int8 only")
    if args.target == "gpu":
        if hw.gpu is None:
            raise OperatorError(f"--target gpu: {hw.name} describes no GPU")
        if args.dtype == "int8":
            raise OperatorError("--dtype int8 is not implemented for --target gpu (int8 kernels: x86-64 host CPUs "
                                "and AArch64 cores with dotprod)")
        if args.lowering != "auto":
            raise OperatorError(f"--lowering {args.lowering} is a CPU option (the OpenCL path has no Winograd "
                                f"lowering: docs/winograd.md)")
        report = run_gpu_synth(spec, hw, out_dir, dtype=args.dtype, verify=args.verify, explain=args.explain,
                               bench=args.bench, force=args.force)
    else:
        quant = _check_cpu_dtype_args(args, hw)
        if args.lowering == "winograd":
            from ..cpu.winograd import check_applicable
            check_applicable(spec)
        if args.bench and hw.target_arch != "x86_64" and progress:
            progress("note: --bench on an ARM description times the kernel under QEMU (emulated), "
                     "which says nothing about phone speed; use 'xfc bench --device SERIAL' on a phone")
        # fp16 and int8 plans come from the static model: the tile database holds fp32 rows only
        choice = args.tile_db if args.dtype == "fp32" else "off"
        evaluator, constants, tile_db = _tile_db_inputs(choice, hw, args.cluster)
        try:
            report = run_synth(spec, hw, out_dir, dtype=args.dtype, quant=quant, cluster=args.cluster,
                               threads=args.threads, verify=args.verify, bench=args.bench, repeat=args.repeat,
                               progress=progress, force=args.force, mca=args.mca, evaluator=evaluator,
                               constants=constants, tile_db=tile_db if args.dtype == "fp32" else None,
                               lowering=args.lowering, fault=test_fault())
        finally:
            if evaluator is not None:
                evaluator.close()
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
        return 0
    if args.explain and report.explain:
        print(report.explain)
        for note in (report.to_dict().get("tile_db") or {}).get("notes", []):   # e.g. emulated rows ignored
            print(f"note: {note}")
        print()
    print_summary(report.to_dict())
    return 0


def test_fault():
    """TEST-ONLY: the deliberately wrong kernel XFC_TEST_MUTANT names (xfc/cpu/mutants.py), handed to the
    pipeline as a fault to apply to the rendered source, so that tests can show `--verify` exits 4."""
    from .. import settings
    name = settings.test_mutant()
    if not name:
        return None
    from ..testing.mutants import mutate
    return lambda rendered: mutate(rendered, name)


def _check_cpu_dtype_args(args, hw):
    """The CPU options a dtype refuses, in one line (exit 2) before anything is written; the int8
    quantization parameters (None for the float types). fp16 needs a core with FP16 arithmetic
    (xfc/cpu/fp16.py); int8 runs on x86-64 hosts and ARM cores with dotprod."""
    if args.dtype in ("fp16", "int8") and args.tile_db not in ("auto", "off"):
        raise OperatorError(f"--tile-db {args.tile_db}: the tile database holds fp32 rows only; {args.dtype} plans "
                            f"come from the static model (use --tile-db auto or off)")
    if args.dtype == "fp16":
        from ..cpu.fp16 import check_fp16_target
        check_fp16_target(hw, args.cluster)
        if args.lowering == "winograd":
            raise OperatorError("--lowering winograd: fp16 kernels use the direct lowering only (docs/fp16.md)")
        return None
    if args.dtype != "int8":
        return None
    from ..ops.quant import parse_quant
    if hw.target_arch == "aarch64" and args.bench:
        raise OperatorError(f"--bench with --dtype int8 on {hw.name}: ARM int8 kernels run under qemu-aarch64 here, "
                            "whose timings say nothing about a phone; use --verify")
    if args.mca:
        raise OperatorError("--mca analyses AArch64 fp32 kernels; not available for --dtype int8")
    if args.lowering != "auto":
        raise OperatorError(f"--lowering {args.lowering} chooses among fp32 CPU lowerings; int8 kernels have one "
                            "(implicit GEMM, or direct depthwise)")
    return parse_quant(args.quant)


def _tile_db_inputs(choice: str, hw, cluster_role):
    """tiledb.evaluators.synthesis_inputs with this process's environment; warnings on stderr."""
    import os
    import sys
    from ..tiledb.evaluators import synthesis_inputs
    return synthesis_inputs(choice, hw, cluster_role, os.environ,
                            lambda message: print(f"xfc: {message}", file=sys.stderr, flush=True))


def add_operator_arguments(p) -> None:
    p.add_argument("op", choices=OPERATORS, metavar="{matmul,conv2d,depthwise}", help="operator to synthesize")
    p.add_argument("--hw", required=True, metavar="HW",
                   help="hardware: a shipped name (snapdragon-865, cortex-a76), a file (snapdragon.yaml, ./my.yaml), or 'host'")
    p.add_argument("--shape", required=True, metavar="K=V,...",
                   help="matmul: m=,n=,k=[,batch=]; conv2d: [n=,]c=,h=,w=,k=,r=,s=; depthwise: [n=,]c=,h=,w=,r=,s=")
    p.add_argument("--stride", default="1", help="1 or 2 values (h,w); conv2d/depthwise (default 1)")
    p.add_argument("--pad", default="0", help="1, 2 (h,w) or 4 values (top,left,bottom,right) (default 0)")
    p.add_argument("--dilation", default="1", help="1 or 2 values (h,w) (default 1)")
    p.add_argument("--bias", action="store_true", help="fuse a bias add (per output channel / matmul column)")
    p.add_argument("--activation", default="none", choices=("none", "relu", "relu6"), help="fused activation")
    p.add_argument("--cluster", choices=("prime", "big", "mid", "little"), default=None,
                   help="CPU cluster to target (default: big)")
    p.add_argument("--threads", type=int, default=None, help="threads (default: every core of the cluster)")


def register(sub) -> None:
    p = sub.add_parser("synth", help="synthesize a kernel (and optionally verify and time it)",
                       description="Synthesize a kernel bottom-up for one operator and hardware description, "
                       "render it, build it, and optionally verify it against numpy and time it.",
                       epilog=f"Outputs: {OUTPUT_RULE} Exit status: 0 ok, 2 bad input or an output location xfc may "
                       "not write, 3 missing toolchain, 4 kernel differs from numpy, 130 interrupted (Ctrl-C), "
                       "143 terminated (SIGTERM); an interrupted run leaves no output, staging directory or child "
                       "process behind.")
    add_operator_arguments(p)
    p.add_argument("--target", choices=("cpu", "gpu"), default="cpu", help="CPU (C/NEON or host SIMD) or GPU (OpenCL)")
    p.add_argument("--dtype", choices=DTYPES, default="fp32",
                   help="element type (fp16: GPU, or AArch64 cores with FP16 arithmetic, fp16 accumulation; "
                        "int8: ONNX QLinearMatMul/QLinearConv semantics on x86-64 hosts (VNNI/AVX2) and on ARM "
                        "cores with dotprod (sdot; smmla with i8mm), verified under qemu-aarch64; cores without "
                        "dotprod, e.g. cortex-a53, are refused)")
    p.add_argument("--quant", default=None, metavar="K=V,...",
                   help="int8 quantization: act=uint8|int8, a_scale=, a_zp=, w_scale=, per_channel=0|1, "
                        "out_scale=|auto, out_zp= (defaults: uint8, 0.02, middle of the type, 0.01, 0, auto, middle)")
    p.add_argument("-o", "--output", metavar="DIR",
                   help=f"output directory (default: {DEFAULT_OUT_ROOT}/<hw>-<target>/<op key>-<dtype>[-<cluster>-t<threads>]"
                        "[-<lowering>][-q<quant digest>]); see 'Outputs' below")
    p.add_argument("--force", action="store_true",
                   help="write into an existing directory that holds files xfc did not write; xfc's files go beside "
                        "them, and a file xfc did not write is never deleted or replaced (a same-named one is refused)")
    p.add_argument("--verify", action="store_true",
                   help="run the kernel (host natively, ARM under qemu-aarch64, GPU on PoCL) and compare with numpy")
    p.add_argument("--bench", action="store_true", help="time the kernel (real speed only on --hw host)")
    p.add_argument("--repeat", type=int, default=20, help="timed repetitions for --bench (median reported)")
    p.add_argument("--explain", action="store_true", help="print the tile program and the constraint behind each level")
    p.add_argument("--mca", action="store_true",
                   help="ARM descriptions: run llvm-mca-16 on the kernel's inner FMA loop (FMA per cycle, share of the "
                        "core's FMA pipes, bottleneck, spills; a static estimate) and add it to report.json")
    p.add_argument("--tile-db", default="auto", metavar="PATH|auto|off",
                   help="CPU: answer micro-tile scores and cost-model constants from a tile database (docs/tile-db.md): "
                        "auto (default) = the shipped database for shipped hardware, the per-user one (measured and "
                        "calibrated rows: 'xfc tiledb calibrate') for host and your own files; off = the static model")
    p.add_argument("--lowering", choices=("auto", "direct", "winograd"), default="auto",
                   help="CPU conv2d: auto (default) = the faster of implicit GEMM and, for 3x3 stride-1 layers, "
                        "Winograd as the cost model predicts; direct = implicit GEMM only; winograd = force it "
                        "(3x3, stride 1, dilation 1 only)")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.set_defaults(func=cmd_synth)
