"""Operator specifications (input 2): shapes, validation, FLOP counts, CLI shape parsing.

Layouts (fp32, row-major / C order):
  matmul     A[batch, M, K] @ B[batch, K, N] (+ bias[N]) -> C[batch, M, N]
  conv2d     input[N, C, H, W] * weight[K, C, R, S] (+ bias[K]) -> out[N, K, OH, OW]
  depthwise  input[N, C, H, W] * weight[C, 1, R, S] (+ bias[C]) -> out[N, C, OH, OW]
The epilogue (bias, then ReLU or ReLU6) is part of the spec because mobile models fuse it.

Facts about a spec that several stages need are computed here once: `gemm_view` (the GEMM an
operator lowers to), `window_rows` (the input rows a block of output rows reads) and
`shape_dict` (the size fields as a dict).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Union

import numpy as np

from ..errors import OperatorError

ACTIVATIONS = ("none", "relu", "relu6")   # what `xfc synth --activation` and the fuzzer choose from
# Epilogues the network runtime fuses besides (xfc/model/runtime): CPU fp32 kernels only; every other
# target refuses them. leakyrelu takes its slope from Epilogue.alpha.
NETWORK_ACTIVATIONS = ("hardswish", "sigmoid", "silu", "leakyrelu")
ALL_ACTIVATIONS = ACTIVATIONS + NETWORK_ACTIVATIONS
OPERATORS = ("matmul", "conv2d", "depthwise")
# Element types: fp32 everywhere; fp16 on the GPU target; int8 (xfc.ops.quant: ONNX QLinear*
# semantics) on x86-64 host kernels (xfc.cpu.int8_synth). Each target refuses a type it lacks.
DTYPES = ("fp32", "fp16", "int8")


@dataclass(frozen=True)
class Epilogue:
    """What a kernel does to each accumulated output, in this order: + bias, + residual, activation.

    residual: the output buffer holds an addend on entry (a residual Add fused into the layer that
    produces its other input), read before it is overwritten: out = act(acc + bias + out_in).
    alpha: the slope of leakyrelu (0 for every other activation)."""

    bias: bool = False
    activation: str = "none"  # one of ALL_ACTIVATIONS
    residual: bool = False
    alpha: float = 0.0

    def __post_init__(self):
        if self.activation not in ALL_ACTIVATIONS:
            raise OperatorError(
                f"unknown activation '{self.activation}' (expected one of {', '.join(ALL_ACTIVATIONS)})")
        if self.alpha and self.activation != "leakyrelu":
            raise OperatorError(f"epilogue alpha={self.alpha:g} is the slope of leakyrelu, not of '{self.activation}'")

    @property
    def extended(self) -> bool:
        """Uses what only the network runtime's CPU fp32 kernels do: a residual or a network activation."""
        return self.residual or self.activation in NETWORK_ACTIVATIONS

    def describe(self) -> str:
        act = f"leakyrelu{self.alpha:g}" if self.activation == "leakyrelu" else self.activation
        parts = (["bias"] if self.bias else []) + (["residual"] if self.residual else []) \
            + ([act] if self.activation != "none" else [])
        return "+".join(parts) if parts else "none"



class _Spec:
    """What every spec offers beside its fields.

    operand_shapes: the three operands of every kernel's C entry point (input, weights, bias); the
    bias pointer is part of the ABI even when the epilogue adds none (the kernel then never reads it).
    input_shapes: the inputs a caller passes: (input, weights), plus the bias only when the spec has one.
    """

    @property
    def input_shapes(self) -> tuple[tuple[int, ...], ...]:
        return self.operand_shapes if self.epilogue.bias else self.operand_shapes[:2]

    def shape_dict(self) -> dict[str, int]:
        """The size fields (everything but the epilogue), in declaration order."""
        return {f: getattr(self, f) for f in self.__dataclass_fields__ if f != "epilogue"}


@dataclass(frozen=True)
class MatmulSpec(_Spec):
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
    def operand_shapes(self) -> tuple[tuple[int, ...], ...]:
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
class _WindowedSpec(_Spec):
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

    def window_rows(self, out_rows: int) -> int:
        """Input rows (padded image) that `out_rows` consecutive output rows read."""
        return (out_rows - 1) * self.stride_h + (self.r - 1) * self.dilation_h + 1

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
    def operand_shapes(self):
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
    def operand_shapes(self):
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
    for field, value in spec.shape_dict().items():
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
    for shape in (*spec.operand_shapes, spec.output_shape):
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
              dilation: str | tuple = "1", bias: bool = False, activation: str = "none", residual: bool = False,
              alpha: float = 0.0) -> OperatorSpec:
    """Build and validate a spec from CLI-style pieces. stride/pad/dilation accept '1', '1,2', (1, 2).
    residual / alpha: the network runtime's epilogue extensions (Epilogue)."""
    epilogue = Epilogue(bias=bias, activation=activation, residual=residual, alpha=alpha)
    if op not in SHAPE_KEYS:
        raise OperatorError(f"unknown operator '{op}' (expected one of {', '.join(OPERATORS)})")
    missing = [k for k in SHAPE_KEYS[op][0] if k not in shape]
    if missing:
        raise OperatorError(f"shape for {op} is missing {', '.join(missing)} (got {dict(shape)})")

    def as_text(v):
        return ",".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)

    if op == "matmul":
        # A matmul has no window: a stride, pad or dilation asked for would be silently ignored.
        for what, value, neutral in (("--stride", stride, 1), ("--pad", pad, 0), ("--dilation", dilation, 1)):
            given = _int_list(as_text(value), what, (1, 2, 4))
            if any(v != neutral for v in given):
                raise OperatorError(f"{what} {as_text(value)}: applies to conv2d and depthwise, not matmul")
        return _validate(MatmulSpec(m=shape["m"], n=shape["n"], k=shape["k"], batch=shape.get("batch", 1),
                                    epilogue=epilogue))

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


class GemmView(NamedTuple):
    """The GEMM an operator lowers to, per batch item: C[M x N] = A[M x K] B[K x N]; A's rows are
    K floats apart (lda = K)."""

    m: int
    n: int
    k: int

    @property
    def lda(self) -> int:
        return self.k


def gemm_view(spec: OperatorSpec, transposed: bool = False) -> GemmView:
    """(M, N, K) of the GEMM an operator lowers to. Conv2d: M = output channels, N = output
    pixels; transposed (implicit_gemm_t): M = output pixels, N = output channels."""
    if isinstance(spec, MatmulSpec):
        return GemmView(spec.m, spec.n, spec.k)
    if isinstance(spec, Conv2dSpec):
        if transposed:
            return GemmView(spec.out_h * spec.out_w, spec.k, spec.c * spec.r * spec.s)
        return GemmView(spec.k, spec.out_h * spec.out_w, spec.c * spec.r * spec.s)
    raise OperatorError(f"{spec.name} is not lowered to GEMM")
