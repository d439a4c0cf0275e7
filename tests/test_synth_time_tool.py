"""benchmarks/synth_time.py's per-row medians over fresh processes (unit): rows matched by
description, workload and thread count, every run's cold figure kept, a row missing from a run refused."""
from __future__ import annotations

import pytest

from support import benchmark_with_siblings

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tool():
    with benchmark_with_siblings("synth_time", ("machine",)) as module:
        yield module


def _row(workload, threads, cold, warm=0.15):
    return dict(hw="host", workload=workload, threads=threads, cold_ms=cold, record_ms=1.0,
                warm_min_ms=warm, warm_median_ms=warm + 0.02)


def test_median_rows_over_runs(tool):
    runs = [[_row("mm_512", 1, 2.0), _row("conv_r18_l1", 1, 16.1, warm=0.20)],
            [_row("conv_r18_l1", 1, 8.9), _row("mm_512", 1, 2.4)],
            [_row("mm_512", 1, 2.2), _row("conv_r18_l1", 1, 9.1, warm=0.14)]]
    rows = {r["workload"]: r for r in tool.median_rows(runs)}
    assert rows["conv_r18_l1"]["cold_ms"] == 9.1                  # one disturbed run does not decide
    assert rows["conv_r18_l1"]["cold_runs_ms"] == [16.1, 8.9, 9.1]
    assert rows["conv_r18_l1"]["warm_min_ms"] == 0.14
    assert rows["mm_512"]["cold_ms"] == 2.2


def test_row_missing_from_a_run_is_refused(tool):
    with pytest.raises(SystemExit, match="conv_r18_l1 T1 is missing"):
        tool.median_rows([[_row("mm_512", 1, 2.0), _row("conv_r18_l1", 1, 9.0)], [_row("mm_512", 1, 2.1)]])
