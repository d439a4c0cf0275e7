"""Guard zones and NaN pre-fill: the Python buffers (xfc/runners/guards.py), the CPU C harness built for
the host, and the OpenCL harness on PoCL."""
from __future__ import annotations

import math
import re
import shutil
import subprocess

import numpy as np
import pytest

from support import host_kernel
from xfc.toolchain.cpu import COMMON_FLAGS, write_sources
from xfc.toolchain.tools import HOST_CC
from xfc.cpu.plans import hand_plan
from xfc.cpu.codegen import render_cpu_kernel
from xfc.errors import DeviceError, ToolchainError, VerificationError
from xfc.runners.guards import GUARD_BITS, PREFILL_BITS, GuardedBuffer, guard_floats
from xfc.testing.mutants import mutate
from xfc.ops.reference import check_output, make_inputs
from xfc.ops.spec import make_spec
from xfc.runners.base import HARNESS_EXIT_GUARD, RunSpec
from xfc.runners.qemu import LocalRunner


def _run_local(binary, spec, a, b, bias, prepacked=False):
    """The CPU harness as a host program (xfc.runners.qemu.LocalRunner): the Measurement."""
    return LocalRunner().execute(RunSpec(harness=binary, inputs=(a, b, bias), repeat=1, warmup=0,
                                         output_shape=tuple(spec.output_shape), protocol="times-file",
                                         prepacked=prepacked, input_shapes=spec.operand_shapes))

# ---------------------------------------------------------------------------------------------
# GuardedBuffer
# ---------------------------------------------------------------------------------------------


@pytest.mark.unit
def test_guard_size_formula():
    assert guard_floats(1) == 64 and guard_floats(64) == 64
    assert guard_floats(65) == 80 and guard_floats(1000) == 1008
    assert guard_floats(10 ** 7) == 65536
    assert all(guard_floats(n) % 16 == 0 for n in range(1, 3000))


@pytest.mark.unit
def test_guarded_buffer_starts_as_nan_and_sees_writes_on_either_side():
    buf = GuardedBuffer(10, "out")
    assert np.isnan(buf.data).all() and (buf.data.view(np.uint32) == PREFILL_BITS).all()
    assert buf.violation() == ""
    raw = buf._raw
    raw[buf.guard + 10] = 0                   # one float past the end
    raw[buf.guard + 12] = 0                   # and one three floats past it
    assert buf.violation() == "wrote 2 float(s) past the end of out, up to 3 floats past it"
    raw[buf.guard - 2] = 123                  # two floats before the start
    with pytest.raises(VerificationError, match=r"kern: wrote 1 float\(s\) before the start of out, up to 2 floats "
                                                r"before it; wrote 2 float\(s\) past the end"):
        buf.check("kern")
    buf2 = GuardedBuffer.copy_of(np.arange(5, dtype=np.float32), "in0")
    assert buf2.data.tolist() == [0, 1, 2, 3, 4]
    buf2.data[:] = 7                          # the interior is the kernel's to write
    buf2.check("kern")
    assert (buf2._raw[:buf2.guard] == GUARD_BITS).all()


@pytest.mark.unit
def test_a_nan_guard_pattern_survives_a_value_copy_bit_exactly():
    """Guards compare bits: a kernel that copies a guard float back unchanged still passes, one
    that rewrites it as a (canonical) NaN does not."""
    buf = GuardedBuffer(4, "out")
    buf._raw[buf.guard + 4] = np.float32(np.nan).view(np.uint32)
    assert "past the end" in buf.violation()


# ---------------------------------------------------------------------------------------------
# HostKernel: fresh NaN output per call, guards after every entry point
# ---------------------------------------------------------------------------------------------

def mm(m, n, k, batch=1, **epi):
    return make_spec("matmul", dict(m=m, n=n, k=k, batch=batch), **epi)


@pytest.mark.host
def test_host_kernel_guards_every_entry_point(tmp_path):
    spec = mm(29, 40, 37, batch=2, bias=True)
    rendered = mutate(render_cpu_kernel(hand_plan(spec, "avx2")), "tail_store_mr_rows")
    kernel = host_kernel(rendered, tmp_path)
    a, b, bias = make_inputs(spec)
    for call in (lambda: kernel(a, b, bias), lambda: kernel.run_packed(a, kernel.prepack(b), bias),
                 lambda: kernel.time(a, b, bias, repeats=1, warmup=0),
                 lambda: kernel.time(a, b, bias, repeats=1, warmup=0, prepacked=True)):
        with pytest.raises(VerificationError, match="wrote 40 float\\(s\\) past the end of out"):
            call()


@pytest.mark.host
def test_host_kernel_outputs_are_fresh_and_a_real_kernel_writes_every_element(tmp_path):
    spec = mm(13, 21, 30, bias=True, activation="relu")
    kernel = host_kernel(render_cpu_kernel(hand_plan(spec, "avx2")), tmp_path)
    a, b, bias = make_inputs(spec)
    first, second = kernel(a, b, bias), kernel(a, b, bias)
    assert first.ctypes.data != second.ctypes.data
    assert np.isfinite(first).all() and np.array_equal(first, second)
    assert check_output(spec, first, a, b, bias).ok


# ---------------------------------------------------------------------------------------------
# The CPU C harness (templates/cpu/harness.c.j2), built as a host program
# ---------------------------------------------------------------------------------------------

def _host_program(rendered, out_dir):
    kernel_c, harness_c = write_sources(rendered, out_dir)
    binary = out_dir / "harness_prog"
    proc = subprocess.run([HOST_CC, *COMMON_FLAGS, f"-march={rendered.plan.gcc_march or 'native'}", "-o",
                           binary.name, kernel_c.name, harness_c.name], cwd=out_dir, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr
    return binary


@pytest.mark.host
@pytest.mark.parametrize("mutant, needle", [
    ("tail_store_mr_rows", "wrote 40 float(s) past the end of out, up to 40 floats past it"),
    ("out_pointer_minus_one", "wrote 1 float(s) before the start of out, up to 1 floats before it"),
    ("packed_size_too_small", "past the end of packed weights"),
])
def test_c_harness_reports_guard_violations_in_one_line(tmp_path, mutant, needle):
    spec = mm(29, 40, 37, batch=2, bias=True)
    rendered = render_cpu_kernel(hand_plan(spec, "avx2"))
    a, b, bias = make_inputs(spec)
    m = _run_local(_host_program(rendered, tmp_path / "real"), spec, a, b, bias, prepacked=True)
    assert check_output(spec, m.output, a, b, bias).ok and len(m.samples_s) == 1
    wrong = _host_program(mutate(rendered, mutant), tmp_path / "wrong")
    prepacked = mutant == "packed_size_too_small"
    with pytest.raises(VerificationError) as info:
        _run_local(wrong, spec, a, b, bias, prepacked=prepacked)
    message = str(info.value)
    assert needle in message and "\n" not in message
    # the same guard size as the host buffers
    n = 2 * 37 * 48 - 16 if prepacked else math.prod(spec.output_shape)
    assert f"guard zones of {guard_floats(n)} floats" in message
    # the raw exit status and line, as runners and phones see them
    tmp = tmp_path / "raw"
    tmp.mkdir()
    for name, arr in (("a", a), ("b", b), ("bias", bias)):
        arr.tofile(tmp / name)
    proc = subprocess.run([str(wrong), *(str(tmp / x) for x in ("a", "b", "bias", "out", "times")), "0", "1",
                           *(["prepacked"] if prepacked else [])], capture_output=True, text=True, timeout=60)
    assert proc.returncode == HARNESS_EXIT_GUARD
    assert [ln for ln in proc.stderr.splitlines() if ln] == [ln for ln in proc.stderr.splitlines()
                                                             if ln.startswith("xfc harness: guard violation:")]
    assert not (tmp / "out").exists()


@pytest.mark.host
def test_c_harness_output_starts_as_nan(tmp_path):
    spec = make_spec("conv2d", dict(c=3, h=8, w=8, k=5, r=3, s=3), pad=1, activation="relu")
    rendered = mutate(render_cpu_kernel(hand_plan(spec, "avx2")), "unwritten_last_row")
    a, b, bias = make_inputs(spec)
    out = _run_local(_host_program(rendered, tmp_path), spec, a, b, bias).output
    assert np.isnan(out[0, -1, -1, :]).all() and np.isfinite(out[0, :-1]).all()
    assert (out[0, -1, -1, :].view(np.uint32) == PREFILL_BITS).all()


# ---------------------------------------------------------------------------------------------
# The OpenCL harness (templates/opencl/harness.c.j2) on PoCL
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pocl(tmp_path_factory):
    from xfc.toolchain.opencl import build_harness
    from xfc.runners.pocl import device_info
    with pytest.MonkeyPatch.context() as mp:   # keep the harness cache out of $HOME
        mp.setenv("XFC_CACHE_DIR", str(tmp_path_factory.mktemp("xfc-cache")))
        try:
            harness = build_harness()
            device_info(harness)
        except ToolchainError as exc:
            pytest.skip(str(exc))
        yield harness


def _gpu_kernel(tmp_path, spec, dtype="fp32"):
    from xfc.pipeline import run_gpu_synth
    from xfc.hardware.load import load
    report = run_gpu_synth(spec, load("adreno-650"), tmp_path, dtype=dtype, verify=True).to_dict()
    assert report["verified"] is True, report
    variant = "fp16_storage" if dtype == "fp16" else "fp32"
    return report, tmp_path / report["files"][variant].split("/")[-1]


def _run_edited(pocl, tmp_path, spec, kernel_path, edit, count_min=1):
    from xfc.runners.pocl import PoclRunner
    text = kernel_path.read_text()
    edited, count = re.subn(edit[0], edit[1], text)
    assert count >= count_min and edited != text
    bad = tmp_path / ("wrong_" + kernel_path.name)
    bad.write_text(edited)
    a, b, bias = make_inputs(spec)
    m = PoclRunner(pocl).execute(RunSpec(harness=bad, inputs=(a, b, bias), repeat=1, warmup=1,
                                         input_shapes=spec.operand_shapes))
    assert m.emulated and "not a phone GPU timing" in m.where
    return m.output, (a, b, bias)


@pytest.mark.opencl
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_opencl_harness_guards_the_output(pocl, tmp_path, dtype):
    spec = mm(67, 45, 30)
    _, kernel = _gpu_kernel(tmp_path, spec, dtype)
    with pytest.raises(VerificationError, match=r"guard violation: wrote \d+ element\(s\) past the end of out"):
        _run_edited(pocl, tmp_path, spec, kernel, (r"row0 \+ (\d+) < M &&", r"row0 + \1 < M + 1 &&"))


@pytest.mark.opencl
def test_opencl_harness_output_starts_as_nan(pocl, tmp_path):
    spec = mm(67, 45, 30, bias=True, activation="relu")
    _, kernel = _gpu_kernel(tmp_path, spec)
    got, (a, b, bias) = _run_edited(pocl, tmp_path, spec, kernel, (r"row0 \+ (\d+) < M &&", r"row0 + \1 < M - 1 &&"))
    got = got.reshape(spec.output_shape)
    assert np.isnan(got[0, -1, :]).all() and np.isfinite(got[0, :-1]).all()
    verdict = check_output(spec, got, a, b, bias)
    assert not verdict.ok and "non-finite" in verdict.reason


@pytest.mark.opencl
def test_opencl_guard_violation_fails_run_gpu_synth_with_a_report(pocl, tmp_path, monkeypatch):
    """run_gpu_synth turns the harness's exit 5 into VerificationError after writing report.json."""
    import json

    from xfc import pipeline
    from xfc.gpu import codegen as gpu_codegen
    from xfc.hardware.load import load
    spec = mm(67, 45, 30)
    real_render = gpu_codegen.render_kernel

    def broken(plan):
        return re.sub(r"row0 \+ (\d+) < M &&", r"row0 + \1 < M + 1 &&", real_render(plan))

    monkeypatch.setattr(gpu_codegen, "render_kernel", broken)
    with pytest.raises(VerificationError, match="past the end of out") as info:
        pipeline.run_gpu_synth(spec, load("adreno-650"), tmp_path, verify=True)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["verified"] is False and "guard violation" in report["failure"]
    assert info.value.report.verified is False and info.value.report.measurement is None
    assert "guard violation" in info.value.report.failure


@pytest.mark.host
@pytest.mark.skipif(shutil.which(HOST_CC) is None, reason="no host gcc")
def test_local_runner_reports_a_crash_as_device_error(tmp_path):
    """Only exit 5 is a verification failure; any other failure stays a device error (exit 3)."""
    script = tmp_path / "fails"
    script.write_text("#!/bin/sh\necho 'xfc harness: cannot read' >&2\nexit 2\n")
    script.chmod(0o755)
    spec = mm(2, 2, 2)
    with pytest.raises(DeviceError, match="exit 2") as info:
        _run_local(script, spec, *make_inputs(spec))
    assert "cannot read" in str(info.value) and not isinstance(info.value, VerificationError)
