"""The GEMM cost model on a 16-register, 256-bit core (issue 17): issue interference, operands
streamed from L2, column-tail tiles and per-thread packing, and the plans they lead to."""
from __future__ import annotations

import dataclasses

import pytest

import support
from xfc.cpu.cost_model import StaticEvaluator, gemm_estimate, l2_stream_factor, share_imbalance
from xfc.cpu.synth import synthesize_cpu
from xfc.cpu.tiles import MicroTile
from xfc.ops.spec import gemm_view
from xfc.ops.workloads import SUITE
from xfc.ops.spec import make_spec

pytestmark = pytest.mark.unit


def _avx2():
    hw = support.recorded_host("avx2")
    return hw, hw.cluster()


def _score(cluster, mr, nr_vectors):
    return StaticEvaluator().evaluate(MicroTile(mr=mr, nr_vectors=nr_vectors, lanes=8, a_load_bits=32),
                                      cluster.core, "avx2")


def _suite(name):
    op, shape, kw = SUITE[name]
    return make_spec(op, shape, **kw)


def test_tiles_at_the_latency_or_load_bound_score_below_a_balanced_tile():
    _, cluster = _avx2()
    core = cluster.core
    balanced = _score(cluster, 4, 3)                     # 12 accumulators, 7 loads per 12 FMAs
    at_latency = _score(cluster, 4, 2)                   # 8 accumulators = latency x pipes
    load_heavy = _score(cluster, 14, 1)                  # 15 loads per 14 FMAs
    assert 4 * 2 == core.fma_latency_cycles * core.fma_per_cycle
    assert at_latency.efficiency < balanced.efficiency - 0.08
    assert load_heavy.efficiency < balanced.efficiency - 0.08
    # a bound far under the largest one costs little: a wide AVX-512-like tile stays near peak
    assert 0.97 < StaticEvaluator().evaluate(MicroTile(14, 2, 16, 32), support.recorded_host("avx512").cluster().core,
                                             "avx512").efficiency <= 1.0


def test_a_b_micro_panel_streamed_from_l2_slows_a_narrow_tile_only():
    hw, cluster = _avx2()
    spec = _suite("conv_r18_l3")
    deep = synthesize_cpu(spec, hw, threads=1).plan.gemm
    # the 2x32 transposed tile with the whole K (2304) as one slice: B streams from L2 at ~the L2 rate
    narrow = dataclasses.replace(deep, mr=2, nr=32, kc=2304)
    wide_resident = dataclasses.replace(deep, mr=4, nr=24, kc=192)
    assert l2_stream_factor(cluster.core, MicroTile(2, 4, 8, 32), _score(cluster, 2, 4), narrow) > 1.08
    assert l2_stream_factor(cluster.core, MicroTile(4, 3, 8, 32), _score(cluster, 4, 3), wide_resident) < 1.002


@pytest.mark.parametrize("name", ["conv_r18_l3", "conv_s2", "conv_r18_l1", "conv_r18_c1", "mm_512"])
def test_avx2_plans_keep_enough_accumulators_and_no_l2_bound_micro_kernel(name):
    hw, cluster = _avx2()
    for threads in (1, 2):
        syn = synthesize_cpu(_suite(name), hw, threads=threads)
        g = syn.plan.gemm
        tile = MicroTile(g.mr, g.nr // 8, 8, 32)
        assert tile.registers("avx2") <= cluster.core.vector_registers
        assert tile.accumulator_registers > cluster.core.fma_latency_cycles * cluster.core.fma_per_cycle
        assert l2_stream_factor(cluster.core, tile, _score(cluster, g.mr, g.nr // 8), g) < 1.05


def test_a_slow_column_tail_costs_its_share_of_the_columns():
    hw, cluster = _avx2()
    spec = _suite("conv_r18_l1")                                # transposed: N = 64 channels
    syn = synthesize_cpu(spec, hw, threads=1)
    g = syn.plan.gemm
    transposed = syn.plan.lowering == "implicit_gemm_t"
    n = gemm_view(spec, transposed).n
    tile = MicroTile(g.mr, g.nr // 8, 8, 32)
    score = _score(cluster, g.mr, g.nr // 8)
    plain = gemm_estimate(spec, hw, cluster, tile, score, g, transposed)
    slow_tail = dataclasses.replace(score, efficiency=score.efficiency / 2)
    with_tail = gemm_estimate(spec, hw, cluster, tile, score, g, transposed, tail_score=slow_tail)
    if n % g.nr:
        assert with_tail.predicted_s > plain.predicted_s
    else:
        assert with_tail.predicted_s == plain.predicted_s


def test_the_operand_packed_across_the_split_is_charged_to_every_thread():
    hw, cluster = _avx2()
    spec = _suite("conv_s2")
    base = synthesize_cpu(spec, hw, threads=2).plan.gemm
    # plain orientation: B (the im2col panel) is packed on every call
    g = dataclasses.replace(base, mr=4, nr=24, kc=288, mc=256, nc=216, a_pack="direct", c_store="direct",
                            stage_copy="strided", threads=2)
    tile, score = MicroTile(4, 3, 8, 32), _score(cluster, 4, 3)
    by_axis = {axis: dict(gemm_estimate(spec, hw, cluster, tile, score, dataclasses.replace(g, parallel_axis=axis),
                                        False).seconds_by_bound)["compute"] for axis in ("m", "n")}
    m, n, k = gemm_view(spec, False)
    im2col_s = k * n / 2 / (cluster.clock_ghz * 1e9)            # lanes x 0.25 elements per cycle
    # 64 row tiles split evenly; the columns as the kernel deals its NR panels (the last one short)
    imbalance = {"m": share_imbalance(m, 4, 2), "n": share_imbalance(n, 24, 2, 8)}
    assert imbalance["m"] == 1.0
    # split m: both threads pack all of B; split n: each packs half (imbalance aside)
    assert by_axis["m"] - by_axis["n"] / imbalance["n"] == pytest.approx(im2col_s / 2, rel=0.35)


def test_a_pointwise_image_read_in_place_streams_a_line_per_k_step():
    from xfc.cpu.cost_model import strided_a_bytes_per_k
    spec = make_spec("conv2d", dict(c=320, h=7, w=7, k=1280, r=1, s=1), bias=True)
    plan = synthesize_cpu(spec, *_avx2()[:1], threads=1).plan.gemm
    in_place = dataclasses.replace(plan, mr=6, a_pack="im2col_direct")
    # a 196-byte plane: a 64-byte line per k step, plus 5 floats' chance of a second one
    assert strided_a_bytes_per_k(spec, in_place, True, 4, 64) == pytest.approx(64 + 5 * 4)
    assert strided_a_bytes_per_k(spec, dataclasses.replace(in_place, a_pack="packed"), True, 4, 64) is None
    assert strided_a_bytes_per_k(spec, in_place, False, 4, 64) is None          # not transposed
    three = make_spec("conv2d", dict(c=320, h=7, w=7, k=1280, r=3, s=3, pad=1))
    assert strided_a_bytes_per_k(three, in_place, True, 4, 64) is None           # not pointwise
    tiny = make_spec("conv2d", dict(c=320, h=2, w=2, k=64, r=1, s=1))
    assert strided_a_bytes_per_k(tiny, dataclasses.replace(in_place, mr=4), True, 4, 64) == 16   # planes < a line


@pytest.mark.parametrize("c,hw,k,a_pack", [
    (320, 7, 1280, "packed"),      # 80 column panels re-read the image: one transpose pays (1.32x)
    (2048, 7, 512, "packed"),      # ResNet-50's last projection (1.64x)
    (96, 56, 24, "im2col_direct"), # one column panel: the transpose would be pure cost (in place 1.29x)
    (384, 14, 64, "im2col_direct"),
])
def test_a_wide_pointwise_conv_packs_its_image_a_narrow_one_reads_it_in_place(c, hw, k, a_pack):
    """benchmarks/results/pointwise_a.json (Zen 3, AVX2): the measured winner of each layer."""
    host, _ = _avx2()
    spec = make_spec("conv2d", dict(c=c, h=hw, w=hw, k=k, r=1, s=1), bias=True)
    plan = synthesize_cpu(spec, host, threads=1).plan
    assert plan.lowering == "implicit_gemm_t"
    assert plan.gemm.a_pack == a_pack


def test_the_avx512_row_keeps_a_pointwise_image_in_place():
    """Unmeasured there: the rows without the interference model never pack it."""
    hw = support.recorded_host("avx512")
    for c, hw_px, k in [(320, 7, 1280), (2048, 7, 512)]:
        plan = synthesize_cpu(make_spec("conv2d", dict(c=c, h=hw_px, w=hw_px, k=k, r=1, s=1), bias=True),
                              hw, threads=1).plan
        assert plan.gemm.a_pack != "packed" or plan.lowering != "implicit_gemm_t"
