"""FLOPs per ONNX node and how much of a network xfc covers.

FLOPs count floating-point additions and multiplications, a multiply-add as 2, as xfc's
OperatorSpec.flops does: Conv 2*out*(C/group)*kh*kw, ConvTranspose likewise per input element,
Gemm 2*M*N*K, MatMul 2*out*K (bias adds of these are not counted, like xfc's specs);
Add/Sub/Mul/Div one per output element (Sum: inputs-1 per element); BatchNormalization 2 per
element; AveragePool kernel-size adds per output; GlobalAveragePool/ReduceMean/ReduceSum one per
input element. Ops that do no arithmetic (Relu, Clip, MaxPool, data movement) count 0. Other
ops have no FLOP count here (None): they are listed as not counted, never guessed.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Callable, Optional

from onnx import helper

ZERO_FLOP_OPS = frozenset({
    "Relu", "Clip", "MaxPool", "GlobalMaxPool", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose",
    "Concat", "Identity", "Dropout", "Shape", "Size", "Gather", "Slice", "Constant", "ConstantOfShape", "Pad",
    "Split", "Expand", "Cast", "Tile", "Abs", "Neg", "DepthToSpace", "SpaceToDepth",
})
ELEMENTWISE_OPS = frozenset({"Add", "Sub", "Mul", "Div"})


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def node_flops(node, shape: Callable[[str], Optional[tuple[int, ...]]]) -> Optional[int]:
    """FLOPs of one node (see the module docstring); None when undefined or a shape is unknown."""
    op = node.op_type
    if node.domain not in ("", "ai.onnx"):
        return None
    if op in ZERO_FLOP_OPS:
        return 0
    ins = [shape(n) if n else None for n in node.input]
    out = shape(node.output[0]) if node.output and node.output[0] else None
    if op == "Conv":
        w = ins[1] if len(ins) > 1 else None
        return None if out is None or w is None else 2 * prod(out) * prod(w[1:])
    if op == "ConvTranspose":
        x, w = ins[0], ins[1] if len(ins) > 1 else None
        return None if x is None or w is None else 2 * prod(x) * prod(w[1:])
    if op == "Gemm":
        a = ins[0]
        if out is None or a is None or len(a) != 2:
            return None
        k = a[0] if _attr(node, "transA", 0) else a[1]
        return 2 * prod(out) * k
    if op == "MatMul":
        a = ins[0]
        return None if out is None or a is None else 2 * prod(out) * a[-1]
    if op in ELEMENTWISE_OPS:
        return None if out is None else prod(out)
    if op == "Sum":
        return None if out is None else (len(node.input) - 1) * prod(out)
    if op == "BatchNormalization":
        return None if out is None else 2 * prod(out)
    if op == "AveragePool":
        kernel = _attr(node, "kernel_shape")
        return None if out is None or not kernel else prod(out) * prod(kernel)
    if op in ("GlobalAveragePool", "ReduceMean", "ReduceSum"):
        return None if ins[0] is None else prod(ins[0])
    return None


@dataclass(frozen=True)
class UncoveredGroup:
    op_type: str
    count: int
    flops: int                       # of the nodes whose FLOPs are defined
    reasons: tuple[str, ...]         # distinct reasons, in order of first appearance
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Coverage:
    total_flops: int
    covered_flops: int
    layers: int                      # covered layers (kernel calls)
    distinct_layers: int             # distinct layer shapes (kernels synthesized)
    nodes: int                       # ONNX nodes mapped (Constant nodes, Casts of constants are folded at load)
    covered_nodes: int
    uncovered: tuple[UncoveredGroup, ...]
    not_counted_ops: tuple[str, ...]   # op types whose FLOPs are undefined here

    @property
    def covered_share(self) -> float:
        return self.covered_flops / self.total_flops if self.total_flops else 0.0


def coverage(net) -> Coverage:
    """Coverage summary of a MappedNetwork."""
    layers, uncovered = net.layers, net.uncovered
    groups: dict[str, list] = {}
    for u in uncovered:
        groups.setdefault(u.op_type, []).append(u)
    grouped = tuple(
        UncoveredGroup(op_type=op, count=len(items), flops=sum(u.flops or 0 for u in items),
                       reasons=tuple(dict.fromkeys(u.reason for u in items)), nodes=tuple(u.name for u in items))
        for op, items in sorted(groups.items(), key=lambda kv: (-sum(u.flops or 0 for u in kv[1]), kv[0])))
    covered = sum(layer.flops for layer in layers)
    total = covered + sum(u.flops or 0 for u in uncovered)
    return Coverage(total_flops=total, covered_flops=covered, layers=len(layers),
                    distinct_layers=len(net.distinct_specs()),
                    nodes=sum(len(layer.nodes) for layer in layers) + len(uncovered),
                    covered_nodes=sum(len(layer.nodes) for layer in layers), uncovered=grouped,
                    not_counted_ops=tuple(sorted({u.op_type for u in uncovered if u.flops is None})))


MAPPED_OPS = ("Conv", "Gemm", "MatMul")   # the ONNX ops mapping.py can turn into xfc kernels


def nothing_covered(cov: Coverage) -> str:
    """Why a network with no covered layer has none, in one phrase: its op types, and why its
    Conv / Gemm / MatMul nodes (if any) were not mapped."""
    ops = ", ".join(g.op_type for g in cov.uncovered) or "none"
    why = "; ".join(f"{g.op_type}: {g.reasons[0]}" for g in cov.uncovered if g.op_type in MAPPED_OPS and g.reasons)
    return (f"none of the model's {cov.nodes} node{'s' if cov.nodes != 1 else ''} maps to an xfc kernel: op types "
            f"{ops}" + (f" ({why})" if why else "") + f"; xfc maps {', '.join(MAPPED_OPS[:-1])} and {MAPPED_OPS[-1]}")
