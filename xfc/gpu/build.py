"""Render GPU plans to OpenCL C, build the C host harness, run it on PoCL and verify.

PoCL runs the kernels on the host CPU: its timings are never phone GPU timings, and PoCL
has no cl_khr_fp16, so true half-arithmetic kernels are only rendered here (and compile-
checked when the OpenCL device offers cl_khr_fp16). The fp16-storage / fp32-arithmetic
variant (vload_half / vstore_half) runs everywhere and is what `dtype='fp16'` verifies.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Optional

import jinja2
import numpy as np

from .._version import __version__
from .. import settings
from ..build import procs
from ..build.toolchain import write_atomic
from ..errors import ToolchainError, VerificationError
from ..ops.reference import make_inputs
from ..paths import TEMPLATES_DIR
from .ir import PREDICTION_LABEL, GpuKernelPlan
from .synth import synthesize_gpu
from ..ops.reference import check_variant_output

TEMPLATE_DIR = TEMPLATES_DIR / "opencl"
POCL_LABEL = "PoCL on the host CPU — not a phone GPU timing"
FP16_NOTE = ("PoCL has no cl_khr_fp16, so the half-arithmetic kernel is only render-checked here (compile-checked "
             "only on an OpenCL device that offers cl_khr_fp16); the fp16-storage / fp32-arithmetic variant is the "
             "one run and verified")
APT_PACKAGES = "gcc ocl-icd-opencl-dev opencl-headers pocl-opencl-icd"
HARNESS_RUN_TIMEOUT_S = 900
HARNESS_COMPILE_TIMEOUT_S = 180
HARNESS_EXIT_GUARD = 5  # the harness found a changed guard zone around a buffer (a wrong kernel)

_env: Optional[jinja2.Environment] = None
_harness_cache: dict[str, Path] = {}
_device_cache: dict[str, dict] = {}


def _environment() -> jinja2.Environment:
    global _env
    if _env is None:
        _env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)), undefined=jinja2.StrictUndefined,
                                  keep_trailing_newline=True, autoescape=False)
    return _env


def render_kernel(plan: GpuKernelPlan) -> str:
    return _environment().get_template(plan.template).render(**plan.template_context())


def render_harness(default_repeat: int = 10, default_warmup: int = 1) -> str:
    return _environment().get_template("harness.c.j2").render(
        version=__version__, default_repeat=default_repeat, default_warmup=default_warmup)


def _cache_root() -> Path:
    return settings.cache_dir()


def _compile_command(source: Path, binary: Path) -> list[str]:
    return ["gcc", "-O2", "-std=c11", "-Wall", str(source), "-o", str(binary), "-lOpenCL", "-lm"]


def build_harness(out_dir: Optional[Path] = None) -> Path:
    """Compile the shape-free harness once per source text (cached); copy it to out_dir if given."""
    source = render_harness()
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    binary = _harness_cache.get(digest)
    if binary is None or not binary.exists():
        if shutil.which("gcc") is None:
            raise ToolchainError(f"gcc not found; the OpenCL harness needs it: apt-get install {APT_PACKAGES}")
        cache = _cache_root() / "opencl-harness" / digest
        binary = cache / "harness"
        if not binary.exists():
            cache.mkdir(parents=True, exist_ok=True)
            src = cache / "harness.c"
            write_atomic(src, source)
            tmp_bin = cache / f".harness.{os.getpid()}"
            try:
                try:
                    proc = procs.run(_compile_command(src, tmp_bin), timeout=HARNESS_COMPILE_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    raise ToolchainError(f"building the OpenCL harness timed out after "
                                         f"{HARNESS_COMPILE_TIMEOUT_S} s") from None
                if proc.returncode != 0:
                    first = next((l for l in proc.stderr.splitlines() if "error" in l), proc.stderr.strip()[:200])
                    raise ToolchainError(f"building the OpenCL harness failed ({first.strip()}); install the OpenCL "
                                         f"headers and loader: apt-get install {APT_PACKAGES}")
                os.replace(tmp_bin, binary)
            finally:  # a failed or interrupted build leaves nothing in the cache
                tmp_bin.unlink(missing_ok=True)
        _harness_cache[digest] = binary
    if out_dir is not None:
        dest = Path(out_dir) / "harness"
        if not dest.exists() or dest.stat().st_size != binary.stat().st_size:
            shutil.copy2(binary, dest)
        return dest
    return binary


def _run(cmd: list[str], what: str) -> str:
    try:
        proc = procs.run(cmd, timeout=HARNESS_RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ToolchainError(f"{what} timed out after {HARNESS_RUN_TIMEOUT_S} s") from None
    if proc.returncode == HARNESS_EXIT_GUARD:
        line = next((l.strip() for l in proc.stderr.splitlines() if "guard violation" in l), proc.stderr.strip())
        raise VerificationError(f"{what}: {line.replace('harness: ', '', 1)[:300]}")
    if proc.returncode != 0:
        lines = [l.strip() for l in proc.stderr.splitlines() if l.strip()]
        harness_line = next((l for l in lines if l.startswith("harness:")), lines[-1] if lines else "")
        first_error = next((l for l in lines if "error" in l.lower() and not l.startswith("harness:")), "")
        if "no OpenCL platform" in harness_line or "no OpenCL device" in harness_line:
            raise ToolchainError(f"{what}: no OpenCL platform/device; apt-get install {APT_PACKAGES}")
        detail = harness_line + (f" ({first_error})" if first_error else "")
        raise ToolchainError(f"{what} failed: {detail}")
    return proc.stdout


def device_info(harness: Path) -> dict:
    key = str(harness)
    if key not in _device_cache:
        _device_cache[key] = json.loads(_run([str(harness), "--info"], "OpenCL device query").strip().splitlines()[-1])
    return _device_cache[key]


def run_kernel(harness: Path, kernel: Path, inputs: tuple[Path, Path, Path], out: Path, repeat: int = 1,
               warmup: int = 1) -> dict:
    cmd = [str(harness), str(kernel), *map(str, inputs), str(out), "--repeat", str(repeat), "--warmup", str(warmup)]
    text = _run(cmd, f"running {kernel.name}")
    return json.loads(text.strip().splitlines()[-1])


def compile_check(harness: Path, kernel: Path) -> dict:
    return json.loads(_run([str(harness), "--compile-only", str(kernel)], f"compiling {kernel.name}")
                      .strip().splitlines()[-1])


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


def _build_script(kernel_names: list[str]) -> str:
    return "\n".join([
        "#!/bin/sh",
        f"# xfc {__version__}: build and run the OpenCL harness (host: gcc + PoCL; phone: the NDK's clang",
        "# against the device's libOpenCL.so, e.g. $NDK/.../aarch64-linux-android29-clang harness.c -lOpenCL).",
        "set -e",
        'cd "$(dirname "$0")"',
        "${CC:-gcc} -O2 -std=c11 -Wall harness.c -o harness -lOpenCL -lm",
        *[f"./harness {k} a.f32 b.f32 bias.f32 out.f32 --repeat 10 --warmup 1" for k in kernel_names],
        "",
    ])


def run_gpu_synth(spec, hw, out_dir, dtype: str = "fp32", verify: bool = True, explain: bool = False,
                  bench: bool = False, max_work_group_size: Optional[int] = None, repeat: Optional[int] = None,
                  seed: int = 0, force: bool = False) -> dict:
    """Synthesize, render, and (if verify or bench) build, run on PoCL and check; outputs go to out_dir.

    Everything is written into a staging directory that replaces out_dir only when complete
    (xfc.outputs: out_dir must be new, empty or xfc's own; `force` writes beside foreign files).
    Returns the report (also in out_dir/report.json). A wrong result raises VerificationError
    after the outputs are in place (the report is attached as `.report`).
    """
    from ..outputs import OutputDir

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
        write_atomic(path, render_kernel(p))
        files[variant] = path
    write_atomic(out / "harness.c", render_harness())
    write_atomic(out / "build.sh", _build_script([files[v].name for v in kernels if v != "fp16"]))
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
        harness = build_harness(out)
        report["build_seconds"] = time.perf_counter() - t0
        info = device_info(harness)
        report["pocl_device"] = info.get("device")
        if dtype == "fp16" and "cl_khr_fp16" in info.get("extensions", "").split():
            compile_check(harness, files["fp16"])
            report["fp16_kernel"] = {"status": "compile-checked", "device": info.get("device"), "note": FP16_NOTE}
        a, b, bias = make_inputs(spec, seed)
        paths = (out / "a.f32", out / "b.f32", out / "bias.f32")
        for arr, path in zip((a, b, bias), paths):
            write_atomic(path, np.ascontiguousarray(arr, dtype=np.float32).tobytes())
        out_path = out / "out.f32"
        reps = repeat if repeat is not None else (10 if bench else 1)
        try:
            timing = run_kernel(harness, files[run_variant], paths, out_path, repeat=reps, warmup=1)
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
