"""benchmarks/net_plans.py's comparison (unit): a kernel whose plan digest differs is listed with both
tiles lines, a kernel only one side has is named, equal plans list nothing."""
from __future__ import annotations

import pytest

from support import benchmark_with_siblings

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tool():
    with benchmark_with_siblings("net_plans", ("machine", "nets")) as module:
        yield module


def _plan(tiles, digest):
    return dict(lowering="winograd", tiles=tiles, digest=digest)


def test_equal_plans_list_nothing(tool):
    plans = {"resnet18 t1": {"conv a": _plan("m=4 mr=8", "d1")}}
    assert tool.compare(plans, plans) == []


def test_a_moved_plan_and_a_kernel_on_one_side_are_listed(tool):
    before = {"resnet18 t1": {"conv a": _plan("m=4 mr=8", "d1"), "conv b": _plan("mr=6", "d2")}}
    after = {"resnet18 t1": {"conv a": _plan("m=4 mr=9", "d3"), "conv c": _plan("mr=6", "d4")}}
    lines = tool.compare(before, after)
    assert len(lines) == 3
    assert "before winograd m=4 mr=8" in lines[0] and "after  winograd m=4 mr=9" in lines[0]
    assert lines[1] == "resnet18 t1: conv b: only before" and lines[2] == "resnet18 t1: conv c: only after"


def test_the_digest_covers_every_plan_field(tool):
    from dataclasses import dataclass, replace

    @dataclass(frozen=True)
    class Plan:
        mr: int
        prefetch: int

    assert tool.plan_digest(Plan(8, 0)) != tool.plan_digest(replace(Plan(8, 0), prefetch=2))
    assert tool.plan_digest(Plan(8, 0)) == tool.plan_digest(Plan(8, 0))
