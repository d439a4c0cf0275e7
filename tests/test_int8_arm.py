"""ARM int8 kernels (issue 13): sdot / smmla planning from the core description (unit) and the
kernels built static for AArch64 and run under qemu-aarch64 with the core's qemu_cpu, byte-exact
against the reference in xfc/ops/quant.py (emulated)."""
from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pytest

from xfc.cpu.config import SDOT, SMMLA
from xfc.cpu.int8_arm import arm_shape, candidates, group_cycles, in_order, plan_arm_int8
from xfc.cpu.int8_codegen import render_int8_kernel
from xfc.cpu.int8_synth import explain, plan_int8
from xfc.errors import DeviceError, OperatorError, XfcError
from xfc.hardware.load import load
from xfc.ops.quant import QuantParams, make_qinputs, multipliers, qreference
from xfc.ops.spec import make_spec
from xfc.paths import HARDWARE_DIR
from xfc.pipeline import stages
from xfc.runners.qemu import QemuRunner
from support import assert_int8_exact, compile_int8, run_int8_entry, verify_int8
from support.cases import DEPTHWISE_CHANNELS_CASES

from support.cli import run as _run   # main(argv) in process: (exit code, stdout, stderr)

unit = pytest.mark.unit
emulated = pytest.mark.emulated

CONV = make_spec("conv2d", {"c": 64, "h": 56, "w": 56, "k": 64, "r": 3, "s": 3}, pad="1")
MM = make_spec("matmul", {"m": 512, "n": 512, "k": 512})


# ---------------------------------------------------------------------------------------------
# Planning (unit)
# ---------------------------------------------------------------------------------------------

@unit
@pytest.mark.parametrize("hw, cluster, instr", [
    ("snapdragon", None, "smmla"), ("snapdragon", "little", "smmla"), ("snapdragon-865", None, "sdot"),
    ("snapdragon-865", "little", "sdot"), ("cortex-a76", None, "sdot"), ("cortex-x3", None, "smmla")])
def test_instruction_follows_the_core_features(hw, cluster, instr):
    plan = plan_int8(CONV, QuantParams(), load(hw), cluster=cluster)
    core = load(hw).cluster(cluster).core
    assert plan.dialect == instr and plan.target_arch == "aarch64" and plan.qemu_cpu == core.qemu_cpu
    assert plan.k_depth == (8 if instr == "smmla" else 4) and plan.gcc_march == core.gcc_march
    used, available = plan.registers
    assert used <= available == 32


@unit
@pytest.mark.parametrize("spec", [CONV, MM], ids=["conv", "matmul"])
def test_in_order_core_gets_its_own_tile(spec):
    """A55 (in-order: a 128-bit load blocks the pipe 2 cycles) against A76 (out of order, loads
    hidden): the model picks a tile with fewer loads per dot product on the A55. The split-load
    variant is never picked by the planner (xfc/cpu/int8_arm.py: gcc does not pair its loads)."""
    a55 = plan_int8(spec, QuantParams(), load("cortex-a55"))
    a76 = plan_int8(spec, QuantParams(), load("cortex-a76"))
    assert in_order(load("cortex-a55").cluster().core) and not in_order(load("cortex-a76").cluster().core)
    assert not a55.split_loads and not a76.split_loads
    assert plan_arm_int8(spec, QuantParams(), load("cortex-a55"), force_split_loads=True).split_loads
    assert (a55.mr, a55.nr) != (a76.mr, a76.nr)
    loads_per_dot = lambda p: (p.nv + p.mr // 4) / (p.mr * p.nv)   # noqa: E731
    assert loads_per_dot(a55) < loads_per_dot(a76)


@unit
def test_issue_model_formulas():
    a55, a76 = load("cortex-a55").cluster().core, load("cortex-a76").cluster().core
    # 8x12 sdot: 24 instructions, 2 row + 3 column loads
    assert group_cycles(a76, SDOT, 8, 3) == max(24 / 2, 5 / 2, 4)
    assert group_cycles(a55, SDOT, 8, 3) == 24 / 1 + 5 * 2
    assert group_cycles(a55, SDOT, 8, 3, split_loads=True) == 24 + 5
    # smmla 8x8: 4 row pairs x 4 column pairs = 16 instructions, each 2x2x8 multiply-adds
    a715 = load("cortex-a715").cluster().core
    assert SMMLA.instructions(8, 4) == 16 and SMMLA.registers(8, 4) == 16 + 4 + 4
    assert group_cycles(a715, SMMLA, 8, 4) == max(16 / 2, 8 / 3, 4)
    assert arm_shape(CONV, SMMLA).groups == 9 * 8 and arm_shape(CONV, SDOT).groups == 9 * 16


@unit
def test_every_scored_tile_fits_the_register_file():
    cluster = load("snapdragon").cluster()
    tiles = candidates(CONV, cluster, 2, (SMMLA, SDOT))
    assert tiles and all(t.dot.registers(t.mr, t.nv) <= 32 for t in tiles)
    assert {t.dot.name for t in tiles} == {"smmla", "sdot"}
    assert all(a.seconds <= b.seconds for a, b in zip(tiles, tiles[1:]))


@unit
def test_explain_names_the_micro_tile_and_the_alternatives():
    plan = plan_int8(CONV, QuantParams(), load("snapdragon"))
    text = explain(plan)
    chosen = next(line for line in text.splitlines() if "chosen:" in line)
    assert re.search(r"smmla \d+x\d+", chosen) and "8-deep k groups" in chosen
    assert re.search(r"\d+ of 32 registers", chosen) and "int8 ops/cycle" in chosen
    assert "smmla at 2/cycle (smmla_per_cycle)" in text
    assert "beat smmla" in text and re.search(r"best sdot tile: sdot \d+x\d+.*\(2\.00x the time\)", text)
    little = explain(plan_int8(CONV, QuantParams(), load("snapdragon-865"), cluster="little"))
    assert "in-order" in little and "blocks the pipe 2 cycles" in little and "split" not in little


@unit
@pytest.mark.parametrize("op, shape", [("matmul", {"m": 4, "n": 4, "k": 4}),
                                       ("depthwise", {"c": 4, "h": 5, "w": 5, "r": 3, "s": 3})])
def test_core_without_dotprod_is_refused(op, shape):
    with pytest.raises(OperatorError, match=r"cortex-a53: the core lacks 'dotprod'") as info:
        plan_int8(make_spec(op, shape), QuantParams(), load("cortex-a53"))
    assert "\n" not in str(info.value)


@unit
def test_forcing_an_instruction_the_core_lacks_is_refused():
    with pytest.raises(OperatorError, match="'smmla' is not available on cortex-a76"):
        plan_int8(MM, QuantParams(), load("cortex-a76"), force_dialect="smmla")
    with pytest.raises(OperatorError, match="MR=6"):
        plan_int8(MM, QuantParams(), load("cortex-a76"), force_tile=(6, 2))


@unit
def test_rendering_is_deterministic_and_uses_the_instruction():
    for hw, call in (("cortex-a76", "vdotq_laneq_s32"), ("cortex-a715", "vmmlaq_s32")):
        plan = plan_int8(CONV, QuantParams(act_type="int8", a_zero_point=-3), load(hw))
        one, two = render_int8_kernel(plan), render_int8_kernel(plan)
        assert one.source == two.source and call in one.source and "immintrin" not in one.source
        assert "int main(" in one.harness_source


@unit
def test_rate_fields_are_validated(tmp_path):
    """sdot_per_cycle without dotprod is refused with one line naming the field."""
    from xfc.hardware.load import validate_file
    text = (HARDWARE_DIR / "cpu" / "cortex-a53.yaml").read_text().replace("fma_latency_cycles:",
                                                                          "sdot_per_cycle: 1\nfma_latency_cycles:")
    path = tmp_path / "cpu" / "cortex-a53.yaml"
    path.parent.mkdir()
    path.write_text(text)
    with pytest.raises(XfcError, match=r"field 'sdot_per_cycle'.*dotprod"):
        validate_file(path)


# ---------------------------------------------------------------------------------------------
# Kernels under qemu-aarch64 (emulated)
# ---------------------------------------------------------------------------------------------

TARGETS = [("cortex-a76", "sdot"), ("cortex-a55", "sdot"), ("cortex-a715", "smmla")]
CASES = [
    ("matmul", {"m": 19, "n": 37, "k": 45, "batch": 2}, {}, ("uint8", 0, 255), "relu", True),
    ("matmul", {"m": 1, "n": 1, "k": 1}, {}, ("int8", 127, -128), "none", False),
    ("conv2d", {"c": 5, "h": 11, "w": 9, "k": 21, "r": 3, "s": 3, "n": 2}, {"stride": "2,1", "pad": "1,2,0,1"},
     ("int8", -128, 127), "relu6", True),
    ("conv2d", {"c": 13, "h": 6, "w": 7, "k": 3, "r": 1, "s": 1}, {}, ("uint8", 255, 0), "none", False),
    ("conv2d", {"c": 9, "h": 8, "w": 10, "k": 11, "r": 3, "s": 2}, {"dilation": "2,1", "pad": "2,1"},
     ("uint8", 3, 250), "relu", True),
    ("depthwise", {"c": 6, "h": 9, "w": 13, "r": 3, "s": 3}, {"stride": "2", "pad": "1", "dilation": "1,2"},
     ("uint8", 128, 3), "relu6", True),
]


@pytest.mark.matrix(every=2)
@emulated
@pytest.mark.parametrize("hw, instr", TARGETS, ids=[f"{h}-{i}" for h, i in TARGETS])
@pytest.mark.parametrize("op, shape, geometry, quant, activation, per_channel", CASES,
                         ids=[f"{c[0]}-{c[3][0]}-{c[4]}-{i}" for i, c in enumerate(CASES)])
def test_arm_int8_kernel_matches_the_reference_exactly(hw, instr, op, shape, geometry, quant, activation,
                                                       per_channel, tmp_path):
    """Ragged shapes (every tile edge partial), zero points at both ends, per-channel scales, both
    entry points (verify_kernel runs the per-call and the pre-packed one)."""
    act, a_zp, out_zp = quant
    spec = make_spec(op, shape, bias=True, activation=activation, **geometry)
    q = QuantParams(act_type=act, a_zero_point=a_zp, per_channel=per_channel, out_zero_point=out_zp)
    plan, kernel = compile_int8(spec, q, load(hw), tmp_path, threads=2)
    assert isinstance(kernel.runner, QemuRunner) and kernel.runner.cpu == load(hw).cluster().core.qemu_cpu
    assert plan.dialect == (instr if op != "depthwise" else "neon")
    verdict = verify_int8(kernel, seed=11)
    assert verdict["ok"] and verdict["exact_share"] == 1.0, verdict


STAGING = [  # the NEON staging (st4 interleaves, ld2 splits the phases): rows of 16 pixels and more
    ({"c": 3, "h": 13, "w": 45, "k": 19, "r": 7, "s": 7}, {"stride": "2", "pad": "3"}, ("int8", -60, -3)),
    ({"c": 9, "h": 10, "w": 37, "k": 21, "r": 1, "s": 1, "n": 2}, {"stride": "2"}, ("uint8", 131, 120)),
    ({"c": 8, "h": 9, "w": 41, "k": 16, "r": 3, "s": 3}, {"stride": "2", "pad": "1,0,2,1", "dilation": "1,2"},
     ("uint8", 90, 140)),
    ({"c": 14, "h": 5, "w": 35, "k": 19, "r": 3, "s": 3}, {"pad": "1,2,1,1"}, ("int8", -9, 5)),
]


@emulated
@pytest.mark.parametrize("shape, geometry, quant", STAGING, ids=["stem-7x7-c3-s2", "1x1-s2-batch2",
                                                                  "dilated-even-phase", "stride-1-w35"])
def test_arm_neon_staging_matches_the_reference_exactly(shape, geometry, quant, tmp_path):
    """sdot conv2d kernels whose input is staged with NEON (stride 1 and 2, a partial channel group,
    rows and phases no tap reads skipped), under qemu on the Cortex-A76 model, 2 threads."""
    act, a_zp, out_zp = quant
    spec = make_spec("conv2d", shape, bias=True, activation="relu6" if act == "int8" else "none", **geometry)
    q = QuantParams(act_type=act, a_zero_point=a_zp, per_channel=True, out_zero_point=out_zp)
    plan, kernel = compile_int8(spec, q, load("cortex-a76"), tmp_path, threads=2)
    assert plan.dialect == "sdot" and plan.column_layout == "rows"
    source = kernel.rendered.source
    assert "vst4q_u8" in source and ("xfc_phases32(pad" in source) == (spec.stride_w == 2)
    assert_int8_exact(kernel)


FORCED = [("cortex-a76", "sdot", (24, 1, 1), False), ("cortex-a76", "sdot", (4, 6, 3), False),
          ("cortex-a76", "sdot", (12, 2, 2), True), ("cortex-a715", "smmla", (2, 8, 4), False),
          ("cortex-a715", "smmla", (14, 1, 1), True), ("cortex-a715", "sdot", (8, 3, 1), False)]


@emulated
@pytest.mark.parametrize("hw, instr, tile, split", FORCED, ids=[f"{f[1]}-{f[2]}-{f[3]}" for f in FORCED])
def test_forced_tiles_and_load_variants(hw, instr, tile, split, tmp_path):
    """Tiles the search does not pick here (tallest, widest, multi-row conv tiles, sdot on an i8mm
    core), with and without the in-order split loads, on shapes ragged in every direction."""
    mr, nv, rows = tile
    specs = [make_spec("matmul", {"m": 27, "n": 45, "k": 29}, bias=True),
             make_spec("conv2d", {"c": 10, "h": 9, "w": 21, "k": 15, "r": 3, "s": 2}, stride="2,1", pad="1,1",
                       bias=True, activation="relu6")]
    for spec in specs:
        q = QuantParams(act_type="int8", a_zero_point=-7, per_channel=True, out_zero_point=3)
        plan = plan_arm_int8(spec, q, load(hw), force_dialect=instr, force_tile=(mr, nv), force_rows=rows,
                             force_split_loads=split)
        assert (plan.dialect, plan.mr, plan.nv, plan.split_loads) == (instr, mr, nv, split)
        kernel = stages.realize(plan, tmp_path / spec.name)
        verdict = verify_int8(kernel, seed=mr + nv)
        assert verdict["ok"] and verdict["exact_share"] == 1.0, (plan.summary(), verdict)


@emulated
@pytest.mark.parametrize("hw", ["cortex-a76", "cortex-a715"])
@pytest.mark.parametrize("op, shape", [("matmul", {"m": 5, "n": 19, "k": 4096 + 3}),
                                       ("conv2d", {"c": 460, "h": 3, "w": 5, "k": 6, "r": 3, "s": 3})])
@pytest.mark.parametrize("act, zp", [("uint8", 255), ("int8", -128)])
def test_int32_accumulation_at_large_k(hw, op, shape, act, zp, tmp_path):
    """x at the far end from its zero point, w = -128: |acc| = K x 255 x 128 (> 2^27 at K > 4096)
    reaches the output unclamped through a small multiplier; then random data at the same K."""
    spec = make_spec(op, shape)
    k = spec.reduction_size
    assert k >= 4096
    q = QuantParams(act_type=act, a_zero_point=zp, a_scale=1.0, w_scale=1.0, out_scale=float(k * 255 * 128 / 100),
                    out_zero_point=128 if act == "uint8" else 0)
    _, kernel = compile_int8(spec, q, load(hw), tmp_path, threads=1)
    x, w, bias = make_qinputs(spec, q, mode="extreme")
    ref = qreference(spec, q, x, w, bias)
    assert abs(int(ref.astype(np.int64).reshape(-1)[0]) - q.out_zero_point) == 100   # full magnitude, not clamped
    np.testing.assert_array_equal(run_int8_entry(kernel, x, w, bias, multipliers(spec, q)), ref)
    assert verify_int8(kernel, seed=5)["exact_share"] == 1.0


@emulated
def test_saturation_and_a_wrong_kernel_is_caught(tmp_path):
    """A small output scale saturates most outputs, still byte-exact; a kernel built for another
    activation zero point than the reference's differs (the check can fail)."""
    spec = make_spec("conv2d", {"c": 12, "h": 7, "w": 9, "k": 10, "r": 3, "s": 3}, pad="1", bias=True)
    q = QuantParams(act_type="uint8", a_zero_point=100, out_scale=0.05, out_zero_point=128)
    _, kernel = compile_int8(spec, q, load("cortex-a715"), tmp_path / "a", threads=1)
    verdict = verify_int8(kernel, seed=2)
    assert verdict["ok"] and verdict["saturated_share"] > 0.5, verdict
    wrong_plan = replace(kernel.plan, quant=replace(kernel.plan.quant, a_zero_point=101))
    wrong = stages.realize(wrong_plan, tmp_path / "b")
    x, w, bias = make_qinputs(spec, kernel.plan.quant, seed=2)
    out = run_int8_entry(wrong, x, w, bias, multipliers(spec, kernel.plan.quant), prepacked=False)
    assert not np.array_equal(out, qreference(spec, kernel.plan.quant, x, w, bias))


@emulated
def test_smmla_kernel_faults_on_a_core_without_i8mm(tmp_path):
    """qemu -cpu cortex-a76 has dotprod but no i8mm: the smmla binary dies of SIGILL, reported in one
    line naming the -march (so the kernels really use the instruction their plan names)."""
    spec = make_spec("matmul", {"m": 8, "n": 8, "k": 16})
    plan, kernel = compile_int8(spec, QuantParams(), load("cortex-a715"), tmp_path, threads=1)
    assert plan.dialect == "smmla"
    on_a76 = stages.Built(kernel.rendered, kernel.artifact, QemuRunner(cpu="cortex-a76"), 0.0, "")
    x, w, bias = make_qinputs(spec, plan.quant)
    with pytest.raises(DeviceError, match=r"illegal instruction.*-march=armv9-a\+i8mm"):
        run_int8_entry(on_a76, x, w, bias, multipliers(spec, plan.quant), prepacked=False)


@emulated
@pytest.mark.parametrize("cluster", [None, "little"])
def test_cli_snapdragon_conv2d_verify_explain(cluster, tmp_path, capfd):
    hw = str(HARDWARE_DIR / "snapdragon.yaml")
    argv = ["synth", "conv2d", "--hw", hw, "--shape", "c=16,h=10,w=12,k=24,r=3,s=3", "--pad", "1", "--bias",
            "--activation", "relu", "--dtype", "int8", "--quant", "per_channel=1", "--verify", "--explain",
            "-o", str(tmp_path / "o")] + (["--cluster", cluster] if cluster else [])
    code, out, err = _run(argv, capfd)
    assert code == 0, err
    core = "cortex-a510" if cluster else "cortex-a715"
    assert f"core {core}" in out and "chosen: smmla" in out and "8-deep k groups" in out
    assert "verified: yes on qemu-aarch64 -cpu max" in out and "exact match: 100.00%" in out
    assert re.search(r"micro-tile: smmla \d+x\d+, 8-deep k groups, \d+ of 32 vector registers", out)
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["verified"] is True and report["exact_share"] == 1.0 and report["dialect"] == "smmla"


@unit
@pytest.mark.parametrize("argv, contains", [
    (["--hw", "cortex-a53", "--verify"], "cortex-a53: the core lacks 'dotprod'"),
    (["--hw", "cortex-a76", "--bench"], "say nothing about a phone"),
])
def test_cli_arm_refusals_exit_2_with_one_line(argv, contains, tmp_path, capfd):
    base = ["synth", "matmul", "--shape", "m=4,n=4,k=4", "--dtype", "int8", "-o", str(tmp_path / "o")]
    code, out, err = _run(base + argv, capfd)
    lines = [ln for ln in err.splitlines() if ln.startswith("xfc: error")]
    assert code == 2 and len(lines) == 1 and contains in lines[0] and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------------------------
# Depthwise 'channels' layout on AArch64 (16 channels in the lanes, sdot on quads of adjacent taps)
# ---------------------------------------------------------------------------------------------

# The shared ragged cases (tests/support/cases.py) and MobileNetV2's 7x7 plane.
ARM_CHANNELS_CASES = DEPTHWISE_CHANNELS_CASES + [
    ({"c": 16, "h": 7, "w": 7, "r": 3, "s": 3}, {"pad": "1"}, ("uint8", 255, 0), "relu", True, True, 1),
]


@emulated
@pytest.mark.matrix(every=2)
@pytest.mark.parametrize("hw", ["cortex-a76", "cortex-a55"])
@pytest.mark.parametrize("case", ARM_CHANNELS_CASES, ids=[f"{c[0]['c']}x{c[0]['h']}x{c[0]['w']}-{c[2][0]}-{i}"
                                                          for i, c in enumerate(ARM_CHANNELS_CASES)])
def test_arm_depthwise_channels_layout_matches_the_reference_exactly(hw, case, tmp_path):
    shape, geometry, (act, a_zp, out_zp), activation, per_channel, bias, threads = case
    spec = make_spec("depthwise", shape, bias=bias, activation=activation, **geometry)
    q = QuantParams(act_type=act, a_zero_point=a_zp, per_channel=per_channel, out_zero_point=out_zp)
    plan, kernel = compile_int8(spec, q, load(hw), tmp_path, threads=threads, force_layout="channels")
    assert (plan.dialect, plan.depthwise_layout, plan.parallel_axis) == ("sdot", "channels", "channel_groups")
    assert "vdotq_s32" in kernel.rendered.source and "vqtbl4q_u8" in kernel.rendered.source
    assert_int8_exact(kernel)


@unit
def test_arm_depthwise_takes_channels_where_its_buffers_fit_the_l2():
    """Every ARM int8 core has sdot: a depthwise layer takes the channels layout where its buffers fit
    the core's L2, and the plane layout (saying why) where they do not or where the filter is dilated
    across; forcing is checked."""
    q = QuantParams(act_type="uint8", a_zero_point=128, out_zero_point=128)
    hw = load("cortex-a76")

    def plan(shape, geometry, **kw):
        spec = make_spec("depthwise", {"r": 3, "s": 3, **shape}, bias=True, **geometry)
        return plan_arm_int8(spec, q, hw, threads=1, **kw)

    small = plan({"c": 960, "h": 7, "w": 7}, {"pad": "1"})
    assert (small.dialect, small.depthwise_layout, small.lanes) == ("sdot", "channels", 16)
    assert 1 <= small.nv <= 7 and "sdot" in " ".join(small.header_lines)
    from xfc.cpu.dw_channels import channels_buffers
    l2 = hw.cluster().l2.size_bytes
    big = plan({"c": 32, "h": 112, "w": 112}, {"pad": "1"})
    kib = channels_buffers(big.spec, aarch64=True).bytes / 1024
    assert kib * 1024 > l2 and big.depthwise_layout == "plane" and big.dialect == "neon"
    assert any(f"{kib:.0f} KiB per thread, more than the core's L2" in r for r in big.reasons), big.reasons
    assert plan({"c": 8, "h": 7, "w": 7}, {"pad": "2", "dilation": "1,2"}).depthwise_layout == "plane"
    assert plan({"c": 8, "h": 7, "w": 7}, {"pad": "1"}, force_layout="plane").depthwise_layout == "plane"
    assert plan({"c": 32, "h": 112, "w": 112}, {"pad": "1"}, force_layout="channels").depthwise_layout == "channels"
    with pytest.raises(OperatorError, match="dilation_w 1"):
        plan({"c": 8, "h": 7, "w": 7}, {"pad": "2", "dilation": "1,2"}, force_layout="channels")
    with pytest.raises(OperatorError, match="'plane' or 'channels'"):
        plan({"c": 8, "h": 7, "w": 7}, {"pad": "1"}, force_layout="tap_pairs")


@emulated
def test_cli_synth_names_the_channels_layout_and_verifies_under_qemu(tmp_path, capfd):
    """`xfc synth depthwise --dtype int8` for an ARM SoC: the plan line names the groups of channels and
    the pixels per block, the reasons say why the layout was taken, and the kernel verifies exactly."""
    code, out, err = _run(["synth", "depthwise", "--hw", "snapdragon-865", "--shape", "c=40,h=7,w=7,r=3,s=3",
                           "--pad", "1", "--bias", "--activation", "relu6", "--dtype", "int8", "--threads", "1",
                           "--explain", "--verify", "-o", str(tmp_path / "o")], capfd)
    assert code == 0, err
    text = out + err
    assert "groups of 16 channels in the lanes, blocks of 2 output pixel(s)" in text, text
    assert "fit the core's L2" in text and "sdot" in text
    assert "exact match: 100.00% of outputs" in text, text
