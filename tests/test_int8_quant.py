"""int8 (issue 13): quantization parameters, the exact reference, requantization, planning and
rendering. Pure Python, no process (the kernels run in tests/test_int8_host.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from xfc.cpu.int8_codegen import render_int8_kernel
from xfc.cpu.config import INT8_DIALECTS, int8_dialect, int8_registers as registers_needed
from xfc.cpu.int8_synth import plan_int8
from xfc.errors import OperatorError
from xfc.hardware.load import load
from xfc.ops.quant import (MAX_INT8_REDUCTION, QuantParams, accumulators, check_qoutput, clamp_bounds, make_qinputs,
                           multipliers, parse_quant, qreference, requantize, resolve_out_scale, validate)
from xfc.ops.spec import make_spec

pytestmark = pytest.mark.unit


# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, field", [
    ("a_scale=0", "a_scale=0"), ("a_scale=-0.5", "a_scale=-0.5"), ("w_scale=nan", "w_scale=nan"),
    ("out_scale=inf", "out_scale=inf"), ("out_scale=-inf", "out_scale=-inf"), ("a_scale=abc", "a_scale='abc'"),
    ("a_zp=256", "a_zp=256"), ("a_zp=-1", "a_zp=-1"), ("act=int8,a_zp=128", "a_zp=128"),
    ("act=int8,out_zp=-129", "out_zp=-129"), ("out_zp=1.5", "out_zp='1.5'"), ("act=fp8", "act=fp8"),
    ("per_channel=2", "per_channel=2"), ("bogus=1", "bogus=1"), ("a_zp=1,a_zp=2", "a_zp"),
])
def test_bad_quantization_parameters_are_one_line_errors(text, field):
    with pytest.raises(OperatorError) as err:
        parse_quant(text)
    message = str(err.value)
    assert field in message and "\n" not in message, message


def test_dataclass_validation_names_the_field():
    for bad, field in ((QuantParams(a_scale=0.0), "a_scale"), (QuantParams(w_scale=float("nan")), "w_scale"),
                       (QuantParams(out_scale=-1.0), "out_scale"), (QuantParams(a_zero_point=300), "a_zp=300"),
                       (QuantParams(act_type="int8", out_zero_point=200), "out_zp=200")):
        with pytest.raises(OperatorError, match=field):
            validate(bad)


def test_zero_points_at_both_ends_are_accepted():
    for act, lo, hi in (("uint8", 0, 255), ("int8", -128, 127)):
        for zp in (lo, hi):
            q = parse_quant(f"act={act},a_zp={zp},out_zp={zp}")
            assert (q.a_zero_point, q.out_zero_point, q.act_type) == (zp, zp, act)


def test_multiplier_outside_fp32_is_refused():
    spec = make_spec("matmul", {"m": 2, "n": 2, "k": 2})
    with pytest.raises(OperatorError, match="fp32"):
        multipliers(spec, QuantParams(a_scale=1e30, w_scale=1e30, out_scale=1e-30))


def test_reduction_beyond_int32_bound_is_refused():
    spec = make_spec("matmul", {"m": 1, "n": 1, "k": MAX_INT8_REDUCTION + 1})
    with pytest.raises(OperatorError, match="int32"):
        plan_int8(spec, QuantParams(), load("host"))


# ---------------------------------------------------------------------------------------------
# The reference against an independent scalar evaluation
# ---------------------------------------------------------------------------------------------

def _scalar_reference(spec, q, x, w, bias):
    """Loops over Python integers; requantization through Python's round() (half to even)."""
    q = resolve_out_scale(spec, q)
    mult = multipliers(spec, q)
    lo, hi = clamp_bounds(spec, q)
    out = np.zeros(spec.output_shape, np.int64)

    def finish(acc, ch):
        scaled = float(np.float32(np.float32(acc) * mult[ch]))
        return min(hi, max(lo, round(scaled) + q.out_zero_point))

    if spec.name == "matmul":
        for b in range(spec.batch):
            for i in range(spec.m):
                for j in range(spec.n):
                    acc = sum((int(x[b, i, t]) - q.a_zero_point) * int(w[b, t, j]) for t in range(spec.k))
                    out[b, i, j] = finish(acc + (int(bias[j]) if spec.epilogue.bias else 0), j)
        return out
    depthwise = spec.name == "depthwise"
    chans = spec.c if depthwise else spec.k
    for n in range(spec.n):
        for o in range(chans):
            for y in range(spec.out_h):
                for z in range(spec.out_w):
                    acc = 0
                    for c in ([o] if depthwise else range(spec.c)):
                        for r in range(spec.r):
                            for s in range(spec.s):
                                ih = y * spec.stride_h - spec.pad_top + r * spec.dilation_h
                                iw = z * spec.stride_w - spec.pad_left + s * spec.dilation_w
                                if 0 <= ih < spec.h and 0 <= iw < spec.w:
                                    wv = int(w[o, 0, r, s]) if depthwise else int(w[o, c, r, s])
                                    acc += (int(x[n, c, ih, iw]) - q.a_zero_point) * wv
                    out[n, o, y, z] = finish(acc + (int(bias[o]) if spec.epilogue.bias else 0), o)
    return out


SMALL = [
    ("matmul", {"m": 3, "n": 5, "k": 7, "batch": 2}, {}),
    ("conv2d", {"c": 3, "h": 6, "w": 7, "k": 4, "r": 3, "s": 2, "n": 2}, {"stride": "2,1", "pad": "1,1,2,0", "dilation": "1,2"}),
    ("depthwise", {"c": 3, "h": 7, "w": 6, "r": 3, "s": 3}, {"stride": "2", "pad": "1"}),
]


@pytest.mark.parametrize("op, shape, geometry", SMALL)
@pytest.mark.parametrize("act, zp", [("uint8", 0), ("uint8", 255), ("int8", -128), ("int8", 127), ("int8", 5)])
@pytest.mark.parametrize("activation, per_channel", [("none", False), ("relu", True), ("relu6", True)])
def test_reference_equals_scalar_loops(op, shape, geometry, act, zp, activation, per_channel):
    spec = make_spec(op, shape, bias=True, activation=activation, **geometry)
    q = resolve_out_scale(spec, QuantParams(act_type=act, a_zero_point=zp, per_channel=per_channel,
                                            out_zero_point=-zp // 2 if act == "int8" else 255 - zp))
    x, w, bias = make_qinputs(spec, q, seed=3)
    expected = qreference(spec, q, x, w, bias)
    assert expected.dtype == (np.uint8 if act == "uint8" else np.int8)
    np.testing.assert_array_equal(expected.astype(np.int64), _scalar_reference(spec, q, x, w, bias))


def test_requantize_rounds_half_to_even_and_saturates():
    # multiplier exactly 0.5: accumulators 1, 3, 5 -> 0.5, 1.5, 2.5 -> 0, 2, 2 (half to even)
    q = QuantParams(act_type="int8", a_scale=1.0, a_zero_point=0, w_scale=1.0, out_scale=2.0, out_zero_point=0)
    acc = np.array([1, 3, 5, -1, -3, 1000, -1000], np.int64).reshape(1, -1, 1)
    got = requantize(acc, make_spec("matmul", {"m": 7, "n": 1, "k": 1}), q).reshape(-1)
    assert got.tolist() == [0, 2, 2, 0, -2, 127, -128]


def test_relu_clamps_in_the_quantized_domain():
    spec = make_spec("matmul", {"m": 1, "n": 1, "k": 4}, activation="relu6")
    q = QuantParams(act_type="uint8", a_scale=0.1, a_zero_point=10, w_scale=0.1, out_scale=0.05, out_zero_point=20)
    assert clamp_bounds(spec, q) == (20, 20 + 120)
    relu = make_spec("matmul", {"m": 1, "n": 1, "k": 4}, activation="relu")
    assert clamp_bounds(relu, q) == (20, 255)


def test_accumulators_stay_exact_at_the_int32_bound():
    """K = 65536 with the extreme inputs: |acc| = 65536 x 255 x 128 = 2^31 - 2^23, exactly."""
    spec = make_spec("matmul", {"m": 1, "n": 2, "k": MAX_INT8_REDUCTION})
    for act, zp, expected_sign in (("uint8", 0, -1), ("uint8", 255, 1), ("int8", 127, 1), ("int8", -128, -1)):
        q = QuantParams(act_type=act, a_zero_point=zp, out_scale=1.0)
        x, w, bias = make_qinputs(spec, q, mode="extreme")
        acc = accumulators(spec, q, x, w, bias)
        assert np.all(acc == expected_sign * MAX_INT8_REDUCTION * 255 * 128), (act, zp)
    with pytest.raises(OperatorError, match="int32"):
        accumulators(make_spec("matmul", {"m": 1, "n": 1, "k": 65536}, bias=True), QuantParams(a_zero_point=0),
                     np.full((1, 1, 65536), 255, np.uint8), np.full((1, 65536, 1), 127, np.int8),
                     np.array([2 ** 30], np.int32))


def test_verdict_reports_share_and_lsb():
    spec = make_spec("matmul", {"m": 4, "n": 8, "k": 16})
    q = resolve_out_scale(spec, QuantParams())
    x, w, bias = make_qinputs(spec, q)
    ref = qreference(spec, q, x, w, bias)
    assert check_qoutput(spec, q, ref, x, w, bias).exact_share == 1.0
    bad = ref.copy()
    bad.reshape(-1)[5] = np.uint8(int(bad.reshape(-1)[5]) ^ 1)
    verdict = check_qoutput(spec, q, bad, x, w, bias)
    assert not verdict.ok and verdict.mismatches == 1 and verdict.max_lsb == 1
    assert math.isclose(verdict.exact_share, 1 - 1 / 32)


# ---------------------------------------------------------------------------------------------
# Planning and rendering
# ---------------------------------------------------------------------------------------------

def test_dialect_follows_the_core_and_the_vnni_flag():
    host = load("host:avx512") if "avx512" in _isas() else None
    if host is not None:
        assert int8_dialect(host.cluster().core, frozenset({"avx512_vnni"}))[0] == "vnni"
        assert int8_dialect(host.cluster().core, frozenset())[0] == "avx2"
    assert int8_dialect(load("host:generic").cluster().core)[0] == "generic"
    # ARM descriptions are planned by xfc.cpu.int8_arm (tests/test_int8_arm.py); a core without dotprod is refused
    assert plan_int8(make_spec("matmul", {"m": 4, "n": 4, "k": 4}), QuantParams(), load("snapdragon-865")).dialect == "sdot"
    with pytest.raises(OperatorError, match="lacks 'dotprod'"):
        plan_int8(make_spec("matmul", {"m": 4, "n": 4, "k": 4}), QuantParams(), load("cortex-a53"))


def _isas():
    from xfc.hardware.host import available_isas
    return available_isas()


@pytest.mark.parametrize("isa", ["avx512", "avx2", "generic"])
@pytest.mark.parametrize("flags", [frozenset(), frozenset({"avx512_vnni"})])
def test_register_tile_fits_the_registers(isa, flags):
    if isa not in _isas():
        pytest.skip(f"host:{isa} is not available here")
    hw = load(f"host:{isa}")
    for op, shape, geometry in SMALL[:2] + [("matmul", {"m": 512, "n": 512, "k": 512}, {}),
                                            ("conv2d", {"c": 64, "h": 56, "w": 56, "k": 64, "r": 3, "s": 3}, {"pad": "1"})]:
        plan = plan_int8(make_spec(op, shape, **geometry), QuantParams(), hw, host_flags=flags)
        assert plan.dialect in INT8_DIALECTS
        assert registers_needed(plan.dialect, plan.mr, plan.nv) <= hw.cluster().core.vector_registers
        assert plan.nr == plan.nv * {"vnni": 16, "avx2": 8, "generic": 4}[plan.dialect]


def test_render_is_deterministic_and_uses_the_dialect():
    hw = load("host:generic")
    spec = make_spec("conv2d", {"c": 8, "h": 9, "w": 9, "k": 16, "r": 3, "s": 3}, pad="1", bias=True)
    q = QuantParams(act_type="int8", a_zero_point=-3, per_channel=True)
    plan = plan_int8(spec, q, hw)
    a, b = render_int8_kernel(plan), render_int8_kernel(plan)
    assert a.source == b.source and plan.dialect == "generic"
    assert "vpdpbusd" not in a.source and "maddubs" not in a.source
    if "avx512" in _isas():
        vnni = render_int8_kernel(plan_int8(spec, q, load("host:avx512"), host_flags=frozenset({"avx512_vnni"})))
        assert "vpdpbusd %2, %1, %0" in vnni.source and "XFC_DPBUSD(c0_0" in vnni.source
        avx2 = render_int8_kernel(plan_int8(spec, q, load("host:avx512"), host_flags=frozenset()))
        assert "_mm256_madd_epi16" in avx2.source and "maddubs" not in avx2.source



@pytest.mark.unit
def test_int8_decisions_are_plan_fields_the_templates_only_spell():
    """Issue 31 item 3: the activation sign convention, the GEMM's row operand, the thread split, the k
    unrolling and the depthwise target pragma are taken by the planners; the templates only spell them."""
    import dataclasses

    from xfc.cpu.int8_arm import plan_arm_int8
    from xfc.cpu.int8_codegen import render_int8_kernel
    from xfc.ops.quant import QuantParams
    signed = QuantParams(act_type="int8", a_zero_point=-3)
    unsigned = QuantParams(act_type="uint8", a_zero_point=100)
    mm = make_spec("matmul", {"m": 9, "n": 17, "k": 30})
    conv = make_spec("conv2d", {"c": 6, "h": 7, "w": 9, "k": 10, "r": 3, "s": 3}, pad=1)
    dw = make_spec("depthwise", {"c": 8, "h": 9, "w": 9, "r": 3, "s": 3}, pad=1)
    host = load("host:generic")
    x86 = plan_int8(mm, signed, host)
    assert (x86.activation_offset, x86.row_operand, x86.parallel_axis, x86.k_unroll) == (128, "activations", "columns", 0)
    assert plan_int8(mm, unsigned, host).activation_offset == 0
    assert plan_int8(conv, signed, host).row_operand == "weights"
    arm = plan_arm_int8(conv, unsigned, load("cortex-a76"))
    assert (arm.activation_offset, arm.row_operand, arm.k_unroll) == (-128, "weights", 1)
    assert plan_arm_int8(mm, signed, load("cortex-a76")).activation_offset == 0
    assert "#pragma GCC unroll 1" in render_int8_kernel(arm).source
    unrolled = render_int8_kernel(dataclasses.replace(arm, k_unroll=4)).source
    assert "#pragma GCC unroll 4" in unrolled and "#pragma GCC unroll 1" not in unrolled
    assert "#pragma GCC unroll" not in render_int8_kernel(x86).source
    generic_dw = plan_int8(dw, unsigned, host)
    assert generic_dw.target_pragma == "" and "#pragma GCC target" not in render_int8_kernel(generic_dw).source
    pragma = render_int8_kernel(dataclasses.replace(generic_dw, target_pragma="avx2,fma")).source
    assert '#pragma GCC target("avx2,fma")' in pragma
    with pytest.raises(OperatorError, match="split column tiles only"):
        render_int8_kernel(dataclasses.replace(x86, parallel_axis="rows"))


@pytest.mark.parametrize("w, pads, s, width", [
    (14, (1, 1), 3, 15),      # one padding run between rows: 14 of 15 lanes outputs, not 14 of 16
    (7, (2, 1), 3, 9),        # the wider side is staged
    (5, (0, 1), 2, 6),
    (9, (0, 0), 1, 9),        # no padding: the rows as they are
    (6, (2, 2), 3, 8),        # padding as wide as the window allows: the output row (8) still fits
])
def test_flat_rows_stage_one_padding_run_between_rows(w, pads, s, width):
    from xfc.cpu.int8_synth import flat_row_width
    spec = make_spec("conv2d", {"c": 8, "h": 4, "w": w, "k": 16, "r": 1, "s": s},
                     pad=f"0,{pads[0]},0,{pads[1]}")
    assert flat_row_width(spec) == width
    assert flat_row_width(spec, "both") == w + sum(pads)
    assert spec.out_w <= flat_row_width(spec)
    plan = plan_int8(spec, QuantParams(), load("host:avx512"), threads=1, force_layout="flat")
    assert plan.flat_row_pixels == width
    both = plan_int8(spec, QuantParams(), load("host:avx512"), threads=1, force_layout="flat", flat_padding="both")
    assert both.flat_row_pixels == w + sum(pads)
    with pytest.raises(OperatorError, match="flat padding 'none'"):
        plan_int8(spec, QuantParams(), load("host:avx512"), threads=1, flat_padding="none")


@pytest.mark.parametrize("width, stride, lanes", [(7, 1, 8), (14, 2, 8), (112, 1, 16), (56, 1, 16)])
def test_depthwise_ties_go_to_fewer_lanes_past_the_row_end(width, stride, lanes):
    """On 7-wide output rows the model ties 8- and 16-lane blocks; the 8-lane one wastes 1 lane, not 9
    (and ran faster: docs/int8.md). Rows that fill whole vectors keep the wider ones."""
    spec = make_spec("depthwise", {"c": 96, "h": width, "w": width, "r": 3, "s": 3}, pad="1,1,1,1",
                     stride=str(stride), bias=True)
    plan = plan_int8(spec, QuantParams(), load("host:avx512"), threads=1,
                     host_flags=frozenset({"avx512_vnni"}))
    assert plan.dialect == "vnni" and plan.lanes == lanes
