"""The part of a Winograd filter transform U past the shared cache streams faster on more threads
where the host probe measured that every CPU reads a buffer a little past the L3 faster than one
(the description's l3_overflow_read_speedup). Found on a Zen 4 VM (session 62): r18_l4's F(4,3), U
37.7 MB past a 32 MB L3, ran 0.93 ms on one thread and 0.61 ms on two, and two CPUs read a 38 MiB
buffer 1.8-2.1x as fast as one (stream_past_cache_zen4_s62*.json). Unit: nothing is built or timed."""
from __future__ import annotations

from dataclasses import replace

import pytest

from xfc.cpu.cost_model import overflow_stream_speedup, winograd_stream_bytes_per_second
from xfc.cpu.synth import synthesize_cpu
from xfc.cpu.winograd import packed_floats, weights_memory
from xfc.cpu.tiles import FLOAT_BYTES
from xfc.ops.spec import make_spec

from support.calibration import CLUSTER, HW

pytestmark = pytest.mark.unit

# ResNet's last stage: 512 -> 512 channels at 7x7; F(4,3)'s U is 36 x 512 x 512 floats (37.7 MB)
R18_L4 = make_spec("conv2d", dict(c=512, h=7, w=7, k=512, r=3, s=3), pad=1)
MEASURED = replace(HW, l3_overflow_read_speedup=2.0)


def test_the_speedup_is_measured_for_every_cpu_and_in_proportion_for_fewer_threads_never_below_1():
    assert HW.l3_overflow_read_speedup is None
    assert overflow_stream_speedup(HW, CLUSTER, 2) == 1.0          # not measured: one chip-wide rate
    assert overflow_stream_speedup(MEASURED, CLUSTER, 1) == 1.0
    assert overflow_stream_speedup(MEASURED, CLUSTER, 2) == 2.0
    assert overflow_stream_speedup(MEASURED, CLUSTER, 8) == 2.0    # more threads than CPUs gain nothing more
    # in proportion to the share of the CPUs, never below 1, never past all of them: 8 CPUs at 4x
    eight = replace(CLUSTER, count=8, cpu_ids=tuple(range(8)))
    four = replace(MEASURED, l3_overflow_read_speedup=4.0)
    assert [overflow_stream_speedup(four, eight, t) for t in (2, 4, 6, 8, 16)] == [1.0, 2.0, 3.0, 4.0, 4.0]
    # a fitted stream rate is not scaled by it (the figure is relative to the DRAM figure)
    from xfc.cpu.cost_model import DEFAULT_CONSTANTS
    fitted = replace(DEFAULT_CONSTANTS, winograd_stream_bytes_per_cycle=8.0)
    assert winograd_stream_bytes_per_second(MEASURED, CLUSTER, fitted, 2) == winograd_stream_bytes_per_second(
        HW, CLUSTER, fitted, 2)
    assert winograd_stream_bytes_per_second(MEASURED, CLUSTER, threads=2) == pytest.approx(
        2 * winograd_stream_bytes_per_second(HW, CLUSTER, threads=2))


def test_the_part_of_u_past_the_cache_streams_at_the_threads_rate():
    u_bytes = FLOAT_BYTES * packed_floats(R18_L4, 4, "channels", 4, 64)
    assert u_bytes > HW.l3_bytes        # past the whole L3: part of it comes from DRAM on every call
    # split over output channels the threads stream disjoint parts, as the probe measured; split over
    # tiles each streams all of U, which it did not measure: priced as before
    for threads, owned, faster in ((1, False, 1.0), (2, False, 2.0), (2, True, 1.0)):
        level, plain_s = weights_memory(R18_L4, 4, 4, HW, CLUSTER, threads, 0, vectors="channels", nr=64, owned=owned)
        _, measured_s = weights_memory(R18_L4, 4, 4, MEASURED, CLUSTER, threads, 0, vectors="channels", nr=64,
                                       owned=owned)
        assert level == "DRAM" and plain_s > 0
        assert measured_s == pytest.approx(plain_s / faster)
    # a U read from memory on every call keeps the cold stream's own fitted rate
    cold = [weights_memory(R18_L4, 4, 4, hw, CLUSTER, 2, 0, vectors="channels", nr=64, from_memory=True)[1]
            for hw in (HW, MEASURED)]
    assert cold[0] == cold[1]


def test_two_threads_that_stream_past_the_l3_faster_take_the_larger_tile():
    """On the recorded machine without the figure, two threads run F(2,3) on r18_l4 (U 16.8 MB,
    within the L3); measured to read past the L3 twice as fast, F(4,3)'s stream no longer outweighs
    its fewer multiplications. One thread is priced as before."""
    def chosen_m(hw, threads):
        plan = synthesize_cpu(R18_L4, hw, hw.cluster().role, threads, lowering="winograd").plan
        return plan.winograd_m

    assert chosen_m(HW, 2) == 2
    assert chosen_m(MEASURED, 2) == 4
    assert chosen_m(MEASURED, 1) == chosen_m(HW, 1)


def test_a_measured_sustained_read_is_the_streams_rate_as_measured():
    """The host probe's DRAM figure is a sustained read: the part of U past the cache streams at it,
    not at it derated again by the static DRAM efficiency (which takes a datasheet peak to what a
    stream sustains). Derated twice, r18_l4's F(4,3) on the Zen 4 VM was priced at 1.30 ms on one
    thread where it ran 0.92-0.93, and F(2,3), 31-34% slower, was chosen (session 64:
    regret_winograd_zen4_1t_s64.json). Descriptions of phones give datasheet peaks: unchanged."""
    from xfc.cpu.cost_model import DEFAULT_CONSTANTS
    sustained = replace(HW, memory=replace(HW.memory, measured_sustained_read=True))
    peak_bytes_per_s = HW.memory.peak_bandwidth_gbps * 1e9
    assert winograd_stream_bytes_per_second(sustained, CLUSTER, threads=1) == pytest.approx(peak_bytes_per_s)
    assert winograd_stream_bytes_per_second(HW, CLUSTER, threads=1) == pytest.approx(
        peak_bytes_per_s * DEFAULT_CONSTANTS.dram_efficiency)
    both = replace(sustained, l3_overflow_read_speedup=2.0)
    assert winograd_stream_bytes_per_second(both, CLUSTER, threads=2) == pytest.approx(2 * peak_bytes_per_s)

    def chosen_m(hw, threads):
        return synthesize_cpu(R18_L4, hw, hw.cluster().role, threads, lowering="winograd").plan.winograd_m

    # the recorded machine: the 21 MB of U past half its L3 now streams fast enough for F(4,3)
    # at one thread; at two, F(4,3) also needs the measured past-L3 gain (the test above)
    assert [chosen_m(HW, t) for t in (1, 2)] == [2, 2]
    assert [chosen_m(sustained, t) for t in (1, 2)] == [4, 2]
    assert [chosen_m(both, t) for t in (1, 2)] == [4, 4]
