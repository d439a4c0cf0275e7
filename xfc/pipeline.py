"""The library pipeline: (spec, hardware, target, options) -> synthesize -> render -> build ->
run/verify -> report, with every output written through xfc.outputs (staged, owned directories).
The CLI (`xfc synth`, `xfc bench`) parses arguments, calls these and prints their reports.

compile (the Python API): synthesize + render + build a CPU kernel -> Kernel (callable on numpy
arrays when built for this machine; otherwise the built artifact's paths).

CPU (run_cpu): host kernels are built with gcc and run in-process through ctypes; ARM kernels are
cross-built static and run under qemu-aarch64 (emulated: correctness only). Both entry points
(weights packed per call, and pre-packed once) are verified against the float64 reference.

GPU (run_gpu_synth): OpenCL kernels rendered for the description's GPU, built into the shape-free
harness and run on PoCL on the host CPU (never a phone GPU timing), verified against the float64
reference. PoCL has no cl_khr_fp16, so true half-arithmetic kernels are only rendered here (and
compile-checked when the OpenCL device offers cl_khr_fp16); the fp16-storage / fp32-arithmetic
variant (vload_half / vstore_half) runs everywhere and is what `dtype='fp16'` verifies.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from . import settings
from ._version import __version__
from .build import opencl
from .build.cpu import HostKernel, build_arm, build_host, run_qemu
from .build.toolchain import write_atomic
from .cpu.codegen import render_cpu_kernel
from .cpu.synth import synthesize_cpu
from .errors import OperatorError, VerificationError, XfcError
from .gpu import codegen as gpu_codegen
from .gpu.ir import PREDICTION_LABEL, GpuKernelPlan
from .gpu.synth import synthesize_gpu
from .ops.accuracy import merge
from .ops.reference import check_output, check_variant_output, make_inputs
from .outputs import OutputDir
from .runners import RunSpec, get_runner, pocl
from .runners.pocl import POCL_LABEL
from .settings import TEST_MUTANT_ENV

FP16_NOTE = ("PoCL has no cl_khr_fp16, so the half-arithmetic kernel is only render-checked here (compile-checked "
             "only on an OpenCL device that offers cl_khr_fp16); the fp16-storage / fp32-arithmetic variant is the "
             "one run and verified")


# ---------------------------------------------------------------------------------------------
# compile: the Python API
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Kernel:
    """A synthesized, rendered and built CPU kernel.

    Built for this machine (an x86-64 description such as 'host'), it is callable on numpy arrays:
    `kernel(in0, in1, bias=None) -> out`, shaped as spec.input_shapes / spec.output_shape.
    Built for an ARM description, it is the static aarch64 harness at `files['binary']` (run it
    with `xfc bench`, or under qemu-aarch64); calling it raises XfcError.
    """

    spec: object
    hardware: str
    synthesis: object                       # xfc.cpu.explain.CpuSynthesis (.plan, .explain(), .report())
    files: dict = field(default_factory=dict)   # what was built: 'library' or 'binary', and the sources' directory
    host: Optional[HostKernel] = None

    @property
    def plan(self):
        return self.synthesis.plan

    def __call__(self, in0, in1, bias=None):
        if self.host is None:
            raise XfcError(f"the kernel for {self.hardware} is an aarch64 binary ({self.files.get('binary')}); "
                           f"it cannot run in this process (use 'xfc bench' or qemu-aarch64)")
        return self.host(in0, in1, bias)


def compile(spec, hw, *, target: str = "cpu", cluster: Optional[str] = None, threads: Optional[int] = None,
            evaluator=None, out_dir=None) -> Kernel:   # noqa: A001  (the public name the issue asks for)
    """Synthesize, render and build spec for hw. out_dir: where the sources and the built file go
    (default: a temporary directory, removed once the host library is loaded; an ARM build needs
    out_dir, since the binary must outlive the call)."""
    if target != "cpu":
        raise OperatorError(f"compile supports target 'cpu' (GPU kernels: xfc.pipeline.run_gpu_synth), got {target!r}")
    result = synthesize_cpu(spec, hw, cluster=cluster, threads=threads, evaluator=evaluator)
    rendered = render_cpu_kernel(result.plan)
    if hw.target_arch == "x86_64":
        if out_dir is None:
            with tempfile.TemporaryDirectory(prefix="xfc-compile-") as tmp:
                host = build_host(rendered, tmp)   # loaded now: the mapping outlives the file
            return Kernel(spec=spec, hardware=hw.name, synthesis=result, host=host)
        host = _build_owned(rendered, Path(out_dir), build_host, f"xfc.compile {spec.key()} for {hw.name}")
        return Kernel(spec=spec, hardware=hw.name, synthesis=result, files={"dir": Path(out_dir)}, host=host)
    if out_dir is None:
        raise XfcError(f"compile for {hw.name} ({hw.target_arch}) builds a binary that must outlive the call: "
                       f"pass out_dir")
    binary = _build_owned(rendered, Path(out_dir), build_arm, f"xfc.compile {spec.key()} for {hw.name}")
    return Kernel(spec=spec, hardware=hw.name, synthesis=result, files={"dir": Path(out_dir), "binary": binary})


def _build_owned(rendered, out_dir: Path, builder, what: str):
    """Build into a staged directory and commit it to out_dir under the output-ownership rules
    (xfc.outputs): a user's directory with files xfc did not write is refused, never overwritten.
    A path the builder returns is mapped to its place in out_dir; a loaded host library keeps its
    mapping across the rename."""
    with OutputDir(out_dir, what=what) as staging:
        built = builder(rendered, staging.path)
        staging.commit()
    if isinstance(built, Path):
        return out_dir / built.relative_to(staging.path)
    return built


# ---------------------------------------------------------------------------------------------
# CPU: xfc synth --target cpu
# ---------------------------------------------------------------------------------------------

def synthesize_timed(spec, hw, cluster=None, threads=None, evaluator=None, constants=None):
    """Run the (pure) synthesizer and time it: the one place synthesis seconds are measured.
    evaluator / constants: a tile-database evaluator and calibrated cost-model constants
    (xfc.tiledb, chosen by the command line's --tile-db); None: the static model."""
    start = time.perf_counter()
    extra = {} if constants is None else {"constants": constants}
    synthesize = getattr(evaluator, "synthesize", synthesize_cpu)   # a tile db's plan cache (xfc.tiledb.plancache)
    result = synthesize(spec, hw, cluster=cluster, threads=threads, evaluator=evaluator, **extra)
    return result, time.perf_counter() - start


def run_cpu(spec, hw, out_dir: Path, *, cluster=None, threads=None, verify=False, bench=False,
            repeat=20, seed=0, progress=None, force=False, mca=False, evaluator=None, constants=None,
            tile_db: Optional[dict] = None) -> dict:
    """The CPU pipeline behind `xfc synth`: synthesize -> render -> build -> [llvm-mca] -> verify -> time.
    Outputs go to out_dir through xfc.outputs.OutputDir (force: write beside foreign files).
    evaluator, constants: see synthesize_timed; tile_db: what the caller says about the database
    they came from (recorded in the report as 'tile_db')."""

    say = progress or (lambda msg: None)
    result, synth_s = synthesize_timed(spec, hw, cluster, threads, evaluator, constants)
    say(f"synthesized in {synth_s * 1e3:.1f} ms: {result.plan.header_lines[-2]}")
    rendered = _test_fault_injection(render_cpu_kernel(result.plan), say)
    report = {"xfc_report": 1, "target": "cpu", **result.report(), "synthesis_seconds": synth_s,
              "threads": result.plan.gemm.threads if result.plan.gemm else result.plan.depthwise.threads,
              "explain": result.explain()}
    if tile_db is not None:
        report["tile_db"] = tile_db
    with OutputDir(Path(out_dir), what=f"xfc synth {spec.key()} for {hw.name} (cpu)", force=force) as staging:
        start = time.perf_counter()
        if hw.target_arch == "x86_64":
            kernel = build_host(rendered, staging.path)
        else:
            binary = build_arm(rendered, staging.path)
        report["build_seconds"] = time.perf_counter() - start
        say(f"built in {report['build_seconds']:.2f} s ({'host gcc' if hw.target_arch == 'x86_64' else 'aarch64-linux-gnu-gcc -static'})")
        if mca:   # static analysis of the inner FMA loop (xfc.mca); the loop goes beside the kernel
            from .mca import analyze_kernel   # an optional analysis: imported only when asked for
            analysis = analyze_kernel(rendered, result.cluster.core)
            report["mca"] = {**analysis.as_dict(), "summary": analysis.summary_lines()}
            (staging.path / "mca_loop.s").write_text(analysis.loop_text)
        if verify or bench:
            a, b, bias = make_inputs(spec, seed)
            # Both entry points are checked: weights packed per call, and pre-packed once. A guard
            # violation raised while running is a failed verification too: it is reported, and
            # the outputs are kept for inspection like any other mismatch.
            per_call = timing = None
            try:
                if hw.target_arch == "x86_64":
                    out, out_packed = kernel(a, b, bias), kernel.run_packed(a, kernel.prepack(b), bias)
                    if bench:
                        timing = kernel.time(a, b, bias, repeats=repeat, warmup=3, prepacked=True)
                        per_call = kernel.time(a, b, bias, repeats=repeat, warmup=3)
                else:
                    say(f"running under qemu-aarch64 -cpu {result.plan.qemu_cpu or 'max'} ...")
                    out, per_call = run_qemu(binary, spec, a, b, bias, qemu_cpu=result.plan.qemu_cpu, march=result.plan.gcc_march,
                                             repeats=repeat if bench else 1, warmup=1 if bench else 0)
                    out_packed, timing = run_qemu(binary, spec, a, b, bias, qemu_cpu=result.plan.qemu_cpu, march=result.plan.gcc_march,
                                                  repeats=repeat if bench else 1, warmup=1 if bench else 0,
                                                  prepacked=True)
                    if not bench:
                        timing = per_call = None
                verdict = merge([check_output(spec, out, a, b, bias), check_output(spec, out_packed, a, b, bias)])
                report.update(verdict.as_report())
            except VerificationError as exc:
                report.update(verified=False, max_abs_error=None, error_to_bound_ratio=None, failure=str(exc))
                timing = per_call = None
            report["verified_on"] = ("host (native)" if hw.target_arch == "x86_64" else
                                     f"qemu-aarch64 -cpu {result.plan.qemu_cpu or 'max'}")
            if timing is not None:
                report["measurement"] = {"median_s": timing.median_s, "min_s": timing.min_s, "max_s": timing.max_s,
                                         "gflops": timing.gflops, "repeats": len(timing.samples_s),
                                         "where": timing.where, "weights": "pre-packed once (untimed)"}
            if per_call is not None:
                report["measurement_packing_per_call"] = {
                    "median_s": per_call.median_s, "gflops": per_call.gflops, "repeats": len(per_call.samples_s),
                    "where": per_call.where, "weights": "packed inside every call"}
        (staging.path / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        staging.commit()
    report["output_dir"] = str(out_dir)
    if report.get("verified") is False:
        raise VerificationError(
            f"{spec.name} kernel for {hw.name} failed verification against the numpy reference "
            f"({report['failure']}); outputs kept in {out_dir}")
    return report


def _test_fault_injection(rendered, say):
    """TEST-ONLY: the deliberately wrong kernel XFC_TEST_MUTANT names (xfc/cpu/mutants.py), applied to
    the rendered source so that tests can show `xfc synth --verify` exits 4."""
    name = settings.test_mutant()
    if not name:
        return rendered
    from .cpu.mutants import mutate
    mutated = mutate(rendered, name)
    say(f"TEST FAULT INJECTION ({TEST_MUTANT_ENV}={name}): this kernel is deliberately wrong")
    return mutated



# ---------------------------------------------------------------------------------------------
# CPU on a device or QEMU: xfc bench
# ---------------------------------------------------------------------------------------------

def run_bench(spec, hw, runner=None, *, cluster=None, threads=None, repeat=10, warmup=2, timeout_s=300.0, seed=0,
              progress=None, device: str = "qemu"):
    """The pipeline behind `xfc bench`: synthesize -> cross-build a static aarch64 harness (in a
    private temporary directory) -> run it pinned to the cluster's CPUs through `runner` (ADB, the
    virtual device; default: local qemu-aarch64) -> verify against the float64 reference.
    Returns (report, RunResult, verdict); the caller adds the device identity and decides on the verdict."""
    say = progress or (lambda msg: None)
    result, synth_s = synthesize_timed(spec, hw, cluster, threads)
    cluster = result.cluster
    say(f"synthesized in {synth_s * 1e3:.1f} ms for the {cluster.role} cluster ({cluster.count}x {cluster.core.name})")
    rendered = render_cpu_kernel(result.plan)
    if runner is None:
        runner = get_runner("qemu", qemu_cpu=result.plan.qemu_cpu or "max")
    with tempfile.TemporaryDirectory(prefix="xfc-bench-") as tmp:
        start = time.perf_counter()
        binary = build_arm(rendered, Path(tmp))
        build_s = time.perf_counter() - start
        say(f"built {binary.name} in {build_s:.2f} s; running on {device} ...")
        a, b, bias = make_inputs(spec, seed=seed)
        run = runner.execute(RunSpec(harness=binary, inputs=(a, b, bias), repeat=repeat, warmup=warmup,
                                     timeout_s=timeout_s, output_shape=spec.output_shape,
                                     cpu_ids=tuple(cluster.cpu_ids), label=spec.key(),
                                     protocol="times-file", march=result.plan.gcc_march))
    verdict = check_output(spec, run.output, a, b, bias)
    ok, max_err, ratio = verdict
    gflops = spec.flops / run.median_s / 1e9 if run.median_s > 0 else float("inf")
    report = {
        "operator": spec.name, "shape": spec.describe(), "hardware": hw.name, "cluster": cluster.role,
        "cpu_ids": list(cluster.cpu_ids), "tiles": result.report().get("tiles"), "synthesis_seconds": synth_s,
        "build_seconds": build_s, "verified": bool(ok), "max_abs_error": max_err, "error_to_bound_ratio": ratio,
        "gflops": gflops, "predicted_gflops": result.estimate.predicted_gflops,
        "prediction_note": "static cost model, not a measurement", "measurement": run.to_dict(),
        "device_identity": None,
    }
    return report, run, verdict


# ---------------------------------------------------------------------------------------------
# GPU: xfc synth --target gpu
# ---------------------------------------------------------------------------------------------

def _jsonable(value):
    if is_dataclass(value):
        return {k: _jsonable(v) for k, v in asdict(value).items()}
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    return value



def run_gpu_synth(spec, hw, out_dir, dtype: str = "fp32", verify: bool = True, explain: bool = False,
                  bench: bool = False, max_work_group_size: Optional[int] = None, repeat: Optional[int] = None,
                  seed: int = 0, force: bool = False) -> dict:
    """Synthesize, render, and (if verify or bench) build, run on PoCL and check; outputs go to out_dir.

    Everything is written into a staging directory that replaces out_dir only when complete
    (xfc.outputs: out_dir must be new, empty or xfc's own; `force` writes beside foreign files).
    Returns the report (also in out_dir/report.json). A wrong result raises VerificationError
    after the outputs are in place (the report is attached as `.report`).
    """
    final = Path(out_dir)
    with OutputDir(final, what=f"xfc synth {spec.key()} for {hw.name} (gpu, {dtype})", force=force) as staging:
        report, failure = _gpu_synth_into(staging.path, final, spec, hw, dtype, verify, explain, bench,
                                          max_work_group_size, repeat, seed)
        staging.commit()
    if failure:
        err = VerificationError(failure)
        err.report = report
        raise err
    return report


def _gpu_synth_into(out: Path, final: Path, spec, hw, dtype, verify, explain, bench, max_work_group_size, repeat,
                    seed) -> tuple[dict, Optional[str]]:
    """The work of run_gpu_synth: files go to `out` (staging), paths in the report name `final`."""
    synthesis = synthesize_gpu(spec, hw, dtype=dtype, max_work_group_size=max_work_group_size)
    plan = synthesis.plan
    stem = spec.key()
    kernels: dict[str, GpuKernelPlan] = {plan.variant: plan}
    if dtype == "fp16":
        kernels["fp16_storage"] = plan.with_variant("fp16_storage")
    files = {}
    for variant, p in kernels.items():
        path = out / f"{stem}.{variant}.cl"
        write_atomic(path, gpu_codegen.render_kernel(p))
        files[variant] = path
    write_atomic(out / "harness.c", gpu_codegen.render_harness())
    write_atomic(out / "build.sh", gpu_codegen.build_script([files[v].name for v in kernels if v != "fp16"]))
    os.chmod(out / "build.sh", 0o755)
    explain_text = synthesis.explain()
    if explain:
        write_atomic(out / "explain.txt", explain_text + "\n")

    run_variant = "fp16_storage" if dtype == "fp16" else "fp32"
    report = {
        "xfc_version": __version__,
        "hardware": plan.hardware_name,
        "gpu": plan.gpu_name,
        "family": plan.family,
        "target": "gpu",
        "op": spec.name,
        "shape": spec.shape_dict(),
        "epilogue": spec.epilogue.describe(),
        "dtype": dtype,
        "tiles": plan.tiles(),
        "tile_summary": plan.tile_summary(),
        "predicted_gflops": plan.cost.gflops,
        "predicted_seconds": plan.cost.seconds,
        "predicted_bound": plan.cost.bound,
        "prediction_label": PREDICTION_LABEL,
        "synthesis_seconds": synthesis.synthesis_seconds,
        "candidates_evaluated": synthesis.candidates_evaluated,
        "build_seconds": None,
        "verified": None,
        "max_abs_error": None,
        "worst_error_ratio": None,
        "run_variant": run_variant if (verify or bench) else None,
        "pocl_median_s": None,
        "pocl_min_s": None,
        "pocl_max_s": None,
        "pocl_repeats": None,
        "pocl_device": None,
        "timing_label": POCL_LABEL,
        "fp16_kernel": None,
        "files": {v: str(final / p.name) for v, p in files.items()},
        "explain": explain_text if explain else None,
    }
    if dtype == "fp16":
        report["fp16_kernel"] = {"status": "rendered only", "note": FP16_NOTE}

    failure = None
    if verify or bench:
        t0 = time.perf_counter()
        harness = opencl.build_harness(out)
        report["build_seconds"] = time.perf_counter() - t0
        info = pocl.device_info(harness)
        report["pocl_device"] = info.get("device")
        if dtype == "fp16" and "cl_khr_fp16" in info.get("extensions", "").split():
            pocl.compile_check(harness, files["fp16"])
            report["fp16_kernel"] = {"status": "compile-checked", "device": info.get("device"), "note": FP16_NOTE}
        a, b, bias = make_inputs(spec, seed)
        paths = (out / "a.f32", out / "b.f32", out / "bias.f32")
        for arr, path in zip((a, b, bias), paths):
            write_atomic(path, np.ascontiguousarray(arr, dtype=np.float32).tobytes())
        out_path = out / "out.f32"
        reps = repeat if repeat is not None else (10 if bench else 1)
        try:
            timing = pocl.run_kernel(harness, files[run_variant], paths, out_path, repeat=reps, warmup=1)
        except VerificationError as exc:  # a guard zone changed: report it like a wrong result
            report.update(verified=False, failure=str(exc))
            failure = str(exc)
        else:
            got = np.fromfile(out_path, dtype=np.float32)
            report.update(pocl_median_s=timing["median_s"], pocl_min_s=timing["min_s"], pocl_max_s=timing["max_s"],
                          pocl_repeats=timing["repeats"], pocl_samples_s=timing["samples_s"])
            if verify:
                verdict = check_variant_output(run_variant, spec, got, a, b, bias)
                report.update(verified=bool(verdict.ok), max_abs_error=verdict.max_abs_error,
                              worst_error_ratio=verdict.worst_ratio, rms_error=verdict.rms_error,
                              rms_limit=verdict.rms_limit)
                if not verdict.ok:
                    report["failure"] = verdict.reason
                    failure = f"{files[run_variant].name} on {report['pocl_device']}: {verdict.reason}"
    write_atomic(out / "report.json", json.dumps(_jsonable(report), indent=2, ensure_ascii=False) + "\n")
    return report, failure
