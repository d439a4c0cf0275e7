"""Operator specifications: shapes, validation, FLOP counts, numpy references and inputs.

Layouts (fp32, row-major / C order):
  matmul     A[batch, M, K] @ B[batch, K, N] (+ bias[N]) -> C[batch, M, N]
  conv2d     input[N, C, H, W] * weight[K, C, R, S] (+ bias[K]) -> out[N, K, OH, OW]
  depthwise  input[N, C, H, W] * weight[C, 1, R, S] (+ bias[C]) -> out[N, C, OH, OW]
The epilogue (bias, then ReLU or ReLU6) is part of the spec because mobile models fuse it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np

from .accuracy import Verdict, judge, variance_bound  # noqa: F401  (Verdict: re-exported)
from .errors import OperatorError

ACTIVATIONS = ("none", "relu", "relu6")
OPERATORS = ("matmul", "conv2d", "depthwise")


@dataclass(frozen=True)
class Epilogue:
    bias: bool = False
    activation: str = "none"  # one of ACTIVATIONS

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise OperatorError(
                f"unknown activation '{self.activation}' (expected one of {', '.join(ACTIVATIONS)})")

    def describe(self) -> str:
        parts = (["bias"] if self.bias else []) + ([self.activation] if self.activation != "none" else [])
        return "+".join(parts) if parts else "none"


@dataclass(frozen=True)
class MatmulSpec:
    m: int
    n: int
    k: int
    batch: int = 1
    epilogue: Epilogue = Epilogue()
    name = "matmul"

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k

    @property
    def reduction_size(self) -> int:
        return self.k

    @property
    def input_shapes(self) -> tuple[tuple[int, ...], ...]:
        return ((self.batch, self.m, self.k), (self.batch, self.k, self.n), (self.n,))

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.batch, self.m, self.n)

    def key(self) -> str:
        return f"matmul_b{self.batch}_m{self.m}_n{self.n}_k{self.k}_{self.epilogue.describe()}"

    def describe(self) -> str:
        b = f"batch={self.batch} " if self.batch != 1 else ""
        return f"matmul {b}M={self.m} N={self.n} K={self.k} epilogue={self.epilogue.describe()}"


@dataclass(frozen=True)
class _WindowedSpec:
    """Shared geometry of conv2d and depthwise: a sliding R x S window over H x W."""

    n: int
    c: int
    h: int
    w: int
    r: int
    s: int
    stride_h: int = 1
    stride_w: int = 1
    pad_top: int = 0
    pad_left: int = 0
    pad_bottom: int = 0
    pad_right: int = 0
    dilation_h: int = 1
    dilation_w: int = 1

    @property
    def out_h(self) -> int:
        return (self.h + self.pad_top + self.pad_bottom - self.dilation_h * (self.r - 1) - 1) // self.stride_h + 1

    @property
    def out_w(self) -> int:
        return (self.w + self.pad_left + self.pad_right - self.dilation_w * (self.s - 1) - 1) // self.stride_w + 1

    @property
    def pointwise(self) -> bool:
        """1x1, stride 1, no padding: the input image is already the [C][H*W] GEMM operand."""
        return (self.r == self.s == 1 and self.stride_h == self.stride_w == 1
                and self.pad_top == self.pad_left == self.pad_bottom == self.pad_right == 0)

    def _geometry_key(self) -> str:
        return (f"n{self.n}_c{self.c}_h{self.h}_w{self.w}_r{self.r}_s{self.s}"
                f"_st{self.stride_h}x{self.stride_w}"
                f"_p{self.pad_top}.{self.pad_left}.{self.pad_bottom}.{self.pad_right}"
                f"_d{self.dilation_h}x{self.dilation_w}")

    def _geometry_text(self) -> str:
        return (f"N={self.n} C={self.c} H={self.h} W={self.w} R={self.r} S={self.s} "
                f"stride={self.stride_h}x{self.stride_w} "
                f"pad(t,l,b,r)=({self.pad_top},{self.pad_left},{self.pad_bottom},{self.pad_right}) "
                f"dilation={self.dilation_h}x{self.dilation_w}")


@dataclass(frozen=True)
class Conv2dSpec(_WindowedSpec):
    k: int = 1  # output channels (number of filters)
    epilogue: Epilogue = Epilogue()
    name = "conv2d"

    @property
    def flops(self) -> int:
        return 2 * self.n * self.k * self.out_h * self.out_w * self.c * self.r * self.s

    @property
    def reduction_size(self) -> int:
        return self.c * self.r * self.s

    @property
    def input_shapes(self):
        return ((self.n, self.c, self.h, self.w), (self.k, self.c, self.r, self.s), (self.k,))

    @property
    def output_shape(self):
        return (self.n, self.k, self.out_h, self.out_w)

    def key(self) -> str:
        return f"conv2d_{self._geometry_key()}_k{self.k}_{self.epilogue.describe()}"

    def describe(self) -> str:
        return f"conv2d {self._geometry_text()} K={self.k} epilogue={self.epilogue.describe()}"


@dataclass(frozen=True)
class DepthwiseSpec(_WindowedSpec):
    epilogue: Epilogue = Epilogue()
    name = "depthwise"

    @property
    def flops(self) -> int:
        return 2 * self.n * self.c * self.out_h * self.out_w * self.r * self.s

    @property
    def reduction_size(self) -> int:
        return self.r * self.s

    @property
    def input_shapes(self):
        return ((self.n, self.c, self.h, self.w), (self.c, 1, self.r, self.s), (self.c,))

    @property
    def output_shape(self):
        return (self.n, self.c, self.out_h, self.out_w)

    def key(self) -> str:
        return f"depthwise_{self._geometry_key()}_{self.epilogue.describe()}"

    def describe(self) -> str:
        return f"depthwise {self._geometry_text()} epilogue={self.epilogue.describe()}"


OperatorSpec = Union[MatmulSpec, Conv2dSpec, DepthwiseSpec]

# Largest single dimension and element count accepted: guards against typos like k=5120000
# that would silently try to allocate tens of GB.
MAX_DIM = 1 << 20
MAX_ELEMENTS = 1 << 31


def _validate(spec: OperatorSpec) -> OperatorSpec:
    fields = {f: getattr(spec, f) for f in spec.__dataclass_fields__ if f != "epilogue"}
    for field, value in fields.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise OperatorError(f"{spec.name}: '{field}' must be an integer, got {value!r}")
        minimum = 0 if field.startswith("pad_") else 1
        if value < minimum:
            raise OperatorError(f"{spec.name}: '{field}' must be >= {minimum}, got {value}")
        if value > MAX_DIM:
            raise OperatorError(f"{spec.name}: '{field}'={value} is larger than the supported {MAX_DIM}")
    if isinstance(spec, _WindowedSpec):
        if spec.out_h < 1 or spec.out_w < 1:
            raise OperatorError(
                f"{spec.name}: the {spec.r}x{spec.s} window (dilation {spec.dilation_h}x{spec.dilation_w}) does not fit "
                f"the padded {spec.h}x{spec.w} input; output would be {spec.out_h}x{spec.out_w}")
        if max(spec.pad_top, spec.pad_bottom) >= spec.dilation_h * (spec.r - 1) + 1 or \
                max(spec.pad_left, spec.pad_right) >= spec.dilation_w * (spec.s - 1) + 1:
            raise OperatorError(
                f"{spec.name}: padding ({spec.pad_top},{spec.pad_left},{spec.pad_bottom},{spec.pad_right}) "
                f"must be smaller than the {spec.r}x{spec.s} window extent")
    for shape in (*spec.input_shapes, spec.output_shape):
        if int(np.prod(shape, dtype=np.int64)) > MAX_ELEMENTS:
            raise OperatorError(f"{spec.name}: a tensor of shape {shape} exceeds {MAX_ELEMENTS} elements")
    return spec


def _int_list(text: str, what: str, allowed_lengths: tuple[int, ...]) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in str(text).split(","))
    except ValueError:
        raise OperatorError(f"{what} must be comma-separated integers, got '{text}'") from None
    if len(values) not in allowed_lengths:
        raise OperatorError(
            f"{what} takes {' or '.join(map(str, allowed_lengths))} values, got {len(values)} ('{text}')")
    return values


SHAPE_KEYS = {
    "matmul": (("m", "n", "k"), ("batch",)),
    "conv2d": (("c", "h", "w", "k", "r", "s"), ("n",)),
    "depthwise": (("c", "h", "w", "r", "s"), ("n",)),
}


def parse_shape(op: str, text: str) -> dict[str, int]:
    """Parse 'm=512,n=512,k=512' into a dict, checking the keys against the operator."""
    if op not in SHAPE_KEYS:
        raise OperatorError(f"unknown operator '{op}' (expected one of {', '.join(OPERATORS)})")
    required, optional = SHAPE_KEYS[op]
    values: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in str(text).split(","))):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep:
            raise OperatorError(f"--shape item '{item}' is not key=value (e.g. {required[0]}=64)")
        if key not in required + optional:
            raise OperatorError(
                f"--shape key '{key}' is not used by {op} (expected {', '.join(required + optional)})")
        if key in values:
            raise OperatorError(f"--shape key '{key}' is given twice")
        try:
            values[key] = int(value)
        except ValueError:
            raise OperatorError(f"--shape {key}='{value.strip()}' is not an integer") from None
    missing = [k for k in required if k not in values]
    if missing:
        raise OperatorError(f"--shape for {op} is missing {', '.join(missing)} (got '{text}')")
    return values


def make_spec(op: str, shape: dict[str, int], *, stride: str | tuple = "1", pad: str | tuple = "0",
              dilation: str | tuple = "1", bias: bool = False, activation: str = "none") -> OperatorSpec:
    """Build and validate a spec from CLI-style pieces. stride/pad/dilation accept '1', '1,2', (1, 2)."""
    epilogue = Epilogue(bias=bias, activation=activation)
    if op == "matmul":
        return _validate(MatmulSpec(m=shape["m"], n=shape["n"], k=shape["k"], batch=shape.get("batch", 1),
                                    epilogue=epilogue))
    if op not in ("conv2d", "depthwise"):
        raise OperatorError(f"unknown operator '{op}' (expected one of {', '.join(OPERATORS)})")

    def as_text(v):
        return ",".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)

    st = _int_list(as_text(stride), "--stride", (1, 2))
    dl = _int_list(as_text(dilation), "--dilation", (1, 2))
    pd = _int_list(as_text(pad), "--pad", (1, 2, 4))
    st = st * 2 if len(st) == 1 else st
    dl = dl * 2 if len(dl) == 1 else dl
    if len(pd) == 1:
        pd = pd * 4
    elif len(pd) == 2:
        pd = (pd[0], pd[1], pd[0], pd[1])
    geometry = dict(n=shape.get("n", 1), c=shape["c"], h=shape["h"], w=shape["w"], r=shape["r"], s=shape["s"],
                    stride_h=st[0], stride_w=st[1], pad_top=pd[0], pad_left=pd[1], pad_bottom=pd[2],
                    pad_right=pd[3], dilation_h=dl[0], dilation_w=dl[1])
    if op == "conv2d":
        return _validate(Conv2dSpec(k=shape["k"], epilogue=epilogue, **geometry))
    return _validate(DepthwiseSpec(epilogue=epilogue, **geometry))


# ---------------------------------------------------------------------------------------------
# Inputs, numpy references and the verification tolerance.
# ---------------------------------------------------------------------------------------------

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


def make_inputs(spec: OperatorSpec, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Deterministic fp32 inputs: (first operand, second operand, bias), uniform in [-1, 1); for a
    ReLU6 epilogue both operands are scaled by input_scale(spec) (same seed, same arrays)."""
    rng = np.random.default_rng(seed)
    a, b, bias = (rng.uniform(-1.0, 1.0, size=shape) for shape in spec.input_shapes)
    scale = input_scale(spec)
    return (a * scale).astype(np.float32), (b * scale).astype(np.float32), bias.astype(np.float32)


def _epilogue(out: np.ndarray, bias: np.ndarray, spec: OperatorSpec, bias_axis: int) -> np.ndarray:
    if spec.epilogue.bias:
        shape = [1] * out.ndim
        shape[bias_axis] = -1
        out = out + bias.astype(out.dtype).reshape(shape)
    if spec.epilogue.activation == "relu":
        out = np.maximum(out, 0)
    elif spec.epilogue.activation == "relu6":
        out = np.clip(out, 0, 6)
    return out


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
              dtype=np.float64) -> np.ndarray:
    """The numpy oracle. Computed in float64 by default so that it is exact enough to judge fp32."""
    a = a.astype(dtype)
    b = b.astype(dtype)
    if isinstance(spec, MatmulSpec):
        return _epilogue(np.matmul(a, b), bias, spec, bias_axis=2)
    windows = _windows(a, spec)
    if isinstance(spec, Conv2dSpec):
        out = np.einsum("ncxyrs,kcrs->nkxy", windows, b, optimize=True)
    else:
        out = np.einsum("ncxyrs,crs->ncxy", windows, b[:, 0], optimize=True)
    return _epilogue(out, bias, spec, bias_axis=1)


def magnitude(spec: OperatorSpec, a: np.ndarray, b: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Per-element M_e = sum_i |a_i b_i| (+ |bias| when fused), in float64: what rounding errors scale with."""
    plain = type(spec)(**{f: getattr(spec, f) for f in spec.__dataclass_fields__ if f != "epilogue"})
    mag = reference(plain, np.abs(a), np.abs(b), np.abs(bias))
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
    variance bound of xfc.accuracy, the RMS check). Unpacks as (ok, max_abs_error, worst_ratio)."""
    return judge(expected, got, bound, variance, k)


def check_output(spec: OperatorSpec, got: np.ndarray, a: np.ndarray, b: np.ndarray, bias: np.ndarray, *,
                 statistical: bool = True):
    """Compare a kernel's output with the reference: a Verdict (see xfc.accuracy) that unpacks as
    (ok, max_abs_error, worst_ratio). ok needs every element finite and within the worst-case
    bound, and, when statistical and K and the output are large enough, the RMS error within the
    sqrt(K) limit. The statistical model assumes inputs with random mantissas (make_inputs)."""
    mag = magnitude(spec, a, b, bias)
    k = spec.reduction_size
    variance = variance_bound(k, mag) if statistical else None
    return judge(reference(spec, a, b, bias), got, error_bound(spec, a, b, bias, mag), variance, k)
