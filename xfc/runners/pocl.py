"""Running OpenCL kernels on the host through the shape-free harness (xfc.build.opencl) and PoCL.

PoCL runs the kernels on the host CPU: its timings are never phone GPU timings (POCL_LABEL).
The harness reads a kernel file's `// xfc-launch:` line, runs it on raw fp32/fp16 files and prints
one JSON line (device info, or median/min/max and the samples). Every run has a timeout; a
changed guard zone around a buffer (exit HARNESS_EXIT_GUARD) is a VerificationError.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from ..build import procs
from ..build.toolchain import APT_PACKAGES as TOOL_PACKAGES
from ..errors import ToolchainError, VerificationError

POCL_LABEL = "PoCL on the host CPU — not a phone GPU timing"
APT_PACKAGES = TOOL_PACKAGES["opencl"]
HARNESS_RUN_TIMEOUT_S = 900
HARNESS_EXIT_GUARD = 5  # the harness found a changed guard zone around a buffer (a wrong kernel)

_device_cache: dict[str, dict] = {}


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


