"""The int8 host runner: an int8 kernel library (xfc.cpu.qcodegen + xfc.build.cpu.build_host)
loaded with ctypes and run in this process.

Guards: every buffer the kernel sees is the interior of a larger byte allocation whose guard
zones hold a fixed pattern, checked after each call (VerificationError naming the buffer and the
side). int8 outputs have no "never written" value like fp32's NaN, so every output is produced
twice, into buffers pre-filled with two different bytes: an element the kernel does not write
keeps the pre-fill and the two results differ.
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Optional

import numpy as np

from ..errors import ToolchainError, VerificationError
from .base import Measurement

GUARD_BYTE = 0xA5
GUARD_BYTES = 256
PREFILLS = (0x5A, 0xC3)
WHERE = "host"
WHERE_PREPACKED = "host (weights pre-packed)"


class ByteBuffer:
    """n elements of dtype between guard zones of GUARD_BYTE."""

    def __init__(self, array: Optional[np.ndarray], name: str, dtype=None, count: int = 0, prefill: int = 0):
        dtype = np.dtype(dtype if dtype is not None else array.dtype)
        count = int(array.size) if array is not None else int(count)
        self.name, self.nbytes = name, count * dtype.itemsize
        self._raw = np.full(self.nbytes + 2 * GUARD_BYTES + 64, GUARD_BYTE, np.uint8)
        # interior 64-byte aligned
        start = GUARD_BYTES + (-(self._raw.ctypes.data + GUARD_BYTES)) % 64
        self._start = start
        interior = self._raw[start:start + self.nbytes]
        if array is not None:
            interior[:] = np.ascontiguousarray(array, dtype=dtype).reshape(-1).view(np.uint8)
        else:
            interior[:] = prefill
        self.data = interior.view(dtype)

    def ptr(self):
        return ctypes.c_void_p(self._raw.ctypes.data + self._start)

    def check(self, function: str) -> None:
        before = self._raw[:self._start]
        after = self._raw[self._start + self.nbytes:]
        for side, zone in (("before", before), ("after", after)):
            if np.any(zone != GUARD_BYTE):
                raise VerificationError(f"{function}: the guard zone {side} '{self.name}' was overwritten")


class QHostKernel:
    """An int8 kernel built for this machine. Call it with numpy arrays:
    kernel(x, w, bias, mult) -> out (shaped spec.output_shape, the activation type)."""

    def __init__(self, rendered, library: Path):
        self.rendered, self.plan, self.spec = rendered, rendered.plan, rendered.plan.spec
        self.library = Path(library)
        self._lib = ctypes.CDLL(str(self.library))
        fn = rendered.function_name
        vp, ci, dp = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_double)

        def bind(name, args, res=ctypes.c_int):
            f = getattr(self._lib, name)
            f.argtypes, f.restype = args, res
            return f

        self._fn = bind(fn, [vp] * 5)
        self._fn_packed = bind(f"{fn}_packed", [vp] * 5)
        self._prepack = bind(f"{fn}_prepack", [vp, vp])
        self._packed_bytes = bind(f"{fn}_packed_bytes", [], ctypes.c_long)
        self._bench = bind(f"{fn}_bench", [vp] * 5 + [ci, ci, dp])
        self._bench_packed = bind(f"{fn}_bench_packed", [vp] * 5 + [ci, ci, dp])
        self.out_dtype = np.uint8 if self.plan.quant.out_type == "uint8" else np.int8
        self.in_dtype = np.uint8 if self.plan.quant.act_type == "uint8" else np.int8

    def _inputs(self, x, w, bias, mult):
        shapes = self.spec.operand_shapes
        x = np.asarray(x)
        if x.shape != tuple(shapes[0]) or x.dtype != self.in_dtype:
            raise VerificationError(f"{self.rendered.function_name}: x is {x.dtype}{x.shape}, "
                                    f"expected {np.dtype(self.in_dtype)}{tuple(shapes[0])}")
        w = np.asarray(w)
        if w.shape != tuple(shapes[1]) or w.dtype != np.int8:
            raise VerificationError(f"{self.rendered.function_name}: w is {w.dtype}{w.shape}, expected int8{tuple(shapes[1])}")
        bias = np.zeros(shapes[2], np.int32) if bias is None else np.asarray(bias, np.int32)
        mult = np.asarray(mult, np.float32)
        return (ByteBuffer(x, "x"), ByteBuffer(w, "w"), ByteBuffer(bias.reshape(-1), "bias"),
                ByteBuffer(mult.reshape(-1), "mult"))

    def _check(self, *buffers) -> None:
        for b in buffers:
            b.check(self.rendered.function_name)

    def _out(self, prefill: int) -> ByteBuffer:
        return ByteBuffer(None, "out", self.out_dtype, int(np.prod(self.spec.output_shape)), prefill)

    def prepack(self, w) -> ByteBuffer:
        wb = ByteBuffer(np.asarray(w, np.int8), "w")
        packed = ByteBuffer(None, "packed weights", np.uint8, int(self._packed_bytes()), PREFILLS[0])
        if self._prepack(wb.ptr(), packed.ptr()):
            raise ToolchainError(f"{self.rendered.function_name}: pre-packing the weights failed")
        self._check(wb, packed)
        return packed

    def _run_twice(self, call, buffers) -> np.ndarray:
        outs = []
        for prefill in PREFILLS:
            out = self._out(prefill)
            if call(out):
                raise ToolchainError(f"{self.rendered.function_name}: kernel could not allocate its scratch memory")
            self._check(out, *buffers)
            outs.append(out.data.copy())
        if not np.array_equal(outs[0], outs[1]):
            unwritten = int(np.count_nonzero(outs[0] != outs[1]))
            raise VerificationError(f"{self.rendered.function_name}: {unwritten} output elements were never written "
                                    f"(they keep the pre-fill byte)")
        return outs[0].reshape(self.spec.output_shape)

    def __call__(self, x, w, bias, mult) -> np.ndarray:
        """Weights packed inside the call."""
        xb, wb, bb, mb = self._inputs(x, w, bias, mult)
        return self._run_twice(lambda out: self._fn(xb.ptr(), wb.ptr(), bb.ptr(), mb.ptr(), out.ptr()),
                               (xb, wb, bb, mb))

    def run_packed(self, x, w, bias, mult) -> np.ndarray:
        """Weights pre-packed once (prepack), then the packed entry point."""
        xb, wb, bb, mb = self._inputs(x, w, bias, mult)
        packed = self.prepack(w)
        return self._run_twice(lambda out: self._fn_packed(xb.ptr(), packed.ptr(), bb.ptr(), mb.ptr(), out.ptr()),
                               (xb, packed, bb, mb))

    def time(self, x, w, bias, mult, repeats: int = 20, warmup: int = 3, prepacked: bool = True) -> Measurement:
        """Median-of-repeats timing in C (ops counted as spec.flops: 2 x MACs)."""
        xb, wb, bb, mb = self._inputs(x, w, bias, mult)
        out = self._out(PREFILLS[0])
        repeats = max(1, int(repeats))
        samples = (ctypes.c_double * repeats)()
        if prepacked:
            packed = self.prepack(w)
            status = self._bench_packed(xb.ptr(), packed.ptr(), bb.ptr(), mb.ptr(), out.ptr(), int(warmup), repeats,
                                        samples)
            self._check(packed)
        else:
            status = self._bench(xb.ptr(), wb.ptr(), bb.ptr(), mb.ptr(), out.ptr(), int(warmup), repeats, samples)
        self._check(out, xb, wb, bb, mb)
        if status:
            raise ToolchainError(f"{self.rendered.function_name}: kernel could not allocate its scratch memory")
        return Measurement.from_samples(list(samples), where=WHERE_PREPACKED if prepacked else WHERE, emulated=False,
                                        output=out.data.reshape(self.spec.output_shape), flops=self.spec.flops,
                                        kernel=self.rendered.function_name, warmup=int(warmup))
