"""`xfc synth --target gpu`: OpenCL kernels rendered for the description's GPU, built into the
shape-free harness and run on PoCL on the host CPU (never a phone GPU timing), verified against the
float64 reference. PoCL has no cl_khr_fp16, so true half-arithmetic kernels are only rendered here
(and compile-checked when the OpenCL device offers cl_khr_fp16); the fp16-storage / fp32-arithmetic
variant (vload_half / vstore_half) runs everywhere and is what `dtype='fp16'` verifies.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from ..toolchain import opencl
from ..errors import VerificationError
from ..gpu import codegen as gpu_codegen
from ..gpu.ir import PREDICTION_LABEL, GpuKernelPlan
from ..gpu.synth import synthesize_gpu
from ..ops.reference import check_variant_output, make_inputs
from ..outputs import OutputDir, write_atomic
from ..runners import Measurement, RunSpec
from ..runners.pocl import HARNESS_RUN_TIMEOUT_S, POCL_LABEL, PoclRunner, compile_check, device_info
from .report import Report, measurement_dict, report_core

FP16_NOTE = ("PoCL has no cl_khr_fp16, so the half-arithmetic kernel is only render-checked here (compile-checked "
             "only on an OpenCL device that offers cl_khr_fp16); the fp16-storage / fp32-arithmetic variant is the "
             "one run and verified")


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
    kernels: dict[str, GpuKernelPlan] = synthesis.kernel_variants     # the planner's: which files ship
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

    run_variant = synthesis.portable_variant
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
