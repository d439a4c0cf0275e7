"""The int8 GEMMs' next-panel prefetch (xfc.cpu.int8_synth.next_panel_prefetch, Int8Plan.prefetch_every_groups):
where the planner turns it on, that a row tile's share of the next weight panel is done by its last k group,
and that kernels with it (the 'channels' conv layout, matmuls; both x86 dialects; ragged, 1 and 2 threads)
are exact. Its speed: benchmarks/packed_panel.py --rule int8_next_panel_prefetch --quantize qoperator."""
from __future__ import annotations

import math

import pytest

from xfc.cpu.decide import NEXT_PANEL_PREFETCH_TILES
from xfc.cpu.int8_arm import plan_arm_int8
from xfc.cpu.int8_synth import next_panel_prefetch, plan_int8
from xfc.hardware.host import available_isas, read_flags
from xfc.hardware.load import load
from xfc.ops.quant import QuantParams
from xfc.ops.spec import make_spec
from support import assert_int8_exact, compile_int8

FLAGS = frozenset(read_flags())
HAS_VNNI = "avx512_vnni" in FLAGS and "avx512" in available_isas()


@pytest.mark.unit
@pytest.mark.parametrize("tiles, groups, panel_bytes", [(2, 16, 2048), (7, 1152, 147456), (16, 9, 4608),
                                                         (14, 576, 73728), (3, 7, 100000), (2, 128, 32768),
                                                         (2, 1, 64), (16, 1000, 64)])
def test_a_tiles_share_is_prefetched_by_its_last_k_group(tiles, groups, panel_bytes):
    """What the kernel prefetches (XFC_PF_LINES lines at k groups 0, every, 2 every, ... < groups) covers
    the tile's share of the next panel, without a step's worth of lines to spare."""
    rule = next_panel_prefetch("vnni", tiles, groups, panel_bytes)
    share_lines = math.ceil(panel_bytes / (64 * tiles))
    steps = math.ceil(groups / rule.every_groups)
    assert rule.every_groups >= 1 and rule.lines_per_step >= 1
    assert steps * rule.lines_per_step >= share_lines
    assert (steps - 1) * rule.lines_per_step < share_lines or rule.every_groups * steps > groups - rule.every_groups


@pytest.mark.unit
def test_the_prefetch_is_off_outside_its_tile_range_and_off_x86():
    fewest, most = NEXT_PANEL_PREFETCH_TILES
    assert next_panel_prefetch("vnni", fewest - 1, 100, 10000) is None
    assert next_panel_prefetch("vnni", most + 1, 100, 10000) is None
    assert next_panel_prefetch("avx2", fewest, 100, 10000) is not None
    assert next_panel_prefetch("generic", fewest, 100, 10000) is None
    assert next_panel_prefetch("sdot", fewest, 100, 10000) is None


@pytest.mark.unit
def test_the_planner_prefetches_where_the_weights_are_the_column_panels():
    from xfc.hardware.host import X86_64_V4_FLAGS, describe_host
    flags = frozenset(X86_64_V4_FLAGS) | {"avx512_vnni"}     # a synthetic VNNI core: this CPU need not be one
    hw = describe_host({"flags": set(flags), "model name": "AVX-512 VNNI core"}, {}, 2, "x86_64", isa="avx512")
    q = QuantParams(a_zero_point=128)
    r18_7x7 = make_spec("conv2d", {"c": 512, "h": 7, "w": 7, "k": 512, "r": 3, "s": 3}, pad="1", bias=True)
    plan = plan_int8(r18_7x7, q, hw, threads=1, host_flags=flags)
    groups = 9 * 512 // 4
    assert plan.column_layout == "channels" and plan.prefetch_every_groups > 0
    rule = next_panel_prefetch("vnni", math.ceil(49 / plan.mr), groups, groups * 4 * plan.nr)
    assert (plan.prefetch_every_groups, plan.prefetch_lines_per_step) == (rule.every_groups, rule.lines_per_step)
    assert "next weight panel prefetched" in "\n".join(plan.reasons)
    assert plan.summary()["prefetch_every_groups"] == plan.prefetch_every_groups
    classifier = make_spec("matmul", {"m": 1, "n": 1000, "k": 512}, bias=True)   # one row tile: streams anyway
    assert plan_int8(classifier, q, hw, threads=1, host_flags=flags).prefetch_every_groups == 0
    big = make_spec("conv2d", {"c": 64, "h": 56, "w": 56, "k": 64, "r": 3, "s": 3}, pad="1", bias=True)
    assert plan_int8(big, q, hw, threads=1, host_flags=flags).prefetch_every_groups == 0   # weights are the rows
    arm = plan_arm_int8(r18_7x7, q, load("cortex-a76"), threads=1)
    assert arm.prefetch_every_groups == 0


CASES = [  # (op, shape, geometry, forced layout, tile): row tiles 2-16 per panel, ragged everywhere
    ("conv2d", {"c": 37, "h": 7, "w": 9, "k": 75, "r": 3, "s": 3}, {"pad": "1"}, "channels", (4, 1)),
    ("conv2d", {"c": 20, "h": 9, "w": 9, "k": 40, "r": 3, "s": 3, "n": 2}, {"stride": "2", "pad": "1"}, "channels",
     (5, 1)),
    ("matmul", {"m": 23, "n": 70, "k": 301}, {}, None, (4, 2)),
]


@pytest.mark.host
@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("op, shape, geometry, layout, tile", CASES, ids=["channels-3x3", "channels-s2-batch2",
                                                                          "matmul"])
def test_kernels_with_the_prefetch_match_the_reference_exactly(isa, op, shape, geometry, layout, tile, tmp_path):
    if isa == "avx512" and not HAS_VNNI:
        pytest.skip("no avx512_vnni here")
    if isa == "avx2" and "avx2" not in available_isas():
        pytest.skip("no AVX2 here")
    spec = make_spec(op, shape, bias=True, activation="relu6", **geometry)
    q = QuantParams(act_type="uint8", a_zero_point=131, per_channel=True, out_zero_point=9)
    for threads in (1, 2):
        forced = {"force_tile": tile, **({"force_layout": layout} if layout else {})}
        plan, kernel = compile_int8(spec, q, load(f"host:{isa}"), tmp_path / f"t{threads}", threads=threads,
                                    flags=FLAGS, **forced)
        assert plan.prefetch_every_groups > 0, plan.summary()
        assert "__builtin_prefetch(pf + 64 * l, 0, 2)" in kernel.rendered.source
        assert_int8_exact(kernel)
