"""Map ONNX nodes to xfc operators.

  Conv, group 1                       -> conv2d
  Conv, group = channels = filters    -> depthwise   (other valid groups: not covered)
  Gemm (transA/transB, alpha, beta)   -> matmul; alpha folded into a constant B, beta into the bias;
                                         the bias C must broadcast per column ([N], [1, N], scalar)
  MatMul (batch dims, 1-D operands)   -> matmul; A's batch dims fold into M when B has none

then absorbed into the layer, each only when the intermediate tensor has exactly one consumer
and is not a graph output:
  BatchNormalization after a Conv     folded into the weights and bias (float64, then fp32)
  Add of a per-column constant after a MatMul (bias)
  Relu, Clip(0, 6) / Clip(0, inf)     fused epilogue (relu6 / relu)

A malformed model is an OperatorError naming the node: weights (Conv W/B, BatchNormalization
parameters) that are not initializers or Constant outputs, a group count that does not match
the channels and the weight shape.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Optional

import numpy as np

from ..errors import OperatorError
from ..ops.spec import make_spec
from .coverage import node_flops
from .graph import ConvFeed, Layer, MappedNetwork, MatmulFeed, Uncovered
from .load import FLOAT_TYPES, LoadedModel, is_folded_cast
from .onnx_nodes import attr as _attr
from .onnx_nodes import conv_geometry, readers_of

FLOAT32_MAX = float(np.finfo(np.float32).max)
BN_FOLD_UNITS = 6      # roundings a runtime may spend folding BatchNormalization (see bounds.py)
GEMM_SCALE_UNITS = 2   # roundings of alpha*(AB) and beta*C, folded or not


def _is_default_domain(node) -> bool:
    return node.domain in ("", "ai.onnx")


@dataclass
class _Core:
    """What a main node maps to, before absorbing the nodes after it."""

    op: str
    shape: dict
    feed: object
    output: str
    out_shape: tuple
    weight: Optional[np.ndarray]          # float64 in xfc layout, or None (dynamic B)
    bias: Optional[np.ndarray]            # float64 [K] / [N], or None
    stride: tuple = (1, 1)
    pad: tuple = (0, 0, 0, 0)
    dilation: tuple = (1, 1)
    fold_units: int = 0
    bias_magnitude: Optional[np.ndarray] = None
    notes: list = field(default_factory=list)
    groups: int = 1                       # grouped convolution: shape is one group's (batch 1)


class _Mapper:
    def __init__(self, loaded: LoadedModel, grouped: bool = False):
        self.loaded = loaded
        self.grouped = grouped
        self.path = loaded.path
        self.nodes = [n for n in loaded.model.graph.node
                      if not ((n.op_type == "Constant" and _is_default_domain(n))
                              or is_folded_cast(n, loaded.constants))]
        self.names = [n.name or f"{n.op_type}_{i}" for i, n in enumerate(self.nodes)]
        self.consumers = readers_of(self.nodes)
        self.graph_outputs = set(loaded.outputs)
        self.absorbed: set[int] = set()
        self.blocked: dict[int, str] = {}   # node index -> why it was not fused into the layer before it

    # -- helpers ------------------------------------------------------------------------------

    def where(self, i: int) -> str:
        return f"{self.path}: node '{self.names[i]}' ({self.nodes[i].op_type})"

    def const(self, i: int, name: str, what: str) -> np.ndarray:
        if name not in self.loaded.constants:
            raise OperatorError(f"{self.where(i)}: {what} '{name}' is not an initializer (xfc needs constant "
                                f"weights)")
        return np.asarray(self.loaded.constants[name])

    def is_float(self, name: str) -> bool:
        return self.loaded.types.get(name, 1) in FLOAT_TYPES

    def flops(self, i: int) -> Optional[int]:
        return node_flops(self.nodes[i], self.loaded.shape)

    def single_consumer(self, tensor: str) -> tuple[Optional[int], str]:
        """(index of the only node reading tensor, '') or (None, why the tensor cannot be fused away)."""
        readers = self.consumers.get(tensor, [])
        if tensor in self.graph_outputs:
            return None, f"its input '{tensor}' is also a graph output"
        if len(readers) != 1:
            return None, f"its input '{tensor}' is read by {len(readers)} nodes"
        return readers[0], ""

    # -- main nodes -----------------------------------------------------------------------------

    def conv(self, i: int, node):
        x = node.input[0]
        w_name = node.input[1]
        weight = self.const(i, w_name, "weight")
        b_name = node.input[2] if len(node.input) > 2 and node.input[2] else None
        bias = self.const(i, b_name, "bias").astype(np.float64).reshape(-1) if b_name else None
        if weight.ndim != 4:
            return f"{weight.ndim - 2}-D convolution (xfc covers 2-D convolutions)"
        xs = self.loaded.shape(x)
        if xs is None or len(xs) != 4:
            return f"the shape of its input '{x}' was not inferred"
        if not (self.is_float(x) and weight.dtype == np.float32):
            return "not fp32 (xfc kernels are fp32)"
        n, c, h, w = xs
        m, cg, kh, kw = weight.shape
        group = int(_attr(node, "group", 1))
        if group < 1 or c % group or m % group or cg * group != c:
            raise OperatorError(f"{self.where(i)}: group {group} does not match its {c} input channels and weight "
                                f"shape {tuple(weight.shape)} (needs channels = group x {cg}, filters divisible "
                                f"by group)")
        kernel = tuple(_attr(node, "kernel_shape", (kh, kw)))
        if kernel != (kh, kw):
            raise OperatorError(f"{self.where(i)}: kernel_shape {list(kernel)} does not match the weight shape "
                                f"{tuple(weight.shape)}")
        if bias is not None and bias.shape != (m,):
            raise OperatorError(f"{self.where(i)}: bias '{b_name}' has shape {bias.shape}, expected ({m},)")
        strides, pads, dilations = conv_geometry(node, (h, w), (kh, kw))
        out = node.output[0]
        common = dict(feed=ConvFeed(input_name=x), output=out, stride=strides, pad=pads, dilation=dilations,
                      bias=bias, weight=weight.astype(np.float64))
        if group == 1:
            return _Core(op="conv2d", shape=dict(n=n, c=c, h=h, w=w, k=m, r=kh, s=kw), out_shape=(), **common)
        if group == c and m == c:
            return _Core(op="depthwise", shape=dict(n=n, c=c, h=h, w=w, r=kh, s=kw), out_shape=(), **common)
        if self.grouped:   # one conv2d kernel per group and batch item (the network runtime loops over them)
            return _Core(op="conv2d", shape=dict(n=1, c=cg, h=h, w=w, k=m // group, r=kh, s=kw), out_shape=(),
                         groups=group, **common)
        if group == c:
            return f"depthwise convolution with channel multiplier {m // c} (xfc depthwise has multiplier 1)"
        return f"grouped convolution with group {group} (xfc covers group 1 and group = channels)"

    def gemm(self, i: int, node):
        a, b = node.input[0], node.input[1]
        c_name = node.input[2] if len(node.input) > 2 and node.input[2] else None
        as_, bs = self.loaded.shape(a), self.loaded.shape(b)
        if as_ is None or bs is None:
            return "the shapes of its inputs were not inferred"
        if len(as_) != 2 or len(bs) != 2:
            return f"operands of rank {len(as_)} and {len(bs)} (Gemm takes matrices)"
        if not (self.is_float(a) and self.is_float(b)):
            return "not fp32 (xfc kernels are fp32)"
        trans_a, trans_b = bool(_attr(node, "transA", 0)), bool(_attr(node, "transB", 0))
        alpha, beta = float(_attr(node, "alpha", 1.0)), float(_attr(node, "beta", 1.0))
        m, k = (as_[1], as_[0]) if trans_a else as_
        n = bs[0] if trans_b else bs[1]
        weight, b_feed = None, dict(b_name=b, b_transpose=trans_b, b_view=(k, n), b_broadcast=(k, n))
        if b in self.loaded.constants:
            mat = np.asarray(self.loaded.constants[b], dtype=np.float64)
            weight = (alpha * (mat.T if trans_b else mat)).reshape(1, k, n)
            b_feed = dict(b_name=None)
        elif alpha != 1.0:
            return f"alpha={alpha:g} with a non-constant B (alpha is folded into constant weights only)"
        bias = None
        if c_name:
            if c_name not in self.loaded.constants:
                return f"its bias C '{c_name}' is not a constant"
            cv = np.asarray(self.loaded.constants[c_name], dtype=np.float64)
            if cv.size == 1:
                bias = np.full(n, beta * cv.reshape(()))
            elif cv.shape in ((n,), (1, n)):
                bias = beta * cv.reshape(n)
            else:
                return f"its bias C of shape {tuple(cv.shape)} does not broadcast per column (needs [{n}] or [1, {n}])"
        notes = []
        if alpha != 1.0:
            notes.append(f"alpha={alpha:g} folded into the weights")
        if bias is not None and beta != 1.0:
            notes.append(f"beta={beta:g} folded into the bias")
        units = GEMM_SCALE_UNITS if (alpha != 1.0 or (bias is not None and beta != 1.0)) else 0
        feed = MatmulFeed(a_name=a, a_transpose=trans_a, a_view=(m, k), a_broadcast=(m, k), **b_feed)
        return _Core(op="matmul", shape=dict(m=m, n=n, k=k, batch=1), feed=feed, output=node.output[0],
                     out_shape=(), weight=weight, bias=bias, fold_units=units, notes=notes)

    def matmul(self, i: int, node):
        a, b = node.input[0], node.input[1]
        as_, bs = self.loaded.shape(a), self.loaded.shape(b)
        if as_ is None or bs is None:
            return "the shapes of its inputs were not inferred"
        if not (self.is_float(a) and self.is_float(b)):
            return "not fp32 (xfc kernels are fp32)"
        a_view = (1, *as_) if len(as_) == 1 else tuple(as_)
        b_view = (*bs, 1) if len(bs) == 1 else tuple(bs)
        k, n = b_view[-2], b_view[-1]
        if a_view[-1] != k:
            raise OperatorError(f"{self.where(i)}: operand shapes {as_} and {bs} do not multiply")
        const_b = b in self.loaded.constants
        if len(b_view) == 2:       # B has no batch dims: A's batch dims fold into M
            m, batch = prod(a_view[:-1]), 1
            a_bcast, b_bcast = a_view, b_view
        else:
            try:
                batch_shape = tuple(np.broadcast_shapes(a_view[:-2], b_view[:-2]))
            except ValueError:
                raise OperatorError(f"{self.where(i)}: batch dimensions of {as_} and {bs} do not broadcast") from None
            m, batch = a_view[-2], prod(batch_shape)
            a_bcast, b_bcast = (*batch_shape, a_view[-2], k), (*batch_shape, k, n)
        weight = None
        if const_b:
            mat = np.asarray(self.loaded.constants[b], dtype=np.float64).reshape(b_view)
            weight = np.broadcast_to(mat, b_bcast).reshape(batch, k, n)
        feed = MatmulFeed(a_name=a, a_transpose=False, a_view=a_view, a_broadcast=a_bcast,
                          b_name=None if const_b else b, b_view=b_view, b_broadcast=b_bcast)
        return _Core(op="matmul", shape=dict(m=m, n=n, k=k, batch=batch), feed=feed, output=node.output[0],
                     out_shape=(), weight=weight, bias=None)

    # -- absorbed nodes -------------------------------------------------------------------------

    def bn_params(self, j: int, channels: int):
        """(scale, shift) float64 per channel of an inference BatchNormalization, or a reason string."""
        bn = self.nodes[j]
        params = [self.const(j, name, what) for name, what in
                  zip(bn.input[1:5], ("scale", "bias", "mean", "variance"))]
        if int(_attr(bn, "training_mode", 0)) or len([o for o in bn.output if o]) > 1:
            return "it is in training mode"
        if not int(_attr(bn, "spatial", 1)):
            return "it is not spatial (per-element statistics)"
        if any(p.size != channels for p in params):
            return f"its parameters are not per channel ({channels})"
        scale, shift, mean, var = (p.astype(np.float64).reshape(channels) for p in params)
        eps = float(_attr(bn, "epsilon", 1e-5))
        s = scale / np.sqrt(var + eps)
        return s, shift, mean

    def bias_add(self, j: int, tensor: str, n: int):
        """The per-column constant of an Add reading `tensor`, or None."""
        add = self.nodes[j]
        other = [x for x in add.input if x != tensor]
        if len(add.input) != 2 or len(other) != 1 or other[0] not in self.loaded.constants:
            return None
        cv = np.asarray(self.loaded.constants[other[0]])
        if cv.dtype != np.float32 or cv.shape[-1:] != (n,) or prod(cv.shape) != n:
            return None
        if self.loaded.shape(add.output[0]) != self.loaded.shape(tensor):
            return None
        return cv.astype(np.float64).reshape(n)

    def activation(self, j: int) -> Optional[str]:
        node = self.nodes[j]
        if not _is_default_domain(node):
            return None
        if node.op_type == "Relu":
            return "relu"
        if node.op_type != "Clip":
            return None
        if self.loaded.opset < 11:
            lo, hi = float(_attr(node, "min", -FLOAT32_MAX)), float(_attr(node, "max", FLOAT32_MAX))
        else:
            bounds = []
            for idx, default in ((1, -np.inf), (2, np.inf)):
                name = node.input[idx] if len(node.input) > idx else ""
                if not name:
                    bounds.append(default)
                elif name in self.loaded.constants and self.loaded.constants[name].size == 1:
                    bounds.append(float(np.asarray(self.loaded.constants[name]).reshape(())))
                else:
                    return None
            lo, hi = bounds
        if lo == 0.0 and hi == 6.0:
            return "relu6"
        if lo == 0.0 and hi >= FLOAT32_MAX:
            return "relu"
        return None

    def absorb(self, i: int, core: _Core):
        """Follow the main node's output through foldable/fusable nodes. Returns
        (core, activation, absorbed indices, fused op types)."""
        taken, fused, activation = [], [], "none"
        tensor = core.output
        channels = core.shape.get("k", core.shape.get("c")) * core.groups if core.op != "matmul" else core.shape["n"]
        j, why = self.single_consumer(tensor)
        if core.op != "matmul" and j is not None and self.nodes[j].op_type == "BatchNormalization" \
                and _is_default_domain(self.nodes[j]):
            folded = self.bn_params(j, channels)
            if isinstance(folded, str):
                self.blocked[j] = f"not folded into '{self.names[i]}': {folded}"
            else:
                s, shift, mean = folded
                bias = core.bias if core.bias is not None else np.zeros(channels)
                core.weight = core.weight * s.reshape(-1, 1, 1, 1)
                core.bias = (bias - mean) * s + shift
                core.bias_magnitude = np.abs(s * (bias - mean)) + np.abs(shift)
                core.fold_units += BN_FOLD_UNITS
                core.notes.append(f"BatchNormalization '{self.names[j]}' folded into the weights and bias")
                tensor = self.nodes[j].output[0]
                taken.append(j)
                fused.append("BatchNormalization")
                j, why = self.single_consumer(tensor)
        if core.op == "matmul" and core.bias is None and j is not None and self.nodes[j].op_type == "Add" \
                and _is_default_domain(self.nodes[j]):
            bias = self.bias_add(j, tensor, channels)
            if bias is not None:
                core.bias = bias
                core.notes.append(f"Add '{self.names[j]}' fused as the bias")
                tensor = self.nodes[j].output[0]
                taken.append(j)
                fused.append("Add")
                j, why = self.single_consumer(tensor)
        if j is not None:
            act = self.activation(j)
            if act is not None:
                activation = act
                tensor = self.nodes[j].output[0]
                taken.append(j)
                fused.append(self.nodes[j].op_type)
        else:
            for reader in self.consumers.get(tensor, []):
                if self.activation(reader) is not None:
                    self.blocked[reader] = f"not fused into '{self.names[i]}': {why}"
        core.output = tensor
        return core, activation, taken, fused

    # -- the walk -------------------------------------------------------------------------------

    def reason(self, i: int) -> str:
        node = self.nodes[i]
        if not _is_default_domain(node):
            return f"custom domain '{node.domain}'"
        if node.op_type == "Clip" and self.activation(i) is None:
            return "not fused: only Clip(0, 6) and Clip(0, inf) are xfc epilogues"
        if node.op_type in ("Relu", "Clip"):
            return "not fused: its input does not come from a layer xfc covers"
        return "not an xfc operator"

    def uncovered(self, i: int, reason: str) -> Uncovered:
        node = self.nodes[i]
        return Uncovered(node=node, name=self.names[i], op_type=node.op_type, reason=reason, flops=self.flops(i))

    def run(self) -> MappedNetwork:
        mappers = {"Conv": self.conv, "Gemm": self.gemm, "MatMul": self.matmul}
        steps = []
        for i, node in enumerate(self.nodes):
            if i in self.absorbed:
                continue
            mapper = mappers.get(node.op_type) if _is_default_domain(node) else None
            if mapper is None:
                if node.op_type == "BatchNormalization" and _is_default_domain(node):
                    for name, what in zip(node.input[1:5], ("scale", "bias", "mean", "variance")):
                        self.const(i, name, what)
                reason = self.blocked.get(i) or self.reason(i)
                steps.append(self.uncovered(i, reason))
                continue
            core = mapper(i, node)
            if isinstance(core, str):
                steps.append(self.uncovered(i, core))
                continue
            saved_blocked = dict(self.blocked)
            core, activation, taken, fused = self.absorb(i, core)
            try:
                spec = make_spec(core.op, core.shape, stride=core.stride, pad=core.pad, dilation=core.dilation,
                                 bias=core.bias is not None, activation=activation)
            except OperatorError as exc:
                self.blocked = saved_blocked
                steps.append(self.uncovered(i, str(exc)))
                continue
            self.absorbed.update(taken)
            run = [i, *taken]
            weight = None if core.weight is None else np.ascontiguousarray(core.weight, dtype=np.float32)
            bias_floats = spec.operand_shapes[2][0] * core.groups
            bias = np.zeros(bias_floats, np.float32) if core.bias is None else core.bias.astype(np.float32)
            magnitude = (core.bias_magnitude if core.bias_magnitude is not None
                         else np.abs(core.bias) if core.bias is not None else np.zeros(bias_floats))
            out_shape = self.loaded.shape(core.output) or tuple(spec.output_shape)
            steps.append(Layer(
                name=self.names[i], op_type=node.op_type, fused_ops=tuple(fused),
                nodes=tuple(self.names[j] for j in run), onnx_nodes=tuple(self.nodes[j] for j in run),
                notes=tuple(core.notes), spec=spec, feed=core.feed,
                output=core.output, out_shape=tuple(out_shape), weight=weight, bias=bias,
                bias_magnitude=np.asarray(magnitude, dtype=np.float64), fold_units=core.fold_units,
                flops=sum(self.flops(j) or 0 for j in run), groups=core.groups))
        return MappedNetwork(loaded=self.loaded, steps=tuple(steps))


def map_network(loaded: LoadedModel, grouped: bool = False) -> MappedNetwork:
    """Map every node of a loaded model (see the module docstring). grouped: also map grouped
    convolutions (1 < group, not depthwise) to one conv2d spec per group (Layer.groups; the
    network runtime, xfc/model/runtime, runs them). A quantized model (QDQ, QOperator) is refused in
    one line once its quantization is read and checked (xfc.model.quantized.refuse_quantized)."""
    from .quantized import refuse_quantized   # quantized.py reads conv_geometry from here
    refuse_quantized(loaded)
    return _Mapper(loaded, grouped).run()
