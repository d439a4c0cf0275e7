"""Quantized int8 operators: parameters, validation, deterministic inputs, the exact reference and
the verdict.

Semantics (ONNX QLinearMatMul / QLinearConv, with the bias and activation fusion mobile libraries
add):

    acc[o]  = sum_i (x_i - x_zero_point) * w_i  (+ bias[o])           exact, int32
    y[o]    = clamp(rint_even(fp32(acc[o]) * multiplier[o]) + y_zero_point, lo, hi)

  - x (activations): uint8 or int8 with a per-tensor zero point in the type's range; padded
    positions of a convolution hold x_zero_point (they contribute nothing).
  - w (weights): int8, zero point 0, one scale (per tensor) or one per output channel (matmul:
    column n; conv2d: output channel k; depthwise: channel c).
  - bias: int32 with scale x_scale * w_scale[o] (the ONNX QLinearConv convention).
  - multiplier[o] = fp32(x_scale * w_scale[o] / y_scale), computed once in float64 and rounded to
    fp32: kernel and reference use the same fp32 multipliers. fp32(acc) rounds to nearest even
    (as cvtdq2ps does), the product is one fp32 multiply, rint_even is round half to even (the
    default SSE/AVX rounding mode and numpy's rint), then the output zero point is added and the
    result saturates to the output type (the output type is the activation type).
  - fused activation as a clamp in the quantized domain: relu: lo = max(qmin, y_zero_point);
    relu6: additionally hi = min(qmax, y_zero_point + rint_even(6 / y_scale)).
Clamping the product to [lo - zp, hi - zp] before rounding gives the same result as rounding first
(the bounds are integers and rounding is monotonic) and keeps the float-to-int conversion in range;
the kernels do it that way.

int32 range: every |(x - zp) * w| <= 255 * 128 = 32640, so a reduction of K terms stays within
int32 when K * 32640 + |bias| < 2^31: K <= MAX_INT8_REDUCTION = 65536 leaves |bias| < 2^23 free.
Longer reductions are refused (exit 2); the reference checks the int32 range of every accumulator
in int64 and raises rather than wrap. Kernels that accumulate the shifted (unsigned) products
wrap modulo 2^32 in intermediate sums; the final value is exact because it fits int32.

The verdict is exact: every output byte must equal the reference (tolerance_lsb = 0: no rounding
shortcut is used by any host kernel); the report carries the exact-match share and the largest
difference in LSB either way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

from ..errors import OperatorError
from .spec import Conv2dSpec, DepthwiseSpec, MatmulSpec, OperatorSpec, _WindowedSpec

ACT_TYPES = ("uint8", "int8")
TYPE_RANGE = {"uint8": (0, 255), "int8": (-128, 127)}
MAX_INT8_REDUCTION = 65536
INT32_MAX = 2 ** 31 - 1
PRODUCT_MAX = 255 * 128
# Per-channel weight scales when only a base scale is given: base * 2^(e/4), e cycling through
# -4..4 (0.5x .. 2x), so neighbouring channels get different multipliers.
PER_CHANNEL_STEPS = 9


NARROW_WEIGHT_MAX = 64      # QuantParams.narrow_weights: |w| <= this for every weight


@dataclass(frozen=True)
class QuantParams:
    """Quantization parameters of one int8 operator. w_scales: None = per tensor (w_scale),
    else one scale per output channel. out_scale None = 'auto' (see resolve_out_scale)."""

    act_type: str = "uint8"
    a_scale: float = 0.02
    a_zero_point: int = 0
    w_scale: float = 0.01
    per_channel: bool = False
    out_scale: Optional[float] = None
    out_zero_point: int = 0
    # Every weight within +-NARROW_WEIGHT_MAX (7-bit: what onnxruntime's quantize_static writes with
    # reduce_range): a pair of u8 x s8 products then sums within int16 (255 x 128 <= 32767), so x86
    # kernels without VNNI may use vpmaddubsw. Known where the weights are (a model's layers); the
    # kernel's pre-pack refuses weights outside it.
    narrow_weights: bool = False

    @property
    def out_type(self) -> str:
        return self.act_type

    @property
    def shift(self) -> int:
        """Added to activations to make them unsigned for u8 x s8 dot products (int8: 128)."""
        return 128 if self.act_type == "int8" else 0

    def describe(self) -> str:
        w = f"w_scale={self.w_scale:g}{' per-channel' if self.per_channel else ''}"
        return (f"{self.act_type} x_scale={self.a_scale:g} x_zp={self.a_zero_point} {w} "
                f"y_scale={self.out_scale:g} y_zp={self.out_zero_point}")

    def as_dict(self) -> dict:
        return {"act_type": self.act_type, "a_scale": self.a_scale, "a_zero_point": self.a_zero_point,
                "w_scale": self.w_scale, "per_channel": self.per_channel, "out_scale": self.out_scale,
                "out_zero_point": self.out_zero_point, "out_type": self.out_type,
                "narrow_weights": self.narrow_weights}


def _check_scale(field: str, value) -> float:
    try:
        scale = float(value)
    except (TypeError, ValueError):
        raise OperatorError(f"--quant {field}={value!r} is not a number") from None
    if not math.isfinite(scale) or scale <= 0:
        raise OperatorError(f"--quant {field}={value} must be a finite scale > 0")
    return scale


def _check_zero_point(field: str, value, act_type: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise OperatorError(f"--quant {field}={value!r} must be an integer")
    lo, hi = TYPE_RANGE[act_type]
    if not lo <= int(value) <= hi:
        raise OperatorError(f"--quant {field}={value} is out of range for {act_type} ({lo}..{hi})")
    return int(value)


def validate(q: QuantParams) -> QuantParams:
    """The parameters, checked: one-line OperatorError (exit 2) naming the field and value."""
    if q.act_type not in ACT_TYPES:
        raise OperatorError(f"--quant act={q.act_type} is not one of {', '.join(ACT_TYPES)}")
    _check_scale("a_scale", q.a_scale)
    _check_scale("w_scale", q.w_scale)
    if q.out_scale is not None:
        _check_scale("out_scale", q.out_scale)
    _check_zero_point("a_zp", q.a_zero_point, q.act_type)
    _check_zero_point("out_zp", q.out_zero_point, q.out_type)
    return q


QUANT_KEYS = ("act", "a_scale", "a_zp", "w_scale", "per_channel", "out_scale", "out_zp", "narrow_weights")


def parse_quant(text: Optional[str], act_type: Optional[str] = None) -> QuantParams:
    """'act=int8,a_scale=0.02,a_zp=-3,w_scale=0.01,per_channel=1,out_scale=auto,out_zp=0,narrow_weights=1'
    (narrow_weights: every weight within +-64, QuantParams.narrow_weights).
    Missing keys keep the defaults; the default zero points are the middle of the type (128 / 0)."""
    values: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in str(text or "").split(","))):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in QUANT_KEYS:
            raise OperatorError(f"--quant item '{item}' is not one of {', '.join(k + '=' for k in QUANT_KEYS)}")
        if key in values:
            raise OperatorError(f"--quant key '{key}' is given twice")
        values[key] = value.strip()
    act = values.get("act", act_type or "uint8")
    if act not in ACT_TYPES:
        raise OperatorError(f"--quant act={act} is not one of {', '.join(ACT_TYPES)}")
    middle = 128 if act == "uint8" else 0

    def integer(key: str, default: int) -> int:
        if key not in values:
            return default
        try:
            return int(values[key])
        except ValueError:
            raise OperatorError(f"--quant {key}={values[key]!r} must be an integer") from None

    per_channel = values.get("per_channel", "0").lower()
    if per_channel not in ("0", "1", "true", "false", "yes", "no"):
        raise OperatorError(f"--quant per_channel={per_channel} must be 0 or 1")
    narrow = values.get("narrow_weights", "0").lower()
    if narrow not in ("0", "1", "true", "false", "yes", "no"):
        raise OperatorError(f"--quant narrow_weights={narrow} must be 0 or 1")
    out_scale = values.get("out_scale", "auto")
    q = QuantParams(act_type=act, a_scale=_check_scale("a_scale", values.get("a_scale", "0.02")),
                    a_zero_point=integer("a_zp", middle), w_scale=_check_scale("w_scale", values.get("w_scale", "0.01")),
                    per_channel=per_channel in ("1", "true", "yes"),
                    out_scale=None if out_scale.lower() == "auto" else _check_scale("out_scale", out_scale),
                    out_zero_point=integer("out_zp", middle), narrow_weights=narrow in ("1", "true", "yes"))
    return validate(q)


# ---------------------------------------------------------------------------------------------
# Facts derived from (spec, params)
# ---------------------------------------------------------------------------------------------

def channels(spec: OperatorSpec) -> int:
    """Output channels (the axis of per-channel scales, bias and multipliers)."""
    if isinstance(spec, MatmulSpec):
        return spec.n
    if isinstance(spec, Conv2dSpec):
        return spec.k
    return spec.c


def channel_axis(spec: OperatorSpec) -> int:
    return 2 if isinstance(spec, MatmulSpec) else 1


def check_spec(spec: OperatorSpec) -> OperatorSpec:
    """An int8 spec must keep its int32 accumulators in range (see the module docstring) and ask
    only for what int8 kernels fuse: bias and relu / relu6 (requantization clamps)."""
    if spec.epilogue.extended:
        raise OperatorError(f"{spec.name} int8: epilogue '{spec.epilogue.describe()}' has no int8 kernels "
                            f"(int8 fuses bias and relu or relu6)")
    if spec.reduction_size > MAX_INT8_REDUCTION:
        raise OperatorError(f"{spec.name} int8: reduction size {spec.reduction_size} exceeds {MAX_INT8_REDUCTION} "
                            f"(K x 255 x 128 must stay within int32)")
    return spec


def resolve_out_scale(spec: OperatorSpec, q: QuantParams) -> QuantParams:
    """out_scale 'auto': the accumulator spread of random full-range inputs (sqrt(K) x 74 x 74,
    74 ~ the standard deviation of a uniform byte) mapped to about +-48 output steps, so that
    outputs use the range and some saturate."""
    if q.out_scale is not None:
        return q
    spread = math.sqrt(spec.reduction_size) * 74.0 * 74.0
    return replace(q, out_scale=float(np.float32(q.a_scale * q.w_scale * spread / 48.0)))


def weight_scales(spec: OperatorSpec, q: QuantParams) -> np.ndarray:
    n = channels(spec)
    if not q.per_channel:
        return np.full(n, q.w_scale, np.float64)
    steps = (np.arange(n) * 7) % PER_CHANNEL_STEPS - PER_CHANNEL_STEPS // 2
    return q.w_scale * np.exp2(steps / 4.0)


def multipliers(spec: OperatorSpec, q: QuantParams) -> np.ndarray:
    """fp32 requantization multipliers, one per output channel (the kernels' `mult` input)."""
    q = resolve_out_scale(spec, q)
    mult = q.a_scale * weight_scales(spec, q) / q.out_scale
    f32 = np.finfo(np.float32)
    if not np.all(np.isfinite(mult)) or mult.max() > f32.max or mult.min() < f32.tiny:
        raise OperatorError(f"--quant a_scale x w_scale / out_scale = {float(mult.max()):g} is not a normal fp32 "
                            f"multiplier (over- or underflows fp32)")
    return mult.astype(np.float32)


def clamp_bounds(spec: OperatorSpec, q: QuantParams) -> tuple[int, int]:
    """(lo, hi) of the output in the quantized domain: the type's range, cut by ReLU / ReLU6."""
    q = resolve_out_scale(spec, q)
    lo, hi = TYPE_RANGE[q.out_type]
    act = spec.epilogue.activation
    if act in ("relu", "relu6"):
        lo = max(lo, q.out_zero_point)
    if act == "relu6":
        hi = min(hi, q.out_zero_point + int(np.rint(6.0 / q.out_scale)))
    return lo, max(lo, hi)


def np_type(name: str):
    return np.uint8 if name == "uint8" else np.int8


# ---------------------------------------------------------------------------------------------
# Inputs, reference, verdict
# ---------------------------------------------------------------------------------------------

def bias_limit(spec: OperatorSpec) -> int:
    """Largest |bias| for which every accumulator provably stays within int32."""
    return max(0, min(1 << 23, INT32_MAX - spec.reduction_size * PRODUCT_MAX))


def make_qinputs(spec: OperatorSpec, q: QuantParams, seed: int = 0, mode: str = "random"):
    """Deterministic (x, w, bias) for an int8 spec. mode 'random': full-range uniform bytes and a
    bias of about one accumulator spread (within bias_limit); 'extreme': x at the end of its range farthest from the zero point and
    w = -128 everywhere (the largest |accumulator|: K x 255 x 128 with zero points at the ends)."""
    rng = np.random.default_rng(seed)
    lo, hi = TYPE_RANGE[q.act_type]
    x_shape, w_shape, b_shape = spec.operand_shapes
    if mode == "extreme":
        far = lo if abs(lo - q.a_zero_point) >= abs(hi - q.a_zero_point) else hi
        x = np.full(x_shape, far, np_type(q.act_type))
        w = np.full(w_shape, -NARROW_WEIGHT_MAX if q.narrow_weights else -128, np.int8)
        bias = np.zeros(b_shape, np.int32)
    elif mode == "random":
        x = rng.integers(lo, hi + 1, size=x_shape).astype(np_type(q.act_type))
        w_lo, w_hi = (-NARROW_WEIGHT_MAX, NARROW_WEIGHT_MAX) if q.narrow_weights else (-128, 127)
        w = rng.integers(w_lo, w_hi + 1, size=w_shape).astype(np.int8)
        limit = min(bias_limit(spec), int(math.sqrt(spec.reduction_size) * 74 * 74))   # about one accumulator spread
        bias = rng.integers(-limit, limit + 1, size=b_shape).astype(np.int32)
    else:
        raise ValueError(f"unknown input mode {mode!r}")
    if not spec.epilogue.bias:
        bias = np.zeros(b_shape, np.int32)
    return x, w, bias


def _windows(x: np.ndarray, spec: _WindowedSpec, pad_value) -> np.ndarray:
    xp = np.pad(x, ((0, 0), (0, 0), (spec.pad_top, spec.pad_bottom), (spec.pad_left, spec.pad_right)),
                constant_values=pad_value)
    n, c, hp, wp = xp.shape
    sn, sc, sh, sw = xp.strides
    return np.lib.stride_tricks.as_strided(
        xp, shape=(n, c, spec.out_h, spec.out_w, spec.r, spec.s),
        strides=(sn, sc, sh * spec.stride_h, sw * spec.stride_w, sh * spec.dilation_h, sw * spec.dilation_w),
        writeable=False)


def accumulators(spec: OperatorSpec, q: QuantParams, x, w, bias) -> np.ndarray:
    """The exact int32 accumulators (as int64), bias included. Sums are taken in float64, exact
    here: every partial sum is an integer below 2^53. Raises if one leaves int32."""
    xs = np.asarray(x).astype(np.float64) - q.a_zero_point
    w64 = np.asarray(w).astype(np.float64)
    if isinstance(spec, MatmulSpec):
        acc = np.matmul(xs, w64)
    elif isinstance(spec, Conv2dSpec):
        acc = np.einsum("ncxyrs,kcrs->nkxy", _windows(xs, spec, 0.0), w64, optimize=True)
    elif isinstance(spec, DepthwiseSpec):
        acc = np.einsum("ncxyrs,crs->ncxy", _windows(xs, spec, 0.0), w64[:, 0], optimize=True)
    else:
        raise OperatorError(f"{spec.name} has no int8 reference")
    acc = np.rint(acc).astype(np.int64)
    if spec.epilogue.bias:
        shape = [1] * acc.ndim
        shape[channel_axis(spec)] = -1
        acc = acc + np.asarray(bias, np.int64).reshape(shape)
    if acc.size and (acc.max() > INT32_MAX or acc.min() < -INT32_MAX - 1):
        raise OperatorError(f"{spec.name} int8: an accumulator ({int(np.abs(acc).max())}) leaves int32; "
                            f"keep |bias| <= {bias_limit(spec)}")
    return acc


def requantize(acc: np.ndarray, spec: OperatorSpec, q: QuantParams, mult: Optional[np.ndarray] = None) -> np.ndarray:
    """int32 accumulators -> output bytes (module docstring): fp32 multiply, clamp, round half to
    even, add the zero point. mult: the fp32 multipliers per output channel (default: multipliers(spec,
    q); a quantized model brings its own, xfc.model.quantized)."""
    q = resolve_out_scale(spec, q)
    shape = [1] * acc.ndim
    shape[channel_axis(spec)] = -1
    mult = (multipliers(spec, q) if mult is None else np.asarray(mult, np.float32)).reshape(shape)
    lo, hi = clamp_bounds(spec, q)
    scaled = acc.astype(np.float32) * mult                                       # one fp32 multiply
    scaled = np.clip(scaled, np.float32(lo - q.out_zero_point), np.float32(hi - q.out_zero_point))
    return (np.rint(scaled).astype(np.int64) + q.out_zero_point).astype(np_type(q.out_type))


def qreference(spec: OperatorSpec, q: QuantParams, x, w, bias) -> np.ndarray:
    return requantize(accumulators(spec, q, x, w, bias), spec, q)


@dataclass(frozen=True)
class QVerdict:
    ok: bool
    exact_share: float        # share of output bytes equal to the reference
    max_lsb: int              # largest |kernel - reference| in output steps
    mismatches: int
    saturated_share: float    # share of reference outputs at lo or hi (saturation exercised)
    reason: Optional[str]

    def as_dict(self) -> dict:
        return {"ok": self.ok, "exact_share": self.exact_share, "max_lsb": self.max_lsb,
                "mismatches": self.mismatches, "saturated_share": self.saturated_share, "reason": self.reason}


def check_qoutput(spec: OperatorSpec, q: QuantParams, got, x, w, bias, tolerance_lsb: int = 0,
                  expected: Optional[np.ndarray] = None) -> QVerdict:
    expected = qreference(spec, q, x, w, bias) if expected is None else expected
    got = np.asarray(got)
    if got.shape != expected.shape:
        return QVerdict(False, 0.0, -1, expected.size, 0.0, f"output shape {got.shape}, expected {expected.shape}")
    diff = np.abs(got.astype(np.int64) - expected.astype(np.int64))
    mismatches = int(np.count_nonzero(diff))
    max_lsb = int(diff.max()) if diff.size else 0
    lo, hi = clamp_bounds(spec, q)
    saturated = float(np.mean((expected == lo) | (expected == hi))) if expected.size else 0.0
    ok = max_lsb <= tolerance_lsb
    reason = None
    if not ok:
        where = np.unravel_index(int(np.argmax(diff)), diff.shape)
        reason = (f"{mismatches} of {expected.size} outputs differ, up to {max_lsb} LSB (at {tuple(map(int, where))}: "
                  f"got {int(got[where])}, expected {int(expected[where])})")
    share = 1.0 - mismatches / expected.size if expected.size else 1.0
    return QVerdict(ok, share, max_lsb, mismatches, saturated, reason)
