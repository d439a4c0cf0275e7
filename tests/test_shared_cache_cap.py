"""The shared cache's chip-wide bandwidth cap (cost-model form 3, issue 11): uncapped by default,
so no prediction moves until calibration finds a cap; when set, an L3-resident call stops scaling
at it, and the fit recovers it from measurements that show it."""
from __future__ import annotations

from dataclasses import replace

import pytest

from xfc.cpu.cost_model import DEFAULT_CONSTANTS, StaticEvaluator, depthwise_memory, gemm_estimate
from xfc.cpu.synth import synthesize_cpu
from xfc.cpu.tiles import MicroTile
from xfc.ops.spec import make_spec
from xfc.tiledb.calibrate import GRIDS, Measured, fit, predicted_s, training_specs

from support.calibration import CLUSTER, HW

pytestmark = pytest.mark.unit

# 96 planes of 112x112 in, 56x56 out: about 6 MB, more than half a 1 MiB L2 per thread, in the L3.
L3_RESIDENT = make_spec("depthwise", dict(c=96, h=112, w=112, r=3, s=3), stride=2, pad=1)


def test_uncapped_by_default_so_the_shared_cache_scales_with_every_core():
    assert DEFAULT_CONSTANTS.shared_cache_chip_bytes_per_cycle == 0
    level1, one = depthwise_memory(L3_RESIDENT, HW, CLUSTER, 1)
    level2, two = depthwise_memory(L3_RESIDENT, HW, CLUSTER, 2)
    assert level1 == level2 == "L3"
    assert two == pytest.approx(one / 2, rel=1e-12)


def test_a_cap_holds_two_threads_to_the_chip_wide_rate():
    capped = replace(DEFAULT_CONSTANTS, shared_cache_chip_bytes_per_cycle=24.0)
    _, one = depthwise_memory(L3_RESIDENT, HW, CLUSTER, 1, capped)
    _, two = depthwise_memory(L3_RESIDENT, HW, CLUSTER, 2, capped)
    _, one_uncapped = depthwise_memory(L3_RESIDENT, HW, CLUSTER, 1)
    assert one == pytest.approx(one_uncapped, rel=1e-12)         # 16 B/cycle for one core is under the cap
    assert two == pytest.approx(one * 16.0 / 24.0, rel=1e-12)     # two ports of 16 would be 32; the cap is 24
    # A cap above what the cores can draw changes nothing.
    loose = replace(DEFAULT_CONSTANTS, shared_cache_chip_bytes_per_cycle=64.0)
    assert depthwise_memory(L3_RESIDENT, HW, CLUSTER, 2, loose)[1] == pytest.approx(one / 2, rel=1e-12)


def _gemm_parts(item: Measured, constants) -> dict:
    """The estimate's terms for the plan that ran (as calibrate.predicted_s re-estimates it)."""
    plan = item.plan
    g = plan.gemm
    tile = MicroTile(mr=g.mr, nr_vectors=g.nr // plan.vector_lanes, lanes=plan.vector_lanes, a_load_bits=g.a_load_bits)
    score = StaticEvaluator().evaluate(tile, CLUSTER.core, plan.isa)
    return dict(gemm_estimate(item.spec, HW, CLUSTER, tile, score, g, plan.lowering == "implicit_gemm_t",
                              constants).seconds_by_bound)


def test_the_gemm_shared_cache_term_takes_the_cap_too():
    spec = make_spec("matmul", dict(m=1024, n=1024, k=1024))
    plan = synthesize_cpu(spec, HW, CLUSTER.role, 2).plan
    item = Measured(spec=spec, threads=2, plan=plan, measured_s=1.0, spread=0.0)
    uncapped = _gemm_parts(item, DEFAULT_CONSTANTS)
    capped = _gemm_parts(item, replace(DEFAULT_CONSTANTS, shared_cache_chip_bytes_per_cycle=16.0))
    assert capped["L3"] == pytest.approx(2 * uncapped["L3"], rel=1e-12)   # two ports of 16 held to 16
    assert capped["compute"] == uncapped["compute"] and capped["L2"] == uncapped["L2"]


def test_the_fit_recovers_a_cap_from_measurements_that_show_it():
    truth = replace(DEFAULT_CONSTANTS, shared_cache_chip_bytes_per_cycle=20.0)
    assert truth.shared_cache_chip_bytes_per_cycle in GRIDS["shared_cache_chip_bytes_per_cycle"]
    items = []
    for spec in training_specs():
        for t in (1, 2):
            plan = synthesize_cpu(spec, HW, CLUSTER.role, t).plan
            item = Measured(spec=spec, threads=t, plan=plan, measured_s=1.0, spread=0.0)
            items.append(replace(item, measured_s=predicted_s(item, HW, CLUSTER, truth)))
    result = fit(items, HW, CLUSTER)
    assert result.worst_before > 0.1             # the training rows that live in L3 are held back by the cap
    assert result.error_after < 0.002
    assert result.constants.shared_cache_chip_bytes_per_cycle == 20.0
