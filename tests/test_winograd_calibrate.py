"""Calibrated Winograd stage constants (issue 19): the training layers, the fit recovering known
constants from synthetic measurements, the stored constants read back by synthesis, and the
structure of the Winograd GEMM stage (U read once from where it lives, the column tail scored on
every ISA, the GEMM schedule chosen by the whole stage). Unit: nothing is built or timed."""
from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from xfc.cpu.cost_model import (COST_MODEL_VERSION, DEFAULT_CONSTANTS, StaticEvaluator, cold_stream_bytes_per_second,
                                dram_bytes_per_second)
from xfc.cpu.cost_model import L2_FILL, l2_per_core_bytes
from xfc.cpu.synth import synthesize_cpu
from xfc.cpu.tiles import MicroTileScore, round_up
from xfc.cpu.winograd import gemm_problem, plan_stages, stages_of_plan, weights_memory, winograd_estimate
from xfc.ops.spec import make_spec
from xfc.ops.winograd import admissible_tile_sizes
from xfc.ops.workloads import SUITE
from xfc.tiledb.calibrate import (GRIDS, Measured, calibrated_constants, fit, predicted_s, store_fit,
                                  training_cases, winograd_training_specs)
from xfc.tiledb.store import TileDb

from support.calibration import CLUSTER, HW, synthetic_items

pytestmark = pytest.mark.unit
# A fit over Winograd plans searches the whole 3072-point grid of the four transform constants
# (calibrate.JOINT) at least twice, re-estimating every Winograd plan at each point: pure, but
# 5-40 s each, so `sweep` (in `make test`, not in `pytest -m unit`).
WINOGRAD_FIT = pytest.mark.sweep

REPO = Path(__file__).resolve().parent.parent


def _benchmark_layers() -> set:
    """(C, H, W, K) of benchmarks/winograd.py's layers, read from its source (importing it would
    load the benchmark's peers)."""
    text = (REPO / "benchmarks" / "winograd.py").read_text()
    rows = re.findall(r'"(?:r18|vgg)_\w+": \(dict\(c=(\d+), h=(\d+), w=(\d+), k=(\d+)', text)
    return {tuple(int(x) for x in row) for row in rows}


def _shape(spec) -> tuple:
    return (spec.c, spec.h, spec.w, spec.k)


def test_the_winograd_training_layers_are_neither_benchmark_layers_nor_suite_operators():
    bench = _benchmark_layers()
    assert len(bench) == 12
    suite = {(s.get("c"), s.get("h"), s.get("w"), s.get("k")) for op, s, _ in SUITE.values() if op == "conv2d"}
    specs = winograd_training_specs()
    assert len(specs) >= 3
    for spec in specs:
        assert (spec.r, spec.s, spec.stride_h, spec.stride_w) == (3, 3, 1, 1)
        assert _shape(spec) not in bench and _shape(spec) not in suite
        # other channel counts and spatial sizes than the benchmark's, not only another combination
        assert spec.c not in {c for c, _, _, _ in bench} and spec.h not in {h for _, h, _, _ in bench}


def test_training_cases_time_every_admissible_tile_size_and_the_direct_plan():
    cases = training_cases()
    for spec in winograd_training_specs():
        mine = [c for c in cases if c.spec == spec]
        assert [c.lowering for c in mine].count("direct") == 1
        assert sorted(c.winograd_m for c in mine if c.lowering == "winograd") == list(admissible_tile_sizes(spec.c))
    assert {c.winograd_m for c in cases if c.lowering == "winograd"} == {2, 4, 6}


def _winograd_items(truth, threads=(1, 2)) -> list[Measured]:
    """'Measurements' of every training case: the model's own predictions under known constants."""
    return synthetic_items(training_cases(), truth, threads)


def test_re_estimating_a_winograd_plan_reproduces_the_synthesizers_estimate():
    for case in training_cases():
        if case.lowering != "winograd":
            continue
        result = synthesize_cpu(case.spec, HW, CLUSTER.role, 2, lowering="winograd", winograd_m=case.winograd_m)
        assert result.plan.winograd_m == case.winograd_m
        item = Measured(spec=case.spec, threads=2, plan=result.plan, measured_s=1.0, spread=0.0)
        assert predicted_s(item, HW, CLUSTER, DEFAULT_CONSTANTS) == pytest.approx(result.estimate.predicted_s,
                                                                                   rel=1e-12)


@WINOGRAD_FIT
def test_the_fit_recovers_known_winograd_stage_constants():
    truth = replace(DEFAULT_CONSTANTS, compute_efficiency=0.9, winograd_transform_efficiency=0.6,
                    winograd_store_cycles=2.0, winograd_scalar_cycles=1.5, winograd_group_cycles=16.0)
    for field, value in truth.as_dict().items():
        if field in GRIDS:                        # reachable, so an exact recovery is possible
            assert value in GRIDS[field], field
        else:                                     # not fitted: the truth keeps the static value
            assert value == getattr(DEFAULT_CONSTANTS, field), field
    # one thread: at two, the tile-owned split divides both transforms by the busiest thread's
    # share and traffic_exposed trades off against the store and group cycles (an equally good fit)
    items = _winograd_items(truth, threads=(1,))
    result = fit(items, HW, CLUSTER)
    assert result.error_before > 0.1              # the static transform constants are visibly wrong here
    assert result.error_after < 0.005 and result.worst_after < 0.02
    for field in ("compute_efficiency", "winograd_transform_efficiency", "winograd_store_cycles",
                  "winograd_scalar_cycles", "winograd_group_cycles"):
        assert getattr(result.constants, field) == getattr(truth, field), field


@WINOGRAD_FIT
def test_fitted_winograd_constants_round_trip_and_change_the_winograd_estimate_only(tmp_path, monkeypatch):
    monkeypatch.setattr("xfc.tiledb.hostcc.compiler_version", lambda: "gcc (recorded)")   # no process in a unit test
    truth = replace(DEFAULT_CONSTANTS, winograd_store_cycles=3.0, winograd_group_cycles=32.0)
    spec = make_spec("conv2d", dict(c=96, h=30, w=30, k=160, r=3, s=3), pad=1)
    with TileDb.open(tmp_path / "db.sqlite") as db:
        assert calibrated_constants(db, HW, CLUSTER) is None   # uncalibrated: synthesis keeps the defaults
        result = fit(_winograd_items(truth, threads=(1,)), HW, CLUSTER)
        store_fit(db, HW, CLUSTER, result, (1,))
        constants = calibrated_constants(db, HW, CLUSTER)
    assert constants == result.constants
    assert constants.winograd_store_cycles == 3.0 and constants.winograd_group_cycles == 32.0
    assert COST_MODEL_VERSION >= 4
    wino = [synthesize_cpu(spec, HW, CLUSTER.role, 1, lowering="winograd", winograd_m=4, constants=c)
            for c in (DEFAULT_CONSTANTS, constants)]
    assert wino[1].estimate.predicted_s > wino[0].estimate.predicted_s
    direct = [synthesize_cpu(spec, HW, CLUSTER.role, 1, lowering="direct", constants=c) for c in
              (DEFAULT_CONSTANTS, replace(constants, compute_efficiency=DEFAULT_CONSTANTS.compute_efficiency))]
    assert direct[0].estimate.predicted_s == direct[1].estimate.predicted_s


# ---- structure of the GEMM stage ------------------------------------------------------------------

def _stage(spec, m, threads, evaluator=None):
    plan = synthesize_cpu(spec, HW, CLUSTER.role, threads, lowering="winograd", winograd_m=m).plan
    return plan, stages_of_plan(plan, HW, CLUSTER, evaluator=evaluator)


def test_a_gemm_stage_whose_u_stays_on_chip_scales_with_threads():
    # 256 channels at 14x14, m = 4: 16 tiles; U = 36 x 256 x 256 floats = 9.4 MB, in the 32 MB L3.
    # Each GEMM's own roofline charged U, V and M from DRAM on all 36 GEMMs: a term no thread divides.
    spec = make_spec("conv2d", dict(c=256, h=14, w=14, k=256, r=3, s=3), pad=1)
    plan1, one = _stage(spec, 4, 1)
    plan2, two = _stage(spec, 4, 2)
    assert one.weights_level == two.weights_level == "L3"
    assert one.gemm_bound != "DRAM" and two.gemm_bound != "DRAM"
    assert two.gemm_s < 0.6 * one.gemm_s


def test_a_u_past_the_shared_cache_is_read_once_per_image_from_dram():
    spec = make_spec("conv2d", dict(n=2, c=512, h=7, w=7, k=512, r=3, s=3), pad=1)
    u_bytes = 4 * 16 * 513 * 512                  # F(2,3): 16.8 MB, past the share, inside the 32 MB L3
    shared = HW.l3_bytes * 0.5                     # L3_FILL: the share U and the tiles may hold
    level, seconds = weights_memory(spec, 2, 9, HW, CLUSTER, 1, tile_bytes=0)
    assert level == "DRAM"
    # only the part past the shared cache's share comes from DRAM, once per image
    assert seconds == pytest.approx(2 * (u_bytes - shared) / dram_bytes_per_second(HW), rel=1e-12)
    # the tiles take room beside U, so more of U spills
    _, more = weights_memory(spec, 2, 9, HW, CLUSTER, 1, tile_bytes=4 << 20)
    assert more == pytest.approx(2 * (u_bytes + (4 << 20) - shared) / dram_bytes_per_second(HW), rel=1e-12)
    # F(4,3)'s U (37.8 MB) is larger than the whole L3: the share still stays on chip between calls
    # (issue 34), only the part past it comes from DRAM
    _, past_the_cache = weights_memory(spec, 4, 9, HW, CLUSTER, 1, tile_bytes=0)
    assert past_the_cache == pytest.approx(2 * (4 * 36 * 513 * 512 - shared) / dram_bytes_per_second(HW), rel=1e-12)
    small = make_spec("conv2d", dict(c=64, h=56, w=56, k=64, r=3, s=3), pad=1)
    assert weights_memory(small, 4, 14, HW, CLUSTER, 1, tile_bytes=0) == ("L3", 0.0)


def test_split_over_tiles_every_thread_streams_the_part_of_u_past_the_shared_cache():
    """Split over tiles (owned), each thread multiplies its tiles by all of U: the part past the
    shared cache comes from DRAM once per thread, and U stays in L2 only if each thread's share
    holds all of it. Split over output channels (or one thread) it is read once."""
    spec = make_spec("conv2d", dict(n=1, c=512, h=7, w=7, k=512, r=3, s=3), pad=1)
    _, once = weights_memory(spec, 2, 9, HW, CLUSTER, 2, tile_bytes=0)
    level, owned = weights_memory(spec, 2, 9, HW, CLUSTER, 2, tile_bytes=0, owned=True)
    assert level == "DRAM" and owned == pytest.approx(2 * once, rel=1e-12)
    assert weights_memory(spec, 2, 9, HW, CLUSTER, 1, tile_bytes=0, owned=True) == \
        weights_memory(spec, 2, 9, HW, CLUSTER, 1, tile_bytes=0)
    # the cold stream keeps its fitted constants: no copies
    assert weights_memory(spec, 2, 9, HW, CLUSTER, 2, tile_bytes=0, from_memory=True, owned=True) == \
        weights_memory(spec, 2, 9, HW, CLUSTER, 2, tile_bytes=0, from_memory=True)
    # a U that fits two L2 shares but not one: L2 split over output channels, not over tiles
    l2_share = l2_per_core_bytes(CLUSTER) * L2_FILL
    tiny = next(make_spec("conv2d", dict(c=c, h=14, w=14, k=c, r=3, s=3), pad=1) for c in range(8, 512, 8)
                if l2_share < 4 * 16 * round_up(c, 9) * c <= 2 * l2_share)
    assert weights_memory(tiny, 2, 9, HW, CLUSTER, 2, tile_bytes=0)[0] == "L2"
    assert weights_memory(tiny, 2, 9, HW, CLUSTER, 2, tile_bytes=0, owned=True)[0] != "L2"


def test_weights_from_memory_read_all_of_u_from_dram_on_every_call():
    """A layer of a network whose weights exceed the shared cache meets its U in memory: all of it
    is charged at the cold stream's rate, also where it would fit the cache share, and also on two
    threads."""
    spec = make_spec("conv2d", dict(n=2, c=512, h=7, w=7, k=512, r=3, s=3), pad=1)
    u_bytes = 4 * 16 * 513 * 512
    for threads in (1, 2):
        level, seconds = weights_memory(spec, 2, 9, HW, CLUSTER, threads, tile_bytes=0, from_memory=True)
        assert level == "DRAM"
        assert seconds == pytest.approx(2 * u_bytes / cold_stream_bytes_per_second(HW, threads=threads), rel=1e-12)
    # at the cold stream's own rate: the description's DRAM figure at its efficiency (on several
    # threads, at its parallel efficiency), no other
    assert cold_stream_bytes_per_second(HW) == pytest.approx(
        HW.memory.peak_bandwidth_gbps * 1e9 * DEFAULT_CONSTANTS.winograd_cold_stream_efficiency)
    assert cold_stream_bytes_per_second(HW, threads=2) == pytest.approx(
        HW.memory.peak_bandwidth_gbps * 1e9 * DEFAULT_CONSTANTS.winograd_cold_stream_parallel_efficiency)
    assert cold_stream_bytes_per_second(HW, threads=2) < cold_stream_bytes_per_second(HW)
    _, two = weights_memory(spec, 2, 9, HW, CLUSTER, 2, tile_bytes=0, from_memory=True)
    _, one = weights_memory(spec, 2, 9, HW, CLUSTER, 1, tile_bytes=0, from_memory=True)
    assert two == pytest.approx(one * DEFAULT_CONSTANTS.winograd_cold_stream_efficiency
                                / DEFAULT_CONSTANTS.winograd_cold_stream_parallel_efficiency, rel=1e-12)
    half = replace(DEFAULT_CONSTANTS, winograd_cold_stream_efficiency=0.5,
                               winograd_stream_bytes_per_cycle=3.0, dram_efficiency=0.3)
    _, slower = weights_memory(spec, 2, 9, HW, CLUSTER, 1, tile_bytes=0, constants=half, from_memory=True)
    assert slower == pytest.approx(2 * one, rel=1e-12)
    small = make_spec("conv2d", dict(c=64, h=56, w=56, k=64, r=3, s=3), pad=1)
    level, seconds = weights_memory(small, 4, 14, HW, CLUSTER, 1, tile_bytes=0, from_memory=True)
    assert level == "DRAM" and seconds > 0
    # a stream shorter than the FMAs beside it is hidden (the cold exposure is 0): priced as cached
    plan, cached = _stage(small, 4, 1)
    cold = stages_of_plan(plan, HW, CLUSTER, weights_from_memory=True)
    assert cold.weights_level == "DRAM" and cached.weights_level == "L3"
    assert DEFAULT_CONSTANTS.winograd_cold_stream_exposed == 0 and cold.total_s == pytest.approx(cached.total_s)
    # a longer one (a 9 MB U beside 4 tiles per GEMM) sets the GEMM stage's time, and synthesis takes it
    deep = make_spec("conv2d", dict(c=256, h=7, w=7, k=256, r=3, s=3), pad=1)
    plan, cached = _stage(deep, 4, 1)
    cold = stages_of_plan(plan, HW, CLUSTER, weights_from_memory=True)
    assert cold.weights_level == "DRAM" and cached.weights_level == "L3" and cold.gemm_bound == "DRAM"
    assert cold.total_s > cached.total_s
    planned = synthesize_cpu(deep, HW, CLUSTER.role, 1, lowering="winograd", winograd_m=4, weights_from_memory=True)
    as_cold = winograd_estimate(deep, stages_of_plan(planned.plan, HW, CLUSTER, weights_from_memory=True))
    as_cached = winograd_estimate(deep, stages_of_plan(planned.plan, HW, CLUSTER))
    assert planned.estimate.predicted_s == pytest.approx(as_cold.predicted_s, rel=1e-9)
    assert as_cold.predicted_s > as_cached.predicted_s


class NarrowTilesSlow(StaticEvaluator):
    """The static model, except that one-vector-wide tiles reach half their FMA rate (as measured
    on the AVX-512 host for a 9x16 column tail; the static model says 0.9)."""

    def evaluate(self, tile, core, isa):
        score = super().evaluate(tile, core, isa)
        if tile.nr_vectors > 1:
            return score
        return MicroTileScore(cycles_per_k=score.cycles_per_k * 2 * score.efficiency, efficiency=0.5,
                              bound="measured", source="test")


def test_the_column_tail_is_charged_on_avx512_and_steers_the_winograd_gemm_schedule():
    # 128 channels at 28x28, m = 4: N = 49 tiles. A 48-column tile leaves a 1-column tail: one
    # narrow micro-kernel call per row panel, a quarter of the padded work.
    spec = make_spec("conv2d", dict(c=128, h=28, w=28, k=128, r=3, s=3), pad=1)
    plan = synthesize_cpu(spec, HW, CLUSTER.role, 1, lowering="winograd", winograd_m=4,
                          winograd_vectors="tiles").plan
    assert plan.isa == "avx512" and gemm_problem(spec, 4).n == 49
    wide = replace(plan.gemm, mr=9, nr=48, mc=135, nc=96)
    fast, slow = (plan_stages(spec, 4, HW, CLUSTER, wide, 16, "avx512", evaluator=e)
                  for e in (StaticEvaluator(), NarrowTilesSlow()))
    assert slow.gemm_s > fast.gemm_s * 1.15          # the tail at half rate shows in the stage
    chosen = synthesize_cpu(spec, HW, CLUSTER.role, 1, lowering="winograd", winograd_m=4,
                            evaluator=NarrowTilesSlow(), winograd_vectors="tiles").plan.gemm
    # the schedule the stage estimate picks leaves no one-vector column tail on these 49 tiles
    assert math.ceil((49 % chosen.nr) / 16) != 1


@WINOGRAD_FIT
def test_a_contended_measurement_is_left_out_of_the_fit():
    truth = replace(DEFAULT_CONSTANTS, winograd_store_cycles=2.0, winograd_scalar_cycles=1.5)
    items = _winograd_items(truth)
    lost = next(i for i in items if i.threads == 2 and i.plan.lowering == "winograd")
    # a 2-thread run that lost a core in every repeat: slower than the same plan on one thread
    contended = replace(lost, measured_s=lost.measured_s * 5, contended=True)
    result = fit(items + [contended], HW, CLUSTER)
    assert result.left_out == 1 and result.cases == len(items)
    assert result.error_after < 1e-9
    assert (result.constants.winograd_store_cycles, result.constants.winograd_scalar_cycles) == (2.0, 1.5)
