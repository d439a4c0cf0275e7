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
@pytest.mark.matrix(every=3)
@pytest.mark.parametrize("case", range(30))
def test_grid(case):
    assert case >= 0
'''


def _run(tmp_path, *args, env=None):
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    env = {**os.environ, **(env or {}),
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-c",
                           str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), "-rA", *args, str(tmp_path)],
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
    sample = _run(tmp_path, "-m", "matrix", env={"XFC_TEST_MATRICES": ""})
    again = _run(tmp_path, "-m", "matrix", env={"XFC_TEST_MATRICES": ""})
    ran = _outcomes(sample.stdout)
    assert ran == _outcomes(again.stdout) and set(ran.values()) == {"PASSED"}   # the same cases each run
    assert 5 <= len(ran) <= 15, ran                     # about one in three of 30 (by the ids' digests)
    assert f"the sample is {len(ran)} of the 30 cases collected" in sample.stdout
    full = _outcomes(_run(tmp_path, "-m", "matrix", env={"XFC_TEST_MATRICES": "full"}).stdout)
    assert sorted(full) == sorted(f"test_grid[{i}]" for i in range(30))
