"""Candidates the cost model cannot tell apart by their binding bound (a memory level ties them)
are ranked by their compute time next: a tile that pads the problem less is never slower, and is
faster as soon as the memory bound is looser than modelled (issue 17: a 4x24 tile padding N=16
to 24 was chosen over 6x16 for a Winograd GEMM at 2 threads, costing 11% measured)."""
from __future__ import annotations

import pytest

from xfc.hardware.host import X86_64_V3_FLAGS
from xfc.cpu.cost_model import DEFAULT_CONSTANTS, StaticEvaluator
from xfc.cpu.synth import RANK_BUCKET, ranked_gemm_candidates
from xfc.hardware.host import HostMeasurement, describe_host
from xfc.ops.spec import MatmulSpec

pytestmark = pytest.mark.unit

FACTS = {"flags": set(X86_64_V3_FLAGS), "model name": "Recorded AVX2 CPU", "cpu MHz": "3700.000"}


def _host(dram_gbps: float):
    measured = HostMeasurement(clock_ghz=3.7, fma_per_cycle=((128, 2.0), (256, 2.0)), fma_latency_cycles=4.0,
                               measured_at="2026-01-01T00:00:00Z", cached=True, dram_read_gbps=dram_gbps)
    return describe_host(FACTS, {"L2": {"size_kib": 1024, "line_bytes": 64, "ways": 8, "shared_by_cores": 1},
                                 "L3": {"size_kib": 32768, "line_bytes": 64, "ways": 16, "shared_by_cores": 2}},
                         2, "x86_64", measured=measured)


@pytest.mark.parametrize("dram_gbps", [8.0, 20.0, 400.0])
@pytest.mark.parametrize("threads", [1, 2])
def test_among_tied_candidates_the_least_compute_wins(dram_gbps, threads):
    hw = _host(dram_gbps)
    problem = MatmulSpec(m=256, n=16, k=256, batch=1)     # one GEMM of a Winograd F(4,3) plan at 14x14
    ranked = ranked_gemm_candidates(problem, hw, hw.cluster(), threads, "avx2", StaticEvaluator(), DEFAULT_CONSTANTS)
    fastest = min(c.predicted_s for c in ranked)
    tied = [c for c in ranked if round((c.predicted_s / fastest - 1) / RANK_BUCKET) == 0]
    best = ranked[0]
    assert best in tied
    least = min(c.compute_s for c in tied)
    assert best.compute_s <= least * (1 + RANK_BUCKET), (best.summary(), [(c.summary(), c.compute_s) for c in tied])


def test_a_memory_bound_tie_no_longer_pads_the_columns():
    """Starved of DRAM bandwidth, every tile of this GEMM is memory-bound at 2 threads; the chosen
    one must still not pad N=16 columns to a multiple of 24."""
    hw = _host(8.0)
    ranked = ranked_gemm_candidates(MatmulSpec(m=256, n=16, k=256, batch=1), hw, hw.cluster(), 2, "avx2",
                                    StaticEvaluator(), DEFAULT_CONSTANTS)
    assert ranked[0].estimate.bound != "compute"
    assert 16 % ranked[0].sched.nr == 0, ranked[0].summary()
