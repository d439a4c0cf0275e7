"""`xfc synth --verify` exits 4 with one line when the kernel is wrong, and keeps its outputs.

The wrong kernels come from the test-only fault injection XFC_TEST_MUTANT (xfc/testing/mutants.py,
read only through xfc/settings.py, applied in xfc/pipeline.py), run through the real console script in a subprocess.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from xfc.toolchain.tools import ARM_CC, QEMU

XFC = shutil.which("xfc", path=str(Path(sys.executable).parent)) or "xfc"
HAVE_ARM = shutil.which(ARM_CC) is not None and shutil.which(QEMU) is not None
SHAPE = ["--shape", "m=37,n=45,k=70,batch=2", "--bias", "--activation", "relu"]   # M prime: a row tail for any MR


def synth(hw: str, out: Path, mutant: str | None):
    env = {k: v for k, v in os.environ.items() if k not in ("XFC_DEBUG", "XFC_TEST_MUTANT")}
    if mutant:
        env["XFC_TEST_MUTANT"] = mutant
    return subprocess.run([XFC, "synth", "matmul", "--hw", hw, *SHAPE, "--verify", "-o", str(out)],
                          capture_output=True, text=True, timeout=600, env=env)


def assert_exit4_and_kept(proc, out: Path, needle: str):
    assert proc.returncode == 4, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("xfc: error")]
    assert len(errors) == 1, proc.stderr
    line = errors[0]
    assert needle in line, line
    kept = re.search(r"outputs kept in (\S+)$", line)
    assert kept and Path(kept.group(1)).resolve() == out.resolve(), line
    report = json.loads((out / "report.json").read_text())
    assert report["verified"] is False and needle in report["failure"]
    assert list(out.glob("*.c")), "the kernel sources are kept for inspection"
    assert "TEST FAULT INJECTION" in proc.stderr       # the run says it was deliberately broken


@pytest.mark.host
@pytest.mark.parametrize("mutant, needle", [("tail_store_mr_rows", "past the end of out"),
                                            ("unwritten_last_row", "non-finite"),
                                            ("drop_last_k", "K-derived bound")])
def test_host_synth_verify_exits_4_on_a_wrong_kernel(tmp_path, mutant, needle):
    out = tmp_path / "out"
    assert_exit4_and_kept(synth("host", out, mutant), out, needle)


@pytest.mark.host
def test_host_synth_verify_passes_without_the_fault(tmp_path):
    out = tmp_path / "out"
    proc = synth("host", out, None)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["verified"] is True and report["failure"] is None
    assert "TEST FAULT INJECTION" not in proc.stderr


@pytest.mark.host
def test_unknown_test_mutant_is_a_usage_error(tmp_path):
    proc = synth("host", tmp_path / "out", "no_such_bug")
    assert proc.returncode == 2 and "unknown test mutant 'no_such_bug'" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.emulated
@pytest.mark.skipif(not HAVE_ARM, reason=f"{ARM_CC} or {QEMU} not installed")
@pytest.mark.parametrize("mutant, needle", [("tail_store_mr_rows", "guard violation: wrote"),
                                            ("unwritten_last_row", "non-finite")])
def test_arm_synth_verify_under_qemu_exits_4_on_a_wrong_kernel(tmp_path, mutant, needle):
    out = tmp_path / "out"
    assert_exit4_and_kept(synth("cortex-a76", out, mutant), out, needle)
