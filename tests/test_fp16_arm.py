"""fp16 CPU kernels (issue 13) built for AArch64 and run under qemu-aarch64: FMLA .8h kernels for
matmul, conv2d and depthwise on the Snapdragon 855's Cortex-A76 (big) and Cortex-A55 (little)
clusters, verified through both entry points under the derived fp16 bound (xfc/ops/fp16.py);
ragged tails, bias and activations, large K, large magnitudes and overflow, deliberately wrong
kernels, and the command line (including the Cortex-A53 refusal)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from support import needs_arm
from xfc.errors import XfcError
from xfc.testing.fp16_run import run_fp16_case
from xfc.hardware.load import load
from xfc.ops.fp16 import to_fp16_values
from xfc.ops.reference import make_inputs, reference
from xfc.ops.spec import make_spec

from support.cli import run as _run   # main(argv) in process: (exit code, stdout, stderr)

pytestmark = [pytest.mark.emulated, needs_arm]

SD855 = "snapdragon-855"   # big: Cortex-A76, little: Cortex-A55

CASES = [   # (operator, shape, options): sizes that are not multiples of 8 lanes or of MR
    ("matmul", dict(m=37, n=45, k=70), dict(bias=True, activation="relu")),
    ("matmul", dict(batch=2, m=13, n=9, k=31), dict(activation="relu6")),
    ("matmul", dict(m=1, n=1, k=1), {}),
    ("conv2d", dict(c=16, h=17, w=19, k=24, r=3, s=3), dict(pad=1, bias=True, activation="relu6")),
    ("conv2d", dict(n=2, c=8, h=30, w=30, k=13, r=3, s=3), dict(stride=2, pad=1)),
    ("conv2d", dict(c=20, h=9, w=11, k=7, r=1, s=1), dict(bias=True)),
    ("conv2d", dict(c=5, h=16, w=25, k=41, r=3, s=5), dict(pad="1,2", dilation=2, activation="relu")),
    ("depthwise", dict(c=8, h=21, w=23, r=3, s=3), dict(pad=1, bias=True, activation="relu6")),
    ("depthwise", dict(c=4, h=20, w=20, r=5, s=5), dict(stride=2, pad=2)),
    ("depthwise", dict(n=2, c=3, h=7, w=9, r=3, s=3), dict(dilation=2, bias=True, activation="relu")),
]


def _spec(op, shape, options):
    return make_spec(op, shape, **options)


@pytest.mark.matrix(every=2)
@pytest.mark.parametrize("cluster", ["big", "little"])
@pytest.mark.parametrize("op, shape, options", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_fp16_kernel_verifies_through_both_entry_points(op, shape, options, cluster, tmp_path):
    spec = _spec(op, shape, options)
    case = run_fp16_case(spec, load(SD855), tmp_path, cluster=cluster, threads=2 if "n" in shape else 1)
    assert case.ok and case.entry_points_equal, case.failure
    assert case.plan_summary["isa"] == "neon_fp16" and case.plan_summary["lanes"] == 8
    assert case.qemu_cpu == "cortex-a76"
    out = case.outputs[0]
    assert np.array_equal(out, out.astype(np.float16).astype(np.float32))   # fp16 values
    if options.get("activation") == "relu6":
        assert out.max() <= 6.0 and out.min() >= 0.0


def test_large_k_where_the_classical_bound_says_nothing(tmp_path):
    spec = make_spec("matmul", dict(m=9, n=20, k=2500), bias=True)
    case = run_fp16_case(spec, load(SD855), tmp_path, threads=1)
    assert case.ok, case.failure
    assert case.bound.kind == "running" and case.bound.classical_gamma == np.inf
    assert 0 < case.error_to_bound_ratio < 1


def test_large_magnitudes_within_the_fp16_range(tmp_path):
    """Operands up to about 180, outputs up to about 32000: within range, verified."""
    spec = make_spec("conv2d", dict(c=1, h=6, w=6, k=9, r=1, s=1), bias=True)
    a, b, bias = make_inputs(spec, seed=4)
    a, b = 180.0 * a, 180.0 * b
    case = run_fp16_case(spec, load(SD855), tmp_path, cluster="little", threads=1, inputs=(a, b, bias * 100))
    assert case.ok, case.failure
    assert 10000 < np.abs(case.outputs[0]).max() < 65504


def test_overflow_gives_inf_and_a_clear_verdict(tmp_path):
    """The kernels follow IEEE fp16 (no saturation, like XNNPACK): past 65504 the output is inf, and
    the verification says the inputs overflow fp16 instead of reporting an error ratio."""
    spec = make_spec("matmul", dict(m=3, n=10, k=8))
    a, b, bias = to_fp16_values(*make_inputs(spec, seed=2))
    a, b = np.full_like(a, 200.0), np.full_like(b, 200.0)       # 8 * 40000 = 320000
    case = run_fp16_case(spec, load(SD855), tmp_path, threads=1, inputs=(a, b, bias))
    assert np.isinf(case.outputs[0]).all() and np.isinf(reference(spec, a, b, bias)).sum() == 0
    assert not case.ok and case.failure.startswith("per-call entry: fp16 overflow")   # per entry (stages.verify)


@pytest.mark.parametrize("mutant, op, shape, options", [
    ("drop_last_k", "matmul", dict(m=20, n=24, k=50), {}),
    ("pad_top_off_by_one", "conv2d", dict(c=16, h=12, w=12, k=16, r=3, s=3), dict(pad=1, bias=True)),
    ("pad_top_off_by_one", "depthwise", dict(c=8, h=12, w=12, r=3, s=3), dict(pad=1)),
    ("drop_relu6_clamp", "conv2d", dict(c=16, h=8, w=8, k=16, r=3, s=3), dict(pad=1, activation="relu6")),
])
def test_wrong_fp16_kernels_exceed_the_bound(mutant, op, shape, options, tmp_path):
    spec = _spec(op, shape, options)
    good = run_fp16_case(spec, load(SD855), tmp_path / "good", threads=1)
    wrong = run_fp16_case(spec, load(SD855), tmp_path / "wrong", threads=1, mutant=mutant)
    assert good.ok, good.failure
    assert not wrong.ok and "bound" in wrong.failure, wrong.failure


def test_a_write_before_the_output_trips_the_fp16_guard_zone(tmp_path):
    spec = make_spec("matmul", dict(m=5, n=12, k=7))
    with pytest.raises(XfcError, match="guard"):
        run_fp16_case(spec, load(SD855), tmp_path, threads=1, mutant="out_pointer_minus_one")


# ---- command line ---------------------------------------------------------------------------------

@pytest.mark.parametrize("op, shape", [("matmul", "m=20,n=33,k=90"), ("conv2d", "c=6,h=11,w=13,k=10,r=3,s=3"),
                                       ("depthwise", "c=5,h=13,w=15,r=3,s=3")])
def test_cli_synth_fp16_verifies_and_reports_the_bound(op, shape, tmp_path, capfd):
    out_dir = tmp_path / "o"
    code, out, err = _run(["synth", op, "--hw", "snapdragon.yaml", "--shape", shape, "--pad", "1", "--bias",
                           "--activation", "relu6", "--dtype", "fp16", "--verify", "--json", "-o", str(out_dir)]
                          if op != "matmul" else
                          ["synth", op, "--hw", "snapdragon.yaml", "--shape", shape, "--bias", "--dtype", "fp16",
                           "--verify", "--json", "-o", str(out_dir)], capfd)
    assert code == 0, err
    report = json.loads(out)
    assert report["dtype"] == "fp16" and report["verified"] is True
    assert report["bound"]["unit_roundoff"] == 2.0 ** -11
    assert report["bound"]["kind"] == ("classical" if op == "depthwise" else "running")
    assert json.loads((out_dir / "report.json").read_text())["verified"] is True
    kernel, harness = (out_dir / f"xfc_{op}.c").read_text(), (out_dir / f"xfc_{op}_harness.c").read_text()
    assert "float16x8_t" in kernel and "0x7DA5u" in harness   # fp16 vectors; fp16 guard bits


def test_cli_explain_shows_8_lane_tiles(tmp_path, capfd):
    code, out, err = _run(["synth", "matmul", "--hw", "snapdragon-855", "--shape", "m=64,n=64,k=64", "--dtype",
                           "fp16", "--explain", "-o", str(tmp_path / "o")], capfd)
    assert code == 0, err
    assert "8-lane vectors" in out and "isa neon_fp16" in out


@pytest.mark.parametrize("argv, contains", [
    (["--hw", "cortex-a53"], "cortex-a53 (cortex-a53, big cluster) lacks the 'fp16' feature"),
    (["--hw", "snapdragon-855", "--lowering", "winograd"], "direct lowering only"),
    (["--hw", "snapdragon-855", "--tile-db", "x.db"], "fp32 rows only"),
])
def test_cli_fp16_refusals_are_one_line_exit_2(argv, contains, tmp_path, capfd):
    code, out, err = _run(["synth", "conv2d", "--shape", "c=8,h=10,w=10,k=8,r=3,s=3", "--dtype", "fp16", "--verify",
                           "-o", str(tmp_path / "o"), *argv], capfd)
    lines = [ln for ln in err.splitlines() if ln.startswith("xfc: error")]
    assert code == 2 and len(lines) == 1 and contains in lines[0] and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()


def test_cli_fp16_wrong_kernel_exits_4(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("XFC_TEST_MUTANT", "drop_last_k")
    code, out, err = _run(["synth", "matmul", "--hw", "snapdragon-855", "--shape", "m=16,n=16,k=40", "--dtype",
                           "fp16", "--verify", "-o", str(tmp_path / "o")], capfd)
    assert code == 4 and "failed verification" in err and "bound" in err, err
