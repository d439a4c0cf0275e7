"""Run a harness locally under qemu-aarch64 (correctness only: timings are emulated)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np

from xfc.build import procs
from xfc.errors import DeviceError, ToolchainError
from xfc.runners.base import (WHERE_QEMU, RunContext, Runner, harness_args, load_output,
                              parse_report, report_from_times)
from xfc.sigill import illegal_instruction_message, is_illegal_instruction


class QemuRunner(Runner):
    where = WHERE_QEMU
    emulated = True

    def __init__(self, cpu: str = "max", qemu: str = "qemu-aarch64"):
        self.cpu = cpu
        self.qemu = qemu

    def _qemu_path(self) -> str:
        path = shutil.which(self.qemu)
        if path is None:
            raise ToolchainError(f"'{self.qemu}' not found: install qemu-user "
                                 "(apt-get install -y qemu-user)")
        return path

    def describe(self) -> dict:
        return {"runner": "qemu", "emulator": f"{self.qemu} -cpu {self.cpu}", "virtual": True}

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
        out = d / "out.bin"
        times = d / "times.txt"
        cmd = [self._qemu_path(), "-cpu", self.cpu, str(d / "harness"),
               *harness_args(spec, [str(p) for p in ctx.input_files], str(out), str(times))]
        try:
            proc = procs.run(cmd, cwd=d, env_extra=dict(spec.env), timeout=spec.timeout_s)
        except subprocess.TimeoutExpired:
            raise DeviceError(f"harness timed out after {spec.timeout_s:g} s under "
                              f"qemu-aarch64 -cpu {self.cpu}; it was killed") from None
        if is_illegal_instruction(proc.returncode, proc.stderr):
            raise DeviceError(f"harness failed under qemu-aarch64 -cpu {self.cpu}: "
                              + illegal_instruction_message(
                                  spec.march, f"emulated CPU: qemu-aarch64 -cpu {self.cpu}"))
        if proc.returncode != 0:
            detail = (proc.stderr.strip().splitlines() or [""])[-1][:300]
            raise DeviceError(f"harness failed under qemu-aarch64 -cpu {self.cpu} "
                              f"(exit {proc.returncode}): {detail}")
        if spec.protocol == "times-file":
            if not times.is_file():
                raise DeviceError(f"harness did not write its TIMES file under {self.where}")
            ctx.report = report_from_times(times.read_text(), self.where,
                                           spec.label or Path(spec.harness).name)
        else:
            ctx.report = parse_report(proc.stdout, self.where)
        ctx.extra["telemetry"] = {"throttled": None}
        ctx.extra.setdefault("notes", []).append(f"ran under qemu-aarch64 -cpu {self.cpu}")
        return ctx.report

    def fetch(self, ctx: RunContext) -> np.ndarray:
        out = Path(ctx.remote_dir) / "out.bin"
        if not out.is_file():
            raise DeviceError(f"harness did not write its output file under {self.where}")
        return load_output(out.read_bytes(), ctx.spec, self.where)
