"""Lower an ONNX network to the steps the C runtime runs (program.py).

    load (load.py) -> fold constant and shape arithmetic (fold.py) -> map Conv / Gemm / MatMul to xfc
    layers, grouped convolutions included (mapping.py) -> every other node to a runtime op or an
    alias -> epilogue fusion -> graph outputs in the caller's buffers -> Program

Runtime ops (fp32, NCHW; templates/runtime/ops.c.j2): Relu, Clip, HardSwish, HardSigmoid, Sigmoid,
SiLU (x * Sigmoid(x), x * HardSigmoid(x) recognised as one op), LeakyRelu, broadcasting
Add / Sub / Mul / Div, MaxPool / AveragePool (pads, strides, dilations, ceil_mode), GlobalAveragePool /
GlobalMaxPool, ReduceMean over trailing axes, Concat, Split, Slice, Transpose, Expand, Resize /
Upsample (nearest: index tables computed here with onnx.reference), Pad (constant), Softmax,
BatchNormalization that mapping.py could not fold (a per-channel affine). Reshape, Flatten, Squeeze,
Unsqueeze, Identity and Dropout are aliases (no step); a Split along a leading axis is one alias per
output.

Epilogue fusion (fuse_epilogues), each only when the kernel's output has one reader and is not a
graph output:
  * a residual Add of two same-shaped tensors, one of them a conv2d / matmul kernel's output: the
    kernel adds the other in its epilogue (Epilogue.residual; the planner places the kernel's output
    on the addend's buffer when the addend dies there, else the addend is copied there first; a
    grouped conv's per-group calls each add their slice of it);
  * then an activation (Relu, Clip(0, 6), HardSwish, Sigmoid, SiLU, LeakyRelu) into the kernel's
    epilogue (also after a residual: act(conv + bias + residual)).

Other element types (`dtype`, xfc.ops.dtypes; fp16): every tensor between two steps has the
dtype; the graph's inputs and outputs stay the caller's fp32 buffers, converted by a `cast` step
each (cast_boundaries: the input rounded to the dtype once, the output widened exactly). Kernels
of another dtype fuse only what their templates fuse (bias, relu, relu6: Epilogue.extended is
fp32 only), so residual Adds and the other activations stay runtime ops there.

A node outside this set makes lower_network raise OperatorError (exit 2) with one line naming each
such node and its op type.
"""
from __future__ import annotations

import dataclasses
from math import prod
from typing import Optional

import numpy as np
import onnx

from ...errors import OperatorError
from ...ops.dtypes import FP32, DType
from ..graph import ConvFeed, Layer, MappedNetwork
from ..load import LoadedModel
from ..mapping import map_network
from ..nodes import run_node
from ..onnx_nodes import attr as _attr
from .fold import fold_constants
from .program import KernelStep, OpStep, Program

FLOAT = 1   # onnx.TensorProto.FLOAT
UNARY = ("relu", "clip", "hardswish", "hardsigmoid", "sigmoid", "silu", "leakyrelu")
BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}
ALIAS_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout")
# Epilogue activation of a fusable unary op (op, params) -> (activation, alpha), or None.
RESIDUAL_SPECS = ("conv2d", "matmul")   # kernels that add a residual (GEMM and Winograd templates)
MAX_BROADCAST_DIMS = 4                  # after merging, the binary ops loop over at most this many dims
MAX_MOVE_DIMS = 6                       # transpose / slice / pad loop nests


def _element_type_name(elem: int) -> str:
    """'int64' for ONNX element type 7 (the number alone tells a user nothing)."""
    try:
        return onnx.TensorProto.DataType.Name(elem).lower()
    except ValueError:
        return "unknown"


class _Unsupported(Exception):
    """A node the runtime cannot run (collected, then reported in one line)."""


@dataclasses.dataclass(frozen=True)
class Lowered:
    program: Program
    net: MappedNetwork               # the mapped (folded) network: layers for synthesis and the report
    folded_loaded: LoadedModel
    original: LoadedModel            # as loaded (shapes fixed, nothing folded): what onnxruntime runs


class _Lowering:
    def __init__(self, loaded: LoadedModel, net: MappedNetwork, name: str, folded: tuple[str, ...]):
        self.loaded = loaded
        self.net = net
        self.path = loaded.path
        self.name = name
        self.folded = folded
        self.steps: list = []
        self.aliases: dict[str, tuple[str, int]] = {}
        self.constants: dict[str, np.ndarray] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.notes: list[str] = []
        self.unsupported: list[str] = []
        self.skip: set[int] = set()          # uncovered step indexes consumed by a pattern
        self.uncovered_nodes = [s for s in net.steps if not s.covered]
        self.readers: dict[str, int] = {}
        for step in net.steps:
            for t in self._step_reads(step):
                self.readers[t] = self.readers.get(t, 0) + 1
        self.graph_outputs = set(loaded.outputs)
        self.counter = 0

    # -- helpers ------------------------------------------------------------------------------

    @staticmethod
    def _step_reads(step) -> list[str]:
        if isinstance(step, Layer):
            f = step.feed
            return [f.input_name] if isinstance(f, ConvFeed) else [n for n in (f.a_name, f.b_name) if n]
        return [n for n in step.node.input if n]

    def shape(self, name: str) -> tuple[int, ...]:
        shape = self.loaded.shape(name)
        if shape is None:
            raise _Unsupported(f"the shape of '{name}' is not static (fix the input shapes: --input-shape on the "
                               f"command line, input_shapes= in Python)")
        return tuple(int(d) for d in shape)

    def is_const(self, name: str) -> bool:
        return name in self.loaded.constants

    def const(self, name: str) -> np.ndarray:
        return np.asarray(self.loaded.constants[name])

    def tensor(self, name: str) -> str:
        """A run-time fp32 tensor (an activation): its shape recorded."""
        if self.is_const(name):
            raise _Unsupported(f"its input '{name}' is a constant where the runtime expects an activation")
        elem = self.loaded.types.get(name, FLOAT)
        if elem != FLOAT:
            raise _Unsupported(f"tensor '{name}' is not float32 (ONNX element type {elem}) at run time")
        self.shapes[name] = self.shape(name)
        return name

    def constant_operand(self, name: str) -> str:
        value = self.const(name)
        if value.dtype.kind != "f":
            raise _Unsupported(f"constant '{name}' is not floating point")
        self.constants[name] = value.astype(np.float32)
        return name

    def temp(self, base: str, shape) -> str:
        self.counter += 1
        name = f"{base}#{self.counter}"
        self.shapes[name] = tuple(int(d) for d in shape)
        return name

    def add(self, op: str, node, inputs, outputs, params=None, constants=(), inplace=False, nodes=None):
        for t in outputs:
            if t not in self.shapes:
                self.shapes[t] = self.shape(t)
        step = OpStep(op=op, name=node.name if node is not None else outputs[0], inputs=tuple(inputs),
                      outputs=tuple(outputs), params=dict(params or {}), constants=tuple(constants),
                      inplace=inplace, nodes=tuple(nodes or ([node.name] if node is not None else ())),
                      onnx_nodes=(node,) if node is not None else ())
        self.steps.append(step)
        return step

    def alias(self, out: str, root: str, offset: int = 0):
        self.shapes[out] = self.shape(out)
        self.aliases[out] = (root, int(offset))

    # -- layers ---------------------------------------------------------------------------------

    def layer(self, layer: Layer):
        spec = layer.spec
        if isinstance(layer.feed, ConvFeed):
            x = self.tensor(layer.feed.input_name)
            batch = self.shape(x)[0] if layer.groups > 1 else 1
            step = KernelStep(name=layer.name, layer=layer, spec=spec, input=x, output=layer.output,
                              groups=layer.groups, batch=batch, nodes=layer.nodes, onnx_nodes=layer.onnx_nodes)
        else:
            f = layer.feed
            a = self._matmul_operand(layer, f.a_name, f.a_transpose, f.a_view, f.a_broadcast,
                                     spec.operand_shapes[0], "A")
            b = None
            if f.b_name is not None:
                b = self._matmul_operand(layer, f.b_name, f.b_transpose, f.b_view, f.b_broadcast,
                                         spec.operand_shapes[1], "B")
            step = KernelStep(name=layer.name, layer=layer, spec=spec, input=a, output=layer.output,
                              weight_tensor=b, nodes=layer.nodes, onnx_nodes=layer.onnx_nodes)
        self.shapes[layer.output] = tuple(layer.out_shape)
        self.steps.append(step)

    def _matmul_operand(self, layer: Layer, name: str, transpose: bool, view, broadcast, kernel_shape, which):
        """The tensor a matmul kernel reads as A or B: the ONNX operand itself (an alias when only
        its shape differs), or a copy that transposes and/or broadcasts it."""
        src = self.tensor(name)
        shape = self.shape(name)
        if transpose:
            perm = list(range(len(shape)))
            perm[-1], perm[-2] = perm[-2], perm[-1]
            out_shape = tuple(shape[p] for p in perm)
            t = self.temp(f"{name}:T", out_shape)
            self._transpose(None, src, t, shape, perm, label=f"{layer.name}: {which} transposed")
            src, shape = t, out_shape
        if prod(broadcast) != prod(view):
            t = self.temp(f"{name}:bcast", broadcast)
            self._expand(None, src, t, tuple(view), tuple(broadcast), label=f"{layer.name}: {which} broadcast")
            src = t
        if tuple(self.shapes[src]) != tuple(kernel_shape):
            view_name = self.temp(f"{src}:view", kernel_shape)
            self.aliases[view_name] = (src, 0)
            src = view_name
        return src

    # -- runtime ops ----------------------------------------------------------------------------

    def unary(self, node, op: str, params=None):
        x = self.tensor(node.input[0])
        self.add(op, node, [x], [node.output[0]], params, inplace=True)

    def clip_bounds(self, node) -> tuple[float, float]:
        big = float(np.finfo(np.float32).max)
        if self.loaded.opset < 11:
            return float(_attr(node, "min", -big)), float(_attr(node, "max", big))
        bounds = []
        for idx, default in ((1, -big), (2, big)):
            name = node.input[idx] if len(node.input) > idx else ""
            if not name:
                bounds.append(default)
            elif self.is_const(name) and self.const(name).size == 1:
                bounds.append(float(self.const(name).reshape(())))
            else:
                raise _Unsupported("its min / max are not constants")
        return max(bounds[0], -big), min(bounds[1], big)

    def binary(self, node, kind: str):
        if len(node.input) != 2:
            raise _Unsupported("expects two inputs")
        out = node.output[0]
        out_shape = self.shape(out)
        operands, consts = [], []
        for name in node.input:
            if self.is_const(name):
                operands.append(self.constant_operand(name))
                consts.append(name)
            else:
                operands.append(self.tensor(name))
        shapes = [self.shape(n) for n in node.input]
        params = _broadcast_params(out_shape, shapes)
        # in place: an operand of the output's size that is not broadcast
        inplace = any(not self.is_const(n) and prod(s) == prod(out_shape) for n, s in zip(node.input, shapes))
        self.add(kind, node, operands, [out], params, constants=consts, inplace=inplace)

    def pool(self, node, kind: str):
        x = self.tensor(node.input[0])
        if len([o for o in node.output if o]) > 1:
            raise _Unsupported("returns indices")
        self.add(kind, node, [x], [node.output[0]], pool_params(node, self.shape(x), self.shape(node.output[0])))

    def global_pool(self, node, kind: str):
        x = self.tensor(node.input[0])
        shape = self.shape(x)
        self.add(kind, node, [x], [node.output[0]], dict(outer=shape[0] * shape[1], inner=prod(shape[2:])))

    def reduce_mean(self, node):
        x = self.tensor(node.input[0])
        shape = self.shape(x)
        axes = _attr(node, "axes")
        if axes is None and len(node.input) > 1 and node.input[1]:
            if not self.is_const(node.input[1]):
                raise _Unsupported("its axes are not constant")
            axes = self.const(node.input[1]).tolist()
        if axes is None:
            axes = list(range(len(shape)))
        axes = sorted(a % len(shape) for a in axes)
        if axes != list(range(len(shape) - len(axes), len(shape))):
            raise _Unsupported(f"axes {axes}: the runtime reduces trailing axes only")
        inner = prod(shape[len(shape) - len(axes):])
        self.add("global_avgpool", node, [x], [node.output[0]], dict(outer=prod(shape) // max(inner, 1), inner=inner))

    def concat(self, node):
        out = node.output[0]
        out_shape = self.shape(out)
        axis = int(_attr(node, "axis")) % len(out_shape)
        inputs = [self.tensor(n) for n in node.input]
        outer = prod(out_shape[:axis])
        chunks = [prod(self.shape(n)[axis:]) for n in inputs]
        inner = prod(out_shape[axis + 1:])         # positions per item along the axis (a channel plane)
        self.add("concat", node, inputs, [out], dict(outer=outer, chunks=chunks, inner=inner))

    def split(self, node):
        x = self.tensor(node.input[0])
        shape = self.shape(x)
        axis = int(_attr(node, "axis", 0)) % len(shape)
        outs = [o for o in node.output if o]
        sizes = [self.shape(o)[axis] for o in outs]
        if sum(sizes) != shape[axis] or len(outs) != len(node.output):
            raise _Unsupported(f"output sizes {sizes} do not add up to {shape[axis]}")
        outer, inner = prod(shape[:axis]), prod(shape[axis + 1:])
        if outer == 1:   # each output is a contiguous piece of the input: aliases
            offset = 0
            for o, size in zip(outs, sizes):
                self.alias(o, x, offset)
                offset += size * inner
            return
        self.add("split", node, [x], outs, dict(outer=outer, chunks=[s * inner for s in sizes]))

    def slice(self, node):
        x = self.tensor(node.input[0])
        shape = self.shape(x)
        out_shape = self.shape(node.output[0])
        if self.loaded.opset < 10:
            starts, ends = _attr(node, "starts"), _attr(node, "ends")
            axes = _attr(node, "axes", list(range(len(starts))))
            steps = [1] * len(starts)
        else:
            vals = []
            for idx in range(1, 5):
                name = node.input[idx] if len(node.input) > idx else ""
                if name and not self.is_const(name):
                    raise _Unsupported("its starts / ends / axes / steps are not constant")
                vals.append(self.const(name).astype(np.int64).tolist() if name else None)
            starts, ends, axes, steps = vals
            axes = axes if axes is not None else list(range(len(starts)))
            steps = steps if steps is not None else [1] * len(starts)
        begin = [0] * len(shape)
        step = [1] * len(shape)
        for s, e, a, st in zip(starts, ends, axes, steps):
            a = a % len(shape)
            dim = shape[a]
            if st > 0:
                s = min(max(s + dim if s < 0 else s, 0), dim)
            else:
                s = min(max(s + dim if s < 0 else s, 0), dim - 1)
            begin[a], step[a] = int(s), int(st)
        self._strided_copy(node, x, node.output[0], shape, out_shape, begin, step)

    def _strided_copy(self, node, x, out, shape, out_shape, begin, step):
        """out[i] = x[begin + i * step] per axis (Slice): an alias when the result is a contiguous run."""
        strides = _strides(shape)
        offset = sum(b * s for b, s in zip(begin, strides))
        contiguous = all(st == 1 for st in step) and _is_contiguous_piece(shape, out_shape, begin)
        if contiguous:
            self.alias(out, x, offset)
            return
        dims, in_strides = _merge_dims(list(out_shape), [s * st for s, st in zip(strides, step)])
        if len(dims) > MAX_MOVE_DIMS:
            raise _Unsupported(f"a {len(dims)}-D strided copy (the runtime moves up to {MAX_MOVE_DIMS} dims)")
        self.add("strided_copy", node, [x], [out], dict(offset=offset, **_padded(dims, in_strides, MAX_MOVE_DIMS)))

    def transpose(self, node):
        x = self.tensor(node.input[0])
        shape = self.shape(x)
        perm = _attr(node, "perm") or list(reversed(range(len(shape))))
        self._transpose(node, x, node.output[0], shape, list(perm))

    def _transpose(self, node, x, out, shape, perm, label=None):
        strides = _strides(shape)
        out_shape = [shape[p] for p in perm]
        dims, in_strides = _merge_dims(out_shape, [strides[p] for p in perm])
        if len(dims) == 1 and in_strides[0] == 1:   # the permutation moves only size-1 axes
            self.shapes[out] = tuple(out_shape)
            self.aliases[out] = (x, 0)
            return
        if len(dims) > MAX_MOVE_DIMS:
            raise _Unsupported(f"a {len(dims)}-D transpose (the runtime moves up to {MAX_MOVE_DIMS} dims)")
        self.shapes[out] = tuple(out_shape)
        params = dict(offset=0, **_padded(dims, in_strides, MAX_MOVE_DIMS))
        if node is None:
            self.steps.append(OpStep(op="strided_copy", name=label or out, inputs=(x,), outputs=(out,),
                                     params=params, nodes=()))
        else:
            self.add("strided_copy", node, [x], [out], params)

    def _expand(self, node, x, out, in_shape, out_shape, label=None):
        self.shapes[out] = tuple(out_shape)
        params = _broadcast_params(tuple(out_shape), [tuple(in_shape), (1,)])
        if node is None:
            self.steps.append(OpStep(op="expand", name=label or out, inputs=(x,), outputs=(out,), params=params))
        else:
            self.add("expand", node, [x], [out], params)

    def expand(self, node):
        x = self.tensor(node.input[0])
        self._expand(node, x, node.output[0], self.shape(x), self.shape(node.output[0]))

    def resize(self, node):
        x = self.tensor(node.input[0])
        shape, out_shape = self.shape(x), self.shape(node.output[0])
        mode = _attr(node, "mode", b"nearest")
        mode = mode.decode() if isinstance(mode, bytes) else str(mode)
        if mode != "nearest":
            raise _Unsupported(f"mode '{mode}' (the runtime resizes with mode 'nearest')")
        if len(shape) != 4 or shape[:2] != out_shape[:2]:
            raise _Unsupported("resizes more than the two spatial axes of an NCHW tensor")
        for name in node.input[1:]:
            if name and not self.is_const(name):
                raise _Unsupported(f"its input '{name}' (scales / sizes / roi) is not constant")
        rows = _nearest_table(node, self.loaded, shape, out_shape, axis=2)
        cols = _nearest_table(node, self.loaded, shape, out_shape, axis=3)
        self.add("resize_nearest", node, [x], [node.output[0]],
                 dict(planes=shape[0] * shape[1], h=shape[2], w=shape[3], oh=out_shape[2], ow=out_shape[3],
                      rows=rows, cols=cols))

    def pad(self, node):
        x = self.tensor(node.input[0])
        shape, out_shape = self.shape(x), self.shape(node.output[0])
        mode = _attr(node, "mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else str(mode)
        if mode != "constant":
            raise _Unsupported(f"mode '{mode}' (the runtime pads with a constant)")
        if self.loaded.opset < 11:
            pads, value = list(_attr(node, "pads")), float(_attr(node, "value", 0.0))
            axes = list(range(len(shape)))
        else:
            for name in node.input[1:]:
                if name and not self.is_const(name):
                    raise _Unsupported(f"its input '{name}' (pads / value / axes) is not constant")
            pads = self.const(node.input[1]).astype(np.int64).tolist()
            value = float(self.const(node.input[2]).reshape(())) if len(node.input) > 2 and node.input[2] else 0.0
            axes = (self.const(node.input[3]).astype(np.int64).tolist() if len(node.input) > 3 and node.input[3]
                    else list(range(len(shape))))
        begin = [0] * len(shape)
        half = len(pads) // 2
        for i, a in enumerate(axes):
            begin[a % len(shape)] = pads[i]
            if pads[i] < 0 or pads[i + half] < 0:
                raise _Unsupported("negative pads (cropping)")
        out_strides = _strides(out_shape)
        offset = sum(b * s for b, s in zip(begin, out_strides))
        dims, dst_strides = _merge_dims(list(shape), out_strides)
        if len(dims) > MAX_MOVE_DIMS:
            raise _Unsupported(f"a {len(dims)}-D pad (the runtime moves up to {MAX_MOVE_DIMS} dims)")
        self.add("pad", node, [x], [node.output[0]],
                 dict(value=value, out_floats=prod(out_shape), offset=offset, **_padded(dims, dst_strides, MAX_MOVE_DIMS)))

    def softmax(self, node):
        x = self.tensor(node.input[0])
        shape = self.shape(x)
        axis = int(_attr(node, "axis", 1 if self.loaded.opset < 13 else -1)) % len(shape)
        if self.loaded.opset < 13:   # the input coerced to 2-D at axis
            outer, n, inner = prod(shape[:axis]), prod(shape[axis:]), 1
        else:
            outer, n, inner = prod(shape[:axis]), shape[axis], prod(shape[axis + 1:])
        self.add("softmax", node, [x], [node.output[0]], dict(outer=outer, n=n, inner=inner))

    def batchnorm(self, node, reason: str):
        x = self.tensor(node.input[0])
        shape = self.shape(x)
        if int(_attr(node, "training_mode", 0)) or len([o for o in node.output if o]) > 1:
            raise _Unsupported("training mode")
        params = []
        for name in node.input[1:5]:
            if not self.is_const(name):
                raise _Unsupported(f"its parameter '{name}' is not constant")
            params.append(self.const(name).astype(np.float64).reshape(-1))
        c = shape[1] if len(shape) > 1 else 1
        if any(p.size != c for p in params):
            raise _Unsupported("parameters not per channel")
        scale, shift, mean, var = params
        s = scale / np.sqrt(var + float(_attr(node, "epsilon", 1e-5)))
        t = shift - mean * s
        base = node.name or node.output[0]
        self.constants[f"{base}:scale"] = s.astype(np.float32)
        self.constants[f"{base}:shift"] = t.astype(np.float32)
        self.add("affine", node, [x], [node.output[0]], dict(outer=shape[0], c=c, inner=prod(shape[2:])),
                 constants=(f"{base}:scale", f"{base}:shift"), inplace=True)
        self.notes.append(f"BatchNormalization '{base}' runs as a per-channel affine ({reason})")

    # -- the walk -------------------------------------------------------------------------------

    def _silu_pair(self, index: int, node) -> Optional[tuple[str, str, object]]:
        """Sigmoid(x) (or HardSigmoid(x) with alpha 1/6, beta 1/2) read only by Mul(x, it): the
        pair is SiLU (HardSwish). Returns (op, x, the Mul node)."""
        if node.op_type not in ("Sigmoid", "HardSigmoid") or node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type == "HardSigmoid" and not (np.isclose(float(_attr(node, "alpha", 0.2)), 1 / 6)
                                                  and float(_attr(node, "beta", 0.5)) == 0.5):
            return None
        x, s = node.input[0], node.output[0]
        if self.readers.get(s) != 1 or s in self.graph_outputs:
            return None
        for j in range(index + 1, len(self.uncovered_nodes)):
            other = self.uncovered_nodes[j].node
            if other.op_type == "Mul" and other.domain in ("", "ai.onnx") and sorted(other.input) == sorted([x, s]):
                self.skip.add(j)
                return ("silu" if node.op_type == "Sigmoid" else "hardswish"), x, other
        return None

    def run(self):
        index_of = {id(u): i for i, u in enumerate(self.uncovered_nodes)}
        for name, shape, elem in self.loaded.inputs:
            if elem != FLOAT:
                self.unsupported.append(f"input '{name}' (ONNX element type {elem}, "
                                        f"{_element_type_name(elem)}: the runtime takes float32)")
            self.shapes[name] = tuple(shape)
        for step in self.net.steps:
            if step.covered:
                try:
                    self.layer(step)
                except _Unsupported as exc:
                    self.unsupported.append(f"'{step.name}' ({step.op_type}: {exc})")
                continue
            i = index_of[id(step)]
            if i in self.skip:
                continue
            node = step.node
            try:
                pair = self._silu_pair(i, node)
                if pair is not None:
                    op, x, mul = pair
                    self.tensor(x)
                    self.shapes[mul.output[0]] = self.shape(mul.output[0])
                    self.steps.append(OpStep(op=op, name=node.name, inputs=(x,), outputs=(mul.output[0],),
                                             inplace=True, nodes=(node.name, mul.name), onnx_nodes=(node, mul)))
                    self.notes.append(f"'{node.name}' ({node.op_type}) and '{mul.name}' (Mul) run as one {op}")
                    continue
                self.node(node, step.reason)
            except _Unsupported as exc:
                self.unsupported.append(f"'{step.name}' ({step.op_type}: {exc})")
        inputs = {n for n, _, _ in self.loaded.inputs}
        for name in self.loaded.outputs:
            if name in inputs:   # one name for the caller's input and output buffers: nothing to compute
                self.unsupported.append(f"graph output '{name}' (the graph input itself: the runtime writes an "
                                        f"output into a buffer of its own)")
            if name not in self.shapes:
                if name in self.loaded.constants:
                    self.unsupported.append(f"graph output '{name}' (a constant: nothing to run)")
                continue
        if self.unsupported:
            shown = "; ".join(self.unsupported[:12])
            more = f"; and {len(self.unsupported) - 12} more" if len(self.unsupported) > 12 else ""
            raise OperatorError(f"{self.path}: --emit lib: the network runtime cannot run {len(self.unsupported)} "
                                f"part{'s' if len(self.unsupported) != 1 else ''} of this model: {shown}{more}")

    def node(self, node, reason: str):
        op = node.op_type
        if node.domain not in ("", "ai.onnx"):
            raise _Unsupported(f"custom domain '{node.domain}'")
        if op == "Relu":
            return self.unary(node, "relu")
        if op == "Clip":
            lo, hi = self.clip_bounds(node)
            return self.unary(node, "clip", dict(lo=lo, hi=hi))
        if op == "HardSwish":
            return self.unary(node, "hardswish")
        if op == "HardSigmoid":
            return self.unary(node, "hardsigmoid", dict(alpha=float(_attr(node, "alpha", 0.2)),
                                                        beta=float(_attr(node, "beta", 0.5))))
        if op == "Sigmoid":
            return self.unary(node, "sigmoid")
        if op == "LeakyRelu":
            return self.unary(node, "leakyrelu", dict(alpha=float(_attr(node, "alpha", 0.01))))
        if op in BINARY:
            return self.binary(node, BINARY[op])
        if op in ("MaxPool", "AveragePool"):
            return self.pool(node, "maxpool" if op == "MaxPool" else "avgpool")
        if op in ("GlobalAveragePool", "GlobalMaxPool"):
            return self.global_pool(node, "global_avgpool" if op == "GlobalAveragePool" else "global_maxpool")
        if op == "ReduceMean":
            return self.reduce_mean(node)
        if op in ALIAS_OPS:
            if op == "Dropout" and len([o for o in node.output if o]) > 1:
                raise _Unsupported("returns its mask")
            x = self.tensor(node.input[0])
            if prod(self.shape(node.output[0])) != prod(self.shape(x)):
                raise OperatorError(f"{self.path}: node '{node.name}' ({op}): output shape "
                                    f"{self.shape(node.output[0])} does not hold the {prod(self.shape(x))} "
                                    f"elements of its input {self.shape(x)}")
            return self.alias(node.output[0], x, 0)
        if op == "Concat":
            return self.concat(node)
        if op == "Split":
            return self.split(node)
        if op == "Slice":
            return self.slice(node)
        if op == "Transpose":
            return self.transpose(node)
        if op == "Expand":
            return self.expand(node)
        if op in ("Resize", "Upsample"):
            return self.resize(node)
        if op == "Pad":
            return self.pad(node)
        if op == "Softmax":
            return self.softmax(node)
        if op == "BatchNormalization":
            return self.batchnorm(node, reason)
        if op in ("Conv", "Gemm", "MatMul"):
            raise _Unsupported(reason)
        raise _Unsupported("no runtime op")

    def program(self) -> Program:
        return Program(name=self.name, shapes=dict(self.shapes), inputs=tuple(n for n, _, _ in self.loaded.inputs),
                       outputs=tuple(self.loaded.outputs), steps=tuple(self.steps), aliases=dict(self.aliases),
                       constants=dict(self.constants), folded=self.folded, notes=tuple(self.notes))


# ---------------------------------------------------------------------------------------------
# Shape arithmetic for the ops' parameters
# ---------------------------------------------------------------------------------------------

def _strides(shape) -> list[int]:
    strides, step = [], 1
    for d in reversed(list(shape)):
        strides.append(step)
        step *= int(d)
    return list(reversed(strides))


def _merge_dims(dims: list[int], strides: list[int]) -> tuple[list[int], list[int]]:
    """Drop size-1 dims and merge neighbours that walk memory as one (stride[i] = stride[i+1] * dim[i+1])."""
    pairs = [(d, s) for d, s in zip(dims, strides) if d != 1] or [(1, 1)]
    merged = [list(pairs[0])]
    for d, s in pairs[1:]:
        last = merged[-1]
        if last[1] == s * d:
            last[0], last[1] = last[0] * d, s
        else:
            merged.append([d, s])
    return [d for d, _ in merged], [s for _, s in merged]


def _padded(dims, strides, n) -> dict:
    """dims/strides left-padded with 1 / 0 to n entries (the C loop nests have a fixed depth)."""
    pad = n - len(dims)
    return {"dims": [1] * pad + list(dims), "strides": [0] * pad + list(strides)}


def _broadcast_params(out_shape: tuple[int, ...], shapes: list[tuple[int, ...]]) -> dict:
    """Per-operand element strides over the output's dims (0 where broadcast), merged to at most
    MAX_BROADCAST_DIMS dims."""
    rank = len(out_shape)
    per = []
    for shape in shapes:
        shape = (1,) * (rank - len(shape)) + tuple(shape)
        st = _strides(shape)
        per.append([0 if shape[i] == 1 and out_shape[i] != 1 else st[i] for i in range(rank)])
    dims = list(out_shape) or [1]
    per = [p or [0] for p in per]
    # merge: neighbours i, i+1 merge when every operand's strides chain (or are both 0)
    keep = [i for i in range(len(dims)) if dims[i] != 1] or [len(dims) - 1]
    dims = [dims[i] for i in keep]
    per = [[p[i] for i in keep] for p in per]
    merged_dims, merged = [dims[0]], [[p[0]] for p in per]
    for i in range(1, len(dims)):
        if all(m[-1] == p[i] * dims[i] for m, p in zip(merged, per)):
            merged_dims[-1] *= dims[i]
            for m, p in zip(merged, per):
                m[-1] = p[i]
        else:
            merged_dims.append(dims[i])
            for m, p in zip(merged, per):
                m.append(p[i])
    if len(merged_dims) > MAX_BROADCAST_DIMS:
        raise _Unsupported(f"a broadcast over {len(merged_dims)} dims (the runtime merges to at most "
                           f"{MAX_BROADCAST_DIMS})")
    pad = MAX_BROADCAST_DIMS - len(merged_dims)
    return {"dims": [1] * pad + merged_dims, "a_strides": [0] * pad + merged[0],
            "b_strides": [0] * pad + merged[1] if len(merged) > 1 else [0] * MAX_BROADCAST_DIMS}


def _is_contiguous_piece(shape, out_shape, begin) -> bool:
    """out (a box of shape out_shape at begin) is one contiguous run of x: every axis after the
    first one that is cut is whole, and every axis before it has extent 1."""
    cut = next((i for i, (d, o) in enumerate(zip(shape, out_shape)) if d != o), None)
    if cut is None:
        return True
    return all(o == 1 for o in out_shape[:cut]) and all(d == o for d, o in zip(shape[cut + 1:], out_shape[cut + 1:]))


def pool_params(node, shape, out_shape) -> dict:
    """The runtime's parameters of a 2-D MaxPool / AveragePool node (output shape as inferred: ceil_mode
    is in it); _Unsupported for what the pooling ops do not cover."""
    if len(shape) != 4:
        raise _Unsupported(f"{len(shape) - 2}-D pooling (the runtime pools 2-D)")
    kernel = tuple(_attr(node, "kernel_shape"))
    strides = tuple(_attr(node, "strides", (1, 1)))
    dilations = tuple(_attr(node, "dilations", (1, 1)))
    if int(_attr(node, "storage_order", 0)):
        raise _Unsupported("storage_order=1")
    pads = _pads(node, shape[2:], kernel, strides, dilations)
    n, c, h, w = shape
    oh, ow = out_shape[2:]
    return dict(planes=n * c, h=h, w=w, oh=oh, ow=ow, kh=kernel[0], kw=kernel[1], sh=strides[0], sw=strides[1],
                pt=pads[0], pl=pads[1], pb=pads[2], pr=pads[3], dh=dilations[0], dw=dilations[1],
                include_pad=int(_attr(node, "count_include_pad", 0)))


def _pads(node, spatial, kernel, strides, dilations) -> tuple[int, int, int, int]:
    auto = _attr(node, "auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for size, k, s, d in zip(spatial, kernel, strides, dilations):
            out = -(-size // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
            small, large = total // 2, total - total // 2
            begin.append(small if auto == "SAME_UPPER" else large)
            end.append(large if auto == "SAME_UPPER" else small)
        return begin[0], begin[1], end[0], end[1]
    if auto == "VALID":
        return 0, 0, 0, 0
    pads = tuple(_attr(node, "pads", (0, 0, 0, 0)))
    return pads[0], pads[1], pads[2], pads[3]


def _nearest_table(node, loaded: LoadedModel, shape, out_shape, axis: int) -> list[int]:
    """For each output index along axis, the input index nearest-neighbour Resize reads: the node
    itself (its coordinate transformation and rounding) run by onnx.reference on an index ramp."""
    probe = np.zeros((1, 1, shape[2], shape[3]), np.float32)
    probe += np.arange(shape[axis], dtype=np.float32).reshape((-1, 1) if axis == 2 else (1, -1))
    feeds = {node.input[0]: probe}
    for name in node.input[1:]:
        if name:
            feeds[name] = np.asarray(loaded.constants[name])
    if node.op_type == "Resize" and len(node.input) > 3 and node.input[3]:   # sizes: this probe's batch/channels are 1
        sizes = np.asarray(loaded.constants[node.input[3]]).astype(np.int64).copy()
        sizes[:2] = 1
        feeds[node.input[3]] = sizes
    (out,) = run_node(node, feeds, loaded.opset)[:1]
    out = np.asarray(out)
    line = out[0, 0, :, 0] if axis == 2 else out[0, 0, 0, :]
    if line.shape[0] != out_shape[axis]:
        raise _Unsupported(f"its output along axis {axis} has {line.shape[0]} entries, not {out_shape[axis]}")
    return [int(v) for v in line]


# ---------------------------------------------------------------------------------------------
# Epilogue fusion
# ---------------------------------------------------------------------------------------------

def _activation_of(step: OpStep) -> Optional[tuple[str, float]]:
    """The kernel epilogue activation a unary runtime op is, or None."""
    big = float(np.finfo(np.float32).max)
    if step.op == "relu":
        return "relu", 0.0
    if step.op == "clip":
        lo, hi = step.params["lo"], step.params["hi"]
        if lo == 0.0 and hi == 6.0:
            return "relu6", 0.0
        if lo == 0.0 and hi >= big:
            return "relu", 0.0
        return None
    if step.op in ("hardswish", "sigmoid", "silu"):
        return step.op, 0.0
    if step.op == "leakyrelu":
        return "leakyrelu", float(step.params["alpha"])
    return None


def fuse_epilogues(program: Program) -> Program:
    """Fuse residual Adds and activations into the kernels that produce their inputs (module docstring);
    in a program of another dtype than fp32, only what its kernels fuse (not Epilogue.extended)."""
    fp32_kernels = program.dtype == FP32
    steps = list(program.steps)
    outputs = set(program.outputs)
    notes = list(program.notes)

    def readers(tensor: str) -> list[int]:
        roots = {tensor} | {a for a in program.aliases if program.root(a)[0] == tensor}
        return [i for i, s in enumerate(steps) if s is not None and set(s.inputs) & roots]

    def producer(tensor: str) -> Optional[int]:
        return next((i for i, s in enumerate(steps) if s is not None and tensor in s.outputs), None)

    def fusable_kernel(tensor: str, reader: int) -> Optional[int]:
        """The kernel step writing tensor, when tensor is read only by step `reader` and is not an output."""
        if tensor in outputs or tensor in program.aliases or any(program.root(a)[0] == tensor for a in program.aliases):
            return None
        p = producer(tensor)
        if p is None or not isinstance(steps[p], KernelStep) or readers(tensor) != [reader]:
            return None
        return p

    changed = True
    while changed:
        changed = False
        for i, step in enumerate(steps):
            if not isinstance(step, OpStep):
                continue
            if fp32_kernels and step.op == "add" and not step.constants and len(set(step.inputs)) == 2 \
                    and program.shapes[step.inputs[0]] == program.shapes[step.inputs[1]] \
                    == program.shapes[step.outputs[0]]:
                candidates = [(fusable_kernel(t, i), t, other) for t, other in
                              ((step.inputs[0], step.inputs[1]), (step.inputs[1], step.inputs[0]))]
                candidates = [(p, t, o) for p, t, o in candidates if p is not None]
                candidates = [(p, t, o) for p, t, o in candidates
                              if steps[p].spec.name in RESIDUAL_SPECS and steps[p].residual is None
                              and steps[p].spec.epilogue.activation == "none"
                              and (producer(program.root(o)[0]) is None or producer(program.root(o)[0]) < p)]
                if candidates:
                    p, t, other = max(candidates)   # the later kernel: the addend exists when it runs
                    k = steps[p]
                    epi = dataclasses.replace(k.spec.epilogue, residual=True)
                    steps[p] = dataclasses.replace(k, spec=dataclasses.replace(k.spec, epilogue=epi), residual=other,
                                                   output=step.outputs[0], nodes=(*k.nodes, *step.nodes),
                                                   onnx_nodes=(*k.onnx_nodes, *step.onnx_nodes),
                                                   fused=(*k.fused, "Add"))
                    steps[i] = None
                    notes.append(f"residual Add '{step.name}' fused into '{k.name}' (reads '{other}' in its epilogue)")
                    changed = True
                    continue
            act = _activation_of(step)
            if act is not None:
                p = fusable_kernel(step.inputs[0], i)
                if p is None or steps[p].spec.epilogue.activation != "none":
                    continue
                k = steps[p]
                epi = dataclasses.replace(k.spec.epilogue, activation=act[0], alpha=act[1])
                if epi.extended and not fp32_kernels:
                    continue
                steps[p] = dataclasses.replace(k, spec=dataclasses.replace(k.spec, epilogue=epi),
                                               output=step.outputs[0], nodes=(*k.nodes, *step.nodes),
                                               onnx_nodes=(*k.onnx_nodes, *step.onnx_nodes),
                                               fused=(*k.fused, *[n.op_type for n in step.onnx_nodes]))
                steps[i] = None
                notes.append(f"{'+'.join(n.op_type for n in step.onnx_nodes)} '{step.name}' fused into '{k.name}' "
                             f"as its {act[0]} epilogue")
                changed = True
        steps = [s for s in steps if s is not None]
    return _drop_unused_tensors(dataclasses.replace(program, steps=tuple(steps), notes=tuple(notes)))


def _drop_unused_tensors(program: Program) -> Program:
    """Without the tensors a fusion left behind (a kernel's output before its residual Add, an
    Add's before its ReLU): no step reads or writes them, but the arena planner gave every tensor
    of `shapes` a buffer at step 0, which inflated the arena and its lower bound alike (ShuffleNet
    224: 1.7 MiB became 11.6 MiB once residuals fused into its grouped convs)."""
    used = set(program.inputs) | set(program.outputs)
    for step in program.steps:
        used |= set(step.inputs) | set(step.outputs)
    for t in list(used):   # the buffers views live in
        while t in program.aliases:
            t = program.aliases[t][0]
            used.add(t)
    if used >= set(program.shapes):
        return program
    return dataclasses.replace(program, shapes={t: s for t, s in program.shapes.items() if t in used},
                               aliases={t: a for t, a in program.aliases.items() if t in used})


def route_outputs(program: Program) -> Program:
    """Graph outputs live in the caller's buffers. An output that is an alias of a graph input, or a
    piece of a larger buffer, or that shares its buffer with another output, becomes a copy (named
    `<output>`; the alias is renamed `<output>#view`) placed right after its buffer is complete."""
    aliases = dict(program.aliases)
    shapes = dict(program.shapes)
    steps = list(program.steps)
    notes = list(program.notes)
    claimed: set[str] = set()

    def root(t):
        off = 0
        while t in aliases:
            t, more = aliases[t]
            off += more
        return t, off

    for out in program.outputs:
        r, off = root(out)
        if out not in aliases and out not in program.inputs:
            claimed.add(out)
            continue
        needs_copy = (r in program.inputs or off != 0 or prod(shapes[r]) != prod(shapes[out]) or r in claimed
                      or r in program.outputs)
        if not needs_copy:
            claimed.add(r)
            continue
        view = f"{out}#view"
        if out in aliases:
            aliases[view] = aliases.pop(out)
            for a, (target, o) in list(aliases.items()):
                if target == out:
                    aliases[a] = (view, o)
        shapes[view] = shapes[out]
        steps = [_rename_input(s, out, view) for s in steps]
        where = next((i + 1 for i, s in enumerate(steps) if r in s.outputs), 0)
        steps.insert(where, OpStep(op="copy", name=f"{out} (graph output)", inputs=(view,), outputs=(out,),
                                   params={"floats": prod(shapes[out])}))
        notes.append(f"graph output '{out}' is copied from {'input' if r in program.inputs else 'a part of'} "
                     f"'{r}' into the caller's buffer")
        claimed.add(out)
    return dataclasses.replace(program, aliases=aliases, shapes=shapes, steps=tuple(steps), notes=tuple(notes))


def _rename_input(step, old: str, new: str):
    if old not in step.inputs:
        return step
    if isinstance(step, KernelStep):
        return dataclasses.replace(step, input=new if step.input == old else step.input,
                                   weight_tensor=new if step.weight_tensor == old else step.weight_tensor,
                                   residual=new if step.residual == old else step.residual)
    return dataclasses.replace(step, inputs=tuple(new if t == old else t for t in step.inputs))


def cast_boundaries(program: Program) -> Program:
    """A program of another dtype than fp32 reads and writes the caller's fp32 buffers through `cast`
    steps: each graph input X is rounded into `X@<dtype>` (its readers and aliases follow), each graph
    output Y is computed as `Y@<dtype>` and widened into Y by the last steps. An fp32 program is
    returned as it is."""
    if program.dtype == FP32:
        return program
    tag = program.dtype.name
    limit = float(np.finfo(np.float16).max)
    for step in program.steps:   # a parameter the dtype cannot hold would become inf where it is stored
        value = step.params.get("value") if isinstance(step, OpStep) and step.op == "pad" else None
        if value is not None and np.isfinite(value) and abs(value) > limit:
            raise OperatorError(f"--dtype {tag}: Pad '{step.name}' pads with {value:g}, beyond {tag}'s range "
                                f"(largest {limit:g})")
    shapes, aliases = dict(program.shapes), dict(program.aliases)
    steps, notes = list(program.steps), list(program.notes)
    head, tail = [], []
    for x in program.inputs:
        inner = f"{x}@{tag}"
        if inner in shapes:
            raise OperatorError(f"--dtype {tag}: the model already has a tensor named '{inner}'")
        shapes[inner] = shapes[x]
        steps = [_rename_input(s, x, inner) for s in steps]
        aliases = {a: ((inner, o) if t == x else (t, o)) for a, (t, o) in aliases.items()}
        head.append(OpStep(op="cast", name=f"{x} (graph input)", inputs=(x,), outputs=(inner,),
                           params={"from": FP32.name, "to": tag}))
    for y in program.outputs:
        if y in program.inputs:
            continue          # an input that is also an output: route_outputs copies it
        inner = f"{y}@{tag}"
        if inner in shapes:
            raise OperatorError(f"--dtype {tag}: the model already has a tensor named '{inner}'")
        shapes[inner] = shapes[y]
        steps = [_rename_output(_rename_input(s, y, inner), y, inner) for s in steps]
        aliases = {(inner if a == y else a): ((inner, o) if t == y else (t, o)) for a, (t, o) in aliases.items()}
        tail.append(OpStep(op="cast", name=f"{y} (graph output)", inputs=(inner,), outputs=(y,),
                           params={"from": tag, "to": FP32.name}))
    notes.append(f"{tag} between every two steps: {len(head)} graph input(s) rounded from fp32 and "
                 f"{len(tail)} output(s) widened to fp32 by cast steps")
    return dataclasses.replace(program, shapes=shapes, aliases=aliases, steps=(*head, *steps, *tail),
                               notes=tuple(notes))


def _rename_output(step, old: str, new: str):
    if old not in step.outputs:
        return step
    if isinstance(step, KernelStep):
        return dataclasses.replace(step, output=new)
    return dataclasses.replace(step, outputs=tuple(new if t == old else t for t in step.outputs))


def lower_network(loaded: LoadedModel, name: str, fuse: bool = True, dtype: DType = FP32) -> Lowered:
    """The network as runtime steps (module docstring); OperatorError names every node it cannot run."""
    folded = fold_constants(loaded)
    net = map_network(folded.loaded, grouped=True)
    lowering = _Lowering(folded.loaded, net, name, folded.folded)
    lowering.run()
    program = dataclasses.replace(lowering.program(), dtype=dtype)
    if fuse:
        program = fuse_epilogues(program)
    program = cast_boundaries(program)
    program = route_outputs(program)
    return Lowered(program=program, net=net, folded_loaded=folded.loaded, original=loaded)
