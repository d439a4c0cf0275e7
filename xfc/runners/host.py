"""The host runner: a kernel built for this machine (a .so from xfc.toolchain.cpu.build_host), loaded
with ctypes and run in this process, whatever its dtype.

HostKernel is the callable kernel of the Python API (xfc.compile) and of xfc.model. Its entry
points are described by the rendered kernel's ABI (xfc.ops.dtypes.KernelAbi: the operands and their
types, the output type, the packed-weights buffer): fp32 kernels take (in0, in1[, bias]), int8
kernels (x, w, bias, mult). `kernel(*operands)` packs the weights inside the call, `prepack(weights)`
/ `run_packed(...)` use weights packed once (the packed buffer in the weights' place), and `time`
times either in C with the library's bench entry points. HostRunner puts it behind the one runner
interface (xfc.runners.base.Runner): a RunSpec naming the library -> a Measurement.

Calls pass numpy buffers straight to C: an operand that already is a contiguous array of its C
type and shape is passed as it is (a float one of another layout or type is converted once), and
the output is a fresh np.empty array the kernel writes. Guard zones and never-written outputs
(xfc.runners.guards: float outputs start as NaN, integer outputs run twice into two pre-fill bytes so
an element never written shows, VerificationError naming the buffer) are verification machinery:
time() always runs on guarded copies, and a kernel with guarded=True (the tests, `xfc model
--verify`'s layers) guards every call too; call_guarded / run_packed_guarded guard one call.
"""
from __future__ import annotations

import ctypes
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..errors import DeviceError, OperatorError, ToolchainError, VerificationError
from .guards import GuardedBuffer
from .base import Measurement, Runner, RunSpec

WHERE_HOST = "host"
WHERE_HOST_PREPACKED = "host (weights pre-packed)"
WHERE_HOST_COLD = "host (weights pre-packed, evicted from the caches before each call)"
# Integer outputs have no "never written" value: each entry point also runs into a buffer
# pre-filled with the second byte, and the two outputs must agree.
PREFILLS = (0x5A, 0xC3)


class HostKernel:
    """A kernel compiled for this machine and loaded with ctypes. `rendered` is the rendered kernel
    it was built from (its function names, plan.spec and abi are read; runners do not import the
    CPU target)."""

    def __init__(self, rendered, library: Path, guarded: bool = False):
        self.rendered = rendered
        self.guarded = guarded
        self.plan = rendered.plan
        self.spec = rendered.plan.spec
        self.abi = rendered.abi
        self.library = Path(library)
        self._lib = ctypes.CDLL(str(self.library))
        fn, operands = rendered.function_name, len(self.abi.operand_names)
        vp, ci, dp = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_double)

        def bind(name, args, result=ctypes.c_int):
            f = getattr(self._lib, name)
            f.argtypes, f.restype = args, result
            return f

        self._fn = bind(fn, [vp] * (operands + 1))
        self._fn_packed = bind(f"{fn}_packed", [vp] * (operands + 1))
        self._prepack = bind(f"{fn}_prepack", [vp, vp])
        self._packed_size = bind(f"{fn}{self.abi.packed_size_suffix}", [], ctypes.c_long)
        self._bench = bind(rendered.bench_name, [vp] * (operands + 1) + [ci, ci, dp])
        self._bench_packed = bind(f"{rendered.bench_name}_packed", [vp] * (operands + 1) + [ci, ci, dp])
        self._bench_cold = None   # _bind_cold

    # ---- operands ---------------------------------------------------------------------------

    def _operand(self, index: int, value) -> np.ndarray:
        """Operand `index` as a contiguous array of its C type and shape. An optional operand left out
        (the bias of a spec without one) is zeros the kernel never reads; giving one the kernel would
        ignore, leaving out one it needs, or a wrong shape or integer type is an OperatorError."""
        abi, name = self.abi, self.abi.operand_names[index]
        shape, ctype = tuple(abi.operand_shapes[index]), np.dtype(abi.operand_types[index])
        if name == "bias" and abi.operand_names[:2] == ("in0", "in1") and (value is None) != (index in abi.optional):
            fn = self.rendered.function_name
            if value is None:
                raise OperatorError(f"{fn}: the kernel adds a bias (spec built with bias=True): pass bias, "
                                    f"shape {shape}")
            raise OperatorError(f"{fn}: the kernel has no bias (spec built without bias=True), so a bias "
                                f"would be ignored: call it with two inputs, or build the spec with bias=True")
        if value is None:
            if index not in abi.optional:
                raise OperatorError(f"{self.rendered.function_name}: operand '{name}' is missing")
            return np.zeros(shape, ctype)
        array = np.asarray(value)
        if ctype.kind == "f":
            array = np.ascontiguousarray(array, ctype)
        elif array.dtype != ctype:   # integers are never converted: a value that does not fit would change
            raise OperatorError(f"{self.rendered.function_name}: {name} is {array.dtype}{array.shape}, "
                                    f"expected {ctype}{shape}")
        if array.shape != shape:
            # The caller's array, not the kernel's result: bad input (exit 2), never a verification failure.
            raise OperatorError(f"{self.rendered.function_name}: {name} has shape {array.shape}, expected {shape}")
        return np.ascontiguousarray(array)

    def _operands(self, values: Sequence) -> list[GuardedBuffer]:
        names = self.abi.operand_names
        if len(values) > len(names):
            raise OperatorError(f"{self.rendered.function_name}: takes at most {len(names)} operands "
                                f"({', '.join(names)}), got {len(values)}")
        values = list(values) + [None] * (len(names) - len(values))   # a missing one is named by _operand
        return [GuardedBuffer.copy_of(self._operand(i, v), names[i]) for i, v in enumerate(values)]

    def _output(self, prefill: int = PREFILLS[0]) -> GuardedBuffer:
        return GuardedBuffer(int(np.prod(self.spec.output_shape)), "out", dtype=self.abi.output_type,
                             prefill=prefill)

    def _check(self, *buffers: GuardedBuffer) -> None:
        for buf in buffers:
            buf.check(self.rendered.function_name)

    @staticmethod
    def _ptr(buf) -> ctypes.c_void_p:
        data = buf.data if isinstance(buf, GuardedBuffer) else buf
        return ctypes.c_void_p(data.ctypes.data)

    def _call(self, entry, buffers: list[GuardedBuffer]) -> np.ndarray:
        """Run one entry point into a never-written output (integer outputs: twice, two pre-fills)."""
        outputs = []
        for prefill in (PREFILLS if self.abi.never_written == "two-prefills" else PREFILLS[:1]):
            out = self._output(prefill)
            status = entry(*(self._ptr(b) for b in buffers), self._ptr(out))
            self._check(out, *buffers)
            if status != 0:
                raise ToolchainError(f"{self.rendered.function_name}: kernel could not allocate its scratch memory")
            outputs.append(out.data)
        self._unwritten(outputs)
        return outputs[0].reshape(self.spec.output_shape).copy()

    def _unwritten(self, outputs: list[np.ndarray]) -> None:
        if len(outputs) == 2 and not np.array_equal(outputs[0], outputs[1]):
            count = int(np.count_nonzero(outputs[0] != outputs[1]))
            raise VerificationError(f"{self.rendered.function_name}: {count} output elements were never written "
                                    f"(they keep the pre-fill byte)")

    def _bind_cold(self):
        """The harness's cold-weights timing loop (fp32 / fp16 harnesses; the int8 one has none),
        bound on first use."""
        if self._bench_cold is not None:
            return self._bench_cold
        name = f"{self.rendered.bench_name}_packed_cold"
        if not hasattr(self._lib, name):
            raise OperatorError(f"{self.rendered.function_name}: its harness has no cold-weights timing")
        f = getattr(self._lib, name)
        vp, ci, dp = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_double)
        f.argtypes = [vp] * (len(self.abi.operand_names) + 1) + [ci, ci, dp, ctypes.c_long]
        f.restype = ctypes.c_int
        self._bench_cold = f
        return f

    def _packed_buffer(self, weights: GuardedBuffer) -> GuardedBuffer:
        packed = GuardedBuffer(int(self._packed_size()), "packed weights", dtype=self.abi.packed_type,
                               prefill=PREFILLS[0])
        status = self._prepack(self._ptr(weights), self._ptr(packed))
        self._check(packed, weights)
        if status != 0:
            raise ToolchainError(f"{self.rendered.function_name}: pre-packing the weights failed")
        return packed

    def _packed_operand(self, operands: Sequence) -> tuple[int, list, np.ndarray]:
        """(weights index, the operands as a list, the packed weights from prepack(), checked for size)."""
        w = self.abi.weights_index
        values = list(operands)
        if len(values) <= w:
            raise OperatorError(f"{self.rendered.function_name}: run_packed takes the packed weights as operand {w + 1}")
        packed = np.ascontiguousarray(values[w], self.abi.packed_type).reshape(-1)
        if packed.size != int(self._packed_size()):
            raise OperatorError(f"{self.rendered.function_name}: packed weights have {packed.size} elements, "
                                    f"expected {int(self._packed_size())} (from prepack of this kernel)")
        return w, values, packed

    def _with_packed(self, values: Sequence) -> list[GuardedBuffer]:
        """The operands with the caller's packed buffer in the weights' place (checked for size)."""
        w, values, packed = self._packed_operand(values)
        values[w] = np.zeros(self.abi.operand_shapes[w], self.abi.operand_types[w])   # checked, then replaced
        buffers = self._operands(values)
        buffers[w] = GuardedBuffer.copy_of(packed, "packed weights")
        return buffers

    # ---- the direct path: the caller's arrays, one C call ----------------------------------

    def _direct_operands(self, values: Sequence, skip: Optional[int] = None) -> list:
        """The operands as contiguous arrays of their C types (operand `skip` left as None)."""
        names = self.abi.operand_names
        if len(values) > len(names):
            raise OperatorError(f"{self.rendered.function_name}: takes at most {len(names)} operands "
                                f"({', '.join(names)}), got {len(values)}")
        values = list(values) + [None] * (len(names) - len(values))
        return [None if i == skip else self._operand(i, v) for i, v in enumerate(values)]

    def _direct(self, entry, arrays: list[np.ndarray]) -> np.ndarray:
        out = np.empty(self.spec.output_shape, self.abi.output_type)
        if entry(*(a.ctypes.data for a in arrays), out.ctypes.data) != 0:
            raise ToolchainError(f"{self.rendered.function_name}: kernel could not allocate its scratch memory")
        return out

    # ---- entry points -----------------------------------------------------------------------

    def __call__(self, *operands) -> np.ndarray:
        """Run once with the weights packed inside the call; the output (spec.output_shape). One C
        call on the operands themselves (guarded=True: as call_guarded)."""
        if self.guarded:
            return self.call_guarded(*operands)
        return self._direct(self._fn, self._direct_operands(operands))

    def call_guarded(self, *operands) -> np.ndarray:
        """__call__ on guarded copies, the output never-written-checked (xfc.guards)."""
        return self._call(self._fn, self._operands(operands))

    def prepack(self, weights) -> np.ndarray:
        """The weights packed once into the layout the kernel's loops read; pass the result to
        run_packed / time(..., prepacked=True) in the weights' place (guarded=True: packed into a
        guarded, pre-filled buffer)."""
        w = self.abi.weights_index
        if self.guarded:
            buffer = GuardedBuffer.copy_of(self._operand(w, weights), self.abi.operand_names[w])
            return self._packed_buffer(buffer).data.copy()
        packed = np.empty(int(self._packed_size()), self.abi.packed_type)
        if self._prepack(self._operand(w, weights).ctypes.data, packed.ctypes.data) != 0:
            raise ToolchainError(f"{self.rendered.function_name}: pre-packing the weights failed")
        return packed

    def run_packed(self, *operands) -> np.ndarray:
        """Run once with weights from prepack() in the weights' place: one C call on the operands
        themselves (guarded=True: as run_packed_guarded)."""
        if self.guarded:
            return self.run_packed_guarded(*operands)
        w, values, packed = self._packed_operand(operands)
        arrays = self._direct_operands(values, skip=w)
        arrays[w] = packed
        return self._direct(self._fn_packed, arrays)

    def run_packed_guarded(self, *operands) -> np.ndarray:
        """run_packed on guarded copies, the output never-written-checked (xfc.guards)."""
        return self._call(self._fn_packed, self._with_packed(operands))

    def time(self, *operands, repeats: int = 20, warmup: int = 3, prepacked: bool = False,
             cold_weights: bool = False) -> Measurement:
        """Median-of-repeats timing in C. prepacked=True packs the weights once (untimed) and times
        the calls that read them, as libraries with constant weights do; cold_weights=True (with
        prepacked) also evicts the packed weights from the caches before every timed call, as a
        network's layer meets them (fp32 and fp16 harnesses). Guards are checked after the timed
        calls; the output is the last call's (integer outputs: checked against a second pre-fill)."""
        if cold_weights and not prepacked:
            raise OperatorError("time(cold_weights=True) times pre-packed weights: pass prepacked=True too")
        buffers = self._operands(operands)
        entry, bench = (self._fn_packed, self._bench_packed) if prepacked else (self._fn, self._bench)
        extra = ()
        if prepacked:
            w = self.abi.weights_index
            buffers[w] = self._packed_buffer(buffers[w])
            if cold_weights:
                bench = self._bind_cold()
                extra = (ctypes.c_long(buffers[w].data.nbytes),)
        out = self._output()
        repeats = max(1, int(repeats))
        samples = (ctypes.c_double * repeats)()
        status = bench(*(self._ptr(b) for b in buffers), self._ptr(out), int(warmup), repeats, samples, *extra)
        self._check(out, *buffers)
        if status:
            raise ToolchainError(f"{self.rendered.function_name}: kernel could not allocate its scratch memory")
        if self.abi.never_written == "two-prefills":
            second = self._output(PREFILLS[1])
            entry(*(self._ptr(b) for b in buffers), self._ptr(second))
            self._check(second, *buffers)
            self._unwritten([out.data, second.data])
        where = WHERE_HOST_COLD if cold_weights else WHERE_HOST_PREPACKED if prepacked else WHERE_HOST
        return Measurement.from_samples(list(samples), where=where,
                                        emulated=False, output=out.data.reshape(self.spec.output_shape).copy(),
                                        flops=self.spec.flops, kernel=self.rendered.function_name,
                                        warmup=int(warmup))


class HostRunner(Runner):
    """Runs a loaded HostKernel: RunSpec.harness names its library, inputs are its operands in order
    (an optional one may be None), `prepacked` times the pre-packed entry point. Nothing is shipped
    or fetched: the library is mapped into this process."""

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
        m = self.kernel.time(*spec.inputs, repeats=spec.repeat, warmup=spec.warmup, prepacked=spec.prepacked)
        output = m.output.reshape(spec.output_shape) if spec.output_shape is not None else m.output
        return replace(m, output=output, device=self.describe(), kernel=spec.label or m.kernel)
