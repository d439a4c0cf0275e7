"""GEMM edge cases derived from a plan's tiles, the way XNNPACK generates its micro-kernel tests
from the kernel's parameters: the shapes that put the tails exactly where the tiles end.

  M   one full row tile (MR), a row tail alone (M < MR), a tail of one row, a tail of MR - 1 rows
  N   one full column tile (NR), a tail of whole vectors (NR + LANES), a partial last vector
      (2 NR - 1), N below one vector, a tail of one column
  K   one step, around the k unroll (KU - 1, KU + 1), around KC (KC - 1, KC, KC + 1), and two KC
      slices plus a ragged third

Every M value meets every N value once; the K values cycle through those pairs, so each K value
occurs and every (M tail, N tail) corner is built. Every third case fuses bias + ReLU.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GemmCase:
    m: int
    n: int
    k: int
    bias: bool
    activation: str
    why: str

    @property
    def id(self) -> str:
        return f"m{self.m}n{self.n}k{self.k}" + ("+bias_relu" if self.bias else "")


def _unique(values: list[tuple[int, str]]) -> list[tuple[int, str]]:
    seen, out = set(), []
    for value, why in values:
        if value >= 1 and value not in seen:
            seen.add(value)
            out.append((value, why))
    return out


def gemm_cases(mr: int, nr: int, lanes: int, kc: int, k_unroll: int) -> list[GemmCase]:
    """The edge cases of a GEMM plan with register tile MR x NR (NR a multiple of LANES), K slices
    of KC and a k unroll of KU."""
    ms = _unique([(mr, "M = MR"), (max(1, mr // 2), "M < MR: the row tail alone"), (2 * mr + 1, "M = 2 MR + 1"),
                  (3 * mr - 1, "M = 3 MR - 1")])
    ns = _unique([(nr, "N = NR"), (nr + lanes, "N = NR + LANES: a whole-vector tail"),
                  (2 * nr - 1, "N = 2 NR - 1: a partial last vector"), (max(1, lanes - 1), "N < LANES"),
                  (nr + 1, "N = NR + 1")])
    ks = _unique([(1, "K = 1"), (k_unroll - 1, "K = KU - 1"), (k_unroll + 1, "K = KU + 1"), (kc - 1, "K = KC - 1"),
                  (kc, "K = KC"), (kc + 1, "K = KC + 1"), (2 * kc + k_unroll + 1, "K = 2 KC + KU + 1")])
    cases = []
    for i, ((m, m_why), (n, n_why)) in enumerate((pm, pn) for pm in ms for pn in ns):
        k, k_why = ks[i % len(ks)]
        fused = i % 3 == 2
        cases.append(GemmCase(m=m, n=n, k=k, bias=fused, activation="relu" if fused else "none",
                              why=f"{m_why}; {n_why}; {k_why}"))
    return cases


# int8 depthwise 'channels' layout (x86 and AArch64 alike): ragged cases. Channel counts off 16 (last
# groups of 5, 3, 1 and 8 channels), a plane narrower than a quad, strides 1 to 4 (Q built on every 2nd
# / 4th column for 2 and 4), filters of 1 to 9 columns (1 to 3 quads per row), asymmetric padding,
# vertical dilation, batch 2, 2 threads, no bias, both activation types with zero points at both ends;
# the output zero points keep most outputs off the clamp bounds under ReLU.
DEPTHWISE_CHANNELS_CASES = [
    # shape, geometry, (act, a_zp, out_zp), activation, per_channel, bias, threads
    ({"c": 21, "h": 9, "w": 13, "r": 3, "s": 3, "n": 2}, {"stride": "2", "pad": "1"}, ("int8", -128, -100),
     "relu6", True, True, 2),
    ({"c": 19, "h": 5, "w": 4, "r": 5, "s": 5}, {"pad": "2,1"}, ("int8", 127, -128), "relu6", False, True, 1),
    ({"c": 33, "h": 11, "w": 10, "r": 3, "s": 7}, {"stride": "2,1", "pad": "1,3,0,2", "dilation": "2,1"},
     ("uint8", 0, 255), "none", True, False, 2),
    ({"c": 5, "h": 3, "w": 2, "r": 3, "s": 3}, {"stride": "1", "pad": "1"}, ("int8", 0, -7), "none", True, True, 1),
    ({"c": 40, "h": 23, "w": 37, "r": 3, "s": 3}, {"stride": "3", "pad": "1,2,0,1"}, ("uint8", 128, 3),
     "relu6", True, True, 2),
    ({"c": 17, "h": 17, "w": 29, "r": 2, "s": 9}, {"stride": "4", "pad": "0,4,1,3"}, ("int8", -9, 4),
     "none", False, True, 1),
]
