"""Shared fixtures and the end-of-run coverage report.

- Caches go to a temporary directory: XFC_CACHE_DIR (the OpenCL harness) and POCL_CACHE_DIR are
  set for the whole session, so tests never write under ~/.cache and work with a read-only HOME.
- `server`: the one private adb server fixture (module-scoped, 127.0.0.1, a free port).
- Kinds (markers registered in pyproject.toml): a test's own kind marker (decorator or
  pytest.param marks) overrides its class's or module's `pytestmark`, so one subprocess test in a
  unit module is `subprocess` only and `pytest -m unit` leaves it out (pytest_collection_modifyitems).
- A `unit` or `sweep` test starts no process: starting one (a compiler, qemu, adb, a PoCL
  harness, even python) fails the test with one line naming the program; such a test is
  subprocess, host, emulated, opencl or adb.
- Parsed hardware descriptions are remembered for the test process (_remember_parsed_descriptions).
- The test process may write bytecode whatever PYTHONDONTWRITEBYTECODE says, so pytest keeps its
  assertion-rewritten test modules between runs (see below).
- Coverage: tests note what they compiled and ran per ISA / target (tests/support `record`);
  pytest_terminal_summary prints per target what was compiled, what ran, and what did not run
  and why, together with the tests skipped for a missing tool. Works under xdist (the records
  travel in the reports' user_properties).
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib
import os
import subprocess
import sys
from collections import Counter, defaultdict

import pytest

import support

# pytest keeps a test module's assertion-rewritten bytecode (in its __pycache__, git-ignored) only
# where Python may write bytecode. Under PYTHONDONTWRITEBYTECODE=1 (set in this project's machines)
# every worker rewrote all ~80 test modules on every run, most of the ~7 s a worker spends
# collecting; `pytest -m unit -n 2` went from 29-35 s to 25-28 s on later runs.
sys.dont_write_bytecode = False

KIND_MARKERS = ("unit", "sweep", "subprocess", "host", "emulated", "opencl", "adb")
IN_PROCESS_KINDS = ({"unit"}, {"sweep"})   # pure Python in the test process: no process may start


def _kinds(node) -> set[str]:
    return {m.name for m in node.own_markers if m.name in KIND_MARKERS}


# Exhaustive matrices (random shapes, tile and ISA grids): a test marked `matrix(every=N)` runs
# about one case in N under `make test`: those whose id's digest is 0 mod N (the same cases on every
# run and machine), plus, in collection order, any case that brings a value of a parameter no kept
# case has (`cover`: the parameters whose every value must run; default all of them, () for a list
# of random shapes). XFC_TEST_MATRICES=full runs every case (`make test-matrices`, results in
# benchmarks/results/test_matrices.json), and so does naming a case on the command line. The
# terminal summary says how many cases the sample left out.
FULL_MATRICES = os.environ.get("XFC_TEST_MATRICES", "") == "full"
MATRIX_KEY = "xfc_matrix_sample"
_LEFT_OUT = pytest.StashKey[int]()                 # cases the sample left out, kept on the config
_matrix_sample: dict[str, tuple[int, int]] = {}   # {"run": (matrix cases selected, cases the sample left out)}


def _digest_kept(item, every: int) -> bool:
    return int(hashlib.sha256(item.name.encode()).hexdigest(), 16) % every == 0


def _matrix_values(item, mark) -> set:
    params = getattr(getattr(item, "callspec", None), "params", {})
    cover = mark.kwargs.get("cover")
    names = sorted(params) if cover is None else [n for n in cover if n in params]
    return {(n, repr(params[n])) for n in names}


def _matrix_sample_of(items, explicit: set) -> tuple[list, list]:
    """(kept, left out) of the items, by the rule above; items named on the command line are kept."""
    decided: dict[int, bool] = {}
    by_test: dict[tuple, list] = defaultdict(list)
    for item in items:
        mark = item.get_closest_marker("matrix")
        every = int(mark.kwargs.get("every", 1)) if mark else 1
        if FULL_MATRICES or every <= 1 or item.nodeid in explicit:
            decided[id(item)] = True
        else:
            decided[id(item)] = _digest_kept(item, every)
            by_test[(item.path, item.originalname)].append((item, mark))
    for cases in by_test.values():
        covered = set().union(*(_matrix_values(i, m) for i, m in cases if decided[id(i)]))
        for item, mark in cases:
            values = _matrix_values(item, mark)
            if not decided[id(item)] and not values <= covered:
                decided[id(item)] = True
                covered |= values
    kept = [i for i in items if decided[id(i)]]
    return kept, [i for i in items if not decided[id(i)]]


def _named_cases(config) -> set:
    """Node ids of parametrized cases given on the command line (path as collected, then ::name[id])."""
    named = set()
    for arg in config.args:
        path, sep, rest = str(arg).partition("::")
        if sep and "[" in rest:
            try:
                rel = os.path.relpath(os.path.abspath(path), str(config.rootpath)).replace(os.sep, "/")
            except ValueError:
                continue
            named.add(f"{rel}::{rest}")
    return named


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Resolve every test's kind before `-m` selects: its own kind markers if it has any, else the
    nearest enclosing class's or module's. The kind markers of classes and modules are then moved
    onto their tests, so a module's `pytestmark = pytest.mark.unit` does not also select, under
    `-m unit`, a test of that module decorated `@pytest.mark.subprocess` or `@pytest.mark.host`.
    Then the cases of exhaustive matrices that `make test` does not run are left out (above)."""
    parents = set()
    for item in items:
        if not _kinds(item):
            inherited = next((k for node in item.iter_parents() if (k := _kinds(node))), set())
            for name in sorted(inherited):
                item.add_marker(name)
        parents.update(n for n in item.iter_parents() if n is not item)
    for node in parents:
        node.own_markers[:] = [m for m in node.own_markers if m.name not in KIND_MARKERS]
    kept, left_out = _matrix_sample_of(items, _named_cases(config))
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept
        config.stash[_LEFT_OUT] = len(left_out)


def pytest_collection_finish(session):
    """After -m and -k: the matrix cases that will run, and what the sample left out, travel to the
    terminal summary with the reports, as the coverage records do (xdist)."""
    left_out = session.config.stash.get(_LEFT_OUT, 0)
    in_matrices = [i for i in session.items if i.get_closest_marker("matrix")]
    for item in in_matrices:
        item.user_properties.append((MATRIX_KEY, (len(in_matrices), left_out)))


class StartedProcess(Exception):
    """An in-process (unit or sweep) test started a process."""


@contextlib.contextmanager
def _no_process_starts(item):
    """Any process started inside the block (subprocess.Popen/run, os.system, os.posix_spawn[p],
    os.fork) raises StartedProcess naming the test and the program, and the phase fails even when
    the code under test caught the exception."""
    kind, started = min(_kinds(item)), []

    def refuse(argv):
        what = " ".join(map(str, argv[:4])) if isinstance(argv, (list, tuple)) else str(argv)
        started.append(what)
        raise StartedProcess(f"{item.nodeid} runs in-process ({kind}) but started {what}; mark it "
                             "subprocess, host, emulated, opencl or adb (tests/conftest.py)")

    def execute_child(self, args, *rest, **kwargs):
        refuse(list(args) if isinstance(args, (list, tuple)) else [args])

    patches = [(subprocess.Popen, "_execute_child", execute_child), (os, "system", refuse),
               (os, "posix_spawn", lambda path, argv, *a, **k: refuse(list(argv))),
               (os, "posix_spawnp", lambda path, argv, *a, **k: refuse(list(argv))),
               (os, "fork", lambda: refuse("os.fork()"))]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, replacement in patches:
        setattr(owner, name, replacement)
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
    if started:
        raise StartedProcess(f"{item.nodeid} runs in-process ({kind}) but started {started[0]}")


def _guarded(item):
    return _no_process_starts(item) if _kinds(item) in IN_PROCESS_KINDS else contextlib.nullcontext()


# Setup covers the fixtures a test is the first to need, module- and session-scoped ones included.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _guarded(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _guarded(item):
        return (yield)


_HARDWARE_LOAD = importlib.import_module("xfc.hardware.load")   # (xfc.hardware.load is also a function's name)
_READ_YAML = _HARDWARE_LOAD.read_yaml


def _remember_parsed_descriptions():
    """xfc.hardware.load.read_yaml parses with PyYAML's pure-Python loader, 10-30 ms a file, and the
    suite reads the 33 shipped descriptions about a thousand times (every load, validation and
    `xfc hw` command resolves a file's references again): a fifth of `pytest -m unit`. In a test
    process, read_yaml's result is remembered under what it depends on (the path as given, the
    working directory and the file's bytes) and a deep copy returned, so a caller may change it.
    A failure is not remembered (it is raised afresh each time), and a path that is not a regular
    file of at most MAX_FILE_BYTES goes straight to read_yaml (which refuses it before reading)."""
    memo: dict = {}

    def read_yaml(path):
        try:
            ok = path.is_file() and path.stat().st_size <= _HARDWARE_LOAD.MAX_FILE_BYTES
            key = (str(path), os.getcwd(), path.read_bytes()) if ok else None
        except OSError:
            key = None
        if key is None:
            return _READ_YAML(path)
        if key not in memo:
            memo[key] = _READ_YAML(path)
        return copy.deepcopy(memo[key])

    return read_yaml


def pytest_configure(config):
    _HARDWARE_LOAD.read_yaml = _remember_parsed_descriptions()   # collection reads descriptions too


def pytest_unconfigure(config):
    _HARDWARE_LOAD.read_yaml = _READ_YAML


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
        elif key == MATRIX_KEY:
            _matrix_sample["run"] = tuple(value)   # every worker collects the same items: one value
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
    compiled, ran, sampled_out = Counter(), Counter(), Counter()
    reasons: dict[str, Counter] = defaultdict(Counter)
    for target, status, reason in _records:
        if status == "sampled out":    # support.compile_if_sampled: neither compiled nor run
            sampled_out[(target, reason)] += 1
            continue
        compiled[target] += 1
        if status == "ran":
            ran[target] += 1
        else:
            reasons[target][reason] += 1
    order = [*support.ALL_HOST_ISAS, *sorted(t for t in compiled if t not in support.ALL_HOST_ISAS)]
    built = set(compiled) | {t for t, _ in sampled_out}   # all sampled out: still built for
    for target in order:
        if target not in built:
            tr.write_line(f"  {target:<14} no kernels built in this run")
            continue
        not_run = compiled[target] - ran[target]
        line = f"  {target:<14} compiled {compiled[target]:>4}, ran {ran[target]:>4}"
        if not_run:
            line += f", not run {not_run} (" + "; ".join(f"{r}: {n}" for r, n in reasons[target].items()) + ")"
        line += "".join(f"; {n} more not compiled ({r})" for (t, r), n in sampled_out.items() if t == target)
        tr.write_line(line)
    if "run" in _matrix_sample:
        run, left_out = _matrix_sample["run"]
        tr.write_line(f"  matrices: {run} sampled case(s) selected, {left_out} left out by the sample "
                      "(all: XFC_TEST_MATRICES=full, make test-matrices)")
    if _skips:
        tr.write_line("  skipped tests: " + "; ".join(f"{reason} ({n})" for reason, n in _skips.most_common()))
    if _unmarked:
        tr.write_line(f"  {len(_unmarked)} test(s) carry none of the markers {', '.join(KIND_MARKERS)}, "
                      f"e.g. {_unmarked[0]}")


# xfc's CLI tests send SIGINT to child processes, which inherit the worker's signal dispositions
# and blocked mask: a test that leaves SIGINT/SIGTERM ignored or blocked breaks every later one.
@pytest.fixture(autouse=True)
def _signals_left_as_found(request):
    import signal
    before = (signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, []))
    yield
    after = (signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, []))
    assert after == before, (f"{request.node.nodeid} changed the SIGINT handler or the blocked signals: "
                             f"{before} -> {after}")
