"""Winograd math (xfc/ops/winograd.py): the transforms generated from their interpolation points,
the numpy model of the algorithm against the direct float64 reference, the derived error bound
(an fp32 model of the algorithm must sit under it; a perturbed one must not) and the tile-size
policy. Pure numpy, no kernels."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from support import conv
from xfc.errors import OperatorError
from xfc.ops import winograd as w
from xfc.ops.reference import check_winograd_output, make_inputs, reference

pytestmark = pytest.mark.unit

SHAPES = [
    conv(5, 9, 11, 7, 3, 3, n=2, pad=1, bias=True, act="relu"),          # ragged for m = 2, 4, 6
    conv(3, 7, 7, 4, 3, 3, pad=0),                                          # OH = OW = 5
    conv(4, 10, 6, 3, 3, 3, pad=(2, 0, 1, 1), act="relu6"),               # asymmetric padding
    conv(1, 3, 3, 1, 3, 3, pad=(0, 1, 0, 1), bias=True),                  # a single output column
]


@pytest.mark.parametrize("m", w.TILE_SIZES)
def test_one_dimensional_identity_is_exact_in_rationals(m):
    """y = AT[(G g) * (BT d)] equals the correlation exactly, for rational g and d."""
    t = w.transforms(m)
    rng = np.random.default_rng(m)
    g = [Fraction(int(x), 7) for x in rng.integers(-9, 9, size=3)]
    d = [Fraction(int(x), 5) for x in rng.integers(-9, 9, size=t.alpha)]
    gg = [sum(row[k] * g[k] for k in range(3)) for row in t.g_exact]
    bd = [sum(row[i] * d[i] for i in range(t.alpha)) for row in t.bt_exact]
    y = [sum(row[j] * gg[j] * bd[j] for j in range(t.alpha)) for row in t.at_exact]
    assert y == [sum(g[k] * d[i + k] for k in range(3)) for i in range(m)]


def test_known_f2_matrices():
    """F(2,3) from points 0, 1, -1 is Lavin & Gray's up to the signs the construction fixes."""
    t = w.transforms(2)
    assert np.array_equal(np.abs(t.bt), [[1, 0, 1, 0], [0, 1, 1, 0], [0, 1, 1, 0], [0, 1, 0, 1]])
    assert np.array_equal(t.at, [[1, 1, 1, 0], [0, 1, -1, 1]])
    assert np.array_equal(np.abs(t.g), [[1, 0, 0], [.5, .5, .5], [.5, .5, .5], [0, 0, 1]])


@pytest.mark.parametrize("m", w.TILE_SIZES)
@pytest.mark.parametrize("spec", SHAPES, ids=lambda s: s.key())
def test_model_matches_direct_reference(spec, m):
    a, b, bias = make_inputs(spec, seed=3)
    exact = reference(spec, a, b, bias)
    np.testing.assert_allclose(w.winograd_conv(spec, a, b, bias, m), exact, rtol=0, atol=1e-12)
    got32 = w.winograd_conv(spec, a, b, bias, m, dtype=np.float32)
    verdict = check_winograd_output(spec, m, got32, a, b, bias)
    assert verdict.ok, verdict.describe()
    assert verdict.worst_ratio > 0


@pytest.mark.parametrize("m", w.TILE_SIZES)
def test_bound_holds_at_large_magnitudes_and_catches_errors(m):
    spec = conv(64, 13, 14, 8, 3, 3, pad=1, bias=True)
    a, b, bias = make_inputs(spec, seed=5)
    a, b, bias = a * np.float32(3e4), b * np.float32(2e3), bias * np.float32(1e7)
    got32 = w.winograd_conv(spec, a, b, bias, m, dtype=np.float32)
    assert check_winograd_output(spec, m, got32, a, b, bias).ok
    # one element off by ten times its bound fails
    bad = got32.astype(np.float64)
    bound = w.winograd_error_bound(spec, a, b, bias, m)
    bad[0, 3, 5, 7] += 10 * bound[0, 3, 5, 7]
    assert not check_winograd_output(spec, m, bad, a, b, bias).ok
    # a channel left out of the sum fails
    missing = a.copy()
    missing[:, 17] = 0
    assert not check_winograd_output(spec, m, w.winograd_conv(spec, missing, b, bias, m), a, b, bias).ok
    # operands rounded to fp16: caught by the m = 2 bound only (the m = 4, 6 worst-case bounds are
    # wide enough to admit them; the module docstring says so)
    a16, b16 = a.astype(np.float16).astype(np.float32), b.astype(np.float16).astype(np.float32)
    verdict16 = check_winograd_output(spec, m, w.winograd_conv(spec, a16, b16, bias, m), a, b, bias)
    assert verdict16.ok == (m != 2)


def test_bound_is_wider_than_direct_and_grows_with_m():
    spec = conv(16, 12, 12, 4, 3, 3, pad=1)
    a, b, bias = make_inputs(spec)
    from xfc.ops.reference import error_bound
    direct = error_bound(spec, a, b, bias)
    means = [float(np.mean(w.winograd_error_bound(spec, a, b, bias, m) / direct)) for m in w.TILE_SIZES]
    assert 1 < means[0] < means[1] < means[2]
    assert [round(w.transforms(m).growth(), 1) for m in w.TILE_SIZES] == [7.1, 256.0, 508.8]


def test_tile_size_policy():
    assert w.admissible_tile_sizes(64) == (2, 4, 6)
    assert w.admissible_tile_sizes(256) == (2, 4, 6)
    assert w.admissible_tile_sizes(512) == (2, 4)        # m = 6 exceeds the tolerance at C = 512
    assert w.admissible_tile_sizes(4096) == (2,)
    for c in (3, 64, 512, 4096):
        for m in w.admissible_tile_sizes(c):
            assert w.relative_bound(m, c) <= w.RELATIVE_TOLERANCE


def test_applicability():
    assert w.not_applicable(conv(4, 8, 8, 4, 3, 3, pad=1)) is None
    assert "stride" in w.not_applicable(conv(4, 8, 8, 4, 3, 3, stride=2))
    assert "3x3" in w.not_applicable(conv(4, 8, 8, 4, 5, 5))
    assert "dilation" in w.not_applicable(conv(4, 8, 8, 4, 3, 3, dilation=2, pad=2))
    from xfc.cpu.winograd import check_applicable
    with pytest.raises(OperatorError, match="winograd does not apply.*stride"):
        check_applicable(conv(4, 8, 8, 4, 3, 3, stride=2))
