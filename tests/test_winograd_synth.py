"""The synthesizer's Winograd choice (xfc/cpu/winograd.py through synth.synthesize_cpu): the
lowering options, the comparison with the best implicit-GEMM plan, the explanation, the tile-size
policy in synthesis, and the plan cache's round trip of a Winograd synthesis. Pure Python."""
from __future__ import annotations

import pytest

from support import conv
from xfc.cpu.synth import synthesize_cpu
from xfc.errors import OperatorError
from xfc.hardware.load import load
from xfc.tiledb.plancache import synthesis_from_payload, synthesis_payload

pytestmark = pytest.mark.unit

R18_L1 = conv(64, 56, 56, 64, 3, 3, pad=1)


@pytest.fixture(scope="module")
def sd():
    return load("snapdragon.yaml")


def test_auto_keeps_the_faster_prediction(sd):
    auto = synthesize_cpu(R18_L1, sd)
    direct = synthesize_cpu(R18_L1, sd, lowering="direct")
    wino = synthesize_cpu(R18_L1, sd, lowering="winograd")
    assert direct.plan.lowering.startswith("implicit_gemm") and direct.plan.winograd_m == 0
    assert wino.plan.lowering == "winograd" and wino.plan.winograd_m in (2, 4, 6)
    faster = min((direct, wino), key=lambda s: s.estimate.predicted_s)
    assert auto.plan == faster.plan
    assert auto.estimate.predicted_s == pytest.approx(min(direct.estimate.predicted_s, wino.estimate.predicted_s))
    # the transforms and their tile traffic overlap, the GEMMs follow; the flops are the direct
    # convolution's (effective GFLOP/s)
    parts = dict(wino.estimate.seconds_by_bound)
    assert wino.estimate.predicted_s == pytest.approx(
        max(parts["input transform"] + parts["output transform"], parts["tile traffic"]) + parts["GEMMs"])
    assert wino.estimate.flops == R18_L1.flops


def test_explain_shows_stages_and_the_best_direct_plan(sd):
    text = synthesize_cpu(R18_L1, sd, lowering="winograd").explain()
    for needle in ("lowering: winograd F(", "FILTER", "INPUT", "GEMM REG", "GEMMS", "OUTPUT",
                   "input transform", "output transform", "tile traffic", "lowering choice: winograd",
                   "runners-up: direct implicit_gemm"):
        assert needle in text, needle
    direct_text = synthesize_cpu(R18_L1, sd, lowering="direct").explain()
    assert "winograd" not in direct_text


def test_forced_winograd_refuses_other_shapes(sd):
    for spec, why in ((conv(8, 9, 9, 8, 3, 3, stride=2), "stride"), (conv(8, 9, 9, 8, 5, 5), "3x3"),
                      (conv(8, 9, 9, 8, 3, 3, dilation=2, pad=2), "dilation")):
        with pytest.raises(OperatorError, match=why) as exc:
            synthesize_cpu(spec, sd, lowering="winograd")
        assert "\n" not in str(exc.value)
    with pytest.raises(OperatorError, match="--lowering must be one of"):
        synthesize_cpu(R18_L1, sd, lowering="fft")
    with pytest.raises(OperatorError, match="m=6 is not admissible at C=512"):
        synthesize_cpu(conv(512, 7, 7, 512, 3, 3, pad=1), sd, lowering="winograd", winograd_m=6)


def test_other_shapes_stay_direct(sd):
    for spec in (conv(8, 9, 9, 8, 3, 3, stride=2, pad=1), conv(8, 9, 9, 8, 1, 1)):
        assert synthesize_cpu(spec, sd).plan.winograd_m == 0


def test_m6_never_considered_at_c512(sd):
    result = synthesize_cpu(conv(512, 7, 7, 512, 3, 3, pad=1), sd, lowering="winograd")
    assert result.plan.winograd_m in (2, 4)
    assert "m=6" not in " ".join(s for s, _ in result.alternatives)
    assert "m=6 excluded" in result.decision


def test_plan_cache_round_trip(sd):
    result = synthesize_cpu(R18_L1, sd, lowering="winograd")
    back = synthesis_from_payload(synthesis_payload(result), R18_L1, result.cluster)
    assert back.plan == result.plan and back.decision == result.decision
    assert back.explain() == result.explain()
