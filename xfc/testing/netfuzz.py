"""Random small networks for `xfc fuzz --networks N` (issue 32 item 6): the network runtime end to end.

Each network is drawn from (seed, index) alone: an input of 1-12 channels at 4-19 pixels, then 2-6
blocks of the node kinds the runtime runs (xfc/model/runtime: convolutions, depthwise and grouped,
with bias and the fused activations; a residual Add; squeeze-excitation; max and average pooling with
non-square windows, either side's padding, ceil_mode and dilation; Concat; an uneven channel Split;
Slice of rows or columns with steps 2 and -1; constant Pad; nearest Resize by integer scales or to
sizes under every coordinate mapping and rounding rule; rows and columns transposed; a channel
shuffle; Add / Sub / Mul / Div against a broadcast constant; BatchNormalization), and sometimes a classifier head
(GlobalAveragePool, Flatten, Gemm, Softmax). `xfc fuzz --networks` (xfc/cli/fuzz.py) builds each as
`xfc model NET --emit lib --verify [--dtype fp16]` does (the whole network in C, every step checked on
its own inputs and the outputs against onnxruntime under the derived bound) on the host or, for an
ARM description, under qemu. The dtype is the case's, not drawn: the same (seed, index) is the same
model in fp32 and fp16. An int8 case draws from what a quantized network runs in int8 end to end
(INT8_BLOCKS: convolutions and depthwise ones with ReLU / ReLU6, residual Adds, MaxPool, the head
without Softmax): `xfc fuzz --networks` quantizes it with onnxruntime (xfc.model.quantized_peer)
before building it. This module only draws: it imports nothing of xfc's.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

OPSET = 17
ACTIVATIONS = ("none", "relu", "relu6", "hardswish", "sigmoid", "silu", "leakyrelu")
BLOCKS = ("conv", "depthwise", "grouped", "residual", "se", "pool", "concat", "upsample", "shuffle", "batchnorm",
          "slice", "pad", "split", "broadcast", "swap")
INT8_ACTIVATIONS = ("none", "relu", "relu6")     # what a quantized layer clamps in its requantization
INT8_BLOCKS = ("conv", "depthwise", "residual", "pool")


@dataclass(frozen=True)
class NetworkCase:
    seed: int
    index: int
    hardware: str                 # a description name: 'host' or an ARM one (run under qemu)
    threads: int
    model: object = field(repr=False, compare=False)   # onnx.ModelProto
    blocks: tuple[str, ...] = ()  # what was drawn, in order (for the report)
    input_shape: tuple[int, ...] = ()
    dtype: str = "fp32"           # the network's element type (fp16: an ARM description with FP16 arithmetic)

    def describe(self) -> str:
        return (f"net s{self.seed}-n{self.index} {'x'.join(map(str, self.input_shape))} {self.dtype} on "
                f"{self.hardware} t{self.threads}: {' > '.join(self.blocks)}")


class _Graph:
    """Nodes and initializers of one network; shapes tracked as (channels, height, width)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.np_rng = np.random.default_rng(rng.getrandbits(32))
        self.nodes, self.inits, self.count = [], [], 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def const(self, array, prefix: str = "w") -> str:
        from onnx import numpy_helper
        name = self.name(prefix)
        array = np.asarray(array)
        self.inits.append(numpy_helper.from_array(array if array.dtype == np.int64 else array.astype(np.float32), name))
        return name

    def rand(self, *shape, scale: float = 1.0) -> np.ndarray:
        return (self.np_rng.uniform(-1.0, 1.0, size=shape) * scale).astype(np.float32)

    def node(self, op: str, inputs, **attrs) -> str:
        from onnx import helper
        out = self.name("t")
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=self.name(op.lower()), **attrs))
        return out

    def conv(self, x: str, c_in: int, c_out: int, k: int, stride: int, pad: int, group: int = 1,
             bias: bool = True) -> str:
        w = self.const(self.rand(c_out, c_in // group, k, k, scale=1.0 / np.sqrt(c_in // group * k * k)))
        inputs = [x, w] + ([self.const(self.rand(c_out, scale=0.1), "b")] if bias else [])
        return self.node("Conv", inputs, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=group)

    def activation(self, x: str, kind: str) -> str:
        if kind == "relu":
            return self.node("Relu", [x])
        if kind == "relu6":
            return self.node("Clip", [x, self.const(np.float32(0.0), "lo"), self.const(np.float32(6.0), "hi")])
        if kind == "hardswish":
            return self.node("HardSwish", [x])
        if kind == "sigmoid":
            return self.node("Sigmoid", [x])
        if kind == "silu":                 # as exporters write it: x * Sigmoid(x)
            return self.node("Mul", [x, self.node("Sigmoid", [x])])
        if kind == "leakyrelu":
            return self.node("LeakyRelu", [x], alpha=0.1)
        return x


def _out(extent: int, k: int, stride: int, pad: int) -> int:
    return (extent + 2 * pad - k) // stride + 1


def _pool_out(extent: int, k: int, stride: int, dilation: int, pad_begin: int, pad_end: int, ceil_mode: int) -> int:
    """A pooling window's output extent (ONNX: with ceil_mode, a window that would start in the end
    padding is dropped)."""
    span = extent + pad_begin + pad_end - (k - 1) * dilation - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    return out - 1 if ceil_mode and (out - 1) * stride >= extent + pad_begin else out


def _pool_axis(rng: random.Random, extent: int, max_op: str) -> tuple[int, int, int, int, int]:
    """(kernel, stride, dilation, pad_begin, pad_end) along one axis: kernels 2 or 3 (1 for a single
    row or column), pads of either side below the kernel, dilation 2 now and then for MaxPool, while
    the window fits the padded extent."""
    k = rng.choice([2, 3]) if extent >= 3 else min(2, extent)
    d = 2 if max_op == "MaxPool" and rng.random() < 0.25 and 2 * (k - 1) + 1 <= extent else 1
    pads = (rng.randint(0, k - 1), rng.randint(0, k - 1)) if k > 1 else (0, 0)
    return k, rng.choice([1, 2]), d, *pads


def random_network(seed: int, index: int, hardware: str, max_threads: int = 2, dtype: str = "fp32") -> NetworkCase:
    """The network of (seed, index): same arguments, same model (whatever the dtype)."""
    from onnx import TensorProto, helper
    rng = random.Random(f"xfc-netfuzz:{seed}:{index}")
    g = _Graph(rng)
    c, h, w = rng.randint(1, 12), rng.randint(4, 19), rng.randint(4, 19)
    input_shape = (1, c, h, w)
    x, drawn = "input", []
    int8 = dtype == "int8"
    for _ in range(rng.randint(2, 6)):
        kind = rng.choice(INT8_BLOCKS if int8 else BLOCKS)
        act = rng.choice(INT8_ACTIVATIONS if int8 else ACTIVATIONS)
        if int8 and kind == "pool" and not drawn:
            kind = "conv"     # a MaxPool of the fp32 input stays fp32 in the quantized model (before its quantize)
        if kind in ("conv", "depthwise", "grouped"):
            k = rng.choice([1, 3, 5] if kind == "conv" else [3, 5])
            k = min(k, h, w) if min(h, w) >= 3 else 1
            k = k if k % 2 else max(1, k - 1)
            pad = rng.choice([0, k // 2]) if min(h, w) >= k else k // 2
            stride = rng.choice([1, 2]) if min(h, w) >= 6 else 1
            if kind == "depthwise":
                group, c_out = c, c * rng.choice([1, 1, 2])
                c_out = c if int8 else c_out        # xfc's int8 depthwise: one filter per channel
            elif kind == "grouped":
                divisors = [d for d in range(2, c) if c % d == 0]
                if not divisors:
                    kind, group, c_out = "conv", 1, rng.randint(1, 16)
                else:
                    group = rng.choice(divisors)
                    c_out = group * rng.randint(1, 4)
            else:
                group, c_out = 1, rng.randint(1, 16)
            x = g.activation(g.conv(x, c, c_out, k, stride, pad, group, bias=rng.random() < 0.7), act)
            c, h, w = c_out, _out(h, k, stride, pad), _out(w, k, stride, pad)
            drawn.append(f"{kind} {k}x{k}/{stride} g{group} ->{c_out} {act}")
        elif kind == "residual":
            y = g.activation(g.conv(x, c, c, 3, 1, 1), rng.choice(("none", "relu", "relu6")))
            y = g.conv(y, c, c, 1, 1, 0, bias=rng.random() < 0.5)
            x = g.node("Add", [x, y] if rng.random() < 0.5 else [y, x])
            if rng.random() < 0.5 and not int8:      # a Relu after a quantized Add stays fp32 (not int8)
                x = g.node("Relu", [x])
            drawn.append("residual add")
        elif kind == "se":
            squeezed = max(1, c // 2)
            s = g.node("GlobalAveragePool", [x])
            s = g.node("Relu", [g.conv(s, c, squeezed, 1, 1, 0)])
            s = g.activation(g.conv(s, squeezed, c, 1, 1, 0), rng.choice(("sigmoid", "hardswish")))
            x = g.node("Mul", [x, s])
            drawn.append("squeeze-excite")
        elif kind == "pool" and min(h, w) >= 2:
            # non-square windows, either side's padding, strides per axis, ceil_mode, dilated
            # MaxPool: what exported networks rarely hold and the runtime's pooling must still get right
            op = rng.choice(("MaxPool", "AveragePool"))
            op = "MaxPool" if int8 else op
            (kh, sh, dh, pt, pb), (kw, sw, dw, pl, pr) = _pool_axis(rng, h, op), _pool_axis(rng, w, op)
            ceil_mode = rng.choice([0, 1])
            attrs = dict(kernel_shape=[kh, kw], strides=[sh, sw], pads=[pt, pl, pb, pr], ceil_mode=ceil_mode)
            if op == "MaxPool" and (dh, dw) != (1, 1):
                attrs["dilations"] = [dh, dw]
            if op == "AveragePool":
                # not in ceil mode: there xfc refuses an average that counts the padding where a window
                # would start in it and another axis needs ceil mode (xfc.model.load)
                counts_pads = rng.choice([0, 1])
                attrs["count_include_pad"] = 0 if ceil_mode else counts_pads
            x = g.node(op, [x], **attrs)
            h, w = _pool_out(h, kh, sh, dh, pt, pb, ceil_mode), _pool_out(w, kw, sw, dw, pl, pr, ceil_mode)
            drawn.append(f"{op} {kh}x{kw}/{sh}x{sw}" + (f" d{dh}x{dw}" if (dh, dw) != (1, 1) else "")
                         + f" p{pt},{pl},{pb},{pr}" + (" ceil" if ceil_mode else ""))
        elif kind == "concat":
            extra = rng.randint(1, 8)
            y = g.activation(g.conv(x, c, extra, 1, 1, 0), act)
            x = g.node("Concat", [x, y] if rng.random() < 0.5 else [y, x], axis=1)
            c += extra
            drawn.append(f"concat +{extra}")
        elif kind == "upsample" and max(h, w) <= 10:
            if rng.random() < 0.5:   # integer scales per axis
                fh, fw = rng.choice([1, 2, 3]), rng.choice([2, 3])
                scales = g.const(np.array([1.0, 1.0, fh, fw], np.float32), "scales")
                x = g.node("Resize", [x, "", scales], mode="nearest")
                h, w = fh * h, fw * w
                drawn.append(f"resize x{fh}x{fw}")
            else:   # sizes (ratios not integers) under a coordinate mapping and a rounding rule
                oh, ow = rng.randint(h, 2 * h + 3), rng.randint(w, 2 * w + 3)
                ctm = rng.choice(["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"])
                nearest = rng.choice(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
                sizes = g.const(np.array([1, c, oh, ow], np.int64), "sizes")
                x = g.node("Resize", [x, "", "", sizes], mode="nearest", coordinate_transformation_mode=ctm,
                           nearest_mode=nearest)
                h, w = oh, ow
                drawn.append(f"resize to {oh}x{ow} {ctm} {nearest}")
        elif kind == "shuffle" and any(c % d == 0 for d in (2, 3, 4)):
            d = next(d for d in (2, 3, 4) if c % d == 0)
            x = g.node("Reshape", [x, g.const(np.array([1, d, c // d, h, w], np.int64), "shape")])
            x = g.node("Transpose", [x], perm=[0, 2, 1, 3, 4])
            x = g.node("Reshape", [x, g.const(np.array([1, c, h, w], np.int64), "shape")])
            drawn.append(f"shuffle g{d}")
        elif kind == "slice" and min(h, w) >= 3:
            # a window of rows or columns, every first or second one, forwards or backwards
            axis = rng.choice([2, 3])
            extent = h if axis == 2 else w
            step = rng.choice([1, 2, -1])
            lo, hi = sorted(rng.sample(range(extent + 1), 2))
            if hi - lo < 2:
                lo, hi = 0, extent
            starts, ends = (lo, hi) if step > 0 else (hi - 1, lo - 1 if lo > 0 else -extent - 1)
            x = g.node("Slice", [x, g.const(np.array([starts], np.int64), "starts"),
                                 g.const(np.array([ends], np.int64), "ends"),
                                 g.const(np.array([axis], np.int64), "axes"), g.const(np.array([step], np.int64), "steps")])
            kept = len(range(lo, hi, abs(step)))
            h, w = (kept, w) if axis == 2 else (h, kept)
            drawn.append(f"slice {'rows' if axis == 2 else 'cols'} {lo}:{hi}:{step}")
        elif kind == "pad":
            pads = [rng.randint(0, 2) for _ in range(4)]
            value = rng.choice([0.0, -1.5, 0.25])
            x = g.node("Pad", [x, g.const(np.array([0, 0, pads[0], pads[1], 0, 0, pads[2], pads[3]], np.int64), "pads"),
                               g.const(np.float32(value), "value")], mode="constant")
            h, w = h + pads[0] + pads[2], w + pads[1] + pads[3]
            drawn.append(f"pad {','.join(map(str, pads))} value {value}")
        elif kind == "split" and c >= 2:
            # two uneven channel groups, each through its own 1x1 convolution, joined again
            first = rng.randint(1, c - 1)
            a, b_ = g.name("t"), g.name("t")
            g.nodes.append(helper.make_node("Split", [x, g.const(np.array([first, c - first], np.int64), "split")],
                                            [a, b_], name=g.name("split"), axis=1))
            ca, cb = rng.randint(1, 8), rng.randint(1, 8)
            ya, yb = g.activation(g.conv(a, first, ca, 1, 1, 0), act), g.conv(b_, c - first, cb, 1, 1, 0)
            x = g.node("Concat", [yb, ya], axis=1)
            drawn.append(f"split {first}+{c - first} -> {ca}+{cb}")
            c = ca + cb
        elif kind == "broadcast":
            # an elementwise op against a constant broadcast over some axes (as normalisations write it)
            op = rng.choice(["Add", "Sub", "Mul", "Div"])
            shape = rng.choice([(1, c, 1, 1), (1, 1, h, w), (1, 1, 1, w), (1, 1, h, 1), ()])
            value = g.rand(*shape, scale=0.5) if shape else np.float32(rng.uniform(-0.5, 0.5))
            if op == "Div":
                value = np.sign(value) * (0.5 + np.abs(value)) + (value == 0)   # away from zero
            other = g.const(np.asarray(value, np.float32), "k")
            x = g.node(op, [other, x] if op in ("Add", "Mul") and rng.random() < 0.5 else [x, other])
            drawn.append(f"{op.lower()} {'x'.join(map(str, shape)) or 'scalar'}")
        elif kind == "swap":
            # rows and columns exchanged (a strided copy), as a transposed image
            x = g.node("Transpose", [x], perm=[0, 1, 3, 2])
            h, w = w, h
            drawn.append("transpose hw")
        elif kind == "batchnorm":
            scale = g.const(1.0 + 0.5 * g.rand(c))
            shift, mean = g.const(g.rand(c, scale=0.2)), g.const(g.rand(c, scale=0.3))
            var = g.const(1.0 + 0.5 * np.abs(g.rand(c)))
            x = g.node("BatchNormalization", [x, scale, shift, mean, var], epsilon=1e-5)
            drawn.append("batchnorm")
    if not any(b.startswith(("conv", "depthwise", "grouped", "residual", "squeeze", "concat")) for b in drawn):
        # a network of data movement alone has nothing for xfc to synthesize (--emit lib refuses it):
        # end it with a 1x1 convolution
        c_out = rng.randint(1, 16)
        x = g.conv(x, c, c_out, 1, 1, 0)
        c = c_out
        drawn.append(f"conv 1x1/1 g1 ->{c_out} none")
    out_shape = [1, c, h, w]
    if rng.random() < 0.4:
        classes = rng.randint(1, 10)
        out_shape = [1, classes]
        x = g.node("Flatten", [g.node("GlobalAveragePool", [x])])
        x = g.node("Gemm", [x, g.const(g.rand(classes, c, scale=1.0 / np.sqrt(c))), g.const(g.rand(classes))],
                   transB=1)
        if rng.random() < 0.5 and not int8:
            x = g.node("Softmax", [x], axis=1)
        drawn.append(f"head ->{classes}")
    graph = helper.make_graph(g.nodes, f"netfuzz_{seed}_{index}",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(input_shape))],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, out_shape)], g.inits)
    # the output declared as the blocks sized it (the operators' sizes: ONNX's shape inference keeps a
    # ceil-mode pooling window that starts in the padding, which the operator drops)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    threads = rng.randint(1, max(1, max_threads))
    return NetworkCase(seed=seed, index=index, hardware=hardware, threads=threads, model=model,
                       blocks=tuple(drawn), input_shape=input_shape, dtype=dtype)
