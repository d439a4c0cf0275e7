"""The Winograd cost follows the kernel's thread split (templates/cpu/winograd.c.j2): split over
tiles ('n'), each thread transforms its own whole panels of tiles and its tiles stay in its caches;
split over K ('m'), the transforms split channels and K evenly but the transformed tiles cross
cores through the shared cache. Unit: nothing is built or timed."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from xfc.cpu.synth import synthesize_cpu
from xfc.cpu.winograd import plan_stages, transform_cycles
from xfc.ops import winograd as wmath
from xfc.ops.spec import make_spec

from support.calibration import CLUSTER, HW

pytestmark = pytest.mark.unit

# 32 channels at 28x28, m = 4: 49 tiles, two 32-column panels dealt 1 + 1 (32 and 17 tiles); a
# thread's V and M (36 x 64 x 32 floats, 295 kB) fit its L2 share
SPEC = make_spec("conv2d", dict(c=32, h=28, w=28, k=32, r=3, s=3), pad=1)


def _stages(axis, threads, nr=32):
    """The synthesized plan's stages with `nr`-column panels in one 64-column block (the plan's own
    tile may be narrower: winograd.narrower_on_tie)."""
    plan = synthesize_cpu(SPEC, HW, CLUSTER.role, threads, lowering="winograd", winograd_m=4,
                          winograd_vectors="tiles").plan
    sched = replace(plan.gemm, parallel_axis=axis, nr=nr, nc=max(nr, 64), threads=threads)
    return plan_stages(SPEC, 4, HW, CLUSTER, sched, plan.vector_lanes, plan.isa)


def test_the_tile_split_charges_the_busiest_threads_panels():
    one = _stages("n", 1)
    two = _stages("n", 2)
    th, tw = wmath.tile_counts(SPEC, 4)
    tiles = th * tw
    busiest = min(tiles, math.ceil(math.ceil(tiles / 32) / 2) * 32) / tiles
    assert busiest == pytest.approx(32 / 49)
    lanes = synthesize_cpu(SPEC, HW, CLUSTER.role, 1).plan.vector_lanes
    # two ranges of tiles: the second stages its first tile row and halo again
    cycles_in, cycles_out = transform_cycles(SPEC, 4, CLUSTER.core, lanes, blocks=2)
    clock_hz = CLUSTER.clock_ghz * 1e9
    assert two.input_s == pytest.approx(cycles_in * busiest / clock_hz)
    assert two.output_s == pytest.approx(cycles_out * busiest / clock_hz)
    assert transform_cycles(SPEC, 4, CLUSTER.core, lanes)[0] == pytest.approx(one.input_s * clock_hz)
    # one panel only: the second thread has nothing to do, the first does all of it
    assert _stages("n", 2, nr=64).input_s == pytest.approx(_stages("n", 1, nr=64).input_s)


def test_the_k_split_halves_the_transforms_but_its_tiles_cross_cores():
    lanes = synthesize_cpu(SPEC, HW, CLUSTER.role, 1).plan.vector_lanes
    cycles_in, _ = transform_cycles(SPEC, 4, CLUSTER.core, lanes)
    k_split, tile_split = _stages("m", 2), _stages("n", 2)
    assert k_split.input_s == pytest.approx(cycles_in / (CLUSTER.clock_ghz * 1e9) / 2)
    assert tile_split.traffic_level == "L2"
    assert k_split.traffic_level != "L2"
    assert k_split.traffic_s > tile_split.traffic_s
    # on one thread the axis changes nothing
    assert _stages("m", 1).total_s == pytest.approx(_stages("n", 1).total_s)


def test_tile_blocks_cost_halo_rows_and_keep_each_block_in_l2():
    """A share run as several NC-tile blocks restages each block's halo (more input-transform
    cycles) and holds only a block's V and M."""
    big = make_spec("conv2d", dict(c=32, h=56, w=56, k=32, r=3, s=3), pad=1)   # 196 tiles at m=4
    plan = synthesize_cpu(big, HW, CLUSTER.role, 1, lowering="winograd", winograd_m=4,
                          winograd_vectors="tiles").plan
    whole = replace(plan.gemm, parallel_axis="n", nc=10_000)
    blocked = replace(whole, nc=whole.nr)
    s_whole = plan_stages(big, 4, HW, CLUSTER, whole, plan.vector_lanes, plan.isa)
    s_blocked = plan_stages(big, 4, HW, CLUSTER, blocked, plan.vector_lanes, plan.isa)
    assert s_blocked.input_s > s_whole.input_s
    assert s_blocked.output_s == pytest.approx(s_whole.output_s)
    assert s_whole.traffic_level != "L2" and s_blocked.traffic_level == "L2"


def test_exposed_traffic_adds_its_share_of_the_shorter_part():
    """winograd_traffic_exposed = 0: transforms and tile traffic overlap (the longer counts);
    1: they add up; in between, that share of the shorter shows."""
    plan = synthesize_cpu(SPEC, HW, CLUSTER.role, 1, lowering="winograd", winograd_m=4,
                          winograd_vectors="tiles").plan
    from xfc.cpu.cost_model import DEFAULT_CONSTANTS
    stages = [plan_stages(SPEC, 4, HW, CLUSTER, plan.gemm, plan.vector_lanes, plan.isa,
                          replace(DEFAULT_CONSTANTS, winograd_traffic_exposed=share)) for share in (0.0, 0.5, 1.0)]
    transforms = stages[0].input_s + stages[0].output_s
    shorter, longer = sorted((transforms, stages[0].traffic_s))
    assert shorter > 0
    for share, s in zip((0.0, 0.5, 1.0), stages):
        assert s.total_s == pytest.approx(longer + share * shorter + s.gemm_s)
