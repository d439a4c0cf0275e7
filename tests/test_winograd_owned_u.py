"""A Winograd plan split over tiles (each thread owns its tiles through all three stages) reads all of
U per thread, and again per block of tiles when U does not stay in the core's L2 share; a measured
L3 read rate (the host probe's shared_cache_read_gbps) prices those reads. Found on an Intel Xeon VM
whose mesh L3 feeds a core 25-30 GB/s (session 61). Unit: nothing is built or timed."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from xfc.cpu.cost_model import L2_FILL, l2_per_core_bytes
from xfc.cpu.synth import synthesize_cpu
from xfc.cpu.tiles import FLOAT_BYTES
from xfc.cpu.winograd import packed_floats, stages_of_plan, tile_split, u_owned_extra_bytes
from xfc.ops import winograd as wmath
from xfc.ops.spec import make_spec

from support.calibration import CLUSTER, HW

pytestmark = pytest.mark.unit

# VGG's 256 -> 512 channels at 14x14: F(4,3) has 16 tiles and 36 x 512 x 256 floats of U (19 MB)
VGG_7 = make_spec("conv2d", dict(c=256, h=14, w=14, k=512, r=3, s=3), pad=1)
# a small layer whose U (F(4,3): 36 x 32 x 32 floats, 147 KB) stays in any L2 share
SMALL = make_spec("conv2d", dict(c=32, h=28, w=28, k=32, r=3, s=3), pad=1)


def _owned_plan(spec, m, threads, mc, hw=HW):
    plan = synthesize_cpu(spec, hw, hw.cluster().role, threads, lowering="winograd", winograd_m=m,
                          winograd_vectors="channels").plan
    gemm = replace(plan.gemm, parallel_axis="m", mc=mc)
    assert tile_split("channels", gemm.parallel_axis)
    return replace(plan, gemm=gemm)


def _u_bytes(plan):
    return FLOAT_BYTES * packed_floats(plan.spec, plan.winograd_m, "channels", plan.gemm.mr, plan.gemm.nr)


def test_each_block_and_each_thread_reads_all_of_u_beyond_the_gemm_estimates_share():
    plan = _owned_plan(VGG_7, 4, 1, 9)
    u_bytes, mr, nr = _u_bytes(plan), plan.gemm.mr, plan.gemm.nr
    assert u_bytes > l2_per_core_bytes(CLUSTER) * L2_FILL
    tiles = math.prod(wmath.tile_counts(VGG_7, 4))
    for threads, share, block, blocks in ((1, tiles, tiles, 1), (1, tiles, 9, 2), (1, tiles, 4, 4), (2, 8, 8, 1),
                                          (2, 8, 4, 2)):
        extra = u_owned_extra_bytes(VGG_7, 4, mr, nr, "channels", CLUSTER, threads, share, block)
        # the part of U past the L2 share, once per block, less the share the GEMM estimate charges
        past_l2 = u_bytes - l2_per_core_bytes(CLUSTER) * L2_FILL
        assert extra == pytest.approx(max(0.0, blocks * past_l2 - u_bytes / threads))
        assert (extra > 0) == (blocks > 1 or threads > 1)
    # vectors over tiles: U is the GEMM's A, which the estimate already reads once per NC block
    u_tiles = FLOAT_BYTES * packed_floats(VGG_7, 4, "tiles", mr, nr)
    past_tiles = u_tiles - l2_per_core_bytes(CLUSTER) * L2_FILL
    # four blocks of 4 tiles, the estimate's two NC blocks: two more reads of the part past L2
    assert u_owned_extra_bytes(VGG_7, 4, mr, nr, "tiles", CLUSTER, 1, tiles, 4, 2) == pytest.approx(
        4 * past_tiles - 2 * u_tiles)
    # a U that stays in L2 between calls costs nothing here (the GEMM estimate's L2 reads price it)
    small = _owned_plan(SMALL, 4, 1, 9)
    assert _u_bytes(small) <= l2_per_core_bytes(CLUSTER) * L2_FILL
    assert u_owned_extra_bytes(SMALL, 4, small.gemm.mr, small.gemm.nr, "channels", CLUSTER, 2, 20, 4) == 0.0


def test_the_more_blocks_the_more_reads_of_u_and_never_a_lower_price():
    slow = replace(HW, shared_cache_read_gbps=10.0)
    plans = [_owned_plan(VGG_7, 4, 1, mc, slow) for mc in (18, 9)]
    mr = plans[0].gemm.mr
    prices = [stages_of_plan(plan, slow, slow.cluster()).gemm_s for plan in plans]
    assert prices[0] <= prices[1]
    # one row tile per block: every block reads U again (the part past the L2 share; the stage's L3
    # term adds the tiles' own traffic), at the measured rate
    per_tile = _owned_plan(VGG_7, 4, 1, mr, slow)
    blocks = math.ceil(math.prod(wmath.tile_counts(VGG_7, 4)) / mr)
    assert blocks >= 2
    assert stages_of_plan(per_tile, slow, slow.cluster()).gemm_s >= blocks * _u_bytes(per_tile) / 10e9 > prices[0]


def test_a_measured_l3_read_slower_than_the_port_raises_the_owned_split_price():
    slow = replace(HW, shared_cache_read_gbps=10.0)
    fast = replace(HW, shared_cache_read_gbps=400.0)        # faster than the assumed port: ignored
    plan = _owned_plan(VGG_7, 4, 2, 16)
    base = stages_of_plan(plan, HW, CLUSTER).gemm_s
    assert stages_of_plan(plan, fast, fast.cluster()).gemm_s == base
    # each of two threads reads all 19 MB of U at 10 GB/s: at least 1.9 ms of GEMM stage, where the
    # assumed port (16 bytes per cycle) hides it behind the FMAs
    assert stages_of_plan(plan, slow, slow.cluster()).gemm_s >= _u_bytes(plan) / 10e9 > base


def test_a_1x1_image_larger_than_the_l2_read_in_place_waits_for_its_lines():
    """cost_model.strided_a_wait_s: a 1x1 conv lowered transposed that reads its image in place a
    plane apart waits for a line per k step per row tile and column panel, from the shared cache,
    once the image is larger than the core's L2 (x86 rows without the interference terms)."""
    from xfc.cpu.cost_model import strided_a_bytes_per_k, strided_a_wait_s
    slow = replace(HW, shared_cache_read_gbps=25.0)
    big = make_spec("conv2d", dict(c=256, h=56, w=56, k=64, r=1, s=1), bias=True)      # 3.2 MB image
    small = make_spec("conv2d", dict(c=64, h=14, w=14, k=64, r=1, s=1), bias=True)     # 50 KB image
    plan = synthesize_cpu(big, slow, slow.cluster().role, 1, lowering="direct").plan
    in_place = replace(plan.gemm, mr=14, nr=32, a_pack="im2col_direct", parallel_axis="n")
    line = strided_a_bytes_per_k(big, in_place, True, FLOAT_BYTES, CLUSTER.core.l1d.line_bytes)
    wait = strided_a_wait_s(big, slow, slow.cluster(), in_place, line, 1)
    rows, panels = math.ceil(56 * 56 / 14), math.ceil(64 / 32)
    assert wait == pytest.approx(rows * panels * 256 * line / 25e9)
    assert strided_a_wait_s(big, slow, slow.cluster(), replace(in_place, nr=16), line, 1) == pytest.approx(wait * 2)
    # one column panel whose B micro-panel stays in L1 beside the row tile's A lines reads the image
    # once, each channel's row in order, as packing it would: no wait (session 63: 16 output channels
    # in place ran 15-25% faster than packed B, where this charged 50%) ...
    narrow = make_spec("conv2d", dict(c=32, h=112, w=112, k=16, r=1, s=1), bias=True)    # 1.6 MB image
    one_panel = replace(in_place, kc=32)
    narrow_line = strided_a_bytes_per_k(narrow, one_panel, True, FLOAT_BYTES, CLUSTER.core.l1d.line_bytes)
    assert strided_a_wait_s(narrow, slow, slow.cluster(), one_panel, narrow_line, 1) == 0.0
    assert strided_a_wait_s(narrow, slow, slow.cluster(), replace(one_panel, nr=16), narrow_line, 1) == 0.0
    # ... not two panels split one per thread (not measured: the wait stays) ...
    assert strided_a_wait_s(big, slow, slow.cluster(), replace(in_place, kc=32), line, 2) > 0
    # ... and one 64-wide panel of 256 channels (a 32 KB micro-panel at KC 128) does not stay: the wait stays
    assert strided_a_wait_s(big, slow, slow.cluster(), replace(in_place, nr=64), line, 1) == pytest.approx(wait / 2)
    assert strided_a_wait_s(small, slow, slow.cluster(), in_place, line, 1) == 0.0
    # the image of one call, not of the batch: the kernel takes the images one at a time
    batch = make_spec("conv2d", dict(n=8, c=64, h=14, w=14, k=64, r=1, s=1), bias=True)
    assert strided_a_wait_s(batch, slow, slow.cluster(), in_place, line, 1) == 0.0
    # a strided 1x1 conv reads its staged image the same way: a staged plane apart
    strided = make_spec("conv2d", dict(c=256, h=56, w=56, k=512, r=1, s=1), stride=2, bias=True)
    assert strided_a_bytes_per_k(strided, in_place, True, FLOAT_BYTES, 64) == pytest.approx(line)
    assert strided_a_wait_s(strided, slow, slow.cluster(), in_place, line, 1) > 0
    # the planner no longer reads that image in place on an AVX-512 host
    assert not (plan.lowering == "implicit_gemm_t" and plan.gemm.a_pack == "im2col_direct")
