"""Running OpenCL kernels on the host through the shape-free harness (xfc.toolchain.opencl) and PoCL.

PoCL runs the kernels on the host CPU: its timings are never phone GPU timings (POCL_LABEL;
every Measurement from here is `emulated`). The harness reads a kernel file's `// xfc-launch:`
line, runs it on raw fp32 files and prints one JSON line (device info, or median/min/max and the
samples). PoclRunner puts it behind the one runner interface: a RunSpec naming the kernel file ->
a Measurement. Every run has a timeout; a changed guard zone around a buffer (exit
HARNESS_EXIT_GUARD) is a VerificationError; any other failure a ToolchainError.
"""
from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path


from ..toolchain import procs
from ..toolchain.tools import APT_PACKAGES as TOOL_PACKAGES
from ..errors import ToolchainError
from .base import (HARNESS_EXIT_GUARD, Measurement, Runner, RunSpec, guard_violation, load_output, parse_report,
                   stage_inputs)

POCL_LABEL = "PoCL on the host CPU — not a phone GPU timing"
APT_PACKAGES = TOOL_PACKAGES["opencl"]
HARNESS_RUN_TIMEOUT_S = 900

_device_cache: dict[str, dict] = {}


def _run(cmd: list[str], what: str, timeout_s: float = HARNESS_RUN_TIMEOUT_S) -> str:
    try:
        proc = procs.run(cmd, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ToolchainError(f"{what} timed out after {timeout_s:g} s") from None
    if proc.returncode == HARNESS_EXIT_GUARD:
        raise guard_violation(proc.stderr, what)
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
    """The OpenCL device the harness finds (name, extensions, ...); cached per harness."""
    key = str(harness)
    if key not in _device_cache:
        _device_cache[key] = json.loads(_run([str(harness), "--info"], "OpenCL device query").strip().splitlines()[-1])
    return _device_cache[key]


def compile_check(harness: Path, kernel: Path) -> dict:
    return json.loads(_run([str(harness), "--compile-only", str(kernel)], f"compiling {kernel.name}")
                      .strip().splitlines()[-1])


class PoclRunner(Runner):
    """Runs OpenCL kernel files (RunSpec.harness) through one built harness program on PoCL.
    Inputs are staged as raw float32 files in a private temporary directory, removed afterwards."""

    where = POCL_LABEL
    emulated = True           # the host CPU, never the phone GPU the kernel was synthesized for

    def __init__(self, harness: Path):
        self.harness = Path(harness)

    def describe(self) -> dict:
        return {"runner": "pocl", "device": device_info(self.harness).get("device"), "virtual": True}

    def execute(self, spec: RunSpec) -> Measurement:
        kernel = Path(spec.harness)
        if not kernel.is_file():
            raise ToolchainError(f"OpenCL kernel file not found: {kernel}")
        spec.check_input_shapes(f"running {kernel.name}")
        with tempfile.TemporaryDirectory(prefix="xfc-pocl-") as tmp:
            tmp = Path(tmp)
            inputs = stage_inputs(spec, tmp)
            out = tmp / "out.f32"
            text = _run([str(self.harness), str(kernel), *map(str, inputs), str(out), "--repeat", str(spec.repeat),
                         "--warmup", str(spec.warmup)], f"running {kernel.name}", spec.timeout_s)
            report = parse_report(text, self.where)
            if not out.is_file():
                raise ToolchainError(f"running {kernel.name}: the harness wrote no output")
            output = load_output(out.read_bytes(), spec, self.where)
        return Measurement.from_samples(report["samples_s"], where=self.where, emulated=True, output=output,
                                        flops=spec.flops, device=self.describe(), kernel=str(report.get("kernel", "")),
                                        repeats=int(report.get("repeats", len(report["samples_s"]))),
                                        warmup=spec.warmup)
