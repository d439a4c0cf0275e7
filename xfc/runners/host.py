"""The host runner: a kernel built for this machine (a .so from xfc.build.cpu.build_host), loaded
with ctypes and run in this process.

HostKernel is the callable kernel of the Python API (xfc.compile) and of xfc.model: `kernel(in0,
in1, bias)`, `prepack` / `run_packed`, and `time` (timed in C by the library's bench entry
points). HostRunner puts it behind the one runner interface (xfc.runners.base.Runner): a RunSpec
naming the library -> a Measurement. Every entry point runs on guarded copies of its buffers (the
output starts as NaN) and checks the guard zones afterwards (VerificationError naming the buffer).
"""
from __future__ import annotations

import ctypes
from dataclasses import replace
from pathlib import Path
from typing import Optional

import numpy as np

from ..errors import DeviceError, OperatorError, ToolchainError, VerificationError
from ..guards import GuardedBuffer
from ..ops.reference import check_output
from .base import Measurement, Runner, RunSpec

WHERE_HOST = "host"
WHERE_HOST_PREPACKED = "host (weights pre-packed)"


class HostKernel:
    """A kernel compiled for this machine (xfc.build.cpu.build_host) and loaded with ctypes.
    Call it with numpy arrays. `rendered` is the xfc.cpu.codegen.RenderedKernel it was built
    from (its function names and plan.spec are read; runners do not import the CPU target)."""

    def __init__(self, rendered, library: Path):
        self.rendered = rendered
        self.plan = rendered.plan
        self.spec = rendered.plan.spec
        self.library = Path(library)
        self._lib = ctypes.CDLL(str(self.library))
        fp = ctypes.POINTER(ctypes.c_float)
        self._fn = getattr(self._lib, rendered.function_name)
        self._fn.argtypes = [fp, fp, fp, fp]
        self._fn.restype = ctypes.c_int
        self._bench = getattr(self._lib, rendered.bench_name)
        self._bench.argtypes = [fp, fp, fp, fp, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
        self._bench.restype = ctypes.c_int
        self._packed_floats = getattr(self._lib, f"{rendered.function_name}_packed_floats")
        self._packed_floats.argtypes = []
        self._packed_floats.restype = ctypes.c_long
        self._prepack = getattr(self._lib, f"{rendered.function_name}_prepack")
        self._prepack.argtypes = [fp, fp]
        self._prepack.restype = ctypes.c_int
        self._fn_packed = getattr(self._lib, f"{rendered.function_name}_packed")
        self._fn_packed.argtypes = [fp, fp, fp, fp]
        self._fn_packed.restype = ctypes.c_int
        self._bench_packed = getattr(self._lib, f"{rendered.bench_name}_packed")
        self._bench_packed.argtypes = self._bench.argtypes
        self._bench_packed.restype = ctypes.c_int

    _INPUT_NAMES = ("in0", "in1", "bias")

    def _input(self, index: int, arr) -> np.ndarray:
        """Input `index` (0: in0, 1: in1, 2: bias) as contiguous fp32 of its shape. A kernel built
        without a bias takes none (its C entry point gets zeros it never reads); one built with a
        bias needs it: either mistake is an OperatorError, never a silently wrong result."""
        shape = tuple(self.spec.operand_shapes[index])
        if index == 2 and (arr is None) == self.spec.epilogue.bias:
            name = self.rendered.function_name
            if arr is None:
                raise OperatorError(f"{name}: the kernel adds a bias (spec built with bias=True): pass bias, "
                                    f"shape {shape}")
            raise OperatorError(f"{name}: the kernel has no bias (spec built without bias=True), so a bias "
                                f"would be ignored: call it with two inputs, or build the spec with bias=True")
        if arr is None and index == 2:
            return np.zeros(shape, np.float32)
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if arr.shape != shape:
            raise VerificationError(f"{self.rendered.function_name}: {self._INPUT_NAMES[index]} has shape "
                                    f"{arr.shape}, expected {shape}")
        return arr

    def _guarded_input(self, index: int, arr) -> GuardedBuffer:
        return GuardedBuffer.copy_of(self._input(index, arr), self._INPUT_NAMES[index])

    def _output(self) -> GuardedBuffer:
        return GuardedBuffer(int(np.prod(self.spec.output_shape)), "out")

    def _check_guards(self, *buffers: GuardedBuffer) -> None:
        for buf in buffers:
            buf.check(self.rendered.function_name)

    @staticmethod
    def _ptr(a):
        a = a.data if isinstance(a, GuardedBuffer) else a
        return a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))

    def __call__(self, in0: np.ndarray, in1: np.ndarray, bias: Optional[np.ndarray] = None) -> np.ndarray:
        """Run once. Inputs are copied into guarded buffers, the output starts as NaN, and every
        guard is checked afterwards (VerificationError naming the buffer and the side)."""
        a, b, c = (self._guarded_input(i, arr) for i, arr in enumerate((in0, in1, bias)))
        out = self._output()
        status = self._fn(self._ptr(a), self._ptr(b), self._ptr(c), self._ptr(out))
        self._check_guards(out, a, b, c)
        if status != 0:
            raise ToolchainError(f"{self.rendered.function_name}: kernel could not allocate its scratch memory")
        return out.data.reshape(self.spec.output_shape)

    def _prepack_guarded(self, b: GuardedBuffer) -> GuardedBuffer:
        packed = GuardedBuffer(int(self._packed_floats()), "packed weights")
        status = self._prepack(self._ptr(b), self._ptr(packed))
        self._check_guards(packed, b)
        if status != 0:
            raise ToolchainError(f"{self.rendered.function_name}: pre-packing the weights failed")
        return packed

    def prepack(self, in1: np.ndarray) -> np.ndarray:
        """The weights (in1) packed once into the layout the kernel's loops read (see gemm.c.j2);
        pass the result to run_packed / time(..., prepacked=True). The packed buffer starts as NaN
        and has guard zones, checked after packing."""
        return self._prepack_guarded(self._guarded_input(1, in1)).data

    def _check_packed(self, packed: np.ndarray) -> GuardedBuffer:
        packed = np.ascontiguousarray(packed, dtype=np.float32).reshape(-1)
        if packed.size != int(self._packed_floats()):
            raise VerificationError(f"{self.rendered.function_name}: packed weights have {packed.size} floats, "
                                    f"expected {int(self._packed_floats())} (from prepack of this kernel)")
        return GuardedBuffer.copy_of(packed, "packed weights")

    def run_packed(self, in0: np.ndarray, packed: np.ndarray, bias: Optional[np.ndarray] = None) -> np.ndarray:
        """Run with weights from prepack() (guarded like __call__)."""
        a, c = self._guarded_input(0, in0), self._guarded_input(2, bias)
        packed = self._check_packed(packed)
        out = self._output()
        status = self._fn_packed(self._ptr(a), self._ptr(packed), self._ptr(c), self._ptr(out))
        self._check_guards(out, a, packed, c)
        if status != 0:
            raise ToolchainError(f"{self.rendered.function_name}: kernel could not allocate its scratch memory")
        return out.data.reshape(self.spec.output_shape)

    def time(self, in0, in1, bias=None, repeats: int = 20, warmup: int = 3, prepacked: bool = False) -> Measurement:
        """Median-of-repeats timing in C. prepacked=True packs the weights once (untimed) and
        times the calls that read them, as libraries with constant weights do. Guards are
        checked after the timed calls."""
        a, b, c = (self._guarded_input(i, arr) for i, arr in enumerate((in0, in1, bias)))
        out = self._output()
        repeats = max(1, int(repeats))
        samples = (ctypes.c_double * repeats)()
        if prepacked:
            packed = self._prepack_guarded(b)
            status = self._bench_packed(self._ptr(a), self._ptr(packed), self._ptr(c), self._ptr(out),
                                        int(warmup), repeats, samples)
            self._check_guards(packed)
        else:
            status = self._bench(self._ptr(a), self._ptr(b), self._ptr(c), self._ptr(out), int(warmup), repeats,
                                 samples)
        self._check_guards(out, a, b, c)
        if status:
            raise ToolchainError(f"{self.rendered.function_name}: kernel could not allocate its scratch memory")
        return Measurement.from_samples(list(samples), where=WHERE_HOST_PREPACKED if prepacked else WHERE_HOST,
                                        emulated=False, output=out.data.reshape(self.spec.output_shape),
                                        flops=self.spec.flops, kernel=self.rendered.function_name,
                                        warmup=int(warmup))

    def verify(self, in0, in1, bias) -> tuple[np.ndarray, float]:
        """Run once and check against the numpy reference; VerificationError if a guard changed,
        an output is not finite (NaN: never written), an error is outside the K-derived bound or
        the RMS error is outside the statistical limit."""
        out = self(in0, in1, bias)
        verdict = check_output(self.spec, out, in0, in1, bias, winograd_m=self.rendered.plan.winograd_m)
        if not verdict.ok:
            raise VerificationError(f"{self.rendered.function_name}: output differs from the reference "
                                    f"({verdict.reason})")
        return out, verdict.worst_ratio


class HostRunner(Runner):
    """Runs a loaded HostKernel: RunSpec.harness names its library, inputs are arrays (bias may be
    None), `prepacked` times the pre-packed entry point. Nothing is shipped or fetched: the library
    is mapped into this process."""

    where = WHERE_HOST
    emulated = False

    def __init__(self, kernel: HostKernel):
        self.kernel = kernel

    def describe(self) -> dict:
        return {"runner": "host", "library": str(self.kernel.library), "virtual": False}

    def execute(self, spec: RunSpec) -> Measurement:
        if Path(spec.harness).resolve() != self.kernel.library.resolve():
            raise DeviceError(f"the host runner holds {self.kernel.library.name}, not {Path(spec.harness).name}")
        spec.check_input_shapes(self.kernel.rendered.function_name)
        a, b, bias = (None if x is None else np.asarray(x, dtype=np.float32) for x in spec.inputs)
        m = self.kernel.time(a, b, bias, repeats=spec.repeat, warmup=spec.warmup, prepacked=spec.prepacked)
        output = m.output.reshape(spec.output_shape) if spec.output_shape is not None else m.output
        return replace(m, output=output, device=self.describe(), kernel=spec.label or m.kernel)
