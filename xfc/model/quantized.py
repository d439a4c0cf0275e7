"""Quantized ONNX models (issue 33 item 1): QDQ and QOperator graphs read as int8 operations, checked,
and run exactly by an oracle.

`recognise(loaded)` returns None for a model with no QuantizeLinear / QLinear* node, else a
QuantizedNetwork: the model's nodes as steps, in graph order:

  layer       Conv (group 1 or depthwise), Gemm, MatMul in int8: a quantized input, int8 weights
              with one scale per tensor or per output channel (zero point 0), an int32 bias in the
              accumulator's scale (x_scale w_scale), a quantized output. QOperator: QLinearConv,
              QLinearMatMul, QGemm (com.microsoft). QDQ: the float node between DequantizeLinear
              nodes (the activation and the constant weights and bias) and one QuantizeLinear
              (a Relu or Clip(0, 6) in between is the output clamp).
  add         QLinearAdd (com.microsoft), or Add(DQ(a), DQ(b)) -> Q: requantizing addition.
  gap         QLinearGlobalAveragePool (com.microsoft), or GlobalAveragePool(DQ(x)) -> Q.
  move        MaxPool, Flatten, Reshape, Squeeze, Unsqueeze, Identity on quantized values with the
              input's scale and zero point (QOperator: the node on the quantized tensor; QDQ:
              DQ -> node -> Q with the same parameters): the bytes move, nothing is rounded.
  quantize    QuantizeLinear of an fp32 tensor (a graph input, a float node's output).
  dequantize  DequantizeLinear of an activation some float node or the graph output reads.
  float       any other node: fp32, on dequantized values (what onnxruntime does with it too).

Everything wrong with the quantization is one OperatorError line naming the node: a scale that is
not a finite number > 0, a zero point outside its type, weights with a zero point other than 0 (xfc's
int8 kernels take symmetric weights) or not int8, per-channel scales on another axis than the output
channels or of the wrong count, a bias that is not int32 in the scale x_scale w_scale, an int8 layer
whose input and output types differ.

`run(network, feeds)` is the oracle: every step computed exactly as xfc defines it, in numpy. A
layer: int32 accumulators, then y = sat(rint_even(fp32(acc) * m) + y_zp) with m = fp32(x_scale *
w_scale[o]) / y_scale in fp32 arithmetic (as onnxruntime computes its output scales), clamped first
(xfc.ops.quant); an add: sat(rint_even(fp32(fp32(sa/sy) (a - za)) + fp32(fp32(sb/sy) (b - zb))) +
zy); an average: sat(rint_even(fp32(sum(x) - N zx) * fp32(sx / (sy N))) + zy); quantize:
sat(rint_even(x / s) + zp) (ONNX QuantizeLinear); dequantize: (q - zp) s in fp32. onnxruntime may
differ by one step where its rounding differs (fused multiply-adds, another order): the verdict
against it allows 1 LSB (compare_with_onnxruntime).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from math import prod
from typing import Mapping, Optional

import numpy as np

from ..errors import OperatorError
from ..ops.quant import TYPE_RANGE, QuantParams, accumulators, requantize
from ..ops.spec import make_spec
from .load import LoadedModel
from .nodes import run_node
from .onnx_nodes import attr as _attr
from .onnx_nodes import conv_geometry, readers_of

ONNX_TYPES = {2: "uint8", 3: "int8", 6: "int32"}   # TensorProto element types of quantized tensors
MOVES = ("MaxPool", "Flatten", "Reshape", "Squeeze", "Unsqueeze", "Identity")
QLINEAR = ("QLinearConv", "QLinearMatMul", "QGemm", "QLinearAdd", "QLinearGlobalAveragePool")
BIAS_SCALE_RTOL = 1e-5
FORMAT_NAMES = {"qdq": "QDQ", "qoperator": "QOperator"}      # the bias scale must be x_scale w_scale (quantizers write it so)


@dataclass(frozen=True)
class QTensor:
    """A quantized activation: element type, scale, zero point (per tensor)."""

    name: str
    act_type: str
    scale: float
    zero_point: int


@dataclass(frozen=True, eq=False)
class QStep:
    kind: str                          # layer, add, gap, move, quantize, dequantize, float
    name: str                          # the main ONNX node
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: tuple = ()                  # every NodeProto the step stands for
    op: str = ""                       # the main node's op type
    spec: object = None                # layer: the OperatorSpec (bias; relu / relu6 as the clamp)
    weight: Optional[np.ndarray] = None     # layer: int8 in xfc's layout (conv [K,C,R,S], depthwise [C,1,R,S], matmul [K,N])
    w_scales: Optional[np.ndarray] = None   # layer: fp32 per output channel
    bias: Optional[np.ndarray] = None       # layer: int32 per output channel


@dataclass(frozen=True, eq=False)
class QuantizedNetwork:
    format: str                        # 'qdq' or 'qoperator'
    steps: tuple[QStep, ...]
    tensors: Mapping[str, QTensor]     # every quantized activation
    loaded: LoadedModel
    inferred_shapes: Mapping[str, tuple] = None   # shapes ONNX inference did not reach (after com.microsoft nodes)

    def shape(self, name: str) -> Optional[tuple]:
        shape = self.loaded.shape(name)
        if shape is not None:
            return tuple(int(d) for d in shape)
        return (self.inferred_shapes or {}).get(name)

    def counts(self) -> Counter:
        return Counter(s.kind for s in self.steps)

    def describe(self) -> str:
        c = self.counts()
        parts = [f"{c[k]} {label}" for k, label in (("layer", "int8 layers"), ("add", "requantizing adds"),
                                                   ("gap", "int8 averages"), ("move", "byte moves"),
                                                   ("quantize", "quantize"), ("dequantize", "dequantize"),
                                                   ("float", "fp32 nodes")) if c[k]]
        return f"{FORMAT_NAMES[self.format]}: {', '.join(parts)}"


def is_quantized(loaded: LoadedModel) -> bool:
    return any(n.op_type in ("QuantizeLinear", *QLINEAR) for n in loaded.model.graph.node)


class _Reader:
    def __init__(self, loaded: LoadedModel):
        self.loaded = loaded
        self.nodes = list(loaded.model.graph.node)
        self.names = [n.name or f"{n.op_type}_{i}" for i, n in enumerate(self.nodes)]
        self.producer = {o: i for i, n in enumerate(self.nodes) for o in n.output if o}
        self.consumers = readers_of(self.nodes)
        self.graph_outputs = set(loaded.outputs)
        self.tensors: dict[str, QTensor] = {}
        self.shapes: dict[str, tuple] = {}   # what shape inference could not reach (after com.microsoft nodes)

    def shape(self, i: int, name: str) -> tuple:
        shape = self.loaded.shape(name)
        shape = self.shapes.get(name) if shape is None else tuple(int(d) for d in shape)
        if shape is None:
            raise OperatorError(f"{self.where(i)}: the shape of '{name}' is not static (fix the input shapes: "
                                f"--input-shape on the command line, input_shapes= in Python)")
        return shape

    def infer(self, i: int) -> None:
        """Output shapes of node i where shape inference left them unknown: the node run on zeros."""
        node = self.nodes[i]
        outs = [o for o in node.output if o]
        if all(self.loaded.shape(o) is not None or o in self.shapes for o in outs):
            return
        feeds = {}
        for name in node.input:
            if not name or name in feeds:
                continue
            if name in self.loaded.constants:
                feeds[name] = np.asarray(self.loaded.constants[name])
            else:   # shapes only: fp32 zeros (onnx.reference's MaxPool does not take int8)
                feeds[name] = np.zeros(self.shape(i, name), np.float32)
        try:
            results = run_node(node, feeds, self.loaded.opset)
        except Exception as exc:   # noqa: BLE001 - onnx.reference's errors are of every kind
            raise OperatorError(f"{self.where(i)}: cannot infer its output shape ({' '.join(str(exc).split())[:160]})")
        self.shapes.update({o: tuple(np.shape(v)) for o, v in zip(outs, results)})

    def where(self, i: int) -> str:
        return f"{self.loaded.path}: node '{self.names[i]}' ({self.nodes[i].op_type})"

    def const(self, i: int, name: str, what: str) -> np.ndarray:
        if not name or name not in self.loaded.constants:
            raise OperatorError(f"{self.where(i)}: its {what} '{name}' is not a constant")
        return np.asarray(self.loaded.constants[name])

    def scale(self, i: int, name: str, what: str, count: Optional[int] = 1) -> np.ndarray:
        s = self.const(i, name, what).astype(np.float32).reshape(-1)
        if count is not None and s.size != count:
            raise OperatorError(f"{self.where(i)}: {what} '{name}' has {s.size} values, expected {count}")
        bad = ~np.isfinite(s) | (s <= 0)
        if bad.any():
            raise OperatorError(f"{self.where(i)}: {what} '{name}' is {float(s[bad][0]):g}: a scale must be a finite "
                                f"number > 0")
        return s

    def zero_point(self, i: int, name: str, what: str, count: int = 1, kind: Optional[str] = None) -> tuple[str, np.ndarray]:
        """(element type, zero points) of a quantized tensor's zero point input (absent: uint8 0)."""
        if not name:
            return "uint8", np.zeros(count, np.int64)
        z = self.const(i, name, what)
        act = {np.dtype(np.uint8): "uint8", np.dtype(np.int8): "int8", np.dtype(np.int32): "int32"}.get(z.dtype)
        if act is None or (kind is not None and act != kind):
            raise OperatorError(f"{self.where(i)}: {what} '{name}' is {z.dtype}, expected "
                                f"{kind or 'uint8 or int8'}")
        z = z.astype(np.int64).reshape(-1)
        if z.size != count:
            raise OperatorError(f"{self.where(i)}: {what} '{name}' has {z.size} values, expected {count}")
        lo, hi = TYPE_RANGE.get(act, (-2 ** 31, 2 ** 31 - 1))
        if z.min() < lo or z.max() > hi:
            raise OperatorError(f"{self.where(i)}: {what} '{name}' is {int(z[(z < lo) | (z > hi)][0])}, out of range "
                                f"for {act} ({lo}..{hi})")
        return act, z

    def activation(self, i: int, tensor: str, scale_name: str, zp_name: str, what: str) -> QTensor:
        """The QTensor of an activation, from its scale and zero point inputs (one each)."""
        act, zp = self.zero_point(i, zp_name, f"{what} zero point")
        if act not in ("uint8", "int8"):
            raise OperatorError(f"{self.where(i)}: {what} zero point '{zp_name}' is {act}: activations are uint8 or "
                                f"int8")
        scale = self.scale(i, scale_name, f"{what} scale")
        q = QTensor(tensor, act, float(scale[0]), int(zp[0]))
        known = self.tensors.get(tensor)
        if known is not None and (known.act_type, known.scale, known.zero_point) != (q.act_type, q.scale, q.zero_point):
            raise OperatorError(f"{self.where(i)}: '{tensor}' is quantized with scale {q.scale:g} zero point "
                                f"{q.zero_point} here and scale {known.scale:g} zero point {known.zero_point} where "
                                f"it is written")
        self.tensors[tensor] = q
        return q

    def weights(self, i: int, w_name: str, s_name: str, zp_name: str, channels: int, axis: int, ndim: int,
                given_axis: Optional[int]) -> tuple[np.ndarray, np.ndarray]:
        """(int8 weights, fp32 scales per output channel); axis: the output-channel axis of the weights."""
        w = self.const(i, w_name, "weight")
        if w.dtype != np.int8:
            raise OperatorError(f"{self.where(i)}: weight '{w_name}' is {w.dtype}: xfc's int8 kernels take int8 "
                                f"weights")
        if w.ndim != ndim:
            raise OperatorError(f"{self.where(i)}: weight '{w_name}' has rank {w.ndim}, expected {ndim}")
        scales = self.const(i, s_name, "weight scale").reshape(-1)
        if scales.size not in (1, channels):
            raise OperatorError(f"{self.where(i)}: weight scale '{s_name}' has {scales.size} values: neither one "
                                f"(per tensor) nor one per output channel ({channels})")
        if scales.size > 1 and given_axis is not None and given_axis % ndim != axis:
            raise OperatorError(f"{self.where(i)}: weight '{w_name}' is quantized per channel along axis "
                                f"{given_axis}, not its output channels (axis {axis}): mixed per-channel axes")
        s = self.scale(i, s_name, "weight scale", None)
        _, zp = self.zero_point(i, zp_name, "weight zero point", s.size) if zp_name else ("int8", np.zeros(1))
        if np.any(zp != 0):
            raise OperatorError(f"{self.where(i)}: weight zero point '{zp_name}' is {int(zp[zp != 0][0])}: xfc's int8 "
                                f"kernels take symmetric weights (zero point 0)")
        return w, np.broadcast_to(s, (channels,)).astype(np.float32)

    def bias(self, i: int, b_name: str, channels: int, x: QTensor, w_scales: np.ndarray,
             scale_name: Optional[str] = None, zp_name: Optional[str] = None) -> Optional[np.ndarray]:
        if not b_name:
            return None
        b = self.const(i, b_name, "bias")
        if b.dtype != np.int32 or b.size != channels:
            raise OperatorError(f"{self.where(i)}: bias '{b_name}' is {b.dtype} with {b.size} values: expected "
                                f"int32 with one per output channel ({channels})")
        if scale_name is not None:
            scale = self.scale(i, scale_name, "bias scale", None)
            expected = np.float32(x.scale) * w_scales
            if scale.size not in (1, channels) or not np.allclose(np.broadcast_to(scale, (channels,)), expected,
                                                                   rtol=BIAS_SCALE_RTOL, atol=0):
                raise OperatorError(f"{self.where(i)}: bias scale '{scale_name}' is not input scale x weight scale: "
                                    f"xfc adds the bias to the int32 accumulators")
            if zp_name:
                _, zp = self.zero_point(i, zp_name, "bias zero point", scale.size, kind="int32")
                if np.any(zp != 0):
                    raise OperatorError(f"{self.where(i)}: bias zero point '{zp_name}' is not 0")
        return b.reshape(-1).astype(np.int32)


def _layer_spec(reader: _Reader, i: int, op: str, x_shape, w: np.ndarray, bias, activation: str):
    node = reader.nodes[i]
    if op == "conv":
        n, c, h, wd = x_shape
        k, cg, r, s = w.shape
        group = int(_attr(node, "group", 1))
        strides, pads, dilations = conv_geometry(node, (h, wd), (r, s))
        if group == 1 and cg == c:
            return make_spec("conv2d", dict(n=n, c=c, h=h, w=wd, k=k, r=r, s=s), stride=strides, pad=pads,
                             dilation=dilations, bias=bias is not None, activation=activation)
        if group == c and k == c and cg == 1:
            return make_spec("depthwise", dict(n=n, c=c, h=h, w=wd, r=r, s=s), stride=strides, pad=pads,
                             dilation=dilations, bias=bias is not None, activation=activation)
        raise OperatorError(f"{reader.where(i)}: group {group} with {c} channels and {k} filters: xfc's int8 "
                            f"kernels cover group 1 and depthwise")
    m = prod(x_shape[:-1])
    return make_spec("matmul", dict(m=m, n=w.shape[1], k=w.shape[0]), bias=bias is not None, activation=activation)


def recognise(loaded: LoadedModel) -> Optional[QuantizedNetwork]:
    """The quantized network of a model (module docstring), or None when nothing in it is quantized."""
    if not is_quantized(loaded):
        return None
    r = _Reader(loaded)
    qop = any(n.op_type in QLINEAR for n in r.nodes)
    steps = _qoperator(r) if qop else _qdq(r)
    return QuantizedNetwork(format="qoperator" if qop else "qdq", steps=tuple(steps), tensors=dict(r.tensors),
                            loaded=loaded, inferred_shapes=dict(r.shapes))


def refuse_quantized(loaded: LoadedModel) -> None:
    """A quantized model: its quantization read and checked (a bad one is its own one-line error), then
    one line saying what xfc found and that it builds it as a network (--emit lib), not layer by layer."""
    network = recognise(loaded)
    if network is not None:
        raise OperatorError(f"{loaded.path}: an int8 model ({network.describe()}): xfc builds int8 models as a whole "
                            f"network: add --emit lib (the per-layer report and its options read fp32 models)")


def _set_shapes(r: _Reader, step: QStep, i: int) -> None:
    """The shapes of a step's outputs, for the steps after it (QOperator: inference stops at com.microsoft)."""
    out = step.outputs[0]
    if r.loaded.shape(out) is not None:
        return
    if step.kind == "layer":
        x = r.shape(i, step.inputs[0])
        r.shapes[out] = tuple(step.spec.output_shape) if step.spec.name != "matmul" else (*x[:-1], step.weight.shape[1])
    elif step.kind in ("quantize", "dequantize"):
        r.shapes[out] = r.shape(i, step.inputs[0])
    elif step.kind == "add":
        r.shapes[out] = tuple(np.broadcast_shapes(r.shape(i, step.inputs[0]), r.shape(i, step.inputs[1])))
    elif step.kind == "gap":
        x = r.shape(i, step.inputs[0])
        r.shapes[out] = (*x[:2], *([1] * (len(x) - 2)))
    else:
        r.infer(i)


def _conv_layer(r: _Reader, i: int, x: QTensor, y: QTensor, x_shape, w_name, ws, wzp, given_axis, b_name, bs, bzp,
                activation: str, nodes: tuple) -> QStep:
    node = r.nodes[i]
    w = r.const(i, w_name, "weight")
    channels = w.shape[0] if w.ndim else 0
    w, scales = r.weights(i, w_name, ws, wzp, channels, 0, 4, given_axis)
    if x.act_type != y.act_type:
        raise OperatorError(f"{r.where(i)}: input {x.act_type}, output {y.act_type}: xfc's int8 layers read and "
                            f"write one activation type")
    bias = r.bias(i, b_name, channels, x, scales, bs, bzp)
    spec = _layer_spec(r, i, "conv", x_shape, w, bias, activation)
    weight = w if spec.name == "conv2d" else w.reshape(w.shape[0], 1, *w.shape[2:])
    return QStep("layer", r.names[i], (x.name,), (y.name,), nodes, node.op_type, spec, weight, scales,
                 bias if bias is not None else np.zeros(channels, np.int32))


def _gemm_layer(r: _Reader, i: int, x: QTensor, y: QTensor, x_shape, w_name, ws, wzp, given_axis, b_name, bs, bzp,
                activation: str, nodes: tuple, trans_b: bool) -> QStep:
    w = r.const(i, w_name, "weight")
    if w.ndim != 2:
        raise OperatorError(f"{r.where(i)}: weight '{w_name}' has rank {w.ndim}: xfc's int8 matmul takes a 2-D B")
    channels = w.shape[0] if trans_b else w.shape[1]
    w, scales = r.weights(i, w_name, ws, wzp, channels, 0 if trans_b else 1, 2, given_axis)
    if x.act_type != y.act_type:
        raise OperatorError(f"{r.where(i)}: input {x.act_type}, output {y.act_type}: xfc's int8 layers read and "
                            f"write one activation type")
    bias = r.bias(i, b_name, channels, x, scales, bs, bzp)
    weight = np.ascontiguousarray(w.T if trans_b else w)
    spec = _layer_spec(r, i, "matmul", x_shape, weight, bias, activation)
    return QStep("layer", r.names[i], (x.name,), (y.name,), nodes, r.nodes[i].op_type, spec, weight, scales,
                 bias if bias is not None else np.zeros(channels, np.int32))


def _check_gemm(r: _Reader, i: int) -> bool:
    """transB of a Gemm / QGemm (transA, alpha != 1 and beta != 1 are refused)."""
    node = r.nodes[i]
    if int(_attr(node, "transA", 0)) or float(_attr(node, "alpha", 1.0)) != 1.0 or float(_attr(node, "beta", 1.0)) != 1.0:
        raise OperatorError(f"{r.where(i)}: transA, alpha or beta other than the defaults: not an int8 layer xfc "
                            f"builds")
    return bool(int(_attr(node, "transB", 0)))


def _qoperator(r: _Reader) -> list[QStep]:
    steps = []
    for i, node in enumerate(r.nodes):
        before = len(steps)
        _qoperator_node(r, i, node, steps)
        for step in steps[before:]:
            _set_shapes(r, step, i)
    return steps


def _qoperator_node(r: _Reader, i: int, node, steps: list) -> None:
    """The QOperator step(s) of node i, appended to steps."""
    op, ins, outs = node.op_type, list(node.input) + [""] * 9, [o for o in node.output if o]
    if op == "QuantizeLinear":
        y = r.activation(i, outs[0], ins[1], ins[2], "output")
        steps.append(QStep("quantize", r.names[i], (ins[0],), (y.name,), (node,), op))
    elif op == "DequantizeLinear":
        if ins[0] in r.loaded.constants:
            return
        r.activation(i, ins[0], ins[1], ins[2], "input")
        steps.append(QStep("dequantize", r.names[i], (ins[0],), (outs[0],), (node,), op))
    elif op == "QLinearConv":
        x = r.activation(i, ins[0], ins[1], ins[2], "input")
        y = r.activation(i, outs[0], ins[6], ins[7], "output")
        steps.append(_conv_layer(r, i, x, y, r.shape(i, ins[0]), ins[3], ins[4], ins[5], None, ins[8], None,
                                 None, "none", (node,)))
    elif op == "QLinearMatMul":
        x = r.activation(i, ins[0], ins[1], ins[2], "input")
        y = r.activation(i, outs[0], ins[6], ins[7], "output")
        steps.append(_gemm_layer(r, i, x, y, r.shape(i, ins[0]), ins[3], ins[4], ins[5], None, "", None, None,
                                 "none", (node,), trans_b=False))
    elif op == "QGemm":
        x = r.activation(i, ins[0], ins[1], ins[2], "input")
        if not ins[7] or len(outs) != 1:     # no y_scale: QGemm's fp32 output form
            raise OperatorError(f"{r.where(i)}: QGemm with an fp32 output: not an int8 layer xfc builds")
        y = r.activation(i, outs[0], ins[7], ins[8], "output")
        steps.append(_gemm_layer(r, i, x, y, r.shape(i, ins[0]), ins[3], ins[4], ins[5], None, ins[6], None,
                                 None, "none", (node,), trans_b=_check_gemm(r, i)))
    elif op == "QLinearAdd":
        a = r.activation(i, ins[0], ins[1], ins[2], "input A")
        b = r.activation(i, ins[3], ins[4], ins[5], "input B")
        y = r.activation(i, outs[0], ins[6], ins[7], "output")
        steps.append(QStep("add", r.names[i], (a.name, b.name), (y.name,), (node,), op))
    elif op == "QLinearGlobalAveragePool":
        if int(_attr(node, "channels_last", 0)):
            raise OperatorError(f"{r.where(i)}: channels_last=1: xfc's tensors are NCHW")
        x = r.activation(i, ins[0], ins[1], ins[2], "input")
        y = r.activation(i, outs[0], ins[3], ins[4], "output")
        steps.append(QStep("gap", r.names[i], (x.name,), (y.name,), (node,), op))
    elif op in MOVES and ins[0] in r.tensors:
        x = r.tensors[ins[0]]
        r.tensors[outs[0]] = QTensor(outs[0], x.act_type, x.scale, x.zero_point)
        steps.append(QStep("move", r.names[i], tuple(n for n in node.input if n), (outs[0],), (node,), op))
    elif op.startswith("QLinear") or node.domain == "com.microsoft" and op.startswith("Q"):
        raise OperatorError(f"{r.where(i)}: a quantized operator xfc does not read (it reads "
                            f"{', '.join(QLINEAR)}, QuantizeLinear, DequantizeLinear)")
    else:
        steps.append(QStep("float", r.names[i], tuple(n for n in node.input if n), tuple(outs), (node,), op))


def _qdq(r: _Reader) -> list[QStep]:
    """QDQ: activations quantized by QuantizeLinear; a float node between DequantizeLinear nodes and
    one QuantizeLinear runs in int8 (module docstring)."""
    n = r.nodes

    def dq_of(name: str) -> Optional[int]:
        """The DequantizeLinear node writing name (of a constant or an activation), or None."""
        p = r.producer.get(name)
        return p if p is not None and n[p].op_type == "DequantizeLinear" else None

    def only_reader(name: str) -> Optional[int]:
        readers = r.consumers.get(name, [])
        return readers[0] if len(readers) == 1 and name not in r.graph_outputs else None

    def act_input(name: str) -> Optional[int]:
        d = dq_of(name)
        return d if d is not None and n[d].input[0] not in r.loaded.constants else None

    def quantized_output(i: int) -> Optional[tuple[int, list, str]]:
        """(the Q node, the nodes between, the clamp activation) after node i, or None."""
        between, act, tensor = [], "none", n[i].output[0]
        j = only_reader(tensor)
        if j is not None and n[j].op_type in ("Relu", "Clip"):
            act = "relu" if n[j].op_type == "Relu" else _clip_activation(r, n[j])
            if act is None:
                return None
            between.append(j)
            j = only_reader(n[j].output[0])
        if j is None or n[j].op_type != "QuantizeLinear":
            return None
        return j, between, act

    def same_quantization(dq: int, q: int) -> bool:
        """The DequantizeLinear dq and the QuantizeLinear q name equal scale and zero point constants."""
        values = [[np.asarray(r.loaded.constants.get(_at(n[k], j), np.nan)).tolist() if _at(n[k], j) else None
                   for j in (1, 2)] for k in (dq, q)]
        return values[0] == values[1]

    plan: dict[int, tuple] = {}     # main node -> (Q node, between nodes, activation, DQ inputs)
    taken: set[int] = set()
    for i, node in enumerate(n):
        op = node.op_type
        if op not in ("Conv", "Gemm", "MatMul", "Add", "GlobalAveragePool", *MOVES):
            continue
        after = quantized_output(i)
        if after is None:
            continue
        data = [node.input[0]] if op not in ("Add",) else list(node.input[:2])
        dqs = [act_input(t) for t in data]
        if any(d is None for d in dqs):
            continue
        if op in ("Conv", "Gemm", "MatMul"):
            consts = [dq_of(t) for t in node.input[1:3] if t]
            if len(consts) < 1 or any(c is None or n[c].input[0] not in r.loaded.constants for c in consts):
                continue
        elif after[2] != "none":
            continue         # a Relu / Clip after an Add or a move: xfc clamps in layers only, so in fp32
        elif op in MOVES and not same_quantization(dqs[0], after[0]):
            continue         # a move that changes the quantization rounds: it runs in fp32
        plan[i] = (after, dqs)
        taken.update([after[0], *after[1]])
    steps: list[QStep] = []
    for i, node in enumerate(n):
        op, ins, outs = node.op_type, list(node.input) + [""] * 3, [o for o in node.output if o]
        if i in taken:
            continue
        if i in plan:
            (q, between, act), dqs = plan[i]
            y_name = n[q].output[0]
            y = r.activation(q, y_name, n[q].input[1], _at(n[q], 2), "output")
            xs = [r.activation(d, n[d].input[0], n[d].input[1], _at(n[d], 2), "input") for d in dqs]
            nodes = (*[n[d] for d in dqs], node, *[n[b] for b in between], n[q])
            if op == "Conv":
                w, b = dq_of(node.input[1]), dq_of(ins[2]) if ins[2] else None
                steps.append(_conv_layer(r, i, xs[0], y, r.shape(i, node.input[0]), n[w].input[0], n[w].input[1],
                                         _at(n[w], 2), _attr(n[w], "axis", 1), n[b].input[0] if b is not None else "",
                                         n[b].input[1] if b is not None else None,
                                         _at(n[b], 2) if b is not None else None, act, nodes))
            elif op in ("Gemm", "MatMul"):
                trans_b = _check_gemm(r, i) if op == "Gemm" else False
                w, b = dq_of(node.input[1]), dq_of(ins[2]) if op == "Gemm" and ins[2] else None
                steps.append(_gemm_layer(r, i, xs[0], y, r.shape(i, node.input[0]), n[w].input[0], n[w].input[1],
                                         _at(n[w], 2), _attr(n[w], "axis", 1), n[b].input[0] if b is not None else "",
                                         n[b].input[1] if b is not None else None,
                                         _at(n[b], 2) if b is not None else None, act, nodes, trans_b))
            elif op == "Add":
                steps.append(QStep("add", r.names[i], (xs[0].name, xs[1].name), (y.name,), nodes, op))
            elif op == "GlobalAveragePool":
                steps.append(QStep("gap", r.names[i], (xs[0].name,), (y.name,), nodes, op))
            else:
                steps.append(QStep("move", r.names[i], (xs[0].name, *[t for t in node.input[1:] if t]), (y.name,),
                                   nodes, op))
            continue
        if op == "QuantizeLinear":
            y = r.activation(i, outs[0], ins[1], ins[2], "output")
            steps.append(QStep("quantize", r.names[i], (ins[0],), (y.name,), (node,), op))
        elif op == "DequantizeLinear":
            if ins[0] in r.loaded.constants:
                continue          # weights and biases: read by their layer, or folded for a float node below
            readers = r.consumers.get(outs[0], [])
            if outs[0] in r.graph_outputs or any(j not in plan for j in readers):
                r.activation(i, ins[0], ins[1], ins[2], "input")
                steps.append(QStep("dequantize", r.names[i], (ins[0],), (outs[0],), (node,), op))
        else:
            steps.append(QStep("float", r.names[i], tuple(t for t in node.input if t), tuple(outs), (node,), op))
    return steps


def _at(node, index: int) -> str:
    return node.input[index] if len(node.input) > index else ""


def _clip_activation(r: _Reader, node) -> Optional[str]:
    """relu / relu6 for Clip(0) / Clip(0, 6) with constant bounds, else None (not a clamp xfc fuses)."""
    bounds = []
    for index, name in ((1, "min"), (2, "max")):
        if _at(node, index):
            if _at(node, index) not in r.loaded.constants:
                return None                  # a bound computed by the network
            bounds.append(r.loaded.constants[_at(node, index)])
        else:
            bounds.append(_attr(node, name, None))
    lo, hi = bounds
    lo = None if lo is None else float(np.asarray(lo).reshape(-1)[0])
    hi = None if hi is None else float(np.asarray(hi).reshape(-1)[0])
    if lo == 0.0 and hi == 6.0:
        return "relu6"
    if lo == 0.0 and hi is None:
        return "relu"
    return None


# ---------------------------------------------------------------------------------------------
# The oracle
# ---------------------------------------------------------------------------------------------

def _sat(values: np.ndarray, act: str) -> np.ndarray:
    lo, hi = TYPE_RANGE[act]
    return np.clip(values, lo, hi).astype(np.uint8 if act == "uint8" else np.int8)


def layer_quant(x: QTensor, y: QTensor) -> QuantParams:
    """The QuantParams of an int8 layer from its input and output tensors (per-channel weights: the
    multipliers are layer_multipliers, passed beside it)."""
    return QuantParams(act_type=x.act_type, a_scale=x.scale, a_zero_point=x.zero_point, w_scale=1.0,
                       per_channel=True, out_scale=y.scale, out_zero_point=y.zero_point)


def add_ratios(a: QTensor, b: QTensor, y: QTensor) -> tuple[np.float32, np.float32]:
    """fp32(sa / sy), fp32(sb / sy): what a requantizing add multiplies each input by."""
    sy = np.float32(y.scale)
    return np.float32(np.float32(a.scale) / sy), np.float32(np.float32(b.scale) / sy)


def gap_multiplier(x: QTensor, y: QTensor, count: int) -> np.float32:
    """fp32(sx / (sy N)): what an int8 average multiplies its zero-point-corrected sum by."""
    return np.float32(np.float32(x.scale) / (np.float32(y.scale) * np.float32(count)))


def layer_multipliers(x: QTensor, w_scales: np.ndarray, y: QTensor) -> np.ndarray:
    """fp32(x_scale w_scale[o]) / y_scale in fp32 arithmetic (onnxruntime's output scales)."""
    with np.errstate(over="ignore", under="ignore"):
        return (np.float32(x.scale) * np.asarray(w_scales, np.float32)) / np.float32(y.scale)


def run_layer(step: QStep, x_q: np.ndarray, x: QTensor, y: QTensor) -> np.ndarray:
    spec = step.spec
    q = layer_quant(x, y)
    acc = accumulators(spec, q, np.asarray(x_q).reshape(spec.operand_shapes[0]), step.weight, step.bias)
    return requantize(acc, spec, q, layer_multipliers(x, step.w_scales, y))


def run_add(a_q, b_q, a: QTensor, b: QTensor, y: QTensor) -> np.ndarray:
    ra, rb = add_ratios(a, b, y)
    va = (ra * (np.asarray(a_q, np.float32) - np.float32(a.zero_point))).astype(np.float32)
    vb = (rb * (np.asarray(b_q, np.float32) - np.float32(b.zero_point))).astype(np.float32)
    return _rint_sat((va + vb).astype(np.float32), y.zero_point, y.act_type)


def run_gap(x_q, x: QTensor, y: QTensor) -> np.ndarray:
    arr = np.asarray(x_q).astype(np.int64)
    count = prod(arr.shape[2:])
    total = arr.reshape(*arr.shape[:2], -1).sum(axis=2) - count * x.zero_point
    mult = gap_multiplier(x, y, count)
    out = _rint_sat((total.astype(np.float32) * mult).astype(np.float32), y.zero_point, y.act_type)
    return out.reshape(*arr.shape[:2], *([1] * (arr.ndim - 2)))


def _rint_sat(values: np.ndarray, zero_point: int, act: str) -> np.ndarray:
    """sat(rint_even(values) + zero_point), clamped in floating point first (no integer overflow:
    inf and 1e30 saturate to the right end; NaN becomes the zero point)."""
    lo, hi = TYPE_RANGE[act]
    v = np.nan_to_num(np.asarray(values, np.float64), nan=0.0)
    v = np.clip(v, lo - zero_point, hi - zero_point)
    return _sat(np.rint(v).astype(np.int64) + zero_point, act)


def quantize(x: np.ndarray, y: QTensor) -> np.ndarray:
    scaled = np.asarray(x, np.float32) / np.float32(y.scale)
    return _rint_sat(scaled, y.zero_point, y.act_type)


def dequantize(q: np.ndarray, x: QTensor) -> np.ndarray:
    return ((np.asarray(q).astype(np.int32) - x.zero_point).astype(np.float32) * np.float32(x.scale)).astype(np.float32)


def dequantize_constant(node, constants) -> np.ndarray:
    """DequantizeLinear of a constant ((q - zp) scale, per tensor or along `axis`), in fp32."""
    q = np.asarray(constants[node.input[0]]).astype(np.float64)
    scale = np.asarray(constants[node.input[1]], np.float32).astype(np.float64).reshape(-1)
    zp = np.asarray(constants[_at(node, 2)]).astype(np.float64).reshape(-1) if _at(node, 2) else np.zeros(1)
    if scale.size > 1 and q.ndim:
        shape = [1] * q.ndim
        shape[int(_attr(node, "axis", 1)) % q.ndim] = -1
        scale, zp = scale.reshape(shape), np.broadcast_to(zp, scale.shape).reshape(shape)
    return ((q - zp) * scale).astype(np.float32)


def run_move(node, feeds: Mapping[str, np.ndarray], opset: int) -> np.ndarray:
    """A byte move (MOVES) on quantized values: the node run by onnx.reference on the values as fp32
    (exact for bytes; its MaxPool does not take int8 and pads integers with NaN) and cast back."""
    data = np.asarray(feeds[node.input[0]])
    as_float = {**feeds, node.input[0]: data.astype(np.float32)}
    out = np.asarray(run_node(node, as_float, opset)[0])
    return out.astype(data.dtype) if np.issubdtype(data.dtype, np.integer) else out


def run(network: QuantizedNetwork, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor of the network computed by the oracle (module docstring), graph inputs from feeds."""
    loaded = network.loaded
    values: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in feeds.items()}
    t = network.tensors

    def value(name):
        if name in values:
            return values[name]
        return np.asarray(loaded.constants[name])

    for node in loaded.model.graph.node:   # constants a float node reads through DequantizeLinear
        if node.op_type == "DequantizeLinear" and node.input[0] in loaded.constants:
            values[node.output[0]] = dequantize_constant(node, loaded.constants)
    for step in network.steps:
        if step.kind == "layer":
            x, y = t[step.inputs[0]], t[step.outputs[0]]
            out = run_layer(step, value(step.inputs[0]), x, y)
            shape = loaded.shape(step.nodes[-1].output[0]) if step.op in ("QLinearConv", "QLinearMatMul", "QGemm") \
                else loaded.shape(next(nd for nd in step.nodes if nd.op_type == step.op).output[0])
            values[step.outputs[0]] = out.reshape(shape) if shape is not None else out
        elif step.kind == "add":
            a, b, y = t[step.inputs[0]], t[step.inputs[1]], t[step.outputs[0]]
            values[step.outputs[0]] = run_add(value(a.name), value(b.name), a, b, y)
        elif step.kind == "gap":
            values[step.outputs[0]] = run_gap(value(step.inputs[0]), t[step.inputs[0]], t[step.outputs[0]])
        elif step.kind == "move":
            main = next(nd for nd in step.nodes if nd.op_type == step.op)
            feeds_now = {main.input[0]: value(step.inputs[0])}
            for name in main.input[1:]:
                if name:
                    feeds_now[name] = value(name)
            values[step.outputs[0]] = run_move(main, feeds_now, loaded.opset)
        elif step.kind == "quantize":
            values[step.outputs[0]] = quantize(value(step.inputs[0]), t[step.outputs[0]])
        elif step.kind == "dequantize":
            values[step.outputs[0]] = dequantize(value(step.inputs[0]), t[step.inputs[0]])
        else:
            node = step.nodes[0]
            feeds_now = {nm: value(nm) for nm in node.input if nm}
            outs = run_node(node, feeds_now, loaded.opset)
            values.update(zip([o for o in node.output if o], (np.asarray(o) for o in outs)))
    return values


def lsb_differences(network: QuantizedNetwork, got: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
                    name: str) -> np.ndarray:
    """|got - expected| of a graph output in steps of its quantization: a quantized output directly, a
    dequantized one divided by the scale of the tensor it dequantizes (else in fp32 units)."""
    g, e = np.asarray(got[name], np.float64), np.asarray(expected[name], np.float64)
    if name in network.tensors:
        return np.abs(g - e)
    source = next((s.inputs[0] for s in network.steps if s.kind == "dequantize" and s.outputs[0] == name), None)
    scale = network.tensors[source].scale if source in network.tensors else 1.0
    return np.abs(g - e) / scale
