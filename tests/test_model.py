"""`xfc model` without a compiler: loading, mapping, folding, coverage, bounds and bad models."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from support import needs_onnxruntime, nets

from xfc.cli import main
from xfc.errors import OperatorError
from xfc.hardware.load import load as load_hw
from xfc.model import bounds
from xfc.model.coverage import coverage, node_flops
from xfc.model.load import load_model, parse_input_shapes
from xfc.model.mapping import map_network
from xfc.model.pipeline import analyse
from xfc.ops.spec import Conv2dSpec, DepthwiseSpec, MatmulSpec, make_spec
from xfc.ops.reference import reference

pytestmark = pytest.mark.unit


def save(model, tmp_path, name="net.onnx") -> Path:
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def mapped(model, tmp_path, **kw):
    return map_network(load_model(save(model, tmp_path), **kw))


def by_name(net):
    return {s.name: s for s in net.steps}


def constants(model):
    return {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}


# ---------------------------------------------------------------------------------------------
# --input-shape and loading
# ---------------------------------------------------------------------------------------------

def test_parse_input_shapes():
    assert parse_input_shapes(["x=1x3x224x224", "mask=2,5"]) == {"x": (1, 3, 224, 224), "mask": (2, 5)}
    assert parse_input_shapes(["1x3x8x8"]) == {None: (1, 3, 8, 8)}
    assert parse_input_shapes(None) == {}
    for bad in ("x=1xax3", "x=0x3", "=1x2", "x=", "x=1x-2"):
        with pytest.raises(OperatorError):
            parse_input_shapes([bad])
    with pytest.raises(OperatorError, match="twice"):
        parse_input_shapes(["x=1x2", "x=1x3"])


def dynamic_model():
    b = nets.Builder(5)
    y = b.node("Relu", [b.conv("x", 3, 4, name="conv")], name="relu")
    model = b.model({"x": [1, 3, 6, 6]}, [y])
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[0].ClearField("dim_value")
    dims[0].dim_param = "batch"
    dims[2].dim_param = "height"
    for d in model.graph.output[0].type.tensor_type.shape.dim:
        d.dim_param = "o"
    return model


def test_input_shape_fixes_dynamic_dimensions(tmp_path):
    path = save(dynamic_model(), tmp_path)
    for given in (["x=2x3x9x6"], ["2x3x9x6"]):
        net = map_network(load_model(path, parse_input_shapes(given)))
        (layer,) = net.layers
        assert (layer.spec.n, layer.spec.c, layer.spec.h, layer.spec.w) == (2, 3, 9, 6)
        assert layer.out_shape == (2, 4, 9, 6)


# ---------------------------------------------------------------------------------------------
# Mapping
# ---------------------------------------------------------------------------------------------

def test_mobilenet_block_mapping(tmp_path):
    model = nets.mobilenet_net(blocks=2)
    net = mapped(model, tmp_path)
    steps = by_name(net)
    assert steps["stem"].label == "Conv+Clip" and steps["stem"].spec.epilogue.activation == "relu6"
    assert steps["stem"].nodes == ("stem", "stem_relu6")
    dw = steps["mb0_dw"]
    assert isinstance(dw.spec, DepthwiseSpec) and dw.spec.c == 32 and dw.spec.epilogue.activation == "relu6"
    assert dw.weight.shape == (32, 1, 3, 3)
    project = steps["mb0_project"]
    assert isinstance(project.spec, Conv2dSpec) and project.spec.epilogue.activation == "none"
    assert project.spec.epilogue.bias
    add = steps["mb0_add"]
    assert not add.covered and add.op_type == "Add"
    cls = steps["classifier"]
    assert isinstance(cls.spec, MatmulSpec) and (cls.spec.m, cls.spec.n, cls.spec.k) == (1, 10, 16)
    w = constants(model)[cls.onnx_nodes[0].input[1]]
    np.testing.assert_array_equal(cls.weight[0], w.T)   # transB: stored [N, K]


def test_identical_layers_are_synthesized_once(tmp_path):
    path = save(nets.mobilenet_net(blocks=3), tmp_path)
    net, cov, syntheses, names = analyse(path, load_hw("host"))
    assert len(net.layers) == 14
    # stem; expand (all four blocks), dw, project (the three identical blocks); the strided
    # block's dw and project; classifier
    assert len(syntheses) == cov.distinct_layers == 1 + 3 + 2 + 1
    assert list(names.values()) == [f"k{i:02d}_{s.name}" for i, s in enumerate(syntheses, 1)]
    expands = [layer for layer in net.layers if layer.name.endswith("_expand")]
    assert len(expands) == 4 and len({layer.spec for layer in expands}) == 1
    assert len({id(layer.weight) for layer in expands}) == 4     # one kernel, each layer its own weights
    assert len({layer.spec for layer in net.layers if layer.name.endswith("_dw")}) == 2


def test_batchnorm_folds_into_the_conv(tmp_path):
    model = nets.resnet_net(blocks=1)
    net = mapped(model, tmp_path)
    consts = constants(model)
    steps = by_name(net)
    for name, bn_name, act in (("stem", "stem_bn", "relu"), ("rb0_conv2", "rb0_bn2", "none"),
                               ("rb1_down", "rb1_bn_down", "none")):
        layer = steps[name]
        assert layer.fused_ops[0] == "BatchNormalization" and bn_name in layer.nodes
        assert any("folded" in note and bn_name in note for note in layer.notes)
        assert layer.spec.epilogue.activation == act and layer.spec.epilogue.bias
        conv, bn = layer.onnx_nodes[0], layer.onnx_nodes[1]
        w = consts[conv.input[1]].astype(np.float64)
        scale, shift, mean, var = (consts[n].astype(np.float64) for n in bn.input[1:5])
        s = scale / np.sqrt(var + 1e-5)
        np.testing.assert_array_equal(layer.weight, (w * s[:, None, None, None]).astype(np.float32))
        np.testing.assert_array_equal(layer.bias, (shift - mean * s).astype(np.float32))
    # Folded conv (fp32 weights) equals conv followed by BatchNormalization, to fp32 rounding.
    layer = steps["rb0_conv2"]
    x = np.random.default_rng(0).uniform(-1, 1, layer.spec.operand_shapes[0]).astype(np.float32)
    conv, bn = layer.onnx_nodes
    plain = make_spec("conv2d", dict(c=8, h=6, w=6, k=8, r=3, s=3), pad=1)
    raw = reference(plain, x, consts[conv.input[1]], np.zeros(8))
    scale, shift, mean, var = (consts[n].astype(np.float64) for n in bn.input[1:5])
    unfused = (raw - mean[:, None, None]) * (scale / np.sqrt(var + 1e-5))[:, None, None] + shift[:, None, None]
    np.testing.assert_allclose(reference(layer.spec, x, layer.weight, layer.bias), unfused, rtol=0, atol=1e-5)


def _pool_model(path, shape, declared, op="MaxPool", **attrs):
    """input -> pool -> output, the output declared `declared` (as an exporter would)."""
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], name="pool", **attrs)], "p",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(declared))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.mark.unit
@pytest.mark.parametrize("declared", [(1, 2, 5, 4), (1, 2, 5, 5)], ids=["operator", "onnx-inference"])
@pytest.mark.parametrize("pads", [[0, 0, 1, 1], [0, 0, 0, 1]], ids=["rows-exact", "rows-need-ceil"])
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_a_ceil_mode_window_starting_in_the_padding_is_dropped(tmp_path, declared, pads, op):
    """13 x 11, 2 x 2 windows, strides 3, ceil_mode: the last column window would start in the right
    padding and the operator drops it (4 columns); ONNX's shape inference before opset 22 keeps it
    (5). The loader sizes it as the operator does, whichever the model declares (torch declares the
    operator's; a model whose outputs came from ONNX's inference declares 5 columns, which onnxruntime
    too overrides), as the same windows in floor mode: each end padding what its last window reaches
    (the rows' grown from 0 to 1 where they need ceil mode, the columns' cut to 0)."""
    path = _pool_model(tmp_path / "pool.onnx", (1, 2, 13, 11), declared, op=op, kernel_shape=[2, 2], strides=[3, 3],
                       pads=pads, ceil_mode=1)
    loaded = load_model(path)
    assert loaded.shape("y") == (1, 2, 5, 4)
    pool = next(n for n in loaded.model.graph.node if n.op_type == op)
    attrs = {a.name: helper.get_attribute_value(a) for a in pool.attribute}
    assert list(attrs["pads"]) == [0, 0, 1, 0] and attrs["ceil_mode"] == 0


@pytest.mark.unit
def test_a_ceil_mode_average_that_counts_padding_is_refused_where_no_floor_node_keeps_it(tmp_path):
    """count_include_pad=1: growing the rows' end padding (they need ceil mode) would change the last
    row's divisor, so the node is refused in one line naming it."""
    path = _pool_model(tmp_path / "avg.onnx", (1, 2, 13, 11), (1, 2, 5, 4), op="AveragePool", kernel_shape=[2, 2],
                       strides=[3, 3], pads=[0, 0, 0, 1], ceil_mode=1, count_include_pad=1)
    with pytest.raises(OperatorError, match=r"node 'pool' \(AveragePool, ceil_mode=1, count_include_pad=1\).*"
                                            r"not supported") as info:
        load_model(path)
    assert "\n" not in str(info.value)


def test_weights_behind_identity_nodes_are_constants(tmp_path):
    """torch's exporter writes one Identity per duplicate initializer (equal BatchNorm biases of a
    fresh network): such a weight or bias is still a constant, mapped like an initializer."""
    model = nets.mobilenet_net(blocks=1)
    g = model.graph
    conv = next(n for n in g.node if n.op_type == "Conv")
    weight = conv.input[1]
    alias = weight + "_alias"
    g.node.insert(0, helper.make_node("Identity", [weight], [alias], name="dedup_weight"))
    conv.input[1] = alias
    path = tmp_path / "identity.onnx"
    onnx.save(model, path)
    loaded = load_model(path)
    np.testing.assert_array_equal(loaded.constants[alias], loaded.constants[weight])
    net = map_network(loaded)
    layer = next(l for l in net.layers if conv.name in l.nodes)
    np.testing.assert_array_equal(layer.weight.reshape(-1)[:4],
                                  loaded.constants[weight].astype(np.float32).reshape(-1)[:4])


def cast_weight_model():
    """A Conv whose weight is Cast(fp16 initializer) to fp32, then Relu (exporters of fp16 models)."""
    b = nets.Builder(4)
    w16 = b.const(b.rand(4, 3, 3, 3, scale=0.3).astype(np.float16), "w16")
    weight = b.node("Cast", [w16], name="cast_w", to=TensorProto.FLOAT)
    y = b.node("Conv", ["x", weight, b.const(b.rand(4, scale=0.1), "b")], name="conv_cast", kernel_shape=[3, 3],
               pads=[1, 1, 1, 1])
    return b.model({"x": [1, 3, 6, 6]}, [b.node("Relu", [y], name="relu")]), w16


def test_cast_of_an_fp16_initializer_is_folded_at_load(tmp_path):
    """Cast of a constant is a constant: the Conv behind it is covered with the cast weights, and
    the Cast is no step of the network (nothing left for onnx.reference)."""
    model, w16 = cast_weight_model()
    loaded = load_model(save(model, tmp_path))
    cast = next(n for n in model.graph.node if n.op_type == "Cast")
    folded = loaded.constants[cast.output[0]]
    assert folded.dtype == np.float32
    np.testing.assert_array_equal(folded, constants(model)[w16].astype(np.float32))
    net = map_network(loaded)
    (layer,) = net.layers
    assert layer.nodes == ("conv_cast", "relu") and net.uncovered == ()
    np.testing.assert_array_equal(layer.weight.reshape(folded.shape), folded)
    assert coverage(net).covered_share == 1.0


@pytest.mark.host
@needs_onnxruntime
def test_cast_weight_model_verifies_on_the_host(tmp_path, capsys):
    model, _ = cast_weight_model()
    path = save(model, tmp_path)
    code, out, err = run_cli(["model", str(path), "--hw", "host", "--verify", "-o", str(tmp_path / "o")], capsys)
    assert code == 0, err
    assert "verified: yes" in out and "layers: 1 of 1 match" in out, out


def test_gemm_transposes_alpha_beta_and_matmul_bias(tmp_path):
    model = nets.mlp_net()
    consts = constants(model)
    net = mapped(model, tmp_path)
    fc1, fc2, fc3 = net.layers
    assert not net.uncovered
    # fc1: A stored [K, M] (transA), B stored [N, K] (transB), alpha 0.5 into B, beta 2 into C [1, N].
    assert (fc1.spec.m, fc1.spec.n, fc1.spec.k) == (5, 24, 19) and fc1.feed.a_transpose
    gemm = fc1.onnx_nodes[0]
    np.testing.assert_array_equal(fc1.weight[0], (0.5 * consts[gemm.input[1]].astype(np.float64).T).astype(np.float32))
    np.testing.assert_array_equal(fc1.bias, (2.0 * consts[gemm.input[2]][0].astype(np.float64)).astype(np.float32))
    assert fc1.spec.epilogue.activation == "relu" and fc1.fold_units > 0
    assert {"alpha=0.5 folded into the weights", "beta=2 folded into the bias"} == set(fc1.notes)
    # fc2: a scalar C broadcasts to every column; Clip(0, 6) fuses as relu6.
    np.testing.assert_array_equal(fc2.bias, np.full(13, 0.25, np.float32))
    assert fc2.spec.epilogue.activation == "relu6" and fc2.fold_units == 0
    # fc3: MatMul + Add(bias [N]) + Relu is one layer.
    assert fc3.label == "MatMul+Add+Relu" and fc3.spec.epilogue.bias and fc3.spec.epilogue.activation == "relu"
    np.testing.assert_array_equal(fc3.bias, consts[fc3.onnx_nodes[1].input[1]])


def test_no_fusion_grouped_conv_and_matmul_feeds(tmp_path):
    net = mapped(nets.odd_net(), tmp_path)
    steps = by_name(net)
    assert steps["c1"].spec.epilogue.activation == "none"
    assert "graph output" in steps["r1"].reason and not steps["r1"].covered
    assert steps["c2"].spec.epilogue.activation == "none"
    assert "read by 2 nodes" in steps["r2"].reason
    assert "group 2" in steps["grouped"].reason and steps["grouped"].flops == 2 * 6 * 49 * 3 * 9
    assert "multiplier 2" in steps["dw_mult2"].reason
    assert "does not come from a layer" in steps["clip_twice"].reason
    assert steps["c3"].label == "Conv+Clip" and steps["c3"].spec.epilogue.activation == "relu6"
    fold, batch, dynamic = steps["mm_fold"], steps["mm_batch"], steps["mm_dynamic"]
    assert (fold.spec.batch, fold.spec.m, fold.spec.k, fold.spec.n) == (1, 6, 49, 5) and fold.weight is not None
    assert (batch.spec.batch, batch.spec.m) == (3, 6) and batch.feed.a_broadcast == (3, 6, 5)
    assert dynamic.weight is None and dynamic.feed.b_name == steps["tr"].node.output[0]


def test_clip_attributes_before_opset_11(tmp_path):
    net = mapped(nets.clip_attr_net(), tmp_path)
    a, b, c = net.layers
    assert (a.spec.epilogue.activation, b.spec.epilogue.activation, c.spec.epilogue.activation) == \
        ("relu6", "relu", "none")
    (clip,) = net.uncovered
    assert clip.name == "clip11" and "Clip(0, 6)" in clip.reason


def test_pad_larger_than_the_window_is_reported_not_covered(tmp_path):
    b = nets.Builder(7)
    y = b.conv("x", 3, 4, k=1, pad=1, name="pad1x1")
    net = mapped(b.model({"x": [1, 3, 5, 5]}, [y]), tmp_path)
    (u,) = net.uncovered
    assert u.name == "pad1x1" and "padding" in u.reason


# ---------------------------------------------------------------------------------------------
# FLOPs and coverage
# ---------------------------------------------------------------------------------------------

def test_flops_and_coverage_of_the_mobilenet_block(tmp_path):
    net = mapped(nets.mobilenet_net(blocks=2), tmp_path)
    cov = coverage(net)
    conv_flops = sum(layer.spec.flops for layer in net.layers)
    assert cov.covered_flops == conv_flops        # Clip adds no FLOPs, conv bias adds are not counted
    adds = 2 * 8 * 5 * 5                          # two residual Adds of 1x8x5x5
    pool = 16 * 3 * 3                             # GlobalAveragePool over 1x16x3x3
    assert cov.total_flops == conv_flops + adds + pool
    assert cov.covered_share == pytest.approx(conv_flops / (conv_flops + adds + pool))
    groups = {g.op_type: g for g in cov.uncovered}
    assert groups["Add"].count == 2 and groups["Add"].flops == adds
    assert groups["GlobalAveragePool"].flops == pool and groups["Flatten"].flops == 0
    assert cov.nodes == len(nets.mobilenet_net(blocks=2).graph.node)


def test_flops_of_uncovered_and_undefined_ops():
    shapes = {"x": (2, 8, 10, 10), "w": (16, 4, 3, 3), "y": (2, 16, 10, 10), "a": (5, 7), "b": (9, 7),
              "g": (5, 9), "m1": (3, 5, 7), "m2": (7, 4), "mo": (3, 5, 4)}
    shape = shapes.get
    assert node_flops(helper.make_node("Conv", ["x", "w"], ["y"], group=2), shape) == 2 * 2 * 16 * 100 * 4 * 9
    assert node_flops(helper.make_node("Gemm", ["a", "b"], ["g"], transB=1), shape) == 2 * 5 * 9 * 7
    assert node_flops(helper.make_node("MatMul", ["m1", "m2"], ["mo"]), shape) == 2 * 3 * 5 * 4 * 7
    assert node_flops(helper.make_node("Relu", ["x"], ["x2"]), shape) == 0
    assert node_flops(helper.make_node("Softmax", ["x"], ["s"]), shape) is None


@pytest.mark.parametrize("builder, kwargs", [
    (nets.mobilenet_net, dict(blocks=3, c=32, hw=112)),
    (nets.resnet_net, dict(blocks=2, c=64, hw=56)),
])
def test_realistic_blocks_cover_at_least_95_percent(tmp_path, builder, kwargs):
    """MobileNetV2- and ResNet-like stacks at realistic channel counts: the convolutions carry the
    FLOPs, the residual Adds, pools and the classifier's glue do not."""
    path = save(builder(**kwargs), tmp_path)
    net, cov, syntheses, _ = analyse(path, load_hw("host"))
    assert cov.covered_share >= 0.95
    assert cov.distinct_layers < len(net.layers)
    assert all(s.predicted_s > 0 and s.source == "static" for s in syntheses.values())


# ---------------------------------------------------------------------------------------------
# Error bounds
# ---------------------------------------------------------------------------------------------

def test_layer_bound_covers_input_errors_and_rounding():
    """Any input within e of x: the fp32 result of the layer stays within layer_bound of the exact one."""
    rng = np.random.default_rng(3)
    spec = make_spec("conv2d", dict(c=5, h=7, w=6, k=3, r=3, s=3), pad=1, bias=True, activation="relu")
    x = rng.uniform(-1, 1, spec.operand_shapes[0]).astype(np.float32)
    w = rng.uniform(-1, 1, spec.operand_shapes[1]).astype(np.float32)
    bias = rng.uniform(-1, 1, spec.operand_shapes[2]).astype(np.float32)
    e = np.full(x.shape, 1e-3)
    bound = bounds.layer_bound(spec, x, e, w, bounds.ZERO, np.abs(bias.astype(np.float64)), 0)
    exact = reference(spec, x, w, bias)
    worst = 0.0
    for trial in range(5):
        shifted = (x + rng.choice([-1.0, 1.0], x.shape) * e * 0.999).astype(np.float32)
        fp32 = reference(spec, shifted, w, bias, dtype=np.float32)
        worst = max(worst, float(np.max(np.abs(fp32 - exact) / bound)))
    assert 0.05 < worst <= 1.0     # sound, and not absurdly loose for a single layer


def test_error_rules_of_reference_nodes():
    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, (1, 4, 5, 5)).astype(np.float32)
    e = np.full(x.shape, 1e-4)
    pool = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2])
    (y,) = [np.max(np.lib.stride_tricks.sliding_window_view(x, (2, 2), axis=(2, 3)), axis=(-1, -2))]
    (out,) = bounds.propagate(pool, 17, [x], [e], [y])
    np.testing.assert_array_equal(out, np.full(y.shape, 1e-4))
    add = helper.make_node("Add", ["a", "b"], ["c"])
    c = x + x
    (out,) = bounds.propagate(add, 17, [x, x], [e, e], [c])
    assert np.all(out >= 2e-4) and np.all(out <= 2e-4 + 1e-6)
    shape = helper.make_node("Shape", ["x"], ["s"])
    assert not np.any(bounds.propagate(shape, 17, [x], [None], [np.array([1, 4, 5, 5])])[0])
    soft = helper.make_node("Softmax", ["x"], ["s"])
    assert bounds.propagate(soft, 17, [x], [e], [x]) == [None]
    grouped = helper.make_node("Conv", ["x", "w"], ["y"], group=2, pads=[1, 1, 1, 1])
    w = rng.uniform(-1, 1, (6, 2, 3, 3)).astype(np.float32)
    (bound,) = bounds.propagate(grouped, 17, [x, w], [e, bounds.ZERO], [np.zeros((1, 6, 5, 5), np.float32)])
    # the bound dominates the worst-case effect of the input error: |W| applied to e
    for g in range(2):
        spec = make_spec("conv2d", dict(c=2, h=5, w=5, k=3, r=3, s=3), pad=1)
        moved = reference(spec, e[:, 2 * g:2 * g + 2], np.abs(w[3 * g:3 * g + 3]), np.zeros(3))
        assert np.all(bound[:, 3 * g:3 * g + 3] >= moved)
    # a divisor off by its own rounding (an fp16 constant): the bound holds at the corners of both
    # errors; a divisor error as large as the divisor has no rule
    div = helper.make_node("Div", ["a", "b"], ["q"])
    b = np.sign(rng.uniform(-1, 1, x.shape)) * rng.uniform(0.3, 2.0, x.shape)
    eb = np.abs(b) * 2.0 ** -11
    (out,) = bounds.propagate(div, 17, [x, b], [e, eb], [(x / b).astype(np.float32)])
    worst = max(np.max(np.abs((x + sa * e) / (b + sb * eb) - x.astype(np.float64) / b) / out)
                for sa in (-1, 1) for sb in (-1, 1))
    assert 0.3 < worst <= 1.0
    assert bounds.propagate(div, 17, [x, b], [e, np.abs(b)], [x / b]) == [None]


# ---------------------------------------------------------------------------------------------
# Bad models and requests: exit 2, one line, nothing written
# ---------------------------------------------------------------------------------------------

def run_cli(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code, err, *needles):
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xfc: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def with_opset(model, version):
    model.opset_import[0].version = version
    return model


def weight_as_input():
    b = nets.Builder(6)
    b.nodes.append(helper.make_node("Conv", ["x", "wx"], ["y"], name="conv_w_input", pads=[1, 1, 1, 1]))
    graph = helper.make_graph(b.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5]),
                                             helper.make_tensor_value_info("wx", TensorProto.FLOAT, [4, 3, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def bad_group():
    b = nets.Builder(6)
    y = b.conv("x", 4, 6, group=3, name="conv_g3")
    return b.model({"x": [1, 4, 5, 5]}, [y])


def bn_stats_input():
    b = nets.Builder(6)
    c = b.conv("x", 3, 4, name="conv")
    b.nodes.append(helper.make_node("BatchNormalization", [c, b.const(np.ones(4, np.float32)), "beta",
                                                           b.const(np.zeros(4, np.float32)),
                                                           b.const(np.ones(4, np.float32))], ["y"], name="bn"))
    graph = helper.make_graph(b.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5]),
                                             helper.make_tensor_value_info("beta", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])], b.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


BAD_MODELS = {
    "opset_low": (lambda: with_opset(nets.mlp_net(), 6), ["opset 6 is outside the supported range"]),
    "opset_high": (lambda: with_opset(nets.mlp_net(), 99), ["opset 99 is outside the supported range"]),
    "dynamic": (dynamic_model, ["input 'x' has a dynamic shape", "--input-shape x="]),
    "group": (bad_group, ["node 'conv_g3' (Conv)", "group 3"]),
    "weight_input": (weight_as_input, ["node 'conv_w_input' (Conv)", "weight 'wx' is not an initializer"]),
    "bn_input": (bn_stats_input, ["node 'bn' (BatchNormalization)", "bias 'beta' is not an initializer"]),
}


@pytest.mark.host
@pytest.mark.parametrize("case", sorted(BAD_MODELS))
def test_bad_models_exit_2_with_one_line(tmp_path, capsys, case):
    build, needles = BAD_MODELS[case]
    path = save(build(), tmp_path)
    out_dir = tmp_path / "out"
    code, out, err = run_cli(["model", str(path), "--hw", "host", "-o", str(out_dir)], capsys)
    assert_one_line_error(code, err, str(path), *needles)
    assert not out_dir.exists() and out == ""


def unpadded_dynamic_model():
    """Two dynamic inputs; a 3x3 convolution without padding, so a height of 1 has no valid output."""
    b = nets.Builder(7)
    y = b.node("Relu", [b.conv("x", 3, 4, pad=0, name="conv")], name="relu")
    z = b.node("Relu", ["z"], name="relu_z")
    model = b.model({"x": [1, 3, 6, 6], "z": [1, 5]}, [y, z])
    for vi in model.graph.input:
        vi.type.tensor_type.shape.dim[0].dim_param = "batch"
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "height"
    for out in model.graph.output:
        for d in out.type.tensor_type.shape.dim:
            d.dim_param = "o"
    return model


@pytest.mark.host
@pytest.mark.parametrize("build", [dynamic_model, unpadded_dynamic_model])
def test_dynamic_input_hint_works_when_pasted(tmp_path, capsys, build):
    """The --input-shape flags the error suggests, pasted back into the command, run it."""
    path = save(build(), tmp_path)
    code, _, err = run_cli(["model", str(path), "--hw", "host", "-o", str(tmp_path / "a")], capsys)
    assert_one_line_error(code, err, "dynamic shape", "batch=1")
    flags = re.findall(r"--input-shape \S+", err)
    assert flags, err
    pasted = [word for flag in flags for word in flag.split()]
    code, out, err = run_cli(["model", str(path), "--hw", "host", "-o", str(tmp_path / "b")] + pasted, capsys)
    assert code == 0, err
    assert "covered: " in out and (tmp_path / "b" / "report.json").is_file()


def uncoverable_model():
    """A depthwise convolution with channel multiplier 2 and a Relu: nothing xfc covers."""
    b = nets.Builder(3)
    y = b.node("Relu", [b.conv("x", 3, 6, group=3, name="dw_mult2")], name="relu")
    return b.model({"x": [1, 3, 6, 6]}, [y])


def test_nothing_covered_is_said_and_verify_emit_bench_refuse(tmp_path, capsys):
    """0% coverage: the report says so in one note line naming the op types (exit 0); --verify and
    --bench with nothing to work on are exit 2, one line, nothing written. (--emit lib runs the
    grouped convolution as one conv2d kernel per group: tests/test_network.py; a network with no
    kernel at all is refused there.)"""
    path = save(uncoverable_model(), tmp_path)
    code, out, err = run_cli(["model", str(path), "--hw", "snapdragon-865", "-o", str(tmp_path / "report")], capsys)
    assert code == 0, err
    notes = [line for line in out.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "nothing covered" in notes[0], out
    for needle in ("Conv", "Relu", "channel multiplier 2"):
        assert needle in notes[0], notes[0]
    for extra, needle in ((["--verify"], "nothing to verify"),
                          (["--device", "qemu"], "nothing to verify"), (["--bench", "--device", "qemu"], "time")):
        out_dir = tmp_path / "o"
        code, out, err = run_cli(["model", str(path), "--hw", "snapdragon-865", "-o", str(out_dir)] + extra, capsys)
        assert_one_line_error(code, err, str(path), needle, "Conv, Relu")
        assert out == "" and "verified: yes" not in out and not out_dir.exists()


@pytest.mark.host
def test_files_that_are_not_models(tmp_path, capsys):
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a protobuf at all, just some words\n" * 20)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    for path, needle in ((text, "not an ONNX model"), (empty, "not an ONNX model"),
                         (tmp_path / "missing.onnx", "no such file"), (tmp_path, "not a file")):
        code, _, err = run_cli(["model", str(path), "--hw", "host", "-o", str(tmp_path / "out")], capsys)
        assert_one_line_error(code, err, needle)
    assert not (tmp_path / "out").exists()


@pytest.mark.host
@pytest.mark.parametrize("args, needles", [
    (["--target", "gpu"], ["--target gpu", "no GPU section"]),
    (["--device", "qemu"], ["--device qemu", "x86-64 description"]),
    (["--dtype", "fp16"], ["fp16"]),
    (["--input-shape", "y=1x3x6x6"], ["has no input 'y'"]),
    (["--input-shape", "x=1x3x6"], ["rank 4, not 3"]),
    (["--input-shape", "x=1x4x6x6"], ["dimension 1 of 'x' is fixed to 3"]),
    (["--threads", "99", "--input-shape", "x=1x3x6x6"], ["--threads 99 exceeds"]),
])
def test_bad_requests_exit_2_with_one_line(tmp_path, capsys, args, needles):
    path = save(dynamic_model(), tmp_path)
    out_dir = tmp_path / "out"
    code, _, err = run_cli(["model", str(path), "--hw", "host", "-o", str(out_dir)] + args, capsys)
    assert_one_line_error(code, err, *needles)
    assert not out_dir.exists()


@pytest.mark.host
def test_output_location_rules_apply(tmp_path, capsys):
    path = save(nets.mlp_net(), tmp_path)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    code, _, err = run_cli(["model", str(path), "--hw", "host", "-o", str(foreign)], capsys)
    assert_one_line_error(code, err, "xfc did not write")
    assert (foreign / "notes.txt").read_text() == "keep me" and sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


@needs_onnxruntime
@pytest.mark.host
@pytest.mark.parametrize("seed", [5, 6])
def test_ceil_mode_pools_load_to_onnxruntimes_shapes_and_values(tmp_path, seed):
    """400 random ceil-mode MaxPool / AveragePool nodes (kernels 1-3, strides 1-4, either side's
    padding, count_include_pad both ways; a second ceil pool after half of them), their outputs
    declared as ONNX's inference sizes them: loaded, every shape is onnxruntime's, and the rewritten
    model computes onnxruntime's values on the original; an average the rewrite cannot hold is refused
    (count_include_pad=1 only)."""
    import random
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.log_severity_level = 3
    rng = random.Random(seed)
    checked = 0
    for trial in range(400):
        op = rng.choice(["MaxPool", "AveragePool"])
        h, w = rng.randint(2, 14), rng.randint(2, 14)
        kh, kw, sh, sw = rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 4)
        attrs = dict(kernel_shape=[kh, kw], strides=[sh, sw], ceil_mode=1,
                     pads=[rng.randint(0, kh - 1), rng.randint(0, kw - 1), rng.randint(0, kh - 1), rng.randint(0, kw - 1)])
        if op == "AveragePool":
            attrs["count_include_pad"] = rng.randint(0, 1)
        nodes = [helper.make_node("Relu", ["x0"], ["x"]), helper.make_node(op, ["x"], ["y"], name="p", **attrs)]
        out = "y"
        if rng.random() < 0.5:
            nodes.append(helper.make_node("MaxPool", ["y"], ["z"], name="q", kernel_shape=[2, 2], strides=[3, 2],
                                          pads=[0, 0, 1, 1], ceil_mode=1))
            out = "z"
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [1, 2, h, w])],
                                  [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        inferred = onnx.shape_inference.infer_shapes(model)
        del model.graph.output[:]
        model.graph.output.extend(inferred.graph.output)
        x = np.random.default_rng(trial).standard_normal((1, 2, h, w)).astype(np.float32)
        try:
            want = ort.InferenceSession(model.SerializeToString(), options).run(None, {"x0": x})[0]
        except Exception:   # onnxruntime refuses it too (a window past the image in the second pool)
            continue
        if 0 in want.shape:
            continue
        path = tmp_path / f"m{trial}.onnx"
        onnx.save(model, str(path))
        try:
            loaded = load_model(path)
        except OperatorError as exc:
            assert op == "AveragePool" and attrs["count_include_pad"] == 1, (attrs, h, w, str(exc))
            continue
        assert loaded.shape(out) == want.shape, (op, attrs, h, w)
        got = ort.InferenceSession(loaded.model.SerializeToString(), options).run(None, {"x0": x})[0]
        np.testing.assert_allclose(got, want, atol=1e-6, err_msg=f"{op} {attrs} {h}x{w}")
        checked += 1
    assert checked > 300
