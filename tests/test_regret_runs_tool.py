"""benchmarks/regret_runs.py's bookkeeping (unit): rows matched across runs by layer and thread count,
the per-row median and the runs over issue 34's target, rows whose plans differ kept out of the
summary, and runs of another machine or other constants refused."""
from __future__ import annotations

import pytest

from support import benchmark_with_siblings

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tool():
    with benchmark_with_siblings("regret_runs", ("machine", "cpu_share", "regret")) as module:
        yield module


def _run(regrets: dict, fingerprint="abc", chosen=None, constants=None):
    chosen = chosen or {}
    return {"host_figures": {"fingerprint": fingerprint}, "constant_values": constants or {"l2_bytes_per_cycle": 32.0},
            "winograd_rows": [{"layer": layer, "set": "fitting" if layer.startswith("f") else "held-out",
                               "threads": threads, "regret": regret, "null_regret": 0.01,
                               "chosen": chosen.get((layer, threads), "plan A"), "fastest": "kc/2"}
                              for (layer, threads), regret in regrets.items()]}


def test_median_runs_over_target_and_summary(tool):
    runs = [("a", _run({("f1", 1): 0.00, ("f2", 1): 0.09, ("h1", 2): 0.07, ("h2", 1): 0.01})),
            ("b", _run({("f1", 1): 0.06, ("f2", 1): 0.08, ("h1", 2): 0.09, ("h2", 1): 0.0},
                       chosen={("h2", 1): "plan B"})),
            ("c", _run({("f1", 1): 0.01, ("f2", 1): 0.07, ("h1", 2): 0.01}))]   # h2 missing in c
    rows = {(r["layer"], r["threads"]): r for r in tool.combine(runs)}
    assert set(rows) == {("f1", 1), ("f2", 1), ("h1", 2)}   # h2 is not in every run
    assert rows[("f1", 1)]["median"] == pytest.approx(0.01) and rows[("f1", 1)]["runs_over_target"] == 1
    assert rows[("f2", 1)]["median"] == pytest.approx(0.08) and rows[("f2", 1)]["runs_over_target"] == 3
    assert rows[("h1", 2)]["runs_over_target"] == 1        # 2 threads: 8% is the line, 9% is over it
    s = tool.summary(list(rows.values()), runs=3)
    assert s["fitting 1T"]["median_max"] == pytest.approx(0.08) and s["fitting 1T"]["median_max_layer"] == "f2"
    assert s["fitting 1T"]["median_mean"] == pytest.approx(0.045)
    assert [r["max"] for r in s["fitting 1T"]["single_runs"]] == pytest.approx([0.09, 0.08, 0.07])


def test_rows_whose_runs_chose_other_plans_are_left_out(tool):
    runs = [("a", _run({("f1", 1): 0.0, ("f2", 1): 0.2})),
            ("b", _run({("f1", 1): 0.0, ("f2", 1): 0.2}, chosen={("f2", 1): "plan B"}))]
    s = tool.summary(tool.combine(runs), runs=2)
    assert s["fitting 1T"]["layers"] == 1 and s["fitting 1T"]["differs"] == ["f2"]
    assert s["fitting 1T"]["median_max"] == 0.0


@pytest.mark.parametrize("other", [dict(fingerprint="xyz"), dict(constants={"l2_bytes_per_cycle": 16.0})])
def test_runs_of_another_experiment_are_refused(tool, other):
    with pytest.raises(tool.RunsDiffer, match="b:"):
        tool.check_same_experiment([("a", _run({("f1", 1): 0.0})), ("b", _run({("f1", 1): 0.0}, **other))])
    tool.check_same_experiment([("a", _run({("f1", 1): 0.0})), ("b", _run({("f1", 1): 0.1}))])
