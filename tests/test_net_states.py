"""benchmarks/net_states.py's summaries (issue 32): per network and machine state, and issue 32's two
figures (geometric mean, lowest) across the networks in each state. Pure: nothing is built or timed."""
from __future__ import annotations

import math

import pytest

from support import benchmark_with_siblings

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def net_states():
    # net_states.py imports its siblings as top-level modules
    with benchmark_with_siblings("net_states", ("machine", "cpu_share", "nets"), "xfc_benchmark_net_states") as module:
        yield module


def _round(net, threads, state, xfc_ms, ort_ms):
    return {"net": net, "threads": threads, "state": state, "xfc_ms": xfc_ms, "onnxruntime_ms": ort_ms}


def test_each_network_state_and_thread_count_is_summarized_apart(net_states):
    rounds = [_round("a", 2, "shared cache", 10.0, 12.0), _round("a", 2, "shared cache", 11.0, 12.0),
              _round("a", 2, "shared cache", 30.0, 36.0), _round("a", 2, "separate caches", 20.0, 19.0),
              _round("a", 2, "changed", 5.0, 50.0), _round("b", 2, "shared cache", 4.0, 5.0)]
    rows = net_states.summarize(rounds, [2], ["a", "b"])
    by_key = {(r["net"], r["state"]): r for r in rows}
    assert set(by_key) == {("a", "shared cache"), ("a", "separate caches"), ("b", "shared cache"),
                           ("a", "any"), ("b", "any")}
    assert by_key[("a", "any")]["rounds"] == 5   # every round, the one whose probes disagreed too
    shared = by_key[("a", "shared cache")]
    assert (shared["rounds"], shared["xfc_median_ms"], shared["onnxruntime_median_ms"]) == (3, 11.0, 12.0)
    assert shared["speedup"] == pytest.approx(12.0 / 11.0, abs=1e-4)
    assert by_key[("a", "separate caches")]["speedup"] == pytest.approx(0.95)


def test_the_paired_figure_follows_each_rounds_ratio_when_the_medians_pair_different_states(net_states):
    # xfc's median round and onnxruntime's median round can come from different machine states
    rounds = [_round("a", 2, "shared cache", 4.0, 4.2), _round("a", 2, "shared cache", 4.1, 4.3),
              _round("a", 2, "separate caches", 7.0, 7.5), _round("a", 2, "changed", 7.0, 4.1),
              _round("a", 2, "shared cache", 4.6, 4.6)]
    [row] = [r for r in net_states.summarize(rounds, [2], ["a"]) if r["state"] == "any"]
    assert row["speedup"] == pytest.approx(4.3 / 4.6, abs=1e-4)           # medians of medians: below 1
    assert row["speedup_per_round_median"] == pytest.approx(4.3 / 4.1, abs=1e-4)   # the paired rounds: above
    [o] = [o for o in net_states.across_networks([row], [2], ["a"])]
    assert (o["min_speedup"], o["min_speedup_per_round"]) == (row["speedup"], row["speedup_per_round_median"])


def test_across_networks_gives_the_geomean_and_the_lowest_and_names_the_missing(net_states):
    rounds = [_round("a", 1, "shared cache", 10.0, 12.0), _round("b", 1, "shared cache", 10.0, 9.0),
              _round("c", 1, "shared cache", 10.0, 20.0), _round("a", 1, "separate caches", 10.0, 10.5)]
    summary = net_states.summarize(rounds, [1], ["a", "b", "c"])
    overall = {o["state"]: o for o in net_states.across_networks(summary, [1], ["a", "b", "c"])}
    shared = overall["shared cache"]
    assert shared["networks"] == 3 and shared["missing"] == []
    assert shared["geomean_speedup"] == pytest.approx(math.prod([1.2, 0.9, 2.0]) ** (1 / 3), abs=1e-4)
    assert (shared["min_speedup"], shared["min_net"]) == (0.9, "b")
    assert shared["geomean_speedup_per_round"] == pytest.approx(shared["geomean_speedup"], abs=1e-4)  # one round each
    assert overall["separate caches"]["missing"] == ["b", "c"]
    assert overall["separate caches"]["geomean_speedup"] == pytest.approx(1.05)


def test_steps_by_state_lists_the_steps_that_differ_most_between_the_two_states(net_states):
    """--steps: per network and thread count with rounds in both states, each step's median in either and
    the steps ordered by how much slower they run with separate caches; a network with rounds in one state
    only is left out; the steps' labels come from the emitted manifest."""
    def with_steps(net, state, steps):
        return {**_round(net, 2, state, sum(steps), 1.0), "steps_ms": steps}
    rounds = [with_steps("a", "shared cache", [1.0, 2.0, 3.0]), with_steps("a", "shared cache", [1.2, 2.0, 3.0]),
              with_steps("a", "shared cache", [9.0, 2.0, 3.0]), with_steps("a", "separate caches", [1.1, 2.5, 6.0]),
              with_steps("a", "changed", [50.0, 50.0, 50.0]), with_steps("b", "shared cache", [1.0])]
    [block] = net_states.steps_by_state(rounds, {("a", 2): ["conv", "concat", "resize"], ("b", 2): ["conv"]})
    assert (block["net"], block["threads"]) == ("a", 2)
    assert block["rounds"] == {"shared cache": 3, "separate caches": 1}
    assert [s["what"] for s in block["steps"]] == ["resize", "concat", "conv"]
    assert (block["steps"][0]["shared_cache_ms"], block["steps"][0]["separate_caches_ms"]) == (3.0, 6.0)
    assert block["steps"][2]["shared_cache_ms"] == 1.2           # the median of its three shared rounds
    assert block["steps_sum_ms"] == {"shared cache": 6.2, "separate caches": 9.6}
