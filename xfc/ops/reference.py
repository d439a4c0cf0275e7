"""The truth a kernel is checked against: deterministic inputs, the float64 numpy oracle, the
K-derived per-element error bound and the verdict (with the statistical RMS check of
accuracy.py), for fp32 kernels and for kernels with fp16 storage and fp32 arithmetic.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .accuracy import Verdict, judge, variance_bound  # noqa: F401  (Verdict: re-exported)
from .spec import Conv2dSpec, MatmulSpec, OperatorSpec, _WindowedSpec
from .winograd import winograd_error_bound

# Pre-activation spread (standard deviation) aimed for when a spec ends in ReLU6, so that its upper
# clamp is crossed as often as its lower one (about one output in six above 6).
RELU6_SPREAD = 6.0


def input_scale(spec: OperatorSpec) -> float:
    """Factor applied to both operands by make_inputs: 1, except for ReLU6 epilogues.

    With operands uniform in [-1, 1) a dot product of length K has standard deviation sqrt(K)/3,
    which stays below 6 up to K = 324: the ReLU6 clamp at 6 would almost never be exercised.
    Scaling both operands by s with s^2 sqrt(K)/3 = RELU6_SPREAD lifts the spread to 6 (never
    scaled down). The K-derived error bound is relative to sum |a_i b_i|, so it scales too.
    """
    if spec.epilogue.activation != "relu6":
        return 1.0
    return max(1.0, float(np.sqrt(3.0 * RELU6_SPREAD / np.sqrt(spec.reduction_size))))


def make_inputs(spec: OperatorSpec, seed: int = 0) -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """Deterministic fp32 inputs: (first operand, second operand, bias), uniform in [-1, 1); bias is
    None when the spec adds none (spec.input_shapes). For a ReLU6 epilogue both operands are scaled
    by input_scale(spec) (same seed, same arrays)."""
    rng = np.random.default_rng(seed)
    a, b = (rng.uniform(-1.0, 1.0, size=shape) for shape in spec.operand_shapes[:2])
    bias = rng.uniform(-1.0, 1.0, size=spec.operand_shapes[2]).astype(np.float32) if spec.epilogue.bias else None
    scale = input_scale(spec)
    return (a * scale).astype(np.float32), (b * scale).astype(np.float32), bias


# The activations of an epilogue (Epilogue.activation), as ONNX defines them:
#   hardswish  x * max(0, min(1, x/6 + 1/2))      sigmoid  1 / (1 + exp(-x))
#   silu       x * sigmoid(x)                     leakyrelu  x if x >= 0 else alpha x
# Lipschitz constants (how much an input error can grow) and the rounding units an fp32 evaluation
# spends, relative to ACTIVATION_MAGNITUDE (exp is evaluated to within 2 units by the kernels'
# polynomial; a sigmoid then adds an addition and a division; hardswish's clamp argument, the
# product with x and the scaling by 1/6 round three times, relative to |x| (not |y|: for x near -3
# the result is much smaller than its factors)).
ACTIVATION_LIPSCHITZ = {"none": 1.0, "relu": 1.0, "relu6": 1.0, "hardswish": 1.5, "sigmoid": 0.25, "silu": 1.1,
                        "leakyrelu": 1.0}
ACTIVATION_UNITS = {"none": 0, "relu": 0, "relu6": 0, "hardswish": 4, "sigmoid": 8, "silu": 10, "leakyrelu": 1}


def activate(y: np.ndarray, activation: str, alpha: float = 0.0) -> np.ndarray:
    """An epilogue activation in y's dtype (the float64 oracle)."""
    if activation == "relu":
        return np.maximum(y, 0)
    if activation == "relu6":
        return np.clip(y, 0, 6)
    if activation == "hardswish":
        return y * np.clip(y / 6 + 0.5, 0, 1)
    if activation == "sigmoid":
        return 1 / (1 + np.exp(-y))
    if activation == "silu":
        return y / (1 + np.exp(-y))
    if activation == "leakyrelu":
        return np.where(y >= 0, y, alpha * y)
    return y


def activation_lipschitz(activation: str, alpha: float = 0.0) -> float:
    return max(1.0, abs(alpha)) if activation == "leakyrelu" else ACTIVATION_LIPSCHITZ[activation]


def activation_bound(pre_bound, pre: np.ndarray, activation: str, alpha: float = 0.0) -> np.ndarray:
    """Bound on |act(y~) - act(y)| given |y~ - y| <= pre_bound at the computed pre-activation pre
    (float64): the activation's Lipschitz constant times pre_bound, plus its own evaluation
    roundings (ACTIVATION_UNITS of the larger of |act(pre)| and, for hardswish, |pre|)."""
    out = activation_lipschitz(activation, alpha) * np.asarray(pre_bound, np.float64)
    units = ACTIVATION_UNITS[activation]
    if units:
        pre = np.asarray(pre, np.float64)
        reach = np.abs(pre) + out
        magnitude = np.abs(activate(pre, activation, alpha)) + out
        if activation == "hardswish":
            magnitude = np.maximum(magnitude, reach)
        out = out + _gamma(units) * magnitude + np.finfo(np.float32).tiny
    return out


def _epilogue(out: np.ndarray, bias: np.ndarray, spec: OperatorSpec, bias_axis: int,
              residual: Optional[np.ndarray] = None) -> np.ndarray:
    if spec.epilogue.bias:
        shape = [1] * out.ndim
        shape[bias_axis] = -1
        out = out + bias.astype(out.dtype).reshape(shape)
    if spec.epilogue.residual:
        if residual is None:
            raise ValueError(f"{spec.describe()}: the reference needs the residual addend")
        out = out + np.asarray(residual).astype(out.dtype).reshape(out.shape)
    return activate(out, spec.epilogue.activation, spec.epilogue.alpha)


def _windows(x: np.ndarray, spec: _WindowedSpec) -> np.ndarray:
    """View of x padded, as [N, C, OH, OW, R, S] windows (strided, no copy of the windows)."""
    xp = np.pad(x, ((0, 0), (0, 0), (spec.pad_top, spec.pad_bottom), (spec.pad_left, spec.pad_right)))
    n, c, hp, wp = xp.shape
    sn, sc, sh, sw = xp.strides
    return np.lib.stride_tricks.as_strided(
        xp, shape=(n, c, spec.out_h, spec.out_w, spec.r, spec.s),
        strides=(sn, sc, sh * spec.stride_h, sw * spec.stride_w, sh * spec.dilation_h, sw * spec.dilation_w),
        writeable=False)


def reference(spec: OperatorSpec, a: np.ndarray, b: np.ndarray, bias: np.ndarray,
              dtype=np.float64, residual: Optional[np.ndarray] = None) -> np.ndarray:
    """The numpy oracle. Computed in float64 by default so that it is exact enough to judge fp32.
    residual: the addend of an epilogue with a residual (what the output buffer holds on entry)."""
    a = a.astype(dtype)
    b = b.astype(dtype)
    if isinstance(spec, MatmulSpec):
        return _epilogue(np.matmul(a, b), bias, spec, bias_axis=2, residual=residual)
    windows = _windows(a, spec)
    if isinstance(spec, Conv2dSpec):
        out = np.einsum("ncxyrs,kcrs->nkxy", windows, b, optimize=True)
    else:
        out = np.einsum("ncxyrs,crs->ncxy", windows, b[:, 0], optimize=True)
    return _epilogue(out, bias, spec, bias_axis=1, residual=residual)


def magnitude(spec: OperatorSpec, a: np.ndarray, b: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Per-element M_e = sum_i |a_i b_i| (+ |bias| when fused), in float64: what rounding errors scale with."""
    plain = type(spec)(**spec.shape_dict())
    mag = reference(plain, np.abs(a), np.abs(b), None)
    if spec.epilogue.bias:
        bias_axis = 2 if isinstance(spec, MatmulSpec) else 1
        shape = [-1 if axis == bias_axis else 1 for axis in range(mag.ndim)]
        mag = mag + np.abs(bias).astype(np.float64).reshape(shape)
    return mag


def _gamma(k: int) -> float:
    unit = np.float64(2.0 ** -24)
    return float(k * unit / (1 - k * unit))


def error_bound(spec: OperatorSpec, a: np.ndarray, b: np.ndarray, bias: np.ndarray,
                mag: np.ndarray | None = None) -> np.ndarray:
    """Per-element bound on |fp32 kernel - exact| from the standard dot-product error analysis.

    Any summation order of a length-K fp32 dot product with FMA satisfies
    |computed - exact| <= gamma_K * sum_i |a_i b_i|, gamma_K = K u / (1 - K u), u = 2^-24;
    the bias add and the final rounding add two more units. The bound depends only on K and on
    the data, not on a tuned constant. ReLU/ReLU6 are 1-Lipschitz, so the bound carries through.
    """
    mag = magnitude(spec, a, b, bias) if mag is None else mag
    return _gamma(spec.reduction_size + 2) * mag + np.finfo(np.float32).tiny


def compare_to_bound(expected: np.ndarray, got, bound: np.ndarray, variance: np.ndarray | None = None,
                     k: int = 0):
    """Verdict of got against expected under a per-element bound (and, given the per-element
    variance bound of accuracy.py, the RMS check). Unpacks as (ok, max_abs_error, worst_ratio)."""
    return judge(expected, got, bound, variance, k)


def check_output(spec: OperatorSpec, got: np.ndarray, a: np.ndarray, b: np.ndarray, bias: np.ndarray, *,
                 statistical: bool = True, winograd_m: int = 0):
    """Compare a kernel's output with the reference: a Verdict (see accuracy.py) that unpacks as
    (ok, max_abs_error, worst_ratio). ok needs every element finite and within the worst-case
    bound, and, when statistical and K and the output are large enough, the RMS error within the
    sqrt(K) limit. The statistical model assumes inputs with random mantissas (make_inputs).
    winograd_m: the output of a Winograd plan with that tile size (CpuKernelPlan.winograd_m) is
    judged under its own derived bound (xfc/ops/winograd.py); 0: a direct plan."""
    if spec.epilogue.residual:
        raise ValueError(f"{spec.describe()}: a residual epilogue needs its addend: check_extended_output")
    if spec.epilogue.extended:
        return check_extended_output(spec, got, a, b, bias, winograd_m=winograd_m)
    if winograd_m:
        return check_winograd_output(spec, winograd_m, got, a, b, bias)
    mag = magnitude(spec, a, b, bias)
    k = spec.reduction_size
    variance = variance_bound(k, mag) if statistical else None
    return judge(reference(spec, a, b, bias), got, error_bound(spec, a, b, bias, mag), variance, k)


def check_extended_output(spec: OperatorSpec, got, a: np.ndarray, b: np.ndarray, bias: Optional[np.ndarray],
                          residual: Optional[np.ndarray] = None, winograd_m: int = 0) -> Verdict:
    """The verdict for a kernel whose epilogue is extended (Epilogue.extended: a residual addend
    and/or a network activation). The pre-activation y = W x + b + r is bounded as for a plain
    kernel (the K-derived bound, or the Winograd bound for a Winograd plan) plus the two roundings
    of the residual add, gamma_2 (|r| + |y|); the activation then scales it by its Lipschitz
    constant and adds its own evaluation roundings (activation_bound). No RMS check: its model
    counts the roundings of a plain dot product."""
    from .spec import Epilogue
    plain = _replace_epilogue(spec, Epilogue(bias=spec.epilogue.bias))
    pre = reference(plain, a, b, bias)
    if winograd_m:
        pre_bound = winograd_error_bound(plain, a, b, bias, winograd_m)
    else:
        pre_bound = error_bound(plain, a, b, bias)
    if spec.epilogue.residual:
        r = np.asarray(residual, np.float64).reshape(pre.shape)
        pre = pre + r
        pre_bound = pre_bound + _gamma(2) * (np.abs(r) + np.abs(pre))
    expected = activate(pre, spec.epilogue.activation, spec.epilogue.alpha)
    return judge(expected, got, activation_bound(pre_bound, pre, spec.epilogue.activation, spec.epilogue.alpha))


def _replace_epilogue(spec: OperatorSpec, epilogue) -> OperatorSpec:
    return type(spec)(**spec.shape_dict(), epilogue=epilogue)


def check_winograd_output(spec: Conv2dSpec, m: int, got, a: np.ndarray, b: np.ndarray, bias: np.ndarray) -> Verdict:
    """The verdict for the output of a Winograd plan with tile size m: finite, and within the
    derived Winograd bound (xfc/ops/winograd.py) of the float64 direct reference. No RMS check
    (its model counts the rounding events of a direct dot product)."""
    return judge(reference(spec, a, b, bias), got, winograd_error_bound(spec, a, b, bias, m))


# ---------------------------------------------------------------------------------------------
# fp16 storage, fp32 arithmetic (the GPU kernel variant that runs everywhere).
# ---------------------------------------------------------------------------------------------
# Checking GPU kernel outputs against the numpy reference.
#
# fp32 kernels are judged by `check_output` unchanged (K-derived bound and, at large K,
# the sqrt(K) RMS limit of accuracy.py).
#
# The fp16-storage / fp32-arithmetic variant sees inputs rounded to fp16 and rounds its result to
# fp16 once when storing. It is judged against the reference evaluated on the *rounded* inputs
# (exactly what the kernel read), with the same K-derived fp32 accumulation bound plus the one
# final rounding of vstore_half_rte: half a unit in the last place of fp16, <= 2^-11 |value| for
# normal results, 2^-25 absolute in the subnormal range. For the RMS check that final rounding
# adds its own variance: a relative error uniform within half an fp16 ulp has a mean square of at
# most (2 * 2^-11)^2 / 12 = 2^-22 / 3 times the value squared (the same argument as for fp32 in
# accuracy.py), so each element's variance bound grows by 2^-22 / 3 * (|exact| + bound)^2.

HALF_UNIT_ROUNDOFF = 2.0 ** -11
HALF_SUBNORMAL_HALF_ULP = 2.0 ** -25


def round_to_half(*arrays):
    return tuple(None if x is None else np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)
                 for x in arrays)


def check_fp16_storage_output(spec, got, a, b, bias):
    """Verdict (unpacks as (ok, max_abs_error, worst_ratio)) for a kernel with fp16 storage and
    fp32 arithmetic."""
    a16, b16, bias16 = round_to_half(a, b, bias)
    expected = reference(spec, a16, b16, bias16)
    mag = magnitude(spec, a16, b16, bias16)
    bound = error_bound(spec, a16, b16, bias16, mag)
    # the fp32 accumulation error (bound) can move the stored value; round that up too
    reach = np.abs(expected) + bound
    variance = variance_bound(spec.reduction_size, mag) + HALF_UNIT_ROUNDOFF ** 2 / 3.0 * np.square(reach)
    bound = bound + HALF_UNIT_ROUNDOFF * reach + HALF_SUBNORMAL_HALF_ULP
    return compare_to_bound(expected, got, bound, variance, spec.reduction_size)


def check_variant_output(variant: str, spec, got, a, b, bias):
    """The verdict for a GPU kernel variant: 'fp32' (check_output) or 'fp16_storage'."""
    if variant == "fp32":
        return check_output(spec, got, a, b, bias)
    if variant == "fp16_storage":
        return check_fp16_storage_output(spec, got, a, b, bias)
    raise ValueError(f"no run-time check for kernel variant {variant}")
