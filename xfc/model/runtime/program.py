"""The lowered network: every step the C runtime runs, the tensors between them, and the constants.

A Program is what lower.py makes of a mapped network and what the planner (arena.py), the C
renderer (emit.py) and the verification (check.py) read. Every tensor is NCHW (the layout the
kernels read and write) and has a static shape. Its element type is the program's `dtype`
(xfc.ops.dtypes: fp32, or fp16 for `xfc model --dtype fp16`), except at the edges: graph inputs
and outputs are the caller's fp32 buffers, converted by `cast` steps (lower.cast_boundaries) when
the program's dtype is not fp32.

  KernelStep   one xfc layer kernel call (per group and batch item for a grouped convolution):
               spec (the epilogue as fused: bias, residual, activation), the input tensor, the
               weight tensor when B is computed by the network (a MatMul of two activations), the
               residual tensor the kernel adds in its epilogue, the output tensor.
  OpStep       one runtime op (ops.c.j2): an op name, its tensors and its parameters (ints, floats,
               lists of them); constants it reads are named in `constants`.

An int8 program (a quantized model, quantized_program.py) holds bytes between its steps: every
tensor's scale and zero point is in `quantization`; its kernels are xfc's int8 kernels
(KernelStep.quant), quantize and dequantize steps meet the caller's fp32 buffers.

Aliases: a tensor that is another tensor's buffer seen with another shape (Reshape, Flatten,
Squeeze, Unsqueeze, Identity, Dropout) or a contiguous part of it (Split along a leading axis):
`aliases[name] = (root, float offset)`. They cost nothing at run time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Mapping, Optional, Union

import numpy as np

from ...ops.dtypes import FP32, DType


@dataclass(frozen=True, eq=False)
class KernelStep:
    name: str                        # the main ONNX node
    layer: object                    # graph.Layer (weights, bias, fold notes)
    spec: object                     # OperatorSpec with the fused epilogue
    input: str
    output: str
    weight_tensor: Optional[str] = None   # B of a MatMul computed by the network (kernel packs per call)
    residual: Optional[str] = None        # tensor added in the epilogue (copied into the output first if needed)
    groups: int = 1
    batch: int = 1                   # grouped convolution: batch items looped over (spec is batch 1)
    nodes: tuple[str, ...] = ()      # every ONNX node the step runs (main first)
    onnx_nodes: tuple = ()           # the same, as NodeProtos
    fused: tuple[str, ...] = ()      # op types fused into it by the runtime (beyond mapping.py's)
    kind: str = "kernel"
    quant: Optional[object] = None   # int8: the kernel's QuantParams (zero points and clamp are compiled in)

    @property
    def kernel_key(self):
        """What makes two steps call the same kernel: the spec (fp32, fp16), with the quantization (int8)."""
        return self.spec if self.quant is None else (self.spec, self.quant)

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(t for t in (self.input, self.weight_tensor, self.residual) if t)

    @property
    def outputs(self) -> tuple[str, ...]:
        return (self.output,)

    @property
    def label(self) -> str:
        return "+".join((self.layer.op_type, *self.layer.fused_ops, *self.fused))


@dataclass(frozen=True, eq=False)
class OpStep:
    op: str                          # runtime op (ops.c.j2)
    name: str                        # the ONNX node (or the node a materialization serves)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: Mapping = field(default_factory=dict)
    constants: tuple[str, ...] = ()  # constant tensors the op reads (Program.constants)
    inplace: bool = False            # output 0 may share input 0's buffer (elementwise on its last reader)
    nodes: tuple[str, ...] = ()
    onnx_nodes: tuple = ()
    kind: str = "op"

    @property
    def label(self) -> str:
        return self.op


Step = Union[KernelStep, OpStep]


@dataclass(frozen=True, eq=False)
class Program:
    name: str                                        # the model's C identifier stem
    shapes: Mapping[str, tuple[int, ...]]            # every run-time tensor (inputs, outputs, intermediates)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    steps: tuple[Step, ...]
    aliases: Mapping[str, tuple[str, int]]           # tensor -> (root tensor, float offset)
    constants: Mapping[str, np.ndarray]              # fp32 constants runtime ops read
    folded: tuple[str, ...] = ()                     # nodes folded at load (fold.py)
    notes: tuple[str, ...] = ()                      # what lowering did (fusions, materializations)
    dtype: DType = FP32                              # element type of every tensor between two steps
    quantization: Mapping[str, object] = field(default_factory=dict)   # int8: tensor -> its QTensor

    def floats(self, tensor: str) -> int:
        """Elements of the tensor (floats of an fp32 program; the name predates other dtypes)."""
        return prod(self.shapes[tensor])

    def element_type(self, tensor: str) -> DType:
        """fp32 for the caller's buffers (graph inputs and outputs, and their aliases), else the dtype."""
        root = self.root(tensor)[0]
        return FP32 if root in self.inputs or root in self.outputs else self.dtype

    def root(self, tensor: str) -> tuple[str, int]:
        """The tensor whose buffer holds `tensor`, and the float offset in it."""
        offset = 0
        while tensor in self.aliases:
            tensor, more = self.aliases[tensor]
            offset += more
        return tensor, offset

    @property
    def kernel_steps(self) -> tuple[KernelStep, ...]:
        return tuple(s for s in self.steps if isinstance(s, KernelStep))

    def distinct_specs(self) -> tuple:
        return tuple(dict.fromkeys(s.spec for s in self.kernel_steps))

    def distinct_kernels(self) -> tuple:
        """Kernel keys (KernelStep.kernel_key) in order of first use: one C function each."""
        return tuple(dict.fromkeys(s.kernel_key for s in self.kernel_steps))

    @property
    def activation_type(self) -> str:
        """int8 programs: 'uint8' or 'int8', the type of every quantized tensor (lower_quantized refuses a mix)."""
        types = {q.act_type for q in self.quantization.values()}
        return types.pop() if len(types) == 1 else ""


def spec_of(key):
    """The OperatorSpec of a kernel key (KernelStep.kernel_key: a spec, or (spec, quantization))."""
    return key[0] if isinstance(key, tuple) else key
