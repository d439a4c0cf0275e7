"""Run one ONNX node with `onnx.reference` (the nodes xfc does not cover, and the error rules).

Each node runs as a one-node model that imports the network's opset, so the operator semantics
are those of the model's opset (Clip's min/max attributes before opset 11, for instance).
Evaluators are cached by the node's serialized form.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Mapping, Sequence

import numpy as np


@lru_cache(maxsize=512)
def _evaluator(node_bytes: bytes, opset: int):
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator
    node = onnx.NodeProto()
    node.ParseFromString(node_bytes)
    inputs = [helper.make_value_info(n, onnx.TypeProto()) for n in dict.fromkeys(node.input) if n]
    outputs = [helper.make_value_info(n, onnx.TypeProto()) for n in node.output if n]
    graph = helper.make_graph([node], "xfc_one_node", inputs, outputs)
    imports = [helper.make_opsetid("", opset)]
    if node.domain not in ("", "ai.onnx"):
        imports.append(helper.make_opsetid(node.domain, 1))
    model = helper.make_model(graph, opset_imports=imports)
    return ReferenceEvaluator(model)


def run_node(node, feeds: Mapping[str, np.ndarray], opset: int) -> list[np.ndarray]:
    """Outputs of `node` (one per non-empty output name) for the given input values."""
    evaluator = _evaluator(node.SerializeToString(), int(opset))
    names = [n for n in dict.fromkeys(node.input) if n]
    return [np.asarray(v) for v in evaluator.run(None, {n: feeds[n] for n in names})]


def variant(node, inputs: Sequence[str] | None = None, **attributes):
    """A copy of node with other input names and/or attributes replaced (same op, same name)."""
    import onnx
    from onnx import helper
    out = onnx.NodeProto()
    out.CopyFrom(node)
    if inputs is not None:
        del out.input[:]
        out.input.extend(inputs)
    for key, value in attributes.items():
        kept = [a for a in out.attribute if a.name != key]
        del out.attribute[:]
        out.attribute.extend(kept)
        if value is not None:
            out.attribute.append(helper.make_attribute(key, value))
    return out
