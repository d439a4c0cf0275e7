"""Judging a kernel's output: the worst-case bound, the statistical (RMS) check, and the verdict.

Pure functions on numpy arrays; `xfc.ops.reference.check_output` feeds them the reference and the
per-element magnitudes M_e = sum_i |a_i b_i| (+ |bias|) of the operator.

Two checks, both derived from the standard model of floating-point arithmetic
(fl(x op y) = (x op y)(1 + d), |d| <= u, u = 2^-24 for fp32 round-to-nearest):

1. Worst case, per element (`error_bound` in reference.py): |err_e| <= gamma_(K+2) * M_e. It holds
   for any summation order, but it grows like K while real errors grow like sqrt(K), so at
   large K it also accepts operands rounded to fp16 (ratio 0.3-0.9 at K = 1024..2304).

2. Statistical, over all outputs (`rms_limit`, this module). To first order the error of one
   output is a sum over its rounding events j of d_j * v_j, where v_j is the exact value that
   event rounds (a product a_i b_i, a partial sum, the bias add). Every such value is a sum over
   a subset of the terms, so |v_j| <= M_e. With FMA there are K + 1 events (K fused multiply-adds
   and the bias add); without FMA (the generic dialect on a target without it) the K products
   are rounded too, and a KC-sliced accumulation adds one rounding per extra slice but has the
   same number of additions in total, so n_r = 2K + 2 events bound every order we generate.
   Model: the d_j are mean-zero and uncorrelated (inputs with random mantissas, as from
   make_inputs). For round-to-nearest the absolute error of a value in [2^e, 2^(e+1)) is at most
   half an ulp; treating it as uniform on [-ulp/2, ulp/2] gives E[d^2] <= ulp^2/12 / 2^(2e)
   = (2u)^2/12 = u^2/3. Hence

       E[err_e^2] <= m_e := n_r * (u^2 / 3) * M_e^2 .

   Over all outputs, S = sum_e err_e^2 has E[S] <= sum_e m_e. Each err_e is a sum of many small
   independent terms, so its kurtosis is at most that of a Gaussian (3), i.e.
   Var[err_e^2] <= 2 m_e^2, and rounding errors of different outputs are uncorrelated. By
   Chebyshev, P(S > tau * sum m_e) <= 2 / ((tau - 1)^2 * n_eff) with
   n_eff = (sum m_e)^2 / sum m_e^2 (the number of outputs, weighted). We use tau = 4, i.e.

       rms(err) <= 2 * sqrt(n_r / 3) * u * rms(M)      (~ 1.63 * sqrt(K) * u * rms(M))

   and apply it only when n_eff >= 256 (false-alarm probability <= 2 / (9 * 256) < 0.1 %) and
   K >= 64 (at least 128 rounding events per output, so the central-limit reasoning behind the
   kurtosis bound holds). Nothing here is tuned to measured errors: a correct kernel sits far
   below the limit (its partial sums are much smaller than M_e), while operands rounded to fp16
   (relative error variance 2^-22 / 6 per operand) give an RMS error of about 3900 / K times the
   limit, i.e. 3.8x at K = 1024 and 1.7x at K = 2304. Past K ~ 3900 fp16 operands pass again;
   that is the limit of what a statistical check on fp32 can see.

   The model does not hold for structured inputs (all ones, repeated values: rounding errors
   are then correlated and a correct kernel's error can grow like K); callers with such inputs
   pass statistical=False to check_output.

3. fp16 kernels (fp16 operands and fp16 accumulation, --dtype fp16 on AArch64; xfc/ops/fp16.py,
   docs/fp16.md). The same standard model with u = 2^-11 (UNIT_ROUNDOFF_FP16; 2^-11 (1 + 2^-12) per
   operation, covering the scalar tail merge that rounds through fp32) and an underflow term
   eta = 2^-25 per operation. The classical bound of check 1, gamma_(K+2) M_e, exceeds 1 from
   K ~ 1000 and is undefined from K ~ 2046, so for GEMM plans the bound is the running bound of
   the kernel's own order: along each KC slice |e_j| <= (1 + u) |e_(j-1)| + u |p_j| + eta from the
   exact partial sums p_j, then one such step per slice combination and for the bias, evaluated
   in float64 on the fp16 inputs (taken as exact). It stays finite at any K and scales with the
   partial sums, not with M_e. Depthwise (K = R*S, a few dozen) keeps gamma_(K+2) M_e. Inputs
   are fp16 values, so no input rounding enters; the output rounding is the last operation's.
   A partial value that can reach the fp16 overflow threshold fails the check with a line
   saying so. Check 2 applies to fp16 GEMM plans with the running model's variance,
   m_e = sum over rounding events of (u^2 / 3) (|p_j| + e_j)^2, instead of n_r (u^2 / 3) M_e^2.

Winograd plans (3x3 stride-1 conv2d lowered to F(m x m, 3x3), xfc/cpu/winograd.py) compute a
different sum, through transforms whose entries are not all 1: their bound is derived in
xfc/ops/winograd.py from the transform matrices and C (gamma_(C + 4a + 3) times a Winograd
magnitude Mw >= M_e; a = m + 2) and replaces check 1 for them (reference.check_winograd_output,
or check_output(..., winograd_m=m)); check 2 is not applied (its event count is the direct
dot product's). docs/winograd.md has the derivation and the tile-size tolerance.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

UNIT_ROUNDOFF = 2.0 ** -24          # fp32, round to nearest
UNIT_ROUNDOFF_FP16 = 2.0 ** -11     # fp16 (binary16), round to nearest: xfc/ops/fp16.py
RMS_TAU = 4.0                       # mean-square margin (Chebyshev, see the module docstring)
RMS_MIN_K = 64                      # reduction length below which the check is not applied
RMS_MIN_OUTPUTS = 256               # effective number of outputs below which it is not applied


def format_ratio(ratio: float) -> str:
    """An error-to-bound (or error-to-limit) ratio for people, without the trailing 'x': two
    significant digits (0.0022, 0.31, 4.7; 0.00x hid how far below the bound a kernel is), whole
    numbers from 100 on, and never rounded onto 1 from either side (1.004 is not '1': it failed)."""
    ratio = float(ratio)
    if not math.isfinite(ratio) or ratio == 0.0:
        return f"{ratio:g}"
    if abs(ratio) >= 99.5:      # whole numbers, where two significant digits would print 1e+02
        return f"{ratio:.0f}"
    for digits in range(2, 8):
        text = f"{ratio:.{digits}g}"
        if float(text) != 1.0 or ratio == 1.0:
            break
    return text


def rounding_events(k: int) -> int:
    """Upper bound on the rounding events of one output: K products, K additions, bias, slack."""
    return 2 * int(k) + 2


def variance_bound(k: int, magnitude: np.ndarray) -> np.ndarray:
    """Per-element bound m_e on E[err_e^2] under the standard model (see the module docstring)."""
    return rounding_events(k) * (UNIT_ROUNDOFF ** 2 / 3.0) * np.square(np.asarray(magnitude, np.float64))


@dataclass(frozen=True)
class RmsLimit:
    """The statistical limit for one output tensor, or why it does not apply."""

    limit: Optional[float]      # None: not applied
    effective_outputs: float
    why_not: str = ""


def rms_limit(k: int, variance: np.ndarray) -> RmsLimit:
    """RMS limit sqrt(tau * mean(m_e)) when K and the effective number of outputs are large enough."""
    v = np.asarray(variance, np.float64).ravel()
    total, squares = float(v.sum()), float(np.square(v).sum())
    n_eff = total * total / squares if squares > 0 else 0.0
    if k < RMS_MIN_K:
        return RmsLimit(None, n_eff, f"K={k} < {RMS_MIN_K}")
    if n_eff < RMS_MIN_OUTPUTS:
        return RmsLimit(None, n_eff, f"{n_eff:.0f} effective outputs < {RMS_MIN_OUTPUTS}")
    return RmsLimit(math.sqrt(RMS_TAU * total / v.size), n_eff)


@dataclass(frozen=True)
class Verdict:
    """The result of checking one output. Unpacks as the legacy (ok, max_abs_error, worst_ratio)."""

    ok: bool
    max_abs_error: float
    worst_ratio: float              # max over elements of |err| / worst-case bound
    rms_error: float
    rms_limit: Optional[float]      # None: the statistical check did not apply
    reason: str = ""                # empty when ok; otherwise one line saying which check failed

    @property
    def rms_ratio(self) -> Optional[float]:
        if self.rms_limit is None:
            return None
        return self.rms_error / self.rms_limit if self.rms_limit > 0 else float("inf")

    # Compatibility: callers written for the tuple API keep working.
    def _legacy(self) -> tuple[bool, float, float]:
        return (self.ok, self.max_abs_error, self.worst_ratio)

    def __iter__(self):
        return iter(self._legacy())

    def __getitem__(self, index):
        return self._legacy()[index]

    def describe(self) -> str:
        """One line for people and error messages."""
        if not self.ok:
            return self.reason
        rms = (f", RMS {format_ratio(self.rms_ratio)}x the sqrt(K) limit" if self.rms_limit is not None else "")
        return f"max abs error {self.max_abs_error:.3g}, {format_ratio(self.worst_ratio)}x the K-derived bound{rms}"

    def as_report(self) -> dict:
        """The keys a JSON report carries."""
        return {"verified": bool(self.ok), "max_abs_error": self.max_abs_error,
                "error_to_bound_ratio": self.worst_ratio, "rms_error": self.rms_error,
                "rms_limit": self.rms_limit, "rms_ratio": self.rms_ratio,
                **({"failure": self.reason} if not self.ok else {})}


def merge(verdicts) -> Verdict:
    """One verdict for several outputs of the same kernel (e.g. per-call and pre-packed weights)."""
    verdicts = list(verdicts)
    failed = [v for v in verdicts if not v.ok]
    limits = [v.rms_ratio for v in verdicts if v.rms_ratio is not None]
    worst_rms = max(verdicts, key=lambda v: (v.rms_ratio or 0.0))
    return Verdict(ok=not failed, max_abs_error=max(v.max_abs_error for v in verdicts),
                   worst_ratio=max(v.worst_ratio for v in verdicts), rms_error=worst_rms.rms_error,
                   rms_limit=worst_rms.rms_limit if limits else None,
                   reason="; ".join(dict.fromkeys(v.reason for v in failed)))


def _index_text(shape, flat_index: int) -> str:
    return "[" + ",".join(str(int(i)) for i in np.unravel_index(flat_index, shape)) + "]"


def judge(expected: np.ndarray, got, bound: np.ndarray, variance: Optional[np.ndarray] = None,
          k: int = 0) -> Verdict:
    """Check got against expected: every element finite and within its bound, and (when variance
    is given and the statistics apply) the RMS error within rms_limit(k, variance)."""
    expected = np.asarray(expected, np.float64)
    got = np.asarray(got, dtype=np.float64).reshape(expected.shape)
    if got.size == 0:
        return Verdict(True, 0.0, 0.0, 0.0, None)
    finite = np.isfinite(got)
    if not finite.all():
        bad = np.flatnonzero(~finite.ravel())
        first = int(bad[0])
        value = got.ravel()[first]
        what = "NaN (unwritten, or NaN computed)" if np.isnan(value) else f"{value:+}"
        return Verdict(False, float("inf"), float("inf"), float("inf"), None,
                       f"{bad.size} non-finite output value(s); first {what} at {_index_text(got.shape, first)}")
    err = np.abs(got - expected)
    ratios = err / bound
    worst = int(np.argmax(ratios))
    max_err, ratio = float(err.max()), float(ratios.ravel()[worst])
    rms = float(np.sqrt(np.mean(np.square(err))))
    limit = rms_limit(k, variance).limit if variance is not None else None
    reason = ""
    if ratio > 1.0:
        reason = (f"max abs error {max_err:.3g}; at {_index_text(err.shape, worst)} the error is {format_ratio(ratio)}x "
                  f"the K-derived bound")
    elif limit is not None and rms > limit:
        reason = (f"RMS error {rms:.3g} is {format_ratio(rms / limit)}x the sqrt(K) statistical limit {limit:.3g} "
                  f"(precision loss; max error {format_ratio(ratio)}x the K-derived bound)")
    return Verdict(not reason, max_err, ratio, rms, limit, reason)
