"""The DRAM stream of a Winograd filter (cost-model forms 8 and 9): a GEMM stage whose transformed
filter U lives in DRAM streams the part of it past the cache share at one chip-wide rate whatever
the threads (the chip's static figure unless `xfc tiledb calibrate` fits
winograd_stream_bytes_per_cycle), the share winograd_stream_exposed of the shorter of (FMAs,
stream) adds to the longer, on every thread count, and the choice takes the predictions as they
are. The fit recovers a known rate. Unit: nothing is built or timed."""
from __future__ import annotations

from dataclasses import replace

import pytest

from xfc.cpu.cost_model import DEFAULT_CONSTANTS, L3_FILL, dram_bytes_per_second, winograd_stream_bytes_per_second
from xfc.cpu.synth import synthesize_cpu
from xfc.cpu.tiles import FLOAT_BYTES
from xfc.cpu.winograd import packed_floats, stages_of_plan, weights_memory
from xfc.ops.spec import make_spec
from xfc.tiledb.calibrate import GRIDS, fit, predicted_s, training_cases

from support.calibration import CLUSTER, HW, synthetic_items

pytestmark = pytest.mark.unit
# A fit over Winograd plans searches the whole 3072-point grid of the four transform constants
# (calibrate.JOINT) at least twice, re-estimating every Winograd plan at each point: pure, but
# 5-40 s each, so `sweep` (in `make test`, not in `pytest -m unit`).
WINOGRAD_FIT = pytest.mark.sweep

# 512 channels at 14x14: U of F(4,3) is 36 x 512 x 512 floats = 38 MB, past the 32 MB L3.
BIG = make_spec("conv2d", dict(c=512, h=14, w=14, k=512, r=3, s=3), pad=1)


def _stages(constants, m, threads):
    plan = synthesize_cpu(BIG, HW, CLUSTER.role, threads, lowering="winograd", winograd_m=m,
                          constants=constants).plan
    return stages_of_plan(plan, HW, CLUSTER, constants)


def test_the_stream_rate_is_the_chips_static_rate_unless_one_is_fitted():
    chip = dram_bytes_per_second(HW)
    assert winograd_stream_bytes_per_second(HW, CLUSTER) == chip
    # the fitted dram_efficiency of the direct plans does not move it
    assert winograd_stream_bytes_per_second(HW, CLUSTER, replace(DEFAULT_CONSTANTS, dram_efficiency=0.3)) == chip
    fitted = replace(DEFAULT_CONSTANTS, winograd_stream_bytes_per_cycle=12.0)
    assert winograd_stream_bytes_per_second(HW, CLUSTER, fitted) == pytest.approx(12.0 * CLUSTER.clock_ghz * 1e9)


def test_a_filter_in_dram_is_charged_at_the_stream_rate_and_a_filter_on_chip_is_not():
    slow = replace(DEFAULT_CONSTANTS, winograd_stream_bytes_per_cycle=2.0)
    fast = replace(DEFAULT_CONSTANTS, winograd_stream_bytes_per_cycle=24.0)
    one_slow, one_fast = _stages(slow, 4, 1), _stages(fast, 4, 1)
    assert one_slow.weights_level == one_fast.weights_level == "DRAM"
    assert one_slow.gemm_bound == "DRAM" and one_slow.gemm_s > 1.5 * one_fast.gemm_s
    # the stream is the chip's: a second thread divides the FMAs, not the stream
    two_slow = _stages(slow, 4, 2)
    assert two_slow.gemm_s > 0.85 * one_slow.gemm_s
    small = make_spec("conv2d", dict(c=128, h=28, w=28, k=128, r=3, s=3), pad=1)   # U 2.4 MB: on chip
    plans = [synthesize_cpu(small, HW, CLUSTER.role, 1, lowering="winograd", winograd_m=4, constants=c)
             for c in (slow, fast)]
    assert plans[0].estimate.predicted_s == plans[1].estimate.predicted_s


@pytest.mark.parametrize("threads", [1, 2])
def test_the_exposed_share_of_the_stream_adds_to_the_fmas_on_every_thread_count(threads):
    hidden = replace(DEFAULT_CONSTANTS, winograd_stream_exposed=0.0)
    shown = replace(DEFAULT_CONSTANTS, winograd_stream_exposed=1.0)
    overlap, added = _stages(hidden, 4, threads), _stages(shown, 4, threads)
    assert overlap.weights_level == "DRAM"
    assert added.gemm_s > 1.2 * overlap.gemm_s
    assert DEFAULT_CONSTANTS.winograd_stream_exposed == 0.5     # the static guess: between two hosts


@WINOGRAD_FIT
def test_the_fit_recovers_a_known_stream_rate():
    truth = replace(DEFAULT_CONSTANTS, winograd_stream_bytes_per_cycle=10.0)
    assert truth.winograd_stream_bytes_per_cycle in GRIDS["winograd_stream_bytes_per_cycle"]
    items = synthetic_items(training_cases(), truth, winograd_vectors=None)
    moved = [i for i in items if predicted_s(i, HW, CLUSTER, DEFAULT_CONSTANTS) != i.measured_s]
    assert moved, "some training plan must stream its filter from DRAM, or the rate cannot be fitted"
    result = fit(items, HW, CLUSTER)
    assert result.constants.winograd_stream_bytes_per_cycle == 10.0
    assert result.worst_after < 1e-9


@WINOGRAD_FIT
def test_a_probed_stream_is_not_replaced_by_one_fitted_rate():
    """Where the host probe measured the DRAM read as a sustained read, the stream's rate is that
    figure (scaled by the threads where the probe measured past-L3 reads), not one fitted rate for
    every thread count: the fit leaves winograd_stream_bytes_per_cycle at 0, from a stored start too."""
    probed = replace(HW, memory=replace(HW.memory, measured_sustained_read=True))
    truth = replace(DEFAULT_CONSTANTS, winograd_stream_bytes_per_cycle=10.0)
    items = synthetic_items(training_cases(), truth, winograd_vectors=None)
    stored = replace(DEFAULT_CONSTANTS, winograd_stream_bytes_per_cycle=12.0)
    result = fit(items, probed, CLUSTER, stored=stored)
    assert result.constants.winograd_stream_bytes_per_cycle == 0.0


def test_the_choice_takes_the_fastest_predicted_tile_size_whatever_the_stream():
    # no extra count for a filter streamed whole from DRAM (issue 34): the choice is the prediction
    for rate in GRIDS["winograd_stream_bytes_per_cycle"][1:]:
        for exposed in GRIDS["winograd_stream_exposed"]:
            constants = replace(DEFAULT_CONSTANTS, winograd_stream_bytes_per_cycle=rate,
                                winograd_stream_exposed=exposed)
            auto = synthesize_cpu(BIG, HW, CLUSTER.role, 1, constants=constants)
            predicted = {m: synthesize_cpu(BIG, HW, CLUSTER.role, 1, lowering="winograd", winograd_m=m,
                                           constants=constants).estimate.predicted_s for m in (2, 4)}
            assert auto.plan.lowering == "winograd"
            assert auto.plan.winograd_m == min(predicted, key=lambda m: (predicted[m], m))
            assert auto.estimate.predicted_s == pytest.approx(predicted[auto.plan.winograd_m])


@pytest.mark.parametrize("shape", [dict(c=256, h=14, w=14, k=512),     # F(4,3): U 19 MB, past the 16 MB share
                                   dict(c=512, h=14, w=14, k=512),     # U 38 MB, past the whole 32 MB L3
                                   dict(c=512, h=13, w=13, k=1024)])   # U 75 MB
def test_a_filter_past_the_cache_share_is_charged_the_part_past_it(shape):
    # what stays on chip between calls is the share, also when U is larger than the whole cache
    # (issue 34: streamed at 1.3-1.7x the probe's read rate on two hosts, not all of it from DRAM)
    spec = make_spec("conv2d", dict(shape, r=3, s=3), pad=1)
    plan = synthesize_cpu(spec, HW, CLUSTER.role, 1, lowering="winograd", winograd_m=4).plan
    g = plan.gemm
    u_bytes = FLOAT_BYTES * packed_floats(spec, 4, plan.winograd_vectors, g.mr, g.nr)
    tile_bytes = 1000
    level, seconds = weights_memory(spec, 4, g.mr, HW, CLUSTER, 1, tile_bytes, DEFAULT_CONSTANTS,
                                    plan.winograd_vectors, g.nr)
    shared = HW.l3_bytes * L3_FILL
    assert level == "DRAM" and u_bytes > shared
    assert seconds == pytest.approx((u_bytes + tile_bytes - shared) / winograd_stream_bytes_per_second(HW, CLUSTER))


def test_never_more_of_the_filter_from_dram_than_the_filter():
    # tiles larger than the cache share (their traffic is its own term): U alone, not U + tiles - share
    spec = make_spec("conv2d", dict(c=512, h=14, w=14, k=512, r=3, s=3), pad=1)
    plan = synthesize_cpu(spec, HW, CLUSTER.role, 1, lowering="winograd", winograd_m=4).plan
    g = plan.gemm
    u_bytes = FLOAT_BYTES * packed_floats(spec, 4, plan.winograd_vectors, g.mr, g.nr)
    huge_tiles = 2 * HW.l3_bytes
    level, seconds = weights_memory(spec, 4, g.mr, HW, CLUSTER, 1, huge_tiles, DEFAULT_CONSTANTS,
                                    plan.winograd_vectors, g.nr)
    assert level == "DRAM"
    assert seconds == pytest.approx(u_bytes / winograd_stream_bytes_per_second(HW, CLUSTER))
    # and with no shared cache at all, all of U streams
    bare = replace(HW, l3_bytes=0, slc_bytes=0)
    level, seconds = weights_memory(spec, 4, g.mr, bare, CLUSTER, 1, 1000, DEFAULT_CONSTANTS,
                                    plan.winograd_vectors, g.nr)
    assert level == "DRAM" and seconds == pytest.approx(u_bytes / winograd_stream_bytes_per_second(bare, CLUSTER))
