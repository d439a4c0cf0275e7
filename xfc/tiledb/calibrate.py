"""Calibration: fit the CPU cost model's per-hardware constants to measurements of one machine.

What is fitted (xfc.cpu.cost_model.CostConstants): the share of the micro-kernel's FMA rate whole
GEMMs sustain, the L2 and shared-cache bandwidths (per core, and the shared cache's chip-wide
cap), a DRAM factor, a scale on every packing
rate, and the depthwise model (its load cost, its sustained share of the FMA issue model, its
staging rate and per-row cost), the fork/join cost of a parallel region, and the Winograd
transforms' constants (the sustained share of the FMA rate of their arithmetic, cycles per vector
store, per scalar staged or scattered element, per group of LANES tiles). Which memory level a
depthwise call's tensors live in is not fitted: it follows from the description's cache sizes
(cost_model.depthwise_memory). The FMA rate and clock themselves are measured by the host probe
(xfc.tiledb.probe) and enter through the host description, not through this fit. The stored
constants name the model form they were fitted to (cost_model.COST_MODEL_VERSION); another form
ignores them until `xfc tiledb calibrate` runs again.

How: operators that are NOT in the benchmark suite (TRAINING_SHAPES, so the suite stays a
held-out check) and 3x3 stride-1 layers that are NOT benchmarks/winograd.py's layers
(WINOGRAD_TRAINING_SHAPES: a direct plan and a Winograd plan forced to each admissible m = 2, 4, 6
for each; training_cases) are synthesized with the static constants, built, verified and timed here with
the weights pre-packed, as the model assumes (the fastest of the repeats: contention only slows). The fitted plan of each measurement is re-estimated
under candidate constants (the plan that ran, not a re-synthesized one), and a deterministic
coordinate descent over fixed grids minimizes the objective below. The fitted constants are
stored in the database's `calibration` table under the hardware fingerprint (names
`cost.<field>`, source 'host'); synthesis reads them back with `calibrated_constants`.

The objective (_Objective), three terms:
- mean |log(predicted / measured)| over the timed operators: the absolute error.
- RANK_WEIGHT x the sum, over the clear pairs, of max(0, log(1 + RANK_MARGIN) - log(predicted
  slower / predicted faster)), divided by the number of operators. A clear pair is two plans of
  one operator at one thread count (the direct plan and each forced Winograd m) whose measured
  times differ by more than RANK_MARGIN.
  The synthesizer picks the plan predicted fastest, so what decides its choice is the ORDER of a
  layer's plans, which the absolute term does not see: a few % of error on each of two plans
  costs little there but flips the choice when the two are close. The hinge is zero once the
  prediction orders the pair the measured way by the margin, so constants that already order
  every pair right are fitted on absolute error alone; in log ratios, so it adds to the first term
  in the same unit.
- REGULARIZATION x the distance from the static constants in grid steps, summed over the
  Winograd-only fields (winograd_only).
  The Winograd transform constants trade off against each other (a slower FMA share or a slower
  store give the same time to most layers), so the first two terms are nearly flat along a ridge
  and run-to-run noise picked a different point of it each run (transform efficiency 0.7 one
  run, 0.25 the next). The weak pull makes the ridge's minimum the point nearest the static
  constants; it is far below what any measured difference costs (one grid step: 0.02% of mean
  error).
What is fitted by default: the direct plans' constants (GEMM, memory, packing, depthwise, fork/join).
The Winograd-only constants (winograd_only) stay static unless `--winograd` asks for them
(fit(winograd=True), training_cases(winograd=True)). On the Zen 4 VM of session 65, three
calibrations were saved (--save-measurements) and refitted offline against the plans that
benchmarks/regret.py had timed (benchmarks/calibration_refit.py: each run alone and the three
pooled; the pull on the Winograd fields or on all, weak or twenty times stronger). With the Winograd
fields fitted, 12 of the 16 fits chose on some regret layers plans slower than the static constants
chose (the worst row 14-30% slower than its fastest plan, against 7-13% with the static constants:
r18_l4 F(2,3) for F(4,3); odd_9 and yolo_26 F(4,3) for F(6,3)), through whichever field the
training layers left free: the stream's exposed share, the plans' L2 rate. With them static, none
did (benchmarks/results/calibration_refit_zen4_s65.json). The Winograd training layers' own plans
are ordered alike either way (126-133 of 130-137 clear pairs), so what the fit gains there is
absolute error that does not carry to other layers.

Measurements can be saved (`--save-measurements FILE`: measurements_document) and fitted again
without timing (`--from-measurements FILE...`: read_measurements, several runs pooled to each
operator's fastest time), so a change to the fit is judged on the same times.

The descent runs from the static constants and, when this machine has stored constants of the
same model version, from those as well; the lower objective wins (the static start on a tie).
From each start it first fits the fields that move direct plans to the non-Winograd plans alone,
then the Winograd-only fields to every plan, the four Winograd transform constants searched
together (JOINT); the plan-order term therefore moves only Winograd constants.

Only the host can be measured here. Phones keep the static constants until a device has been
measured (the shipped databases hold no measured rows).
"""
from __future__ import annotations

import itertools
import json
import math
import statistics
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

from .._version import __version__
from ..cpu.cost_model import (COST_MODEL_VERSION, DEFAULT_CONSTANTS, CostConstants, StaticEvaluator,
                              depthwise_estimate, gemm_estimate)
from ..cpu.ir import CpuKernelPlan
from ..cpu.synth import synthesize_cpu
from ..cpu.tiles import MicroTile
from ..errors import VerificationError, XfcError
from ..hardware.model import CpuCluster, HardwareDescription
from ..ops.spec import OperatorSpec, make_spec
from . import hostcc
from .fingerprint import fingerprint
from .records import CalibrationRow, canonical_json
from .store import TileDb, store_row, utc_now

# Operators outside the suite (xfc/ops/workloads.py), chosen to cover what the constants govern:
# square and skinny GEMMs, 3x3/1x1/strided and first-layer convolutions, depthwise 3x3 and 5x5
# at both strides, with ragged sizes. (operator, shape, options)
TRAINING_SHAPES: tuple[tuple[str, dict, dict], ...] = (
    ("matmul", dict(m=384, n=384, k=384), {}),
    ("matmul", dict(m=200, n=1000, k=300), {}),
    ("matmul", dict(m=64, n=2048, k=512), {}),
    ("conv2d", dict(c=32, h=56, w=56, k=64, r=3, s=3), dict(pad=1)),
    ("conv2d", dict(c=128, h=30, w=30, k=128, r=3, s=3), dict(pad=1)),   # not r18_l2 (28x28) of benchmarks/winograd.py
    ("conv2d", dict(c=256, h=14, w=14, k=512, r=1, s=1), {}),
    ("conv2d", dict(c=64, h=56, w=56, k=128, r=3, s=3), dict(pad=1, stride=2)),
    ("conv2d", dict(c=3, h=112, w=112, k=32, r=3, s=3), dict(pad=1, stride=2)),
    ("depthwise", dict(c=32, h=112, w=112, r=3, s=3), dict(pad=1)),
    ("depthwise", dict(c=240, h=28, w=28, r=5, s=5), dict(pad=2)),
    ("depthwise", dict(c=576, h=14, w=14, r=3, s=3), dict(pad=1, stride=2)),
    ("depthwise", dict(c=72, h=56, w=56, r=3, s=3), dict(pad=1, stride=2)),
    ("depthwise", dict(c=96, h=40, w=40, r=3, s=3), dict(pad=1)),
    ("depthwise", dict(c=384, h=14, w=14, r=3, s=3), dict(pad=1)),
    ("depthwise", dict(c=48, h=150, w=150, r=3, s=3), dict(pad=1, stride=2)),
)

# 3x3 stride-1 layers whose Winograd plans (each admissible m, forced) and direct plan fit the
# Winograd stage constants together with the GEMM constants. None is a layer of
# benchmarks/winograd.py (C,K in 32..512 at 112/56/28/14/7 pixels: r18_l1-l4, vgg_1-8) nor of the
# suite: other channel counts (48, 96/160, 192, 384) and spatial sizes (40, 30, 17, 10), ragged
# for m = 4 and 6, from transform-heavy (few channels, many tiles) to GEMM-heavy with few tiles
# (384 channels at 10x10: N = 4..25 tiles, and at m = 4 a U of 21 MB, past half the host's L3).
# About 32 builds (~1.2 s each on the AVX-512 host) and timings: under a minute added at threads 1,2.
WINOGRAD_TRAINING_SHAPES: tuple[tuple[str, dict, dict], ...] = (
    ("conv2d", dict(c=48, h=40, w=40, k=48, r=3, s=3), dict(pad=1)),
    ("conv2d", dict(c=96, h=30, w=30, k=160, r=3, s=3), dict(pad=1)),
    ("conv2d", dict(c=192, h=17, w=17, k=192, r=3, s=3), dict(pad=1)),
    ("conv2d", dict(c=384, h=10, w=10, k=384, r=3, s=3), dict(pad=1)),
    # Near the choice between m = 2, m = 4 and direct (issue 19: r18_l2 at 128 channels, 28x28 ran
    # fastest at m = 4 and r18_l3 at 256, 14x14 at m = 2, each predicted the other way), so the
    # ranking term has the order of close plans to train on; still no benchmark channel count or
    # size: 120 at 26 (m = 2 and 4 within 1% in the static model; 26 ragged for m = 4 and 6),
    # 144 at 24, 240 at 16, 288 at 12 (3x3 tiles at m = 4, 2x2 at m = 6), and few channels over many
    # tiles (40 at 60). 5 layers x (direct + m = 2, 4, 6) x threads 1,2: 40 more builds and timings,
    # about 50 s more.
    ("conv2d", dict(c=120, h=26, w=26, k=120, r=3, s=3), dict(pad=1)),
    ("conv2d", dict(c=144, h=24, w=24, k=144, r=3, s=3), dict(pad=1)),
    ("conv2d", dict(c=240, h=16, w=16, k=240, r=3, s=3), dict(pad=1)),
    ("conv2d", dict(c=288, h=12, w=12, k=288, r=3, s=3), dict(pad=1)),
    ("conv2d", dict(c=40, h=60, w=60, k=40, r=3, s=3), dict(pad=1)),
    # A transformed filter larger than a 32 MB L3, streamed from DRAM on every call: 480 -> 544
    # channels at 12x12, F(4,3)'s U is 36 x 544 x 480 floats = 38 MB (F(2,3)'s 17 MB). The DRAM
    # stream cap is fitted on it; the layers above keep U on chip or nearly.
    ("conv2d", dict(c=480, h=12, w=12, k=544, r=3, s=3), dict(pad=1)),
    # and with more tiles, where the GEMMs' FMA time and the stream are about equal (F(4,3): 16
    # tiles, U 33 MB; F(2,3): 64 tiles, U 15 MB on chip): how much of the stream they hide
    ("conv2d", dict(c=480, h=15, w=15, k=480, r=3, s=3), dict(pad=1)),
    # and with almost no FMAs beside the stream (F(4,3): 4 tiles, U 38 MB): the stream's own rate,
    # which the two above cannot tell from how much of it shows
    ("conv2d", dict(c=544, h=6, w=6, k=480, r=3, s=3), dict(pad=1)),
)

# The grids the descent walks, per fitted field (values in the field's unit).
GRIDS: dict[str, tuple] = {
    "compute_efficiency": tuple(round(0.40 + 0.02 * i, 2) for i in range(41)),          # 0.40 .. 1.20
    "l2_bytes_per_cycle": (8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0),
    "shared_cache_bytes_per_cycle": (4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0),
    # 0: no chip-wide cap (every core adds its port); else the cap for all cores together
    "shared_cache_chip_bytes_per_cycle": (0.0, 12.0, 16.0, 20.0, 24.0, 28.0, 32.0, 40.0, 48.0, 64.0),
    "dram_efficiency": (0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0),
    "pack_rate_scale": (0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0),
    "depthwise_load_cost": (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0),
    "depthwise_efficiency": tuple(round(0.20 + 0.05 * i, 2) for i in range(21)),     # 0.20 .. 1.20
    "depthwise_stage_scale": (0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0),
    "stage_row_cycles": (0.0, 1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0),
    "parallel_region_s": (0.0, 1e-6, 2e-6, 4e-6, 8e-6, 16e-6),
    "winograd_transform_efficiency": (0.25, 0.35, 0.5, 0.6, 0.7, 0.85, 1.0, 1.2),
    "winograd_store_cycles": (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0),
    "winograd_scalar_cycles": (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0),
    "winograd_group_cycles": (0.0, 4.0, 8.0, 16.0, 32.0, 64.0),
    "winograd_traffic_exposed": (0.0, 0.25, 0.5, 0.75, 1.0),
    # How much of the stream the FMAs hide is the machine's: on the session-28 AVX-512 VM the 1-thread
    # times of layers streaming U added up (1), on the issue-34 Zen 4 VM the stream hid behind the FMAs
    # (544 -> 480 channels at 6x6, F(4,3), U 38 MB: 1.02 ms measured; with the share fixed at 1 the
    # fit ran the rate to the end of its grid and still predicted 1.78 ms). Fitted with the rate
    # (JOINT), each trading off against the other.
    "winograd_stream_exposed": (0.0, 0.25, 0.5, 0.75, 1.0),
    # the Winograd plans' own cache rates (CostConstants.for_winograd), the grids of the direct plans'
    "winograd_l2_bytes_per_cycle": (8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0),
    "winograd_shared_cache_bytes_per_cycle": (4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0),
    # 0: the chip's static rate (moves only plans whose Winograd filter lives in DRAM)
    "winograd_stream_bytes_per_cycle": (0.0, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0, 20.0, 24.0, 32.0),
}
SWEEPS = 4
# The ranking term (module docstring): measured times further apart than this are a clear order,
# and a clear pair costs nothing once predicted in that order by this margin as well.
RANK_MARGIN = 0.03
# Its weight: the hinges are summed over the clear pairs and divided by the operators fitted, so
# a pair predicted 10% the wrong way (a hinge of ~0.13) costs as much as eight operators each off
# by 13%: the fit gives up about a point of mean |error| to order a layer's close plans right
# (issue 19: the choice within 3% of the fastest), while among constants that order every pair
# right the absolute term alone decides.
RANK_WEIGHT = 8.0
# Per grid step away from the static constants (summed over fields): decides flat directions only.
REGULARIZATION = 2e-4
# A multi-threaded operator whose fastest run is no faster than its 1-thread run lost a thread to
# another process in every repeat (it then waits at the barrier): it is timed again, this many times
# at most, and the fastest of all its runs kept.
CONTENDED_RETRIES = 3
# ... unless the model predicts t threads at more than this share of the 1-thread time: then no
# speed-up is expected, and none missing means nothing (the F(4,3) plan of the 544-channel 6x6
# training layer streams its filter from DRAM at the same rate on 1 and 2 threads, unless the
# host's l3_overflow_read_speedup says more threads stream it faster).
SCALING_EXPECTED = 0.8
# Fields whose effects trade off against each other (a slower FMA issue or a slower staging copy
# give the same time for one operator): searched together, every combination of grid values, each
# sweep. The four Winograd transform constants all scale the same two stages: moves of one, two or
# three of them stall in a local minimum (a fit that must lower one while raising the other three),
# and which one the descent reached depended on its path, so they are searched all four at once
# (8 x 8 x 8 x 6 combinations, each re-estimating only the Winograd plans: the exact minimum of
# that block given the other fields, a few seconds a sweep).
JOINT: tuple[tuple[str, ...], ...] = (("depthwise_efficiency", "depthwise_stage_scale"),
                                      ("depthwise_efficiency", "depthwise_load_cost"),
                                      ("shared_cache_bytes_per_cycle", "shared_cache_chip_bytes_per_cycle"),
                                      ("winograd_transform_efficiency", "winograd_store_cycles",
                                       "winograd_scalar_cycles", "winograd_group_cycles"),
                                      # how much traffic shows trades off against how fast the transforms run
                                      ("winograd_traffic_exposed", "winograd_transform_efficiency"),
                                      # a slower stream, hidden more, shows as much as a faster one hidden less
                                      ("winograd_stream_exposed", "winograd_stream_bytes_per_cycle"))

@dataclass(frozen=True)
class Measured:
    """One timed operator: the plan that ran and its median time (weights pre-packed)."""
    spec: OperatorSpec
    threads: int
    plan: CpuKernelPlan
    measured_s: float
    spread: float
    # t > 1 threads and still no faster than 1 thread after CONTENDED_RETRIES: a thread was lost to
    # another process in every repeat; fit() leaves it out (no constant explains a lost core)
    contended: bool = False


@dataclass(frozen=True)
class TrainingCase:
    """One operator to time: its lowering ('direct': the best implicit-GEMM plan; 'winograd' with
    winograd_m: the Winograd plan of that tile size, forced)."""
    spec: OperatorSpec
    lowering: str = "direct"
    winograd_m: Optional[int] = None

    def describe(self) -> str:
        return self.spec.describe() + (f" winograd m={self.winograd_m}" if self.lowering == "winograd" else "")


@dataclass(frozen=True)
class Fit:
    constants: CostConstants
    error_before: float          # mean |predicted / measured - 1| with the static constants
    error_after: float
    worst_before: float
    worst_after: float
    cases: int                   # operators fitted (the contended ones left out)
    left_out: int = 0            # contended operators not fitted
    start: str = "static"        # the start whose descent won: 'static' or 'stored' (this machine's last fit)
    # (pairs predicted in the measured order, clear pairs): plans of one operator at one thread count
    # whose measured times differ by more than RANK_MARGIN
    rank_before: tuple[int, int] = (0, 0)
    rank_after: tuple[int, int] = (0, 0)


def training_specs() -> list[OperatorSpec]:
    return [make_spec(op, shape, **options) for op, shape, options in TRAINING_SHAPES]


def winograd_training_specs() -> list[OperatorSpec]:
    return [make_spec(op, shape, **options) for op, shape, options in WINOGRAD_TRAINING_SHAPES]


def training_cases(winograd: bool = True) -> list[TrainingCase]:
    """What `xfc tiledb calibrate` times: every training spec's direct plan, and (winograd) for each
    Winograd training layer its direct plan and a Winograd plan per admissible tile size."""
    from ..ops.winograd import admissible_tile_sizes
    cases = [TrainingCase(spec) for spec in training_specs()]
    for spec in winograd_training_specs() if winograd else ():
        cases.append(TrainingCase(spec))
        cases += [TrainingCase(spec, "winograd", m) for m in admissible_tile_sizes(spec.c)]
    return cases


def predicted_s(item: Measured, hw: HardwareDescription, cluster: CpuCluster, constants: CostConstants,
                gemm=None) -> float:
    """The cost model's time for the plan that ran, under `constants` (a Winograd plan's GEMM estimate
    given as `gemm` when the caller has it for these constants' non-Winograd fields)."""
    plan = item.plan
    if plan.depthwise is not None:
        return depthwise_estimate(item.spec, hw, cluster, plan.depthwise, plan.vector_lanes, constants).predicted_s
    if plan.lowering == "winograd":
        from ..cpu.winograd import stages_of_plan   # the plan's stages: transforms, tile traffic, GEMMs
        return stages_of_plan(plan, hw, cluster, constants, gemm=gemm).total_s
    g = plan.gemm
    tile = MicroTile(mr=g.mr, nr_vectors=g.nr // plan.vector_lanes, lanes=plan.vector_lanes, a_load_bits=g.a_load_bits)
    score = StaticEvaluator().evaluate(tile, cluster.core, plan.isa)
    return gemm_estimate(item.spec, hw, cluster, tile, score, g, plan.lowering == "implicit_gemm_t",
                         constants).predicted_s


def relative_errors(items: Sequence[Measured], hw, cluster, constants: CostConstants) -> list[float]:
    return [predicted_s(i, hw, cluster, constants) / i.measured_s - 1 for i in items]


def clear_pairs(items: Sequence[Measured], margin: float = RANK_MARGIN) -> list[tuple[int, int]]:
    """(faster, slower) index pairs of plans of one operator at one thread count whose measured
    times differ by more than `margin` (in `items`' order: deterministic)."""
    groups: dict[tuple, list[int]] = {}
    for index, item in enumerate(items):
        groups.setdefault((item.spec, item.threads), []).append(index)
    pairs = []
    for members in groups.values():
        for i, j in itertools.combinations(members, 2):
            fast, slow = (i, j) if items[i].measured_s <= items[j].measured_s else (j, i)
            if items[slow].measured_s > items[fast].measured_s * (1 + margin):
                pairs.append((fast, slow))
    return pairs


def rank_agreement(items: Sequence[Measured], hw, cluster, constants: CostConstants) -> tuple[int, int]:
    """(clear pairs the constants predict in the measured order, clear pairs)."""
    pairs = clear_pairs(items)
    predicted = [predicted_s(i, hw, cluster, constants) for i in items]
    return sum(predicted[slow] > predicted[fast] for fast, slow in pairs), len(pairs)


def _grid_position(grid: Sequence[float], value: float) -> float:
    """Where `value` sits on a sorted grid, in steps (interpolated; clamped past the ends)."""
    if value <= grid[0]:
        return 0.0
    for k in range(1, len(grid)):
        if value <= grid[k]:
            return k - 1 + (value - grid[k - 1]) / (grid[k] - grid[k - 1])
    return float(len(grid) - 1)


def winograd_only(field: str) -> bool:
    """A constant that moves only Winograd plans' predictions (the transform constants, the filter
    stream's rate and how much of it shows, the plans' own cache rates)."""
    return field.startswith("winograd_")


# The Winograd-only fields the GEMM stage of a Winograd plan reads (CostConstants.for_winograd).
WINOGRAD_GEMM_FIELDS = ("winograd_l2_bytes_per_cycle", "winograd_shared_cache_bytes_per_cycle")


def _distance_from_static(constants: CostConstants, pull: str = "winograd") -> float:
    """Grid steps from the static constants, summed over the Winograd-only fields (the ridge the pull
    is for). The GEMM, memory and depthwise fields are not pulled: where the direct plans leave one
    of them flat (the L2 rate, when no training plan is L2-bound), a pull to the static value still
    moves the synthesizer's blocking choices elsewhere (l2_bytes_per_cycle pulled from 96 to 32 on
    the host chose kc=208 for mm_1024, measured 10% slower than the kc=1024 it chose before).
    pull='all' pulls every fitted field (benchmarks/calibration_refit.py tries it: it brought the
    fits of three runs closer together, not their plans nearer the static constants' speed)."""
    return sum(abs(_grid_position(grid, getattr(constants, field))
                   - _grid_position(grid, getattr(DEFAULT_CONSTANTS, field)))
               for field, grid in GRIDS.items() if pull == "all" or winograd_only(field))


class _Objective:
    """The fit's objective over one set of measurements (module docstring). Predictions of the
    non-Winograd plans do not depend on the Winograd-only fields (winograd_only), and the GEMM
    estimates of the Winograd plans only on their cache rates among them (WINOGRAD_GEMM_FIELDS), so
    both are remembered under the other fields' values: the moves of the transform and stream
    constants, most of the descent, re-estimate only the Winograd plans' other stages."""

    def __init__(self, items: Sequence[Measured], hw, cluster, rank_weight: float, regularization: float,
                 pull: str = "winograd"):
        self.items, self.hw, self.cluster = list(items), hw, cluster
        self.rank_weight, self.regularization, self.pull = rank_weight, regularization, pull
        self.pairs = clear_pairs(self.items)
        self.log_measured = [math.log(i.measured_s) for i in self.items]
        self.winograd = [i.plan.lowering == "winograd" for i in self.items]
        self.other_fields = [f for f in DEFAULT_CONSTANTS.as_dict() if not winograd_only(f)]
        self._cache: dict[tuple, list[float]] = {}
        self._scores: dict[CostConstants, float] = {}
        self._gemms: dict[tuple, list] = {}

    def log_predicted(self, constants: CostConstants) -> list[float]:
        key = tuple(getattr(constants, f) for f in self.other_fields)
        others = self._cache.get(key)
        if others is None:
            others = [0.0 if w else math.log(predicted_s(i, self.hw, self.cluster, constants))
                      for i, w in zip(self.items, self.winograd)]
            self._cache[key] = others
        # a Winograd plan's GEMMs move with the other fields and the Winograd plans' cache rates only
        gemm_key = key + tuple(getattr(constants, f) for f in WINOGRAD_GEMM_FIELDS)
        gemms = self._gemms.get(gemm_key)
        if gemms is None:
            from ..cpu.winograd import gemm_of_plan
            gemms = self._gemms[gemm_key] = [gemm_of_plan(i.plan, self.hw, self.cluster, constants) if w else None
                                        for i, w in zip(self.items, self.winograd)]
        return [math.log(predicted_s(i, self.hw, self.cluster, constants, gemm)) if w else o
                for i, w, o, gemm in zip(self.items, self.winograd, others, gemms)]

    def __call__(self, constants: CostConstants) -> float:
        # a descent retries the moves of its last sweep from the same point, and two starts often
        # meet: about half the trial constants repeat, and the objective is a pure function of them
        score = self._scores.get(constants)
        if score is None:
            score = self._scores[constants] = self._score(constants)
        return score

    def _score(self, constants: CostConstants) -> float:
        logs = self.log_predicted(constants)
        absolute = statistics.fmean(abs(p - m) for p, m in zip(logs, self.log_measured))
        rank = 0.0
        if self.pairs and self.rank_weight:
            margin = math.log1p(RANK_MARGIN)
            rank = sum(max(0.0, margin - (logs[slow] - logs[fast])) for fast, slow in self.pairs) / len(logs)
        return absolute + self.rank_weight * rank + self.regularization * _distance_from_static(constants, self.pull)


def _descend(objective: _Objective, start: CostConstants, moves: Sequence[dict]) -> tuple[CostConstants, float]:
    """Coordinate descent from `start` (fixed order of moves, the first of equal improvements wins)."""
    best, best_score = start, objective(start)
    for _ in range(SWEEPS):
        improved = False
        for move in moves:
            trial = replace(best, **move)
            score = objective(trial)
            if score < best_score - 1e-12:
                best, best_score, improved = trial, score, True
        if not improved:
            break
    return best, best_score


def fit(items: Sequence[Measured], hw: HardwareDescription, cluster: CpuCluster,
        start: CostConstants = DEFAULT_CONSTANTS, *, stored: Optional[CostConstants] = None,
        rank_weight: float = RANK_WEIGHT, regularization: float = REGULARIZATION, pull: str = "winograd",
        fixed: Sequence[str] = (), winograd: bool = True) -> Fit:
    """Coordinate descent over GRIDS, and over the JOINT groups together, from `start` and (when
    given and different) from `stored`, this machine's last fitted constants; the lower objective
    wins, `start` on a tie (deterministic). The errors 'before' are those of `start`."""
    if not items:
        raise XfcError("calibrate: no measurements to fit")
    fitted = [i for i in items if not i.contended] or list(items)
    left_out = len(items) - len(fitted)
    items = fitted
    objective = _Objective(items, hw, cluster, rank_weight, regularization, pull)
    moves = [{field: value} for field, grid in GRIDS.items() for value in grid]
    moves += [dict(zip(fields_, values)) for fields_ in JOINT
              for values in itertools.product(*(GRIDS[f] for f in fields_))]
    starts = [("static", start)] + ([("stored", stored)] if stored is not None and stored != start else [])
    if fixed:   # not searched: kept at the start's value
        moves = [move for move in moves if not set(move) & set(fixed)]
        starts = [(name, replace(s, **{f: getattr(start, f) for f in fixed})) for name, s in starts]
    if hw.memory is not None and hw.memory.measured_sustained_read:
        # The probe measured the stream of a filter transform past the cache: the sustained DRAM read
        # is its rate, scaled by the threads where it measured every CPU reading past the L3 faster
        # (cost_model.winograd_stream_bytes_per_second). One fitted rate for every thread count is a
        # coarser form of the same fact: on the Zen 4 VM of session 64 the fit took 10 bytes a cycle
        # (36 GB/s) at 1 and 2 threads alike, and r18_l4 at 2 threads went back to F(2,3), 28% slower
        # than F(4,3) (benchmarks/results/regret_winograd_zen4_2t_s64_calibrated13.json). How much of
        # the stream shows (winograd_stream_exposed) is still fitted.
        moves = [move for move in moves if move.get("winograd_stream_bytes_per_cycle", 0.0) == 0.0]
        starts = [(name, replace(s, winograd_stream_bytes_per_cycle=0.0)) for name, s in starts]
    if not winograd or not any(i.plan.lowering == "winograd" for i in items):
        # not asked for (WINOGRAD_FIT_NOTE), or those fields move no prediction: not searched, and
        # left at the static values (the regularized optimum) whatever the start
        moves = [move for move in moves if not all(winograd_only(f) for f in move)]
        static = {f: v for f, v in DEFAULT_CONSTANTS.as_dict().items() if winograd_only(f)}
        starts = [(name, replace(s, **static)) for name, s in starts]
    # Each start is descended in two stages: the fields that move direct plans, on the direct plans
    # alone (so the GEMM, packing and memory constants are set by the plans they describe, not bent
    # to absorb Winograd transform costs or to order a layer's Winograd plans: a compute efficiency
    # bent first left the transform constants a local minimum 2% of error above the exact fit, and
    # an L2 rate bent by the plan-order term moved the blocking of direct GEMMs), then the
    # Winograd-only fields on every plan, the GEMM stage predicted with the constants of stage one.
    others = [i for i in items if i.plan.lowering != "winograd"]
    staged = 0 < len(others) < len(items)
    first = _Objective(others, hw, cluster, rank_weight, regularization, pull) if staged else None
    winograd_moves = [move for move in moves if all(winograd_only(f) for f in move)]
    other_moves = [move for move in moves if not all(winograd_only(f) for f in move)]
    won, best, best_score = "", start, math.inf
    for name, s in starts:
        if staged:
            s, _ = _descend(first, s, other_moves)
            constants, score = _descend(objective, s, winograd_moves)
        else:
            constants, score = _descend(objective, s, moves)
        if score < best_score - 1e-12:
            won, best, best_score = name, constants, score
    before = [abs(e) for e in relative_errors(items, hw, cluster, start)]
    after = [abs(e) for e in relative_errors(items, hw, cluster, best)]
    return Fit(constants=best, error_before=statistics.fmean(before), error_after=statistics.fmean(after),
               worst_before=max(before), worst_after=max(after), cases=len(items), left_out=left_out,
               start=won, rank_before=rank_agreement(items, hw, cluster, start),
               rank_after=rank_agreement(items, hw, cluster, best))


def measure(hw: HardwareDescription, cluster: CpuCluster, specs: Iterable, threads: Sequence[int],
            *, repeats: int = 15, progress: Callable[[str], None] = lambda message: None,
            constants: CostConstants = DEFAULT_CONSTANTS) -> list[Measured]:
    """Synthesize (with `constants`), build, verify and time each operator at each thread count here.
    specs: OperatorSpecs (their direct plans) or TrainingCases (training_cases)."""
    from ..ops.dtypes import FP32, make_operands
    from ..pipeline import stages
    out = []
    cases = [c if isinstance(c, TrainingCase) else TrainingCase(c) for c in specs]
    total = len(cases) * len(threads)
    predicted_single: dict = {}
    with tempfile.TemporaryDirectory(prefix="xfc-calibrate-") as tmp:
        for index, (case, t) in enumerate(((c, t) for c in cases for t in threads), 1):
            spec = case.spec
            progress(f"[{index}/{total}] {case.describe()} at {t} thread(s)")
            # direct plans, or a Winograd plan of one tile size: the plan that ran is re-estimated
            synthesis = synthesize_cpu(spec, hw, cluster.role, t, constants=constants, lowering=case.lowering,
                                       winograd_m=case.winograd_m)
            plan = synthesis.plan
            built = stages.realize(plan, Path(tmp) / f"k{index}")
            operands = make_operands(spec, FP32, seed=0)
            outcome = stages.verify(built, operands)
            if not outcome.ok:
                raise VerificationError(f"calibrate: {case.describe()}: the kernel differs from the reference "
                                        f"({outcome.check.reason}); not timed")
            samples = stages.run(built, operands, prepacked=True, repeat=repeats, warmup=3).samples_s
            # The fastest run: another process can only slow a run down (badly so for a
            # multi-threaded kernel that waits at barriers for a descheduled thread), so the
            # minimum is the best estimate of what the machine does; the spread shows the noise.
            single = next((m.measured_s for m in reversed(out) if m.spec == spec and m.threads == 1
                           and (m.plan.lowering == "winograd") == (case.lowering == "winograd")
                           and m.plan.winograd_m == plan.winograd_m), None)
            # A plan the model itself expects no faster on t threads (a Winograd filter streamed
            # from DRAM at the chip's rate) is no sign of a lost thread.
            single_predicted = predicted_single.get((spec, case.lowering, plan.winograd_m))
            if t == 1:
                predicted_single[(spec, case.lowering, plan.winograd_m)] = synthesis.estimate.predicted_s
            elif single_predicted is not None and synthesis.estimate.predicted_s > SCALING_EXPECTED * single_predicted:
                single = None
            for _ in range(CONTENDED_RETRIES):
                # Slower on t threads than on one: every repeat lost a thread to another process.
                if t == 1 or single is None or min(samples) < single:
                    break
                progress(f"    {t} threads no faster than 1 ({min(samples) * 1e3:.3f} ms): contended; timing again")
                samples = samples + stages.run(built, operands, prepacked=True, repeat=repeats, warmup=3).samples_s
            fastest = min(samples)
            contended = t > 1 and single is not None and fastest >= single
            if contended:
                progress("    still no faster than 1 thread: left out of the fit")
            out.append(Measured(spec=spec, threads=t, plan=plan, measured_s=fastest,
                                spread=(max(samples) - fastest) / statistics.median(samples), contended=contended))
    return out

# A measurement file (`xfc tiledb calibrate --save-measurements`): what measure() timed, so that a
# change to the fit can be judged on the same times without timing again (--from-measurements), and
# several runs on a noisy machine pooled (the fastest of each operator over the files).
MEASUREMENTS_FORMAT = "xfc-calibration-measurements/1"


def case_of(item: Measured) -> TrainingCase:
    """The training case a measurement timed (a Winograd plan: the case of its tile size)."""
    if item.plan.lowering == "winograd":
        return TrainingCase(item.spec, "winograd", item.plan.winograd_m)
    return TrainingCase(item.spec)


def plan_identity(plan: CpuKernelPlan) -> str:
    """What tells two plans of one operator apart: the decisions of plan_json, and for a Winograd plan
    its tile size and vector axis."""
    from .operators import plan_json
    return canonical_json({"plan": json.loads(plan_json(plan)), "winograd_m": plan.winograd_m,
                           "winograd_vectors": plan.winograd_vectors if plan.lowering == "winograd" else ""})


def measurements_document(items: Sequence[Measured], hw: HardwareDescription, cluster: CpuCluster,
                          repeats: int, compiler: str, measured_at: str) -> dict:
    """The measurements as a JSON-ready document naming the machine (its fingerprint and facts) and the
    compiler that built the kernels."""
    from .fingerprint import cluster_facts
    records = []
    for item in items:
        records.append({"case": case_of(item).describe(), "threads": item.threads, "plan": plan_identity(item.plan),
                        "measured_s": item.measured_s, "spread": item.spread, "contended": item.contended})
    return {"format": MEASUREMENTS_FORMAT, "xfc_version": __version__, "measured_at": measured_at,
            "hardware": hw.name, "cpu": hw.marketing_name, "cores": cluster.count,
            "isa": f"{cluster.core.isa} ({cluster.core.gcc_march}; {', '.join(sorted(cluster.core.features))})",
            "fingerprint": fingerprint(hw, cluster), "facts": cluster_facts(hw, cluster),
            "compiler": compiler, "repeats": repeats, "planned_with": "static constants",
            "records": records}


def read_measurements(paths: Sequence[Path], hw: HardwareDescription, cluster: CpuCluster,
                      warn: Callable[[str], None] = lambda message: None) -> list[Measured]:
    """The measurements of one or more files written by `--save-measurements` on this machine, pooled:
    per training operator and thread count the fastest time over the files (contended only if it was
    in every file). Each plan is synthesized again with the static constants, as measure() planned
    it; a record whose plan xfc no longer synthesizes (xfc changed since) is left out, said through
    `warn`. XfcError for a file that is not one, another machine's, or one naming an operator outside
    the training set."""
    cases = {case.describe(): case for case in training_cases()}
    this_machine = fingerprint(hw, cluster)
    pooled: dict[tuple[str, int], list[dict]] = {}
    for path in paths:
        try:
            document = json.loads(Path(path).read_text())
        except OSError as error:
            raise XfcError(f"--from-measurements {path}: cannot read it ({error.strerror or error})") from None
        except ValueError as error:
            raise XfcError(f"--from-measurements {path}: not JSON ({error})") from None
        if not isinstance(document, dict) or document.get("format") != MEASUREMENTS_FORMAT:
            raise XfcError(f"--from-measurements {path}: not a measurement file of `xfc tiledb calibrate "
                           f"--save-measurements` (format {MEASUREMENTS_FORMAT!r})")
        if document.get("fingerprint") != this_machine:
            raise XfcError(f"--from-measurements {path}: measured on another machine or another description of it "
                           f"({document.get('hardware')!r}, fingerprint {str(document.get('fingerprint'))[:12]}; "
                           f"this host's is {this_machine[:12]}: 'xfc hw show host' shows its figures)")
        for record in document.get("records", []):
            try:
                key = (str(record["case"]), int(record["threads"]))
                seconds, spread = float(record["measured_s"]), float(record.get("spread", 0.0))
                if not (0 < seconds < math.inf and 0 <= spread < math.inf):
                    raise ValueError
            except (AttributeError, KeyError, TypeError, ValueError):
                raise XfcError(f"--from-measurements {path}: a record without case, threads and a positive "
                               f"measured_s: {str(record)[:120]}") from None
            if key[0] not in cases:
                raise XfcError(f"--from-measurements {path}: {key[0]!r} is not one of this xfc's training "
                               "operators (the training set changed since): measure again")
            pooled.setdefault(key, []).append(record)
    out, stale = [], []
    for (described, threads), records in pooled.items():
        case = cases[described]
        plan = synthesize_cpu(case.spec, hw, cluster.role, threads, constants=DEFAULT_CONSTANTS,
                              lowering=case.lowering, winograd_m=case.winograd_m).plan
        timed = [r for r in records if r.get("plan") == plan_identity(plan)]
        if not timed:
            stale.append(f"{described} at {threads} thread(s)")
            continue
        fastest = min(timed, key=lambda r: float(r["measured_s"]))
        out.append(Measured(spec=case.spec, threads=threads, plan=plan, measured_s=float(fastest["measured_s"]),
                            spread=float(fastest.get("spread", 0.0)),
                            contended=all(bool(r.get("contended", False)) for r in timed)))
    if stale:
        warn(f"{len(stale)} of {len(pooled)} measured plans are no longer the plans xfc synthesizes for their "
             f"operators (xfc changed since they were timed); left out: {'; '.join(stale[:3])}"
             + (" ..." if len(stale) > 3 else ""))
    if not out:
        raise XfcError("--from-measurements: no measurement left to fit (every plan changed since): measure again")
    order = {described: index for index, described in enumerate(cases)}
    return sorted(out, key=lambda m: (order[case_of(m).describe()], m.threads))


METHOD = ("coordinate descent over fixed grids minimizing mean |log(predicted/measured)| plus a hinge on each "
          "layer's plan order and a weak pull to the static constants, on {cases} timed "
          "operators outside the suite (threads {threads}; weights pre-packed; fastest of the repeats)")
PREFIX = "cost."


def store_fit(db: TileDb, hw: HardwareDescription, cluster: CpuCluster, result: Fit, threads: Sequence[int]) -> None:
    """Replace this machine's fitted constants for the cluster's fingerprint."""
    subject = fingerprint(hw, cluster)
    origin = db.origin_for("host")
    method = METHOD.format(cases=result.cases, threads=",".join(map(str, threads)))
    conditions = canonical_json({"cost_model": COST_MODEL_VERSION, "error_before": round(result.error_before, 4),
                                 "error_after": round(result.error_after, 4),
                                 "worst_after": round(result.worst_after, 4)})
    now = utc_now()
    rows = [CalibrationRow(subject=subject, name=PREFIX + name, value=float(value), unit="", method=method,
                           source="host", origin=origin, repeats=result.cases, spread=None, conditions=conditions,
                           compiler=hostcc.compiler_version(), xfc_version=__version__, created_at=now)
            for name, value in result.constants.as_dict().items()]
    db.transact(lambda conn: [store_row(conn, "calibration", row, replace=True) for row in rows],
                "store the calibration")


def forget_fit(db: TileDb, hw: HardwareDescription, cluster: CpuCluster) -> int:
    """Remove this machine's fitted constants for the cluster's fingerprint (every form of the model);
    returns the rows removed. Synthesis then predicts with the static constants again."""
    subject = fingerprint(hw, cluster)
    return db.transact(lambda conn: conn.execute("DELETE FROM calibration WHERE subject = ? AND name LIKE ?",
                                                 (subject, PREFIX + "%")).rowcount, "forget the calibration")


def calibrated_constants(db: TileDb, hw: HardwareDescription, cluster: CpuCluster) -> Optional[CostConstants]:
    """The newest fitted constants for this cluster's fingerprint, or None (static constants).
    Constants fitted to another form of the model (COST_MODEL_VERSION) are not used."""
    rows = [row for row in db.rows("calibration", "subject = ? AND name LIKE ?", (fingerprint(hw, cluster), PREFIX + "%"))
            if fitted_model_version(row) == COST_MODEL_VERSION]
    if not rows:
        return None
    newest: dict[str, CalibrationRow] = {}
    for row in rows:
        if row.name not in newest or row.created_at > newest[row.name].created_at:
            newest[row.name] = row
    values = {}
    for name, default in DEFAULT_CONSTANTS.as_dict().items():
        row = newest.get(PREFIX + name)
        if row is not None:
            values[name] = bool(row.value) if isinstance(default, bool) else float(row.value)
    return CostConstants(**values)


def fitted_model_version(row: CalibrationRow) -> int:
    """The cost-model form a calibration row was fitted to (1: before the version was recorded)."""
    try:
        conditions = json.loads(row.conditions)
    except ValueError:
        return 0
    version = conditions.get("cost_model", 1) if isinstance(conditions, dict) else 0
    return version if isinstance(version, int) else 0
