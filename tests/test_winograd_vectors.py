"""The two vector axes of a Winograd plan (xfc/cpu/winograd.py VECTOR_AXES): over tiles the
transforms fill LANES tiles of one tile row, so a row of fewer tiles leaves lanes idle; over
channels they fill LANES channels of one tile whatever the map's size. The synthesizer weighs both
(on x86) and records the one it took; the plan round-trips through the plan cache; bad plans are
refused in one line. Unit: nothing is built or timed (tests/test_winograd_host.py runs both)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from xfc.cpu.codegen import render_cpu_kernel
from xfc.cpu.synth import synthesize_cpu
from xfc.cpu.winograd import (gemm_problem, hand_winograd_plan, packed_floats, tile_split, transform_cycles,
                              vector_axes)
from xfc.errors import OperatorError
from xfc.hardware.load import load
from xfc.ops import winograd as wmath
from xfc.ops.spec import make_spec
from xfc.tiledb.plancache import synthesis_payload, synthesis_from_payload

from support.calibration import CLUSTER, HW

pytestmark = pytest.mark.unit

SMALL = make_spec("conv2d", dict(c=256, h=7, w=7, k=256, r=3, s=3), pad=1)    # m=2: 4x4 tiles
WIDE = make_spec("conv2d", dict(c=64, h=64, w=64, k=64, r=3, s=3), pad=1)     # m=2: 32 tiles per row


def test_over_channels_the_gemm_rows_are_tiles_and_its_columns_output_channels():
    over_tiles, over_channels = gemm_problem(SMALL, 2, "tiles"), gemm_problem(SMALL, 2, "channels")
    assert (over_tiles.m, over_tiles.n, over_tiles.k) == (256, 16, 256)
    assert (over_channels.m, over_channels.n, over_channels.k) == (16, 256, 256)
    assert tile_split("tiles", "n") and tile_split("channels", "m")
    assert not tile_split("tiles", "m") and not tile_split("channels", "n")
    # U padded to the register tile's rows (K = MR rows over tiles) or columns (NR over channels)
    assert packed_floats(SMALL, 2, "tiles", 14, 32) == 16 * 266 * 256
    assert packed_floats(SMALL, 2, "channels", 14, 48) == 16 * 288 * 256


def test_transform_groups_over_tiles_idle_lanes_on_a_small_map_and_not_over_channels():
    core, lanes = CLUSTER.core, 16
    tiles_in, tiles_out = transform_cycles(SMALL, 2, core, lanes, vectors="tiles")
    chans_in, chans_out = transform_cycles(SMALL, 2, core, lanes, vectors="channels")
    # 4 tiles per row fill 4 of 16 lanes: four vector groups per channel where one does over channels
    assert tiles_out > 2 * chans_out and tiles_in > chans_in
    # with 32 tiles per row every lane is used either way: the vector groups cost the same
    wide_tiles = transform_cycles(WIDE, 2, core, lanes, vectors="tiles")
    wide_chans = transform_cycles(WIDE, 2, core, lanes, vectors="channels")
    assert wide_chans[1] == pytest.approx(wide_tiles[1], rel=0.05)


def test_the_synthesizer_takes_channels_on_a_small_map_and_records_it():
    result = synthesize_cpu(SMALL, HW, CLUSTER.role, 1, lowering="winograd", winograd_m=2)
    plan = result.plan
    assert plan.winograd_vectors == "channels" and plan.gemm.a_pack == "direct"
    forced = synthesize_cpu(SMALL, HW, CLUSTER.role, 1, lowering="winograd", winograd_m=2, winograd_vectors="tiles")
    assert forced.plan.winograd_vectors == "tiles" and forced.plan.gemm.a_pack == "packed"
    assert result.estimate.predicted_s < forced.estimate.predicted_s
    assert "vectors over channels" in "\n".join(plan.header_lines)
    source = render_cpu_kernel(plan).source
    assert "template cpu/winograd_cv.c.j2" in source and "#define XFC_KV 256" in source


def test_neon_plans_keep_vectors_over_tiles():
    assert vector_axes("neon") == ("tiles",) and "channels" in vector_axes("avx512")
    plan = synthesize_cpu(SMALL, load("cortex-a76"), threads=1, lowering="winograd", winograd_m=2).plan
    assert plan.winograd_vectors == "tiles"
    # forced, they take the intrinsics micro-kernels (the inline-assembly ones read packed A)
    forced = synthesize_cpu(SMALL, load("cortex-a55"), threads=1, lowering="winograd", winograd_m=2,
                            winograd_vectors="channels").plan
    assert forced.winograd_vectors == "channels" and forced.gemm.ukernel == "intrinsics"
    assert "winograd_cv.c.j2" in render_cpu_kernel(forced).source


def test_a_channels_plan_round_trips_through_the_plan_cache():
    result = synthesize_cpu(SMALL, HW, CLUSTER.role, 2, lowering="winograd", winograd_m=2)
    back = synthesis_from_payload(synthesis_payload(result), SMALL, CLUSTER)
    assert back.plan == result.plan and back.plan.winograd_vectors == "channels"


def test_bad_vector_axis_plans_are_refused_in_one_line():
    with pytest.raises(OperatorError, match="vectors 'rows'"):
        hand_winograd_plan(SMALL, 2, "avx512", vectors="rows")
    plan = hand_winograd_plan(SMALL, 2, "avx512", vectors="channels")
    with pytest.raises(OperatorError, match="a_pack='direct'"):
        render_cpu_kernel(replace(plan, gemm=replace(plan.gemm, a_pack="packed")))
    with pytest.raises(OperatorError, match="winograd_vectors 'rows'"):
        render_cpu_kernel(replace(plan, winograd_vectors="rows"))
    with pytest.raises(OperatorError, match="vectors 'rows'"):
        synthesize_cpu(SMALL, HW, CLUSTER.role, 1, lowering="winograd", winograd_vectors="rows")
    assert wmath.tile_counts(SMALL, 2) == (4, 4)


@pytest.mark.parametrize("floats", [1, 16, 17, 256, 4096, 16 * 256, 49 * 256, 100 * 128, 12345])
def test_planes_are_an_odd_number_of_cache_lines_apart(floats):
    from xfc.cpu.winograd import CACHE_LINE_FLOATS, plane_floats
    stride = plane_floats(floats)
    lines = stride // CACHE_LINE_FLOATS
    assert stride % CACHE_LINE_FLOATS == 0 and lines % 2 == 1
    assert floats <= stride < floats + 2 * CACHE_LINE_FLOATS
    # the planes' lines at one offset fall in distinct sets of a 64-set L1 (up to 64 planes)
    assert len({(xi * lines) % 64 for xi in range(64)}) == 64


@pytest.mark.parametrize("vectors", ["tiles", "channels"])
def test_rendered_plane_strides_are_padded(vectors):
    import re
    # 256 channels at 14x14, m = 4: 16 tiles, so the unpadded planes of V are 16 KiB apart
    spec = make_spec("conv2d", dict(c=256, h=14, w=14, k=256, r=3, s=3), pad=1)
    source = render_cpu_kernel(hand_winograd_plan(spec, 4, "avx512", vectors=vectors)).source
    for name in ("XFC_V_STRIDE", "XFC_M_STRIDE"):
        floats = int(re.search(rf"#define {name} (\d+)L", source).group(1))
        assert floats % 16 == 0 and (floats // 16) % 2 == 1, (name, floats)
        assert floats >= 16 * 256
