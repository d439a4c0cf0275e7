"""Small ONNX networks with random weights for the `xfc model` tests (built with onnx.helper).

Each builder returns an onnx.ModelProto; weights come from a seeded generator, so a builder
called twice gives the same model. Shapes are small (a few channels, spatial sizes around 10,
odd where possible) so that kernels build and run in seconds and tails are ragged.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class Builder:
    """Collects nodes and initializers; names tensors t0, t1, ... unless told."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.count = 0

    def name(self, prefix: str = "t") -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def const(self, array, prefix: str = "w") -> str:
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def rand(self, *shape, scale: float = 1.0) -> np.ndarray:
        return (self.rng.uniform(-1.0, 1.0, size=shape) * scale).astype(np.float32)

    def node(self, op: str, inputs, name: str | None = None, outputs: int = 1, **attrs):
        outs = [self.name() for _ in range(outputs)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=name or self.name(op.lower()), **attrs))
        return outs[0] if outputs == 1 else outs

    def conv(self, x: str, c_in: int, c_out: int, k: int = 3, stride: int = 1, pad: int = 1, group: int = 1,
             bias: bool = True, name: str | None = None) -> str:
        fan_in = c_in // group * k * k
        w = self.const(self.rand(c_out, c_in // group, k, k, scale=1.0 / np.sqrt(fan_in)))
        inputs = [x, w] + ([self.const(self.rand(c_out, scale=0.1), "b")] if bias else [])
        return self.node("Conv", inputs, name=name, kernel_shape=[k, k], strides=[stride, stride],
                         pads=[pad] * 4, group=group)

    def bn(self, x: str, c: int, name: str | None = None) -> str:
        scale = self.const((1.0 + 0.5 * self.rand(c)).astype(np.float32), "bn_s")
        shift = self.const(self.rand(c, scale=0.2), "bn_b")
        mean = self.const(self.rand(c, scale=0.3), "bn_m")
        var = self.const((1.0 + 0.5 * np.abs(self.rand(c))).astype(np.float32), "bn_v")
        return self.node("BatchNormalization", [x, scale, shift, mean, var], name=name, epsilon=1e-5)

    def relu6(self, x: str, name: str | None = None, bounds: tuple[str, str] | None = None) -> str:
        """Clip(0, 6); `bounds` reuses existing min/max constants (exporters often share them)."""
        lo, hi = bounds or (self.const(np.float32(0.0), "lo"), self.const(np.float32(6.0), "hi"))
        return self.node("Clip", [x, lo, hi], name=name)

    def model(self, inputs: dict, outputs: list[str], opset: int = OPSET) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, "xfc_test",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8
        # Graph outputs need a shape (the checker says so): take the inferred one.
        inferred = onnx.shape_inference.infer_shapes(model)
        del model.graph.output[:]
        model.graph.output.extend(inferred.graph.output)
        onnx.checker.check_model(model)
        return model


def mobilenet_block(b: Builder, x: str, c: int, expand: int, c_out: int, stride: int = 1,
                    prefix: str = "mb") -> str:
    """Pointwise (relu6), depthwise 3x3 (relu6), pointwise linear, residual add when shapes allow."""
    hidden = c * expand
    t = b.relu6(b.conv(x, c, hidden, k=1, pad=0, name=f"{prefix}_expand"), name=f"{prefix}_relu6a")
    t = b.relu6(b.conv(t, hidden, hidden, k=3, stride=stride, pad=1, group=hidden, name=f"{prefix}_dw"),
                name=f"{prefix}_relu6b")
    t = b.conv(t, hidden, c_out, k=1, pad=0, name=f"{prefix}_project")
    if stride == 1 and c == c_out:
        t = b.node("Add", [x, t], name=f"{prefix}_add")
    return t


def mobilenet_net(blocks: int = 2, c: int = 8, hw: int = 10, seed: int = 0, batch: int = 1) -> onnx.ModelProto:
    """A stem conv (stride 2, relu6), `blocks` identical MobileNetV2 blocks, global pool, classifier Gemm."""
    b = Builder(seed)
    t = b.relu6(b.conv("x", 3, c, k=3, stride=2, pad=1, name="stem"), name="stem_relu6")
    for i in range(blocks):
        t = mobilenet_block(b, t, c, 4, c, prefix=f"mb{i}")
    t = mobilenet_block(b, t, c, 4, 2 * c, stride=2, prefix=f"mb{blocks}")
    t = b.node("GlobalAveragePool", [t], name="pool")
    t = b.node("Flatten", [t], name="flatten", axis=1)
    y = b.node("Gemm", [t, b.const(b.rand(10, 2 * c, scale=0.3)), b.const(b.rand(10, scale=0.1), "b")],
               name="classifier", transB=1)
    return b.model({"x": [batch, 3, hw, hw]}, [y])


def resnet_block(b: Builder, x: str, c: int, c_out: int, stride: int = 1, prefix: str = "rb") -> str:
    """Conv-BN-Relu, Conv-BN, shortcut (1x1 conv-BN when the shape changes), Add, Relu."""
    t = b.node("Relu", [b.bn(b.conv(x, c, c_out, stride=stride, bias=False, name=f"{prefix}_conv1"), c_out,
                             name=f"{prefix}_bn1")], name=f"{prefix}_relu1")
    t = b.bn(b.conv(t, c_out, c_out, bias=False, name=f"{prefix}_conv2"), c_out, name=f"{prefix}_bn2")
    short = x
    if stride != 1 or c != c_out:
        short = b.bn(b.conv(x, c, c_out, k=1, stride=stride, pad=0, bias=False, name=f"{prefix}_down"), c_out,
                     name=f"{prefix}_bn_down")
    return b.node("Relu", [b.node("Add", [t, short], name=f"{prefix}_add")], name=f"{prefix}_relu2")


def resnet_net(blocks: int = 2, c: int = 8, hw: int = 11, seed: int = 1, batch: int = 1) -> onnx.ModelProto:
    """Stem conv-BN-relu, max pool, `blocks` basic blocks, a strided block, pool, classifier."""
    b = Builder(seed)
    t = b.node("Relu", [b.bn(b.conv("x", 3, c, k=3, stride=1, pad=1, bias=False, name="stem"), c, name="stem_bn")],
               name="stem_relu")
    t = b.node("MaxPool", [t], name="maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    for i in range(blocks):
        t = resnet_block(b, t, c, c, prefix=f"rb{i}")
    t = resnet_block(b, t, c, 2 * c, stride=2, prefix=f"rb{blocks}")
    t = b.node("GlobalAveragePool", [t], name="pool")
    t = b.node("Flatten", [t], name="flatten", axis=1)
    y = b.node("Gemm", [t, b.const(b.rand(2 * c, 10, scale=0.3)), b.const(b.rand(10, scale=0.1), "b")],
               name="fc")
    return b.model({"x": [batch, 3, hw, hw]}, [y])


def mlp_net(seed: int = 2) -> onnx.ModelProto:
    """Two Gemm layers (transA/transB, alpha/beta, bias [1, N] and scalar) and a MatMul + Add bias + Relu."""
    b = Builder(seed)
    # x is stored transposed: [features, batch] -> Gemm transA=1.
    t = b.node("Gemm", ["x", b.const(b.rand(24, 19, scale=0.3)), b.const(b.rand(1, 24, scale=0.1), "b")],
               name="fc1", transA=1, transB=1, alpha=0.5, beta=2.0)
    t = b.node("Relu", [t], name="relu1")
    t = b.node("Gemm", [t, b.const(b.rand(24, 13, scale=0.3)), b.const(np.float32(0.25), "b")], name="fc2",
               alpha=1.0, beta=1.0)
    t = b.relu6(t, name="clip2")
    t = b.node("MatMul", [t, b.const(b.rand(13, 7, scale=0.3))], name="fc3")
    t = b.node("Add", [t, b.const(b.rand(7, scale=0.1), "b")], name="fc3_bias")
    y = b.node("Relu", [t], name="relu3")
    return b.model({"x": [19, 5]}, [y])


def odd_net(seed: int = 3) -> onnx.ModelProto:
    """The cases that must not fuse or are not covered, and MatMul feeding variants.

    Two Clip(0, 6) nodes share their min/max constants; the first (after an Add) is not fused,
    the second is fused into c3.

    c1 (Conv) is also a graph output, so the Relu after it is not fused; c2 is read by a Relu and
    an Add, so neither fuses; a grouped conv (group 2) and a depthwise conv with channel
    multiplier 2 are not covered; MatMul with a constant 2-D B (batch dims fold into M), with a
    constant batched B that broadcasts A, and between two activations (B not constant).
    """
    b = Builder(seed)
    c1 = b.conv("x", 4, 6, name="c1")
    r1 = b.node("Relu", [c1], name="r1")
    c2 = b.conv(r1, 6, 6, k=1, pad=0, name="c2")
    a = b.node("Relu", [c2], name="r2")
    twice = b.node("Add", [c2, c2], name="twice")
    shared = (b.const(np.float32(0.0), "lo"), b.const(np.float32(6.0), "hi"))
    twice = b.relu6(twice, name="clip_twice", bounds=shared)      # not fused: follows an Add
    g = b.conv(a, 6, 6, group=2, name="grouped")
    mult = b.conv(twice, 6, 12, group=6, name="dw_mult2")
    mult = b.relu6(b.conv(mult, 12, 6, k=1, pad=0, name="c3"), name="clip_c3", bounds=shared)  # fused
    s = b.node("Add", [g, mult], name="sum")
    flat = b.node("Reshape", [s, b.const(np.array([1, 6, 49], np.int64), "shape")], name="flat")
    t = b.node("MatMul", [flat, b.const(b.rand(49, 5, scale=0.2))], name="mm_fold")
    bt = b.node("MatMul", [t, b.const(b.rand(3, 5, 4, scale=0.5))], name="mm_batch")
    tt = b.node("Transpose", [t], name="tr", perm=[0, 2, 1])
    gram = b.node("MatMul", [t, tt], name="mm_dynamic")
    return b.model({"x": [1, 4, 7, 7]}, [c1, bt, gram])


def clip_attr_net(seed: int = 4) -> onnx.ModelProto:
    """Opset 9: Clip takes min/max as attributes; Clip(0, 6) and Clip(0, max) fuse, Clip(-1, 1) does not."""
    b = Builder(seed)
    t = b.node("Clip", [b.conv("x", 3, 4, name="a")], name="clip06", min=0.0, max=6.0)
    t = b.node("Clip", [b.conv(t, 4, 4, name="b")], name="clip0", min=0.0)
    t = b.node("Clip", [b.conv(t, 4, 4, name="c")], name="clip11", min=-1.0, max=1.0)
    return b.model({"x": [1, 3, 6, 6]}, [t], opset=9)
