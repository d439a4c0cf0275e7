"""candidate_syntheses: the cost model's top-N GEMM programs (what the regret benchmark measures)."""
from __future__ import annotations

import pytest

from xfc.cpu.synth import candidate_syntheses, synthesize_cpu
from xfc.errors import OperatorError
from xfc.hardware.load import load
from xfc.ops.spec import make_spec

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("hw_name", ["host:avx2", "cortex-a55", "snapdragon-865"])
@pytest.mark.parametrize("op,shape,opts", [
    ("matmul", dict(m=100, n=200, k=300), {}),
    ("conv2d", dict(c=16, h=30, w=30, k=24, r=3, s=3), dict(pad=1)),
])
def test_first_candidate_is_the_synthesized_plan_and_all_are_distinct(hw_name, op, shape, opts):
    hw = load(hw_name, host_isa_cap=None)
    spec = make_spec(op, shape, **opts)
    cands = candidate_syntheses(spec, hw, threads=1, top=10)
    assert cands[0].plan == synthesize_cpu(spec, hw, threads=1, lowering="direct").plan   # implicit-GEMM candidates only
    assert 2 <= len(cands) <= 10
    keys = [(c.plan.lowering, c.plan.gemm) for c in cands]
    assert len(set(keys)) == len(keys)
    assert cands == candidate_syntheses(spec, hw, threads=1, top=10)     # deterministic


def test_depthwise_has_no_gemm_candidates():
    spec = make_spec("depthwise", dict(c=8, h=9, w=9, r=3, s=3), pad=1)
    with pytest.raises(OperatorError):
        candidate_syntheses(spec, load("cortex-a55"), threads=1)
