"""One runner interface, one Measurement: the five ways of running (host ctypes, a host-native
harness program, qemu-aarch64, ADB, PoCL) take a RunSpec and return a Measurement. Here: the
pure parts, and the same ragged kernels through the host, local and qemu runners checked
against the float64 reference (ADB: test_runners.py; PoCL: test_guards.py, test_gpu_pocl.py)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from support import RUNNABLE_ISAS, conv, host_kernel, host_march, host_plan, mm, needs_arm
from xfc.toolchain.cpu import COMMON_FLAGS, build_arm, write_sources
from xfc.toolchain.tools import HOST_CC
from xfc.cpu.codegen import render_cpu_kernel
from xfc.cpu.plans import hand_plan
from xfc.errors import DeviceError, OperatorError
from xfc.ops.reference import check_output, make_inputs
from xfc.runners.adb import AdbRunner
from xfc.runners.base import HarnessRunner, Measurement, Runner, RunSpec, harness_args
from xfc.runners.host import WHERE_HOST, WHERE_HOST_PREPACKED, HostRunner
from xfc.runners.pocl import POCL_LABEL, PoclRunner
from xfc.runners.qemu import LocalRunner, QemuRunner


# ---------------------------------------------------------------------------------------------
# pure
# ---------------------------------------------------------------------------------------------

@pytest.mark.unit
def test_the_five_runners_share_one_interface():
    for cls in (HostRunner, LocalRunner, QemuRunner, AdbRunner, PoclRunner):
        assert issubclass(cls, Runner) and cls.execute is not Runner.execute
    for cls in (LocalRunner, QemuRunner, AdbRunner):   # the ones that ship a harness program
        assert issubclass(cls, HarnessRunner)
    # timings that are not the target device's are labelled so
    assert QemuRunner("cortex-a76").emulated and "emulated: not phone timing" in QemuRunner("cortex-a76").where
    assert "-cpu cortex-a76" in QemuRunner("cortex-a76").where and QemuRunner(None).cpu == "max"
    assert PoclRunner(Path("h")).emulated and PoclRunner(Path("h")).where == POCL_LABEL
    assert not LocalRunner().emulated and not HostRunner.emulated


@pytest.mark.unit
def test_measurement_medians_in_one_place():
    odd = Measurement.from_samples([3.0, 1.0, 2.0], where="x", emulated=False, flops=6_000_000_000)
    assert (odd.median_s, odd.min_s, odd.max_s, odd.repeats) == (2.0, 1.0, 3.0, 3)
    assert odd.gflops == pytest.approx(3.0) and odd.samples_s == (3.0, 1.0, 2.0)
    even = Measurement.from_samples([4.0, 1.0, 2.0, 3.0], where="x", emulated=True)
    assert even.median_s == 2.5 and even.gflops == 0.0 and even.emulated
    d = even.to_dict()
    assert d["where"] == "x" and d["emulated"] is True and d["samples_s"] == [4.0, 1.0, 2.0, 3.0]
    assert d["output_shape"] is None
    for bad in ([], [1.0, float("nan")], [-1.0]):
        with pytest.raises(DeviceError, match="no valid timing samples"):
            Measurement.from_samples(bad, where="x", emulated=False)


@pytest.mark.unit
def test_run_spec_checks_shapes_and_entry_points():
    spec = mm(5, 7, 3)
    a, b, bias = make_inputs(spec)
    shapes = tuple(tuple(s) for s in spec.operand_shapes)
    RunSpec(harness=Path("h"), inputs=(a, b, bias), input_shapes=shapes).check_input_shapes("k")
    with pytest.raises(OperatorError, match=r"k: in1 has shape \(2, 2\)"):
        RunSpec(harness=Path("h"), inputs=(a, np.zeros((2, 2), np.float32), bias),
                input_shapes=shapes).check_input_shapes("k")
    rs = RunSpec(harness=Path("h"), inputs=(a, b, bias), protocol="times-file", prepacked=True, repeat=3, warmup=2)
    assert harness_args(rs, ["a", "b", "c"], "o", "t") == ["a", "b", "c", "o", "t", "2", "3", "prepacked"]
    with pytest.raises(DeviceError, match="pre-packed"):
        harness_args(RunSpec(harness=Path("h"), inputs=(a, b, bias), prepacked=True), ["a", "b", "c"], "o", "t")


# ---------------------------------------------------------------------------------------------
# the same kernels through host, local and qemu runners
# ---------------------------------------------------------------------------------------------

CASES = [mm(29, 37, 19, bias=True, act="relu"), conv(3, 9, 7, 10, 3, 3, pad=1, bias=True)]


def _run_spec(harness, spec, a, b, bias, prepacked, **kw):
    return RunSpec(harness=harness, inputs=(a, b, bias), repeat=2, warmup=1, output_shape=tuple(spec.output_shape),
                   protocol="times-file", prepacked=prepacked, input_shapes=tuple(tuple(s) for s in spec.operand_shapes),
                   flops=spec.flops, **kw)


def _check(spec, m: Measurement, a, b, bias):
    assert m.output.shape == tuple(spec.output_shape) and len(m.samples_s) == 2 and m.min_s <= m.median_s
    verdict = check_output(spec, m.output, a, b, bias)
    assert verdict.ok, verdict.reason


@pytest.mark.host
@pytest.mark.parametrize("spec", CASES, ids=["matmul", "conv2d"])
def test_host_and_local_runners_agree_with_the_reference(spec, tmp_path):
    isa = "avx2" if "avx2" in RUNNABLE_ISAS else "generic"
    rendered = render_cpu_kernel(host_plan(spec, isa))
    kernel = host_kernel(rendered, tmp_path / "so")
    a, b, bias = make_inputs(spec, seed=3)
    runner = HostRunner(kernel)
    for prepacked in (False, True):
        m = runner.execute(_run_spec(kernel.library, spec, a, b, bias, prepacked))
        _check(spec, m, a, b, bias)
        assert m.where == (WHERE_HOST_PREPACKED if prepacked else WHERE_HOST) and not m.emulated
        assert m.flops == spec.flops and m.gflops > 0
    with pytest.raises(DeviceError, match="holds"):
        runner.execute(_run_spec(tmp_path / "other.so", spec, a, b, bias, False))
    # the same sources as a host-native harness program (templates/cpu/harness.c.j2 with main)
    out_dir = tmp_path / "prog"
    kernel_c, harness_c = write_sources(rendered, out_dir)
    subprocess.run([HOST_CC, *COMMON_FLAGS, f"-march={host_march(isa)}", "-o", "prog", kernel_c.name, harness_c.name],
                   cwd=out_dir, check=True, capture_output=True, timeout=180)
    for prepacked in (False, True):
        m = LocalRunner().execute(_run_spec(out_dir / "prog", spec, a, b, bias, prepacked, label="prog"))
        _check(spec, m, a, b, bias)
        assert m.kernel == "prog" and not m.emulated


@pytest.mark.emulated
@needs_arm
@pytest.mark.parametrize("spec", CASES, ids=["matmul", "conv2d"])
def test_qemu_runner_agrees_with_the_reference(spec, tmp_path):
    plan = hand_plan(spec, "neon", 1, qemu_cpu="cortex-a76", gcc_march="armv8.2-a")
    binary = build_arm(render_cpu_kernel(plan), tmp_path)
    a, b, bias = make_inputs(spec, seed=4)
    for prepacked in (False, True):
        m = QemuRunner(plan.qemu_cpu).execute(_run_spec(binary, spec, a, b, bias, prepacked, march=plan.gcc_march))
        _check(spec, m, a, b, bias)
        assert m.emulated and "qemu-aarch64 -cpu cortex-a76" in m.where
        assert any("emulated" in note for note in m.notes)
    with pytest.raises(OperatorError, match="in0 has shape"):
        QemuRunner("cortex-a76").execute(_run_spec(binary, spec, a[..., :1], b, bias, False))
