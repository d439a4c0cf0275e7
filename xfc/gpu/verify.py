"""Checking GPU kernel outputs against the numpy reference.

fp32 kernels are judged by `xfc.ops.check_output` unchanged (K-derived bound and, at large K,
the sqrt(K) RMS limit of xfc.accuracy).

The fp16-storage / fp32-arithmetic variant sees inputs rounded to fp16 and rounds its result to
fp16 once when storing. It is judged against the reference evaluated on the *rounded* inputs
(exactly what the kernel read), with the same K-derived fp32 accumulation bound plus the one
final rounding of vstore_half_rte: half a unit in the last place of fp16, <= 2^-11 |value| for
normal results, 2^-25 absolute in the subnormal range. For the RMS check that final rounding
adds its own variance: a relative error uniform within half an fp16 ulp has a mean square of at
most (2 * 2^-11)^2 / 12 = 2^-22 / 3 times the value squared (the same argument as for fp32 in
xfc.accuracy), so each element's variance bound grows by 2^-22 / 3 * (|exact| + bound)^2.
"""
from __future__ import annotations

import numpy as np

from ..ops import check_output, compare_to_bound, error_bound, magnitude, reference, variance_bound

HALF_UNIT_ROUNDOFF = 2.0 ** -11
HALF_SUBNORMAL_HALF_ULP = 2.0 ** -25


def round_to_half(*arrays):
    return tuple(np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32) for x in arrays)


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


def check(variant: str, spec, got, a, b, bias):
    if variant == "fp32":
        return check_output(spec, got, a, b, bias)
    if variant == "fp16_storage":
        return check_fp16_storage_output(spec, got, a, b, bias)
    raise ValueError(f"no run-time check for kernel variant {variant}")
