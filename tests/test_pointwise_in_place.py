"""A pointwise convolution lowered with output pixels as GEMM rows (implicit_gemm_t) reads its input
in place: the zero-padded, phase-split image it would stage is the image itself (no padding, one
column phase), so nothing is copied and no barrier waits on a copy. Checked against the oracle on
ragged shapes, batches of two, both ways of reading A (in place, packed panels), 1 and 2 threads."""
from __future__ import annotations

import dataclasses

import pytest

import support
from support import ALL_HOST_ISAS, host_description, recorded_host, run_host_plan
from xfc.cpu import decide
from xfc.cpu.codegen import render_cpu_kernel
from xfc.cpu.isa import isa_row
from xfc.cpu.synth import candidate_syntheses, synthesize_cpu
from xfc.errors import OperatorError
from xfc.ops.spec import make_spec


def _pointwise(n, c, h, w, k, **kw):
    return make_spec("conv2d", dict(n=n, c=c, h=h, w=w, k=k, r=1, s=1), **kw)


def _transposed(spec, hw, threads, a_pack):
    cands = candidate_syntheses(spec, hw, threads=threads, top=80)
    return next(c.plan for c in cands if c.plan.lowering == "implicit_gemm_t" and c.plan.gemm.a_pack == a_pack)


@pytest.mark.unit
def test_only_a_pointwise_convolution_is_read_in_place():
    assert decide.stage_copy(_pointwise(1, 8, 7, 7, 4), transposed=True) == "none"
    padded = make_spec("conv2d", dict(n=1, c=8, h=7, w=7, k=4, r=3, s=3), pad=(1, 1))
    strided = make_spec("conv2d", dict(n=1, c=8, h=8, w=8, k=4, r=1, s=1), stride=(2, 2))
    assert decide.stage_copy(padded, transposed=True) == "run"     # 3x3: the staged image is padded
    assert decide.stage_copy(strided, transposed=True) == "strided"


@pytest.mark.unit
def test_the_rendered_kernel_copies_nothing_and_a_staged_plan_is_refused():
    hw = recorded_host("avx512")
    plan = _transposed(_pointwise(1, 24, 14, 14, 40, bias=True), hw, 2, "im2col_direct")
    source = render_cpu_kernel(plan).source
    assert plan.gemm.stage_copy == "none" and "xfc_stage_rows" not in source
    assert "input read in place" in source and "#pragma omp barrier" not in source
    staged = dataclasses.replace(plan, gemm=dataclasses.replace(plan.gemm, stage_copy="run"))
    with pytest.raises(OperatorError, match="stage_copy"):
        render_cpu_kernel(staged)


SHAPES = [(2, 13, 7, 9, 37, 1), (1, 40, 5, 11, 70, 2), (2, 3, 6, 14, 17, 2), (1, 96, 14, 14, 24, 1),
          (1, 7, 7, 7, 33, 2)]
# MR values that do not divide the width: a tile's pixels span output rows (read in place, they are
# still consecutive floats of the image), and M leaves a row tail
MRS = [4, 5, 14]


@pytest.mark.unit
def test_a_pointwise_tile_reads_in_place_whatever_mr():
    hw = recorded_host("avx512")
    for w, mr in ((7, 14), (9, 4), (11, 5)):
        spec = _pointwise(1, 8, 5, w, 16)
        assert decide.default_a_pack(isa_row("avx512"), True, mr, w, pointwise=True)[0] == "im2col_direct"
        assert decide.default_a_pack(isa_row("avx512"), True, mr, w, pointwise=False)[0] == "packed"
    plan = synthesize_cpu(_pointwise(1, 960, 7, 7, 160, bias=True), hw, threads=2).plan
    if plan.lowering == "implicit_gemm_t":
        assert plan.gemm.a_pack == "im2col_direct", plan.gemm.tiles()


@pytest.mark.host
@pytest.mark.matrix(every=3)   # each ISA, A reading, MR and shape stays in the sample; test-matrices: all
@pytest.mark.parametrize("isa", ALL_HOST_ISAS)
@pytest.mark.parametrize("a_pack", ["im2col_direct", "packed"])
@pytest.mark.parametrize("mr", MRS)
@pytest.mark.parametrize("n,c,h,w,k,threads", SHAPES, ids=[f"n{n}-c{c}-{h}x{w}-k{k}-t{t}" for n, c, h, w, k, t in SHAPES])
def test_in_place_pointwise_matches_the_oracle(isa, a_pack, mr, n, c, h, w, k, threads, tmp_path):
    spec = _pointwise(n, c, h, w, k, bias=True, activation="relu6")
    plan = support.host_plan(spec, isa, threads, mr=mr, transposed=True, a_pack=a_pack,
                             function_name=f"xfc_pw_{isa}_{a_pack}_{mr}")
    assert plan.lowering == "implicit_gemm_t" and plan.gemm.stage_copy == "none"
    run_host_plan(plan, tmp_path, seed=7, what=f"{isa} {a_pack} mr={mr} threads={threads} {plan.header_lines}")


@pytest.mark.host
@pytest.mark.parametrize("isa", ALL_HOST_ISAS)
def test_the_synthesized_pointwise_plans_match_the_oracle(isa, tmp_path):
    """What the synthesizer picks for this host's ISA on MobileNet's 7x7 and 14x14 projections and a
    ragged shape, 1 and 2 threads."""
    for i, (c, hw_side, k) in enumerate([(960, 7, 160), (576, 14, 96), (13, 9, 37)]):
        for threads in (1, 2):
            spec = _pointwise(1, c, hw_side, hw_side, k, bias=True)
            plan = synthesize_cpu(spec, host_description(isa), threads=threads).plan
            run_host_plan(plan, tmp_path / f"{i}_{threads}", seed=i, what=f"{isa} threads={threads} {plan.header_lines}")
