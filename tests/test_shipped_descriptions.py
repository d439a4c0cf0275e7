"""Every shipped CPU core and SoC description builds and verifies under qemu-aarch64.

For each core (in-order A53/A55/A510 included) three small ragged shapes - a matmul, a conv and a
depthwise, all with bias + ReLU6 so both clamps bite - are synthesized, cross-built with the
description's own gcc_march and run under its own qemu_cpu through both entry points (weights
packed per call, and pre-packed). Each SoC (snapdragon.yaml, the Armv9 8 Gen 2, included) runs
the same shapes with multi-threaded NEON plans on its clusters (threads from 2 up to the cluster's
cores). So a description whose -march the qemu model cannot run, or a thread split that breaks on
some cluster size, fails here.
"""
from __future__ import annotations

import numpy as np
import pytest

import support
import xfc
from support import needs_arm
from support import qemu_run
from xfc.toolchain.cpu import build_arm
from xfc.runners.qemu import qemu_cpu_models
from xfc.cpu.codegen import render_cpu_kernel
from xfc.hardware.load import SHIPPED_ROOT, load_path, shipped_files
from xfc.ops.reference import make_inputs
from xfc.ops.spec import make_spec
from xfc.cpu.synth import synthesize_cpu

SHAPES = {
    "matmul": make_spec("matmul", dict(m=23, n=37, k=41), bias=True, activation="relu6"),
    "conv2d": make_spec("conv2d", dict(c=5, h=11, w=13, k=11, r=3, s=3), stride=2, pad=(1, 0, 1, 1),
                        bias=True, activation="relu6"),
    "depthwise": make_spec("depthwise", dict(c=7, h=15, w=17, r=3, s=3), pad=1, bias=True, activation="relu6"),
}


def _descriptions():
    cores, socs = [], []
    for path in shipped_files():
        hw = load_path(path)
        if not hw.clusters:
            continue
        name = path.name if path.parent == SHIPPED_ROOT else path.stem   # snapdragon.yaml as users type it
        (cores if hw.kind == "cpu_core" else socs).append((name, hw))
    return cores, socs


CORES, SOCS = _descriptions()


def _soc_cases():
    """Per SoC: the matmul on its big (default) cluster with every big core, the conv on the little
    cluster with every little core, the depthwise with 2 threads on another multi-core cluster."""
    cases = []
    for name, hw in SOCS:
        by_role = {c.role: c for c in hw.clusters}
        big = hw.cluster()
        little = by_role.get("little", big)
        other = next((c for c in hw.clusters if c.count >= 2 and c.role not in (big.role, little.role)), big)
        for op, cluster, threads in (("matmul", big, big.count), ("conv2d", little, little.count),
                                     ("depthwise", other, 2)):
            cases.append(pytest.param(name, op, cluster.role, min(threads, cluster.count),
                                      id=f"{name}-{op}-{cluster.role}-t{min(threads, cluster.count)}"))
    return cases


def _build_and_verify(hw, op, tmp_path, cluster=None, threads=None):
    spec = SHAPES[op]
    plan = synthesize_cpu(spec, hw, cluster=cluster, threads=threads).plan
    core = hw.cluster(cluster).core
    assert plan.isa == "neon" and plan.gcc_march == core.gcc_march and plan.qemu_cpu == core.qemu_cpu
    binary = build_arm(render_cpu_kernel(plan), tmp_path)
    a, b, bias = make_inputs(spec, seed=5)
    out = qemu_run(binary, spec, a, b, bias, qemu_cpu=plan.qemu_cpu).output
    support.assert_verified(spec, out, a, b, bias, f"{hw.name} {plan.header_lines}")
    packed = qemu_run(binary, spec, a, b, bias, qemu_cpu=plan.qemu_cpu, prepacked=True).output
    support.assert_verified(spec, packed, a, b, bias, f"{hw.name} pre-packed {plan.header_lines}")
    assert np.array_equal(out, packed), f"{hw.name}: the pre-packed entry point differs from the normal one"
    support.record("neon (qemu)", "ran")
    return plan


@pytest.mark.emulated
@needs_arm
def test_every_description_names_a_qemu_model_it_can_run():
    """The gcc_march / qemu_cpu pair of every shipped core is usable: qemu has the model (or 'max')."""
    models = qemu_cpu_models()
    for name, hw in CORES + SOCS:
        for c in hw.clusters:
            assert (c.core.qemu_cpu or "max") in models, (name, c.core.name, c.core.qemu_cpu)
            assert c.core.gcc_march, (name, c.core.name)


@pytest.mark.unit
def test_descriptions_cover_the_shipped_cores():
    names = {hw.name for _, hw in CORES}
    assert {"cortex-a53", "cortex-a55", "cortex-a510", "cortex-x3"} <= names
    assert "snapdragon.yaml" in dict(SOCS)
    pipelines = {hw.cluster().core.pipeline for _, hw in CORES}
    assert pipelines == {"in_order", "out_of_order"}


# Each core builds one operator, the operators taking turns down the list of cores (every operator
# on a third of the cores, both pipelines among them); the SoC cases below build all three on each
# SoC. Every core with every operator was 42 qemu builds, a minute of a 2-core `make test`.
CORE_CASES = [pytest.param(name, op, id=f"{name}-{op}")
              for i, (name, _) in enumerate(CORES) for op in [list(SHAPES)[i % len(SHAPES)]]]


@pytest.mark.unit
def test_core_cases_cover_every_core_and_operator_on_both_pipelines():
    ops_by_pipeline: dict[str, set[str]] = {}
    for case in CORE_CASES:
        name, op = case.values
        ops_by_pipeline.setdefault(dict(CORES)[name].cluster().core.pipeline, set()).add(op)
    assert {case.values[0] for case in CORE_CASES} == {n for n, _ in CORES}
    assert ops_by_pipeline == {"in_order": set(SHAPES), "out_of_order": set(SHAPES)}, ops_by_pipeline


@pytest.mark.emulated
@needs_arm
@pytest.mark.parametrize("name,op", CORE_CASES)
def test_core_builds_and_verifies(name, op, tmp_path):
    _build_and_verify(dict(CORES)[name], op, tmp_path)


@pytest.mark.emulated
@needs_arm
@pytest.mark.matrix(every=2)   # every SoC, operator, cluster role and thread count stays in the sample
@pytest.mark.parametrize("name,op,cluster,threads", _soc_cases())
def test_soc_multithreaded_builds_and_verifies(name, op, cluster, threads, tmp_path):
    plan = _build_and_verify(dict(SOCS)[name], op, tmp_path, cluster=cluster, threads=threads)
    schedule = plan.gemm or plan.depthwise
    assert schedule.threads == threads


@pytest.mark.unit
def test_snapdragon_yaml_is_the_armv9_8_gen_2():
    hw = xfc.load_hardware("snapdragon.yaml")
    assert hw.name == "snapdragon-8-gen-2"
    assert {c.core.gcc_march for c in hw.clusters} == {"armv9-a+i8mm+bf16"}
    assert sorted(c.count for c in hw.clusters) == [1, 2, 2, 3]
