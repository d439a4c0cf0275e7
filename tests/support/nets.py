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


# ---------------------------------------------------------------------------------------------
# The CNN families of the network runtime's tests (xfc model --emit lib): squeeze-excitation with
# hard-swish, a bottleneck ResNet, grouped convolution with channel shuffle, Concat with an
# upsampling path. Ragged sizes; every runtime op of xfc/model/runtime/lower.py appears somewhere.
# ---------------------------------------------------------------------------------------------

def _shape_of(b: Builder, x: str, index: int) -> str:
    """Shape(x)[index] as a 1-element int64 vector, the way exporters compute reshape targets."""
    shape = b.node("Shape", [x], name=b.name("shape"))
    picked = b.node("Gather", [shape, b.const(np.array(index, np.int64), "idx")], name=b.name("gather"), axis=0)
    return b.node("Unsqueeze", [picked, b.const(np.array([0], np.int64), "axes")], name=b.name("unsqueeze"))


def flatten_by_shape(b: Builder, x: str) -> str:
    """Reshape(x, [Shape(x)[0], -1]) written as exporters do (Shape, Gather, Unsqueeze, Concat): folded at load."""
    target = b.node("Concat", [_shape_of(b, x, 0), b.const(np.array([-1], np.int64), "minus1")],
                    name=b.name("concat_shape"), axis=0)
    return b.node("Reshape", [x, target], name=b.name("flatten"))


def se_block(b: Builder, x: str, c: int, squeeze: int, prefix: str) -> str:
    """Squeeze-excitation: GlobalAveragePool, 1x1 reduce + Relu, 1x1 expand + HardSigmoid, Mul (broadcast)."""
    s = b.node("GlobalAveragePool", [x], name=f"{prefix}_gap")
    s = b.node("Relu", [b.conv(s, c, squeeze, k=1, pad=0, name=f"{prefix}_reduce")], name=f"{prefix}_relu")
    s = b.node("HardSigmoid", [b.conv(s, squeeze, c, k=1, pad=0, name=f"{prefix}_expand")], name=f"{prefix}_hsig",
               alpha=1.0 / 6, beta=0.5)
    return b.node("Mul", [x, s], name=f"{prefix}_scale")


def mobilenet_v3_net(c: int = 8, hw: int = 13, seed: int = 5, batch: int = 1) -> onnx.ModelProto:
    """MobileNetV3-like: stem + HardSwish, an inverted residual block with squeeze-excitation and
    hard-swish, a block with SiLU written as x * Sigmoid(x) and a LeakyRelu, a residual, an average
    pool (ceil_mode, count_include_pad), the exporters' Shape/Gather/Concat flatten, classifier + Softmax."""
    b = Builder(seed)
    t = b.node("HardSwish", [b.bn(b.conv("x", 3, c, stride=2, bias=False, name="stem"), c, name="stem_bn")],
               name="stem_hswish")
    e = b.node("HardSwish", [b.conv(t, c, 3 * c, k=1, pad=0, name="b1_expand")], name="b1_hswish1")
    e = b.node("HardSwish", [b.conv(e, 3 * c, 3 * c, k=3, pad=1, group=3 * c, name="b1_dw")], name="b1_hswish2")
    e = se_block(b, e, 3 * c, 4, "b1_se")
    t = b.node("Add", [t, b.conv(e, 3 * c, c, k=1, pad=0, name="b1_project")], name="b1_add")
    s = b.conv(t, c, 2 * c, k=3, pad=1, name="b2_conv")
    t = b.node("Mul", [s, b.node("Sigmoid", [s], name="b2_sigmoid")], name="b2_silu")
    t = b.node("LeakyRelu", [b.conv(t, 2 * c, 2 * c, k=1, pad=0, name="b2_pw")], name="b2_leaky", alpha=0.1)
    t = b.node("AveragePool", [t], name="avgpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
               ceil_mode=1, count_include_pad=1)
    t = flatten_by_shape(b, t)
    side = (hw - 1) // 2 + 1                      # after the stride-2 stem
    pooled = -(-(side - 1) // 2) + 1              # 3x3 / 2, pad 1, ceil_mode
    features = 2 * c * pooled * pooled
    y = b.node("Gemm", [t, b.const(b.rand(10, features, scale=0.2)), b.const(b.rand(10, scale=0.1), "b")],
               name="classifier", transB=1)
    y = b.node("Softmax", [y], name="softmax", axis=1)
    return b.model({"x": [batch, 3, hw, hw]}, [y])


def bottleneck_net(c: int = 8, hw: int = 9, seed: int = 6, batch: int = 1) -> onnx.ModelProto:
    """ResNet-50-like bottlenecks (1x1 reduce, 3x3, 1x1 expand, BatchNormalization folded, residual Add + Relu),
    one with a strided projection shortcut; a BatchNormalization that cannot fold (after an Add)."""
    b = Builder(seed)
    t = b.node("Relu", [b.bn(b.conv("x", 3, 4 * c, k=3, pad=1, bias=False, name="stem"), 4 * c, name="stem_bn")],
               name="stem_relu")

    def bottleneck(x, c_in, mid, c_out, stride, prefix):
        y = b.node("Relu", [b.bn(b.conv(x, c_in, mid, k=1, pad=0, bias=False, name=f"{prefix}_reduce"), mid)],
                   name=f"{prefix}_relu1")
        y = b.node("Relu", [b.bn(b.conv(y, mid, mid, k=3, stride=stride, pad=1, bias=False, name=f"{prefix}_conv"),
                                 mid)], name=f"{prefix}_relu2")
        y = b.bn(b.conv(y, mid, c_out, k=1, pad=0, bias=False, name=f"{prefix}_expand"), c_out)
        short = x if stride == 1 and c_in == c_out else b.bn(
            b.conv(x, c_in, c_out, k=1, stride=stride, pad=0, bias=False, name=f"{prefix}_proj"), c_out)
        return b.node("Relu", [b.node("Add", [y, short], name=f"{prefix}_add")], name=f"{prefix}_out")

    t = bottleneck(t, 4 * c, c, 4 * c, 1, "bn1")
    t = bottleneck(t, 4 * c, 2 * c, 8 * c, 2, "bn2")
    t = b.bn(b.node("Add", [t, t], name="double"), 8 * c, name="lone_bn")      # not foldable: after an Add
    t = b.node("GlobalAveragePool", [t], name="pool")
    t = b.node("Flatten", [t], name="flatten", axis=1)
    y = b.node("Gemm", [t, b.const(b.rand(8 * c, 10, scale=0.3)), b.const(b.rand(10, scale=0.1), "b")], name="fc")
    return b.model({"x": [batch, 3, hw, hw]}, [y])


def channel_shuffle(b: Builder, x: str, groups: int, c: int, h: int, w: int, prefix: str) -> str:
    """Reshape [N, g, C/g, H, W] -> Transpose (0, 2, 1, 3, 4) -> Reshape back (ShuffleNet)."""
    t = b.node("Reshape", [x, b.const(np.array([-1, groups, c // groups, h, w], np.int64), "shape")],
               name=f"{prefix}_split_groups")
    t = b.node("Transpose", [t], name=f"{prefix}_transpose", perm=[0, 2, 1, 3, 4])
    return b.node("Reshape", [t, b.const(np.array([-1, c, h, w], np.int64), "shape")], name=f"{prefix}_merge")


def shufflenet_net(c: int = 12, hw: int = 11, seed: int = 7, batch: int = 1) -> onnx.ModelProto:
    """ShuffleNet-like: grouped 1x1 convolutions (group 3) with channel shuffle, depthwise 3x3, a
    ShuffleNetV2 unit (Split into two halves, one through convolutions, Concat, shuffle), a strided
    unit whose shortcut is an AveragePool concatenated to the grouped branch."""
    b = Builder(seed)
    t = b.node("Relu", [b.conv("x", 3, c, k=3, pad=1, name="stem")], name="stem_relu")
    g = b.node("Relu", [b.conv(t, c, c, k=1, pad=0, group=3, name="g1_conv")], name="g1_relu")
    g = channel_shuffle(b, g, 3, c, hw, hw, "g1_shuffle")
    g = b.conv(g, c, c, k=3, pad=1, group=c, name="g1_dw")
    g = b.conv(g, c, c, k=1, pad=0, group=3, name="g1_conv2")
    t = b.node("Relu", [b.node("Add", [t, g], name="g1_add")], name="g1_out")
    left, right = b.node("Split", [t, b.const(np.array([c // 2, c // 2], np.int64), "split")], name="v2_split",
                         outputs=2, axis=1)
    right = b.node("Relu", [b.conv(right, c // 2, c // 2, k=1, pad=0, name="v2_pw1")], name="v2_relu")
    right = b.conv(right, c // 2, c // 2, k=3, pad=1, group=c // 2, name="v2_dw")
    t = b.node("Concat", [left, right], name="v2_concat", axis=1)
    t = channel_shuffle(b, t, 2, c, hw, hw, "v2_shuffle")
    short = b.node("AveragePool", [t], name="s_pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    branch = b.conv(t, c, c, k=3, stride=2, pad=1, group=3, name="s_gconv")
    t = b.node("Relu", [b.node("Concat", [short, branch], name="s_concat", axis=1)], name="s_relu")
    t = b.node("GlobalAveragePool", [t], name="pool")
    t = b.node("Flatten", [t], name="flatten", axis=1)
    y = b.node("Gemm", [t, b.const(b.rand(10, 2 * c, scale=0.3)), b.const(b.rand(10, scale=0.1), "b")],
               name="fc", transB=1)
    return b.model({"x": [batch, 3, hw, hw]}, [y])


def unet_net(c: int = 6, hw: int = 10, seed: int = 8, batch: int = 1) -> onnx.ModelProto:
    """A small U-Net / FPN: two levels down (MaxPool), up with Resize (nearest, scale 2) and Upsample-free
    Concat with the skip tensors, a Pad before a valid convolution, a Slice, a Clip (not 0..6), two outputs."""
    b = Builder(seed)
    d1 = b.node("Relu", [b.conv("x", 3, c, name="enc1")], name="enc1_relu")
    d2 = b.node("Relu", [b.conv(b.node("MaxPool", [d1], name="down1", kernel_shape=[2, 2], strides=[2, 2]), c,
                                2 * c, name="enc2")], name="enc2_relu")
    mid = b.node("Relu", [b.conv(b.node("MaxPool", [d2], name="down2", kernel_shape=[3, 3], strides=[2, 2],
                                        pads=[1, 1, 1, 1], ceil_mode=1), 2 * c, 2 * c, name="mid")], name="mid_relu")
    scales = b.const(np.array([1, 1, 2, 2], np.float32), "scales")
    up = b.node("Resize", [mid, "", scales], name="up2", mode="nearest")
    up = b.node("Slice", [up, b.const(np.array([0, 0], np.int64), "starts"),
                          b.const(np.array([hw // 2, hw // 2], np.int64), "ends"),
                          b.const(np.array([2, 3], np.int64), "axes")], name="crop2")
    t = b.node("Concat", [up, d2], name="cat2", axis=1)
    t = b.node("Relu", [b.conv(t, 4 * c, 2 * c, name="dec2")], name="dec2_relu")
    up = b.node("Resize", [t, "", scales], name="up1", mode="nearest", coordinate_transformation_mode="asymmetric",
                nearest_mode="floor")
    t = b.node("Concat", [d1, up], name="cat1", axis=1)
    t = b.node("Pad", [t, b.const(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")], name="pad", mode="constant")
    t = b.conv(t, 3 * c, c, k=3, pad=0, name="dec1")
    seg = b.node("Clip", [t, b.const(np.float32(-1.0), "lo"), b.const(np.float32(2.0), "hi")], name="clip")
    logits = b.conv(mid, 2 * c, 3, k=1, pad=0, name="aux_head")
    return b.model({"x": [batch, 3, hw, hw]}, [seg, logits])
