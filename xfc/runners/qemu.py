"""Harness programs run on this machine: natively (LocalRunner: sanitizer builds) or under
qemu-aarch64 (QemuRunner: static aarch64 harnesses; correctness only, timings are emulated).

One path for both: the harness and its inputs are staged in a private temporary directory, run
with a timeout, and every failure is one line: a changed guard zone (exit HARNESS_EXIT_GUARD) is
a VerificationError, an illegal instruction names the -march and the CPU, anything else is a
DeviceError with the process's first error line.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from xfc.toolchain import procs
from xfc.errors import DeviceError, ToolchainError
from xfc.runners.base import (HARNESS_EXIT_GUARD, HARNESS_EXIT_UNWRITTEN, HarnessRunner, RunContext, guard_violation,
                              harness_args, load_output, parse_report, report_from_times, where_qemu)
from xfc.runners.sigill import illegal_instruction_message, is_illegal_instruction

WHERE_LOCAL = "host (native harness program)"


def _first_error_line(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    return next((ln for ln in lines if "error" in ln.lower()), lines[-1] if lines else "")[:300]


class LocalRunner(HarnessRunner):
    """Runs a harness program in a private temporary directory on this machine, as
    `*prefix harness ARGS` (prefix empty: natively)."""

    where = WHERE_LOCAL
    emulated = False

    def __init__(self, prefix: Sequence[str] = (), cpu_text: str = "the host CPU"):
        self.prefix = tuple(prefix)
        self.cpu_text = cpu_text          # for SIGILL messages: which CPU refused the instruction

    def describe(self) -> dict:
        return {"runner": "local", "virtual": False}

    def _argv_prefix(self) -> list[str]:
        return list(self.prefix)

    def upload(self, ctx: RunContext) -> None:
        # The staging directory is the run directory: only the harness has to be copied in.
        dest = ctx.local_dir / "harness"
        shutil.copyfile(ctx.spec.harness, dest)
        os.chmod(dest, 0o755)
        ctx.remote_dir = str(ctx.local_dir)
        ctx.uploaded = [str(dest)] + [str(p) for p in ctx.input_files]

    def run(self, ctx: RunContext) -> dict:
        spec = ctx.spec
        d = Path(ctx.remote_dir)
        out, times = d / "out.bin", d / "times.txt"
        cmd = [*self._argv_prefix(), str(d / "harness"),
               *harness_args(spec, [str(p) for p in ctx.input_files], str(out), str(times))]
        what = f"harness {spec.label or Path(spec.harness).name} on {self.where}"
        try:
            proc = procs.run(cmd, cwd=d, env_extra=dict(spec.env), timeout=spec.timeout_s)
        except subprocess.TimeoutExpired:
            raise DeviceError(f"{what} timed out after {spec.timeout_s:g} s; it was killed") from None
        except OSError as exc:
            raise ToolchainError(f"{what} could not start '{cmd[0]}': {exc}") from None
        if proc.returncode in (HARNESS_EXIT_GUARD, HARNESS_EXIT_UNWRITTEN):
            raise guard_violation(proc.stderr, what)
        if is_illegal_instruction(proc.returncode, proc.stderr):   # never only the emulator's own text
            raise DeviceError(f"{what} failed: " + illegal_instruction_message(spec.march, self.cpu_text))
        if proc.returncode != 0:
            raise DeviceError(f"{what} failed (exit {proc.returncode}): {_first_error_line(proc.stderr)}")
        if spec.protocol == "times-file":
            if not times.is_file():
                raise DeviceError(f"harness did not write its TIMES file on {self.where}")
            ctx.report = report_from_times(times.read_text(), self.where, spec.label or Path(spec.harness).name)
        else:
            ctx.report = parse_report(proc.stdout, self.where)
        ctx.extra["telemetry"] = {"throttled": None}
        return ctx.report

    def fetch(self, ctx: RunContext) -> np.ndarray:
        out = Path(ctx.remote_dir) / "out.bin"
        if not out.is_file():
            raise DeviceError(f"harness did not write its output file on {self.where}")
        return load_output(out.read_bytes(), ctx.spec, self.where)


_QEMU_MODELS: dict[str, tuple[str, ...]] = {}


def qemu_cpu_models(qemu: str = "qemu-aarch64") -> tuple[str, ...]:
    """CPU models this qemu-aarch64 accepts for -cpu (e.g. qemu 7.2 has cortex-a53/a72/a76, no a55)."""
    if qemu not in _QEMU_MODELS:
        path = qemu_path(qemu)
        try:  # qemu 7.2 prints the list and exits with status 1
            proc = procs.run([path, "-cpu", "help"], timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ToolchainError(f"{qemu} -cpu help failed: {exc}") from None
        lines = (proc.stdout + proc.stderr).replace("Available CPUs:", " ").split()
        _QEMU_MODELS[qemu] = tuple(sorted(set(lines)))
    return _QEMU_MODELS[qemu]


def qemu_path(qemu: str = "qemu-aarch64") -> str:
    path = shutil.which(qemu)
    if path is None:
        raise ToolchainError(f"'{qemu}' not found: install qemu-user (apt-get install -y qemu-user)")
    return path


class QemuRunner(LocalRunner):
    """A static aarch64 harness under `qemu-aarch64 -cpu CPU` (emulated: never a phone timing)."""

    emulated = True

    def __init__(self, cpu: Optional[str] = "max", qemu: str = "qemu-aarch64"):
        self.cpu = cpu or "max"
        self.qemu = qemu
        super().__init__((), f"emulated CPU: qemu-aarch64 -cpu {self.cpu}")

    @property
    def where(self) -> str:  # type: ignore[override]
        return where_qemu(self.cpu)

    def describe(self) -> dict:
        return {"runner": "qemu", "emulator": f"{self.qemu} -cpu {self.cpu}", "virtual": True}

    def _argv_prefix(self) -> list[str]:
        path = qemu_path(self.qemu)
        if self.cpu not in qemu_cpu_models(self.qemu):
            raise ToolchainError(f"qemu-aarch64 has no CPU model '{self.cpu}' "
                                 f"(available: {', '.join(qemu_cpu_models(self.qemu))})")
        return [path, "-cpu", self.cpu]

    def run(self, ctx: RunContext) -> dict:
        report = super().run(ctx)
        ctx.extra.setdefault("notes", []).append(f"ran under qemu-aarch64 -cpu {self.cpu}")
        return report
