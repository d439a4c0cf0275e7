"""The ARM int8 runner: a static aarch64 int8 harness program (templates/cpu/qharness_main.c.j2,
built by xfc.build.cpu.build_arm) run under `qemu-aarch64 -cpu <core's qemu_cpu>`.

The same call interface as xfc.runners.qhost.QHostKernel for verification: kernel(x, w, bias,
mult) runs the entry point that packs the weights inside the call, kernel.run_packed(...) pre-packs
once and runs the packed entry point; each returns the output array. Every run happens in a private
temporary directory (removed afterwards) with a timeout. The harness checks guard zones around
every buffer (exit 5 -> VerificationError) and runs the entry point twice into outputs pre-filled
with different bytes (a difference = elements never written -> VerificationError). An illegal
instruction names the -march and the qemu CPU (DeviceError). Emulated: nothing is timed.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from ..build import procs
from ..errors import DeviceError, ToolchainError, VerificationError
from ..ops.quant import channels
from ..sigill import illegal_instruction_message, is_illegal_instruction
from .base import HARNESS_EXIT_GUARD, guard_violation, where_qemu
from .qemu import qemu_cpu_models, qemu_path

RUN_TIMEOUT_S = 300.0


class QQemuKernel:
    """An int8 kernel's static aarch64 harness, run under qemu-aarch64 -cpu `cpu`."""

    emulated = True

    def __init__(self, rendered, binary: Path, cpu: str, timeout_s: float = RUN_TIMEOUT_S):
        self.rendered, self.plan, self.spec = rendered, rendered.plan, rendered.plan.spec
        self.binary, self.cpu, self.timeout_s = Path(binary), cpu or "max", float(timeout_s)
        self.out_dtype = np.uint8 if self.plan.quant.out_type == "uint8" else np.int8
        self.in_dtype = np.uint8 if self.plan.quant.act_type == "uint8" else np.int8

    @property
    def where(self) -> str:
        return where_qemu(self.cpu)

    def _inputs(self, x, w, bias, mult) -> list[bytes]:
        shapes, fn = self.spec.operand_shapes, self.rendered.function_name
        x, w = np.asarray(x), np.asarray(w)
        if x.shape != tuple(shapes[0]) or x.dtype != self.in_dtype:
            raise VerificationError(f"{fn}: x is {x.dtype}{x.shape}, expected {np.dtype(self.in_dtype)}{tuple(shapes[0])}")
        if w.shape != tuple(shapes[1]) or w.dtype != np.int8:
            raise VerificationError(f"{fn}: w is {w.dtype}{w.shape}, expected int8{tuple(shapes[1])}")
        n = channels(self.spec)
        bias = np.zeros(n, np.int32) if bias is None else np.asarray(bias, "<i4").reshape(-1)
        mult = np.asarray(mult, "<f4").reshape(-1)
        if bias.size != n or mult.size != n:
            raise VerificationError(f"{fn}: bias and mult need {n} values each, got {bias.size} and {mult.size}")
        return [np.ascontiguousarray(a).tobytes() for a in (x, w, bias, mult)]

    def _run(self, x, w, bias, mult, entry: str) -> np.ndarray:
        data = self._inputs(x, w, bias, mult)
        fn = self.rendered.function_name
        qemu = qemu_path()
        if self.cpu not in qemu_cpu_models():
            raise ToolchainError(f"qemu-aarch64 has no CPU model '{self.cpu}' "
                                 f"(available: {', '.join(qemu_cpu_models())})")
        what = f"int8 harness {fn} ({entry}) under qemu-aarch64 -cpu {self.cpu}"
        work = Path(tempfile.mkdtemp(prefix="xfc-q8run-"))
        try:
            paths = []
            for name, blob in zip(("x", "w", "bias", "mult"), data):
                path = work / f"{name}.bin"
                path.write_bytes(blob)
                paths.append(str(path))
            out = work / "out.bin"
            cmd = [qemu, "-cpu", self.cpu, str(self.binary), *paths, str(out), entry]
            try:
                proc = procs.run(cmd, cwd=work, timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                raise DeviceError(f"{what} timed out after {self.timeout_s:g} s; it was killed") from None
            except OSError as exc:
                raise ToolchainError(f"{what} could not start: {exc}") from None
            if proc.returncode == HARNESS_EXIT_GUARD:
                raise guard_violation(proc.stderr, what)
            if is_illegal_instruction(proc.returncode, proc.stderr):
                raise DeviceError(f"{what} failed: " + illegal_instruction_message(
                    self.plan.gcc_march, f"emulated CPU: qemu-aarch64 -cpu {self.cpu}"))
            if proc.returncode != 0:
                line = next((ln.strip() for ln in proc.stderr.splitlines() if ln.strip()), "")
                raise DeviceError(f"{what} failed (exit {proc.returncode}): {line[:300]}")
            blob = out.read_bytes() if out.is_file() else b""
        finally:
            shutil.rmtree(work, ignore_errors=True)
        size = int(np.prod(self.spec.output_shape))
        if len(blob) != 2 * size:
            raise DeviceError(f"{what} wrote {len(blob)} output bytes, expected {2 * size}")
        first = np.frombuffer(blob[:size], self.out_dtype)
        second = np.frombuffer(blob[size:], self.out_dtype)
        if not np.array_equal(first, second):
            raise VerificationError(f"{fn}: {int(np.count_nonzero(first != second))} output elements were never "
                                    f"written (they keep the pre-fill byte)")
        return first.reshape(self.spec.output_shape).copy()

    def __call__(self, x, w, bias, mult) -> np.ndarray:
        """Weights packed inside the call."""
        return self._run(x, w, bias, mult, "call")

    def run_packed(self, x, w, bias, mult) -> np.ndarray:
        """Weights pre-packed once, then the packed entry point."""
        return self._run(x, w, bias, mult, "packed")
