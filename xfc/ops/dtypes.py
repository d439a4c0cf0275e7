"""Element types as values: fp32, fp16 and int8.

A DType is created once here and carried unchanged from the command line (`--dtype`) through the
plan to the runner's operands and the oracle. It knows what differs between the types at the
edges of the chain (xfc/pipeline/stages.py):

  operands     the kernel's inputs in its C entry point's order, typed: fp32 and fp16 kernels take
               (in0, in1, bias) as float32 values (fp16: values that fp16 holds exactly, what the
               kernel and the reference both see); int8 kernels take (x, w, bias, mult): activation
               bytes, int8 weights, int32 bias, fp32 requantization multipliers (xfc/ops/quant.py)
  outputs      the kernel's output element type (float32 values; the int8 activation type)
  check        the oracle and its bound: fp32 the float64 reference under the K-derived bound
               (Winograd plans: their derived bound), fp16 the derived fp16 bound (xfc/ops/fp16.py),
               int8 byte for byte against the exact reference (xfc/ops/quant.py)

What a dtype means for a core (instructions, lanes, rates, refusals) is the hardware's side: the
per-core configuration table of the CPU target, not this module.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import numpy as np

from ..errors import OperatorError
from .accuracy import merge
from .spec import OperatorSpec


@dataclass(frozen=True)
class DType:
    name: str                       # the word users type: 'fp32', 'fp16', 'int8'
    element_bytes: int              # weights and activations in memory
    accumulator: str                # what the dot products accumulate in: 'fp32', 'fp16', 'int32'
    exact: bool                     # outputs are compared byte for byte (else under a derived bound)
    operand_names: tuple[str, ...]  # the C entry point's inputs, in order (the output follows them)
    oracle: str                     # how a kernel of this type is judged, in words

    def __str__(self) -> str:
        return self.name


FP32 = DType("fp32", 4, "fp32", False, ("in0", "in1", "bias"),
             "float64 reference under the K-derived bound gamma_(K+2) sum|a b| (Winograd plans: their derived bound)")
FP16 = DType("fp16", 2, "fp16", False, ("in0", "in1", "bias"),
             "float64 reference on the fp16 inputs under the derived fp16-accumulation bound (docs/fp16.md)")
INT8 = DType("int8", 1, "int32", True, ("x", "w", "bias", "mult"),
             "exact ONNX QLinear reference, byte for byte (docs/int8.md)")

DTYPES: tuple[DType, ...] = (FP32, FP16, INT8)
DTYPE_NAMES: tuple[str, ...] = tuple(d.name for d in DTYPES)
_BY_NAME: Mapping[str, DType] = {d.name: d for d in DTYPES}


def dtype_named(name) -> DType:
    """The DType of a name ('fp32', 'fp16', 'int8'), a DType itself, or a one-line OperatorError."""
    if isinstance(name, DType):
        return name
    found = _BY_NAME.get(str(name).strip().lower())
    if found is None:
        close = difflib.get_close_matches(str(name), DTYPE_NAMES, n=1)
        raise OperatorError(f"--dtype {name}: not an element type (expected one of {', '.join(DTYPE_NAMES)})"
                            + (f"; did you mean '{close[0]}'?" if close else ""))
    return found


@dataclass(frozen=True, eq=False)
class Operands:
    """One kernel call's inputs, typed, in the C entry point's order (DType.operand_names).

    fp32 / fp16: (in0, in1, bias) as float32 arrays, bias None when the spec adds none (the entry
    point then gets zeros it never reads). int8: (x, w, bias, mult) and the quantization they were
    made for (quant, out_scale resolved)."""

    dtype: DType
    arrays: tuple
    quant: object = None            # xfc.ops.quant.QuantParams for int8

    def __iter__(self):
        return iter(self.arrays)

    def __len__(self) -> int:
        return len(self.arrays)

    def shapes(self, spec: OperatorSpec) -> tuple[tuple[int, ...], ...]:
        """The shape of every operand as the entry point takes it (a missing bias: its zeros' shape)."""
        if self.dtype is INT8:
            from .quant import channels
            return (*spec.operand_shapes[:2], (channels(spec),), (channels(spec),))
        return tuple(tuple(s) for s in spec.operand_shapes)

    def for_abi(self, spec: OperatorSpec) -> tuple[np.ndarray, ...]:
        """Every operand as an array of the entry point's element type (a missing bias as zeros)."""
        out = []
        for array, shape, ctype in zip(self.arrays, self.shapes(spec), self.c_types()):
            out.append(np.zeros(shape, ctype) if array is None else np.ascontiguousarray(array, ctype).reshape(shape))
        return tuple(out)

    def c_types(self) -> tuple[np.dtype, ...]:
        """numpy types of the operands in the C entry point."""
        if self.dtype is INT8:
            from .quant import np_type
            return (np.dtype(np_type(self.quant.act_type)), np.dtype(np.int8), np.dtype(np.int32),
                    np.dtype(np.float32))
        return (np.dtype(np.float32),) * 3


@dataclass(frozen=True)
class KernelAbi:
    """A CPU kernel's C entry points as a runner sees them, whatever the dtype (the runner contract):

        <fn>(op0, ..., opN-1, out)                 the weights (operand weights_index) packed inside the call
        <fn>_prepack(weights, packed)              once per weight tensor
        <fn>_packed(op0, packed, ..., out)         the packed weights in place of operand weights_index
        <fn><packed_size_suffix>()                 the packed buffer's size, in packed_type elements

    optional: operands a caller may leave out (the bias of a spec without one: its zeros are passed).
    never_written: how an element the kernel never wrote shows: 'nan' (float outputs start as a NaN
    the verdict rejects) or 'two-prefills' (integer outputs: the entry point runs into two buffers
    pre-filled with different bytes, and any difference is an unwritten element)."""

    operand_names: tuple[str, ...]
    operand_types: tuple[str, ...]          # numpy type strings ('<f4', '|u1', '|i1', '<i4')
    operand_shapes: tuple[tuple[int, ...], ...]
    output_type: str
    output_shape: tuple[int, ...]
    packed_size_suffix: str
    packed_type: str
    weights_index: int = 1
    optional: tuple[int, ...] = ()
    never_written: str = "nan"


def kernel_abi(spec: OperatorSpec, dtype, quant=None) -> KernelAbi:
    """The entry points' operands for spec in dtype (int8: quant gives the activation type)."""
    dtype = dtype_named(dtype)
    shapes = Operands(dtype, (), quant).shapes(spec)
    if dtype is INT8:
        types = tuple(t.str for t in Operands(dtype, (), quant).c_types())
        return KernelAbi(dtype.operand_names, types, shapes, output_type(dtype, quant).str,
                         tuple(spec.output_shape), "_packed_bytes", "|u1", never_written="two-prefills")
    return KernelAbi(dtype.operand_names, ("<f4",) * 3, shapes, "<f4", tuple(spec.output_shape), "_packed_floats",
                     "<f4", optional=() if spec.epilogue.bias else (2,))


def output_type(dtype: DType, quant=None) -> np.dtype:
    """The numpy type of a kernel's output elements."""
    if dtype is INT8:
        from .quant import np_type
        return np.dtype(np_type(quant.out_type))
    return np.dtype(np.float32)


def make_operands(spec: OperatorSpec, dtype, *, seed: int = 0, quant=None, mode: str = "random",
                  arrays: Optional[Sequence] = None) -> Operands:
    """Deterministic operands for spec in dtype (arrays: the caller's fp inputs (a, b, bias) instead
    of make_inputs'; fp16 rounds them to values fp16 holds). int8: quant (QuantParams) is required;
    mode 'random' or 'extreme' (xfc.ops.quant.make_qinputs)."""
    dtype = dtype_named(dtype)
    if dtype is INT8:
        from .quant import make_qinputs, multipliers, resolve_out_scale
        if quant is None:
            raise OperatorError("int8 operands need quantization parameters (--quant)")
        quant = resolve_out_scale(spec, quant)
        x, w, bias = make_qinputs(spec, quant, seed, mode)
        return Operands(dtype, (x, w, bias, multipliers(spec, quant)), quant)
    from .reference import make_inputs
    a, b, bias = arrays if arrays is not None else make_inputs(spec, seed)
    if dtype is FP16:
        from .fp16 import to_fp16_values
        a, b, bias = to_fp16_values(a, b, bias)
    return Operands(dtype, (a, b, bias))


@dataclass(frozen=True)
class Check:
    """The verdict on one kernel's outputs (every entry point it ran), whatever the dtype.

    report: the keys a report carries: fp32/fp16 max_abs_error, error_to_bound_ratio and the RMS
    figures (fp16 also 'bound', the derived bound it was judged under); int8 exact_share, max_lsb
    (the largest difference in output steps), saturated_share."""

    ok: bool
    reason: str = ""
    report: Mapping = field(default_factory=dict)
    worst_ratio: float = 0.0        # fp: the worst error / bound over the outputs; int8: max_lsb

    def describe(self) -> str:
        return self.reason if not self.ok else ", ".join(f"{k} {v}" for k, v in self.report.items()
                                                          if isinstance(v, (int, float)))


def check(spec: OperatorSpec, outputs: Sequence[np.ndarray], operands: Operands, *, winograd_m: int = 0,
          kc: Optional[int] = None) -> Check:
    """Judge every output of one kernel (e.g. its two entry points) against the dtype's oracle.
    winograd_m: a Winograd plan's tile size (fp32); kc: the KC of a GEMM plan (fp16's running bound)."""
    dtype = operands.dtype
    if dtype is INT8:
        from .quant import check_qoutput
        x, w, bias, _ = operands.arrays
        verdicts = [check_qoutput(spec, operands.quant, out, x, w, bias) for out in outputs]
        worst = min(verdicts, key=lambda v: (v.ok, v.exact_share))
        return Check(ok=all(v.ok for v in verdicts), reason=worst.reason or "",
                     report={"exact_share": worst.exact_share, "max_lsb": worst.max_lsb,
                             "saturated_share": worst.saturated_share},
                     worst_ratio=float(max(v.max_lsb for v in verdicts)))
    a, b, bias = operands.arrays
    if dtype is FP16:
        from .fp16 import check_fp16_output
        checked = [check_fp16_output(spec, out, a, b, bias, kc) for out in outputs]
        verdict = merge([v for v, _ in checked])
        return Check(ok=verdict.ok, reason=verdict.reason,
                     report={**_fp_report(verdict), "bound": checked[0][1].as_report()},
                     worst_ratio=verdict.worst_ratio)
    from .reference import check_output
    verdict = merge([check_output(spec, out, a, b, bias, winograd_m=winograd_m) for out in outputs])
    return Check(ok=verdict.ok, reason=verdict.reason, report=_fp_report(verdict), worst_ratio=verdict.worst_ratio)


def _fp_report(verdict) -> dict:
    return {k: v for k, v in verdict.as_report().items() if k not in ("verified", "failure")}


def merge_checks(named: Mapping[str, Check]) -> Check:
    """One verdict for several runs of a kernel (its entry points), each failure named by its run:
    'pre-packed entry: max abs error ...'. The report is the worst run's."""
    failed = [(name, c) for name, c in named.items() if not c.ok]
    worst = max(named.values(), key=lambda c: (not c.ok, c.worst_ratio))
    return Check(ok=not failed, reason="; ".join(f"{name} entry: {c.reason}" for name, c in failed),
                 report=worst.report, worst_ratio=max(c.worst_ratio for c in named.values()))
