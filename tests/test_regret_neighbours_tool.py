"""benchmarks/regret_neighbours.py's bookkeeping (unit): per row the chosen plan's predicted and measured
ratio to one neighbour (matched by label prefix), ties only on request, and the summary's counts."""
from __future__ import annotations

import pytest

from support import benchmark_with_siblings

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tool():
    with benchmark_with_siblings("regret_neighbours", ("machine",)) as module:
        yield module


def _row(layer, chosen, neighbour, label="nr-16"):
    return {"layer": layer, "set": "held-out", "threads": 1, "plans": [
        {"label": "chosen", "plan": "wide", "predicted_ms": chosen[0], "measured_ms": chosen[1]},
        {"label": label, "plan": "narrow", "predicted_ms": neighbour[0], "measured_ms": neighbour[1]},
        {"label": "mr+1", "plan": "taller", "predicted_ms": 9.0, "measured_ms": 0.1}]}


def test_ratios_ties_and_the_summary(tool):
    data = {"winograd_rows": [_row("tied_slower", (1.0, 1.1), (1.0, 1.0)),
                              _row("tied_faster", (2.0, 1.8), (2.0, 2.0)),
                              _row("not_tied", (1.0, 1.0), (1.2, 1.3)),
                              _row("no_neighbour", (1.0, 1.0), (1.0, 1.0), label="kc/2")]}
    rows = tool.neighbour_rows(data, "nr-16", ties_only=False)
    assert [r["layer"] for r in rows] == ["tied_slower", "tied_faster", "not_tied"]
    assert rows[0]["measured_ratio"] == pytest.approx(1.1) and rows[2]["predicted_ratio"] == pytest.approx(1 / 1.2, abs=1e-4)
    tied = tool.neighbour_rows(data, "nr-16", ties_only=True)
    assert [r["layer"] for r in tied] == ["tied_slower", "tied_faster"]
    summary = tool.summary(tied)
    assert summary["rows"] == 2 and summary["neighbour_faster"] == 1
    assert summary["geomean_measured_ratio"] == pytest.approx((1.1 * 0.9) ** 0.5, abs=1e-4)
    assert tool.summary([]) == {"rows": 0}
