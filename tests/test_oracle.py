"""The oracle itself: `reference` against an independent implementation, and the checks
(`check_output`, `compare_to_bound`, `error_bound`, the RMS limit) against known-wrong outputs.

The naive implementations below are written from the operator definitions (loops over every
index, the output size found by sliding the window until it no longer fits), sharing nothing
with xfc.ops except the spec fields they read. torch.nn.functional is a third opinion where it
is installed.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from xfc.ops.accuracy import RMS_MIN_K, UNIT_ROUNDOFF, judge, rms_limit, variance_bound
from xfc.ops.spec import DepthwiseSpec, Epilogue, MatmulSpec, make_spec
from xfc.ops.reference import check_output, compare_to_bound, error_bound, make_inputs, reference
from xfc.ops.workloads import suite_spec

pytestmark = pytest.mark.unit

TINY = float(np.finfo(np.float32).tiny)


# ---------------------------------------------------------------------------------------------
# Naive implementations (float64 Python loops)
# ---------------------------------------------------------------------------------------------

def _act(x: float, activation: str) -> float:
    if activation == "relu":
        return x if x > 0 else 0.0
    if activation == "relu6":
        return 0.0 if x < 0 else (6.0 if x > 6 else x)
    return x


def naive_matmul(spec: MatmulSpec, a, b, bias):
    out = np.zeros((spec.batch, spec.m, spec.n))
    for t in range(spec.batch):
        for i in range(spec.m):
            for j in range(spec.n):
                acc = 0.0
                for p in range(spec.k):
                    acc += float(a[t, i, p]) * float(b[t, p, j])
                if spec.epilogue.bias:
                    acc += float(bias[j])
                out[t, i, j] = _act(acc, spec.epilogue.activation)
    return out


def _positions(size: int, pad_before: int, pad_after: int, window: int, dilation: int, stride: int) -> int:
    """How many window positions fit: slide until the last tap leaves the padded input."""
    count, start = 0, 0
    while start + (window - 1) * dilation <= size + pad_before + pad_after - 1:
        count += 1
        start += stride
    return count


def naive_windowed(spec, x, w, bias):
    """conv2d (w[K][C][R][S]) or depthwise (w[C][1][R][S]) from the definition."""
    depthwise = isinstance(spec, DepthwiseSpec)
    oh = _positions(spec.h, spec.pad_top, spec.pad_bottom, spec.r, spec.dilation_h, spec.stride_h)
    ow = _positions(spec.w, spec.pad_left, spec.pad_right, spec.s, spec.dilation_w, spec.stride_w)
    channels_out = spec.c if depthwise else spec.k
    out = np.zeros((spec.n, channels_out, oh, ow))
    for n in range(spec.n):
        for ko in range(channels_out):
            for y in range(oh):
                for z in range(ow):
                    acc = 0.0
                    for c in ([ko] if depthwise else range(spec.c)):
                        for r in range(spec.r):
                            ih = y * spec.stride_h - spec.pad_top + r * spec.dilation_h
                            if not 0 <= ih < spec.h:
                                continue
                            for s in range(spec.s):
                                iw = z * spec.stride_w - spec.pad_left + s * spec.dilation_w
                                if 0 <= iw < spec.w:
                                    weight = w[c, 0, r, s] if depthwise else w[ko, c, r, s]
                                    acc += float(x[n, c, ih, iw]) * float(weight)
                    if spec.epilogue.bias:
                        acc += float(bias[ko])
                    out[n, ko, y, z] = _act(acc, spec.epilogue.activation)
    return out


def naive(spec, a, b, bias):
    return naive_matmul(spec, a, b, bias) if isinstance(spec, MatmulSpec) else naive_windowed(spec, a, b, bias)


def _inputs(spec, seed=0, scale=1.0):
    """make_inputs with the first operand and the bias scaled (to reach both ReLU6 clamps)."""
    a, b, bias = make_inputs(spec, seed)
    return (a * np.float32(scale)).astype(np.float32), b, None if bias is None else (bias * np.float32(scale)).astype(np.float32)


SPECS = [
    make_spec("matmul", dict(m=5, n=7, k=9, batch=3), bias=True, activation="relu"),
    make_spec("matmul", dict(m=1, n=13, k=1)),
    make_spec("matmul", dict(m=6, n=4, k=11), bias=True, activation="relu6"),
    make_spec("conv2d", dict(n=2, c=3, h=7, w=8, k=4, r=3, s=2), stride=(2, 1), pad=(2, 0, 1, 1),
              dilation=(1, 2), bias=True, activation="relu"),
    make_spec("conv2d", dict(c=2, h=9, w=6, k=3, r=2, s=3), stride=(1, 2), pad=(0, 2, 1, 0), dilation=(3, 1)),
    make_spec("conv2d", dict(c=4, h=5, w=5, k=5, r=1, s=1), bias=True, activation="relu6"),
    make_spec("conv2d", dict(n=1, c=2, h=10, w=11, k=3, r=5, s=4), stride=3, pad=(4, 1, 0, 3), dilation=(1, 2)),
    make_spec("depthwise", dict(n=2, c=3, h=9, w=7, r=3, s=3), stride=2, pad=(1, 2, 0, 1), bias=True,
              activation="relu6"),
    make_spec("depthwise", dict(c=4, h=8, w=12, r=2, s=5), dilation=(3, 2), pad=(0, 3, 2, 1)),
    make_spec("depthwise", dict(c=2, h=6, w=6, r=3, s=3), stride=(1, 3), pad=(2, 0, 0, 2), activation="relu"),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.key())
def test_reference_matches_naive_loops(spec):
    a, b, bias = _inputs(spec, seed=3, scale=4.0)   # relu6 reaches both clamps
    expected = naive(spec, a, b, bias)
    got = reference(spec, a, b, bias)
    assert got.shape == expected.shape == tuple(spec.output_shape)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    if spec.epilogue.activation == "relu6":
        assert (expected == 6.0).any() and (expected == 0.0).any(), "the case must reach both clamps"


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.key())
def test_reference_matches_torch(spec):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    a, b, bias = _inputs(spec, seed=4, scale=4.0)
    ta, tb, tbias = (None if x is None else torch.from_numpy(x.astype(np.float64)) for x in (a, b, bias))
    if isinstance(spec, MatmulSpec):
        out = torch.matmul(ta, tb) + (tbias if spec.epilogue.bias else 0)
    else:
        # torch pads symmetrically only: pad explicitly (left, right, top, bottom), then convolve
        x = F.pad(ta, (spec.pad_left, spec.pad_right, spec.pad_top, spec.pad_bottom))
        out = F.conv2d(x, tb, tbias if spec.epilogue.bias else None, stride=(spec.stride_h, spec.stride_w),
                       dilation=(spec.dilation_h, spec.dilation_w),
                       groups=spec.c if isinstance(spec, DepthwiseSpec) else 1)
    if spec.epilogue.activation == "relu":
        out = torch.relu(out)
    elif spec.epilogue.activation == "relu6":
        out = torch.clamp(out, 0, 6)
    np.testing.assert_allclose(reference(spec, a, b, bias), out.numpy(), rtol=1e-12, atol=1e-12)


def test_naive_output_size_agrees_with_the_spec_on_many_geometries():
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(400):
        h, r, d, st = (int(v) for v in (rng.integers(1, 20), rng.integers(1, 6), rng.integers(1, 4),
                                         rng.integers(1, 4)))
        extent = d * (r - 1) + 1
        pt, pb = (int(v) for v in rng.integers(0, extent, size=2))
        if h + pt + pb < extent:
            continue
        spec = make_spec("depthwise", dict(c=1, h=h, w=1, r=r, s=1), stride=(st, 1), pad=(pt, 0, pb, 0),
                         dilation=(d, 1))
        assert spec.out_h == _positions(h, pt, pb, r, d, st), (h, r, d, st, pt, pb)
        checked += 1
    assert checked > 200


# ---------------------------------------------------------------------------------------------
# check_output rejects wrong outputs and accepts the exact one
# ---------------------------------------------------------------------------------------------

CHECK_SPECS = [
    make_spec("matmul", dict(m=33, n=40, k=200, batch=2), bias=True, activation="relu"),
    make_spec("conv2d", dict(n=2, c=16, h=12, w=11, k=24, r=3, s=3), stride=(2, 1), pad=(1, 0, 2, 1),
              dilation=(1, 2), bias=True),
    make_spec("depthwise", dict(n=2, c=8, h=13, w=12, r=3, s=3), pad=(1, 1, 0, 2), bias=True, activation="relu6"),
]


def _exact(spec, a, b, bias):
    return reference(spec, a, b, bias).astype(np.float32)


def _element(spec, seed=5):
    """An output element away from the padding, whose pre-activation value is positive."""
    shape = spec.output_shape
    rng = np.random.default_rng(seed)
    return tuple(int(rng.integers(0, d)) for d in shape)


@pytest.mark.parametrize("spec", CHECK_SPECS, ids=lambda s: s.key())
def test_check_output_accepts_the_exact_fp32_rounded_result(spec):
    a, b, bias = make_inputs(spec)
    verdict = check_output(spec, _exact(spec, a, b, bias), a, b, bias)
    assert verdict.ok, verdict.reason
    assert verdict.worst_ratio < 0.5
    ok, max_err, ratio = verdict            # the legacy tuple form still unpacks
    assert ok and max_err == verdict.max_abs_error and ratio == verdict.worst_ratio and verdict[0] is True


def _term_products(spec, a, b, index):
    """The K products a_i b_i that make up one output element (pre-bias)."""
    if isinstance(spec, MatmulSpec):
        t, i, j = index
        return a[t, i, :].astype(np.float64) * b[t, :, j]
    n, ko, y, z = index
    depthwise = isinstance(spec, DepthwiseSpec)
    products = []
    for c in ([ko] if depthwise else range(spec.c)):
        for r in range(spec.r):
            for s in range(spec.s):
                ih = y * spec.stride_h - spec.pad_top + r * spec.dilation_h
                iw = z * spec.stride_w - spec.pad_left + s * spec.dilation_w
                if 0 <= ih < spec.h and 0 <= iw < spec.w:
                    weight = b[c, 0, r, s] if depthwise else b[ko, c, r, s]
                    products.append(float(a[n, c, ih, iw]) * float(weight))
    return np.array(products)


@pytest.mark.parametrize("spec", CHECK_SPECS, ids=lambda s: s.key())
def test_check_output_rejects_one_dropped_k_term(spec):
    a, b, bias = make_inputs(spec)
    exact = reference(spec, a, b, bias)
    pre = reference(dataclasses.replace(spec, epilogue=Epilogue()), a, b, bias)
    # an element whose activation passes values through, so the dropped term shows
    index = next(idx for idx in (_element(spec, seed) for seed in range(100))
                 if 0.5 < pre[idx] + (bias[idx[-1] if isinstance(spec, MatmulSpec) else idx[1]]
                                      if spec.epilogue.bias else 0) < 5.5)
    products = _term_products(spec, a, b, index)
    dropped = products[np.argsort(np.abs(products))[len(products) // 2]]  # a term of median size
    got = exact.copy()
    got[index] -= dropped
    got = got.astype(np.float32)
    verdict = check_output(spec, got, a, b, bias)
    assert not verdict.ok and "K-derived bound" in verdict.reason, (dropped, verdict)


@pytest.mark.parametrize("spec", CHECK_SPECS, ids=lambda s: s.key())
def test_check_output_rejects_a_missing_bias(spec):
    a, b, bias = make_inputs(spec)
    no_bias = dataclasses.replace(spec, epilogue=Epilogue(False, spec.epilogue.activation))
    verdict = check_output(spec, _exact(no_bias, a, b, bias), a, b, bias)
    assert not verdict.ok and "bound" in verdict.reason


@pytest.mark.parametrize("spec", CHECK_SPECS, ids=lambda s: s.key())
def test_check_output_rejects_one_shifted_row(spec):
    a, b, bias = make_inputs(spec)
    got = _exact(spec, a, b, bias)
    if isinstance(spec, MatmulSpec):
        got[1, 7, :] = got[1, 8, :]          # row 7 of item 1 holds row 8
    else:
        got[1, 3, 4, :] = got[1, 3, 5, :]    # output row 4 of channel 3 holds row 5
    verdict = check_output(spec, got, a, b, bias)
    assert not verdict.ok and "bound" in verdict.reason


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("spec", CHECK_SPECS, ids=lambda s: s.key())
def test_check_output_rejects_one_non_finite_value(spec, bad):
    a, b, bias = make_inputs(spec)
    got = _exact(spec, a, b, bias)
    index = _element(spec)
    got[index] = bad
    verdict = check_output(spec, got, a, b, bias)
    assert not verdict.ok and "non-finite" in verdict.reason
    assert str(list(index)).replace(" ", "") in verdict.reason   # says where
    assert tuple(verdict) == (False, math.inf, math.inf)


def test_compare_to_bound_is_exactly_the_bound():
    expected = np.array([1.0, -2.0, 3.0])
    bound = np.array([0.5, 0.25, 1.0])
    assert compare_to_bound(expected, expected + bound * 0.999, bound).ok
    over = compare_to_bound(expected, expected + np.array([0, 0, 1.001]), bound)
    assert not over.ok and over.worst_ratio == pytest.approx(1.001)
    assert compare_to_bound(expected, expected - bound, bound).ok     # the bound itself is inside


# ---------------------------------------------------------------------------------------------
# error_bound: what it scales with
# ---------------------------------------------------------------------------------------------

def test_error_bound_is_gamma_k_plus_2_times_sum_of_magnitudes():
    for k in (1, 7, 512, 4096):
        spec = make_spec("matmul", dict(m=2, n=3, k=k))
        a, b = np.full((1, 2, k), -0.5, np.float32), np.full((1, k, 3), 2.0, np.float32)
        bound = error_bound(spec, a, b, np.zeros(3, np.float32))
        u = 2.0 ** -24
        gamma = (k + 2) * u / (1 - (k + 2) * u)
        np.testing.assert_allclose(bound, gamma * k + TINY, rtol=1e-12)


def test_error_bound_is_linear_in_the_data_and_counts_the_bias():
    spec = make_spec("conv2d", dict(c=3, h=6, w=5, k=4, r=3, s=3), pad=1, bias=True, activation="relu6")
    a, b, bias = make_inputs(spec)
    base = error_bound(spec, a, b, bias) - TINY
    np.testing.assert_allclose(error_bound(spec, 2 * a, b, 2 * bias) - TINY, 2 * base, rtol=1e-12)
    np.testing.assert_allclose(error_bound(spec, -a, b, -bias) - TINY, base, rtol=1e-12)
    no_bias = dataclasses.replace(spec, epilogue=Epilogue(False, "relu6"))
    extra = base - (error_bound(no_bias, a, b, bias) - TINY)
    gamma = (27 + 2) * 2.0 ** -24 / (1 - 29 * 2.0 ** -24)
    np.testing.assert_allclose(extra, gamma * np.abs(bias.astype(np.float64))[None, :, None, None] * np.ones(extra.shape), rtol=1e-9)
    # corner outputs see fewer taps under padding: a smaller bound there
    assert base[0, 0, 0, 0] < base[0, 0, 2, 2]


def test_depthwise_bound_uses_r_times_s():
    spec = make_spec("depthwise", dict(c=2, h=5, w=5, r=3, s=3))
    ones = [np.ones(s, np.float32) for s in spec.operand_shapes]
    bound = error_bound(spec, *ones)
    u = 2.0 ** -24
    np.testing.assert_allclose(bound, 11 * u / (1 - 11 * u) * 9 + TINY, rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# The statistical (RMS) check: derived in xfc/accuracy.py
# ---------------------------------------------------------------------------------------------

def test_rms_limit_formula_and_when_it_applies():
    mag = np.full(1000, 3.0)
    k = 1024
    limit = rms_limit(k, variance_bound(k, mag))
    expected = 2 * math.sqrt((2 * k + 2) / 3) * UNIT_ROUNDOFF * 3.0
    assert limit.limit == pytest.approx(expected, rel=1e-12)
    assert limit.effective_outputs == pytest.approx(1000)
    assert rms_limit(RMS_MIN_K - 1, variance_bound(RMS_MIN_K - 1, mag)).limit is None     # K too small
    assert rms_limit(k, variance_bound(k, np.full(100, 3.0))).limit is None              # too few outputs
    # one huge element dominates: few effective outputs, so no statistical claim
    skewed = np.full(1000, 1e-3)
    skewed[0] = 10.0
    assert rms_limit(k, variance_bound(k, skewed)).limit is None


def test_rms_limit_scales_like_sqrt_k():
    mag = np.ones(5000)
    l1, l4 = (rms_limit(k, variance_bound(k, mag)).limit for k in (1000, 4000))
    assert l4 / l1 == pytest.approx(math.sqrt(8002 / 2002), rel=1e-12)


def test_simulated_rounding_noise_at_the_model_passes_and_twice_it_fails():
    """Gaussian noise with exactly the model's variance m_e passes; noise of RMS just above the
    limit (tau = 4 in mean square) fails. Checks the plumbing of judge, not the kernels."""
    rng = np.random.default_rng(11)
    k, n = 512, 4096
    mag = rng.uniform(50, 150, n)
    expected = rng.normal(0, 10, n)
    var = variance_bound(k, mag)
    bound = 1e9 * np.ones(n)                     # take the worst-case bound out of the picture
    at_model = expected + rng.normal(0, 1, n) * np.sqrt(var)
    verdict = judge(expected, at_model, bound, var, k)
    assert verdict.ok and 0.4 < verdict.rms_ratio < 0.6   # sqrt(1/4) = 0.5
    above = expected + rng.normal(0, 1, n) * np.sqrt(4.4 * var)
    verdict = judge(expected, above, bound, var, k)
    assert not verdict.ok and "statistical limit" in verdict.reason


def _fp16(*arrays):
    return tuple(np.asarray(x, np.float32).astype(np.float16).astype(np.float32) for x in arrays)


@pytest.mark.parametrize("name", ["mm_1024", "conv_r18_l3"])
def test_fp16_rounded_operands_fail_at_large_k_although_within_the_worst_case_bound(name):
    """The reason for the RMS check: at K = 1024 and 2304 the worst-case bound accepts an fp32
    computation on operands rounded to fp16; the sqrt(K) limit does not."""
    spec = suite_spec(name)
    a, b, bias = make_inputs(spec)
    a16, b16 = _fp16(a, b)
    got = reference(spec, a16, b16, bias).astype(np.float32)   # exact arithmetic on fp16 operands
    worst_case_only = check_output(spec, got, a, b, bias, statistical=False)
    assert worst_case_only.ok, "this case exists to show the worst-case bound alone passes it"
    verdict = check_output(spec, got, a, b, bias)
    assert not verdict.ok and "statistical limit" in verdict.reason, verdict
    assert verdict.rms_ratio > 1.3
    exact = check_output(spec, reference(spec, a, b, bias).astype(np.float32), a, b, bias)
    assert exact.ok and exact.rms_ratio < 0.05


def test_fp32_sequential_accumulation_sits_well_inside_the_rms_limit():
    """A plain left-to-right fp32 FMA-free dot product (the worst order the kernels could use:
    products and sums rounded separately) passes with a wide margin."""
    spec = make_spec("matmul", dict(m=24, n=40, k=1536))
    a, b, bias = make_inputs(spec)
    acc = np.zeros((1, spec.m, spec.n), np.float32)
    for p in range(spec.k):
        acc = (acc + (a[:, :, p:p + 1] * b[:, p:p + 1, :]).astype(np.float32)).astype(np.float32)
    verdict = check_output(spec, acc, a, b, bias)
    assert verdict.ok and verdict.rms_limit is not None and verdict.rms_ratio < 0.25, verdict
