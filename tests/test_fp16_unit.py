"""fp16 CPU kernels (issue 13), pure parts: the ISA row and tiles in 8 lanes / 2-byte elements, the
fp16 FMA rate from the description, the refusals, and the derived bound (xfc/ops/fp16.py) against
an emulation of the kernel's fp16 arithmetic in numpy, including wrong arithmetic it must reject."""
from __future__ import annotations

import numpy as np
import pytest

from support import recorded_host
from xfc.cpu.codegen import render_cpu_kernel
from xfc.cpu.config import FP16_ISA, cpu_config, fma_rate, gcc_march
from xfc.cpu.fp16 import check_fp16_target, synthesize_fp16
from xfc.cpu.isa import isa_row
from xfc.cpu.synth import synthesize_cpu
from xfc.cpu.tiles import MicroTile, enumerate_micro_tiles
from xfc.errors import HardwareError, OperatorError
from xfc.hardware.load import load
from xfc.ops.fp16 import (FP16_OVERFLOW_THRESHOLD, check_fp16_output, classical_gamma, fp16_bound,
                          to_fp16_values)
from xfc.ops.reference import make_inputs, reference
from xfc.ops.spec import make_spec

pytestmark = pytest.mark.unit


# ---- ISA row, tiles, cost model ----------------------------------------------------------------

def test_fp16_row_is_8_lanes_of_2_bytes_and_never_chosen_for_fp32():
    row = isa_row(FP16_ISA)
    a76 = load("cortex-a76").cluster().core
    assert (row.elem_type, row.elem_bytes, row.synthesis_lanes(a76)) == ("float16_t", 2, 8)
    # the .8h assembly loops, A in v0-v15 (the indexed operand of FMLA .8h by element), overlapping A loads
    assert (row.asm_ukernels, row.indexed_registers, row.a_load_overlap) == (True, 16, True)
    assert synthesize_cpu(make_spec("matmul", dict(m=32, n=32, k=32)), load("cortex-a76")).plan.isa == "neon"


def test_micro_tiles_count_8_a_values_per_q_register():
    tiles = enumerate_micro_tiles(load("cortex-a76").cluster().core, FP16_ISA)
    assert tiles and all(t.lanes == 8 and t.elem_bytes == 2 for t in tiles)
    fp16 = MicroTile(mr=14, nr_vectors=2, lanes=8, a_load_bits=128, elem_bytes=2)
    fp32 = MicroTile(mr=14, nr_vectors=2, lanes=4, a_load_bits=128)
    # packed A budgeted as it is loaded (tiles.a_load_groups, the one rule codegen spells): fp16
    # loads overlap (IsaRow.a_load_overlap), so MR=14 is two q loads, rows 0-7 and 6-13, 2 registers
    # (pieces would be 8 + 4 + 1 + 1, four); fp32 stays in pieces 4 + 4 + 4 + 2, four registers
    assert (fp16.a_registers(FP16_ISA), fp32.a_registers("neon")) == (2, 4)
    assert MicroTile(mr=5, nr_vectors=1, lanes=8, a_load_bits=64, elem_bytes=2).loads_per_k(FP16_ISA) == (1, 2)


@pytest.mark.parametrize("core", ["cortex-a76", "cortex-a55"])
def test_cache_tiles_use_2_byte_elements(core):
    """KC fills the L1 share counted in 2-byte elements: the same KC in 4-byte units would need
    about twice the share (over the whole L1 fill), so a 4-byte count would have halved KC."""
    from xfc.cpu.cost_model import L1_FILL
    spec = make_spec("matmul", dict(m=256, n=256, k=4096))
    hw = load(core)
    result = synthesize_fp16(spec, hw, threads=1)
    g, l1 = result.plan.gemm, hw.cluster().core.l1d.size_bytes
    assert result.levels[1].decided_by.startswith(f"L1 capacity ({L1_FILL:.0%}")
    share = (g.mr + g.nr) * g.kc * 2 / l1
    assert g.nr % 8 == 0 and 0.8 * L1_FILL < share <= L1_FILL and 2 * share > L1_FILL * 1.5


def test_fp16_fma_rate_comes_from_the_description_and_predictions_double():
    hw = load("cortex-a76")
    assert hw.cluster().core.fp16_fma_per_cycle == 2.0
    core = hw.cluster().core
    assert fma_rate(core, FP16_ISA) == 2.0 and gcc_march(core, FP16_ISA).count("fp16") == 1
    spec = make_spec("matmul", dict(m=512, n=512, k=512))
    before = hw
    fp16 = synthesize_fp16(spec, hw, threads=1)
    p16 = fp16.estimate
    # issue 31: the description is never rewritten for a dtype; the plan carries the fp16 -march
    assert hw == before and hw.cluster().core.gcc_march == core.gcc_march
    assert fp16.plan.gcc_march == gcc_march(core, FP16_ISA) and fp16.plan.dtype.name == "fp16"
    cfg = cpu_config(core, "fp16")
    assert (cfg.dialect, cfg.lanes, cfg.instruction, cfg.issue_per_cycle) == (FP16_ISA, 8, "FMLA .8h", 2.0)
    p32 = synthesize_cpu(spec, hw, threads=1, lowering="direct").estimate
    peak32 = hw.cluster().peak_gflops_per_core
    assert p32.predicted_gflops <= peak32 < p16.predicted_gflops <= 2 * peak32


def test_armv9_march_gains_fp16():
    hw = load("snapdragon-8-gen-2")
    plan = synthesize_fp16(make_spec("matmul", dict(m=16, n=16, k=16)), hw).plan
    assert "armv9-a" in plan.gcc_march and plan.gcc_march.endswith("+fp16")


def test_3x3_conv_is_never_winograd_in_fp16():
    spec = make_spec("conv2d", dict(c=64, h=56, w=56, k=64, r=3, s=3), pad=1)
    assert synthesize_fp16(spec, load("cortex-a76")).plan.lowering in ("implicit_gemm", "implicit_gemm_t")


def test_fp16_source_uses_8h_intrinsics_and_fp16_types():
    spec = make_spec("conv2d", dict(c=7, h=9, w=11, k=13, r=3, s=3), pad=1, bias=True, activation="relu6")
    source = render_cpu_kernel(synthesize_fp16(spec, load("cortex-a55")).plan).source
    assert "float16x8_t" in source and "vfmaq_lane" in source and "const float *" not in source
    assert "int xfc_conv2d(const float16_t *restrict in0" in source


# ---- refusals ------------------------------------------------------------------------------------

def test_a53_is_refused_naming_core_and_feature():
    with pytest.raises(OperatorError) as err:
        synthesize_fp16(make_spec("matmul", dict(m=8, n=8, k=8)), load("cortex-a53"))
    assert "cortex-a53" in str(err.value) and "'fp16'" in str(err.value) and "\n" not in str(err.value)


def test_x86_host_is_refused():
    with pytest.raises(OperatorError, match="no fp16 CPU kernels for host:avx512 .*FP16 arithmetic .*fp32 arithmetic under an fp16 label"):
        check_fp16_target(recorded_host("avx512"))


def test_fp16_rate_needs_the_fp16_feature(tmp_path):
    from xfc.hardware import SHIPPED_ROOT
    text = (SHIPPED_ROOT / "cpu" / "cortex-a53.yaml").read_text().replace("fma_latency_cycles:",
                                                                          "fp16_fma_per_cycle: 1\nfma_latency_cycles:")
    path = tmp_path / "cortex-a53.yaml"
    path.write_text(text)
    with pytest.raises(HardwareError, match="fp16_fma_per_cycle.*'fp16'"):
        load(str(path))


# ---- the bound against an emulation of the kernel's arithmetic -----------------------------------

def _fp16_gemm(a, b, bias, kc, *, mantissa_bits=None, drop=None):
    """Matmul [M,K] x [K,N] computed as the kernel does: per KC slice an fp16 accumulator from 0 with
    one rounding per FMA in k order, slices added into C (one rounding), then the bias. Products of
    fp16 values are exact in float64. mantissa_bits: round to fewer bits instead (a wrong kernel);
    drop: skip this k (a wrong kernel)."""
    def rnd(x):
        if mantissa_bits is None:
            return x.astype(np.float16).astype(np.float64)
        m, e = np.frexp(x)
        return np.ldexp(np.round(m * 2.0 ** mantissa_bits) / 2.0 ** mantissa_bits, e)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    k_total = a.shape[1]
    c = None
    for k0 in range(0, k_total, kc):
        acc = np.zeros((a.shape[0], b.shape[1]))
        for k in range(k0, min(k0 + kc, k_total)):
            if k != drop:
                acc = rnd(acc + a64[:, k, None] * b64[None, k, :])
        c = acc if c is None else rnd(c + acc)
    return rnd(c + bias.astype(np.float64)[None, :])


@pytest.mark.parametrize("k, kc", [(70, 70), (300, 128), (2100, 700), (3000, 3000)])
def test_running_bound_holds_for_fp16_arithmetic_where_the_classical_one_may_be_vacuous(k, kc):
    spec = make_spec("matmul", dict(m=6, n=10, k=k), bias=True)
    a, b, bias = to_fp16_values(*make_inputs(spec, seed=k))
    got = _fp16_gemm(a[0], b[0], bias, kc)[None]
    verdict, bound = check_fp16_output(spec, got, a, b, bias, kc)
    assert verdict.ok and 0 < verdict.worst_ratio < 1, verdict.describe()
    assert np.isfinite(bound.bound).all()
    assert (classical_gamma(k + 2) == np.inf) == (k >= 2046)


@pytest.mark.parametrize("k", [64, 300, 2100])
def test_bound_rejects_arithmetic_with_fewer_bits_or_a_dropped_term(k):
    """8 significant bits instead of 11 (bf16-like accumulation): beyond the worst-case bound at small
    K; from K ~ 300 within it (ratio 0.5-0.9: a worst-case bound grows like K, errors like sqrt(K))
    but beyond the RMS limit of the running model. A dropped term: beyond the worst-case bound."""
    spec = make_spec("matmul", dict(m=32, n=48, k=k))
    a, b, bias = to_fp16_values(*make_inputs(spec, seed=7))
    zero = np.zeros(spec.operand_shapes[2], np.float32)   # the spec adds no bias (bias is None)
    coarse = _fp16_gemm(a[0], b[0], zero, 256, mantissa_bits=8)[None]
    verdict, _ = check_fp16_output(spec, coarse, a, b, zero, 256)
    assert not verdict.ok and ("K-derived bound" in verdict.reason if k < 100 else "RMS" in verdict.reason), \
        verdict.describe()
    dropped = _fp16_gemm(a[0], b[0], zero, 256, drop=k - 1)[None]
    verdict, _ = check_fp16_output(spec, dropped, a, b, zero, 256)
    assert not verdict.ok
    assert check_fp16_output(spec, _fp16_gemm(a[0], b[0], zero, 256)[None], a, b, zero, 256)[0].ok


def test_classical_bound_for_depthwise_holds_and_is_tight_enough_to_fail():
    spec = make_spec("depthwise", dict(c=3, h=9, w=9, r=5, s=5), pad=2, bias=True)
    a, b, bias = to_fp16_values(*make_inputs(spec, seed=3))
    exact = reference(spec, a, b, bias)
    bound = fp16_bound(spec, a, b, bias)
    assert bound.kind == "classical" and bound.classical_gamma < 0.02
    got = exact.astype(np.float16).astype(np.float64)       # a correctly rounded result: within
    assert check_fp16_output(spec, got, a, b, bias)[0].ok
    wrong = got.copy()
    wrong[0, 1, 4, 4] += 0.25                               # one tap's worth off
    assert not check_fp16_output(spec, wrong, a, b, bias)[0].ok


def test_inputs_that_can_overflow_fp16_fail_with_a_line_saying_so():
    spec = make_spec("matmul", dict(m=2, n=8, k=64))
    a, b, bias = to_fp16_values(*make_inputs(spec, seed=1))
    a, b = to_fp16_values(np.sign(a) * 60.0, np.sign(b) * 60.0)[:2]   # |partial sums| up to 64 * 3600
    verdict, bound = check_fp16_output(spec, np.full((1, 2, 8), np.inf), a, b, bias, 64)
    assert bound.peak_partial >= FP16_OVERFLOW_THRESHOLD
    assert not verdict.ok and verdict.reason.startswith("fp16 overflow")
