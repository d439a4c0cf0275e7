"""Deliberately wrong kernels (xfc/testing/mutants.py) must fail the suite's checks; the real ones pass.

Every case runs the same inputs through the unmutated kernel (which must pass) and the mutant
(which must fail, and fail in the check named: a guard zone, the NaN pre-fill, the worst-case
bound or the RMS limit). `mutate` itself refuses an edit that leaves the source unchanged or a
mutant that cannot change this plan's result, so none of these tests can pass vacuously.
"""
from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

from xfc.toolchain.tools import ARM_CC, QEMU
from support import host_kernel, qemu_run
from xfc.toolchain.cpu import build_arm
from xfc.cpu.plans import hand_plan
from xfc.cpu.codegen import render_cpu_kernel
from xfc.errors import OperatorError, VerificationError
from xfc.hardware.host import detect_host
from xfc.testing.mutants import MUTANTS, mutate
from xfc.ops.spec import Epilogue, make_spec
from xfc.ops.reference import check_output, make_inputs, reference
from xfc.testing.sanitize import host_isas
from xfc.cpu.synth import synthesize_cpu
from xfc.ops.workloads import SUITE, suite_spec

pytestmark = pytest.mark.host

HOST_ISAS = host_isas()
HAVE_ARM = shutil.which(ARM_CC) is not None and shutil.which(QEMU) is not None


def _inputs(spec, bias_scale=1.0, seed=0):
    a, b, bias = make_inputs(spec, seed)
    return a, b, None if bias is None else (bias * np.float32(bias_scale)).astype(np.float32)


def suite_checks(kernel, spec, a, b, bias) -> str:
    """What the test suite does with a host kernel: both entry points, guards, check_output.
    '' if it passes, else the first failure (one line)."""
    try:
        outputs = [kernel(a, b, bias), kernel.run_packed(a, kernel.prepack(b), bias)]
    except VerificationError as exc:
        return str(exc)
    for out in outputs:
        verdict = check_output(spec, out, a, b, bias)
        if not verdict.ok:
            return verdict.reason
    return ""


def _host_case(tmp_path, spec, mutant, isa="avx2", threads=1, bias_scale=1.0, **plan):
    """(failure of the real kernel, failure of the mutant) on the same inputs."""
    rendered = render_cpu_kernel(hand_plan(spec, isa, threads, **plan))
    inputs = _inputs(spec, bias_scale)
    real = suite_checks(host_kernel(rendered, tmp_path / "real"), spec, *inputs)
    wrong = suite_checks(host_kernel(mutate(rendered, mutant), tmp_path / mutant), spec, *inputs)
    return real, wrong


def mm(m, n, k, batch=1, **epi):
    return make_spec("matmul", dict(m=m, n=n, k=k, batch=batch), **epi)


def conv(c, h, w, k, r, s, n=1, **opts):
    return make_spec("conv2d", dict(n=n, c=c, h=h, w=w, k=k, r=r, s=s), **opts)


def dw(c, h, w, r, s, n=1, **opts):
    return make_spec("depthwise", dict(n=n, c=c, h=h, w=w, r=r, s=s), **opts)


# (id, mutant, spec, plan overrides, bias scale, the text of the check that must reject it)
CASES = [
    ("mm_tail_batch2", "tail_store_mr_rows", mm(29, 40, 37, batch=2, bias=True), {}, 1, "past the end of out"),
    ("conv_tail", "tail_store_mr_rows", conv(6, 9, 8, 13, 3, 3, n=2, pad=1), {}, 1, "past the end of out"),
    ("conv_t_tail", "tail_store_mr_rows", conv(5, 8, 9, 16, 3, 3, pad=(1, 0, 0, 1)),
     {"transposed": True, "a_pack": "packed"}, 1, "past the end of out"),
    ("mm_relu6", "drop_relu6_clamp", mm(17, 33, 20, bias=True, activation="relu6"), {}, 8, "K-derived bound"),
    ("dw_relu6", "drop_relu6_clamp", dw(6, 11, 13, 3, 3, pad=1, bias=True, activation="relu6"), {}, 8,
     "K-derived bound"),
    ("conv_relu6", "drop_relu6_clamp", conv(4, 8, 9, 7, 3, 3, stride=2, pad=1, bias=True, activation="relu6"), {},
     8, "K-derived bound"),
    ("conv_pad", "pad_top_off_by_one", conv(3, 11, 10, 7, 3, 3, n=2, stride=2, pad=(1, 0, 2, 1)), {}, 1,
     "K-derived bound"),
    ("dw_pad", "pad_top_off_by_one", dw(5, 9, 11, 3, 3, n=2, pad=(0, 1, 1, 1), dilation=(2, 1)), {}, 1,
     "K-derived bound"),
    ("mm_unwritten_relu", "unwritten_last_row", mm(13, 21, 30, bias=True, activation="relu"), {}, 1, "non-finite"),
    ("conv_unwritten", "unwritten_last_row", conv(3, 8, 8, 5, 3, 3, pad=1, activation="relu"), {}, 1,
     "non-finite"),
    ("dw_unwritten", "unwritten_last_row", dw(4, 7, 9, 3, 3, activation="relu"), {}, 1, "non-finite"),
    ("mm_drop_k", "drop_last_k", mm(11, 19, 37), {"kc": 16}, 1, "K-derived bound"),
    ("mm_minus_one", "out_pointer_minus_one", mm(9, 17, 8, batch=2), {}, 1, "before the start of out"),
    ("dw_minus_one", "out_pointer_minus_one", dw(3, 6, 7, 3, 3), {}, 1, "before the start of out"),
    ("mm_split", "thread_split_drops_last_panel", mm(20, 70, 12), {"threads": 3}, 1, "non-finite"),
    ("dw_split", "thread_split_drops_last_panel", dw(5, 6, 7, 3, 3, n=2), {"threads": 2}, 1, "non-finite"),
    ("mm_packed_size", "packed_size_too_small", mm(10, 37, 23, batch=2), {}, 1, "packed weights"),
]


@pytest.mark.parametrize("case_id, name, spec, plan, bias_scale, caught_by", CASES, ids=[c[0] for c in CASES])
def test_mutant_fails_and_real_kernel_passes_on_host(tmp_path, case_id, name, spec, plan, bias_scale, caught_by):
    plan = dict(plan)
    threads = plan.pop("threads", 1)
    if name == "drop_relu6_clamp":  # the clamp can only matter if the outputs go above 6
        unclamped = dataclasses.replace(spec, epilogue=Epilogue(bias=True))
        assert (reference(unclamped, *_inputs(spec, bias_scale)) > 6).mean() > 0.05
    real, wrong = _host_case(tmp_path, spec, name, threads=threads, bias_scale=bias_scale, **plan)
    assert real == "", real
    assert wrong, f"mutant {name} passed the checks"
    assert caught_by in wrong, wrong


@pytest.mark.parametrize("isa", HOST_ISAS)
def test_tail_store_is_caught_on_every_host_isa(tmp_path, isa):
    real, wrong = _host_case(tmp_path, mm(27, 45, 33, batch=2, bias=True, activation="relu"), "tail_store_mr_rows",
                             isa=isa, threads=2)
    assert real == "" and "past the end of out" in wrong, (real, wrong)


def test_tail_store_inside_a_batch_is_overwritten_later_but_the_last_item_is_guarded(tmp_path):
    """The review's example: extra rows of batch item 0 land in item 1, which is computed later;
    only the last item's rows leave the buffer. The guard catches exactly those."""
    spec = mm(29, 40, 37, batch=3)
    _, wrong = _host_case(tmp_path, spec, "tail_store_mr_rows")
    extra_rows = 6 - 29 % 6                      # avx2 hand plan: MR = 6
    assert f"wrote {extra_rows * 40} float(s) past the end of out" in wrong, wrong


def test_fp16_operands_pass_the_worst_case_bound_but_fail_the_rms_limit(tmp_path):
    """mm_1024 (K = 1024): the mutant's error is within the K-derived bound everywhere; only the
    statistical check rejects it. The real kernel passes with the RMS check applied."""
    spec = suite_spec("mm_1024")
    rendered = render_cpu_kernel(synthesize_cpu(spec, detect_host()).plan)
    a, b, bias = make_inputs(spec)
    real = check_output(spec, host_kernel(rendered, tmp_path / "real")(a, b, bias), a, b, bias)
    assert real.ok and real.rms_limit is not None and real.rms_ratio < 0.25, real
    out = host_kernel(mutate(rendered, "fp16_operands"), tmp_path / "fp16")(a, b, bias)
    assert check_output(spec, out, a, b, bias, statistical=False).ok
    wrong = check_output(spec, out, a, b, bias)
    assert not wrong.ok and "statistical limit" in wrong.reason, wrong


def test_fp16_operands_fail_on_conv_with_k_2304(tmp_path):
    spec = suite_spec("conv_r18_l3")
    real, wrong = _host_case(tmp_path, spec, "fp16_operands", isa=HOST_ISAS[0], threads=2)
    assert real == "" and "statistical limit" in wrong, (real, wrong)


LARGE_K = [name for name in SUITE if suite_spec(name).reduction_size >= 64]


@pytest.mark.parametrize("name", list(SUITE))
def test_real_suite_kernels_pass_with_the_rms_check_applied(tmp_path, name):
    """The synthesized host kernels of the workload suite pass check_output, and for every
    workload with K >= 64 the statistical check was part of the verdict."""
    spec = suite_spec(name)
    kernel = host_kernel(render_cpu_kernel(synthesize_cpu(spec, detect_host(), threads=2).plan), tmp_path)
    a, b, bias = make_inputs(spec, seed=3)
    verdict = check_output(spec, kernel(a, b, bias), a, b, bias)
    assert verdict.ok, verdict.reason
    assert (verdict.rms_limit is not None) == (name in LARGE_K)


@pytest.mark.parametrize("name", ["mm_1024", "conv_r18_l3", "mm_bert"])
def test_generic_isa_without_fma_passes_the_rms_check(tmp_path, name):
    """The generic dialect compiled for baseline x86-64 (no FMA: products and sums rounded
    separately, the n_r = 2K + 2 case of the derivation) passes too."""
    spec = suite_spec(name)
    kernel = host_kernel(render_cpu_kernel(hand_plan(spec, "generic", 2, gcc_march="x86-64")), tmp_path)
    a, b, bias = make_inputs(spec)
    verdict = check_output(spec, kernel(a, b, bias), a, b, bias)
    assert verdict.ok and verdict.rms_ratio < 0.5, verdict


# ---------------------------------------------------------------------------------------------
# The hook itself
# ---------------------------------------------------------------------------------------------

@pytest.mark.unit
def test_mutate_refuses_unknown_inapplicable_and_vacuous_mutants():
    rendered = render_cpu_kernel(hand_plan(mm(12, 16, 8), "avx2"))      # M a multiple of MR=6
    with pytest.raises(OperatorError, match="unknown test mutant"):
        mutate(rendered, "nope")
    with pytest.raises(OperatorError, match="no row tail"):
        mutate(rendered, "tail_store_mr_rows")
    with pytest.raises(OperatorError, match="relu6"):
        mutate(rendered, "drop_relu6_clamp")
    with pytest.raises(OperatorError, match="padded window"):
        mutate(rendered, "pad_top_off_by_one")


@pytest.mark.unit
def test_every_mutant_changes_the_source_and_leaves_the_original_alone():
    specs = [mm(13, 20, 9, bias=True, activation="relu6"),
             conv(3, 7, 8, 5, 3, 3, pad=1, bias=True, activation="relu6"),
             dw(4, 7, 9, 3, 3, pad=1, bias=True, activation="relu6")]
    applied = set()
    for spec in specs:
        rendered = render_cpu_kernel(hand_plan(spec, "avx2"))
        before = rendered.source
        for name, mutant in MUTANTS.items():
            if mutant.applies(rendered):
                continue
            mutated = mutate(rendered, name)
            assert mutated.source != before and rendered.source == before
            assert mutated.harness_source == rendered.harness_source
            applied.add(name)
    assert applied == set(MUTANTS)


# ---------------------------------------------------------------------------------------------
# The same checks through the C harness under qemu (what also runs on phones)
# ---------------------------------------------------------------------------------------------

QEMU_CASES = [
    ("tail_store_mr_rows", mm(29, 40, 37, batch=2, bias=True), "past the end of out"),
    ("out_pointer_minus_one", dw(3, 6, 7, 3, 3), "before the start of out"),
    ("unwritten_last_row", conv(3, 8, 8, 5, 3, 3, pad=1, activation="relu"), "non-finite"),
    ("packed_size_too_small", mm(10, 37, 23, batch=2), "packed weights"),
    ("drop_relu6_clamp", dw(6, 11, 13, 3, 3, pad=1, bias=True, activation="relu6"), "K-derived bound"),
]


@pytest.mark.emulated
@pytest.mark.skipif(not HAVE_ARM, reason=f"{ARM_CC} or {QEMU} not installed")
@pytest.mark.parametrize("name, spec, caught_by", QEMU_CASES, ids=[c[0] for c in QEMU_CASES])
def test_mutant_fails_under_qemu_through_the_c_harness(tmp_path, name, spec, caught_by):
    rendered = render_cpu_kernel(hand_plan(spec, "neon", 2, qemu_cpu="cortex-a76"))
    inputs = _inputs(spec, 8 if name == "drop_relu6_clamp" else 1)

    def checks(binary) -> str:
        try:
            for prepacked in (False, True):
                out = qemu_run(binary, spec, *inputs, qemu_cpu="cortex-a76", prepacked=prepacked).output
                verdict = check_output(spec, out, *inputs)
                if not verdict.ok:
                    return verdict.reason
        except VerificationError as exc:
            return str(exc)
        return ""

    assert checks(build_arm(rendered, tmp_path / "real")) == ""
    wrong = checks(build_arm(mutate(rendered, name), tmp_path / name))
    assert caught_by in wrong, wrong
