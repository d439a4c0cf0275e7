"""The per-core cap on a GEMM's DRAM stream (cost-model form 5): a Winograd GEMM stage whose
transformed filter U lives in DRAM is charged at threads x the per-core rate when that is lower
than the chip's; uncapped by default; `xfc tiledb calibrate` recovers a known cap from synthetic
measurements. Unit: nothing is built or timed."""
from __future__ import annotations

from dataclasses import replace

import pytest

from xfc.cpu.cost_model import DEFAULT_CONSTANTS, dram_bytes_per_second, dram_stream_bytes_per_second
from xfc.cpu.synth import synthesize_cpu
from xfc.cpu.winograd import stages_of_plan
from xfc.ops.spec import make_spec
from xfc.tiledb.calibrate import GRIDS, Measured, fit, predicted_s, training_cases

from test_calibrate import CLUSTER, HW

pytestmark = pytest.mark.unit

# 512 channels at 14x14: U of F(4,3) is 36 x 512 x 512 floats = 38 MB, past the 32 MB L3.
BIG = make_spec("conv2d", dict(c=512, h=14, w=14, k=512, r=3, s=3), pad=1)


def _stages(constants, m, threads):
    plan = synthesize_cpu(BIG, HW, CLUSTER.role, threads, lowering="winograd", winograd_m=m,
                          constants=constants).plan
    return stages_of_plan(plan, HW, CLUSTER, constants)


def test_the_stream_rate_is_the_chip_rate_unless_a_lower_per_core_cap_is_known():
    chip = dram_bytes_per_second(HW)
    assert dram_stream_bytes_per_second(HW, CLUSTER, 1) == chip
    capped = replace(DEFAULT_CONSTANTS, dram_stream_core_bytes_per_cycle=2.0)
    per_core = 2.0 * CLUSTER.clock_ghz * 1e9
    assert dram_stream_bytes_per_second(HW, CLUSTER, 1, capped) == pytest.approx(min(chip, per_core))
    assert dram_stream_bytes_per_second(HW, CLUSTER, 2, capped) == pytest.approx(min(chip, 2 * per_core))
    huge = replace(DEFAULT_CONSTANTS, dram_stream_core_bytes_per_cycle=1e6)
    assert dram_stream_bytes_per_second(HW, CLUSTER, 2, huge) == chip


def test_a_filter_in_dram_is_charged_at_the_capped_rate_and_a_filter_on_chip_is_not():
    capped = replace(DEFAULT_CONSTANTS, dram_stream_core_bytes_per_cycle=2.0)
    free, slow = _stages(DEFAULT_CONSTANTS, 4, 1), _stages(capped, 4, 1)
    assert free.weights_level == slow.weights_level == "DRAM"
    assert slow.gemm_bound == "DRAM" and slow.gemm_s > free.gemm_s
    # two threads stream twice as fast under the per-core cap
    assert _stages(capped, 4, 2).gemm_s < 0.6 * slow.gemm_s
    small = make_spec("conv2d", dict(c=128, h=28, w=28, k=128, r=3, s=3), pad=1)   # U 2.4 MB: on chip
    plans = [synthesize_cpu(small, HW, CLUSTER.role, 1, lowering="winograd", winograd_m=4, constants=c)
             for c in (DEFAULT_CONSTANTS, capped)]
    assert plans[0].estimate.predicted_s == plans[1].estimate.predicted_s


def test_the_fit_recovers_a_known_per_core_stream_cap():
    truth = replace(DEFAULT_CONSTANTS, dram_stream_core_bytes_per_cycle=2.5)
    assert truth.dram_stream_core_bytes_per_cycle in GRIDS["dram_stream_core_bytes_per_cycle"]
    items = []
    for case in training_cases():
        for t in (1, 2):
            plan = synthesize_cpu(case.spec, HW, CLUSTER.role, t, lowering=case.lowering,
                                  winograd_m=case.winograd_m).plan
            item = Measured(spec=case.spec, threads=t, plan=plan, measured_s=1.0, spread=0.0)
            items.append(replace(item, measured_s=predicted_s(item, HW, CLUSTER, truth)))
    moved = [i for i in items if predicted_s(i, HW, CLUSTER, DEFAULT_CONSTANTS) != i.measured_s]
    assert moved, "some training plan must stream its filter from DRAM, or the cap cannot be fitted"
    result = fit(items, HW, CLUSTER)
    assert result.constants.dram_stream_core_bytes_per_cycle == 2.5
    assert result.worst_after < 1e-9
