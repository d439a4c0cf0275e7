"""Shared fixtures and the end-of-run coverage report.

- Caches go to a temporary directory: XFC_CACHE_DIR (the OpenCL harness) and POCL_CACHE_DIR are
  set for the whole session, so tests never write under ~/.cache and work with a read-only HOME.
- `server`: the one private adb server fixture (module-scoped, 127.0.0.1, a free port).
- Coverage: tests note what they compiled and ran per ISA / target (tests/support.py `record`);
  pytest_terminal_summary prints per target what was compiled, what ran, and what did not run
  and why, together with the tests skipped for a missing tool. Works under xdist (the records
  travel in the reports' user_properties).
"""
from __future__ import annotations

import os
from collections import Counter, defaultdict

import pytest

import support

KIND_MARKERS = ("unit", "host", "emulated", "opencl", "adb")


@pytest.fixture(scope="session", autouse=True)
def _private_caches(tmp_path_factory):
    """Every cache a test can fill lives under the session's temporary directory."""
    root = tmp_path_factory.mktemp("caches")
    saved = {k: os.environ.get(k) for k in ("XFC_CACHE_DIR", "POCL_CACHE_DIR")}
    os.environ["XFC_CACHE_DIR"] = str(root / "xfc")
    os.environ["POCL_CACHE_DIR"] = str(root / "pocl")
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(autouse=True)
def _coverage_item(request):
    support.set_current_item(request.node)
    if not any(request.node.get_closest_marker(m) for m in KIND_MARKERS):
        request.node.user_properties.append(("xfc_unmarked", request.node.nodeid))
    yield
    support.set_current_item(None)


@pytest.fixture(scope="module")
def server():
    """A private real adb server on a free 127.0.0.1 port, stopped after the module."""
    if not support.HAVE_ADB:
        pytest.skip("no adb binary")
    from android_runner.testbed import AdbServer
    with AdbServer() as srv:
        yield srv


# ---------------------------------------------------------------------------------------------
# Coverage summary
# ---------------------------------------------------------------------------------------------

_records: list[tuple[str, str, str]] = []
_skips: Counter = Counter()
_unmarked: list[str] = []


def pytest_runtest_logreport(report):
    for key, value in getattr(report, "user_properties", ()):
        if key == support.COVERAGE_KEY and report.when == "call":
            _records.append(tuple(value))
        elif key == "xfc_unmarked" and report.when == "setup" and value not in _unmarked:
            _unmarked.append(value)
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skips[reason.removeprefix("Skipped: ")] += 1


def pytest_terminal_summary(terminalreporter):
    tr = terminalreporter
    tr.section("xfc coverage: what was compiled and run where")
    cap = support.host_isa_cap()
    tr.write_line(f"host ISAs run here: {', '.join(support.RUNNABLE_ISAS)}"
                  + (f" (limited by {support.HOST_ISA_ENV}={cap})" if cap else ""))
    compiled, ran = Counter(), Counter()
    reasons: dict[str, Counter] = defaultdict(Counter)
    for target, status, reason in _records:
        compiled[target] += 1
        if status == "ran":
            ran[target] += 1
        else:
            reasons[target][reason] += 1
    order = [*support.ALL_HOST_ISAS, *sorted(t for t in compiled if t not in support.ALL_HOST_ISAS)]
    for target in order:
        if target not in compiled and target in support.ALL_HOST_ISAS:
            tr.write_line(f"  {target:<14} no kernels built in this run")
            continue
        not_run = compiled[target] - ran[target]
        line = f"  {target:<14} compiled {compiled[target]:>4}, ran {ran[target]:>4}"
        if not_run:
            line += f", not run {not_run} (" + "; ".join(f"{r}: {n}" for r, n in reasons[target].items()) + ")"
        tr.write_line(line)
    if _skips:
        tr.write_line("  skipped tests: " + "; ".join(f"{reason} ({n})" for reason, n in _skips.most_common()))
    if _unmarked:
        tr.write_line(f"  {len(_unmarked)} test(s) carry none of the markers {', '.join(KIND_MARKERS)}, "
                      f"e.g. {_unmarked[0]}")
