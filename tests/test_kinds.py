"""The test kinds of tests/conftest.py, checked on a throwaway test directory run by a child pytest:
a function's own kind marker overrides its module's `pytestmark`, and an in-process test (unit,
sweep) that starts a process (a compiler here) fails, also when it catches the error, and also
when the process starts in a module-scoped fixture."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

SAMPLE = '''
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit
CC = [sys.executable, "-c", "pass"]   # stands for gcc: any program counts


def test_pure():
    assert sum(range(4)) == 6


@pytest.mark.host
def test_builds():
    assert subprocess.run(CC, timeout=60).returncode == 0


def test_compiles_unnoticed():
    subprocess.run(CC, timeout=60)


def test_swallows_the_error():
    try:
        subprocess.run(CC, timeout=60)
    except Exception:
        pass


@pytest.fixture(scope="module")
def built():
    subprocess.run(CC, timeout=60)


def test_through_a_module_fixture(built):
    pass


@pytest.mark.sweep
@pytest.mark.parametrize("n", [1, 2])
def test_sweep(n):
    assert n


@pytest.mark.sweep
@pytest.mark.matrix(every=3, cover=())
@pytest.mark.parametrize("case", range(30))
def test_grid(case):
    assert case >= 0


@pytest.mark.sweep
@pytest.mark.matrix(every=3)
@pytest.mark.parametrize("side", ["p", "q", "r"])
@pytest.mark.parametrize("size", range(6))
def test_pairs(size, side):
    assert size >= 0 and side
'''


def _run(tmp_path, *args, env=None, target=None):
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    env = {**os.environ, **(env or {}),
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-c",
                           str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), "-rA", *args,
                           target or str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)


def _outcomes(stdout: str) -> dict[str, str]:
    """test name -> PASSED / FAILED / ERROR from the -rA summary."""
    found = {}
    for line in stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "ERROR") and "::" in rest:
            found[rest.split("::", 1)[1].split(" ", 1)[0]] = word
    return found


def test_unit_selects_only_in_process_tests_and_refuses_processes(tmp_path):
    proc = _run(tmp_path, "-m", "unit")
    assert _outcomes(proc.stdout) == {"test_pure": "PASSED", "test_compiles_unnoticed": "FAILED",
                                      "test_swallows_the_error": "FAILED",
                                      "test_through_a_module_fixture": "ERROR"}, proc.stdout + proc.stderr
    assert proc.stdout.count("runs in-process (unit) but started") >= 3


def test_own_kind_marker_overrides_the_module(tmp_path):
    host = _outcomes(_run(tmp_path, "-m", "host").stdout)
    assert host == {"test_builds": "PASSED"}
    sweep = _outcomes(_run(tmp_path, "-m", "sweep and not matrix").stdout)
    assert sweep == {"test_sweep[1]": "PASSED", "test_sweep[2]": "PASSED"}


def test_a_matrix_runs_a_fixed_sample_and_all_of_it_on_request(tmp_path):
    no_env = {"XFC_TEST_MATRICES": ""}
    sample = _run(tmp_path, "-m", "matrix", env=no_env)
    ran = _outcomes(sample.stdout)
    assert ran == _outcomes(_run(tmp_path, "-m", "matrix", env=no_env).stdout)   # the same cases each run
    assert set(ran.values()) == {"PASSED"}
    grid = [n for n in ran if n.startswith("test_grid[")]
    assert 5 <= len(grid) <= 15, grid                   # about one in three of 30, by the ids' digests
    pairs = [n[len("test_pairs["):-1].split("-") for n in ran if n.startswith("test_pairs[")]
    # every value of each parameter keeps a case (cover defaults to all), yet not all 18 run
    assert {s for s, _ in pairs} == set(map(str, range(6))) and {p for _, p in pairs} == {"p", "q", "r"}
    assert len(pairs) < 18, pairs
    assert f"matrices: {len(ran)} sampled case(s) selected, {48 - len(ran)} left out by the sample" in sample.stdout
    full = _outcomes(_run(tmp_path, "-m", "matrix", env={"XFC_TEST_MATRICES": "full"}).stdout)
    assert len(full) == 48 and {f"test_grid[{i}]" for i in range(30)} <= set(full)
    # a case named on the command line runs even when the sample leaves it out
    left_out = next(f"test_grid[{i}]" for i in range(30) if f"test_grid[{i}]" not in ran)
    named = _run(tmp_path, env=no_env, target=f"{tmp_path / 'test_sample.py'}::{left_out}")
    assert _outcomes(named.stdout) == {left_out: "PASSED"}, named.stdout
