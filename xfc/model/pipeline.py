"""load -> map -> synthesize each distinct layer -> build -> (verify) -> [library] -> report, into one
output directory.

The output directory (xfc.outputs.OutputDir: new, empty or xfc's own; staged, committed whole)
is flat: per distinct layer kernel `xfc_<kernel>.c`, its harness, `build_<kernel>.sh` and the
built library (host) or static binary (ARM) -- for --target gpu `xfc_<kernel>.cl` and the OpenCL
harness.c --, with --emit lib the static library and its header, CMakeLists.txt, manifest and
weight blobs (library.py), then `report.json`. Kernels are built in a private scratch directory
and copied in, so nothing half-built reaches the destination.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Optional

from ..errors import OperatorError, VerificationError
from ..ops.accuracy import format_ratio
from ..outputs import OutputDir
from . import backend
from .coverage import coverage, nothing_covered
from .load import load_model
from .mapping import map_network
from .report import build_report


EMITS = ("kernels", "lib")


def kernel_names(specs) -> dict:
    """k01_conv2d, k02_depthwise, ... in order of first use."""
    return {spec: f"k{i:02d}_{spec.name}" for i, spec in enumerate(specs, start=1)}


def analyse(path, hw, *, input_shapes=None, cluster=None, threads=None, progress=None, target: str = "cpu"):
    """Load, map and synthesize (pure apart from reading the file): (net, coverage, syntheses, names)."""
    say = progress or (lambda msg: None)
    loaded = load_model(path, input_shapes)
    net = map_network(loaded)
    cov = coverage(net)
    specs = net.distinct_specs()
    names = kernel_names(specs)
    syntheses = {}
    for spec in specs:
        syntheses[spec] = backend.synthesize_layer(spec, hw, target=target, cluster=cluster, threads=threads)
    if specs:
        say(f"mapped {cov.nodes} nodes: {cov.layers} xfc layers, {len(specs)} distinct; synthesized in "
            f"{sum(s.seconds for s in syntheses.values()) * 1e3:.1f} ms")
    return net, cov, syntheses, names


def check_request(hw, target: str, device: Optional[str], emit: str = "kernels", bench: bool = False,
                  dtype: str = "fp32") -> None:
    """Refuse combinations that cannot work before anything is read or built (exit 2). With --emit lib,
    --bench on an ARM description without --device runs the network's program under qemu (emulated).
    --dtype fp16 runs whole networks: --emit lib, CPU, a core with FP16 arithmetic."""
    if dtype not in ("fp32", "fp16"):
        raise OperatorError(f"--dtype {dtype}: 'xfc model' runs fp32 and fp16 networks")
    if dtype == "fp16":
        if target != "cpu" or emit != "lib":
            raise OperatorError("--dtype fp16 runs the whole network in fp16 through the network runtime: add "
                                "--emit lib (CPU)" + (", drop --target gpu" if target != "cpu" else ""))
        from ..cpu.fp16 import check_fp16_target
        check_fp16_target(hw)
    if bench and (target != "cpu" or (hw.target_arch != "x86_64" and device is None and emit != "lib")):
        raise OperatorError(f"--bench times host kernels against onnxruntime (--hw host), or ARM kernels on a device "
                            f"(--device SERIAL, or qemu: emulated); not {hw.name}"
                            f"{' --target gpu' if target == 'gpu' else ' without --device'}")
    if target not in backend.TARGETS:
        raise OperatorError(f"--target {target}: expected one of {', '.join(backend.TARGETS)}")
    if emit not in EMITS:
        raise OperatorError(f"--emit {emit}: expected one of {', '.join(EMITS)}")
    if target == "gpu":
        if emit == "lib":
            raise OperatorError("--emit lib builds the CPU kernels into a static library; drop --target gpu")
        if getattr(hw, "gpu", None) is None:
            raise OperatorError(f"--target gpu: hardware '{hw.name}' has no GPU section (use a SoC description "
                                f"with an Adreno or Mali GPU, e.g. snapdragon-865)")
        if device is not None:
            raise OperatorError("--device runs CPU kernels on an ARM target; GPU kernels run on PoCL on this "
                                "machine (drop --device)")
        return
    if device is not None and hw.target_arch == "x86_64":
        raise OperatorError(f"--device {device}: {hw.name} is an x86-64 description; --device runs ARM kernels "
                            f"(qemu or an ADB serial) for an ARM description such as snapdragon-865")


def verified_on(hw, target: str, kernels) -> str:
    """Where the covered layers ran during --verify, in words."""
    if target == "gpu":
        return f"{backend.PoclKernel.where}, kernels for {hw.gpu.name}"
    where = {k.where for k in kernels.values()} or {"host (native)" if hw.target_arch == "x86_64" else "?"}
    return ", ".join(sorted(where))


def run_model(path, hw, out_dir, *, input_shapes=None, cluster: Optional[str] = None, threads: Optional[int] = None,
              verify: bool = False, explain: bool = False, force: bool = False, seed: int = 0,
              target: str = "cpu", device: Optional[str] = None, runner=None, emit: str = "kernels",
              toolchain_env: Optional[dict] = None, bench: bool = False, repeat: int = 20,
              progress: Optional[Callable[[str], None]] = None, embed_weights: bool = False,
              thread_wait: str = "spin", profile: bool = False, dtype: str = "fp32") -> dict:
    """The work behind `xfc model`; returns the report (report['verification']['verified'] may be
    False: see raise_if_unverified). device: None, 'qemu' or an ADB serial (ARM only); runner: the
    xfc Runner for that device when the caller made one already (it read the device's identity);
    toolchain_env: ANDROID_NDK_HOME / XFC_ANDROID_API for --emit lib (library.select_toolchain).
    emit 'lib': the whole network as a C library and benchmark program (runtime/network.py).
    dtype 'fp16' (emit 'lib' on an AArch64 core with FP16 arithmetic): the whole network in fp16."""
    from .run import verify_network
    say = progress or (lambda msg: None)
    check_request(hw, target, device, emit, bench, dtype)
    if emit == "lib":
        from .runtime.network import run_network_model
        return run_network_model(path, hw, out_dir, input_shapes=input_shapes, cluster=cluster, threads=threads,
                                 verify=verify, explain=explain, force=force, seed=seed, device=device, runner=runner,
                                 toolchain_env=toolchain_env, bench=bench, repeat=repeat, embed_weights=embed_weights,
                                 thread_wait=thread_wait, profile=profile, dtype=dtype, progress=progress)
    placement = backend.Placement(device=device, runner=runner)
    what = f"xfc model {Path(path).name} for {hw.name} ({target})"
    # The destination is checked first: a location xfc may not write is refused before any work.
    with OutputDir(Path(out_dir), what=what, force=force) as staging, \
            tempfile.TemporaryDirectory(prefix="xfc-model-") as scratch:
        net, cov, syntheses, names = analyse(path, hw, input_shapes=input_shapes, cluster=cluster, threads=threads,
                                             progress=progress, target=target)
        _refuse_nothing_covered(path, net, cov, verify=verify, emit=emit, bench=bench)
        kernels = {}
        for i, (spec, syn) in enumerate(syntheses.items(), start=1):
            say(f"building kernel {i}/{len(syntheses)}: {names[spec]} ({spec.describe()})")
            kernel = backend.build_layer_kernel(spec, hw, name=names[spec], work_dir=Path(scratch), cluster=cluster,
                                                threads=threads, synthesis=syn, target=target, placement=placement,
                                                runnable=verify or bench)
            for file in kernel.files:
                shutil.copy2(file, staging.path / file.name)
            kernels[spec] = kernel
        if target == "gpu" and kernels:
            _write_gpu_harness(staging.path, [f"xfc_{names[s]}.cl" for s in kernels])
        verification = None
        if verify:
            where = verified_on(hw, target, kernels)
            say(f"verifying the network ({len(net.layers)} xfc layers on {where}, {len(net.uncovered)} nodes "
                f"through onnx.reference) against onnxruntime")
            verification = verify_network(net, kernels, seed=seed, progress=progress, where=where)
        timing = None
        if bench and kernels:
            from .bench import bench_network
            first = next(iter(syntheses.values()))
            timing = bench_network(net, kernels, threads=threads or first.result.cluster.count, repeats=repeat,
                                   seed=seed, compare=hw.target_arch == "x86_64", progress=progress)
        report = build_report(net, cov, syntheses, names, hw=hw, cluster=cluster, threads=threads, kernels=kernels,
                              verification=verification, explain=explain, target=target, bench=timing)
        (staging.path / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        staging.commit()
    report["output_dir"] = str(out_dir)
    return report


def _refuse_nothing_covered(path, net, cov, *, verify: bool, emit: str, bench: bool) -> None:
    """--verify, --emit lib and --bench need a covered layer: with none, exit 2 in one line rather
    than a report claiming success over nothing (the coverage report alone stays exit 0)."""
    if net.layers:
        return
    asked = [(flag, verb) for flag, verb, on in (("--verify", "verify", verify), ("--emit lib", "build into a library",
                                                 emit == "lib"), ("--bench", "time", bench)) if on]
    if not asked:
        return
    flags = ", ".join(flag for flag, _ in asked)
    raise OperatorError(f"{path}: {flags}: nothing to {', '.join(verb for _, verb in asked)}: {nothing_covered(cov)} "
                        f"(run without {flags} for the coverage report)")


def _write_gpu_harness(directory: Path, kernel_files) -> None:
    """The shape-free OpenCL harness source beside the GPU kernels (each .cl file carries its launch line)."""
    from ..outputs import write_atomic
    from ..gpu import codegen
    write_atomic(directory / "harness.c", codegen.render_harness())


def raise_if_unverified(report: dict) -> None:
    """VerificationError (exit 4) when --verify ran and failed; one line."""
    v = report.get("verification")
    if v is None or v["verified"]:
        return
    bad = [c for c in v["outputs"] if not c["ok"]]
    parts = [f"output '{c['name']}' differs from onnxruntime by {c['max_abs_error']:.3g} "
             f"({format_ratio(c['error_to_bound_ratio'])}x the {c['bound_kind']} bound)" for c in bad[:2]]
    mismatched = [s for s in v.get("steps", ()) if s["bound_kind"].startswith("shape mismatch")]
    if mismatched:
        parts.append(f"step {mismatched[0]['index']} ({mismatched[0]['name']}): {mismatched[0]['bound_kind']}")
    elif v["layers_failed"]:
        parts.append(f"layer{'s' if len(v['layers_failed']) > 1 else ''} {', '.join(v['layers_failed'][:3])} "
                     f"outside the K-derived bound")
    raise VerificationError(f"{report['model']} on {report['hardware']}: " + "; ".join(parts)
                            + f"; outputs kept in {report['output_dir']}")
