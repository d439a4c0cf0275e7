"""Error bounds through a network: how far an fp32 evaluation may be from exact arithmetic.

Every tensor t carries an element-wise bound e(t) >= |t_computed - t_exact| (float64), where
"exact" means real arithmetic on the model's fp32 inputs and weights. Inputs and constants have
e = 0. The rules, with u = 2^-24 and gamma_n = n u / (1 - n u) (the standard model of fp32
arithmetic; any summation order, FMA or not):

* xfc layer (conv2d / depthwise / matmul, y = act(W x + b)): by linearity
      e(y) <= |W| e(x) + gamma_{K+2+f} (|W| (|x~| + e(x)) + |b|)
  computed as one float64 convolution / product of nonnegative tensors; K is the reduction
  length (xfc.ops.error_bound uses gamma_{K+2}); f counts roundings that folding may add in
  this or another runtime (BatchNormalization: 6, Gemm alpha/beta: 2; mapping.py), and |b| is
  the bias magnitude before folding (|s (b - mean)| + |beta| for a folded BatchNormalization).
  Relu and ReLU6 are 1-Lipschitz, so the bound passes through the epilogue. With a
  non-constant B the product rule (|A~|+eA)(|B~|+eB)(1+gamma) - |A~||B~| is used instead.
  A layer whose plan is Winograd F(m x m, 3x3) replaces the rounding term by
  gamma_{C+4a+3+f} (Mw(|x~| + e(x)) + |b|), a = m + 2 (winograd_layer_bound, xfc/ops/winograd.py).
* Relu, Clip, Abs, Neg, Identity, Dropout: 1-Lipschitz, no rounding: e(y) = e(x).
* Data movement (Reshape, Transpose, Concat, Slice, Pad, MaxPool, ...): the same node applied
  to e (max pooling of e bounds the change of a max).
* Add/Sub: e1 + e2 + u'|y~|, u' = u/(1-u); Sum: sum e_i + gamma_{n-1} sum |x_i~|;
  Mul: |x1~| e2 + |x2~| e1 + e1 e2 + u'|y~|; Div by an exact divisor: e1/|x2~| + u'|y~|.
* Averages and sums (AveragePool, GlobalAveragePool, ReduceMean, ReduceSum) over n elements:
  op(e) + gamma_{n+1} op(|x~| + e).
* BatchNormalization on its own: |s| e + gamma_6 (|s| (|x~| + e + |mean|) + |beta|).
* Conv, ConvTranspose, Gemm, MatMul that xfc does not cover: the layer rule with K of the node
  (ConvTranspose: an upper bound on the terms per output).
* Sigmoid, HardSwish, LeakyRelu (and the epilogues of those names): their Lipschitz constant
  times e, plus their own evaluation roundings (xfc.ops.reference.activation_bound: exp is assumed
  to be evaluated within 2 units, in xfc and in the other runtime); HardSigmoid: |alpha| e +
  gamma_2 (|alpha x~| + |beta|).
* Resize / Upsample with mode nearest: data movement.
* Integer outputs (Shape, ...) are exact when their inputs are; any other op has no rule here
  (bound None, reported).

All magnitudes use |x~| + e(x) >= |x_exact|. Comparing two fp32 evaluations of the same network
(xfc's and onnxruntime's) then allows 2 e(y) at the outputs, under the assumption that the other
runtime's kernels also satisfy the standard model with at most the fold roundings counted in f
(plain dot products, no Winograd/FFT, no approximate transcendental functions in the path);
this is first order in u (terms of order u^2 |y| are far below the bound's slack).
"""
from __future__ import annotations

from math import prod
from typing import Optional, Sequence

import numpy as np
from onnx import helper

from ..ops.reference import activation_bound
from .nodes import run_node, variant

UNIT = 2.0 ** -24
ROUND = UNIT / (1 - UNIT)
TINY = float(np.finfo(np.float32).tiny)
ZERO = np.zeros(())

LIPSCHITZ_ONE = frozenset({"Relu", "Clip", "Abs", "Neg", "Identity", "Dropout"})
MOVEMENT = {   # op -> input indices that carry data (None: all inputs)
    "Reshape": (0,), "Flatten": (0,), "Squeeze": (0,), "Unsqueeze": (0,), "Transpose": (0,), "Concat": None,
    "Slice": (0,), "Gather": (0,), "Split": (0,), "Expand": (0,), "Tile": (0,), "Pad": (0,),
    "MaxPool": (0,), "GlobalMaxPool": (0,), "DepthToSpace": (0,), "SpaceToDepth": (0,),
}
AVERAGES = frozenset({"AveragePool", "GlobalAveragePool", "ReduceMean", "ReduceSum"})
BILINEAR = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
BN_UNITS = 6


# ONNX activations with an error rule, as xfc.ops.reference's epilogue activations
ACTIVATIONS = {"Sigmoid": "sigmoid", "HardSwish": "hardswish", "LeakyRelu": "leakyrelu"}


def _mode(node) -> str:
    mode = _attr(node, "mode", b"nearest")
    return mode.decode() if isinstance(mode, bytes) else str(mode)


def gamma(n: int) -> float:
    return n * UNIT / (1 - n * UNIT)


def is_zero(e) -> bool:
    return e is not None and not np.any(e)


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def layer_bound(spec, x: np.ndarray, e_x, weight: np.ndarray, e_w, bias_magnitude: np.ndarray,
                fold_units: int, winograd_m: int = 0) -> np.ndarray:
    """Bound on |y~ - y_exact| of one xfc layer (see the module docstring); kernel layout.
    winograd_m: the layer runs a Winograd plan of that tile size (winograd_layer_bound)."""
    from ..ops.spec import MatmulSpec
    from ..ops.reference import reference
    plain = type(spec)(**{f: getattr(spec, f) for f in spec.__dataclass_fields__ if f != "epilogue"})
    if winograd_m:
        return winograd_layer_bound(plain, x, e_x, weight, e_w, bias_magnitude, fold_units, winograd_m)
    g = gamma(spec.reduction_size + 2 + fold_units)
    ax = np.abs(x.astype(np.float64))
    aw = np.abs(weight.astype(np.float64))
    zero_bias = np.zeros(spec.operand_shapes[2])
    e_x = np.broadcast_to(np.asarray(e_x, np.float64), ax.shape)
    if is_zero(e_w):
        out = reference(plain, (1 + g) * e_x + g * ax, aw, zero_bias)
    else:
        e_w = np.broadcast_to(np.asarray(e_w, np.float64), aw.shape)
        out = (1 + g) * reference(plain, ax + e_x, aw + e_w, zero_bias) - reference(plain, ax, aw, zero_bias)
    axis = 2 if isinstance(spec, MatmulSpec) else 1
    shape = [-1 if i == axis else 1 for i in range(out.ndim)]
    return out + g * np.asarray(bias_magnitude, np.float64).reshape(shape) + TINY


def winograd_layer_bound(plain, x: np.ndarray, e_x, weight: np.ndarray, e_w, bias_magnitude: np.ndarray,
                         fold_units: int, m: int) -> np.ndarray:
    """The layer rule for a conv2d that runs Winograd F(m x m, 3x3) (xfc/ops/winograd.py):
        e(y) <= [|W| (|x~| + e(x)) with |W| + e(W) in place of |W|] - |W| |x~|
                + gamma_{C+4a+3+f} (Mw(|x~| + e(x), |W| + e(W)) + |b|)
    The first part carries the incoming errors through the exact convolution (as for a direct
    layer, by linearity); the second is the Winograd rounding bound (reference.check_winograd_output's
    gamma_(C+4a+3) (Mw + |b|)) taken at the perturbed magnitudes, with the fold roundings f added.
    Mw >= |W| |x| (the transforms' growth, docs/winograd.md) but its gamma counts C + 4a + 3
    roundings, not 9 C + 2: at m = 2 the bound can be tighter than the direct rule's, at m = 4 and
    6 it is wider."""
    from ..ops.reference import reference
    from ..ops.winograd import channel_roundings, winograd_magnitude
    ax = np.abs(x.astype(np.float64))
    aw = np.abs(weight.astype(np.float64))
    zero_bias = np.zeros(plain.operand_shapes[2])
    e_x = np.broadcast_to(np.asarray(e_x, np.float64), ax.shape)
    e_w = np.broadcast_to(np.asarray(0.0 if e_w is None else e_w, np.float64), aw.shape)
    if is_zero(e_x) and is_zero(e_w):
        carried = 0.0
    else:
        carried = reference(plain, ax + e_x, aw + e_w, zero_bias) - reference(plain, ax, aw, zero_bias)
    g = gamma(channel_roundings(m, plain.c) + fold_units)
    rounding = g * winograd_magnitude(plain, ax + e_x, aw + e_w, m)
    shape = [-1 if i == 1 else 1 for i in range(rounding.ndim)]
    return carried + rounding + g * np.asarray(bias_magnitude, np.float64).reshape(shape) + TINY


def _full(e, like: np.ndarray) -> np.ndarray:
    return np.broadcast_to(np.asarray(e, np.float64), like.shape).astype(np.float64)


def _channel(v: np.ndarray, ndim: int) -> np.ndarray:
    return np.asarray(v, np.float64).reshape([-1 if i == 1 else 1 for i in range(ndim)])


def _bilinear(node, opset, ins, bounds, y):
    """Conv / ConvTranspose / Gemm / MatMul not covered by xfc: the layer rule."""
    op = node.op_type
    a, b = ins[0], ins[1]
    extra, bias_term = 0, 0.0
    if op in ("Conv", "ConvTranspose"):
        group = int(_attr(node, "group", 1))
        k = (a.shape[1] // group) * prod(b.shape[2:]) if op == "ConvTranspose" else prod(b.shape[1:])
        if len(ins) > 2 and ins[2] is not None:
            bias_term = _channel(np.abs(ins[2]), y.ndim)
        plain = variant(node, inputs=list(node.input[:2]))
    elif op == "Gemm":
        k = a.shape[0] if _attr(node, "transA", 0) else a.shape[1]
        alpha, beta = float(_attr(node, "alpha", 1.0)), float(_attr(node, "beta", 1.0))
        extra = 2
        if len(ins) > 2 and ins[2] is not None:
            bias_term = abs(beta) * np.abs(ins[2].astype(np.float64))
        plain = variant(node, inputs=list(node.input[:2]), alpha=abs(alpha), beta=None)
    else:
        k = a.shape[-1]
        plain = variant(node)
    g = gamma(k + 2 + extra)
    names = list(plain.input[:2])
    ea, eb = _full(bounds[0], a), _full(bounds[1], b)
    aa, ab = np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64))
    (big,) = run_node(plain, dict(zip(names, (aa + ea, ab + eb))), opset)
    if is_zero(bounds[0]) and is_zero(bounds[1]):
        out = g * big
    else:
        (small,) = run_node(plain, dict(zip(names, (aa, ab))), opset)
        out = (1 + g) * big - small
    return np.asarray(out, np.float64) + g * bias_term + TINY


def propagate(node, opset: int, ins: Sequence[Optional[np.ndarray]], bounds: Sequence, outs: Sequence[np.ndarray]):
    """Bounds of a node's outputs from its inputs' (module docstring); None where no rule applies."""
    op = node.op_type
    n_out = len(outs)
    floats = [o.dtype.kind in "fc" for o in outs]
    present = [(x, e) for x, e in zip(ins, bounds) if x is not None]
    if op in ("Shape", "Size", "ConstantOfShape", "Constant"):
        return [ZERO] * n_out
    if not any(floats):
        return [ZERO if all(is_zero(e) for _, e in present) else None] * n_out
    if node.domain not in ("", "ai.onnx") or any(e is None for _, e in present):
        return [None] * n_out
    rest = [ZERO if not f else None for f in floats[1:]]   # e.g. MaxPool indices, Dropout mask
    y = outs[0]
    ay = np.abs(y.astype(np.float64))
    if op in LIPSCHITZ_ONE:
        return [bounds[0], *rest]
    if op in ACTIVATIONS:
        x, e = present[0]
        alpha = float(_attr(node, "alpha", 0.01)) if op == "LeakyRelu" else 0.0
        return [activation_bound(_full(e, x), np.asarray(x, np.float64), ACTIVATIONS[op], alpha), *rest]
    if op == "HardSigmoid":
        x, e = present[0]
        alpha, beta = float(_attr(node, "alpha", 0.2)), float(_attr(node, "beta", 0.5))
        return [abs(alpha) * _full(e, x) + gamma(2) * (abs(alpha) * np.abs(x.astype(np.float64)) + abs(beta)) + TINY,
                *rest]
    nearest = op in ("Resize", "Upsample") and _mode(node) == "nearest"
    if op in MOVEMENT or nearest:
        data = (0,) if nearest else range(len(ins)) if MOVEMENT[op] is None else MOVEMENT[op]
        feeds = {}
        for idx, (name, x) in enumerate(zip(node.input, ins)):
            if name and x is not None:
                feeds[name] = _full(bounds[idx], x) if idx in data else x
        moved = node
        if op == "Pad":
            if len(node.input) > 2 and node.input[2]:
                feeds[node.input[2]] = np.zeros_like(ins[2])
            if _attr(node, "value") is not None:
                moved = variant(node, value=0.0)
            if any(not is_zero(bounds[i]) for i in range(1, len(ins)) if ins[i] is not None):
                return [None] * n_out
        results = run_node(moved, feeds, opset)
        return [np.asarray(r, np.float64) if f else ZERO for r, f in zip(results, floats)]
    if op in ("Add", "Sub"):
        return [np.asarray(bounds[0]) + np.asarray(bounds[1]) + ROUND * ay, *rest]
    if op == "Sum":
        total = sum(np.asarray(e) for _, e in present)
        mags = sum(np.abs(x.astype(np.float64)) for x, _ in present)
        return [total + gamma(max(len(present) - 1, 1)) * mags, *rest]
    if op == "Mul":
        (x1, e1), (x2, e2) = present
        e1, e2 = np.asarray(e1), np.asarray(e2)
        return [np.abs(x1.astype(np.float64)) * e2 + np.abs(x2.astype(np.float64)) * e1 + e1 * e2 + ROUND * ay, *rest]
    if op == "Div":
        # (a + da) / (b + db) - a / b = (da b - a db) / (b (b + db)): with |da| <= e1, |db| <= e2 < |b|,
        # at most (e1 |b| + |a| e2) / (|b| (|b| - e2)) (e2 > 0: a divisor rounded, e.g. an fp16 constant)
        (x1, e1), (x2, e2) = present
        a, b = np.abs(x1.astype(np.float64)), np.abs(x2.astype(np.float64))
        e1, e2 = np.asarray(e1, np.float64), np.asarray(e2, np.float64)
        if np.any(e2 >= b):
            return [None] * n_out
        return [(e1 * b + a * e2) / (b * (b - e2)) + ROUND * ay, *rest]
    if op in AVERAGES:
        x, e = present[0]
        count = prod(_attr(node, "kernel_shape")) if op == "AveragePool" else x.size // max(y.size, 1)
        feeds = dict(zip([n for n in node.input if n], [p[0] for p in present]))
        feeds[node.input[0]] = _full(e, x)
        (moved,) = run_node(node, feeds, opset)[:1]
        feeds[node.input[0]] = np.abs(x.astype(np.float64)) + _full(e, x)
        (mag,) = run_node(node, feeds, opset)[:1]
        return [np.asarray(moved, np.float64) + gamma(count + 1) * np.asarray(mag, np.float64), *rest]
    if op == "BatchNormalization":
        x, e = present[0]
        if len(present) < 5 or any(not is_zero(b) for _, b in present[1:5]):
            return [None] * n_out
        scale, beta, mean, var = (p[0].astype(np.float64) for p in present[1:5])
        s = scale / np.sqrt(var + float(_attr(node, "epsilon", 1e-5)))
        if s.ndim == 1:
            s, beta, mean = (_channel(v, x.ndim) for v in (s, beta, mean))
        e = _full(e, x)
        local = np.abs(s) * (np.abs(x.astype(np.float64)) + e + np.abs(mean)) + np.abs(beta)
        return [np.abs(s) * e + gamma(BN_UNITS) * local, *rest]
    if op in BILINEAR:
        return [_bilinear(node, opset, list(ins), list(bounds), y), *rest]
    return [None] * n_out
