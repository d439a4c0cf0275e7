"""The Winograd GEMM stage fitted to its stage (winograd.deeper_slices, winograd.rows_within): the
synthesizer weighs fewer, deeper reduction slices beside the L1 fit the matmul growth gives and
keeps one only where the whole stage is predicted faster; a register tile taller than the GEMM's
rows is cut to them; the explanation restates both; NEON plans keep the L1 fit. Unit: nothing is
built or timed."""
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


def test_depths_are_equal_slices_halving_in_number_up_to_the_whole_reduction():
    plan = winograd.hand_winograd_plan(DEEP, 2, "avx512", vectors="channels", kc=128)
    assert [s.kc for s in winograd.deeper_slices(plan.gemm, DEEP, "avx512")] == [256, 512]
    # 480 in slices of 160 (three): two of 240, then one of 480 (not 320 + 160)
    odd = make_spec("conv2d", dict(c=480, h=9, w=9, k=64, r=3, s=3), pad=1)
    assert [s.kc for s in winograd.deeper_slices(replace(plan.gemm, kc=160), odd, "avx512")] == [240, 480]
    # 200 in slices of 52 (four): two of 100, then one of 200; every depth a multiple of the unroll
    # but the whole reduction
    odd = make_spec("conv2d", dict(c=200, h=9, w=9, k=200, r=3, s=3), pad=1)
    assert [s.kc for s in winograd.deeper_slices(replace(plan.gemm, kc=52), odd, "avx512")] == [100, 200]
    assert winograd.deeper_slices(replace(plan.gemm, kc=512), DEEP, "avx512") == []
    assert winograd.deeper_slices(plan.gemm, DEEP, "neon") == []


@pytest.mark.parametrize("threads", [1, 2])
def test_the_chosen_slice_is_the_fastest_predicted_depth(threads):
    synthesis = synthesize_cpu(DEEP, HW, CLUSTER.role, threads, lowering="winograd", winograd_m=2)
    plan = synthesis.plan
    # 16 tiles at 7x7: the L1 fit (KC 128 for a 10x32 tile in 32 KiB) is deepened to all of C
    assert plan.gemm.kc == 512
    chosen_s = winograd.stages_of_plan(plan, HW, CLUSTER).total_s
    assert chosen_s == pytest.approx(synthesis.estimate.predicted_s)
    for kc in (64, 128, 256):     # every shallower slicing is predicted slower
        shallower = replace(plan, gemm=replace(plan.gemm, kc=kc))
        assert winograd.stages_of_plan(shallower, HW, CLUSTER).total_s > chosen_s
    levels = {lv.level: lv for lv in synthesis.levels}
    assert levels["GEMM L1"].tile.startswith("kc=512:") and "deeper_slices" in levels["GEMM L1"].decided_by
    assert "x512:" in levels["GEMM L2"].tile or "x512" in levels["GEMM L2"].tile
    assert levels["GEMM L3"].tile.startswith(f"nc={plan.gemm.nc}: packed B panel 512x")


def test_a_tile_taller_than_the_gemm_is_cut_to_its_rows():
    # F(4,3) at 7x7: 4 tiles, the rows of the GEMM over channels
    synthesis = synthesize_cpu(DEEP, HW, CLUSTER.role, 1, lowering="winograd", winograd_m=4,
                               winograd_vectors="channels")
    g = synthesis.plan.gemm
    assert g.mr <= 4 and g.mc == g.mr
    sched = replace(g, mr=6, mc=6)
    cut = winograd.rows_within(sched, 4, "avx512", CLUSTER.core)
    assert (cut.mr, cut.mc, cut.nr, cut.kc) == (4, 4, sched.nr, sched.kc)
    assert winograd.rows_within(sched, 40, "avx512", CLUSTER.core) is sched
    levels = {lv.level: lv for lv in synthesis.levels}
    assert levels["GEMM REG"].tile.startswith(f"mr={g.mr} x nr={g.nr}")


def test_neon_plans_keep_the_l1_fit():
    sd = load("snapdragon.yaml")
    synthesis = synthesize_cpu(DEEP, sd, lowering="winograd", winograd_m=2)
    levels = {lv.level: lv for lv in synthesis.levels}
    assert "deeper_slices" not in levels["GEMM L1"].decided_by
