"""Reading ONNX nodes: an attribute, a convolution's geometry, which nodes read each tensor (the
float mapping, mapping.py, and the quantized reading, quantized.py, share them)."""
from __future__ import annotations

from math import ceil

from onnx import helper


def attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def pool_extent(size: int, kernel: int, stride: int, dilation: int, pad_begin: int, pad_end: int,
                ceil_mode: int) -> int:
    """Output extent of a pooling window along one axis as the operator defines it: floor, or with
    ceil_mode ceil, where a window that would start in the end padding is dropped (ONNX's shape
    inference before opset 22 keeps it: xfc/model/load.py)."""
    span = size + pad_begin + pad_end - (kernel - 1) * dilation - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    return out - 1 if ceil_mode and (out - 1) * stride >= size + pad_begin else out


def readers_of(nodes) -> dict[str, list[int]]:
    """Tensor name -> indexes of the nodes reading it (each node once per tensor)."""
    readers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for name in dict.fromkeys(n.input):
            if name:
                readers.setdefault(name, []).append(i)
    return readers


def conv_geometry(node, image: tuple[int, int], kernel: tuple[int, int]) -> tuple[tuple, tuple, tuple]:
    """(strides, pads (top, left, bottom, right), dilations) of a 2-D Conv / QLinearConv node; auto_pad
    SAME_UPPER / SAME_LOWER / VALID resolved for the image."""
    strides = tuple(attr(node, "strides", (1, 1)))
    dilations = tuple(attr(node, "dilations", (1, 1)))
    auto_pad = attr(node, "auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for size, k, s, d in zip(image, kernel, strides, dilations):
            total = max(0, (ceil(size / s) - 1) * s + (k - 1) * d + 1 - size)
            small, large = total // 2, total - total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else large)
            end.append(large if auto_pad == "SAME_UPPER" else small)
        return strides, (begin[0], begin[1], end[0], end[1]), dilations
    if auto_pad == "VALID":
        return strides, (0, 0, 0, 0), dilations
    return strides, tuple(attr(node, "pads", (0, 0, 0, 0))), dilations
