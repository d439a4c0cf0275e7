"""Cost model 14: Winograd plans are priced with their own L2 and shared-cache rates
(CostConstants.for_winograd), so the rates calibration fits on direct plans do not move Winograd
plans, and `xfc tiledb calibrate` fits the Winograd constants only when asked (fit(winograd=True))."""
from __future__ import annotations

from dataclasses import replace

import pytest

from xfc.cpu.cost_model import DEFAULT_CONSTANTS
from xfc.cpu.synth import synthesize_cpu
from xfc.cpu.winograd import stages_of_plan
from xfc.ops.spec import make_spec
from xfc.tiledb.calibrate import fit, predicted_s, training_cases, winograd_only

from support.calibration import CLUSTER, HW, synthetic_items

# r18_l4: 512 channels at 7x7; F(4,3)'s GEMMs read a U of 21.7 MB from the 32 MB L3 of the recorded host
R18_L4 = make_spec("conv2d", dict(c=512, h=7, w=7, k=512, r=3, s=3), pad=1)


def _winograd_plan(m: int):
    return synthesize_cpu(R18_L4, HW, CLUSTER.role, 1, lowering="winograd", winograd_m=m).plan


@pytest.mark.unit
def test_the_static_constants_price_winograd_plans_as_before():
    assert DEFAULT_CONSTANTS.for_winograd() is DEFAULT_CONSTANTS
    fitted = replace(DEFAULT_CONSTANTS, winograd_shared_cache_bytes_per_cycle=8.0)
    assert fitted.for_winograd().shared_cache_bytes_per_cycle == 8.0
    assert fitted.for_winograd().for_winograd() == fitted.for_winograd()          # idempotent


@pytest.mark.unit
def test_a_direct_plans_cache_rate_moves_direct_plans_only():
    plan = _winograd_plan(4)
    static = stages_of_plan(plan, HW, CLUSTER, DEFAULT_CONSTANTS)
    direct_slow_l3 = replace(DEFAULT_CONSTANTS, shared_cache_bytes_per_cycle=8.0, l2_bytes_per_cycle=12.0)
    assert stages_of_plan(plan, HW, CLUSTER, direct_slow_l3).total_s == static.total_s
    # the Winograd plans' own rate does move it: its GEMMs then wait on the L3
    slow = stages_of_plan(plan, HW, CLUSTER, replace(DEFAULT_CONSTANTS, winograd_shared_cache_bytes_per_cycle=8.0))
    assert slow.total_s > static.total_s * 1.2 and slow.gemm_bound == "L3"
    # ... and the direct plan of the same layer moves with the direct rates
    direct = synthesize_cpu(R18_L4, HW, CLUSTER.role, 1, lowering="direct").plan
    from xfc.tiledb.calibrate import Measured
    item = Measured(spec=R18_L4, threads=1, plan=direct, measured_s=1.0, spread=0.0)
    assert predicted_s(item, HW, CLUSTER, direct_slow_l3) > predicted_s(item, HW, CLUSTER, DEFAULT_CONSTANTS)
    # the synthesizer's choice of m is the static one whatever the direct plans' rates
    chosen = [synthesize_cpu(R18_L4, HW, CLUSTER.role, 1, constants=c).plan for c in (DEFAULT_CONSTANTS, direct_slow_l3)]
    assert chosen[0].winograd_m == chosen[1].winograd_m


@pytest.mark.unit
def test_calibration_leaves_the_winograd_constants_static_unless_asked():
    """Measurements made under Winograd constants far from the static ones: fitted with winograd=True
    the fit moves them; with winograd=False (the CLI's default) they stay static, while the direct
    plans' constants are fitted either way."""
    cases = [c for c in training_cases() if c.lowering == "winograd" or c.spec.__class__.__name__ == "MatmulSpec"]
    cases = cases[:3] + [c for c in cases if c.lowering == "winograd"][:6]
    truth = replace(DEFAULT_CONSTANTS, compute_efficiency=0.8, winograd_store_cycles=3.0,
                    winograd_shared_cache_bytes_per_cycle=8.0)
    items = synthetic_items(cases, truth, threads=(1,))
    asked = fit(items, HW, CLUSTER, winograd=True)
    default = fit(items, HW, CLUSTER, winograd=False)
    assert asked.constants.compute_efficiency == default.constants.compute_efficiency == pytest.approx(0.8)
    moved = {f for f, v in asked.constants.as_dict().items() if winograd_only(f) and v != getattr(DEFAULT_CONSTANTS, f)}
    assert moved                                   # the Winograd plans' times asked for other constants
    assert all(getattr(default.constants, f) == getattr(DEFAULT_CONSTANTS, f)
               for f in DEFAULT_CONSTANTS.as_dict() if winograd_only(f))
    assert asked.error_after < default.error_after
    # and a stored fit with moved Winograd constants is no start that keeps them
    again = fit(items, HW, CLUSTER, winograd=False, stored=asked.constants)
    assert all(getattr(again.constants, f) == getattr(DEFAULT_CONSTANTS, f)
               for f in DEFAULT_CONSTANTS.as_dict() if winograd_only(f))
