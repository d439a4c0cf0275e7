"""The mapped network: per ONNX node, the xfc layer that runs it or the reason it is not covered.

A Layer is one xfc kernel call. It may run several ONNX nodes: its main node (Conv, Gemm,
MatMul) plus what was absorbed into it: a BatchNormalization folded into a conv's weights and
bias, a bias Add after a MatMul, and a Relu or Clip(0, 6) fused into the epilogue. Weights and
bias are stored in the layout the xfc kernel takes (ops.py: OperatorSpec.operand_shapes), fp32.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from ..ops.spec import OperatorSpec
from .load import LoadedModel


@dataclass(frozen=True)
class ConvFeed:
    """conv2d / depthwise: the NCHW activation tensor is xfc's in0 as it is."""

    input_name: str


@dataclass(frozen=True)
class MatmulFeed:
    """matmul: how ONNX operands become xfc's A[batch, M, K] and B[batch, K, N].

    Each operand x is read as: x (swap its last two axes if *_transpose) -> reshape to *_view
    (promotes a 1-D operand to a matrix) -> broadcast to *_broadcast -> reshape to the spec's shape.
    Batch dimensions of A fold into M when B has none, so constant weights are packed once.
    """

    a_name: str
    a_transpose: bool
    a_view: tuple[int, ...]
    a_broadcast: tuple[int, ...]
    b_name: Optional[str]            # None: B is the layer's constant weight
    b_transpose: bool = False
    b_view: tuple[int, ...] = ()
    b_broadcast: tuple[int, ...] = ()


@dataclass(frozen=True, eq=False)
class Layer:
    """A covered node and what it absorbed: one xfc kernel call."""

    name: str                        # the main ONNX node's name
    op_type: str                     # 'Conv', 'Gemm' or 'MatMul'
    fused_ops: tuple[str, ...]       # op types absorbed after the main node, in order
    nodes: tuple[str, ...]           # every ONNX node this layer runs (main first)
    onnx_nodes: tuple                # the same, as onnx.NodeProto (run.py checks the layer against them)
    notes: tuple[str, ...]           # e.g. "BatchNormalization 'bn1' folded into the weights and bias"
    spec: OperatorSpec
    feed: Union[ConvFeed, MatmulFeed]
    output: str                      # the tensor the layer writes (the last absorbed node's output)
    out_shape: tuple[int, ...]       # its ONNX shape
    weight: Optional[np.ndarray]     # fp32, spec.operand_shapes[1]; None when B is not a constant
    bias: np.ndarray                 # fp32, spec.operand_shapes[2] (zeros when there is no bias)
    bias_magnitude: np.ndarray       # float64 magnitude of the bias before the fold's roundings (bounds)
    fold_units: int                  # rounding units that folding may add, in xfc or another runtime
    flops: int                       # FLOPs of every ONNX node the layer runs (coverage.py)
    groups: int = 1                  # > 1: a grouped convolution (mapping.map_network(grouped=True)): spec is one
                                     # group's with batch 1; weight [K, C/groups, R, S] and bias [K] of all groups

    @property
    def label(self) -> str:
        return "+".join((self.op_type, *self.fused_ops))

    @property
    def covered(self) -> bool:
        return True


@dataclass(frozen=True, eq=False)
class Uncovered:
    """A node xfc does not synthesize; --verify runs it with onnx.reference."""

    node: object                     # onnx.NodeProto
    name: str
    op_type: str
    reason: str
    flops: Optional[int]             # None: FLOPs not defined for this op type (coverage.py)

    @property
    def covered(self) -> bool:
        return False


Step = Union[Layer, Uncovered]


@dataclass(frozen=True, eq=False)
class MappedNetwork:
    loaded: LoadedModel
    steps: tuple[Step, ...]          # in the model's (topological) order

    @property
    def layers(self) -> tuple[Layer, ...]:
        return tuple(s for s in self.steps if isinstance(s, Layer))

    @property
    def uncovered(self) -> tuple[Uncovered, ...]:
        return tuple(s for s in self.steps if isinstance(s, Uncovered))

    def distinct_specs(self) -> tuple[OperatorSpec, ...]:
        """Each distinct layer shape once, in order of first use (identical shapes share a kernel)."""
        return tuple(dict.fromkeys(layer.spec for layer in self.layers))
