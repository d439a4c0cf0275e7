"""benchmarks/winograd_refit.py's bookkeeping (unit): a re-planned plan's regret is read from the
timed row it is looked up in, the twin never counts as the fastest, a plan the row did not time is
'untimed' and out of the means, and a grid names CostConstants fields only."""
from __future__ import annotations

import pytest

from support import benchmark_with_siblings

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def winograd_refit():
    """The script, with its sibling imports (machine, cpu_share, regret) in sys.modules for the module."""
    with benchmark_with_siblings("winograd_refit", ("machine", "cpu_share", "regret")) as module:
        yield module

def test_a_replanned_plan_is_judged_by_the_row_that_timed_it(winograd_refit):
    row = {"layer": "x", "set": "fitting", "threads": 2, "plans": [
        {"label": "chosen", "plan": "A", "measured_ms": 1.2},
        {"label": "kc/2", "plan": "B", "measured_ms": 1.0},
        {"label": winograd_refit.TWIN, "plan": "A", "measured_ms": 0.9}]}
    assert winograd_refit.row_regret(row, "A") == (pytest.approx(0.2), True)
    assert winograd_refit.row_regret(row, "B") == (0.0, True)
    assert winograd_refit.row_regret(row, "C") == (None, False)


def test_untimed_plans_are_counted_and_left_out_of_the_means(winograd_refit):
    results = [{"set": "fitting", "threads": 2, "regret": 0.2}, {"set": "fitting", "threads": 2, "regret": None},
               {"set": "fitting", "threads": 2, "regret": 0.0}, {"set": "held-out", "threads": 1, "regret": None}]
    summary = winograd_refit.summarize(results)
    assert summary["fitting 2T"] == {"layers": 3, "untimed": 1, "mean": pytest.approx(0.1), "max": 0.2}
    assert summary["held-out 1T"] == {"layers": 1, "untimed": 1, "mean": None, "max": None}


def test_the_grid_names_constants_fields(winograd_refit):
    names = {"winograd_cold_stream_efficiency", "winograd_cold_stream_exposed"}
    assert winograd_refit.parse_grid(["winograd_cold_stream_efficiency=0.5,1"], names) == {
        "winograd_cold_stream_efficiency": [0.5, 1.0]}
    for bad in ("no_such_field=1", "winograd_cold_stream_exposed", "winograd_cold_stream_exposed="):
        with pytest.raises(ValueError, match="CostConstants field"):
            winograd_refit.parse_grid([bad], names)
