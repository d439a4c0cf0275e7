"""A Winograd GEMM stage's register tile one vector narrower where the stage model prices the two alike
(winograd.narrower_on_tie, issue 34): the AVX-512 host ran the narrower faster in most rows where the
model tied them (benchmarks/results/regret_neighbours_nr16_zen4_s65.json)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from support import recorded_host
from xfc.cpu import winograd
from xfc.cpu.ir import GemmSchedule
from xfc.cpu.synth import synthesize_cpu
from xfc.hardware.load import load
from xfc.ops.spec import make_spec

HOST = recorded_host("avx512", cpus=2)
CORE = HOST.cluster().core
WIDE = GemmSchedule(mr=14, nr=32, k_unroll=4, kc=128, mc=84, nc=256, threads=1, parallel_axis="n")


def _narrow(sched=WIDE, narrower_s=1.0, wide_s=1.0, isa="avx512", columns=256):
    return winograd.narrower_on_tie(sched, wide_s, lambda trial: narrower_s if trial.nr < sched.nr else wide_s,
                                    isa, CORE, "channels", columns)


@pytest.mark.unit
def test_a_tie_takes_the_narrower_tile_and_nothing_else_does():
    sched, key, narrowed = _narrow()
    assert narrowed and (sched.mr, sched.nr, sched.kc) == (14, 16, 128) and key == 1.0
    assert sched.nc == 128 and sched.mc == WIDE.mc          # the blocks keep their number of register tiles
    assert _narrow(narrower_s=0.9)[2]                           # predicted faster: taken as well
    assert not _narrow(narrower_s=1.01)[2]                      # predicted slower: the wider stays
    assert not _narrow(isa="avx2")[2]                           # measured on AVX-512 only
    assert not _narrow(sched=replace(WIDE, nr=16, nc=128))[2]   # one vector: nothing narrower
    assert not _narrow(sched=replace(WIDE, kc=16))[2]           # a shallow slice: not where it was measured
    assert _narrow(sched=replace(WIDE, kc=winograd.NARROWER_ON_TIE_MIN_KC))[2]
    # a narrower tile that leaves a ragged column tail where the wider left none: kept wide
    assert not _narrow(sched=replace(WIDE, nr=48, nc=48), columns=144)[2]
    assert _narrow(sched=replace(WIDE, nr=48, nc=48), columns=100)[2]       # both ragged: the tie decides
    assert _narrow(sched=replace(WIDE, nr=48, nc=48), columns=96)[2]        # neither ragged


@pytest.mark.unit
def test_the_synthesizer_narrows_a_tied_stage_and_says_why():
    """incep_35 of benchmarks/regret.py (64 -> 96 channels at 35x35) at 2 threads on the recorded
    AVX-512 host: F(6,3) over channels, 9x48 priced as 9x32; the plan is 9x32 and the explanation
    names the rule."""
    spec = make_spec("conv2d", dict(c=64, h=35, w=35, k=96, r=3, s=3), pad=1)
    cluster = HOST.cluster()
    result = synthesize_cpu(spec, HOST, cluster.role, 2)
    plan, g = result.plan, result.plan.gemm
    assert (plan.lowering, plan.winograd_m, plan.winograd_vectors, g.mr, g.nr) == ("winograd", 6, "channels", 9, 32)
    wide = winograd.with_register_tile(g, g.mr, 48, g.kc, "avx512", CORE, "channels")
    narrow_s = winograd.stages_of_plan(plan, HOST, cluster).total_s
    wide_s = winograd.plan_stages(spec, 6, HOST, cluster, wide, 16, "avx512", vectors="channels").total_s
    assert narrow_s <= wide_s * (1 + winograd.TIE_TOLERANCE)
    reg = next(level for level in result.levels if level.level == "GEMM REG")
    assert "narrowed from 48 columns" in reg.tile and "narrower_on_tie" in reg.decided_by


@pytest.mark.unit
def test_phone_plans_keep_the_wider_tile():
    hw = load("snapdragon-865")
    spec = make_spec("conv2d", dict(c=128, h=52, w=52, k=256, r=3, s=3), pad=1)
    cluster = hw.cluster("big")
    plan = synthesize_cpu(spec, hw, "big", 1, lowering="winograd", winograd_m=4).plan
    narrowed = winograd.with_register_tile(plan.gemm, plan.gemm.mr, plan.gemm.nr - plan.vector_lanes, plan.gemm.kc,
                                           plan.isa, cluster.core, plan.winograd_vectors)
    assert plan.isa not in winograd.NARROWER_ON_TIE_ISAS
    reg = next(level for level in synthesize_cpu(spec, hw, "big", 1, lowering="winograd", winograd_m=4).levels
               if level.level == "GEMM REG")
    assert "narrower_on_tie" not in reg.decided_by and (narrowed is None or narrowed.nr < plan.gemm.nr)


@pytest.mark.unit
def test_the_chosen_tile_is_narrowed_until_the_model_no_longer_ties():
    """A chosen AVX-512 Winograd plan admits no further narrowing: one vector at a time while tied."""
    from xfc.cpu.winograd import gemm_problem, narrower_on_tie, plan_stages, split_penalty
    cluster = HOST.cluster()
    # 32 channels at 26x26 on 2 threads: 64 columns narrowed twice, to 32
    for shape in (dict(c=64, h=35, w=35, k=96), dict(c=32, h=26, w=26, k=32), dict(c=32, h=56, w=56, k=64)):
        spec = make_spec("conv2d", dict(shape, r=3, s=3), pad=1)
        for threads in (1, 2):
            plan = synthesize_cpu(spec, HOST, cluster.role, threads).plan
            if plan.lowering != "winograd":
                continue
            m, vectors, lanes = plan.winograd_m, plan.winograd_vectors, plan.vector_lanes

            def price(sched):
                return plan_stages(spec, m, HOST, cluster, sched, lanes, plan.isa, vectors=vectors).total_s \
                    * split_penalty(sched, vectors)
            _, _, narrowed = narrower_on_tie(plan.gemm, price(plan.gemm), price, plan.isa, CORE, vectors,
                                             gemm_problem(spec, m, vectors).n)
            assert not narrowed, (shape, threads, plan.gemm)
