"""The GEMM thread split as the kernels deal it (cost_model.share_imbalance): contiguous runs of
NR (or MR) panels per thread, the last panel short, each share padded to whole vectors."""
from __future__ import annotations

import pytest

from xfc.cpu.cost_model import share_imbalance, split_imbalance

pytestmark = pytest.mark.unit


def _shares(extent, step, threads):
    """The kernels' split (templates/cpu/gemm.c.j2, winograd.c.j2): panels * t / T."""
    panels = -(-extent // step)
    return [min(extent, panels * (t + 1) // threads * step) - min(extent, panels * t // threads * step)
            for t in range(threads)]


def test_a_short_last_panel_is_not_counted_as_a_full_one():
    # 49 Winograd tiles in NR = 16 panels on 2 threads: 32 and 17 columns (17 padded to 24 lanes)
    assert _shares(49, 16, 2) == [32, 17]
    assert share_imbalance(49, 16, 2, 8) == pytest.approx(32 * 2 / (32 + 24))
    assert split_imbalance(4, 2) == 1.0          # the panel count alone sees an even split


def test_even_splits_and_one_thread_are_balanced():
    assert share_imbalance(784, 16, 1, 16) == 1.0
    assert share_imbalance(128, 8, 2) == 1.0
    assert share_imbalance(64, 4, 4) == 1.0


def test_more_threads_than_panels_leave_threads_idle():
    assert _shares(16, 32, 2) == [0, 16]
    assert share_imbalance(16, 32, 2, 16) == pytest.approx(2.0)


@pytest.mark.parametrize("extent, step, threads, unit", [(100, 12, 3, 1), (784, 48, 2, 16), (130, 13, 4, 1),
                                                         (1000, 32, 8, 16)])
def test_matches_the_kernels_split(extent, step, threads, unit):
    shares = [-(-s // unit) * unit for s in _shares(extent, step, threads)]
    assert share_imbalance(extent, step, threads, unit) == pytest.approx(max(shares) * threads / sum(shares))
