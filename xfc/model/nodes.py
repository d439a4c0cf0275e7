"""Run one ONNX node with `onnx.reference` (the nodes xfc does not cover, and the error rules).

Each node runs as a one-node model that imports the network's opset, so the operator semantics
are those of the model's opset (Clip's min/max attributes before opset 11, for instance).
Evaluators are cached by the node's serialized form.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Mapping, Optional, Sequence

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


def max_pool_2d(node, x: np.ndarray) -> Optional[np.ndarray]:
    """MaxPool of an N x C x H x W float tensor as the operator defines it: kernel_shape, strides,
    dilations, pads [top, left, bottom, right] or auto_pad, ceil_mode (a window that would start in
    the bottom or right padding is dropped; with VALID the last one may reach past the image, as
    onnxruntime has it); padding never wins. Written out here because onnx.reference 1.23 gets some
    asymmetric pads wrong: a 13 x 11 plane, kernel 5 x 4, pads [2, 1, 2, 2] came out 12 x 12, where
    the operator (and onnxruntime) give 13 x 11."""
    from .onnx_nodes import attr, conv_geometry, pool_extent
    kernel = tuple(int(k) for k in attr(node, "kernel_shape", ()))
    sizes = x.shape[2:]
    strides, pads, dilations = conv_geometry(node, sizes, kernel)
    ceil_mode = int(attr(node, "ceil_mode", 0))
    outs = [pool_extent(sizes[a], kernel[a], strides[a], dilations[a], pads[a], pads[a + 2], ceil_mode) for a in range(2)]
    if min(outs) < 1:
        return None   # no window fits: left to onnx.reference (and its error)
    y = np.full(x.shape[:2] + tuple(outs), -np.inf, dtype=np.float64)
    for i in range(kernel[0]):
        rows = np.arange(outs[0]) * strides[0] - pads[0] + i * dilations[0]
        for j in range(kernel[1]):
            cols = np.arange(outs[1]) * strides[1] - pads[1] + j * dilations[1]
            r_ok, c_ok = (rows >= 0) & (rows < sizes[0]), (cols >= 0) & (cols < sizes[1])
            taps = np.full(y.shape, -np.inf)
            taps[:, :, r_ok[:, None] & c_ok[None, :]] = x[:, :, rows[r_ok]][:, :, :, cols[c_ok]].reshape(
                x.shape[:2] + (-1,))
            y = np.maximum(y, taps)
    return y.astype(x.dtype)


def run_node(node, feeds: Mapping[str, np.ndarray], opset: int) -> list[np.ndarray]:
    """Outputs of `node` (one per non-empty output name) for the given input values."""
    if node.op_type == "MaxPool" and len([o for o in node.output if o]) == 1:
        x = np.asarray(feeds[node.input[0]])
        from .onnx_nodes import attr
        if x.ndim == 4 and np.issubdtype(x.dtype, np.floating) and int(attr(node, "storage_order", 0)) == 0:
            y = max_pool_2d(node, x)
            if y is not None:
                return [y]
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
