"""Quantized ONNX models (issue 33 item 1, xfc/model/quantized.py): QDQ and QOperator models made by
onnxruntime.quantization.quantize_static are read as int8 steps, the oracle computes them exactly and
agrees with onnxruntime where onnxruntime's own arithmetic is exact, bad quantization is one line
naming the node, and `xfc model` says what it found instead of failing on a weight."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from support import nets
from support.cli import assert_one_line_error

from xfc.cli import main
from xfc.errors import OperatorError
from xfc.model import quantized as Q
from xfc.model.load import load_model
from xfc.model.quantized_peer import onnxruntime_step_values, quantize_with_onnxruntime

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")
pytestmark = pytest.mark.unit


def quantize(tmp_path, model, fmt: str, *, reduce_range: bool = True, activation: str = "uint8",
             per_channel: bool = True, name: str = "q"):
    """The model quantized by onnxruntime as users do it (xfc.model.quantized_peer)."""
    src = tmp_path / f"{name}_fp32.onnx"
    onnx.save(model, str(src))
    return quantize_with_onnxruntime(src, tmp_path / f"{name}_{fmt}.onnx", fmt, reduce_range=reduce_range,
                                     activation=activation, per_channel=per_channel)


def feeds_for(loaded, seed: int = 1) -> dict:
    name, shape, _ = loaded.inputs[0]
    return {name: np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_quantized_models_read_as_int8_steps(tmp_path, fmt):
    loaded = load_model(quantize(tmp_path, nets.bottleneck_net(), fmt))
    network = Q.recognise(loaded)
    assert network.format == fmt
    counts = network.counts()
    assert counts["layer"] == 9 and counts["add"] == 3 and counts["quantize"] >= 1 and counts["dequantize"] >= 1
    layers = [s for s in network.steps if s.kind == "layer"]
    assert {s.spec.name for s in layers} == {"conv2d", "matmul"}
    for s in layers:
        assert s.weight.dtype == np.int8 and s.bias.dtype == np.int32
        assert s.w_scales.shape == (s.bias.size,) and np.all(s.w_scales > 0)
        assert len(set(np.round(s.w_scales, 12))) > 1               # per channel: the scales differ
        x, y = network.tensors[s.inputs[0]], network.tensors[s.outputs[0]]
        assert x.act_type == y.act_type == "uint8"
    assert "9 int8 layers" in network.describe() and network.describe().startswith(Q.FORMAT_NAMES[fmt])
    assert Q.recognise(load_model(tmp_path / "q_fp32.onnx")) is None      # the fp32 original: not quantized


@pytest.mark.parametrize("fmt, activation", [("qdq", "uint8"), ("qoperator", "uint8"), ("qdq", "int8")])
def test_the_oracle_agrees_with_onnxruntime_step_by_step(tmp_path, fmt, activation):
    """7-bit weights: onnxruntime's int8 kernels are exact; the requantization rounds alike: every
    quantized tensor of every step within 1 LSB, 99.9% of them equal (in practice all)."""
    path = quantize(tmp_path, nets.bottleneck_net(), fmt, activation=activation)
    loaded = load_model(path)
    network = Q.recognise(loaded)
    feeds = feeds_for(loaded)
    ours, theirs = Q.run(network, feeds), onnxruntime_step_values(path, network, feeds)
    compared = equal = 0
    for name in network.tensors:
        if name in theirs and name in ours:
            diff = np.abs(np.asarray(ours[name], np.int64).reshape(-1) - np.asarray(theirs[name], np.int64).reshape(-1))
            assert diff.max(initial=0) <= 1, name
            compared += diff.size
            equal += int(np.count_nonzero(diff == 0))
    assert compared > 1000 and equal >= 0.999 * compared, (equal, compared)
    out = loaded.outputs[0]
    assert np.max(Q.lsb_differences(network, ours, theirs, out)) <= 1


def test_full_range_weights_agree_with_onnxruntime_computing_the_qdq_graph_as_written(tmp_path):
    """8-bit weights: xfc's arithmetic is exact; onnxruntime without its graph optimizations runs
    DequantizeLinear, the float node and QuantizeLinear as written (fp32): within 1 LSB. (Optimized, its
    u8 x s8 kernels on x86 without VNNI may saturate 16-bit pair sums: not compared.)"""
    path = quantize(tmp_path, nets.bottleneck_net(), "qdq", reduce_range=False)
    loaded = load_model(path)
    network = Q.recognise(loaded)
    feeds = feeds_for(loaded)
    ours, theirs = Q.run(network, feeds), onnxruntime_step_values(path, network, feeds, optimize=False)
    out = loaded.outputs[0]
    lsb = Q.lsb_differences(network, ours, theirs, out)
    assert lsb.max() <= 1 and np.mean(lsb < 0.5) >= 0.999


def edit(path, tmp_path, change, name="bad.onnx"):
    model = onnx.load(str(path))
    change(model)
    out = tmp_path / name
    onnx.save(model, str(out))
    return out


def set_constant(model, name, array):
    for i, init in enumerate(model.graph.initializer):
        if init.name == name:
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(np.asarray(array, dtype=array.dtype), name))
            return
    raise KeyError(name)


def first(model, op):
    return next(n for n in model.graph.node if n.op_type == op)


def weight_dq(model):
    """The DequantizeLinear of the first convolution's weights."""
    conv = first(model, "Conv")
    return next(n for n in model.graph.node if n.output[0] == conv.input[1])


def const(model, name):
    return numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == name))


BAD = {
    "zero scale": (lambda m: set_constant(m, first(m, "QuantizeLinear").input[1], np.array(0.0, np.float32)),
                   ["'x_QuantizeLinear'", "scale", "is 0"]),
    "negative scale": (lambda m: set_constant(m, first(m, "QuantizeLinear").input[1], np.array(-0.5, np.float32)),
                       ["scale", "is -0.5", "finite number > 0"]),
    "weight zero point": (lambda m: set_constant(m, weight_dq(m).input[2],
                                                 np.full(const(m, weight_dq(m).input[2]).shape, 3, np.int8)),
                          ["weight zero point", "is 3", "symmetric"]),
    "mixed axes": (lambda m: weight_dq(m).attribute[0].CopyFrom(helper.make_attribute("axis", 1)),
                   ["axis 1", "mixed per-channel axes"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_quantization_is_one_line_naming_the_node(tmp_path, capsys, case):
    change, needles = BAD[case]
    good = quantize(tmp_path, nets.bottleneck_net(), "qdq")
    bad = edit(good, tmp_path, change)
    with pytest.raises(OperatorError) as err:
        Q.recognise(load_model(bad))
    message = str(err.value)
    assert "\n" not in message and "node '" in message, message
    for needle in needles:
        assert needle in message, message
    code = main(["model", str(bad), "--hw", "snapdragon-865", "-o", str(tmp_path / "out")])
    assert_one_line_error(code, capsys.readouterr().err, 2, *needles)


def test_xfc_model_says_what_it_found_in_an_int8_model(tmp_path, capsys):
    """The bottleneck net keeps a BatchNormalization in fp32 when quantized: the per-layer report sends the
    user to --emit lib, which names the fp32 node its int8 runtime cannot run."""
    path = quantize(tmp_path, nets.bottleneck_net(), "qdq")
    for extra, needle in (([], "add --emit lib"), (["--emit", "lib"], "'lone_bn' (BatchNormalization, in fp32)")):
        code = main(["model", str(path), "--hw", "snapdragon-865", "-o", str(tmp_path / "out"), *extra])
        assert_one_line_error(code, capsys.readouterr().err, 2, "an int8 model (QDQ: 9 int8 layers", needle)
        assert not (tmp_path / "out").exists()


def test_the_oracle_saturates_like_quantizelinear_without_integer_overflow():
    """ONNX QuantizeLinear: saturate(round_half_even(x / scale) + zero_point); far out of range and
    infinite values go to the right end of the type."""
    int8, uint8 = Q.QTensor("a", "int8", 1.0, 0), Q.QTensor("b", "uint8", 0.5, 10)
    got = Q.quantize(np.array([1e30, np.inf, -np.inf, -1e30, 2.5, 3.5, -2.5], np.float32), int8)
    assert got.tolist() == [127, 127, -128, -128, 2, 4, -2] and got.dtype == np.int8
    assert Q.quantize(np.array([1e19, -1e19, 1.25, 1.75], np.float32), uint8).tolist() == [255, 0, 12, 14]
    added = Q.run_add(np.array([127], np.int8), np.array([127], np.int8), int8, int8, Q.QTensor("y", "int8", 1e-3, 0))
    assert added.tolist() == [127]


def test_a_relu_after_an_add_keeps_the_add_in_fp32_and_agrees_with_onnxruntime(tmp_path):
    """QDQ Add -> Relu -> QuantizeLinear (quantizers other than onnxruntime's write it): xfc clamps in
    int8 layers only, so the Add and the Relu run in fp32 between a dequantize and a quantize."""
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 3, 3])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 3, 3])
    inits = [numpy_helper.from_array(np.array(0.02, np.float32), "s"), numpy_helper.from_array(np.array(128, np.uint8), "z"),
             numpy_helper.from_array(np.array(0.03, np.float32), "s2"), numpy_helper.from_array(np.array(0, np.uint8), "z2")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q_in"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xa"], name="dq_a"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xb"], name="dq_b"),
             helper.make_node("Add", ["xa", "xb"], ["sum"], name="add"),
             helper.make_node("Relu", ["sum"], ["r"], name="relu"),
             helper.make_node("QuantizeLinear", ["r", "s2", "z2"], ["rq"], name="q_out"),
             helper.make_node("DequantizeLinear", ["rq", "s2", "z2"], ["y"], name="dq_out")]
    path = tmp_path / "add_relu.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits),
                                opset_imports=[helper.make_opsetid("", 17)]), str(path))
    loaded = load_model(path)
    network = Q.recognise(loaded)
    assert [s.kind for s in network.steps] == ["quantize", "dequantize", "dequantize", "float", "float", "quantize",
                                               "dequantize"]
    feeds = feeds_for(loaded, seed=0)
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.array_equal(Q.run(network, feeds)["y"], theirs)


@pytest.mark.parametrize("reduce_range", [True, False])
def test_kernels_know_when_every_weight_is_narrow(tmp_path, reduce_range):
    """7-bit weights (reduce_range) make every kernel's QuantParams narrow_weights, which lets the avx2
    kernels sum u8 x s8 pairs with vpmaddubsw; full-range weights never do."""
    from xfc.model.runtime.quantized_program import kernel_quant
    network = Q.recognise(load_model(quantize(tmp_path, nets.bottleneck_net(), "qdq", reduce_range=reduce_range)))
    layers = [s for s in network.steps if s.kind == "layer"]
    narrow = [kernel_quant(s, network).narrow_weights for s in layers]
    for step, flag in zip(layers, narrow):
        assert flag == (int(np.abs(step.weight.astype(np.int16)).max()) <= 64)
    assert all(narrow) if reduce_range else not any(narrow)
