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
import tempfile
import time
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Optional

import numpy as np

from . import settings
from ._version import __version__
from .build import opencl
from .build.cpu import build_arm, build_host
from .build.toolchain import RUN_TIMEOUT_S
from .cpu.codegen import render_cpu_kernel
from .cpu.synth import synthesize_cpu
from .errors import OperatorError, VerificationError, XfcError
from .gpu import codegen as gpu_codegen
from .gpu.ir import PREDICTION_LABEL, GpuKernelPlan
from .gpu.synth import synthesize_gpu
from .ops.accuracy import merge
from .ops.reference import check_output, check_variant_output, make_inputs
from .outputs import OutputDir, write_atomic
from .runners import Measurement, RunSpec, get_runner
from .runners.host import HostKernel, HostRunner
from .runners.pocl import HARNESS_RUN_TIMEOUT_S, POCL_LABEL, PoclRunner, compile_check, device_info
from .runners.qemu import QemuRunner
from .settings import TEST_MUTANT_ENV

FP16_NOTE = ("PoCL has no cl_khr_fp16, so the half-arithmetic kernel is only render-checked here (compile-checked "
             "only on an OpenCL device that offers cl_khr_fp16); the fp16-storage / fp32-arithmetic variant is the "
             "one run and verified")


# ---------------------------------------------------------------------------------------------
# Report: what every pipeline run returns
# ---------------------------------------------------------------------------------------------

REPORT_TARGETS = ("cpu", "gpu", "bench")
# The one report schema (docs/ARCHITECTURE.md, "Reports"): every report starts with these keys,
# with the same meaning and type whatever the command and target; target-specific keys follow.
REPORT_SCHEMA_VERSION = 2
REPORT_CORE_KEYS = ("xfc_report", "xfc_version", "command", "target", "operator", "shape", "hardware", "tiles",
                    "predicted_gflops", "verified", "failure", "max_abs_error", "error_to_bound_ratio", "measurement")


def report_core(command: str, target: str, spec, hardware: str, tiles, predicted_gflops) -> dict:
    """The keys every report starts with. shape: spec.describe(); measurement: measurement_dict()
    of the timed run, None until something ran; verified/failure/errors: None until verified."""
    return {"xfc_report": REPORT_SCHEMA_VERSION, "xfc_version": __version__, "command": command, "target": target,
            "operator": spec.name, "shape": spec.describe(), "hardware": hardware, "tiles": tiles,
            "predicted_gflops": predicted_gflops, "verified": None, "failure": None, "max_abs_error": None,
            "error_to_bound_ratio": None, "measurement": None}


def measurement_dict(m: Measurement, weights: Optional[str] = None) -> dict:
    """A Measurement in a report: Measurement.to_dict() plus GFLOP/s (and how weights were packed)."""
    out = {**m.to_dict(), "gflops": m.gflops}
    if weights is not None:
        out["weights"] = weights
    return out


@dataclass(frozen=True, eq=False)
class Report:
    """One pipeline run, for CPU and GPU kernels alike (`xfc synth`, `xfc synth --target gpu`,
    `xfc bench`). The typed fields are what code reads; `to_dict()` is report.json / `--json`.

    measurement: the timed run, or None when nothing was timed: the pre-packed entry point (CPU),
    the PoCL run (GPU), the device or qemu run (bench). per_call: CPU only, the weights packed
    inside every call. Both are runners.Measurement (with `where` and `emulated`: qemu, virtual
    device and PoCL timings are never phone timings). keys: every report key, in report order
    (the JSON schema per target is documented in docs/ARCHITECTURE.md, "Reports").
    """

    target: str                           # one of REPORT_TARGETS
    operator: str                         # spec.name: matmul, conv2d, depthwise
    hardware: str                         # the description's name
    verified: Optional[bool] = None       # None: not verified
    failure: Optional[str] = None         # why verification failed (None when it did not)
    measurement: Optional[Measurement] = None
    per_call: Optional[Measurement] = None
    output_dir: Optional[str] = None
    explain: Optional[str] = None
    keys: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.target not in REPORT_TARGETS:
            raise ValueError(f"report target must be one of {REPORT_TARGETS}, got {self.target!r}")
        object.__setattr__(self, "keys", MappingProxyType(dict(self.keys)))

    @staticmethod
    def of(target: str, keys: dict, *, hardware: str, measurement=None, per_call=None,
           output_dir: Optional[str] = None) -> "Report":
        """A Report from its report keys (the typed fields are read from the same keys)."""
        return Report(target=target, operator=str(keys.get("operator") or ""), hardware=hardware,
                      verified=keys.get("verified"), failure=keys.get("failure"), measurement=measurement,
                      per_call=per_call, output_dir=output_dir, explain=keys.get("explain"), keys=keys)

    def to_dict(self) -> dict:
        """report.json / --json: the keys, and the output directory when the run wrote one."""
        out = dict(self.keys)
        if self.output_dir is not None:
            out["output_dir"] = self.output_dir
        return out


# ---------------------------------------------------------------------------------------------
# compile: the Python API
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Kernel:
    """A synthesized, rendered and built CPU kernel.

    Built for this machine (an x86-64 description such as 'host'), it is callable on numpy arrays:
    `kernel(in0, in1, bias=None) -> out`, shaped as spec.operand_shapes / spec.output_shape.
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
            evaluator=None, constants=None, lowering: str = "auto",
            out_dir=None) -> Kernel:   # noqa: A001  (the public name the issue asks for)
    """Synthesize (synthesize_timed: evaluator and constants from a tile database, or the static
    model), render and build spec for hw. out_dir: where the sources and the built file go
    (default: a temporary directory, removed once the host library is loaded; an ARM build needs
    out_dir, since the binary must outlive the call)."""
    if target != "cpu":
        raise OperatorError(f"compile supports target 'cpu' (GPU kernels: xfc.pipeline.run_gpu_synth), got {target!r}")
    result, _seconds = synthesize_timed(spec, hw, cluster, threads, evaluator, constants, lowering)
    rendered = render_cpu_kernel(result.plan)
    if hw.target_arch == "x86_64":
        if out_dir is None:
            with tempfile.TemporaryDirectory(prefix="xfc-compile-") as tmp:
                host = HostKernel(rendered, build_host(rendered, tmp))   # loaded now: the mapping outlives the file
            return Kernel(spec=spec, hardware=hw.name, synthesis=result, host=host)
        host = _build_owned(rendered, Path(out_dir), _build_and_load, f"xfc.compile {spec.key()} for {hw.name}")
        return Kernel(spec=spec, hardware=hw.name, synthesis=result, files={"dir": Path(out_dir)}, host=host)
    if out_dir is None:
        raise XfcError(f"compile for {hw.name} ({hw.target_arch}) builds a binary that must outlive the call: "
                       f"pass out_dir")
    binary = _build_owned(rendered, Path(out_dir), build_arm, f"xfc.compile {spec.key()} for {hw.name}")
    return Kernel(spec=spec, hardware=hw.name, synthesis=result, files={"dir": Path(out_dir), "binary": binary})


def _build_and_load(rendered, out_dir: Path) -> HostKernel:
    return HostKernel(rendered, build_host(rendered, out_dir))


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

def synthesize_timed(spec, hw, cluster=None, threads=None, evaluator=None, constants=None, lowering="auto"):
    """Run the (pure) synthesizer and time it: the one place synthesis seconds are measured.
    evaluator / constants: a tile-database evaluator and calibrated cost-model constants
    (xfc.tiledb, chosen by the command line's --tile-db); None: the static model. lowering:
    'auto', 'direct' or 'winograd' (synth.synthesize_cpu); a forced lowering is never answered
    from the plan cache, which holds 'auto' choices only."""
    start = time.perf_counter()
    extra = {} if constants is None else {"constants": constants}
    synthesize = getattr(evaluator, "synthesize", synthesize_cpu)   # a tile db's plan cache (xfc.tiledb.plancache)
    if lowering != "auto":
        synthesize, extra = synthesize_cpu, {**extra, "lowering": lowering}
    result = synthesize(spec, hw, cluster=cluster, threads=threads, evaluator=evaluator, **extra)
    return result, time.perf_counter() - start


def run_cpu(spec, hw, out_dir: Path, *, cluster=None, threads=None, verify=False, bench=False,
            repeat=20, seed=0, progress=None, force=False, mca=False, evaluator=None, constants=None,
            tile_db: Optional[dict] = None, lowering: str = "auto", dtype: str = "fp32") -> Report:
    """The CPU pipeline behind `xfc synth`: synthesize -> render -> build -> [llvm-mca] -> verify -> time.
    Outputs go to out_dir through xfc.outputs.OutputDir (force: write beside foreign files).
    evaluator, constants: see synthesize_timed; tile_db: what the caller says about the database
    they came from (recorded in the report as 'tile_db'). dtype 'fp16': fp16 kernels on AArch64 cores
    with FP16 arithmetic (xfc/cpu/fp16.py), verified under the bound of xfc/ops/fp16.py."""

    say = progress or (lambda msg: None)
    fp16 = dtype == "fp16"
    if fp16:   # static cost model, direct lowering (xfc/cpu/fp16.py); refusals are one line
        from .cpu.fp16 import synthesize_fp16
        start = time.perf_counter()
        result = synthesize_fp16(spec, hw, cluster, threads)
        synth_s = time.perf_counter() - start
    else:
        result, synth_s = synthesize_timed(spec, hw, cluster, threads, evaluator, constants, lowering)
    say(f"synthesized in {synth_s * 1e3:.1f} ms: {result.plan.header_lines[-2]}")
    rendered = _test_fault_injection(render_cpu_kernel(result.plan), say)
    report = {**report_core("synth", "cpu", spec, hw.name, None, None), **result.report(), "synthesis_seconds": synth_s,
              "threads": result.plan.gemm.threads if result.plan.gemm else result.plan.depthwise.threads,
              "explain": result.explain()}
    if tile_db is not None:
        report["tile_db"] = tile_db
    if fp16:
        report["dtype"] = "fp16"
    with OutputDir(Path(out_dir), what=f"xfc synth {spec.key()} for {hw.name} (cpu)", force=force) as staging:
        start = time.perf_counter()
        host = hw.target_arch == "x86_64"
        qemu_cpu = result.plan.qemu_cpu or "max"
        if host:
            runner = HostRunner(HostKernel(rendered, build_host(rendered, staging.path)))
            artifact = runner.kernel.library
        else:
            runner, artifact = QemuRunner(cpu=qemu_cpu), build_arm(rendered, staging.path)
        report["build_seconds"] = time.perf_counter() - start
        say(f"built in {report['build_seconds']:.2f} s ({'host gcc' if host else 'aarch64-linux-gnu-gcc -static'})")
        if mca:   # static analysis of the inner FMA loop (xfc.mca); the loop goes beside the kernel
            from .mca import analyze_kernel   # an optional analysis: imported only when asked for
            analysis = analyze_kernel(rendered, result.cluster.core)
            report["mca"] = {**analysis.as_dict(), "summary": analysis.summary_lines()}
            (staging.path / "mca_loop.s").write_text(analysis.loop_text)
        per_call = timing = None
        if verify or bench:
            a, b, bias = make_inputs(spec, seed)
            if fp16:   # the kernel's inputs are fp16; the reference takes these values as exact
                from .ops.fp16 import to_fp16_values
                a, b, bias = to_fp16_values(a, b, bias)
            # Both entry points are checked: weights packed per call, and pre-packed once. A guard
            # violation raised while running is a failed verification too: it is reported, and
            # the outputs are kept for inspection like any other mismatch.
            if not host:
                say(f"running under qemu-aarch64 -cpu {qemu_cpu} ...")
            warmup = (3 if host else 1) if bench else 0

            def measure(prepacked: bool):
                return runner.execute(RunSpec(
                    harness=artifact, inputs=(a, b, bias), repeat=repeat if bench else 1, warmup=warmup,
                    timeout_s=RUN_TIMEOUT_S, output_shape=spec.output_shape, label=rendered.function_name,
                    protocol="times-file", march=result.plan.gcc_march, prepacked=prepacked,
                    input_shapes=tuple(tuple(s) for s in spec.operand_shapes), flops=spec.flops))
            try:
                per_call, timing = measure(prepacked=False), measure(prepacked=True)
                wm = result.plan.winograd_m
                if fp16:
                    from .ops.fp16 import check_fp16_output
                    kc = result.plan.gemm.kc if result.plan.gemm else None
                    checked = [check_fp16_output(spec, run.output, a, b, bias, kc) for run in (per_call, timing)]
                    verdict = merge([v for v, _ in checked])
                    report["bound"] = checked[0][1].as_report()
                else:
                    verdict = merge([check_output(spec, per_call.output, a, b, bias, winograd_m=wm),
                                     check_output(spec, timing.output, a, b, bias, winograd_m=wm)])
                report.update(verdict.as_report())
            except VerificationError as exc:
                report.update(verified=False, max_abs_error=None, error_to_bound_ratio=None, failure=str(exc))
                timing = per_call = None
            if not bench:
                timing = per_call = None
            report["verified_on"] = "host (native)" if host else f"qemu-aarch64 -cpu {qemu_cpu}"
            if timing is not None:
                report["measurement"] = measurement_dict(timing, "pre-packed once (untimed)")
            if per_call is not None:
                report["measurement_packing_per_call"] = measurement_dict(per_call, "packed inside every call")
        (staging.path / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        staging.commit()
    if report.get("verified") is False:
        raise VerificationError(
            f"{spec.name} kernel for {hw.name} failed verification against the numpy reference "
            f"({report['failure']}); outputs kept in {out_dir}")
    return Report.of("cpu", report, hardware=hw.name, measurement=timing, per_call=per_call, output_dir=str(out_dir))


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
              progress=None, device: str = "qemu", device_identity: Optional[dict] = None) -> Report:
    """The pipeline behind `xfc bench`: synthesize -> cross-build a static aarch64 harness (in a
    private temporary directory) -> run it pinned to the cluster's CPUs through `runner` (ADB, the
    virtual device; default: local qemu-aarch64) -> verify against the float64 reference.
    Returns the Report (measurement: the device run; failure: why the output is wrong, if it is);
    device_identity: what the caller read from the device (recorded as is). The caller decides
    on the verdict."""
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
                                     protocol="times-file", march=result.plan.gcc_march, flops=spec.flops,
                                     input_shapes=tuple(tuple(s) for s in spec.operand_shapes)))
    verdict = check_output(spec, run.output, a, b, bias, winograd_m=result.plan.winograd_m)
    ok, max_err, ratio = verdict
    gflops = run.gflops
    report = {
        **report_core("bench", "cpu", spec, hw.name, result.report().get("tiles"), result.estimate.predicted_gflops),
        "verified": bool(ok), "failure": None if ok else verdict.reason, "max_abs_error": max_err,
        "error_to_bound_ratio": ratio, "measurement": measurement_dict(run),
        "cluster": cluster.role, "cpu_ids": list(cluster.cpu_ids), "synthesis_seconds": synth_s,
        "build_seconds": build_s, "gflops": gflops, "prediction_note": "static cost model, not a measurement",
        "device_identity": device_identity,
    }
    rep = Report.of("bench", report, hardware=hw.name, measurement=run)
    return rep if ok else replace(rep, failure=verdict.reason)


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
                  seed: int = 0, force: bool = False) -> Report:
    """Synthesize, render, and (if verify or bench) build, run on PoCL and check; outputs go to out_dir.

    Everything is written into a staging directory that replaces out_dir only when complete
    (xfc.outputs: out_dir must be new, empty or xfc's own; `force` writes beside foreign files).
    Returns the Report (its keys also in out_dir/report.json). A wrong result raises
    VerificationError after the outputs are in place (the Report is attached as `.report`).
    """
    final = Path(out_dir)
    with OutputDir(final, what=f"xfc synth {spec.key()} for {hw.name} (gpu, {dtype})", force=force) as staging:
        keys, timing, failure = _gpu_synth_into(staging.path, final, spec, hw, dtype, verify, explain, bench,
                                                max_work_group_size, repeat, seed)
        staging.commit()
    report = Report.of("gpu", keys, hardware=hw.name, measurement=timing, output_dir=str(final))
    if failure:
        err = VerificationError(failure)
        err.report = report
        raise err
    return report


def _gpu_synth_into(out: Path, final: Path, spec, hw, dtype, verify, explain, bench, max_work_group_size, repeat,
                    seed) -> tuple[dict, Optional[Measurement], Optional[str]]:
    """The work of run_gpu_synth: files go to `out` (staging), paths in the report name `final`.
    Returns (report keys, the PoCL Measurement or None, the failure or None)."""
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
    write_atomic(out / "build.sh", gpu_codegen.build_script([files[v].name for v in kernels if v != "fp16"]),
                 executable=True)
    explain_text = synthesis.explain()
    if explain:
        write_atomic(out / "explain.txt", explain_text + "\n")

    run_variant = "fp16_storage" if dtype == "fp16" else "fp32"
    report = {
        **report_core("synth", "gpu", spec, plan.hardware_name, plan.tiles(), plan.cost.gflops),
        "gpu": plan.gpu_name,
        "family": plan.family,
        "dims": spec.shape_dict(),
        "epilogue": spec.epilogue.describe(),
        "dtype": dtype,
        "tile_summary": plan.tile_summary(),
        "predicted_seconds": plan.cost.seconds,
        "predicted_bound": plan.cost.bound,
        "prediction_label": PREDICTION_LABEL,
        "synthesis_seconds": synthesis.synthesis_seconds,
        "candidates_evaluated": synthesis.candidates_evaluated,
        "build_seconds": None,
        "run_variant": run_variant if (verify or bench) else None,
        "pocl_device": None,
        "timing_label": POCL_LABEL,
        "fp16_kernel": None,
        "files": {v: str(final / p.name) for v, p in files.items()},
        "explain": explain_text if explain else None,
    }
    if dtype == "fp16":
        report["fp16_kernel"] = {"status": "rendered only", "note": FP16_NOTE}

    failure = timing = None
    if verify or bench:
        t0 = time.perf_counter()
        harness = opencl.build_harness(out)
        report["build_seconds"] = time.perf_counter() - t0
        info = device_info(harness)
        report["pocl_device"] = info.get("device")
        if dtype == "fp16" and "cl_khr_fp16" in info.get("extensions", "").split():
            compile_check(harness, files["fp16"])
            report["fp16_kernel"] = {"status": "compile-checked", "device": info.get("device"), "note": FP16_NOTE}
        a, b, bias = make_inputs(spec, seed)
        paths = (out / "a.f32", out / "b.f32", out / "bias.f32")
        for arr, path, shape in zip((a, b, bias), paths, spec.operand_shapes):
            arr = np.zeros(shape, np.float32) if arr is None else arr   # no bias: the ABI's zeros
            write_atomic(path, np.ascontiguousarray(arr, dtype=np.float32).tobytes())
        reps = repeat if repeat is not None else (10 if bench else 1)
        try:
            timing = PoclRunner(harness).execute(RunSpec(harness=files[run_variant], inputs=paths, repeat=reps,
                                                         warmup=1, timeout_s=HARNESS_RUN_TIMEOUT_S, flops=spec.flops))
        except VerificationError as exc:  # a guard zone changed: report it like a wrong result
            report.update(verified=False, failure=str(exc))
            failure = str(exc)
        else:
            got = timing.output
            write_atomic(out / "out.f32", got.tobytes())
            report["measurement"] = measurement_dict(timing)
            if verify:
                verdict = check_variant_output(run_variant, spec, got, a, b, bias)
                report.update(verified=bool(verdict.ok), max_abs_error=verdict.max_abs_error,
                              error_to_bound_ratio=verdict.worst_ratio, rms_error=verdict.rms_error,
                              rms_limit=verdict.rms_limit)
                if not verdict.ok:
                    report["failure"] = verdict.reason
                    failure = f"{files[run_variant].name} on {report['pocl_device']}: {verdict.reason}"
    write_atomic(out / "report.json", json.dumps(_jsonable(report), indent=2, ensure_ascii=False) + "\n")
    return report, timing, failure
