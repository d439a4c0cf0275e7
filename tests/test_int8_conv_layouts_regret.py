"""benchmarks/int8_conv_layouts.py's planner regret: per layer, how much slower the planner's variant ran
than the fastest variant of the same run. Pure: nothing is built or timed."""
from __future__ import annotations

import pytest

from support import benchmark_with_siblings

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def layouts():
    with benchmark_with_siblings("int8_conv_layouts", ("machine",), "xfc_benchmark_int8_conv_layouts") as module:
        yield module


def test_planner_regret_per_layer_and_overall(layouts):
    rows = [{"layer": "a", "variant": "planner", "gops": 800.0}, {"layer": "a", "variant": "flat", "gops": 800.0},
            {"layer": "a", "variant": "channels", "gops": 1000.0},
            {"layer": "b", "variant": "planner", "gops": 500.0}, {"layer": "b", "variant": "rows", "gops": 400.0},
            {"layer": "c", "variant": "rows", "gops": 300.0}]      # no planner row: left out
    regret = layouts.planner_regret(rows)
    assert [(r["layer"], r["best_variant"], r["regret"]) for r in regret["layers"]] == [("a", "channels", 0.25),
                                                                                        ("b", "planner", 0.0)]
    assert (regret["mean"], regret["max"]) == (0.125, 0.25)
