"""GPU synthesis without running anything: plans, Mali vs Adreno differences, errors, rendering."""
from __future__ import annotations

import dataclasses
import re
import time

import pytest

from xfc.errors import HardwareError, OperatorError
from xfc.gpu import synthesize_gpu
from xfc.gpu.build import render_harness, render_kernel
from xfc.hardware import load
from xfc.ops import make_spec
from xfc.workloads import SUITE

WORKLOADS = SUITE


@pytest.fixture(scope="module")
def mali():
    return load("mali-g78")


@pytest.fixture(scope="module")
def adreno():
    return load("adreno-650")


def spec_of(name):
    op, shape, kw = WORKLOADS[name]
    return make_spec(op, shape, **kw)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_fast_deterministic_and_labelled(name, mali, adreno):
    spec = spec_of(name)
    for hw in (mali, adreno):
        t0 = time.perf_counter()
        first = synthesize_gpu(spec, hw)
        assert time.perf_counter() - t0 < 1.0
        second = synthesize_gpu(spec, hw)
        assert first.plan == second.plan
        assert [a.tile_summary() for a in first.alternatives] == [a.tile_summary() for a in second.alternatives]
        assert first.synthesis_seconds < 1.0
        assert first.predicted_gflops == first.plan.cost.gflops > 0
        # the model never predicts more than the ALU peak
        assert first.predicted_gflops <= hw.gpu.peak_fp32_gflops
        text = first.explain()
        assert "cost-model prediction, not a measurement" in text
        for level in ("REG ", "WG ", "GRID "):
            assert level in text
        assert re.search(r"registers ~\d+ of the \d+-register full-occupancy budget", text)
        assert re.search(r"\d+ of \d+ waves resident per compute unit", text)
        assert re.search(r"work-group size \d+ vs max \d+", text)
        assert "local memory" in text
        assert "decisions:" in text


@pytest.mark.parametrize("name", ["mm_512", "mm_bert", "conv_r18_l1", "conv_r18_l3", "conv_s2"])
def test_mali_and_adreno_plans_differ(name, mali, adreno):
    spec = spec_of(name)
    pm = synthesize_gpu(spec, mali).plan
    pa = synthesize_gpu(spec, adreno).plan
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


def test_mali_register_budget_drives_occupancy(mali):
    plan = synthesize_gpu(spec_of("mm_512"), mali).plan
    occ = plan.occupancy
    if occ.registers > 32:
        assert occ.waves_resident == mali.gpu.max_waves_per_cu // 2
    else:
        assert occ.waves_resident == mali.gpu.max_waves_per_cu


def test_adreno_waves_follow_register_file(adreno):
    plan = synthesize_gpu(spec_of("mm_512"), adreno).plan
    g = adreno.gpu
    expected = min(g.register_file_bytes_per_cu // (g.warp_width * plan.occupancy.registers * 4), g.max_waves_per_cu)
    assert plan.occupancy.waves_resident <= expected
    assert plan.occupancy.waves_resident >= 1


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
    for exc in (OperatorError, HardwareError):
        try:
            synthesize_gpu(spec, cpu_only if exc is HardwareError else mali,
                           **({} if exc is HardwareError else {"max_work_group_size": 10 ** 6}))
        except exc as e:
            assert "\n" not in str(e)


def test_soc_description_resolves_gpu():
    hw = load("snapdragon-865")
    plan = synthesize_gpu(spec_of("conv_r18_l1"), hw).plan
    assert plan.hardware_name == "snapdragon-865" and plan.family == "adreno"
    assert "snapdragon-865" in plan.header_lines[0]


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_renders_fp32_and_fp16(name, mali, adreno):
    spec = spec_of(name)
    for hw in (mali, adreno):
        plan = synthesize_gpu(spec, hw, dtype="fp16").plan
        assert plan.variant == "fp16"
        half_src = render_kernel(plan)
        assert "#pragma OPENCL EXTENSION cl_khr_fp16 : enable" in half_src
        assert "typedef half ct_t;" in half_src
        storage_src = render_kernel(plan.with_variant("fp16_storage"))
        assert "cl_khr_fp16" not in storage_src.split("*/")[-1] or "#pragma" not in storage_src
        assert "vload_half" in storage_src and "vstore_half" in storage_src
        fp32 = synthesize_gpu(spec, hw).plan
        src = render_kernel(fp32)
        assert src.startswith("// xfc-launch: kernel=xfc_")
        assert f"{hw.name}" in src and spec.describe() in src and "xfc 0." in src
        assert "half" not in src.split("typedef")[1]


def test_harness_renders_shape_free():
    text = render_harness()
    assert "xfc-launch" in text and "CL_QUEUE_PROFILING_ENABLE" in text and "#include <CL/cl.h>" in text
