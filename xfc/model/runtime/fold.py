"""Fold the constant and shape arithmetic exporters write around static shapes.

Exporters (torch.onnx, tf2onnx) compute reshape targets, slice bounds and pad widths at run
time: `Shape -> Gather -> Unsqueeze -> Concat -> Reshape` around a Flatten, `Constant` nodes,
`Cast` of constants, `Identity` of duplicated initializers. With every input shape fixed
(load.py) each of these has one value, so it is computed here, once, and the node leaves the
graph: its outputs become initializers. What is left are the nodes that compute on the
network's activations.

A node is folded when it is a default-domain node whose every input is a constant (an
initializer or a folded output) and its op type is in FOLDABLE, or when it is a `Shape` /
`Size` of a tensor whose shape is static. The values come from onnx.reference run in the
model's opset (nodes.run_node), so their semantics are ONNX's. A fold that fails (a malformed
shape computation) is exit 2 naming the node.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from ...errors import OperatorError
from ..load import LoadedModel
from ..nodes import run_node

# Ops folded when all their inputs are constants: the shape arithmetic of exporters, constant
# casts and copies, and elementwise arithmetic on constants (e.g. a weight scaled by a constant).
FOLDABLE = frozenset({
    "Shape", "Size", "Gather", "GatherElements", "Slice", "Unsqueeze", "Squeeze", "Concat", "Cast", "CastLike",
    "Constant", "ConstantOfShape", "Reshape", "Flatten", "Identity", "Range", "Expand", "Tile", "Transpose",
    "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Floor", "Ceil", "Sqrt", "Reciprocal", "Pow", "Min", "Max",
    "Equal", "Less", "Greater", "Not", "And", "Or", "Where", "ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin",
    "Mod", "Sign", "Split",
})
# Larger outputs stay in the graph (a constant the size of an activation is not shape arithmetic).
MAX_FOLDED_ELEMENTS = 1 << 22


@dataclasses.dataclass(frozen=True)
class FoldResult:
    loaded: LoadedModel           # the model without the folded nodes (their outputs are initializers)
    folded: tuple[str, ...]       # names of the folded nodes, in graph order
    by_op: Mapping[str, int]      # op type -> nodes folded


def _default_domain(node) -> bool:
    return node.domain in ("", "ai.onnx")


def _node_name(node, index: int) -> str:
    return node.name or f"{node.op_type}_{index}"


def _static_shape(loaded: LoadedModel, name: str):
    shape = loaded.shape(name)
    return None if shape is None else tuple(int(d) for d in shape)


def _shape_value(node, shape: tuple[int, ...], opset: int) -> np.ndarray:
    """Shape (with start/end, opset 15) or Size of a tensor of a static shape."""
    if node.op_type == "Size":
        return np.array(int(np.prod(shape, dtype=np.int64)), np.int64)
    from onnx import helper
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    rank = len(shape)
    start, end = int(attrs.get("start", 0)), attrs.get("end")
    end = rank if end is None else int(end)
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = max(0, min(rank, end + rank if end < 0 else end))
    return np.array(shape[start:end], np.int64)


def fold_constants(loaded: LoadedModel) -> FoldResult:
    """The model with its constant and shape subgraphs computed (module docstring)."""
    from onnx import numpy_helper
    model = loaded.model
    constants = dict(loaded.constants)
    kept, folded, by_op = [], [], {}
    for index, node in enumerate(model.graph.node):
        outputs = [o for o in node.output if o]
        value = None
        if not _default_domain(node) or not outputs:
            kept.append(node)
            continue
        if node.op_type in ("Shape", "Size") and node.input and node.input[0] not in constants:
            shape = _static_shape(loaded, node.input[0])
            if shape is not None:
                value = [_shape_value(node, shape, loaded.opset)]
        elif node.op_type in FOLDABLE and all(not n or n in constants for n in node.input):
            try:
                value = run_node(node, {n: constants[n] for n in node.input if n}, loaded.opset)
            except Exception as exc:
                raise OperatorError(f"{loaded.path}: node '{_node_name(node, index)}' ({node.op_type}) computes on "
                                    f"constants but cannot be evaluated: {' '.join(str(exc).split())[:200]}") from None
            if any(np.asarray(v).size > MAX_FOLDED_ELEMENTS for v in value):
                value = None
        if value is None:
            kept.append(node)
            continue
        for name, v in zip(outputs, value):
            constants[name] = np.asarray(v)
        folded.append(_node_name(node, index))
        by_op[node.op_type] = by_op.get(node.op_type, 0) + 1
    if not folded:
        return FoldResult(loaded=loaded, folded=(), by_op={})
    new = type(model)()
    new.CopyFrom(model)
    del new.graph.node[:]
    new.graph.node.extend(kept)
    # Initializers: the original ones plus every folded value a remaining node or output reads.
    present = {t.name for t in new.graph.initializer}
    read = {n for node in kept for n in node.input if n} | {o.name for o in new.graph.output}
    for name in sorted(read - present):
        if name in constants:
            new.graph.initializer.append(numpy_helper.from_array(np.asarray(constants[name]), name))
    shapes = dict(loaded.shapes)
    types = dict(loaded.types)
    for name, value in constants.items():
        shapes[name] = tuple(np.asarray(value).shape)
        types.setdefault(name, _onnx_type(np.asarray(value).dtype))
    result = dataclasses.replace(loaded, model=new, constants=constants, shapes=shapes, types=types)
    return FoldResult(loaded=result, folded=tuple(folded), by_op=dict(sorted(by_op.items())))


def _onnx_type(dtype) -> int:
    from onnx import helper
    try:
        return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    except Exception:
        return 0
