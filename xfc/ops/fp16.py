"""Judging fp16 CPU kernels (fp16 operands, fp16 accumulation): inputs, the derived bound, the verdict.

The kernel (xfc/cpu/fp16.py) computes every output in fp16 arithmetic, in a fixed order: for each
KC slice of the reduction an accumulator starts at 0 and takes one FMLA per k, in k order (one
rounding each: fl(acc + a_k b_k)); from the second slice on, the slice's sum is added to the value
stored in C (one rounding); after the last slice the bias is added (one rounding); ReLU/ReLU6 are
exact. The reference takes the fp16 inputs as exact and computes in float64 (xfc.ops.reference).

Standard model for one fp16 operation with gradual underflow: |fl(x) - x| <= u |x| + eta, with
u = 2^-11 and eta = 2^-25 (half the spacing of the fp16 subnormals). The scalar merge of a column
tail (C code on __fp16: the sum is formed in fp32, then rounded to fp16) rounds twice, within
u (1 + 2^-12); that u is used for every operation (OP_UNIT_ROUNDOFF).

Classical bound (any order): |err| <= gamma_n M_e, gamma_n = n u / (1 - n u), n = K + 2,
M_e = sum |a_k b_k| + |bias|. With u = 2^-11 it exceeds 1 (says nothing) once n u >= 1/2, i.e.
K >~ 1000, and is undefined from K ~ 2046: vacuous for the deep layers of real networks.

Bound used for GEMM plans (matmul, conv2d as implicit GEMM): the running bound for the kernel's
order. With exact partial sums p_j of a slice, computed ones p^_j = p_j + e_j:
    |e_j| <= (1 + u) |e_(j-1)| + u |p_j| + eta,          e_0 = 0
and the same step for the slice combination (|e| of both operands, u times the exact new value)
and for the bias add. It is evaluated numerically from the exact float64 partial sums (so it
follows the data and the plan's KC, not a tuned constant), it never becomes vacuous, and it is
usually one to two orders of magnitude tighter than gamma_n M_e on random data, because the
partial sums of a random dot product are far smaller than M_e.

Like every worst-case bound it grows faster than real errors (like K, real errors like sqrt(K)):
at K ~ 2000 an accumulation with 8 significant bits instead of 11 stays within it. So GEMM plans
also get the statistical check of accuracy.py (check 2) with the running model: to first order
the error is sum_j d_j v_j over the rounding events, |v_j| <= |p_j| + e_j, E[d_j^2] <= u^2 / 3, so
E[err^2] <= m_e := sum_j (u^2 / 3) (|p_j| + e_j)^2 (+ eta^2 / 3 per event), and the RMS error over
all outputs must stay within sqrt(4 mean(m_e)) (accuracy.rms_limit: K >= 64 and >= 256 effective
outputs; the same Chebyshev argument and false-alarm rate as for fp32).

Depthwise plans (the taps are fed in load order, not k order) keep the classical bound; K = R*S
is at most a few dozen there, so it is far from vacuous; no statistical check.

Overflow: fp16 holds magnitudes up to 65504; a partial value that rounds past it becomes +-inf
(IEEE, as in XNNPACK; the kernels neither saturate nor check). When some exact partial value plus
its error bound reaches the overflow threshold (65520), the verdict fails with a line that says
so instead of judging against a bound that no longer holds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .accuracy import UNIT_ROUNDOFF_FP16, Verdict, judge
from .reference import _windows, magnitude, reference
from .spec import DepthwiseSpec, MatmulSpec, OperatorSpec

OP_UNIT_ROUNDOFF = UNIT_ROUNDOFF_FP16 * (1 + 2.0 ** -12)   # one fp16 rounding, or fp32-then-fp16
UNDERFLOW_ETA = 2.0 ** -25                                 # absolute error of a rounding near 0
FP16_MAX = 65504.0
FP16_OVERFLOW_THRESHOLD = 65520.0                          # magnitudes from here round to inf


def to_fp16_values(*arrays) -> tuple[np.ndarray, ...]:
    """The arrays rounded to fp16 and held as float32 (exactly): the kernel's inputs and the
    reference's, so both see the same numbers."""
    return tuple(None if x is None else np.asarray(x, np.float32).astype(np.float16).astype(np.float32)
                 for x in arrays)


def classical_gamma(n: int) -> float:
    """gamma_n = n u / (1 - n u) for fp16 (inf once n u >= 1: the bound says nothing)."""
    nu = n * OP_UNIT_ROUNDOFF
    return math.inf if nu >= 1 else nu / (1 - nu)


@dataclass(frozen=True)
class Fp16Bound:
    """Per-element bound and what it rests on."""

    bound: np.ndarray           # per-element bound on |kernel - exact|
    variance: Optional[np.ndarray]   # per-element bound on E[err^2] (running model); None: no RMS check
    kind: str                   # 'running' (GEMM order, KC slices) or 'classical'
    kc: Optional[int]           # the KC slices the running bound follows
    peak_partial: float         # largest |exact partial value| + its bound (overflow check)
    classical_gamma: float      # gamma_(K+2) for fp16 (inf: vacuous)

    def as_report(self) -> dict:
        return {"dtype": "fp16", "unit_roundoff": UNIT_ROUNDOFF_FP16, "op_unit_roundoff": OP_UNIT_ROUNDOFF,
                "kind": self.kind, "kc": self.kc, "classical_gamma": self.classical_gamma,
                "classical_vacuous": not self.classical_gamma < 1.0, "peak_partial": self.peak_partial,
                "doc": "docs/fp16.md"}


def _gemm_terms(spec: OperatorSpec, a: np.ndarray, b: np.ndarray):
    """(K, term(k) -> float64 array shaped like the output before the epilogue), k in kernel order."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if isinstance(spec, MatmulSpec):
        return spec.k, lambda k: a64[:, :, k, None] * b64[:, None, k, :]
    windows = _windows(a64, spec)                      # [N, C, OH, OW, R, S]
    rs = spec.r * spec.s

    def term(k: int) -> np.ndarray:                    # k = (c, r, s), the im2col row order
        c, r, s = k // rs, (k // spec.s) % spec.r, k % spec.s
        return b64[None, :, c, r, s, None, None] * windows[:, c, None, :, :, r, s]
    return spec.c * rs, term


def _bias_view(spec: OperatorSpec, bias: np.ndarray, ndim: int) -> np.ndarray:
    axis = 2 if isinstance(spec, MatmulSpec) else 1
    return np.asarray(bias, np.float64).reshape([-1 if i == axis else 1 for i in range(ndim)])


def running_bound(spec: OperatorSpec, a: np.ndarray, b: np.ndarray, bias: np.ndarray, kc: int
                  ) -> tuple[np.ndarray, np.ndarray, float]:
    """(per-element bound before the epilogue's activation, per-element variance bound, peak
    |partial| + bound) for a GEMM plan with KC-deep slices (recursions in the module docstring)."""
    u, eta = OP_UNIT_ROUNDOFF, UNDERFLOW_ETA
    per_event = u * u / 3.0
    k_total, term = _gemm_terms(spec, a, b)
    total = err_total = var = None
    peak = 0.0

    def event(value, err):   # one rounding of `value` (exact) whose computed operands are err off
        nonlocal var, peak
        reach = np.abs(value) + err
        var = per_event * reach ** 2 + eta * eta / 3.0 + (0.0 if var is None else var)
        peak = max(peak, float(np.max(reach)))

    for k0 in range(0, k_total, kc):
        part = err = None
        for k in range(k0, min(k0 + kc, k_total)):
            x = term(k)
            part = x if part is None else part + x
            err = u * np.abs(part) + eta if err is None else (1 + u) * err + u * np.abs(part) + eta
            event(part, err)
        if total is None:
            total, err_total = part, err
        else:
            total = total + part
            err_total = (1 + u) * (err_total + err) + u * np.abs(total) + eta
            event(total, err_total)
    if spec.epilogue.bias:
        total = total + _bias_view(spec, bias, total.ndim)
        err_total = (1 + u) * err_total + u * np.abs(total) + eta
        event(total, err_total)
    return err_total, var, peak


def fp16_bound(spec: OperatorSpec, a: np.ndarray, b: np.ndarray, bias: np.ndarray,
               kc: Optional[int] = None) -> Fp16Bound:
    """The bound for an fp16 kernel: the running bound of a GEMM plan with KC = kc, or (kc None,
    or depthwise) the classical gamma_(K+2) M_e with its underflow terms."""
    n = spec.reduction_size + 2
    gamma = classical_gamma(n)
    mag = magnitude(spec, a, b, bias)
    if kc is not None and not isinstance(spec, DepthwiseSpec):
        bound, variance, peak = running_bound(spec, a, b, bias, kc)
        return Fp16Bound(bound, variance, "running", kc, peak, gamma)
    # classical: every partial value of any order is at most M_e in magnitude
    bound = gamma * mag + n * UNDERFLOW_ETA * (1 + gamma)
    return Fp16Bound(bound, None, "classical", None, float(np.max(mag + bound)) if mag.size else 0.0, gamma)


def check_fp16_output(spec: OperatorSpec, got: np.ndarray, a: np.ndarray, b: np.ndarray, bias: np.ndarray,
                      kc: Optional[int] = None) -> tuple[Verdict, Fp16Bound]:
    """Verdict of an fp16 kernel's output (a, b, bias: the fp16 inputs it ran on, as float32) against
    the float64 reference under fp16_bound (and, for GEMM plans, the RMS limit of the running model);
    fails with an overflow line when the data can overflow fp16 (docs/fp16.md)."""
    expected = reference(spec, a, b, bias)
    bound = fp16_bound(spec, a, b, bias, kc)
    if bound.peak_partial >= FP16_OVERFLOW_THRESHOLD:
        return (Verdict(False, float("inf"), float("inf"), float("inf"), None,
                        f"fp16 overflow: an exact partial value reaches {bound.peak_partial:.6g} (with its rounding "
                        f"bound), past the fp16 range (max {FP16_MAX:g}); inputs too large for this operator in fp16"),
                bound)
    return (judge(expected, got, bound.bound + np.finfo(np.float16).smallest_subnormal, bound.variance,
                  spec.reduction_size), bound)


def fp16_reference(spec: OperatorSpec, a, b, bias) -> np.ndarray:
    """The float64 reference on the fp16-rounded inputs (what the kernel is compared with)."""
    a16, b16, bias16 = to_fp16_values(a, b, bias)
    return reference(spec, a16, b16, bias16)

