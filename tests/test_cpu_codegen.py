"""CPU codegen + build: rendered kernels must match the numpy reference within the K-derived bound.

Host kernels run through ctypes (avx512 / avx2 / generic, 1 and 2 threads); NEON kernels are
cross-compiled and run under qemu-aarch64 (an A55-like plan with 64-bit A loads and an A76-like
plan with 128-bit A loads). Tests that need a missing tool or ISA are skipped with the reason.
"""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from xfc.build import (ARM_CC, QEMU, Measurement, ToolchainError, build_arm, build_host, qemu_cpu_models,
                       require_tool, run_qemu)
from xfc.codegen_cpu import a_load_groups, hand_plan, render_cpu_kernel, validate_plan
from xfc.errors import OperatorError
from xfc.ops import check_output, make_inputs, make_spec


def _host_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


FLAGS = _host_flags()
HOST_ISAS = [isa for isa, need in (("avx512", "avx512f"), ("avx2", "avx2"), ("generic", None))
             if need is None or need in FLAGS]
HAVE_ARM = shutil.which(ARM_CC) is not None and shutil.which(QEMU) is not None
needs_avx512 = pytest.mark.skipif("avx512" not in HOST_ISAS, reason="host has no AVX-512")
needs_arm = pytest.mark.skipif(not HAVE_ARM, reason=f"{ARM_CC} or {QEMU} not installed")


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("xfc_cpu_build")


def _check_host(spec, build_dir, isa="avx512", threads=1, seed=0, **overrides):
    plan = hand_plan(spec, isa, threads, **overrides)
    kernel = build_host(render_cpu_kernel(plan), build_dir)
    a, b, bias = make_inputs(spec, seed=seed)
    out = kernel(a, b, bias)
    ok, max_err, ratio = check_output(spec, out, a, b, bias)
    assert ok, f"{spec.describe()} isa={isa} threads={threads} {overrides}: err {max_err:.3g} ratio {ratio:.3g}"
    return kernel


# ---------------------------------------------------------------------------------------------
# Specs
# ---------------------------------------------------------------------------------------------

def mm(m, n, k, batch=1, bias=False, act="none"):
    return make_spec("matmul", dict(m=m, n=n, k=k, batch=batch), bias=bias, activation=act)


def conv(c, h, w, k, r, s, n=1, stride=1, pad=0, dilation=1, bias=False, act="none"):
    return make_spec("conv2d", dict(n=n, c=c, h=h, w=w, k=k, r=r, s=s), stride=stride, pad=pad,
                     dilation=dilation, bias=bias, activation=act)


def dw(c, h, w, r, s, n=1, stride=1, pad=0, dilation=1, bias=False, act="none"):
    return make_spec("depthwise", dict(n=n, c=c, h=h, w=w, r=r, s=s), stride=stride, pad=pad,
                     dilation=dilation, bias=bias, activation=act)


MATMULS = [
    mm(1, 1, 1),
    mm(1, 17, 3, bias=True),
    mm(13, 1, 5, act="relu"),
    mm(14, 32, 16),                      # exactly one 14x32 register tile
    mm(15, 33, 17, bias=True, act="relu6"),  # one above the tile in both directions
    mm(29, 47, 300, bias=True, act="relu"),  # K > KC: several KC slices, epilogue only on the last
    mm(97, 61, 257, act="relu6"),
    mm(5, 19, 11, batch=3, bias=True),
    mm(128, 96, 64),
]

CONVS = [
    conv(3, 11, 13, 8, 3, 3, pad=1, bias=True),
    conv(3, 23, 19, 17, 7, 7, stride=2, pad=3, act="relu"),          # resnet-stem-like, ragged M
    conv(16, 7, 9, 31, 1, 1, bias=True, act="relu6"),                 # pointwise: contiguous B packing
    conv(16, 9, 9, 8, 1, 1, stride=2),                                # 1x1 stride 2: gather packing
    conv(5, 13, 11, 7, 3, 2, stride=(2, 1), pad=(1, 0, 2, 1), dilation=(1, 2), bias=True, act="relu6"),
    conv(4, 10, 12, 6, 3, 3, pad=(0, 2, 1, 0), dilation=2),           # asymmetric pad + dilation
    conv(7, 5, 6, 9, 3, 3, n=2, pad=1, bias=True),                    # batch > 1
    conv(37, 8, 8, 5, 3, 3, pad=1, bias=True, act="relu"),            # C*R*S = 333 > KC
    conv(2, 1, 1, 3, 1, 1),                                           # 1x1 image
]

DEPTHWISES = [
    dw(3, 9, 9, 3, 3, pad=1, bias=True),
    dw(5, 13, 17, 3, 3, stride=2, pad=1, act="relu6", bias=True),
    dw(4, 11, 7, 3, 3, stride=2, pad=(1, 0, 1, 1), act="relu"),
    dw(3, 13, 7, 3, 2, n=2, stride=2, pad=(1, 0, 1, 1), dilation=(2, 1)),
    dw(2, 17, 37, 5, 5, pad=2, bias=True),                            # 5x5, tails in both dims
    dw(3, 1, 1, 1, 1),                                                # 1x1 everything
    dw(2, 31, 33, 3, 3, stride=(1, 2), pad=1, dilation=(1, 2)),
    dw(6, 23, 29, 3, 3, n=2, stride=2, pad=1, bias=True, act="relu6"),
]


# ---------------------------------------------------------------------------------------------
# Host numerics
# ---------------------------------------------------------------------------------------------

@needs_avx512
@pytest.mark.parametrize("spec", MATMULS, ids=lambda s: s.key())
def test_matmul_avx512(spec, build_dir):
    _check_host(spec, build_dir, "avx512", 1)


@needs_avx512
@pytest.mark.parametrize("spec", CONVS, ids=lambda s: s.key())
def test_conv2d_avx512(spec, build_dir):
    _check_host(spec, build_dir, "avx512", 1)


@needs_avx512
@pytest.mark.parametrize("spec", DEPTHWISES, ids=lambda s: s.key())
def test_depthwise_avx512(spec, build_dir):
    _check_host(spec, build_dir, "avx512", 1)


@needs_avx512
@pytest.mark.parametrize("axis", ["n", "m"])
@pytest.mark.parametrize("spec", [MATMULS[6], MATMULS[7], CONVS[1], CONVS[6]], ids=lambda s: s.key())
def test_two_threads_both_axes(spec, axis, build_dir):
    _check_host(spec, build_dir, "avx512", 2, parallel_axis=axis)


@needs_avx512
@pytest.mark.parametrize("spec", [DEPTHWISES[1], DEPTHWISES[7]], ids=lambda s: s.key())
def test_depthwise_two_threads(spec, build_dir):
    _check_host(spec, build_dir, "avx512", 2)


@needs_avx512
@pytest.mark.parametrize("tiles", [dict(mr=8, nr=48, kc=64, mc=16, nc=96), dict(mr=6, nr=64, k_unroll=1),
                                   dict(mr=16, nr=16, k_unroll=3, kc=37), dict(mr=1, nr=16, kc=5, nc=16)])
def test_tile_variants(tiles, build_dir):
    """Small KC/MC/NC force every loop of the five-loop nest to run several times with ragged ends."""
    _check_host(mm(61, 131, 150, bias=True, act="relu6"), build_dir, "avx512", 1, **tiles)
    _check_host(conv(6, 15, 14, 21, 3, 3, pad=1, bias=True), build_dir, "avx512", 1, **tiles)


@needs_avx512
@pytest.mark.parametrize("tiles", [dict(ow_vectors=1, oh_rows=1), dict(ow_vectors=3, oh_rows=2),
                                   dict(ow_vectors=1, oh_rows=5)])
def test_depthwise_tile_variants(tiles, build_dir):
    _check_host(dw(3, 19, 41, 3, 3, stride=2, pad=1, bias=True), build_dir, "avx512", 1, **tiles)
    _check_host(dw(3, 19, 41, 3, 3, pad=1, act="relu"), build_dir, "avx512", 1, **tiles)


@pytest.mark.parametrize("isa", [i for i in HOST_ISAS if i != "avx512"])
@pytest.mark.parametrize("spec", [MATMULS[4], MATMULS[6], CONVS[1], CONVS[2], CONVS[4],
                                  DEPTHWISES[1], DEPTHWISES[3], DEPTHWISES[4]], ids=lambda s: s.key())
@pytest.mark.parametrize("threads", [1, 2])
def test_other_host_isas(isa, spec, threads, build_dir):
    _check_host(spec, build_dir, isa, threads)


def test_generic_plain_march_and_eight_lanes(build_dir):
    """generic with no -march: vector extensions must still compile and be right (8-lane variant too)."""
    _check_host(MATMULS[6], build_dir, "generic", 1, gcc_march="x86-64")
    plan = hand_plan(CONVS[4], "generic", 1, gcc_march="x86-64")
    plan = dataclasses.replace(plan, vector_lanes=8, gemm=dataclasses.replace(plan.gemm, nr=16),
                               function_name=plan.function_name + "_l8")
    kernel = build_host(render_cpu_kernel(plan), build_dir)
    a, b, bias = make_inputs(plan.spec)
    assert check_output(plan.spec, kernel(a, b, bias), a, b, bias)[0]


# ---------------------------------------------------------------------------------------------
# NEON under qemu
# ---------------------------------------------------------------------------------------------

def _a55_model() -> str:
    """qemu 7.2 has no cortex-a55; fall back to the in-order cortex-a53 (same v8.0 fp32 NEON)."""
    models = qemu_cpu_models()
    return "cortex-a55" if "cortex-a55" in models else "cortex-a53"


NEON_SPECS = [mm(13, 21, 37, bias=True, act="relu"), mm(7, 9, 300, batch=2),
              conv(5, 9, 11, 7, 3, 3, stride=2, pad=1, bias=True), conv(8, 6, 5, 9, 1, 1, act="relu6"),
              dw(5, 9, 11, 3, 3, stride=2, pad=1, bias=True, act="relu6"), dw(3, 7, 13, 3, 3, pad=(1, 1, 0, 2))]


@needs_arm
@pytest.mark.parametrize("core", ["a55", "a76"])
@pytest.mark.parametrize("spec", NEON_SPECS, ids=lambda s: s.key())
def test_neon_qemu(spec, core, build_dir):
    if core == "a55":
        cpu, bits, mr, march = _a55_model(), 64, 6, "armv8.2-a"
    else:
        cpu, bits, mr, march = "cortex-a76", 128, 7, "armv8.2-a+fp16+dotprod"
    plan = hand_plan(spec, "neon", 2, mr=mr, nr=8, kc=128, a_load_bits=bits, gcc_march=march, qemu_cpu=cpu)
    rendered = render_cpu_kernel(plan)
    if plan.gemm is not None:
        assert ("vfmaq_lane_f32" if bits == 64 else "vfmaq_laneq_f32") in rendered.source
    binary = build_arm(rendered, build_dir)
    a, b, bias = make_inputs(spec, seed=3)
    out, meas = run_qemu(binary, spec, a, b, bias, qemu_cpu=plan.qemu_cpu, repeats=2)
    ok, max_err, ratio = check_output(spec, out, a, b, bias)
    assert ok, f"{spec.describe()} on {cpu}: err {max_err:.3g} ratio {ratio:.3g}"
    assert "emulated" in meas.where and len(meas.samples_s) == 2


def test_neon_a_load_groups():
    assert [g["width"] for g in a_load_groups("neon", 7, 128)] == [4, 2, 1]
    assert [g["width"] for g in a_load_groups("neon", 6, 64)] == [2, 2, 2]
    assert [g["width"] for g in a_load_groups("avx512", 3, 128)] == [1, 1, 1]
    rows = [r["row"] for g in a_load_groups("neon", 7, 128) for r in g["rows"]]
    assert rows == list(range(7))


# ---------------------------------------------------------------------------------------------
# Rendering, build products, errors
# ---------------------------------------------------------------------------------------------

def test_render_is_deterministic_and_readable():
    plan = hand_plan(MATMULS[6], "avx512", 1)
    first, second = render_cpu_kernel(plan), render_cpu_kernel(plan)
    assert first.source == second.source and first.harness_source == second.harness_source
    assert first.source.startswith("/*\n * " + plan.header_lines[0])
    for define in ("#define XFC_MR 14", "#define XFC_NR 32", "#define XFC_KC ", "#define XFC_THREADS 1"):
        assert define in first.source
    assert first.function_name == plan.function_name and first.isa == "avx512" and first.plan is plan
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.source = ""


def test_depthwise_render_has_named_constants():
    src = render_cpu_kernel(hand_plan(DEPTHWISES[1], "avx512", 1, ow_vectors=2, oh_rows=3)).source
    assert "#define XFC_OH_ROWS 3" in src and "#define XFC_OW_VECTORS 2" in src and "#define XFC_SW 2" in src


@pytest.mark.parametrize("change,message", [
    (lambda p: dataclasses.replace(p, vector_lanes=8), "vector_lanes"),
    (lambda p: dataclasses.replace(p, lowering="direct_depthwise"), "lowering"),
    (lambda p: dataclasses.replace(p, gemm=dataclasses.replace(p.gemm, nr=24)), "multiple"),
    (lambda p: dataclasses.replace(p, gemm=dataclasses.replace(p.gemm, mc=15)), "mc"),
    (lambda p: dataclasses.replace(p, gemm=dataclasses.replace(p.gemm, parallel_axis="k")), "parallel_axis"),
    (lambda p: dataclasses.replace(p, function_name="bad name"), "C identifier"),
    (lambda p: dataclasses.replace(p, isa="sse"), "isa"),
])
def test_invalid_plans_are_rejected(change, message):
    with pytest.raises(OperatorError, match=message):
        validate_plan(change(hand_plan(MATMULS[4], "avx512", 1)))


def test_build_products_and_timing(build_dir):
    spec = MATMULS[8]
    kernel = _check_host(spec, build_dir, HOST_ISAS[0], 1)
    script = (build_dir / "build.sh").read_text()
    assert "gcc" in script and "-O3" in script and "-fopenmp" in script and "-std=gnu11" in script
    assert not list(build_dir.glob("*.tmp"))
    a, b, bias = make_inputs(spec)
    m = kernel.time(a, b, bias, repeats=5, warmup=1)
    assert isinstance(m, Measurement) and len(m.samples_s) == 5 and m.where == "host"
    assert m.min_s <= m.median_s <= m.max_s and m.gflops > 0
    # identical plan -> same library file, no rebuild
    again = build_host(render_cpu_kernel(kernel.plan), build_dir)
    assert again.library == kernel.library
    with pytest.raises(Exception, match="shape"):
        kernel(a[:, :-1], b, bias)


def test_missing_tool_is_one_clear_line(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ToolchainError) as err:
        require_tool(ARM_CC)
    text = str(err.value)
    assert "\n" not in text and ARM_CC in text and "gcc-aarch64-linux-gnu" in text
    with pytest.raises(ToolchainError, match="qemu-user"):
        require_tool(QEMU)


def test_compile_failure_is_toolchain_error(build_dir):
    plan = hand_plan(MATMULS[0], "avx512", 1, gcc_march="no-such-arch", function_name="xfc_bad_march")
    with pytest.raises(ToolchainError, match="host compile"):
        build_host(render_cpu_kernel(plan), build_dir / "bad")
