"""CPU codegen + build: rendered kernels must match the numpy reference within the K-derived bound.

Host kernels (avx512 / avx2 / generic; 1, 2, 3, 5 and 8 threads) are compiled on every machine
with their ISA's -march and run through ctypes where the CPU (as xfc sees it, XFC_HOST_ISA
included) runs that ISA; elsewhere they are compiled only, and the end-of-run coverage report says
so. NEON kernels are cross-compiled and run under qemu-aarch64 (an A55-like plan with 64-bit A
loads and an A76-like plan with 128-bit A loads). Tests that need a missing tool are skipped with
the reason.
"""
from __future__ import annotations

import dataclasses

import pytest

import support
from support import (ALL_HOST_ISAS, RUNNABLE_ISAS, assert_samples_positive, conv, dw, host_march, host_plan, mm,
                     needs_arm, run_host_plan)
from xfc.toolchain.tools import ARM_CC, QEMU, require_tool
from support import host_kernel, qemu_run
from xfc.toolchain.cpu import build_arm
from xfc.errors import ToolchainError
from xfc.runners.base import Measurement
from xfc.runners.qemu import qemu_cpu_models
from xfc.cpu.codegen import render_cpu_kernel, validate_plan
from xfc.cpu.isa import ISA_TABLE, isa_for
from xfc.cpu.plans import hand_plan
from xfc.cpu.tiles import a_load_groups
from xfc.errors import OperatorError
from xfc.ops.reference import make_inputs


def _check_host(spec, build_dir, isa, threads=1, seed=0, **overrides):
    plan = host_plan(spec, isa, threads, **overrides)
    kernel, _ = run_host_plan(plan, build_dir, seed=seed, what=f"isa={isa} threads={threads} {overrides}")
    return kernel


# ---------------------------------------------------------------------------------------------
# Specs
# ---------------------------------------------------------------------------------------------

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


def _ids(spec):
    return spec.key()


# ---------------------------------------------------------------------------------------------
# Host numerics: every table on every ISA
# ---------------------------------------------------------------------------------------------

@pytest.mark.matrix(every=3)
@pytest.mark.host
@pytest.mark.parametrize("isa", ALL_HOST_ISAS)
@pytest.mark.parametrize("spec", MATMULS + CONVS + DEPTHWISES, ids=_ids)
def test_host_kernels(spec, isa, tmp_path):
    _check_host(spec, tmp_path, isa, 1)


@pytest.mark.host
@pytest.mark.parametrize("isa", ALL_HOST_ISAS)
@pytest.mark.parametrize("axis", ["n", "m"])
@pytest.mark.parametrize("spec", [MATMULS[6], MATMULS[7], CONVS[1], CONVS[6]], ids=_ids)
def test_two_threads_both_axes(spec, axis, isa, tmp_path):
    _check_host(spec, tmp_path, isa, 2, parallel_axis=axis)


@pytest.mark.host
@pytest.mark.parametrize("isa", ALL_HOST_ISAS)
@pytest.mark.parametrize("spec", [DEPTHWISES[1], DEPTHWISES[7]], ids=_ids)
def test_depthwise_two_threads(spec, isa, tmp_path):
    _check_host(spec, tmp_path, isa, 2)


# More threads than this machine may have, uneven splits, and more threads than tiles (M = 29 rows
# are 3 tiles of 14, 5 of 6 or 8 of 4): OpenMP runs them oversubscribed, the numbers must hold.
MANY_THREADS = [
    (MATMULS[5], 3, "m"), (MATMULS[5], 5, "n"), (MATMULS[5], 8, "m"),
    (CONVS[7], 3, "n"), (CONVS[1], 5, "m"), (CONVS[6], 8, "n"),
    (DEPTHWISES[4], 3, None), (DEPTHWISES[7], 5, None), (DEPTHWISES[0], 8, None),
]


@pytest.mark.host
@pytest.mark.parametrize("index", range(len(MANY_THREADS)),
                         ids=[f"{s.key()}-t{t}-{ALL_HOST_ISAS[i % 3]}" for i, (s, t, _) in enumerate(MANY_THREADS)])
def test_many_threads(index, tmp_path):
    spec, threads, axis = MANY_THREADS[index]
    isa = ALL_HOST_ISAS[index % 3]
    _check_host(spec, tmp_path, isa, threads, **({"parallel_axis": axis} if axis else {}))


# Tile variants in vectors of the ISA (nv vectors = NR / lanes): small KC/MC/NC force every loop of
# the five-loop nest to run several times with ragged ends.
TILE_VARIANTS = [dict(mr=8, nv=3, kc=64, mc=16, ncv=6), dict(mr=6, nv=4, k_unroll=1),
                 dict(mr=16, nv=1, k_unroll=3, kc=37), dict(mr=1, nv=1, kc=5, ncv=1)]


def _tiles(isa, variant):
    lanes = ISA_TABLE[isa].hand_lanes
    tiles = {k: v for k, v in variant.items() if k not in ("nv", "ncv")}
    tiles["nr"] = variant["nv"] * lanes
    if "ncv" in variant:
        tiles["nc"] = variant["ncv"] * lanes
    return tiles


@pytest.mark.matrix(every=2)
@pytest.mark.host
@pytest.mark.parametrize("isa", ALL_HOST_ISAS)
@pytest.mark.parametrize("variant", TILE_VARIANTS, ids=lambda v: "-".join(f"{k}{v[k]}" for k in v))
@pytest.mark.parametrize("spec", [mm(61, 131, 150, bias=True, act="relu6"), conv(6, 15, 14, 21, 3, 3, pad=1, bias=True)],
                         ids=_ids)
def test_tile_variants(spec, variant, isa, tmp_path):
    _check_host(spec, tmp_path, isa, 1, **_tiles(isa, variant))


@pytest.mark.host
@pytest.mark.parametrize("isa", ALL_HOST_ISAS)
@pytest.mark.parametrize("tiles", [dict(ow_vectors=1, oh_rows=1), dict(ow_vectors=3, oh_rows=2),
                                   dict(ow_vectors=1, oh_rows=5)], ids=lambda t: f"ow{t['ow_vectors']}-oh{t['oh_rows']}")
@pytest.mark.parametrize("spec", [dw(3, 19, 41, 3, 3, stride=2, pad=1, bias=True), dw(3, 19, 41, 3, 3, pad=1, act="relu")],
                         ids=_ids)
def test_depthwise_tile_variants(spec, tiles, isa, tmp_path):
    _check_host(spec, tmp_path, isa, 1, **tiles)


@pytest.mark.host
def test_generic_plain_march_and_eight_lanes(tmp_path):
    """generic with plain -march=x86-64: vector extensions must still compile and be right (the
    8-lane variant too)."""
    _check_host(MATMULS[6], tmp_path, "generic", 1, gcc_march="x86-64")
    plan = hand_plan(CONVS[4], "generic", 1, gcc_march="x86-64")
    plan = dataclasses.replace(plan, vector_lanes=8, gemm=dataclasses.replace(plan.gemm, nr=16),
                               function_name=plan.function_name + "_l8")
    run_host_plan(plan, tmp_path)


@pytest.mark.unit
def test_every_host_isa_compiles_or_runs_here():
    """The ISAs this run can execute: generic always, and at least the ones the detected host
    claims (a test that silently did nothing on a smaller machine would show up here)."""
    assert "generic" in RUNNABLE_ISAS and set(RUNNABLE_ISAS) <= set(ALL_HOST_ISAS)
    assert isa_for(support.host_description(RUNNABLE_ISAS[0]).cluster().core) == RUNNABLE_ISAS[0]


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


@pytest.mark.emulated
@needs_arm
@pytest.mark.matrix(every=2)   # each operator shape and core stays in the sample
@pytest.mark.parametrize("core", ["a55", "a76"])
@pytest.mark.parametrize("spec", NEON_SPECS, ids=_ids)
def test_neon_qemu(spec, core, tmp_path):
    if core == "a55":
        cpu, bits, mr, march = _a55_model(), 64, 6, "armv8.2-a"
    else:
        cpu, bits, mr, march = "cortex-a76", 128, 7, "armv8.2-a+fp16+dotprod"
    plan = hand_plan(spec, "neon", 2, mr=mr, nr=8, kc=128, a_load_bits=bits, gcc_march=march, qemu_cpu=cpu)
    rendered = render_cpu_kernel(plan)
    if plan.gemm is not None:
        assert ("vfmaq_lane_f32" if bits == 64 else "vfmaq_laneq_f32") in rendered.source
    binary = build_arm(rendered, tmp_path)
    a, b, bias = make_inputs(spec, seed=3)
    meas = qemu_run(binary, spec, a, b, bias, qemu_cpu=plan.qemu_cpu, repeats=2)
    out = meas.output
    support.assert_verified(spec, out, a, b, bias, f"neon on {cpu}")
    assert "emulated" in meas.where and len(meas.samples_s) == 2
    assert_samples_positive(meas.samples_s)
    support.record("neon (qemu)", "ran")


@pytest.mark.unit
def test_neon_a_load_groups():
    assert [g["width"] for g in a_load_groups("neon", 7, 128)] == [4, 2, 1]
    assert [g["width"] for g in a_load_groups("neon", 6, 64)] == [2, 2, 2]
    assert [g["width"] for g in a_load_groups("avx512", 3, 128)] == [1, 1, 1]
    rows = [r["row"] for g in a_load_groups("neon", 7, 128) for r in g["rows"]]
    assert rows == list(range(7))


# ---------------------------------------------------------------------------------------------
# Rendering, build products, timing, errors
# ---------------------------------------------------------------------------------------------

@pytest.mark.unit
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


@pytest.mark.unit
def test_depthwise_render_has_named_constants():
    src = render_cpu_kernel(hand_plan(DEPTHWISES[1], "avx512", 1, ow_vectors=2, oh_rows=3)).source
    assert "#define XFC_OH_ROWS 3" in src and "#define XFC_OW_VECTORS 2" in src and "#define XFC_SW 2" in src


@pytest.mark.unit
@pytest.mark.parametrize("change,message", [
    (lambda p: dataclasses.replace(p, vector_lanes=8), "vector_lanes"),
    (lambda p: dataclasses.replace(p, lowering="direct_depthwise"), "lowering"),
    (lambda p: dataclasses.replace(p, gemm=dataclasses.replace(p.gemm, nr=24)), "multiple"),
    (lambda p: dataclasses.replace(p, gemm=dataclasses.replace(p.gemm, mc=15)), "mc"),
    (lambda p: dataclasses.replace(p, gemm=dataclasses.replace(p.gemm, parallel_axis="k")), "parallel_axis"),
    (lambda p: dataclasses.replace(p, function_name="bad name"), "C identifier"),
    (lambda p: dataclasses.replace(p, isa="sse"), "isa"),
], ids=["lanes", "lowering", "nr", "mc", "axis", "name", "isa"])
def test_invalid_plans_are_rejected(change, message):
    with pytest.raises(OperatorError, match=message):
        validate_plan(change(hand_plan(MATMULS[4], "avx512", 1)))


@pytest.mark.host
@pytest.mark.parametrize("isa", ALL_HOST_ISAS)
def test_build_products(isa, tmp_path):
    """build.sh holds the exact command with this ISA's -march; an identical plan reuses the
    library; nothing temporary is left; a wrong input shape is a one-line OperatorError (bad input,
    exit 2, not a wrong result)."""
    if isa in RUNNABLE_ISAS:
        kernel = _check_host(MATMULS[8], tmp_path, isa, 1)
    else:   # compiled whatever the sampling: its products are checked
        support.compile_if_sampled(render_cpu_kernel(host_plan(MATMULS[8], isa, 1)), tmp_path, every=1)
        kernel = None
    script = (tmp_path / "build.sh").read_text()
    assert "gcc" in script and "-O3" in script and "-fopenmp" in script and "-std=gnu11" in script
    assert f"-march={host_march(isa)}" in script
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    if kernel is None:  # compiled only: this CPU cannot run the ISA (recorded)
        return
    again = host_kernel(render_cpu_kernel(kernel.plan), tmp_path)
    assert again.library == kernel.library
    a, b, bias = make_inputs(MATMULS[8])
    with pytest.raises(OperatorError, match="in0 has shape") as err:
        kernel(a[:, :-1], b, bias)
    assert "\n" not in str(err.value)


@pytest.mark.host
def test_timing_samples_follow_the_work(tmp_path):
    """Every timing sample is positive, and four times the FLOPs takes longer (by a generous
    margin: best-of-repeats, and only 1.5x asked of an expected ~4x)."""
    isa = RUNNABLE_ISAS[0]
    small, large = mm(96, 128, 96), mm(192, 128, 192)
    best = {}
    for spec in (small, large):
        kernel = _check_host(spec, tmp_path / spec.key(), isa, 1)
        a, b, bias = make_inputs(spec)
        m = kernel.time(a, b, bias, repeats=15, warmup=2)
        assert isinstance(m, Measurement) and len(m.samples_s) == 15 and m.where == "host"
        assert_samples_positive(m.samples_s)
        packed = kernel.time(a, b, bias, repeats=5, warmup=1, prepacked=True)
        assert_samples_positive(packed.samples_s)
        assert "pre-packed" in packed.where
        best[spec.key()] = min(m.samples_s)
    assert large.flops == 4 * small.flops
    assert best[large.key()] > 1.5 * best[small.key()], best


@pytest.mark.unit
def test_missing_tool_is_one_clear_line(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ToolchainError) as err:
        require_tool(ARM_CC)
    text = str(err.value)
    assert "\n" not in text and ARM_CC in text and "gcc-aarch64-linux-gnu" in text
    with pytest.raises(ToolchainError, match="qemu-user"):
        require_tool(QEMU)


@pytest.mark.host
def test_compile_failure_is_toolchain_error(tmp_path):
    plan = hand_plan(MATMULS[0], "avx512", 1, gcc_march="no-such-arch", function_name="xfc_bad_march")
    with pytest.raises(ToolchainError, match="host compile of xfc_bad_march.c failed") as err:
        host_kernel(render_cpu_kernel(plan), tmp_path / "bad")
    assert "\n" not in str(err.value)


@pytest.mark.unit
@pytest.mark.parametrize("isa, mr, bits, loads", [
    ("neon", 7, 128, ((4, 0), (2, 4), (1, 6))), ("neon", 3, 128, ((2, 0), (1, 2))),
    ("neon", 6, 128, ((4, 0), (2, 4))), ("neon", 5, 64, ((2, 0), (2, 2), (1, 4))),
    ("neon_fp16", 11, 128, ((8, 0), (8, 3))), ("avx2", 6, 32, tuple((1, i) for i in range(6)))])
def test_the_register_budget_counts_the_a_loads_the_kernel_makes(isa, mr, bits, loads):
    """Issue 31 item 3: one rule (tiles.a_load_groups) for the planner's register budget and the code
    generator's A loads; the budget used to count ceil(MR / lanes) registers where MR = 3 or 7 renders
    a d-register and a single-value load beside the q ones. fp32 NEON: pieces tiling MR exactly;
    fp16 (IsaRow.a_load_overlap): loads of one width, the last overlapping (MR=11: rows 0-7, 3-10)."""
    from xfc.cpu.isa import isa_row
    from xfc.cpu.tiles import MicroTile
    groups = a_load_groups(isa, mr, bits)
    assert tuple((g["width"], g["offset"]) for g in groups) == loads
    assert [r["row"] for g in groups for r in g["rows"]] == list(range(mr))
    assert all(r["lane"] == r["row"] - g["offset"] < g["width"] for g in groups for r in g["rows"])
    row = isa_row(isa)
    if row.lane_indexed and not row.a_load_overlap:
        assert sum(g["width"] for g in groups) == mr
    tile = MicroTile(mr=mr, nr_vectors=2, lanes=8, a_load_bits=bits, elem_bytes=row.elem_bytes)
    assert tile.a_registers(isa) == (len(loads) if row.lane_indexed else 1)
