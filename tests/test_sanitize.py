"""A small subset of `make sanitize`: edge-case kernels under ASan + UBSan for one host ISA.

The full target (scripts/sanitize.py: every edge case, every host ISA, 1-3 threads) runs
outside CI and writes benchmarks/results/sanitize.json.
"""
from __future__ import annotations

import shutil

import pytest

from xfc.toolchain.tools import HOST_CC
from xfc.testing.mutants import mutate
from xfc.testing.sanitize import EDGE_CASES, SANITIZE_FLAGS, host_isas, run_all, sanitize_case

pytestmark = [pytest.mark.host,
              pytest.mark.skipif(shutil.which(HOST_CC) is None, reason="no host gcc")]

CASES = {c.name: c for c in EDGE_CASES}
SUBSET = ["mm_ragged_tiles", "conv_stride2_asym_pad", "conv_transposed_packed", "dw_ragged", "dw_stride2_long_rows",
          "conv_stride2_long_rows", "conv_pointwise_transposed_spanning"]
ISA = host_isas()[0]


def fault(name):
    return lambda rendered: mutate(rendered, name)


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("sanitize")


@pytest.mark.parametrize("name", SUBSET)
def test_edge_case_is_clean_under_asan_and_ubsan(work_dir, name):
    results = sanitize_case(CASES[name], ISA, 2, work_dir)
    assert [r.entry for r in results] == ["per-call", "pre-packed"]
    assert all(r.clean for r in results), [r.detail for r in results]


def test_an_overflow_inside_kernel_scratch_is_caught_only_by_the_sanitizer(work_dir):
    """Positive control: the staging scratch allocated one block short. Guards cannot see it
    (the scratch is the kernel's own); the sanitized build must."""
    results = sanitize_case(CASES["dw_ragged"], ISA, 1, work_dir, fault=fault("scratch_too_small"))
    assert not any(r.clean for r in results)
    assert all("AddressSanitizer: heap-buffer-overflow" in r.detail for r in results), [r.detail for r in results]


def test_a_guard_violation_is_reported_by_the_sanitized_harness_too(work_dir):
    results = sanitize_case(CASES["mm_ragged_tiles"], ISA, 1, work_dir, fault=fault("tail_store_mr_rows"))
    assert all(not r.clean and "past the end of out" in r.detail for r in results)


def test_run_all_summary_shape(work_dir):
    summary = run_all([ISA], [CASES["mm_1x1x1"]], threads=(3,), work_dir=work_dir)
    assert summary["clean"] is True and summary["runs"] == 2 and summary["not_clean"] == []
    assert summary["isas"] == [ISA] and "-fsanitize=address,undefined" in summary["flags"]
    assert "-fno-sanitize-recover=all" in SANITIZE_FLAGS
