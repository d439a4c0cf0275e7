"""Winograd minimal filtering F(m x m, 3 x 3): the transforms, a numpy model and the error bound.

Pure functions (no I/O). The CPU planner (xfc/cpu/winograd.py) and code generation read the
transform matrices from here; the verification of a Winograd plan uses `reference.check_winograd_output` (or check_output(..., winograd_m=m)).

Transforms, generated from interpolation points
------------------------------------------------
F(m, r) computes m outputs of a 1-D correlation with an r-tap filter from a = m + r - 1 inputs as

    y = AT [ (G g) * (BT d) ]        (* elementwise; AT: m x a, G: a x r, BT: a x a)

It is the transpose of the Toom-Cook algorithm for the linear convolution of g (degree r - 1) with
an m-term polynomial: evaluate both at a - 1 finite points p_j and at infinity, multiply pointwise,
interpolate. Hence (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", CVPR 2016,
section 4, whose points we use: 0, +-1, +-2, +-1/2 and infinity):

    A[j][i]  = p_j^i                   (evaluation of the m-term operand; row "infinity": its
                                        leading coefficient, A[inf][i] = [i == m - 1])
    G[j][k]  = p_j^k / prod_{l != j} (p_j - p_l)     (G[inf][k] = [k == r - 1])
    BT[j][i] = coefficient of x^i in prod_{l != j} (x - p_l),   BT[inf][i] = coefficient of x^i
               in prod_l (x - p_l)

(the Lagrange denominators are moved into G, so BT is integral). All of it is computed in exact
rational arithmetic (fractions.Fraction) and converted to float once. 2-D: Y = AT [U * V] AT^T with
U = G g G^T (per filter and input channel) and V = BT d BT^T (per input tile and channel), summed
over input channels before the output transform.

Error bound of a Winograd plan (next to the direct fp32 bound of reference.error_bound)
-----------------------------------------------------------------------------------------
Standard model, u = 2^-24, gamma_n = n u / (1 - n u). Take |X| elementwise. The kernel computes
U in double and rounds it once (|dU| <= u Ubar, Ubar = |G||g||G|^T); V in fp32 with two passes of
a-term sums (|dV| <= gamma_2a Vbar, Vbar = |BT||d||BT|^T); the a^2 GEMMs over C input channels
(any order: gamma_C sum_c |U||V|); the output transform in two passes of a-term sums (gamma_2a),
then bias and the final rounding. To first order, per output element,

    |y_computed - y| <= gamma_(C + 4a + 3) * ( Mw + |bias| ),   Mw = |AT| (sum_c Ubar * Vbar) |AT|^T

(Mw per output tile, cropped to the output). This replaces the direct bound's K = C R S and
M_e = sum |w x| by C + 4a + 3 and Mw: Mw >= M_e, and the transforms' norms say by how much.
With |g| <= g_max and |d| <= d_max, Ubar_ij <= g_max sG_i sG_j and Vbar_ij <= d_max sB_i sB_j
(sG, sB: the absolute row sums of G and BT), so

    Mw <= 9 C g_max d_max * growth(m),   growth(m) = max_y ( sum_i |AT_yi| sG_i sB_i )^2 / 9

relative to the direct magnitude scale 9 C g_max d_max: growth 7.1 (m=2), 256 (m=4), 509 (m=6).

Tolerance: a tile size is admissible for C input channels when the worst-case relative bound
gamma_(C + 4a + 3) * growth(m) stays within RELATIVE_TOLERANCE = 2^-6 (six correct bits in the
worst case; typical errors are far smaller since rounding errors add like sqrt(C)). That admits
m = 2 for any C below 10^4, m = 4 up to C ~ 1000 and m = 6 up to C ~ 500 (not at C = 512).

The RMS (statistical) check of accuracy.py is not applied to Winograd outputs: its model counts
the rounding events of a direct dot product; the worst-case bound above is the check. Its limit:
at m = 4 and 6 the bound is wide enough to admit operands rounded to fp16 (at m = 2 it is not),
so it catches wrong results (a missing channel, a wrong tap, an unwritten element), not a loss
of a few bits of precision.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional

import numpy as np

from .accuracy import UNIT_ROUNDOFF
from .spec import Conv2dSpec, OperatorSpec

FILTER_TAPS = 3
# Interpolation points per output tile size m (a - 1 = m + 1 finite points, plus infinity), as in
# Lavin & Gray 2016: small integers first, then +-1/2 (keeps the transform entries small).
INTERPOLATION_POINTS: dict[int, tuple[Fraction, ...]] = {
    2: (Fraction(0), Fraction(1), Fraction(-1)),
    4: (Fraction(0), Fraction(1), Fraction(-1), Fraction(2), Fraction(-2)),
    6: (Fraction(0), Fraction(1), Fraction(-1), Fraction(2), Fraction(-2), Fraction(1, 2), Fraction(-1, 2)),
}
TILE_SIZES = tuple(sorted(INTERPOLATION_POINTS))
RELATIVE_TOLERANCE = 2.0 ** -6      # worst-case relative bound a tile size may reach (module docstring)
ROUNDINGS_PER_PASS_FACTOR = 4       # two input-transform and two output-transform passes of a-term sums
EXTRA_ROUNDINGS = 3                 # filter transform rounding, bias add, final rounding


Matrix = tuple[tuple[Fraction, ...], ...]


def _times_linear(c: list[int], q: int) -> list[int]:
    """The coefficients (ascending powers) of c(y) (y - q)."""
    out = [0] + c
    for i, x in enumerate(c):
        out[i] -= q * x
    return out


def _divided_by_linear(c: list[int], p: int) -> list[int]:
    """The quotient of c(y) / (y - p) (ascending powers) for a root p of c (synthetic division)."""
    out = [0] * (len(c) - 1)
    out[-1] = c[-1]
    for k in range(len(c) - 2, 0, -1):
        out[k - 1] = c[k] + p * out[k]
    return out


@dataclass(frozen=True)
class WinogradTransforms:
    """The exact transforms of F(m x m, r x r); `.at`, `.g`, `.bt` as float64 arrays."""

    m: int
    r: int
    points: tuple[Fraction, ...]
    at_exact: Matrix        # m x a
    g_exact: Matrix         # a x r
    bt_exact: Matrix        # a x a

    @property
    def alpha(self) -> int:
        """Input tile side a = m + r - 1."""
        return self.m + self.r - 1

    @property
    def at(self) -> np.ndarray:
        return np.array(self.at_exact, dtype=np.float64)

    @property
    def g(self) -> np.ndarray:
        return np.array(self.g_exact, dtype=np.float64)

    @property
    def bt(self) -> np.ndarray:
        return np.array(self.bt_exact, dtype=np.float64)

    def growth(self) -> float:
        """How much the worst-case magnitude Mw can exceed the direct one, 9 C g_max d_max (docstring)."""
        return _growth(self.m, self.r)

    def arithmetic(self) -> dict:
        """Nonzero multiply-adds of one 2-D transform pass pair, per tile (for the cost model):
        input (BT d BT^T), output (AT M AT^T) and filter (G g G^T)."""
        return dict(_arithmetic(self.m, self.r))


# Pure functions of the transforms, asked for many times per synthesis: cached by (m, r), which
# names the transforms (hashing their Fraction matrices would cost more than computing them).
@functools.lru_cache(maxsize=None)
def _growth(m: int, r: int) -> float:
    # in Python floats from the exact entries: every sum has positive terms, so the result is within
    # a few ulps of the exact rational one, without Fraction arithmetic (the first Winograd synthesis
    # of a process pays for this and for the transforms: docs/winograd.md, session 67)
    t = transforms(m, r)

    def magnitudes(matrix: Matrix) -> list[list[float]]:
        return [[abs(float(x)) for x in row] for row in matrix]
    s_g = [sum(row) for row in magnitudes(t.g_exact)]
    s_b = [sum(row) for row in magnitudes(t.bt_exact)]
    worst = max(sum(row[j] * s_g[j] * s_b[j] for j in range(t.alpha)) for row in magnitudes(t.at_exact))
    return worst * worst / (t.r * t.r)


@functools.lru_cache(maxsize=None)
def _arithmetic(m: int, r: int) -> tuple[tuple[str, int], ...]:
    t = transforms(m, r)

    def nnz(mat) -> int:
        return int(sum(1 for row in mat for x in row if x != 0))
    a = t.alpha
    return (("input", nnz(t.bt_exact) * a * 2), ("output", nnz(t.at_exact) * a + nnz(t.at_exact) * m),
            ("filter", nnz(t.g_exact) * r + nnz(t.g_exact) * a))


@functools.lru_cache(maxsize=None)
def transforms(m: int, r: int = FILTER_TAPS) -> WinogradTransforms:
    """F(m x m, r x r) from INTERPOLATION_POINTS[m] (exact rationals)."""
    if m not in INTERPOLATION_POINTS:
        raise ValueError(f"no interpolation points for Winograd tile size m={m} (have {TILE_SIZES})")
    points = INTERPOLATION_POINTS[m]
    a = m + r - 1
    if len(points) != a - 1:
        raise ValueError(f"F({m},{r}) needs {a - 1} finite points, got {len(points)}")
    # full(x) = prod over the points of (x - q); row j of BT holds the coefficients of
    # full(x) / (x - p_j) = prod over q != p_j of (x - q), and G's row j is divided by that
    # product's value at p_j (Lagrange); the last rows are the point at infinity.
    # In integers, with y = D x for D the points' common denominator (every point p = P / D):
    # prod over q != p_j of (x - q) = Q_j(y) / D^(n-1), Q_j(y) = prod over i != j of (y - P_i),
    # so each entry is one fraction of two integers, made once (Fraction arithmetic normalises
    # after every operation; the first Winograd synthesis of a process pays for building these).
    n = len(points)
    d = math.lcm(*(p.denominator for p in points))
    scaled = [int(p * d) for p in points]
    full = [1]
    for q in scaled:
        full = _times_linear(full, q)
    g_rows, a_rows = [], []
    bt = [[Fraction(0)] * a for _ in range(a)]
    for j, p in enumerate(scaled):
        numerator = _divided_by_linear(full, p)                        # Q_j(y), ascending
        value_at_p = math.prod(p - q for i, q in enumerate(scaled) if i != j)   # Q_j(P_j)
        # x^k has coefficient numerator[k] d^k / d^(n-1); G's entry p^k / prod(p_j - q) is
        # (P^k / d^k) d^(n-1) / Q_j(P_j)
        bt[j][:len(numerator)] = [Fraction(c * d ** k, d ** (n - 1)) for k, c in enumerate(numerator)]
        g_rows.append(tuple(Fraction(p ** k * d ** (n - 1), d ** k * value_at_p) for k in range(r)))
        a_rows.append(tuple(Fraction(p ** i, d ** i) for i in range(m)))
    g_rows.append(tuple(Fraction(int(k == r - 1)) for k in range(r)))     # the point at infinity
    a_rows.append(tuple(Fraction(int(i == m - 1)) for i in range(m)))
    bt[a - 1] = [Fraction(c * d ** k, d ** n) for k, c in enumerate(full)]
    at = tuple(tuple(a_rows[j][i] for j in range(a)) for i in range(m))
    return WinogradTransforms(m=m, r=r, points=points, at_exact=at, g_exact=tuple(g_rows),
                              bt_exact=tuple(tuple(row) for row in bt))


# ---------------------------------------------------------------------------------------------
# Applicability and the tile-size policy
# ---------------------------------------------------------------------------------------------

def not_applicable(spec: OperatorSpec) -> Optional[str]:
    """Why the Winograd lowering does not apply to spec (None: it applies)."""
    if not isinstance(spec, Conv2dSpec):
        return f"winograd lowers conv2d only, not {spec.name}"
    if (spec.r, spec.s) != (FILTER_TAPS, FILTER_TAPS):
        return f"winograd needs a 3x3 filter, got {spec.r}x{spec.s}"
    if (spec.stride_h, spec.stride_w) != (1, 1):
        return f"winograd needs stride 1, got {spec.stride_h}x{spec.stride_w}"
    if (spec.dilation_h, spec.dilation_w) != (1, 1):
        return f"winograd needs dilation 1, got {spec.dilation_h}x{spec.dilation_w}"
    return None


def channel_roundings(m: int, c: int) -> int:
    """n of the gamma_n in the Winograd bound: C + 4a + 3."""
    return c + ROUNDINGS_PER_PASS_FACTOR * (m + FILTER_TAPS - 1) + EXTRA_ROUNDINGS


def _gamma(n: int) -> float:
    return n * UNIT_ROUNDOFF / (1 - n * UNIT_ROUNDOFF)


def relative_bound(m: int, c: int) -> float:
    """Worst-case error bound relative to the direct magnitude scale 9 C g_max d_max."""
    return _gamma(channel_roundings(m, c)) * transforms(m).growth()


@functools.lru_cache(maxsize=1024)
def admissible_tile_sizes(c: int) -> tuple[int, ...]:
    """The tile sizes whose worst-case relative bound stays within RELATIVE_TOLERANCE at C = c."""
    return tuple(m for m in TILE_SIZES if relative_bound(m, c) <= RELATIVE_TOLERANCE)


# ---------------------------------------------------------------------------------------------
# numpy model (tests) and the verification bound
# ---------------------------------------------------------------------------------------------

def tile_counts(spec: Conv2dSpec, m: int) -> tuple[int, int]:
    """(tile rows, tile columns) covering the output."""
    return math.ceil(spec.out_h / m), math.ceil(spec.out_w / m)


def input_tiles(spec: Conv2dSpec, x: np.ndarray, m: int) -> np.ndarray:
    """[N, C, TH, TW, a, a] overlapping input tiles of the zero-padded input (zeros past the
    bottom/right edge too, for ragged output sizes)."""
    th, tw = tile_counts(spec, m)
    a = m + FILTER_TAPS - 1
    rows, cols = th * m + a - m, tw * m + a - m
    xp = np.zeros(x.shape[:2] + (rows, cols), dtype=x.dtype)
    h_end = min(spec.h, rows - spec.pad_top)
    w_end = min(spec.w, cols - spec.pad_left)
    xp[:, :, spec.pad_top:spec.pad_top + h_end, spec.pad_left:spec.pad_left + w_end] = x[:, :, :h_end, :w_end]
    sn, sc, sh, sw = xp.strides
    return np.lib.stride_tricks.as_strided(xp, shape=x.shape[:2] + (th, tw, a, a),
                                           strides=(sn, sc, sh * m, sw * m, sh, sw), writeable=False)


def _untile(spec: Conv2dSpec, y: np.ndarray) -> np.ndarray:
    """[N, K, TH, TW, m, m] -> [N, K, OH, OW] (cropping the ragged edge)."""
    n, k, th, tw, m, _ = y.shape
    return y.transpose(0, 1, 2, 4, 3, 5).reshape(n, k, th * m, tw * m)[:, :, :spec.out_h, :spec.out_w]


def winograd_conv(spec: Conv2dSpec, x: np.ndarray, w: np.ndarray, bias: np.ndarray, m: int,
                  dtype=np.float64) -> np.ndarray:
    """The Winograd algorithm in numpy (in dtype), with the spec's epilogue: a model of what the
    kernel computes (tests check it against the direct reference)."""
    t = transforms(m)
    at, g, bt = (mat.astype(dtype) for mat in (t.at, t.g, t.bt))
    u = np.einsum("ij,kcjl,ml->kcim", g, w.astype(dtype), g).astype(dtype)
    v = np.einsum("ij,nctwjl,ml->nctwim", bt, input_tiles(spec, x.astype(dtype), m), bt).astype(dtype)
    mm = np.einsum("kcij,nctwij->nktwij", u, v).astype(dtype)
    y = _untile(spec, np.einsum("ij,nktwjl,ml->nktwim", at, mm, at).astype(dtype))
    if spec.epilogue.bias:
        y = y + bias.astype(dtype).reshape(1, -1, 1, 1)
    if spec.epilogue.activation == "relu":
        y = np.maximum(y, 0)
    elif spec.epilogue.activation == "relu6":
        y = np.clip(y, 0, 6)
    return y


def winograd_magnitude(spec: Conv2dSpec, x: np.ndarray, w: np.ndarray, m: int) -> np.ndarray:
    """Mw of the module docstring, per output element (float64)."""
    t = transforms(m)
    at, g, bt = np.abs(t.at), np.abs(t.g), np.abs(t.bt)
    u_bar = np.einsum("ij,kcjl,ml->kcim", g, np.abs(w.astype(np.float64)), g)
    v_bar = np.einsum("ij,nctwjl,ml->nctwim", bt, input_tiles(spec, np.abs(x.astype(np.float64)), m), bt)
    total = np.einsum("kcij,nctwij->nktwij", u_bar, v_bar, optimize=True)
    return _untile(spec, np.einsum("ij,nktwjl,ml->nktwim", at, total, at))


def winograd_error_bound(spec: Conv2dSpec, x: np.ndarray, w: np.ndarray, bias: np.ndarray, m: int) -> np.ndarray:
    """Per-element bound gamma_(C + 4a + 3) (Mw + |bias|) (module docstring)."""
    mag = winograd_magnitude(spec, x, w, m)
    if spec.epilogue.bias:
        mag = mag + np.abs(bias.astype(np.float64)).reshape(1, -1, 1, 1)
    return _gamma(channel_roundings(m, spec.c)) * mag + np.finfo(np.float32).tiny
