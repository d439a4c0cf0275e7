"""A whole network built for this machine (`xfc.compile_model`): the network runtime's shared library
loaded with ctypes, one C call per inference.

The library describes itself through its C API (xfc/model/runtime: <p>_input_count, _input_name,
_input_shape, ...), so this module needs nothing but the library, its C prefix and the weights.
A call passes the input arrays' own memory to C (contiguous float32 arrays as they are; anything
else is converted once) and C writes the outputs straight into fresh numpy arrays: no other copy.
"""
from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Mapping, Union

import numpy as np

from ..errors import DeviceError, OperatorError


class HostNetwork:
    """`net(x)` / `net(x1, x2)` / `net({"name": x})` -> the output array (or a tuple of them, in the
    graph's output order). `threads`: the count the network was created with. Calls from several
    Python threads are safe and take turns (one arena); for parallel inferences, compile one each."""

    def __init__(self, library: Path, prefix: str, weights: bytes, threads: int = 0, model: str = ""):
        self.library = Path(library)
        self.prefix = prefix
        self.model = model
        self._lib = ctypes.CDLL(str(self.library))

        def fn(name, restype, *argtypes):
            f = self._lib[f"{prefix}_{name}"]
            f.restype, f.argtypes = restype, list(argtypes)
            return f
        vp, ci = ctypes.c_void_p, ctypes.c_int
        self._create = fn("create_from_buffer", vp, ctypes.c_char_p, ctypes.c_size_t, ci)
        self._run = fn("run", ci, vp, vp, vp)
        self._destroy = fn("destroy", None, vp)
        self._error = fn("last_error", ctypes.c_char_p, vp)
        threads_of = fn("threads", ci, vp)
        counts = {kind: fn(f"{kind}_count", ci)() for kind in ("input", "output")}
        self.inputs, self.outputs = [], []
        for kind, into in (("input", self.inputs), ("output", self.outputs)):
            name_of = fn(f"{kind}_name", ctypes.c_char_p, ci)
            rank_of = fn(f"{kind}_rank", ci, ci)
            shape_of = fn(f"{kind}_shape", ctypes.POINTER(ctypes.c_long), ci)
            for i in range(counts[kind]):
                shape = shape_of(i)
                into.append((name_of(i).decode(), tuple(int(shape[d]) for d in range(rank_of(i)))))
        self._handle = self._create(weights, len(weights), int(threads))
        if not self._handle:
            raise DeviceError(f"{self.library.name}: {self._error(None).decode(errors='replace')}")
        self.threads = int(threads_of(self._handle))
        self._in_ptrs = (ctypes.c_void_p * max(1, len(self.inputs)))()
        self._out_ptrs = (ctypes.c_void_p * max(1, len(self.outputs)))()
        # one C network has one arena: calls from several Python threads take turns
        self._lock = threading.Lock()

    def _arrays(self, args, kwargs) -> list[np.ndarray]:
        if len(args) == 1 and isinstance(args[0], Mapping) and not kwargs:
            kwargs, args = dict(args[0]), ()
        if kwargs:
            missing = [n for n, _ in self.inputs if n not in kwargs]
            if args or missing or len(kwargs) != len(self.inputs):
                raise OperatorError(f"{self.model or self.prefix}: pass the inputs by name "
                                    f"({', '.join(n for n, _ in self.inputs)}); missing {', '.join(missing) or 'none'}")
            args = tuple(kwargs[n] for n, _ in self.inputs)
        if len(args) != len(self.inputs):
            raise OperatorError(f"{self.model or self.prefix}: {len(self.inputs)} input(s) "
                                f"({', '.join(n for n, _ in self.inputs)}), got {len(args)}")
        arrays = []
        for value, (name, shape) in zip(args, self.inputs):
            a = np.ascontiguousarray(value, dtype=np.float32)   # no copy when it already is
            if a.shape != shape:
                raise OperatorError(f"{self.model or self.prefix}: input '{name}' has shape {a.shape}, expected {shape}")
            arrays.append(a)
        return arrays

    def __call__(self, *args: np.ndarray, **kwargs: np.ndarray) -> Union[np.ndarray, tuple[np.ndarray, ...]]:
        if not self._handle:
            raise OperatorError(f"{self.model or self.prefix}: the network was closed")
        arrays = self._arrays(args, kwargs)
        outs = [np.empty(shape, np.float32) for _, shape in self.outputs]
        with self._lock:
            for i, a in enumerate(arrays):
                self._in_ptrs[i] = a.ctypes.data
            for j, o in enumerate(outs):
                self._out_ptrs[j] = o.ctypes.data
            if self._run(self._handle, self._in_ptrs, self._out_ptrs) != 0:
                raise DeviceError(self._error(self._handle).decode(errors="replace"))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def close(self) -> None:
        if getattr(self, "_handle", None):
            self._destroy(self._handle)
            self._handle = None

    def __del__(self):
        self.close()

    def __enter__(self) -> "HostNetwork":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        ins = ", ".join(f"{n}: {'x'.join(map(str, s))}" for n, s in self.inputs)
        outs = ", ".join(f"{n}: {'x'.join(map(str, s))}" for n, s in self.outputs)
        return f"<xfc network {self.model or self.prefix} ({ins}) -> ({outs}), {self.threads} thread(s)>"
