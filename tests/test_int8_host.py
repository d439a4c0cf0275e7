"""int8 (issue 13) host kernels: built with the host gcc, run in process, compared byte for byte
with the exact reference (xfc.ops.quant). Every dialect this machine runs (vnni only with
avx512_vnni), ragged shapes, both activation types, zero points at both ends, per-channel scales,
the int32 extremes at K >= 16384, and the `xfc synth --dtype int8` command line. The >= 100
random shapes per operator run behind `make int8-sweep` (scripts/int8_sweep.py)."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from xfc.errors import OperatorError, XfcError
from xfc.hardware.host import available_isas
from xfc.hardware.load import load
from xfc.ops.quant import QuantParams, make_qinputs, multipliers, qreference
from xfc.cpu.config import int8_registers
from xfc.cpu.int8_synth import flat_row_width
from xfc.ops.spec import make_spec
from xfc.hardware.host import read_flags
from support import assert_int8_exact, compile_int8, run_int8_entry, verify_int8
from support.cases import DEPTHWISE_CHANNELS_CASES

from support.cli import run as _run   # main(argv) in process: (exit code, stdout, stderr)

pytestmark = pytest.mark.host

FLAGS = frozenset(read_flags())
HAS_VNNI = "avx512_vnni" in FLAGS and "avx512" in available_isas()


def _dialects():
    out = []
    if HAS_VNNI:
        out.append(("avx512", "vnni"))
    if "avx2" in available_isas():
        out.append(("avx2", "avx2"))
    out.append(("generic", "generic"))
    return out


DIALECTS = _dialects()
CASES = [
    ("matmul", {"m": 19, "n": 37, "k": 45, "batch": 2}, {}, ("uint8", 0, 255), "relu", True),
    ("matmul", {"m": 1, "n": 1, "k": 1}, {}, ("int8", 127, -128), "none", False),
    ("conv2d", {"c": 5, "h": 11, "w": 9, "k": 21, "r": 3, "s": 3, "n": 2}, {"stride": "2,1", "pad": "1,2,0,1"},
     ("int8", -128, 127), "relu6", True),
    ("conv2d", {"c": 7, "h": 6, "w": 6, "k": 3, "r": 1, "s": 1}, {}, ("uint8", 255, 0), "none", False),
    ("depthwise", {"c": 6, "h": 9, "w": 13, "r": 3, "s": 3}, {"stride": "2", "pad": "1", "dilation": "1,2"},
     ("uint8", 128, 3), "relu6", True),
    ("depthwise", {"c": 3, "h": 5, "w": 4, "r": 5, "s": 4, "n": 2}, {"pad": "2,1"}, ("int8", 127, -128), "relu", True),
]


@pytest.mark.parametrize("isa, dialect", DIALECTS, ids=[d for _, d in DIALECTS])
@pytest.mark.parametrize("op, shape, geometry, quant, activation, per_channel", CASES,
                         ids=[f"{c[0]}-{c[3][0]}-{c[4]}" for c in CASES])
def test_int8_kernel_matches_the_reference_exactly(isa, dialect, op, shape, geometry, quant, activation, per_channel,
                                                   tmp_path):
    act, a_zp, out_zp = quant
    spec = make_spec(op, shape, bias=True, activation=activation, **geometry)
    q = QuantParams(act_type=act, a_zero_point=a_zp, per_channel=per_channel, out_zero_point=out_zp)
    plan, kernel = compile_int8(spec, q, load(f"host:{isa}"), tmp_path, threads=2, flags=FLAGS)
    assert plan.dialect == dialect
    verdict = verify_int8(kernel, seed=11)
    assert verdict["ok"] and verdict["exact_share"] == 1.0, verdict


@pytest.mark.matrix(every=2)
@pytest.mark.parametrize("isa, dialect", DIALECTS, ids=[d for _, d in DIALECTS])
@pytest.mark.parametrize("op, shape", [("matmul", {"m": 3, "n": 33, "k": 16384 + 3}),
                                       ("conv2d", {"c": 2048, "h": 3, "w": 4, "k": 5, "r": 3, "s": 3})])
@pytest.mark.parametrize("act, zp", [("uint8", 0), ("uint8", 255), ("int8", -128), ("int8", 127)])
def test_int32_accumulation_at_large_k(isa, dialect, op, shape, act, zp, tmp_path):
    """x at the far end from its zero point, w = -128: |acc| = K x 255 x 128 (> 2^29 at K >= 16384)
    reaches the output unclamped through a small multiplier; then random data at the same K."""
    spec = make_spec(op, shape)
    k = spec.reduction_size
    q = QuantParams(act_type=act, a_zero_point=zp, a_scale=1.0, w_scale=1.0, out_scale=float(k * 255 * 128 / 100),
                    out_zero_point=128 if act == "uint8" else 0)
    _, kernel = compile_int8(spec, q, load(f"host:{isa}"), tmp_path, threads=1, flags=FLAGS)
    x, w, bias = make_qinputs(spec, q, mode="extreme")
    ref = qreference(spec, q, x, w, bias)
    assert abs(int(ref.astype(np.int64).reshape(-1)[0]) - q.out_zero_point) == 100   # full magnitude, not clamped
    np.testing.assert_array_equal(run_int8_entry(kernel, x, w, bias, multipliers(spec, q)), ref)
    assert verify_int8(kernel, seed=5)["exact_share"] == 1.0


FORCED = {"vnni": [(14, 2, 1), (6, 4, 2), (3, 3, 3), (1, 1, 1)], "avx2": [(4, 2, 2), (1, 3, 1)],
          "generic": [(3, 2, 2)]}


@pytest.mark.parametrize("isa, dialect", DIALECTS, ids=[d for _, d in DIALECTS])
def test_forced_register_tiles_including_multi_row_conv_tiles(isa, dialect, tmp_path):
    """Tiles the search does not pick for these shapes: the largest register budgets (accumulators
    pinned to registers), one-lane-wide ones and conv2d tiles spanning 2 or 3 output rows, on
    ragged shapes whose last tile is partial in every direction."""
    hw = load(f"host:{isa}")
    specs = [make_spec("matmul", {"m": 17, "n": 70, "k": 23}, bias=True),
             make_spec("conv2d", {"c": 6, "h": 9, "w": 21, "k": 15, "r": 3, "s": 2}, stride="2,1", pad="1,1",
                       bias=True, activation="relu6")]
    for n, (mr, nv, rows) in enumerate(FORCED[dialect]):
        for spec in specs:
            q = QuantParams(act_type="int8", a_zero_point=-7, per_channel=True, out_zero_point=3)
            plan, kernel = compile_int8(spec, q, hw, tmp_path / f"{n}_{spec.name}", threads=2, flags=FLAGS,
                                        force_tile=(mr, nv), force_rows=rows)
            assert (plan.mr, plan.nv) == (mr, nv)
            verdict = verify_int8(kernel, seed=n)
            assert verdict["ok"] and verdict["exact_share"] == 1.0, (plan.summary(), verdict)


FLAT = [  # stride-1 conv2d: short rows, pads on every side, a dilation, channels not a multiple of 4, a batch
    ({"c": 13, "h": 7, "w": 7, "k": 21, "r": 3, "s": 3, "n": 2}, {"pad": "1,1,1,1"}, (2, 2)),
    ({"c": 5, "h": 9, "w": 5, "k": 17, "r": 3, "s": 2}, {"pad": "2,0,1,1", "dilation": "2,1"}, (3, 1)),
    ({"c": 9, "h": 6, "w": 11, "k": 8, "r": 1, "s": 1}, {}, (1, 2)),
    # the left padding wider than the right and none below: the right padding is read in the next
    # staged row's left one, and the last row's in the zero-point row below the image
    ({"c": 6, "h": 5, "w": 6, "k": 19, "r": 3, "s": 3}, {"pad": "1,2,0,1"}, (2, 1)),
]


@pytest.mark.matrix(every=2)   # each dialect and edge case stays in the sample; test-matrices: all
@pytest.mark.parametrize("isa, dialect", DIALECTS, ids=[d for _, d in DIALECTS])
@pytest.mark.parametrize("shape, geometry, tile", FLAT,
                         ids=["7x7-pad1-batch2", "dilated-odd-pads", "1x1", "left-pad-wider-no-bottom"])
def test_flat_column_layout_matches_the_reference_exactly(isa, dialect, shape, geometry, tile, tmp_path):
    """The 'flat' layout (vectors run on across output rows, the padding columns computed and
    dropped), forced with the planner's tile and with a ragged one, at 1 and 2 threads."""
    spec = make_spec("conv2d", shape, bias=True, activation="relu", **geometry)
    q = QuantParams(act_type="uint8", a_zero_point=200, per_channel=True, out_zero_point=9)
    for n, (threads, force) in enumerate([(1, None), (2, tile)]):
        kw = {"force_layout": "flat", **({"force_tile": force} if force else {})}
        plan, kernel = compile_int8(spec, q, load(f"host:{isa}"), tmp_path / str(n), threads=threads, flags=FLAGS,
                                    **kw)
        assert plan.column_layout == "flat" and "flat" in plan.summary().get("column_layout", "")
        assert plan.flat_row_pixels == flat_row_width(spec)
        verdict = verify_int8(kernel, seed=n + 3)
        assert verdict["ok"] and verdict["exact_share"] == 1.0, (plan.summary(), verdict)


FLAT_WIDE = [  # staged rows of 16 positions or more with padding columns: the vnni masked epilogue
    ({"c": 7, "h": 9, "w": 17, "k": 19, "r": 3, "s": 3, "n": 2}, {"pad": "1,1,1,1"}, (4, 3)),
    ({"c": 5, "h": 7, "w": 20, "k": 10, "r": 3, "s": 3}, {"pad": "2,2,2,2", "dilation": "2,2"}, (3, 1)),
    ({"c": 6, "h": 5, "w": 30, "k": 9, "r": 5, "s": 5}, {"pad": "2,2,2,2"}, (5, 2)),
    ({"c": 4, "h": 8, "w": 16, "k": 33, "r": 7, "s": 7}, {"pad": "3,3,3,3"}, (2, 4)),
]


@pytest.mark.matrix(every=2)   # each dialect and edge case stays in the sample; test-matrices: all
@pytest.mark.parametrize("isa, dialect", DIALECTS, ids=[d for _, d in DIALECTS])
@pytest.mark.parametrize("shape, geometry, tile", FLAT_WIDE, ids=["18-wide-pad1-batch2", "22-wide-dilated-pad2",
                                                                  "32-wide-5x5", "19-wide-7x7-pad3"])
def test_flat_layout_on_wide_padded_rows_matches_the_reference_exactly(isa, dialect, shape, geometry, tile,
                                                                       tmp_path):
    """'flat' on staged rows of 16 positions and more with 1-3 padding columns between them: on vnni
    each vector is stored straight into the output under two byte masks (its first row's lanes, the
    next row's shifted down by the padding); vectors that start in the padding, end past the last
    output row, a partial last block of output channels; the planner's tile and a ragged one, 1 and 2
    threads."""
    spec = make_spec("conv2d", shape, bias=True, activation="relu", **geometry)
    q = QuantParams(act_type="uint8", a_zero_point=200, per_channel=True, out_zero_point=9)
    for n, (threads, force) in enumerate([(1, None), (2, tile)]):
        if force and int8_registers(dialect, force[0], force[1]) > load(f"host:{isa}").cluster().core.vector_registers:
            force = (2, 1)
        kw = {"force_layout": "flat", **({"force_tile": force} if force else {})}
        plan, kernel = compile_int8(spec, q, load(f"host:{isa}"), tmp_path / str(n), threads=threads, flags=FLAGS,
                                    **kw)
        assert plan.column_layout == "flat" and plan.flat_row_pixels >= 16
        if dialect == "vnni":
            assert "vnext[" in kernel.rendered.source and "xfc_out_t local[" not in kernel.rendered.source
        verdict = verify_int8(kernel, seed=n + 5)
        assert verdict["ok"] and verdict["exact_share"] == 1.0, (plan.summary(), verdict)


STAGING = [  # rows of 16 pixels and more (the unpack rounds, the last one overlapping), a partial channel
    # group, int8 activations (the XOR), a 1x1 conv staged as one run of rows, a 3x3 with its padding
    ({"c": 14, "h": 5, "w": 21, "k": 19, "r": 3, "s": 3}, {"pad": "1,1,1,1"}, "int8"),
    ({"c": 12, "h": 6, "w": 19, "k": 9, "r": 1, "s": 1}, {}, "uint8"),
    ({"c": 8, "h": 3, "w": 32, "k": 16, "r": 3, "s": 3}, {"pad": "2,1,0,1"}, "uint8"),
]


@pytest.mark.matrix(every=2)   # each dialect and edge case stays in the sample; test-matrices: all
@pytest.mark.parametrize("isa, dialect", DIALECTS, ids=[d for _, d in DIALECTS])
@pytest.mark.parametrize("layout", ["flat", "rows"])
@pytest.mark.parametrize("shape, geometry, act", STAGING, ids=["3x3-w21-c14-int8", "1x1-w19", "3x3-w32-odd-pads"])
def test_staged_input_rows_of_16_pixels_and_more_match_the_reference_exactly(isa, dialect, layout, shape, geometry,
                                                                           act, tmp_path):
    """The stride-1 staging (SIMD unpacks 16 pixels a round) under both pixel layouts, at 2 threads."""
    spec = make_spec("conv2d", shape, bias=True, **geometry)
    zp = -9 if act == "int8" else 140
    q = QuantParams(act_type=act, a_zero_point=zp, per_channel=True, out_zero_point=5)
    plan, kernel = compile_int8(spec, q, load(f"host:{isa}"), tmp_path, threads=2, flags=FLAGS, force_layout=layout)
    assert plan.column_layout == layout
    verdict = verify_int8(kernel, seed=41)
    assert verdict["ok"] and verdict["exact_share"] == 1.0, (plan.summary(), verdict)


STAGING_S2 = [  # stride-2 columns under the 'rows' layout: the staged rows' two phases formed with SIMD
    # a stem (3 channels: only a partial group) with a 7x7 filter and odd pads, int8 activations (the XOR)
    ({"c": 3, "h": 13, "w": 45, "k": 19, "r": 7, "s": 7}, {"stride": "2", "pad": "3"}, "int8", 2),
    # a 1x1 shortcut: every other row and the even phase only are staged; a whole group and a partial one
    ({"c": 9, "h": 10, "w": 37, "k": 21, "r": 1, "s": 1, "n": 2}, {"stride": "2"}, "uint8", 1),
    # a dilation of 2 along the rows reads the even phase only; pads on every side, none on the left
    ({"c": 8, "h": 9, "w": 41, "k": 16, "r": 3, "s": 3}, {"stride": "2", "pad": "1,0,2,1", "dilation": "1,2"},
     "uint8", 2),
    # rows under 16 positions per phase: the scalar loop over the padded copy
    ({"c": 6, "h": 7, "w": 9, "k": 11, "r": 3, "s": 3}, {"stride": "2", "pad": "1"}, "int8", 1),
    # a row stride of 3 with a column stride of 2: two rows of three skipped, both phases read
    ({"c": 7, "h": 17, "w": 33, "k": 13, "r": 1, "s": 2}, {"stride": "3,2", "pad": "0,1"}, "uint8", 2),
]


@pytest.mark.parametrize("isa, dialect", DIALECTS, ids=[d for _, d in DIALECTS])
@pytest.mark.parametrize("shape, geometry, act, threads", STAGING_S2,
                         ids=["stem-7x7-c3-int8", "1x1-s2-batch2", "dilated-even-phase", "short-rows",
                              "row-stride-3"])
def test_stride_2_staging_matches_the_reference_exactly(isa, dialect, shape, geometry, act, threads, tmp_path):
    """The stride-2 staging of the 'rows' layout on x86 (padded row copies split into even and odd
    columns with SIMD, rows and phases no tap reads skipped), exact on random and extreme inputs."""
    spec = make_spec("conv2d", shape, bias=True, activation="relu6" if act == "int8" else "none", **geometry)
    zp = -60 if act == "int8" else 131
    q = QuantParams(act_type=act, a_zero_point=zp, per_channel=True, out_zero_point=-3 if act == "int8" else 120)
    plan, kernel = compile_int8(spec, q, load(f"host:{isa}"), tmp_path, threads=threads, flags=FLAGS,
                                force_layout="rows")
    assert plan.column_layout == "rows"
    source = kernel.rendered.source
    assert "xfc_phases32(pad" in source or "for (long ph = 0; ph < 2; ph++)" in source, "not the stride-2 staging"
    if shape["r"] == 1:
        assert "row_read[" in source, "rows no tap reads are staged"
    if shape["r"] == shape["s"] == 1:
        assert re.search(r"xfc_phases32\(pad[^;]*NULL", source), "a 1x1 stride-2 conv stages the odd phase"
    assert_int8_exact(kernel)


def test_stride_2_staging_of_very_wide_rows_keeps_the_scalar_loop_and_is_exact(tmp_path):
    """Rows so wide that the padded copies would not stay small on the stack (codegen.STAGE_PAD_MAX_BYTES)
    are staged by the scalar loop, as exactly."""
    spec = make_spec("conv2d", {"c": 5, "h": 3, "w": 16500, "k": 8, "r": 1, "s": 3}, bias=True, stride="2",
                     pad="0,1")
    q = QuantParams(act_type="uint8", a_zero_point=77, out_zero_point=130)
    plan, kernel = compile_int8(spec, q, load("host"), tmp_path, threads=1, flags=FLAGS, force_layout="rows")
    assert "xfc_phases32(pad" not in kernel.rendered.source
    assert_int8_exact(kernel)


def test_flat_layout_with_both_paddings_staged_matches_the_reference_exactly(tmp_path):
    """flat_padding='both' (what benchmarks/int8_conv_layouts.py compares against): the staged rows
    keep both side paddings and the kernel is as exact."""
    spec = make_spec("conv2d", FLAT[0][0], bias=True, **FLAT[0][1])
    q = QuantParams(act_type="uint8", a_zero_point=17, out_zero_point=100)
    plan, kernel = compile_int8(spec, q, load("host"), tmp_path, threads=1, flags=FLAGS, force_layout="flat",
                                flat_padding="both")
    assert plan.flat_row_pixels == spec.w + spec.pad_left + spec.pad_right == 9
    verdict = verify_int8(kernel, seed=11)
    assert verdict["ok"] and verdict["exact_share"] == 1.0, (plan.summary(), verdict)


IM2COL = [  # strided conv2d: short rows, odd pads, a dilation, channels not a multiple of 4, a 1x1, a batch
    ({"c": 13, "h": 14, "w": 13, "k": 21, "r": 3, "s": 3, "n": 2}, {"stride": "2", "pad": "1,1,1,1"}, (2, 2)),
    ({"c": 5, "h": 11, "w": 9, "k": 17, "r": 3, "s": 2}, {"stride": "2,3", "pad": "2,0,1,1", "dilation": "2,1"},
     (3, 1)),
    ({"c": 9, "h": 7, "w": 11, "k": 8, "r": 1, "s": 1}, {"stride": "2"}, (1, 2)),
]


@pytest.mark.parametrize("isa, dialect", DIALECTS, ids=[d for _, d in DIALECTS])
@pytest.mark.parametrize("shape, geometry, tile", IM2COL, ids=["3x3-s2-batch2", "dilated-s2x3-odd-pads", "1x1-s2"])
def test_im2col_column_layout_matches_the_reference_exactly(isa, dialect, shape, geometry, tile, tmp_path):
    """The 'im2col' layout (every tap gathered per output pixel when staged, the outputs as one run),
    forced with the planner's tile and with a ragged one, at 1 and 2 threads."""
    spec = make_spec("conv2d", shape, bias=True, activation="relu6", **geometry)
    q = QuantParams(act_type="int8", a_zero_point=-100, per_channel=True, out_zero_point=-5)
    for n, (threads, force) in enumerate([(1, None), (2, tile)]):
        kw = {"force_layout": "im2col", **({"force_tile": force} if force else {})}
        plan, kernel = compile_int8(spec, q, load(f"host:{isa}"), tmp_path / str(n), threads=threads, flags=FLAGS,
                                    **kw)
        assert plan.column_layout == "im2col"
        verdict = verify_int8(kernel, seed=n + 5)
        assert verdict["ok"] and verdict["exact_share"] == 1.0, (plan.summary(), verdict)


CHANNELS = [  # the GEMM turned around (pixels as rows): a short stage, a strided dilated one, a 1x1, a batch
    ({"c": 13, "h": 7, "w": 7, "k": 37, "r": 3, "s": 3, "n": 2}, {"pad": "1,1,1,1"}, (3, 2)),
    ({"c": 5, "h": 11, "w": 9, "k": 17, "r": 3, "s": 2}, {"stride": "2,3", "pad": "2,0,1,1", "dilation": "2,1"},
     (5, 1)),
    ({"c": 9, "h": 5, "w": 3, "k": 70, "r": 1, "s": 1}, {}, (2, 2)),
]


@pytest.mark.matrix(every=2)   # each dialect and edge case stays in the sample; test-matrices: all
@pytest.mark.parametrize("isa, dialect", DIALECTS, ids=[d for _, d in DIALECTS])
@pytest.mark.parametrize("shape, geometry, tile", CHANNELS, ids=["7x7-batch2", "dilated-s2x3-odd-pads", "1x1"])
@pytest.mark.parametrize("rows", ("gathered", "in_place"))
def test_channels_column_layout_matches_the_reference_exactly(isa, dialect, shape, geometry, tile, rows, tmp_path):
    """The 'channels' layout (output pixels as rows gathered from the staged input or read where it
    holds them, output channels in the lanes, the outputs stored transposed), forced with the planner's
    tile and with a ragged one, at 1 and 2 threads."""
    spec = make_spec("conv2d", shape, bias=True, activation="relu6", **geometry)
    q = QuantParams(act_type="uint8", a_zero_point=77, per_channel=True, out_zero_point=200)
    for n, (threads, force) in enumerate([(1, None), (2, tile)]):
        kw = {"force_layout": "channels", "force_channels_rows": rows, **({"force_tile": force} if force else {})}
        plan, kernel = compile_int8(spec, q, load(f"host:{isa}"), tmp_path / str(n), threads=threads, flags=FLAGS,
                                    **kw)
        assert plan.column_layout == "channels" and plan.row_operand == "activations"
        assert plan.channels_rows_in_place == (rows == "in_place")
        verdict = verify_int8(kernel, seed=n + 7)
        assert verdict["ok"] and verdict["exact_share"] == 1.0, (plan.summary(), verdict)


IN_PLACE = [  # (shape, geometry, tiles): row tiles cut at each output row's end, read in place
    # 9-wide output rows: a 5-pixel tile leaves a 4-pixel one per row, a 16-pixel tile 7 rows past the row
    ({"c": 7, "h": 7, "w": 9, "k": 40, "r": 3, "s": 3}, {"pad": "1,1,1,1"}, ((5, 1), (16, 1))),
    # stride 2: a pixel's k group 8 bytes after the previous one's; odd sizes, a partial channel group
    ({"c": 13, "h": 11, "w": 13, "k": 33, "r": 3, "s": 3}, {"stride": "2,2", "pad": "1,1,1,1"}, ((3, 1), (7, 2))),
    # strides 2 and 3, dilation 2 across, uneven pads: the last tile reads past the staged planes
    ({"c": 9, "h": 10, "w": 12, "k": 20, "r": 3, "s": 2}, {"stride": "2,3", "pad": "1,0,2,1", "dilation": "1,2"},
     ((5, 1), (16, 1))),
    # 1x1 stride 1: the whole image one run (tiles cross output rows), 30 pixels
    ({"c": 20, "h": 5, "w": 6, "k": 17, "r": 1, "s": 1}, {}, ((7, 1), (16, 1))),
    # 3x1 with pads above and below only: rows back to back in the staged input, one run too
    ({"c": 5, "h": 9, "w": 9, "k": 24, "r": 3, "s": 1}, {"pad": "1,0,1,0"}, ((4, 1), (16, 1))),
]


@pytest.mark.matrix(every=2)   # each dialect and edge case stays in the sample; test-matrices: all
@pytest.mark.parametrize("isa, dialect", DIALECTS, ids=[d for _, d in DIALECTS])
@pytest.mark.parametrize("shape, geometry, tiles", IN_PLACE, ids=["partial-row-tiles", "stride-2", "strides-2x3-dilated",
                                                                  "1x1-one-run", "3x1-one-run"])
def test_channels_rows_read_in_place_match_the_reference_exactly(isa, dialect, shape, geometry, tiles, tmp_path):
    """The 'channels' layout reading each row tile's pixels in place (no gather): tiles ending inside a
    row and tiles reaching past it, strides 2 and 3 (the rows' k groups 8 and 12 bytes apart), a 1x1 and
    a 3x1 whose rows follow each other in the staged input (one run); uint8 and int8 activations (the
    staged bytes flipped), 1 and 2 threads."""
    spec = make_spec("conv2d", shape, bias=True, activation="relu6", **geometry)
    quants = (QuantParams(act_type="uint8", a_zero_point=77, per_channel=True, out_zero_point=200),
              QuantParams(act_type="int8", a_zero_point=-20, per_channel=True, out_zero_point=-3))
    for n, (q, threads, tile) in enumerate([(quants[0], 1, tiles[0]), (quants[1], 2, tiles[1])]):
        if int8_registers(dialect, tile[0], tile[1]) > load(f"host:{isa}").cluster().core.vector_registers:
            tile = (3, 1)
        plan, kernel = compile_int8(spec, q, load(f"host:{isa}"), tmp_path / str(n), threads=threads, flags=FLAGS,
                                    force_layout="channels", force_channels_rows="in_place", force_tile=tile)
        assert plan.channels_rows_in_place and (plan.mr, plan.nv) == tile
        verdict = verify_int8(kernel, seed=n + 13)
        assert verdict["ok"] and verdict["exact_share"] == 1.0, (plan.summary(), verdict)


@pytest.mark.parametrize("isa, dialect", DIALECTS, ids=[d for _, d in DIALECTS])
def test_channels_layout_with_int8_activations_matches_the_reference_exactly(isa, dialect, tmp_path):
    """int8 activations (every staged byte flipped by 0x80), whole 4-channel groups staged 4 bytes
    at a time, a partial last pixel block, 2 threads."""
    spec = make_spec("conv2d", {"c": 12, "h": 6, "w": 5, "k": 40, "r": 3, "s": 3}, bias=True, pad="1,1,1,1")
    q = QuantParams(act_type="int8", a_zero_point=-20, per_channel=True, out_zero_point=-3)
    plan, kernel = compile_int8(spec, q, load(f"host:{isa}"), tmp_path, threads=2, flags=FLAGS,
                                force_layout="channels", force_tile=(7, 1))
    assert plan.column_layout == "channels" and (spec.out_h * spec.out_w) % plan.mr != 0
    verdict = verify_int8(kernel, seed=21)
    assert verdict["ok"] and verdict["exact_share"] == 1.0, (plan.summary(), verdict)


@pytest.mark.skipif(not HAS_VNNI, reason="needs a CPU with avx512_vnni")
@pytest.mark.parametrize("tile", [(16, 1), (20, 1)], ids=["16-pixel-blocks", "20-pixel-blocks"])
def test_channels_layout_transposes_whole_and_partial_16_pixel_blocks(tile, tmp_path):
    """The epilogue transposes the tile in 16 x 16 byte blocks: whole blocks of 16 pixels (stored
    whole), a second block of 4 (masked), 16 channels per tile, the last of 40 holding 8."""
    spec = make_spec("conv2d", {"c": 7, "h": 7, "w": 9, "k": 40, "r": 3, "s": 3}, bias=True, pad="1,1,1,1")
    q = QuantParams(act_type="uint8", a_zero_point=90, per_channel=True, out_zero_point=128)
    plan, kernel = compile_int8(spec, q, load("host:avx512"), tmp_path, threads=1, flags=FLAGS,
                                force_layout="channels", force_tile=tile)
    assert (plan.mr, plan.nv, plan.dialect) == (tile[0], tile[1], "vnni")
    verdict = verify_int8(kernel, seed=31)
    assert verdict["ok"] and verdict["exact_share"] == 1.0, (plan.summary(), verdict)


@pytest.mark.unit
@pytest.mark.parametrize("shape, geometry, tiles", IN_PLACE, ids=["partial-row-tiles", "stride-2", "strides-2x3-dilated",
                                                                  "1x1-one-run", "3x1-one-run"])
def test_in_place_rows_stay_inside_the_staged_buffer_and_tile_every_pixel_once(shape, geometry, tiles):
    """Every byte a row tile reads in place (its rows past the run's end included) lies inside the
    staged planes and the slack after them, and the row tiles cover each output pixel exactly once:
    counted pixel by pixel here, not from the codegen's formulas."""
    from xfc.cpu.int8_codegen import _in_place_context
    from xfc.cpu.int8_synth import plan_int8
    spec = make_spec("conv2d", shape, **geometry)
    for tile in tiles:
        plan = plan_int8(spec, QuantParams(), _vnni_host(), threads=1, host_flags=_VNNI_FLAGS, force_layout="channels",
                         force_channels_rows="in_place", force_tile=(tile[0], 1))
        hp, wp = spec.h + spec.pad_top + spec.pad_bottom, spec.w + spec.pad_left + spec.pad_right
        taps = [(r * spec.dilation_h, s * spec.dilation_w) for r in range(spec.r) for s in range(spec.s)]
        cg = -(-spec.c // 4)
        ctx = _in_place_context(plan, hp, wp, taps, cg)
        plane, covered, last = hp * wp * 4, [], 0
        for mb in range(ctx["IP_RUNS"] * ctx["OWT"]):
            run, p0 = divmod(mb, ctx["OWT"])
            p0 *= plan.mr
            covered += [run * ctx["IP_RUN"] + p for p in range(p0, min(p0 + plan.mr, ctx["IP_RUN"]))]
            base = run * ctx["IP_RUN_BYTES"] + p0 * ctx["A_ROW"]
            for r in range(plan.mr):
                for t in ctx["rs_tap_offs"]:
                    last = max(last, base + r * ctx["A_ROW"] + t + (cg - 1) * plane + 4)
            # each valid row's k group at every tap and channel group, where the kernel reads it, against
            # where the staged image holds that pixel's tap: input row oh*sh + dr, column ow*sw + ds
            for r in range(min(plan.mr, ctx["IP_RUN"] - p0)):
                oh, ow = divmod(run * ctx["IP_RUN"] + p0 + r, spec.out_w)
                for (dr, ds), t in zip(taps, ctx["rs_tap_offs"]):
                    for g in range(cg):
                        read = base + r * ctx["A_ROW"] + t + g * plane
                        assert read == g * plane + ((oh * spec.stride_h + dr) * wp + ow * spec.stride_w + ds) * 4
        assert sorted(covered) == list(range(spec.out_h * spec.out_w))
        assert last <= cg * plane + ctx["RS_SLACK"], (tile, last, cg * plane, ctx["RS_SLACK"])


@pytest.mark.unit
def test_the_planner_reads_a_deep_3x3_stage_in_place_and_says_why():
    """ResNet-18's 14x14 stage: the 'channels' layout with its rows read in place (no gather) is
    modelled fastest, and --explain names the gathered alternative's time; a row source without the
    'channels' layout is refused."""
    from xfc.cpu.int8_synth import explain, plan_int8
    spec = make_spec("conv2d", {"c": 256, "h": 14, "w": 14, "k": 256, "r": 3, "s": 3}, pad="1", bias=True)
    plan = plan_int8(spec, QuantParams(), _vnni_host(), threads=1, host_flags=_VNNI_FLAGS)
    assert plan.column_layout == "channels" and plan.channels_rows_in_place
    assert plan.summary()["channels_rows"] == "in_place"
    assert "read in place from the staged input" in explain(plan) and "gathered" in explain(plan)
    with pytest.raises(OperatorError, match="with the 'channels' column layout"):
        plan_int8(spec, QuantParams(), load("host:avx2"), threads=1, force_channels_rows="in_place")


@pytest.mark.unit
def test_the_int8_tile_model_counts_issue_and_the_tiles_own_epilogue():
    """vnni: a broadcast-heavy tile is bound by the issue of its k step (16 dots, 16 broadcasts, a load
    and the loop over the decode width), not by its loads; a tile that stores its own outputs pays its
    requantization per tile, the 'channels' layout (transposed store charged apart) does not; the
    dialects whose k step is not counted instruction by instruction keep the old bound."""
    from xfc.cpu.int8_synth import (DW_EPILOGUE_UOPS, LOOP_UOPS_PER_GROUP, GemmShape, _tile_seconds, group_cycles,
                                    tile_epilogue_cycles)
    core = _vnni_host().cluster().core
    assert group_cycles("vnni", core, 16, 1) == (16 + 16 + 1 + LOOP_UOPS_PER_GROUP) / core.decode_width
    assert group_cycles("vnni", core, 14, 2) == 28 / (core.fma_per_cycle * 1.0)          # the dots bind
    assert tile_epilogue_cycles("vnni", core, 6, 4) == 24 * DW_EPILOGUE_UOPS[16] / core.decode_width
    assert tile_epilogue_cycles("avx2", core, 6, 2) == 0.0
    own, turned = GemmShape(144, 3136, 1, 6), GemmShape(144, 3136, 1, 6, tile_epilogue=False)
    with_epilogue = _tile_seconds(own, 6, 64, 12.0, 1e9, 1, epilogue_cycles=42.0)
    assert with_epilogue == pytest.approx(24 * 49 * (6 * 12.0 + 42.0) / 1e9)
    assert _tile_seconds(turned, 6, 64, 12.0, 1e9, 1, epilogue_cycles=42.0) == pytest.approx(24 * 49 * 6 * 12.0 / 1e9)


@pytest.mark.unit
def test_an_unknown_or_misplaced_column_layout_is_refused():
    from xfc.cpu.int8_synth import plan_int8
    conv = make_spec("conv2d", {"c": 8, "h": 7, "w": 7, "k": 8, "r": 3, "s": 3}, pad="1")
    mm = make_spec("matmul", {"m": 8, "n": 8, "k": 8})
    for spec, layout, needle in ((conv, "columns", "int8 column layout 'columns'"),
                                 (mm, "channels", "for conv2d (not matmul)"),
                                 (conv, "im2col", "strided conv2d")):
        with pytest.raises(OperatorError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            plan_int8(spec, QuantParams(), load("host:avx2"), threads=1, force_layout=layout)


def test_vnni_is_refused_cleanly_without_the_flag():
    if "avx512" not in available_isas():
        pytest.skip("no AVX-512 here")
    from xfc.cpu.int8_synth import plan_int8
    spec = make_spec("matmul", {"m": 4, "n": 4, "k": 4})
    plan = plan_int8(spec, QuantParams(), load("host:avx512"), host_flags=frozenset())
    assert plan.dialect == "avx2"
    with pytest.raises(OperatorError, match="vnni"):
        plan_int8(spec, QuantParams(), load("host:avx2"), host_flags=FLAGS, force_dialect="vnni")


def test_cli_int8_verify_json(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("XFC_HOST_PROBE", "off")
    code, out, err = _run(["synth", "conv2d", "--hw", "host", "--shape", "c=8,h=10,w=7,k=12,r=3,s=3", "--pad", "1",
                           "--bias", "--activation", "relu", "--dtype", "int8", "--quant",
                           "act=int8,a_zp=-128,per_channel=1,out_zp=-20", "--verify", "--json",
                           "-o", str(tmp_path / "o")], capfd)
    assert code == 0, err
    report = json.loads(out)
    assert report["verified"] is True and report["exact_share"] == 1.0 and report["dtype"] == "int8"
    assert report["quantization"]["per_channel"] is True
    assert json.loads((tmp_path / "o" / "report.json").read_text())["exact_share"] == 1.0


@pytest.mark.parametrize("argv, contains", [
    (["--quant", "a_scale=0"], "a_scale=0"), (["--quant", "out_scale=nan"], "out_scale=nan"),
    (["--quant", "w_scale=-2"], "w_scale=-2"), (["--quant", "act=int8,a_zp=200"], "a_zp=200"),
    (["--quant", "out_zp=300"], "out_zp=300"), (["--target", "gpu", "--hw", "adreno-650"], "not implemented"),
    (["--hw", "cortex-a53"], "cortex-a53: the core lacks 'dotprod'"),   # ARM int8 needs SDOT (tests/test_int8_arm.py)
    (["--dtype", "fp16"], "no fp16 CPU kernels for host"),
    (["--dtype", "fp32", "--quant", "a_zp=1"], "--quant applies to --dtype int8 only"),
    (["--tile-db", "some.db"], "fp32 rows only"),
    (["--lowering", "winograd"], "fp32 CPU lowerings"),
])
def test_cli_int8_bad_input_exits_2_with_one_line(argv, contains, tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("XFC_HOST_PROBE", "off")
    base = ["synth", "matmul", "--hw", "host", "--shape", "m=4,n=4,k=4", "--dtype", "int8", "-o", str(tmp_path / "o")]
    code, out, err = _run(base + argv, capfd)
    lines = [ln for ln in err.splitlines() if ln.startswith("xfc: error")]
    assert code == 2 and len(lines) == 1 and contains in lines[0] and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()


# Depthwise 'tap_pairs' layout (x86 avx2 / vnni: int16 tap pairs, vpmaddwd + vpaddd or vpdpwssd). Ragged
# geometry that reaches every staging mode ('pairs' stride 1, 'direct' stride 2 dilation 1, 'gather'),
# widths and channel counts off a multiple of 8/16, planes under 16 bytes (the tail-buffer conversion),
# asymmetric padding, dilation, both activation types with zero points at both ends.
TAP_PAIRS_CASES = [
    # shape, geometry, (act, a_zp, out_zp), activation, per_channel, bias, threads, staging
    ({"c": 5, "h": 13, "w": 37, "r": 3, "s": 3, "n": 2}, {"stride": "1", "pad": "1,0,2,1"}, ("int8", -128, -100),
     "relu6", True, True, 2, "pairs"),
    ({"c": 7, "h": 15, "w": 23, "r": 3, "s": 3}, {"stride": "2", "pad": "0,1,1,0"}, ("uint8", 255, 0),
     "none", False, False, 1, "direct"),
    ({"c": 3, "h": 17, "w": 29, "r": 3, "s": 5}, {"stride": "2", "pad": "2,3,1,0", "dilation": "1,2"},
     ("uint8", 128, 3), "relu", True, True, 2, "gather"),
    ({"c": 9, "h": 11, "w": 19, "r": 5, "s": 4}, {"stride": "1,3", "pad": "2,1", "dilation": "2,1"},
     ("int8", 127, -128), "relu6", True, False, 1, "gather"),
    ({"c": 4, "h": 3, "w": 3, "r": 3, "s": 3, "n": 2}, {"stride": "1", "pad": "1"}, ("int8", 0, -7),
     "none", False, True, 2, "pairs"),
    ({"c": 17, "h": 7, "w": 7, "r": 3, "s": 3}, {"stride": "1", "pad": "1", "dilation": "2,3"}, ("uint8", 0, 0),
     "relu6", True, True, 1, "pairs"),
    ({"c": 2, "h": 9, "w": 70, "r": 7, "s": 7}, {"stride": "2,1", "pad": "3,2,1,3"}, ("uint8", 7, 128),
     "none", True, True, 2, "pairs"),
]


def _tap_pairs_spec(shape, geometry, quant, activation, per_channel, bias):
    act, a_zp, out_zp = quant
    spec = make_spec("depthwise", shape, bias=bias, activation=activation, **geometry)
    return spec, QuantParams(act_type=act, a_zero_point=a_zp, per_channel=per_channel, out_zero_point=out_zp)


@pytest.mark.skipif("avx2" not in available_isas(), reason="no AVX2 here")
@pytest.mark.parametrize("case", TAP_PAIRS_CASES, ids=[f"{c[7]}-{c[2][0]}-{i}" for i, c in enumerate(TAP_PAIRS_CASES)])
def test_depthwise_tap_pairs_matches_the_reference_exactly(case, tmp_path):
    shape, geometry, quant, activation, per_channel, bias, threads, staging = case
    spec, q = _tap_pairs_spec(shape, geometry, quant, activation, per_channel, bias)
    plan, kernel = compile_int8(spec, q, load("host:avx2"), tmp_path, threads=threads, flags=FLAGS)
    assert (plan.dialect, plan.depthwise_layout, plan.depthwise_staging) == ("avx2", "tap_pairs", staging)
    assert any(r.startswith(f"depthwise staging '{staging}'") for r in plan.reasons)
    assert_int8_exact(kernel)


@pytest.mark.skipif("avx2" not in available_isas(), reason="no AVX2 here")
@pytest.mark.parametrize("vectors, rows", [(1, 4), (3, 3), (4, 2), (2, 1)])
def test_depthwise_tap_pairs_forced_blocks(vectors, rows, tmp_path):
    """Blocks the model does not pick, on shapes whose last row block and last column group are partial
    (and whose last vector holds fewer than 8 pixels): multi-row blocks share staged-row loads."""
    hw = load("host:avx2")
    for i, (shape, geometry) in enumerate([({"c": 3, "h": 19, "w": 45, "r": 3, "s": 3}, {"stride": "1", "pad": "1"}),
                                           ({"c": 2, "h": 23, "w": 61, "r": 3, "s": 3}, {"stride": "2", "pad": "1"})]):
        spec, q = _tap_pairs_spec(shape, geometry, ("int8", -9, 4), "relu6", True, True)
        plan, kernel = compile_int8(spec, q, hw, tmp_path / str(i), threads=2, flags=FLAGS, force_tile=(8, vectors),
                                    force_rows=rows)
        assert (plan.tile_rows, plan.nv, plan.lanes) == (rows, vectors, 8)
        verdict = verify_int8(kernel, seed=i)
        assert verdict["ok"] and verdict["exact_share"] == 1.0, (plan.summary(), verdict)


def test_depthwise_plans_name_layout_and_staging():
    """The layout and staging are plan fields the planner decides with a reason: generic keeps the
    plane layout (no staging), avx2 and vnni plan tap pairs; a block that cannot be forced is refused."""
    from xfc.cpu.int8_synth import plan_int8
    spec, q = _tap_pairs_spec({"c": 8, "h": 14, "w": 14, "r": 3, "s": 3}, {"stride": "2", "pad": "1"}, ("uint8", 128, 128),
                              "none", False, True)
    generic = plan_int8(spec, q, load("host:generic"), threads=1)
    assert (generic.depthwise_layout, generic.depthwise_staging) == ("plane", "")
    vnni = plan_int8(spec, q, _vnni_host(), threads=1, host_flags=_VNNI_FLAGS)
    assert (vnni.dialect, vnni.depthwise_layout, vnni.depthwise_staging) == ("vnni", "tap_pairs", "direct")
    assert vnni.summary()["staging"] == "direct" and "vpdpwssd" in " ".join(vnni.header_lines)
    with pytest.raises(OperatorError, match="lanes"):
        plan_int8(spec, q, _vnni_host(), threads=1, host_flags=_VNNI_FLAGS, force_tile=(4, 1))


_VNNI_FLAGS = None


def _vnni_host():
    """An AVX-512 VNNI host description from synthetic /proc/cpuinfo facts (this CPU need not have it)."""
    global _VNNI_FLAGS
    from xfc.hardware.host import X86_64_V4_FLAGS, describe_host
    _VNNI_FLAGS = frozenset(X86_64_V4_FLAGS) | {"avx512_vnni"}
    return describe_host({"flags": set(_VNNI_FLAGS), "model name": "AVX-512 VNNI core"}, {}, 2, "x86_64", isa="avx512")


_vnni_host()


@pytest.mark.matrix(every=2)
@pytest.mark.parametrize("case", TAP_PAIRS_CASES[:4], ids=[f"{c[7]}-{i}" for i, c in enumerate(TAP_PAIRS_CASES[:4])])
@pytest.mark.parametrize("force", [None, (16, 2, 3), (8, 4, 2)], ids=["planned", "zmm-2x3", "ymm-4x2"])
def test_depthwise_tap_pairs_vnni_compiles(case, force, tmp_path):
    """The AVX-512 VNNI variant (vpdpwssd, 16- and 8-lane blocks) cannot run on an AVX2 machine, and
    qemu-x86_64's TCG has no AVX-512: it is compiled here for x86-64-v4 + avx512vnni (errors and
    warnings fail), run where the CPU has avx512_vnni (test_int8_kernel_matches_the_reference_exactly)."""
    import shutil
    import subprocess
    from xfc.pipeline import stages
    from xfc.cpu.int8_synth import plan_int8
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    shape, geometry, quant, activation, per_channel, bias, threads, staging = case
    spec, q = _tap_pairs_spec(shape, geometry, quant, activation, per_channel, bias)
    kw = {} if force is None else {"force_tile": force[:2], "force_rows": force[2]}
    plan = plan_int8(spec, q, _vnni_host(), threads=threads, host_flags=_VNNI_FLAGS, **kw)
    assert (plan.dialect, plan.depthwise_layout, plan.depthwise_staging) == ("vnni", "tap_pairs", staging)
    rendered = stages.render(plan)
    assert "_dpwssd_epi32" in rendered.source and "_madd_epi16" not in rendered.source
    source = tmp_path / "k.c"
    source.write_text(rendered.source)
    proc = subprocess.run(["gcc", "-O3", "-std=gnu11", "-fopenmp", "-Wall", "-Werror", "-Wno-unused-function",
                           "-march=x86-64-v4", "-mavx512vnni", "-c", str(source), "-o", str(tmp_path / "k.o")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


# vpmaddubsw (avx2, QuantParams.narrow_weights): u8 x s8 pair sums in int16, exact for weights within
# +-64; ragged shapes of every avx2 GEMM layout, both activation types, the extreme inputs that make
# the pair sums largest (x at the far end, w = -64: 255 x 128 = 32640 per pair).
NARROW_CASES = [
    ("matmul", {"m": 19, "n": 37, "k": 45, "batch": 2}, {}, "uint8"),
    ("conv2d", {"c": 5, "h": 11, "w": 9, "k": 21, "r": 3, "s": 3, "n": 2}, {"stride": "2,1", "pad": "1,2,0,1"}, "int8"),
    ("conv2d", {"c": 61, "h": 9, "w": 11, "k": 37, "r": 3, "s": 3}, {"pad": "1"}, "uint8"),     # flat columns
    ("conv2d", {"c": 130, "h": 7, "w": 7, "k": 70, "r": 3, "s": 3}, {"pad": "1"}, "int8"),      # channels columns
    ("conv2d", {"c": 7, "h": 6, "w": 6, "k": 3, "r": 1, "s": 1}, {}, "uint8"),
]


@pytest.mark.skipif("avx2" not in available_isas(), reason="no AVX2 here")
@pytest.mark.parametrize("op, shape, geometry, act", NARROW_CASES,
                         ids=[f"{c[0]}-{c[1].get('c', c[1].get('m'))}-{c[3]}" for c in NARROW_CASES])
def test_avx2_pair_sums_of_narrow_weights_match_the_reference_exactly(op, shape, geometry, act, tmp_path):
    spec = make_spec(op, shape, bias=True, activation="relu", **geometry)
    q = QuantParams(act_type=act, a_zero_point=3 if act == "uint8" else -100, per_channel=True,
                    out_zero_point=128 if act == "uint8" else 0, narrow_weights=True)
    plan, kernel = compile_int8(spec, q, load("host:avx2"), tmp_path, threads=2, flags=FLAGS)
    assert (plan.dialect, plan.pair_sums_int16) == ("avx2", True)
    assert "_mm256_maddubs_epi16" in kernel.rendered.source
    for mode, seed in (("random", 3), ("extreme", 0)):
        verdict = verify_int8(kernel, seed=seed, mode=mode)
        assert verdict["ok"] and verdict["exact_share"] == 1.0, (mode, verdict)


@pytest.mark.skipif("avx2" not in available_isas(), reason="no AVX2 here")
def test_a_kernel_planned_for_narrow_weights_refuses_a_wide_one(tmp_path):
    """Its pre-pack checks what the plan assumed: a weight of 65 would let a pair sum saturate."""
    spec = make_spec("conv2d", {"c": 8, "h": 5, "w": 5, "k": 4, "r": 3, "s": 3}, pad=1)
    q = QuantParams(act_type="uint8", a_zero_point=0, narrow_weights=True)
    _, kernel = compile_int8(spec, q, load("host:avx2"), tmp_path, threads=1, flags=FLAGS)
    x, w, bias = make_qinputs(spec, q, seed=1)
    assert np.abs(w.astype(int)).max() <= 64
    np.testing.assert_array_equal(run_int8_entry(kernel, x, w, bias, multipliers(spec, q)), qreference(spec, q, x, w, bias))
    w[0, 0, 1, 1] = 65
    with pytest.raises(XfcError, match="pre-packing the weights failed"):
        run_int8_entry(kernel, x, w, bias, multipliers(spec, q))


# Depthwise 'channels' layout (vnni with avx512vbmi: 16 channels in the lanes, vpdpbusd on quads of
# adjacent taps, the planes transposed in registers, 64 pixels at a time): the shared ragged cases,
# a 16-channel plane of several 64-pixel chunks and a 1x1 filter on 70-wide rows.
HAS_VBMI = HAS_VNNI and "avx512vbmi" in FLAGS
CHANNELS_CASES = DEPTHWISE_CHANNELS_CASES + [
    ({"c": 16, "h": 14, "w": 14, "r": 3, "s": 3}, {"stride": "1", "pad": "1"}, ("uint8", 255, 0), "relu", False, True, 1),
    ({"c": 18, "h": 6, "w": 70, "r": 1, "s": 1}, {"stride": "2,1"}, ("uint8", 7, 128), "relu", True, True, 2),
]


@pytest.mark.skipif(not HAS_VBMI, reason="needs a CPU with avx512_vnni and avx512vbmi")
@pytest.mark.parametrize("case", CHANNELS_CASES, ids=[f"{c[0]['c']}x{c[0]['h']}x{c[0]['w']}-{c[2][0]}-{i}"
                                                      for i, c in enumerate(CHANNELS_CASES)])
def test_depthwise_channels_layout_matches_the_reference_exactly(case, tmp_path):
    shape, geometry, quant, activation, per_channel, bias, threads = case
    spec, q = _tap_pairs_spec(shape, geometry, quant, activation, per_channel, bias)
    plan, kernel = compile_int8(spec, q, load("host"), tmp_path, threads=threads, flags=FLAGS,
                                force_layout="channels")
    assert (plan.dialect, plan.depthwise_layout, plan.parallel_axis) == ("vnni", "channels", "channel_groups")
    assert "_mm512_dpbusd_epi32" in kernel.rendered.source and "_mm512_permutexvar_epi8" in kernel.rendered.source
    assert_int8_exact(kernel)


def _vbmi_host():
    """The synthetic AVX-512 VNNI host with avx512vbmi, and its flags."""
    flags = frozenset(_VNNI_FLAGS) | {"avx512vbmi"}
    from xfc.hardware.host import describe_host
    return describe_host({"flags": set(flags), "model name": "AVX-512 VNNI VBMI core"}, {}, 2, "x86_64",
                         isa="avx512"), flags


def test_depthwise_channels_layout_is_planned_where_it_applies_and_pays():
    """Small planes take channels in the lanes; a plane whose transposed buffers pass the L2 keeps the
    tap pairs (and says why); so do a horizontal dilation, a core without avx512vbmi and forced blocks;
    forcing the layout where it cannot run is one clear error."""
    from xfc.cpu.int8_synth import plan_int8
    hw, flags = _vbmi_host()
    q = QuantParams(act_type="uint8", a_zero_point=128, out_zero_point=128)

    def plan(shape, geometry, host=hw, host_flags=flags, **kw):
        spec = make_spec("depthwise", {"r": 3, "s": 3, **shape}, bias=True, **geometry)
        return plan_int8(spec, q, host, threads=1, host_flags=host_flags, **kw)

    small = plan({"c": 960, "h": 7, "w": 7}, {"pad": "1"})
    assert (small.depthwise_layout, small.lanes, small.nv) == ("channels", 16, 7)
    assert any("depthwise layout 'channels'" in r and "us modelled against" in r for r in small.reasons)
    big = plan({"c": 32, "h": 112, "w": 112}, {"pad": "1"})
    assert big.depthwise_layout == "tap_pairs"
    assert any("more than the core's" in r and "L2" in r for r in big.reasons), big.reasons
    assert plan({"c": 960, "h": 7, "w": 7}, {"pad": "2", "dilation": "1,2"}).depthwise_layout == "tap_pairs"
    assert plan({"c": 960, "h": 7, "w": 7}, {"pad": "1"}, host=_vnni_host(),
                host_flags=_VNNI_FLAGS).depthwise_layout == "tap_pairs"
    assert plan({"c": 960, "h": 7, "w": 7}, {"pad": "1"}, force_tile=(8, 1)).depthwise_layout == "tap_pairs"
    assert plan({"c": 960, "h": 7, "w": 7}, {"pad": "1"}, force_layout="tap_pairs").depthwise_layout == "tap_pairs"
    assert plan({"c": 32, "h": 112, "w": 112}, {"pad": "1"}, force_layout="channels").depthwise_layout == "channels"
    with pytest.raises(OperatorError, match="avx512vbmi"):
        plan({"c": 960, "h": 7, "w": 7}, {"pad": "1"}, host=_vnni_host(), host_flags=_VNNI_FLAGS,
             force_layout="channels")
    with pytest.raises(OperatorError, match="dilation_w 1"):
        plan({"c": 8, "h": 7, "w": 7}, {"pad": "2", "dilation": "1,2"}, force_layout="channels")
    with pytest.raises(OperatorError, match="depthwise layout 'rows'"):
        plan({"c": 8, "h": 7, "w": 7}, {"pad": "1"}, force_layout="rows")
    with pytest.raises(OperatorError, match="channels layout has none"):
        plan({"c": 8, "h": 7, "w": 7}, {"pad": "1"}, force_layout="channels", force_tile=(8, 1))
    with pytest.raises(OperatorError, match="needs the avx2 or vnni dialect"):
        plan({"c": 8, "h": 7, "w": 7}, {"pad": "1"}, host=load("host:generic"), force_layout="tap_pairs")


@pytest.mark.parametrize("case", CHANNELS_CASES[:3], ids=["s2-int8", "5x5-narrow", "dilated-h"])
def test_depthwise_channels_layout_compiles(case, tmp_path):
    """Where this CPU lacks avx512vbmi or VNNI the layout is still compiled (errors and warnings
    fail) for x86-64-v4 + VNNI + VBMI; it runs in test_depthwise_channels_layout_matches_the_reference_exactly."""
    import shutil
    import subprocess
    from xfc.pipeline import stages
    from xfc.cpu.int8_synth import plan_int8
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    shape, geometry, quant, activation, per_channel, bias, threads = case
    spec, q = _tap_pairs_spec(shape, geometry, quant, activation, per_channel, bias)
    hw, flags = _vbmi_host()
    plan = plan_int8(spec, q, hw, threads=threads, host_flags=flags, force_layout="channels")
    source = tmp_path / "k.c"
    source.write_text(stages.render(plan).source)
    proc = subprocess.run(["gcc", "-O3", "-std=gnu11", "-fopenmp", "-Wall", "-Werror", "-Wno-unused-function",
                           "-march=x86-64-v4", "-mavx512vnni", "-mavx512vbmi", "-c", str(source), "-o",
                           str(tmp_path / "k.o")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
