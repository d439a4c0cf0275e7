"""The bottom-up CPU synthesizer: constraints hold, choices follow the hardware, it is fast and
deterministic, and what it synthesizes is correct (host natively, ARM under qemu-aarch64)."""
from __future__ import annotations

import random
import time

import pytest

import xfc
from xfc.build import build_arm, build_host, run_qemu
from xfc.codegen_cpu import render_cpu_kernel
from xfc.ops import check_output, make_inputs, make_spec
from xfc.workloads import SUITE, suite_spec
from xfc.synth_cpu import StaticEvaluator, MicroTile, MicroTileScore, synthesize_cpu


@pytest.fixture(scope="module")
def host():
    return xfc.load_hardware("host")


# ---------------------------------------------------------------------------------------------
# Synthesis itself.
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("hw_name", ["host", "snapdragon.yaml", "cortex-a55", "cortex-x1", "exynos-2100"])
def test_every_suite_workload_synthesizes_in_under_a_second(hw_name):
    hw = xfc.load_hardware(hw_name)
    for name in SUITE:
        start = time.perf_counter()
        result = synthesize_cpu(suite_spec(name), hw)
        elapsed = time.perf_counter() - start
        assert elapsed < 1.0, (name, elapsed)
        assert result.estimate.predicted_s > 0 and result.estimate.bound in ("compute", "L2", "L3", "DRAM")


@pytest.mark.parametrize("hw_name", ["host", "cortex-a55", "cortex-a76", "cortex-x1"])
def test_register_and_cache_constraints_hold(hw_name):
    hw = xfc.load_hardware(hw_name)
    core = hw.cluster().core
    for name in SUITE:
        plan = synthesize_cpu(suite_spec(name), hw).plan
        if plan.gemm is None:
            continue
        g = plan.gemm
        lanes = plan.vector_lanes
        assert g.nr % lanes == 0
        tile = MicroTile(mr=g.mr, nr_vectors=g.nr // lanes, lanes=lanes,
                         a_load_bits=g.a_load_bits if plan.isa == "neon" else 32)
        assert tile.registers(plan.isa) <= core.vector_registers
        panels_bytes = (g.mr + g.nr) * g.kc * 4
        # Micro-panels live in L1, except deep slices streamed from L2: pre-packed matmul B reused
        # by many row tiles, and the transposed conv (its tile is stored once, after the whole K).
        streamed = plan.lowering in ("gemm", "implicit_gemm_t")
        assert panels_bytes <= core.l1d.size_bytes or (streamed and panels_bytes <= hw.cluster().l2.size_bytes // 2)
        assert g.mc * g.kc * 4 <= hw.cluster().l2.size_bytes
        assert g.mc % g.mr == 0 and g.nc % g.nr == 0


def test_deterministic():
    hw = xfc.load_hardware("snapdragon-888")
    spec = suite_spec("conv_r18_l1", bias=True, activation="relu")
    first = synthesize_cpu(spec, hw)
    assert synthesize_cpu(spec, hw) == first
    assert render_cpu_kernel(first.plan).source == render_cpu_kernel(synthesize_cpu(spec, hw).plan).source


def test_choices_follow_the_hardware():
    """A55 (in-order, 32 KiB L1, small L2), A76, X1 (4 FMA pipes, 1 MiB L2) and the host differ."""
    spec = suite_spec("mm_512")
    chosen = {}
    for name in ("cortex-a55", "cortex-a76", "cortex-x1", "host"):
        g = synthesize_cpu(spec, xfc.load_hardware(name), threads=1).plan.gemm
        chosen[name] = (g.mr, g.nr, g.kc, g.mc, g.nc, g.a_load_bits)
    assert len(set(chosen.values())) == 4, chosen
    # The in-order A55 cannot pair 128-bit loads with FMAs: it feeds A through 64-bit loads.
    assert chosen["cortex-a55"][5] == 64 and chosen["cortex-a76"][5] == 128
    # The host's register tile is whole vectors of the host's own width (16 lanes with AVX-512,
    # 8 with AVX2, 4 for generic code): it follows the detected description, not one machine.
    host_core = xfc.load_hardware("host").clusters[0].core
    lanes = host_core.fp32_lanes if host_core.isa_family != "generic" else 4
    assert chosen["host"][1] % lanes == 0


def test_explain_names_the_deciding_constraints():
    hw = xfc.load_hardware("cortex-a55")
    text = synthesize_cpu(suite_spec("mm_1024"), hw).explain()
    for needle in ("REG", "L1", "L2", "L3", "CORES", "registers", "of 32", "KiB L1d", "bound:",
                   "in-order", "not a measurement", "<-"):
        assert needle in text, needle


def test_evaluator_can_be_replaced_by_measurements():
    """A measured tile table (the tile database) replaces the static estimate of a micro-tile."""
    hw = xfc.load_hardware("cortex-a76")

    class Measured(StaticEvaluator):
        def evaluate(self, tile, core, isa):
            eff = 0.95 if (tile.mr, tile.nr) == (5, 8) else 0.5
            return MicroTileScore(cycles_per_k=1.0, efficiency=eff, bound="measured", source="tile_db:test")

    result = synthesize_cpu(suite_spec("mm_512"), hw, evaluator=Measured())
    assert (result.plan.gemm.mr, result.plan.gemm.nr) == (5, 8)
    assert result.micro_tile_source == "tile_db:test"


def test_bad_thread_and_cluster_requests():
    hw = xfc.load_hardware("snapdragon-865")
    with pytest.raises(xfc.errors.OperatorError, match="exceeds"):
        synthesize_cpu(suite_spec("mm_512"), hw, cluster="prime", threads=2)
    with pytest.raises(xfc.errors.OperatorError, match="positive"):
        synthesize_cpu(suite_spec("mm_512"), hw, threads=0)


# ---------------------------------------------------------------------------------------------
# Correctness of synthesized kernels: host (native) and ARM (qemu-aarch64).
# ---------------------------------------------------------------------------------------------

def random_specs(count, seed, max_flops):
    """Random shapes: 1s, primes, sizes just above tile multiples, strides, paddings, epilogues."""
    rng = random.Random(seed)
    edge = [1, 2, 3, 5, 7, 13, 17, 31, 33, 47, 65, 97, 129]
    specs = []
    while len(specs) < count:
        op = rng.choice(["matmul", "conv2d", "depthwise"])
        epi = dict(bias=rng.random() < 0.5, activation=rng.choice(["none", "relu", "relu6"]))
        if op == "matmul":
            shape = dict(m=rng.choice(edge + [rng.randint(1, 200)]), n=rng.choice(edge + [rng.randint(1, 200)]),
                         k=rng.choice(edge + [rng.randint(1, 300)]), batch=rng.choice([1, 1, 1, 2]))
            spec = make_spec(op, shape, **epi)
        else:
            r, s = rng.choice([(1, 1), (3, 3), (5, 5), (7, 7), (3, 1), (1, 3), (2, 2)])
            h, w = rng.randint(max(r, 1), 40), rng.randint(max(s, 1), 40)
            pads = [rng.randint(0, (r - 1)), rng.randint(0, (s - 1)), rng.randint(0, r - 1), rng.randint(0, s - 1)]
            shape = dict(n=rng.choice([1, 1, 2]), c=rng.choice([1, 3, 4, 5, 16, 17, 32]), h=h, w=w, r=r, s=s)
            if op == "conv2d":
                shape["k"] = rng.choice([1, 3, 8, 15, 16, 33, 64])
            stride = (rng.choice([1, 2]), rng.choice([1, 2]))
            dilation = (rng.choice([1, 1, 2]), 1)
            try:
                spec = make_spec(op, shape, stride=stride, pad=pads, dilation=dilation, **epi)
            except xfc.errors.OperatorError:
                continue
        if spec.flops <= max_flops:
            specs.append(spec)
    return specs


def _verify_host(spec, hw, tmp_path, threads):
    result = synthesize_cpu(spec, hw, threads=threads)
    kernel = build_host(render_cpu_kernel(result.plan), tmp_path)
    a, b, bias = make_inputs(spec, seed=1)
    ok, max_err, ratio = check_output(spec, kernel(a, b, bias), a, b, bias)
    assert ok, (spec.describe(), result.plan.header_lines, max_err, ratio)


HOST_RANDOM = random_specs(200, seed=20261122, max_flops=40_000_000)


@pytest.mark.parametrize("index", range(0, len(HOST_RANDOM), 10))
def test_random_shapes_verify_on_host(index, host, tmp_path):
    for i, spec in enumerate(HOST_RANDOM[index:index + 10]):
        _verify_host(spec, host, tmp_path / str(i), threads=1 + (i % 2))


@pytest.mark.parametrize("name", list(SUITE))
def test_suite_workloads_verify_on_host(name, host, tmp_path):
    _verify_host(suite_spec(name, bias=True, activation="relu"), host, tmp_path, threads=None)


QEMU_RANDOM = random_specs(30, seed=7, max_flops=8_000_000)


@pytest.mark.parametrize("hw_name", ["cortex-a55", "cortex-x1"])
@pytest.mark.parametrize("group", ["suite", "random"])
def test_verify_under_qemu(hw_name, group, tmp_path):
    hw = xfc.load_hardware(hw_name)
    specs = [suite_spec(n, bias=True, activation="relu6") for n in SUITE] if group == "suite" else QEMU_RANDOM
    for i, spec in enumerate(specs):
        result = synthesize_cpu(spec, hw)
        binary = build_arm(render_cpu_kernel(result.plan), tmp_path / str(i))
        a, b, bias = make_inputs(spec, seed=2)
        out, _ = run_qemu(binary, spec, a, b, bias, qemu_cpu=result.plan.qemu_cpu)
        ok, max_err, ratio = check_output(spec, out, a, b, bias)
        assert ok, (hw_name, spec.describe(), result.plan.header_lines, max_err, ratio)
