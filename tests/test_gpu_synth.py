"""GPU synthesis without running anything: plans, Mali vs Adreno differences, errors, rendering."""
from __future__ import annotations

import dataclasses
import functools
import re
import time

import pytest

from xfc.errors import HardwareError, OperatorError
from xfc.gpu import synthesize_gpu
from xfc.gpu.codegen import render_harness, render_kernel
from xfc.hardware.load import load
from xfc.ops.spec import make_spec
from xfc.ops.workloads import SUITE, suite_spec

pytestmark = pytest.mark.unit

WORKLOADS = SUITE
HARDWARE = ("mali-g78", "adreno-650")
# Synthesis takes milliseconds; the limit only catches a search that blew up (no tight wall-clock
# limits in tests: they flake on loaded machines).
SYNTHESIS_LIMIT_S = 10.0


@pytest.fixture(scope="module")
def mali():
    return load("mali-g78")


@pytest.fixture(scope="module")
def adreno():
    return load("adreno-650")


spec_of = suite_spec


@functools.lru_cache(maxsize=None)
def _synthesis(name: str, hw_name: str):
    """synthesize_gpu of a suite operator for a shipped GPU in fp32, once per module: the tests that
    read its plan share it (synthesis is deterministic: test_fast_deterministic_and_labelled compares
    this result with a fresh one)."""
    return synthesize_gpu(spec_of(name), load(hw_name))


@pytest.mark.parametrize("hw_name", HARDWARE)
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_fast_deterministic_and_labelled(name, hw_name):
    spec, hw = spec_of(name), load(hw_name)
    t0 = time.perf_counter()
    first = synthesize_gpu(spec, hw)
    assert time.perf_counter() - t0 < SYNTHESIS_LIMIT_S
    second = _synthesis(name, hw_name)     # another synthesis of the same request (shared with later tests)
    assert first is not second and first.plan == second.plan      # across processes: test_synth_cpu.test_deterministic_across_processes
    assert [a.tile_summary() for a in first.alternatives] == [a.tile_summary() for a in second.alternatives]
    assert 0 < first.synthesis_seconds < SYNTHESIS_LIMIT_S
    # the model never predicts more than the ALU peak
    assert 0 < first.predicted_gflops <= hw.gpu.peak_fp32_gflops
    text = first.explain()
    assert "cost-model prediction, not a measurement" in text
    for level in ("REG ", "WG ", "GRID "):
        assert level in text
    occ = first.plan.occupancy
    assert f"registers ~{occ.registers} of the {occ.register_budget}-register full-occupancy budget" in text
    assert f"{occ.waves_resident} of {occ.max_waves} waves resident per compute unit" in text
    assert re.search(rf"work-group size {first.plan.work_group.size} vs max {hw.gpu.max_work_group_size}\b", text)
    assert "local memory" in text
    assert "decisions:" in text


@pytest.mark.parametrize("name", ["mm_512", "mm_bert", "conv_r18_l1", "conv_r18_l3", "conv_s2"])
def test_mali_and_adreno_plans_differ(name, adreno):
    pm = _synthesis(name, "mali-g78").plan
    pa = _synthesis(name, "adreno-650").plan
    # Mali: no on-chip __local memory -> never staged; Arm's <= 64 work-item guidance
    assert not pm.work_group.local_staging
    assert pm.work_group.size <= 64
    assert "NOT on chip" in pm.explain() or "not on chip" in pm.explain()
    assert any(d.startswith("local staging rejected") for d in pm.decisions)
    # Adreno: on-chip local memory tiling for GEMM-like work, wave-sized groups
    assert pa.work_group.local_staging
    assert pa.work_group.size >= adreno.gpu.half_warp_width
    assert pa.work_group.size > 64
    assert pa.work_group.local_bytes <= adreno.gpu.local_memory_kib * 1024
    assert any(d.startswith("local staging chosen") for d in pa.decisions)
    assert pm.tile_summary() != pa.tile_summary()
    src_m, src_a = render_kernel(pm), render_kernel(pa)
    assert "__local" not in src_m and "barrier(" not in src_m
    assert "__local" in src_a and "barrier(CLK_LOCAL_MEM_FENCE)" in src_a


def test_depthwise_is_direct_on_both(mali, adreno):
    for hw in (mali, adreno):
        plan = synthesize_gpu(spec_of("dw_mbv2_s1"), hw).plan
        assert plan.lowering == "direct_depthwise" and not plan.work_group.local_staging


def _accumulator_registers(src: str) -> int:
    """32-bit registers the rendered kernel's accumulators alone need: distinct acc_<i>_<j>
    variables times the lanes of their type (float4 / float)."""
    names = set(re.findall(r"\bacc_\d+_\d+\b", src))
    lanes = 4 if "typedef float4 vt_t;" in src else 1
    return len(names) * lanes


@pytest.mark.parametrize("hw_name", HARDWARE)
@pytest.mark.parametrize("name", ["mm_512", "conv_r18_l1", "conv_s2", "dw_mbv2_s1"])
def test_occupancy_is_physically_possible(name, hw_name):
    """Facts any resident set of waves must satisfy, checked without the occupancy formula: the
    register estimate covers the accumulators the rendered kernel declares; the resident waves
    fit the register file (Adreno) and the per-CU wave limit; the resident work-groups fit the
    resident waves and the on-chip local memory; on Mali, above the full-occupancy register budget
    occupancy is below the maximum (Arm's published rule) and at or below it, full."""
    hw = load(hw_name)
    g = hw.gpu
    plan = _synthesis(name, hw_name).plan
    occ, wg = plan.occupancy, plan.work_group
    assert occ.registers >= _accumulator_registers(render_kernel(plan)) > 0
    assert 1 <= occ.waves_resident <= g.max_waves_per_cu == occ.max_waves
    wg_waves = -(-wg.size // g.warp_width)
    assert 1 <= occ.work_groups_per_cu and occ.work_groups_per_cu * wg_waves <= occ.waves_resident
    if wg.local_staging and g.local_memory_on_chip:
        assert occ.work_groups_per_cu * wg.local_bytes <= g.local_memory_kib * 1024
    if g.register_file_bytes_per_cu:
        assert occ.waves_resident * g.warp_width * occ.registers * 4 <= g.register_file_bytes_per_cu
    else:
        budget = g.registers_per_thread_full_occupancy
        assert (occ.waves_resident == g.max_waves_per_cu) == (occ.registers <= budget), occ


def test_requested_work_group_cap_is_honoured(adreno):
    plan = synthesize_gpu(spec_of("mm_512"), adreno, max_work_group_size=128).plan
    assert plan.work_group.size <= 128
    assert "requested maximum 128" in plan.explain()


def test_bad_requests(mali, adreno):
    spec = spec_of("mm_512")
    with pytest.raises(OperatorError, match="larger than"):
        synthesize_gpu(spec, mali, max_work_group_size=mali.gpu.max_work_group_size + 1)
    with pytest.raises(OperatorError):
        synthesize_gpu(spec, mali, max_work_group_size=0)
    with pytest.raises(OperatorError, match="dtype"):
        synthesize_gpu(spec, mali, dtype="int8")
    no_fp16 = dataclasses.replace(adreno, gpu=dataclasses.replace(adreno.gpu, fp16_flop_per_clock_per_cu=None))
    with pytest.raises(HardwareError, match="fp16"):
        synthesize_gpu(spec, no_fp16, dtype="fp16")
    no_ext = dataclasses.replace(mali, gpu=dataclasses.replace(
        mali.gpu, extensions=tuple(e for e in mali.gpu.extensions if e != "cl_khr_fp16")))
    with pytest.raises(HardwareError, match="cl_khr_fp16"):
        synthesize_gpu(spec, no_ext, dtype="fp16")
    cpu_only = load("cortex-a76")
    assert cpu_only.gpu is None
    with pytest.raises(HardwareError, match="no GPU"):
        synthesize_gpu(spec, cpu_only)
    with pytest.raises(HardwareError) as err:
        synthesize_gpu(spec, cpu_only)
    assert "\n" not in str(err.value) and "cortex-a76" in str(err.value)
    with pytest.raises(OperatorError) as err:
        synthesize_gpu(spec, mali, max_work_group_size=10 ** 6)
    assert "\n" not in str(err.value) and str(mali.gpu.max_work_group_size) in str(err.value)


def test_soc_description_resolves_gpu():
    hw = load("snapdragon-865")
    plan = synthesize_gpu(spec_of("conv_r18_l1"), hw).plan
    assert plan.hardware_name == "snapdragon-865" and plan.family == "adreno"
    assert "snapdragon-865" in plan.header_lines[0]


@pytest.mark.parametrize("hw_name", HARDWARE)
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_renders_fp32_and_fp16(name, hw_name):
    spec, hw = spec_of(name), load(hw_name)
    plan = synthesize_gpu(spec, hw, dtype="fp16").plan
    assert plan.variant == "fp16"
    half_src = render_kernel(plan)
    assert "#pragma OPENCL EXTENSION cl_khr_fp16 : enable" in half_src
    assert "typedef half ct_t;" in half_src
    # fp16 storage must run where cl_khr_fp16 is missing: no half arithmetic, no extension pragma
    storage_src = render_kernel(plan.with_variant("fp16_storage"))
    assert "#pragma OPENCL EXTENSION cl_khr_fp16" not in storage_src and "typedef float ct_t;" in storage_src
    assert "vload_half" in storage_src and "vstore_half" in storage_src
    fp32 = _synthesis(name, hw_name).plan
    src = render_kernel(fp32)
    assert src.startswith("// xfc-launch: kernel=xfc_")
    assert f"{hw.name}" in src and spec.describe() in src and "xfc 0." in src
    assert not re.search(r"\bhalf\d*\b|_half\b|cl_khr_fp16", src), "fp32 kernel mentions half types"


def test_harness_renders_shape_free():
    text = render_harness()
    assert "xfc-launch" in text and "CL_QUEUE_PROFILING_ENABLE" in text and "#include <CL/cl.h>" in text


# PoCL's LLVM spent over a minute on `#pragma unroll 4` over `k < K` when 4 did not divide the constant K
# (the soak's one timeout: mali-g78 fp16 matmul k=1175). The loop over global memory now unrolls
# whole groups of KU steps and runs the rest of K in a plain loop after it. mali-g78 plans these
# shapes with that loop (checked below); a staged plan's unrolled loop runs TKS = 8, 16 or 32 steps,
# zero-filled past K, and is not changed.
@pytest.mark.parametrize("k", [1, 3, 4, 5, 7, 1175, 1176])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_an_unrolled_k_loop_leaves_no_remainder(k, dtype):
    spec = make_spec("matmul", dict(m=100, n=2, k=k), activation="relu6")
    plan = synthesize_gpu(spec, load("mali-g78"), dtype=dtype).plan
    flags, ku = dict(plan.flags), plan.register_tile.k_unroll
    assert dict(plan.constants)["TKS"] == 0, "staged: the test no longer reaches the loop it is about"
    assert flags["k_tail"] == (k % ku != 0)
    src = render_kernel(plan)
    unrolled = re.search(r"#pragma unroll (\d+)\n\s*for \([^;]*; k < ([^;]+);", src)
    assert unrolled and int(unrolled.group(1)) == ku, src
    # the pragma's loop runs a multiple of KU steps: all of K, or K less its remainder
    assert unrolled.group(2) == ("K - K % KU" if flags["k_tail"] else "K")
    assert ("for (; k < K; ++k)" in src) == flags["k_tail"]
