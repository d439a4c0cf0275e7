"""Deeper reduction slices for a Winograd GEMM stage (winograd.deeper_slices): the synthesizer
weighs KC doubled and the whole of C beside the L1 fit the matmul growth gives, keeps a deeper
slice only where the whole stage is predicted faster, says so in the explanation, and leaves NEON
plans alone. Unit: nothing is built or timed."""
from __future__ import annotations

from dataclasses import replace

import pytest

from xfc.cpu import winograd
from xfc.cpu.synth import synthesize_cpu
from xfc.hardware.load import load
from xfc.ops.spec import make_spec

from support.calibration import CLUSTER, HW

pytestmark = pytest.mark.unit

DEEP = make_spec("conv2d", dict(c=512, h=7, w=7, k=512, r=3, s=3), pad=1, bias=True, activation="relu")


def test_depths_double_up_to_the_whole_reduction():
    plan = winograd.hand_winograd_plan(DEEP, 2, "avx512", vectors="channels", kc=128)
    depths = [s.kc for s in winograd.deeper_slices(plan.gemm, DEEP, "avx512")]
    assert depths == [256, 512]
    odd = make_spec("conv2d", dict(c=200, h=9, w=9, k=200, r=3, s=3), pad=1)
    sched = replace(plan.gemm, kc=52)
    assert [s.kc for s in winograd.deeper_slices(sched, odd, "avx512")] == [104, 200]
    assert winograd.deeper_slices(replace(plan.gemm, kc=512), DEEP, "avx512") == []
    assert winograd.deeper_slices(plan.gemm, DEEP, "neon") == []


@pytest.mark.parametrize("threads", [1, 2])
def test_the_chosen_slice_is_the_fastest_predicted_depth(threads):
    synthesis = synthesize_cpu(DEEP, HW, CLUSTER.role, threads, lowering="winograd", winograd_m=2)
    plan = synthesis.plan
    shallower = [replace(plan.gemm, kc=kc) for kc in (64, 128, 256, 512) if kc < plan.gemm.kc]
    deeper = winograd.deeper_slices(plan.gemm, DEEP, plan.isa)
    chosen_s = synthesis.estimate.predicted_s
    # 16 tiles at 7x7: the L1 fit (KC 128 for a 10x32 tile in 32 KiB) is deepened to all of C
    assert plan.gemm.kc == 512
    for sched in shallower + deeper:
        other = replace(plan, gemm=sched)
        other_s = winograd.stages_of_plan(other, HW, CLUSTER).total_s
        if sched in deeper:
            assert other_s >= chosen_s * (1 - 1e-9), (sched.kc, plan.gemm.kc)
    levels = {lv.level: lv for lv in synthesis.levels}
    assert levels["GEMM L1"].tile.startswith(f"kc={plan.gemm.kc}:")


def test_neon_plans_keep_the_l1_fit():
    sd = load("snapdragon.yaml")
    synthesis = synthesize_cpu(DEEP, sd, lowering="winograd", winograd_m=2)
    levels = {lv.level: lv for lv in synthesis.levels}
    assert "streamed from L2" not in levels["GEMM L1"].tile
