"""The int8 Program of a quantized model (issue 33): xfc.model.quantized's steps as runtime steps.

    quantized.recognise (QDQ or QOperator, checked) -> one step per QStep -> graph outputs in the
    caller's buffers -> Program (dtype int8: one byte per element between two steps)

  quantize    -> op 'quantize': a graph input (the caller's fp32) into bytes, y = sat(rint(x / s) + zp)
  layer       -> a KernelStep of xfc's int8 kernel: zero points and the ReLU / ReLU6 clamp compiled in
                 (KernelStep.quant), the int32 bias and the fp32 multipliers fp32(x_scale w_scale[o]) /
                 y_scale (quantized.layer_multipliers) in the weights file's constants
  add         -> op 'qadd': sat(rint(ra (a - za) + rb (b - zb)) + zy), fp32 without contraction
  gap         -> op 'qgap': sat(rint(fp32(sum - N zx) m) + zy)
  move        -> MaxPool: op 'qmaxpool' on the bytes; Flatten, Reshape, Squeeze, Unsqueeze, Identity:
                 aliases (no step)
  dequantize  -> op 'dequantize': into the caller's fp32 output, (q - zp) s

Each op computes what quantized.run computes for its step, in the same fp32 operations, so every
step is byte-exact against the oracle (check.verify_int8_program). Refused, in one line naming
the nodes: a node the model runs in fp32 between its quantized steps (the runtime's int8 programs
hold bytes only), a mix of uint8 and int8 activations, a broadcasting quantized Add, a graph output
that is not dequantized, a graph input that is not quantized first.
"""
from __future__ import annotations

import dataclasses
from math import prod
from typing import Optional

import numpy as np

from ...errors import OperatorError
from ...ops.dtypes import INT8
from ...ops.quant import NARROW_WEIGHT_MAX, TYPE_RANGE, QuantParams
from ..load import LoadedModel
from ..nodes import run_node
from ..quantized import (QuantizedNetwork, QStep, add_ratios, gap_multiplier, layer_multipliers, layer_quant,
                         recognise)
from .lower import _Unsupported, pool_params, route_outputs
from .program import KernelStep, OpStep, Program

ALIAS_MOVES = ("Flatten", "Reshape", "Squeeze", "Unsqueeze", "Identity")


@dataclasses.dataclass(frozen=True, eq=False)
class Int8Layer:
    """What a KernelStep of an int8 program reads beside its spec: the layer's constants."""

    op_type: str                     # the main node (Conv, QLinearConv, Gemm, ...)
    weight: np.ndarray               # int8, the kernel's layout (conv [K,C,R,S], depthwise [C,1,R,S], matmul [K,N])
    bias: np.ndarray                 # int32 per output channel (zeros when the model has none)
    multipliers: np.ndarray          # fp32 per output channel
    fused_ops: tuple[str, ...] = ()  # the clamp (Relu / Clip) folded into the requantization
    notes: tuple[str, ...] = ()
    qstep: Optional[QStep] = None    # the quantized network's step (the oracle's layer)


@dataclasses.dataclass(frozen=True)
class QuantizedLowered:
    program: Program
    network: QuantizedNetwork        # the oracle's view (xfc.model.quantized)
    original: LoadedModel            # as loaded: what onnxruntime runs


def kernel_quant(step: QStep, network: QuantizedNetwork) -> QuantParams:
    """The QuantParams an int8 kernel is planned and compiled with (its multipliers are run-time data)."""
    quant = layer_quant(network.tensors[step.inputs[0]], network.tensors[step.outputs[0]])
    weight = step.weight
    if weight is not None and weight.size and int(np.abs(weight.astype(np.int16)).max()) <= NARROW_WEIGHT_MAX:
        quant = dataclasses.replace(quant, narrow_weights=True)   # reduce_range weights: x86 kernels may sum pairs in int16
    return quant


def _f32(value) -> float:
    return float(np.float32(value))


class _Lowering:
    def __init__(self, network: QuantizedNetwork):
        self.network = network
        self.loaded = network.loaded
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.aliases: dict[str, tuple[str, int]] = {}
        self.steps: list = []
        self.refused: list[str] = []
        self.graph_inputs = {n for n, _shape, _elem in network.loaded.inputs}
        self.graph_outputs = set(network.loaded.outputs)

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self.shapes:
            shape = self.network.shape(name)
            if shape is None:
                raise OperatorError(f"{self.loaded.path}: the shape of '{name}' is not static (fix the input shapes: "
                                    f"--input-shape on the command line, input_shapes= in Python)")
            self.shapes[name] = shape
        return self.shapes[name]

    def op(self, op: str, step: QStep, inputs, outputs, params, inplace=False):
        for t in (*inputs, *outputs):
            self.shape(t)
        self.steps.append(OpStep(op=op, name=step.name, inputs=tuple(inputs), outputs=tuple(outputs),
                                 params=params, inplace=inplace, nodes=tuple(n.name for n in step.nodes),
                                 onnx_nodes=tuple(step.nodes)))

    def run(self) -> None:
        t = self.network.tensors
        for step in self.network.steps:
            x = step.inputs[0] if step.inputs else None
            y = step.outputs[0]
            if step.kind == "layer":
                self.layer(step)
            elif step.kind == "quantize":
                if x not in self.graph_inputs:      # a dequantize -> quantize pair inside: a requantization
                    self.refused.append(f"'{step.name}' (QuantizeLinear of '{x}', a value computed in fp32 inside "
                                        f"the network)")
                    continue
                q = t[y]
                lo, hi = TYPE_RANGE[q.act_type]
                self.op("quantize", step, [x], [y], dict(scale=_f32(q.scale), zero_point=q.zero_point, lo=lo, hi=hi))
            elif step.kind == "dequantize":
                if y not in self.graph_outputs:     # fp32 inside the network: the program holds bytes only
                    self.refused.append(f"'{step.name}' (DequantizeLinear into '{y}', which the network reads in "
                                        f"fp32)")
                    continue
                q = t[x]
                self.op("dequantize", step, [x], [y], dict(scale=_f32(q.scale), zero_point=q.zero_point))
            elif step.kind == "add":
                a, b, q = t[step.inputs[0]], t[step.inputs[1]], t[y]
                if self.shape(a.name) != self.shape(b.name):
                    self.refused.append(f"'{step.name}' ({step.op}: broadcasting {self.shape(a.name)} + "
                                        f"{self.shape(b.name)})")
                    continue
                lo, hi = TYPE_RANGE[q.act_type]
                ra, rb = add_ratios(a, b, q)
                self.op("qadd", step, [a.name, b.name], [y],
                        dict(ra=_f32(ra), rb=_f32(rb), za=a.zero_point,
                             zb=b.zero_point, zy=q.zero_point, lo=lo, hi=hi, n=prod(self.shape(a.name))),
                        inplace=True)
            elif step.kind == "gap":
                xq, q = t[x], t[y]
                shape = self.shape(x)
                count = prod(shape[2:])
                lo, hi = TYPE_RANGE[q.act_type]
                mult = gap_multiplier(xq, q, count)
                self.shapes[y] = (*shape[:2], *([1] * (len(shape) - 2)))
                self.op("qgap", step, [x], [y], dict(outer=shape[0] * shape[1], inner=count, zx=xq.zero_point,
                                                     mult=_f32(mult), zy=q.zero_point, lo=lo, hi=hi))
            elif step.kind == "move" and step.op in ALIAS_MOVES:
                self.shape(x)
                self.shapes[y] = self._move_shape(step)
                self.aliases[y] = (x, 0)
            elif step.kind == "move" and step.op == "MaxPool":
                main = next(n for n in step.nodes if n.op_type == "MaxPool")
                if len([o for o in main.output if o]) > 1:
                    self.refused.append(f"'{step.name}' (MaxPool returning indices)")
                    continue
                try:
                    params = pool_params(main, self.shape(x), self._move_shape(step))
                except _Unsupported as why:
                    self.refused.append(f"'{step.name}' (MaxPool: {why})")
                    continue
                self.shapes[y] = self._move_shape(step)
                self.op("qmaxpool", step, [x], [y], params)
            else:
                self.refused.append(f"'{step.name}' ({step.op}{', in fp32' if step.kind == 'float' else ''})")

    def _move_shape(self, step: QStep) -> tuple[int, ...]:
        y = step.outputs[0]
        shape = self.network.shape(y)
        if shape is None:     # after a com.microsoft node: the node itself run on zeros
            main = next(n for n in step.nodes if n.op_type == step.op)
            feeds = {main.input[0]: np.zeros(self.shape(step.inputs[0]), np.float32)}
            feeds.update({n: np.asarray(self.loaded.constants[n]) for n in main.input[1:] if n})
            try:
                shape = np.shape(run_node(main, feeds, self.loaded.opset)[0])
            except Exception as exc:   # noqa: BLE001 - onnx.reference's errors are of every kind
                raise OperatorError(f"{self.loaded.path}: node '{step.name}' ({step.op}): cannot infer its output "
                                    f"shape ({' '.join(str(exc).split())[:160]})") from None
        return tuple(int(d) for d in shape)

    def layer(self, step: QStep) -> None:
        x, y = self.network.tensors[step.inputs[0]], self.network.tensors[step.outputs[0]]
        spec = step.spec
        act = spec.epilogue.activation
        layer = Int8Layer(op_type=step.op, weight=np.ascontiguousarray(step.weight, np.int8),
                          bias=np.ascontiguousarray(step.bias, np.int32),
                          multipliers=np.ascontiguousarray(layer_multipliers(x, step.w_scales, y), np.float32),
                          fused_ops=(act.capitalize(),) if act in ("relu", "relu6") else (), qstep=step)
        x_shape = self.shape(x.name)
        out_shape = self.network.shape(y.name)
        if out_shape is None:
            out_shape = tuple(spec.output_shape) if spec.name != "matmul" else (*x_shape[:-1], step.weight.shape[1])
        self.shapes[y.name] = tuple(out_shape)
        self.steps.append(KernelStep(name=step.name, layer=layer, spec=spec, input=x.name, output=y.name,
                                     nodes=tuple(n.name for n in step.nodes), onnx_nodes=tuple(step.nodes),
                                     quant=kernel_quant(step, self.network)))


def lower_quantized(loaded: LoadedModel, name: str, network: Optional[QuantizedNetwork] = None) -> QuantizedLowered:
    """The int8 program of a quantized model (module docstring); OperatorError (one line) for what it cannot run."""
    network = network or recognise(loaded)
    if network is None:
        raise OperatorError(f"{loaded.path}: not a quantized model (no QuantizeLinear or QLinear node)")
    types = sorted({q.act_type for q in network.tensors.values()})
    if len(types) > 1:
        raise OperatorError(f"{loaded.path}: activations of both types ({', '.join(types)}): xfc's int8 networks "
                            f"hold one activation type")
    lowering = _Lowering(network)
    lowering.run()
    outputs = list(loaded.outputs)
    written_fp32 = {s.outputs[0] for s in lowering.steps if isinstance(s, OpStep) and s.op == "dequantize"}
    for out in outputs:
        root = out
        while root in lowering.aliases:
            root = lowering.aliases[root][0]
        if root not in written_fp32:
            lowering.refused.append(f"graph output '{out}' (not dequantized: the C API returns fp32)")
    inputs = [n for n, _shape, _elem in loaded.inputs]
    for x in inputs:
        readers = [s for s in lowering.steps if x in s.inputs]
        if any(not (isinstance(s, OpStep) and s.op == "quantize") for s in readers):
            lowering.refused.append(f"graph input '{x}' (read by something other than a QuantizeLinear)")
    if lowering.refused:
        more = f" and {len(lowering.refused) - 8} more" if len(lowering.refused) > 8 else ""
        raise OperatorError(f"{loaded.path}: an int8 model ({network.describe()}): the int8 runtime runs networks "
                            f"whose nodes are all int8 between a quantize and a dequantize; it cannot run "
                            f"{', '.join(lowering.refused[:8])}{more}")
    for x in inputs:
        lowering.shape(x)
    for out in outputs:
        lowering.shape(out)
    quantization = {t: q for t, q in network.tensors.items() if t in lowering.shapes}
    program = Program(name=name, shapes=dict(lowering.shapes), inputs=tuple(inputs), outputs=tuple(outputs),
                      steps=tuple(lowering.steps), aliases=dict(lowering.aliases), constants={},
                      notes=(f"int8 ({types[0]} activations) between every two steps: {network.describe()}",),
                      dtype=INT8, quantization=quantization)
    return QuantizedLowered(program=route_outputs(program), network=network, original=loaded)
