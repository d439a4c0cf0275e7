"""benchmarks/regret.py's Winograd neighbourhood (issue 34): the plans one step from the chosen
Winograd plan in its own plan space, which the benchmark builds and times. Pure: nothing is built."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from xfc.cpu import winograd
from xfc.cpu.codegen import render_cpu_kernel
from xfc.cpu.synth import synthesize_cpu
from xfc.hardware.load import load
from support import BENCHMARKS, host_description, load_benchmark, with_cores

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def regret(monkeypatch_module):
    # regret.py imports its sibling benchmarks/machine.py as `machine`
    monkeypatch_module.setitem(sys.modules, "machine", load_benchmark("machine"))
    monkeypatch_module.setitem(sys.modules, "cpu_share", load_benchmark("cpu_share"))
    return load_benchmark("regret", "xfc_benchmark_regret")


def test_the_cache_state_follows_the_handoff_ratio(regret):
    cpu_share = sys.modules["cpu_share"]
    assert [cpu_share.cache_state(r) for r in (1.02, 3.5, 4.4, 13.4)] == [
        "one core", "shared cache", "shared cache", "separate caches"]


def test_the_verdict_names_the_cache_state_of_full_speed_cores(regret):
    cpu_share = sys.modules["cpu_share"]
    assert cpu_share.verdict(0.99, 0.99, 0.05, 3.5) == "separate cores"
    assert cpu_share.verdict(0.99, 0.99, 0.34, 13.4) == "separate cores, separate caches"
    assert cpu_share.verdict(0.99, 0.99, 0.05, 1.0) == "SMT siblings (share caches)"
    assert cpu_share.verdict(0.51, 0.99, 0.06, 1.0) == "SMT siblings (share FMA units, not latency)"
    assert cpu_share.verdict(0.99, 0.99, 0.05) == "separate cores"


def test_a_timing_out_of_the_shared_cache_state_is_taken_again(regret, monkeypatch):
    """The probes before and after must both say 'shared cache'; a timing with either probe elsewhere
    is repeated, and the attempts are counted."""
    cpu_share = sys.modules["cpu_share"]
    ratios = iter([3.5, 13.2,    # changed during the timing: again
                   13.4, 13.3,   # separate caches: again
                   3.4, 3.5])    # shared cache: kept
    monkeypatch.setattr(cpu_share, "handoff", lambda exe: {"state": cpu_share.cache_state(next(ratios))})
    timings = iter([1.0, 2.0, 3.0])
    result, attempts, in_state = cpu_share.in_state(Path("probe"), lambda: next(timings), pause_s=0)
    assert (result, attempts, in_state) == (3.0, 3, True)
    ratios = iter([13.0] * 4)
    result, attempts, in_state = cpu_share.in_state(Path("probe"), lambda: 7.0, tries=2, pause_s=0)
    assert (result, attempts, in_state) == (7.0, 2, False)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_the_fitting_set_is_the_suite_and_the_winograd_benchmark(regret):
    """FITTING is every 3x3 stride-1 layer the rules were set on: the suite's and
    benchmarks/winograd.py's (read from its source, as tests/test_winograd_calibrate.py does)."""
    text = (BENCHMARKS / "winograd.py").read_text()
    benchmark = {tuple(int(x) for x in row) for row in
                 re.findall(r'"(?:r18|vgg)_\w+": \(dict\(c=(\d+), h=(\d+), w=(\d+), k=(\d+)', text)}
    suite = {(s["c"], s["h"], s["w"], s["k"]) for s in regret.SUITE_3X3.values()}
    fitting = [(s["c"], s["h"], s["w"], s["k"]) for s in regret.FITTING.values()]
    assert len(benchmark) == 12 and len(suite) == 2 and suite <= benchmark
    assert sorted(fitting) == sorted(benchmark)


def test_the_layer_sets_are_disjoint_3x3_layers(regret):
    fitting = {tuple(sorted(s.items())) for s in regret.FITTING.values()}
    held_out = {tuple(sorted(s.items())) for s in regret.HELD_OUT.values()}
    assert len(held_out) == len(regret.HELD_OUT) >= 8 and not fitting & held_out
    for shape in (*regret.FITTING.values(), *regret.HELD_OUT.values()):
        assert winograd.wmath.not_applicable(regret.winograd_spec(shape)) is None


@pytest.mark.parametrize("hw_name", ["host:avx2", "host:avx512", "cortex-a76"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [dict(c=64, h=14, w=14, k=64), dict(c=200, h=9, w=9, k=200)], ids=["c64", "c200"])
def test_neighbours_are_distinct_renderable_and_one_step_away(regret, hw_name, threads, shape):
    hw = host_description(hw_name.split(":")[1]) if hw_name.startswith("host:") else with_cores(load(hw_name), 4)
    spec = regret.winograd_spec(shape)
    chosen = synthesize_cpu(spec, hw, threads=threads, lowering="winograd").plan
    neighbours = regret.winograd_neighbours(chosen, spec, hw, hw.cluster(), threads, None,
                                            regret.DEFAULT_CONSTANTS)
    labels = [label for label, _ in neighbours]
    assert neighbours[0] == ("chosen", chosen) and len(set(labels)) == len(labels)
    keys = [(p.lowering, p.winograd_m, p.winograd_vectors, p.gemm) for _, p in neighbours]
    assert len(set(keys)) == len(keys)
    assert "best direct" in labels and any(label.startswith(("mr", "nr", "kc")) for label in labels)
    g = chosen.gemm
    for label, plan in neighbours:
        if plan.lowering == winograd.LOWERING:
            winograd.validate(plan)
            # the next-panel prefetch the planner would give this schedule, not the chosen plan's
            assert plan.gemm.prefetch_next_panel_lines == winograd.u_prefetch_lines(
                spec, plan.winograd_m, plan.gemm, plan.isa, plan.winograd_vectors)
        assert plan.spec == spec and plan.gemm.threads == threads
        if label.startswith(("mr", "nr", "kc")):      # the register tile and KC only
            n = plan.gemm
            assert (plan.winograd_m, plan.winograd_vectors) == (chosen.winograd_m, chosen.winograd_vectors)
            assert abs(n.mr - g.mr) <= 1 and abs(n.nr - g.nr) <= chosen.vector_lanes
            assert n.kc in {g.kc, max(g.k_unroll, g.kc // 2), min(spec.c, 2 * g.kc), spec.c}
            assert (n.threads, n.parallel_axis, n.a_pack) == (g.threads, g.parallel_axis, g.a_pack)
        render_cpu_kernel(plan)                        # every neighbour is a kernel the renderer accepts


def test_every_plan_is_timed_first_once_in_as_many_rounds(regret):
    orders = [regret.round_order(r, 5) for r in range(5)]
    assert all(sorted(order) == list(range(5)) for order in orders)
    assert sorted(order[0] for order in orders) == list(range(5))


def test_regret_is_how_much_slower_the_chosen_plan_ran_and_never_negative(regret):
    assert regret.regret_of(1.1, 1.0) == pytest.approx(0.1)
    assert regret.regret_of(1.0, 1.1) == 0.0
    assert regret.regret_of(1.0, 1.0) == 0.0


def test_the_summary_keeps_regret_and_noise_per_set_and_thread_count(regret):
    rows = [dict(set="fitting", threads=1, regret=0.10, null_regret=0.02),
            dict(set="fitting", threads=1, regret=0.00, null_regret=0.00),
            dict(set="held-out", threads=2, regret=0.04, null_regret=0.01)]
    summary = regret.summarize(rows)
    assert summary["fitting 1T"] == dict(layers=2, mean=pytest.approx(0.05), max=0.10,
                                         null_mean=pytest.approx(0.01), null_max=0.02)
    assert summary["held-out 2T"]["layers"] == 1 and summary["held-out 2T"]["max"] == 0.04


def test_winograd_variants_reads_tiles_kc_and_prefetch_and_refuses_anything_else(regret, monkeypatch_module):
    """benchmarks/winograd_variants.py: its variants are the planner's plan with another register
    tile, KC and prefetch; the prefetch, unless given, is the planner's for that schedule."""
    monkeypatch_module.setitem(sys.modules, "regret", regret)
    variants = load_benchmark("winograd_variants", "xfc_benchmark_winograd_variants")
    assert variants.parse_variant("6x64:kc=128:pf=0") == dict(mr=6, nr=64, kc=128, pf=0)
    assert variants.parse_variant("9x32") == dict(mr=9, nr=32, kc=None, pf=None)
    for bad in ("6-64", "6x", "x64", "6x64:kc=", "6x64:mc=18", "6x64:pf=-1"):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            variants.parse_variant(bad)
    hw = host_description("avx512")
    spec = regret.winograd_spec(dict(c=256, h=14, w=14, k=256))
    base = synthesize_cpu(spec, hw, threads=1, lowering="winograd", winograd_m=4, winograd_vectors="channels",
                          weights_from_memory=True).plan
    for text in ("6x64:kc=256", "6x64:kc=128", "5x32", "6x64:kc=256:pf=0", "6x64:pf=12"):
        v = variants.parse_variant(text)
        plan = variants.variant_plan(base, hw.cluster(), v)
        g = plan.gemm
        assert (g.mr, g.nr, g.kc) == (v["mr"], v["nr"], v["kc"] or base.gemm.kc)
        planned = winograd.u_prefetch_lines(spec, 4, g, plan.isa, "channels")
        assert g.prefetch_next_panel_lines == (planned if v["pf"] is None else v["pf"])
        render_cpu_kernel(plan)
    # on AVX2 a 6x16 tile's K loop is the assembly one, which ignores the prefetch: pf= is refused there
    avx2 = host_description("avx2")
    base2 = synthesize_cpu(spec, avx2, threads=1, lowering="winograd", winograd_m=4, winograd_vectors="channels",
                           weights_from_memory=True).plan
    asm = variants.variant_plan(base2, avx2.cluster(), variants.parse_variant("6x16"))
    assert asm.gemm.ukernel != "intrinsics" and asm.gemm.prefetch_next_panel_lines == 0
    with pytest.raises(ValueError, match="does not prefetch"):
        variants.variant_plan(base2, avx2.cluster(), variants.parse_variant("6x16:pf=4"))


def test_given_layers_for_the_winograd_part_are_3x3_convolutions(regret):
    layers = regret.winograd_layers_from(["conv2d:c=16,h=14,w=14,k=40,r=3,s=3"])
    assert layers == {"conv2d:c=16,h=14,w=14,k=40,r=3,s=3": dict(c=16, h=14, w=14, k=40)}
    spec = regret.winograd_spec(next(iter(layers.values())))
    assert winograd.wmath.not_applicable(spec) is None
    with pytest.raises(regret.OperatorError, match="3x3 convolutions"):
        regret.winograd_layers_from(["conv2d:c=16,h=14,w=14,k=40,r=1,s=1"])
    with pytest.raises(regret.OperatorError, match="3x3 convolutions"):
        regret.winograd_layers_from(["matmul:m=8,n=8,k=8"])
