"""A Winograd filter transform U read from memory on every call (synthesize_cpu(weights_from_memory=
True), how `xfc model` plans a network whose weights pass the shared cache; issue 34): the stream
is hidden behind the FMAs only where the GEMMs prefetch the next panel of U, and it shares the
core's misses with the row tiles' reads of U from L2 (one per MC block where a KC x NR panel stays
in L1, one per row tile where it does not). Unit: nothing is built or timed."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from xfc.cpu.cost_model import DEFAULT_CONSTANTS, L1_RESIDENT_FILL
from xfc.cpu.synth import synthesize_cpu
from xfc.cpu.tiles import FLOAT_BYTES
from xfc.cpu.winograd import (gemm_of_plan, packed_floats, stages_of_plan, u_l2_read_bytes, u_prefetch_lines,
                              weights_memory, with_planned_prefetch)
from xfc.ops import winograd as wmath
from xfc.ops.spec import make_spec

from support.calibration import CLUSTER, HW

pytestmark = pytest.mark.unit

# ResNet-18's 14x14 stage: F(4,3) has 16 tiles per GEMM and 36 x 256 x 256 floats of U (9.4 MB)
R18_L3 = make_spec("conv2d", dict(c=256, h=14, w=14, k=256, r=3, s=3), pad=1)
L1_PANEL_BYTES = CLUSTER.core.l1d.size_bytes * L1_RESIDENT_FILL


def _channels_plan(spec, m, threads=1, **gemm):
    """The planner's F(m,3) plan over channels with these GEMM fields, its next-panel prefetch as
    make_plan decides it for them."""
    plan = synthesize_cpu(spec, HW, CLUSTER.role, threads, lowering="winograd", winograd_m=m,
                          winograd_vectors="channels").plan
    return with_planned_prefetch(replace(plan, gemm=replace(plan.gemm, **gemm)))


def _u_bytes(plan):
    return FLOAT_BYTES * packed_floats(plan.spec, plan.winograd_m, plan.winograd_vectors, plan.gemm.mr, plan.gemm.nr)


@pytest.mark.parametrize("mr,nr,mc", [(6, 64, 18), (5, 32, 15), (4, 48, 16), (6, 64, 12), (4, 32, 8)])
def test_u_is_read_from_l2_once_per_block_where_its_panel_stays_in_l1_and_per_row_tile_where_not(mr, nr, mc):
    tiles = math.prod(wmath.tile_counts(R18_L3, 4))
    # the MC blocks of the 16 tiles as the kernel walks them (a short last block), and their row tiles
    blocks = [min(mc, tiles - start) for start in range(0, tiles, mc)]
    row_tiles = sum(math.ceil(rows / mr) for rows in blocks)
    for kc in (32, 64, 128, 256):
        plan = _channels_plan(R18_L3, 4, mr=mr, nr=nr, mc=mc, nc=256, kc=kc)
        resident = kc * nr * FLOAT_BYTES <= L1_PANEL_BYTES
        passes = len(blocks) if resident else row_tiles
        assert u_l2_read_bytes(R18_L3, 4, plan.gemm, CLUSTER, "channels") == _u_bytes(plan) * passes
    # one row tile per block: every block's first tile reads the panel, in L1 or not
    one = _channels_plan(R18_L3, 4, mr=mr, nr=nr, mc=mr, nc=256, kc=256)
    assert u_l2_read_bytes(R18_L3, 4, one.gemm, CLUSTER, "channels") == _u_bytes(one) * math.ceil(tiles / mr)


def test_threads_read_their_share_of_u_or_all_of_it_by_the_split():
    plan = _channels_plan(R18_L3, 4, mr=6, nr=64, mc=18, nc=256, kc=64, threads=2)   # a 16 KB panel: in L1
    assert 64 * 64 * FLOAT_BYTES <= L1_PANEL_BYTES
    over_channels = replace(plan.gemm, threads=2, parallel_axis="n")
    over_tiles = replace(plan.gemm, threads=2, parallel_axis="m", mc=12)   # 16 tiles: 12 rows a thread
    one = replace(plan.gemm, threads=1, parallel_axis="n")
    whole = u_l2_read_bytes(R18_L3, 4, one, CLUSTER, "channels")
    assert whole == _u_bytes(plan)
    assert u_l2_read_bytes(R18_L3, 4, over_channels, CLUSTER, "channels") == whole / 2
    assert u_l2_read_bytes(R18_L3, 4, over_tiles, CLUSTER, "channels") == whole
    # over tiles, U is A: one read of each MR x KC panel per NR panel of a thread's tiles
    tiles_plan = synthesize_cpu(R18_L3, HW, CLUSTER.role, 1, lowering="winograd", winograd_m=4,
                                winograd_vectors="tiles").plan
    g = replace(tiles_plan.gemm, nr=16)
    u = FLOAT_BYTES * packed_floats(R18_L3, 4, "tiles", g.mr, g.nr)
    assert u_l2_read_bytes(R18_L3, 4, g, CLUSTER, "tiles") == u * 1                 # 16 tiles: one panel
    assert u_l2_read_bytes(R18_L3, 4, replace(g, nr=32), CLUSTER, "tiles") == \
        FLOAT_BYTES * packed_floats(R18_L3, 4, "tiles", g.mr, 32)


def _compute_s(plan, gemm):
    """The GEMM stage's on-chip time: (m+2)^2 GEMMs at their slowest on-chip bound."""
    return (plan.winograd_m + 2) ** 2 * max(t for name, t in gemm.seconds_by_bound if name != "DRAM")


def _stream_s(plan, constants=DEFAULT_CONSTANTS):
    """U from memory at the cold stream's rate, and the row tiles' reads of it from L2."""
    _, dram_s = weights_memory(plan.spec, plan.winograd_m, plan.gemm.mr, HW, CLUSTER, plan.gemm.threads, 0,
                               constants, vectors=plan.winograd_vectors, nr=plan.gemm.nr, from_memory=True)
    reads = u_l2_read_bytes(plan.spec, plan.winograd_m, plan.gemm, CLUSTER, plan.winograd_vectors)
    return dram_s, reads / (DEFAULT_CONSTANTS.l2_bytes_per_cycle * CLUSTER.clock_ghz * 1e9)


def test_the_l2_reads_add_to_a_cold_stream_and_a_cached_u_is_not_charged_them():
    resident = _channels_plan(R18_L3, 4, mr=6, nr=64, mc=18, nc=256, kc=64)
    deep = _channels_plan(R18_L3, 4, mr=6, nr=64, mc=18, nc=256, kc=256)
    assert 64 * 64 * FLOAT_BYTES <= L1_PANEL_BYTES < 256 * 64 * FLOAT_BYTES
    assert u_l2_read_bytes(R18_L3, 4, deep.gemm, CLUSTER, "channels") == \
        3 * u_l2_read_bytes(R18_L3, 4, resident.gemm, CLUSTER, "channels")
    # a stream slower than the FMAs (a third of the DRAM figure): the 64 KB panel, read by all
    # three row tiles, now costs more cold than the 16 KB one
    slow = replace(DEFAULT_CONSTANTS, winograd_cold_stream_efficiency=0.3)
    extra = {}
    for plan in (resident, deep):
        gemm = gemm_of_plan(plan, HW, CLUSTER, slow)
        dram_s, l2_s = _stream_s(plan, slow)
        assert dram_s > _compute_s(plan, gemm)
        cold = stages_of_plan(plan, HW, CLUSTER, slow, gemm=gemm, weights_from_memory=True)
        assert cold.gemm_bound == "DRAM" and cold.gemm_s == pytest.approx(dram_s + l2_s, rel=1e-12)
        extra[plan.gemm.kc] = cold.gemm_s - stages_of_plan(plan, HW, CLUSTER, slow, gemm=gemm).gemm_s
    assert extra[256] > extra[64] > 0


def test_a_cold_u_no_panel_prefetch_asks_for_is_waited_for():
    """One row tile per panel: the planner does not prefetch the next panel (decide's
    NEXT_PANEL_PREFETCH_TILES), so the cold stream adds to the FMAs instead of hiding behind them."""
    odd = make_spec("conv2d", dict(c=96, h=17, w=17, k=96, r=3, s=3), pad=1)   # F(6,3): 9 tiles
    one_tile = _channels_plan(odd, 6, mr=9, nr=32, mc=9, nc=96, kc=96)
    two_tiles = _channels_plan(odd, 6, mr=5, nr=32, mc=10, nc=96, kc=96)
    assert u_prefetch_lines(odd, 6, one_tile.gemm, one_tile.isa, "channels") == 0
    assert u_prefetch_lines(odd, 6, two_tiles.gemm, two_tiles.isa, "channels") > 0
    for plan, prefetched in ((one_tile, False), (two_tiles, True)):
        gemm = gemm_of_plan(plan, HW, CLUSTER)
        compute_s, stream_s = _compute_s(plan, gemm), sum(_stream_s(plan))
        cold = stages_of_plan(plan, HW, CLUSTER, gemm=gemm, weights_from_memory=True)
        if prefetched:
            assert cold.gemm_s == pytest.approx(max(compute_s, stream_s), rel=1e-12)
        else:   # the FMAs and the whole stream
            assert cold.gemm_s == pytest.approx(compute_s + stream_s, rel=1e-12)
        # cached, the prefetch changes nothing
        assert stages_of_plan(plan, HW, CLUSTER, gemm=gemm).gemm_s == pytest.approx(compute_s, rel=1e-12)
    # a plan's own prefetch decides it: the two-tile plan with its prefetch taken out is waited for
    bare = replace(two_tiles, gemm=replace(two_tiles.gemm, prefetch_next_panel_lines=0))
    gemm = gemm_of_plan(bare, HW, CLUSTER)
    assert stages_of_plan(bare, HW, CLUSTER, gemm=gemm, weights_from_memory=True).gemm_s == pytest.approx(
        _compute_s(bare, gemm) + sum(_stream_s(bare)), rel=1e-12)


def test_the_busiest_thread_reads_its_whole_panels_of_output_channels():
    """Split over output channels, a thread reads the U of its NR-column panels: 160 channels in 64-wide
    panels are 3 panels, 2 for the busiest of 2 threads."""
    odd = make_spec("conv2d", dict(c=64, h=14, w=14, k=160, r=3, s=3), pad=1)
    plan = _channels_plan(odd, 4, mr=6, nr=64, mc=18, nc=192, kc=64, threads=2)
    split = replace(plan.gemm, threads=2, parallel_axis="n")
    one = replace(plan.gemm, threads=1, parallel_axis="n")
    assert u_l2_read_bytes(odd, 4, split, CLUSTER, "channels") == pytest.approx(
        u_l2_read_bytes(odd, 4, one, CLUSTER, "channels") * 2 / 3, rel=1e-12)


def test_the_cold_terms_apply_where_they_were_measured_and_to_what_a_plan_runs():
    """The cold-U terms are the x86 host's (its GEMMs prefetch U): a NEON plan's cold U is priced as
    before them. A plan whose K loop is the assembly one ignores its prefetch lines: waited for."""
    from xfc.cpu.winograd import COLD_TERMS_DIALECTS, gemm_of_plan, hand_winograd_plan, stage_costs
    assert set(COLD_TERMS_DIALECTS) == {"avx512", "avx2"}
    neon = hand_winograd_plan(R18_L3, 4, isa="neon", vectors="tiles")
    gemm = gemm_of_plan(neon, HW, CLUSTER)
    g = neon.gemm
    assert stages_of_plan(neon, HW, CLUSTER, gemm=gemm, weights_from_memory=True) == stage_costs(
        R18_L3, 4, HW, CLUSTER, g.threads, neon.vector_lanes, g.nr, gemm, mr=g.mr, parallel_axis=g.parallel_axis,
        nc=g.nc, vectors="tiles", mc=g.mc, weights_from_memory=True)
    plan = _channels_plan(R18_L3, 4, mr=6, nr=64, mc=18, nc=256, kc=64)
    assert plan.gemm.prefetch_next_panel_lines > 0 and plan.gemm.ukernel == "intrinsics"
    slow = replace(DEFAULT_CONSTANTS, winograd_cold_stream_efficiency=0.3)
    gemm = gemm_of_plan(plan, HW, CLUSTER, slow)
    asm = replace(plan, gemm=replace(plan.gemm, ukernel="asm_out_of_order"))
    prefetched = stages_of_plan(plan, HW, CLUSTER, slow, gemm=gemm, weights_from_memory=True)
    ignored = stages_of_plan(asm, HW, CLUSTER, slow, gemm=gemm, weights_from_memory=True)
    assert ignored.gemm_s == pytest.approx(_compute_s(plan, gemm) + sum(_stream_s(plan, slow)), rel=1e-12)
    assert prefetched.gemm_s < ignored.gemm_s
