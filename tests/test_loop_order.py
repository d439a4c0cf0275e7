"""The GEMM loop order (decide.loop_order): the BLIS order (B micro-panels outside row tiles) except
where C is written once past L2, on the dialects whose cores were timed both ways; and the other
order (row tiles outside) computes the same numbers, on ragged shapes and blockings, 1 and 2 threads."""
from __future__ import annotations

import dataclasses

import pytest

import support
from support import ALL_HOST_ISAS, host_description, recorded_host, run_host_plan
from support.cases import gemm_cases
from xfc.cpu import decide
from xfc.cpu.isa import isa_row
from xfc.cpu.synth import synthesize_cpu
from xfc.ops.spec import make_spec

import xfc

ROW_STREAM_ISAS = [isa for isa in ALL_HOST_ISAS if isa in decide.ROW_STREAM_ORDER_DIALECTS]


def _conv(c, hw_side, k, **kw):
    return make_spec("conv2d", dict(n=1, c=c, h=hw_side, w=hw_side, k=k, r=1, s=1), **kw)


@pytest.mark.unit
@pytest.mark.parametrize("isa", ROW_STREAM_ISAS)
def test_a_large_output_of_a_short_reduction_is_written_row_tile_by_row_tile(isa):
    """MobileNetV3's 112x112 expansion (K=16, 64 rows, 3.2 MB of C): row tiles outside, and the
    explanation says why; the same layer at 28x28 (C in L2) keeps the BLIS order."""
    hw = recorded_host(isa)
    big = synthesize_cpu(_conv(16, 112, 64), hw, threads=1)
    assert big.plan.gemm.loop_order == "ir_jr", big.plan.gemm
    assert "row tiles outside B micro-panels: C written once past L2" in big.explain()
    small = synthesize_cpu(_conv(16, 28, 64), hw, threads=1).plan.gemm
    assert small.loop_order == "jr_ir"


@pytest.mark.unit
def test_the_rule_reads_its_inputs():
    row = isa_row("avx512")
    args = dict(k=16, kc=16, mr=14, mc=64, nc=4096, c_bytes_per_thread=3.2e6, l2_share_bytes=0.75e6, elem_bytes=4)
    assert decide.loop_order(row, False, **args)[0] == "ir_jr"
    assert decide.loop_order(row, True, **args)[0] == "jr_ir"                      # transposed C: tile store
    assert decide.loop_order(row, False, **{**args, "kc": 8})[0] == "jr_ir"       # C revisited per slice
    assert decide.loop_order(row, False, **{**args, "mc": 14})[0] == "jr_ir"      # one row tile: same order
    assert decide.loop_order(row, False, **{**args, "c_bytes_per_thread": 0.5e6})[0] == "jr_ir"
    assert decide.loop_order(row, False, **{**args, "nc": 16384})[0] == "jr_ir"   # B block past L2
    assert decide.loop_order(isa_row("neon"), False, **args)[0] == "jr_ir"        # not timed on NEON


@pytest.mark.unit
@pytest.mark.parametrize("hw_name", ["cortex-a76", "snapdragon-865"])
def test_neon_keeps_the_blis_order(hw_name):
    plan = synthesize_cpu(_conv(16, 112, 64), xfc.load_hardware(hw_name), threads=1).plan
    assert plan.gemm.loop_order == "jr_ir"


# Ragged shapes whose C passes the L2 share: rows and columns not multiples of the tile.
RAGGED = [(13, 101, 37, 1), (16, 97, 70, 2), (5, 131, 23, 1), (24, 83, 61, 2)]


@pytest.mark.host
@pytest.mark.parametrize("isa", ROW_STREAM_ISAS)
@pytest.mark.parametrize("c,side,k,threads", RAGGED, ids=[f"c{c}-{s}x{s}-k{k}-t{t}" for c, s, k, t in RAGGED])
def test_synthesized_row_tile_order_is_exact(isa, c, side, k, threads, tmp_path):
    """The synthesizer's plan for this host in the row-tile order (forced: whether the rule picks it
    depends on this host's L2), against the oracle."""
    spec = _conv(c, side, k, bias=True, activation="relu6")
    plan = synthesize_cpu(spec, host_description(isa), threads=threads).plan
    plan = dataclasses.replace(plan, gemm=dataclasses.replace(plan.gemm, loop_order="ir_jr"))
    run_host_plan(plan, tmp_path, seed=3, what=f"{isa} threads={threads} ir_jr {plan.header_lines}")


KC, K_UNROLL = 24, 4
HAND = [(isa, case) for isa in ROW_STREAM_ISAS
        for case in gemm_cases(*isa_row(isa).hand_tile, isa_row(isa).hand_lanes, KC, K_UNROLL)[::3]]


@pytest.mark.host
@pytest.mark.parametrize("isa,case", HAND, ids=[f"{i}-{c.id}" for i, c in HAND])
def test_hand_row_tile_order_on_edge_cases(isa, case, tmp_path):
    """Every tail corner and K around the unroll and KC slices, with MC of two row tiles and NC of
    one column tile, in the row-tile-outside order."""
    mr, nr = isa_row(isa).hand_tile
    spec = make_spec("matmul", dict(m=case.m, n=case.n, k=case.k), bias=case.bias, activation=case.activation)
    plan = support.host_plan(spec, isa, 1, mr=mr, nr=nr, kc=KC, k_unroll=K_UNROLL, mc=2 * mr, nc=nr,
                             loop_order="ir_jr", function_name=f"xfc_order_{isa}")
    run_host_plan(plan, tmp_path, seed=5, what=f"{isa} ir_jr {case.why}")
