"""The GEMM estimate's shared-cache term for A (issue 34): A is read from the shared cache once per
NC panel of B, unless one thread's whole A stays in its L2 share; then the panels after the first
re-read it from L2, and the shared-cache term counts it once (F(6,3) of a 200-channel 9x9 layer:
64 GEMMs of M = 4 whose 3 KB A was charged once per panel, pricing a narrower register tile, which
ran faster, 2% slower; docs/winograd.md, session 67)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from xfc.cpu.cost_model import DEFAULT_CONSTANTS, L2_FILL, StaticEvaluator, gemm_estimate, l2_per_core_bytes
from xfc.cpu.synth import synthesize_cpu
from xfc.cpu.tiles import MicroTile
from xfc.ops.spec import make_spec

from support.calibration import CLUSTER, HW

pytestmark = pytest.mark.unit
FLOAT_BYTES = 4


def _shared_term_s(spec, threads: int, nc: int, axis: str) -> float:
    plan = synthesize_cpu(spec, HW, CLUSTER.role, threads).plan
    sched = replace(plan.gemm, nc=nc, parallel_axis=axis, threads=threads)
    tile = MicroTile(mr=sched.mr, nr_vectors=sched.nr // plan.vector_lanes, lanes=plan.vector_lanes,
                     a_load_bits=sched.a_load_bits)
    score = StaticEvaluator().evaluate(tile, CLUSTER.core, plan.isa)
    return dict(gemm_estimate(spec, HW, CLUSTER, tile, score, sched, False).seconds_by_bound)["L3"]


def _a_bytes(spec) -> int:
    return FLOAT_BYTES * spec.m * spec.k


def test_an_a_that_stays_in_l2_is_read_from_the_shared_cache_once():
    spec = make_spec("matmul", dict(m=4, n=2048, k=256))
    assert _a_bytes(spec) <= l2_per_core_bytes(CLUSTER) * L2_FILL
    one_panel = _shared_term_s(spec, 1, 2048, "n")
    four_panels = _shared_term_s(spec, 1, 512, "n")
    assert four_panels == pytest.approx(one_panel, rel=1e-12)


def test_an_a_larger_than_the_l2_share_is_read_once_per_panel():
    spec = make_spec("matmul", dict(m=1024, n=2048, k=1024))
    assert _a_bytes(spec) > l2_per_core_bytes(CLUSTER) * L2_FILL
    one_panel = _shared_term_s(spec, 1, 2048, "n")
    four_panels = _shared_term_s(spec, 1, 512, "n")
    rate = DEFAULT_CONSTANTS.shared_cache_bytes_per_s(CLUSTER.clock_ghz * 1e9, 1, HW.shared_cache_read_gbps)
    assert four_panels - one_panel == pytest.approx(3 * _a_bytes(spec) / rate, rel=1e-9)   # three more reads of A


def test_split_over_m_each_thread_keeps_its_rows_of_a():
    # A of 768 KB: over the 512 KB L2 share whole, under it halved between two threads
    spec = make_spec("matmul", dict(m=192, n=4096, k=1024))
    share = l2_per_core_bytes(CLUSTER) * L2_FILL
    assert _a_bytes(spec) > share >= _a_bytes(spec) / 2
    over_m = _shared_term_s(spec, 2, 1024, "m"), _shared_term_s(spec, 2, 4096, "m")
    over_n = _shared_term_s(spec, 2, 1024, "n"), _shared_term_s(spec, 2, 4096, "n")
    assert over_m[0] == pytest.approx(over_m[1], rel=1e-12)     # each thread's half stays in its L2
    assert over_n[0] > over_n[1]                                 # every thread reads all of A per panel
