"""int8 whole networks (issue 33 items 1-2): a quantized model (QDQ or QOperator, as onnxruntime's
quantize_static writes it) becomes a program of bytes, its weights file holds typed byte sections, the
per-step check catches a one-LSB fault in one step, and the network runs in C on the host (VNNI where
the CPU has it, and AVX2 forced), under qemu-aarch64 (sdot, smmla) and on the virtual device, every
step equal to xfc's oracle byte for byte and the outputs within 1 LSB of onnxruntime; refusals are one
line."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import support
from support import nets
from support.cli import assert_one_line_error

from xfc.cli import main
from xfc.model import quantized as Q
from xfc.model.load import load_model
from xfc.model.runtime.arena import plan_arena
from xfc.model.runtime.check import verify_int8_program
from xfc.model.runtime.emit import build_payload
from xfc.model.runtime.program import KernelStep
from xfc.model.runtime.quantized_program import lower_quantized
from xfc.ops.dtypes import FP32, INT8

pytest.importorskip("onnxruntime.quantization")


def quantized_model(tmp_path, model, fmt: str, name: str, activation: str = "uint8"):
    from xfc.model.quantized_peer import quantize_with_onnxruntime
    src = tmp_path / f"{name}_fp32.onnx"
    onnx.save(model, str(src))
    return quantize_with_onnxruntime(src, tmp_path / f"{name}_{fmt}.onnx", fmt, activation=activation)


def run_json(capsys, argv):
    code = main(argv)
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if code == 0 and captured.out.strip() else None), captured


def assert_int8_verified(report, where: str):
    v = report["verification"]
    assert v["verified"] and where in v["verified_on"], v
    assert v["dtype"] == "int8" and v["layers_failed"] == []
    assert v["steps"] and all(s["bound_kind"] == "exact" and s["max_abs_error"] == 0 for s in v["steps"])
    for out, agreed in zip(v["outputs"], v["agreement_with_onnxruntime"]):
        assert out["ok"] and out["bound_kind"] == "lsb" and agreed["share_beyond_1_lsb"] <= 0.001
    assert report["dtype"] == "int8" and report["network"]["dtype"] == "int8"


@pytest.mark.unit
def test_a_quantized_resnet_lowers_to_bytes_with_int8_kernels_ops_and_aliases(tmp_path):
    low = lower_quantized(load_model(quantized_model(tmp_path, nets.resnet_net(), "qdq", "r")), "r")
    program = low.program
    assert program.dtype == INT8 and program.activation_type == "uint8"
    ops = [s.op for s in program.steps if s.kind == "op"]
    assert ops[0] == "quantize" and ops[-1] == "dequantize"
    assert {"qadd", "qgap", "qmaxpool"} <= set(ops)
    assert program.aliases                                             # the Flatten before the classifier
    kernels = program.kernel_steps
    assert len(kernels) == low.network.counts()["layer"] and all(k.quant is not None for k in kernels)
    assert {k.spec.name for k in kernels} == {"conv2d", "matmul"}
    assert program.element_type(program.inputs[0]) == FP32 == program.element_type(program.outputs[0])
    assert program.element_type(kernels[0].output) == INT8 and plan_arena(program).element_bytes == 1
    # the weights file: int8 weights, then int32 biases and fp32 multipliers, as little-endian bytes
    payload = build_payload(program, "test")
    assert payload.data.dtype == np.uint8
    for i, step in enumerate(program.steps):
        if isinstance(step, KernelStep):
            w = step.layer.weight
            start = payload.weight_offsets[i]
            assert np.array_equal(payload.data[start:start + w.size].view(np.int8), w.reshape(-1))
            c = payload.const_section
            b = payload.data[c + payload.bias_offsets[i]:][:4 * step.layer.bias.size].view("<i4")
            m = payload.data[c + payload.mult_offsets[i]:][:4 * step.layer.multipliers.size].view("<f4")
            assert np.array_equal(b, step.layer.bias) and np.array_equal(m, step.layer.multipliers)


@pytest.mark.unit
@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_the_int8_check_accepts_the_oracle_and_catches_one_lsb_in_one_step(tmp_path, fmt):
    path = quantized_model(tmp_path, nets.mobilenet_net(), fmt, "m")
    loaded = load_model(path)
    low = lower_quantized(loaded, "m")
    program = low.program
    name, shape, _ = loaded.inputs[0]
    feeds = {name: np.random.default_rng(3).standard_normal(shape).astype(np.float32)}
    values = Q.run(low.network, feeds)
    dumps = [[np.asarray(values[program.root(s.outputs[0])[0]], np.float32)] for s in program.steps]
    outputs = [np.asarray(values[o], np.float32) for o in program.outputs]
    expected = {o: values[o] for o in program.outputs}
    ok = verify_int8_program(low, feeds, dumps, outputs, expected, "oracle", where="test", emulated=False, seed=0)
    assert ok.ok and all(c.max_abs_error == 0 for c in ok.steps)
    target = next(i for i, s in enumerate(program.steps) if s.kind == "kernel" and s.spec.name == "depthwise")
    bad = [list(d) for d in dumps]
    wrong = bad[target][0].copy()
    flat = wrong.reshape(-1)
    flat[5] = flat[5] + 1 if flat[5] < 255 else flat[5] - 1
    bad[target][0] = wrong
    caught = verify_int8_program(low, feeds, bad, outputs, expected, "oracle", where="test", emulated=False, seed=0)
    assert not caught.ok
    failed = [c.index for c in caught.steps if not c.ok]
    # the fault is found where it is made; the next step read the faulty value, while its dump here is
    # the oracle's on the clean one (a C network would have carried the fault: its check would pass)
    assert failed[0] == target and caught.steps[target].max_abs_error == 1.0


@pytest.mark.unit
def test_quantized_models_are_refused_in_one_line_where_the_int8_runtime_cannot_run_them(tmp_path, capsys):
    path = quantized_model(tmp_path, nets.resnet_net(), "qdq", "r")
    code = main(["model", str(path), "--hw", "snapdragon-865", "--emit", "lib", "--dtype", "fp16",
                 "-o", str(tmp_path / "out")])
    assert_one_line_error(code, capsys.readouterr().err, 2, "a quantized model runs in int8")
    assert not (tmp_path / "out").exists()


@support.needs_onnxruntime
@pytest.mark.host
@pytest.mark.parametrize("family, fmt, activation, hw", [
    ("resnet", "qdq", "uint8", "host"),
    ("mobilenet", "qoperator", "int8", "host"),
    ("mobilenet", "qdq", "uint8", "host:avx2"),
])
def test_int8_network_runs_in_c_on_the_host_equal_to_the_oracle(tmp_path, capsys, family, fmt, activation, hw):
    model = nets.resnet_net() if family == "resnet" else nets.mobilenet_net()
    path = quantized_model(tmp_path, model, fmt, family, activation)
    code, report, captured = run_json(capsys, ["model", str(path), "--hw", hw, "--emit", "lib", "--verify",
                                               "--bench", "--repeat", "2", "--json", "-o", str(tmp_path / "out")])
    assert code == 0, captured.err
    assert_int8_verified(report, "host")
    assert report["quantized"]["format"] == fmt and report["quantized"]["activation_type"] == activation
    dialects = {k["dialect"] for k in report["int8_kernels"]}
    if hw == "host:avx2":
        assert dialects == {"avx2"}
    b = report["network_bench"]
    assert b["xfc"]["median_ms"] > 0 and b["onnxruntime"]["median_ms"] > 0 and b["speedup"] > 0
    assert (tmp_path / "out" / f"libxfc_{family}_{fmt}-x86_64.a").exists()
    # the kernels stage into the runtime's shared per-thread scratch: a run allocates nothing
    kernels = [p.read_text() for p in (tmp_path / "out").glob(f"xfc_{family}_{fmt}_k*.c")]
    assert kernels and all(f"extern __thread void *xfc_{family}_{fmt}_scratch_ptr" in k for k in kernels)
    assert not any("aligned_alloc(64, ((size_t)" in k for k in kernels)


@pytest.mark.emulated
@pytest.mark.skipif(not support.HAVE_ARM, reason="no aarch64 gcc / qemu-aarch64")
@pytest.mark.parametrize("hw, dialect", [("snapdragon-865", "sdot"), ("snapdragon-8-gen-2", "smmla")])
def test_int8_network_under_qemu_equal_to_the_oracle(tmp_path, capsys, hw, dialect):
    path = quantized_model(tmp_path, nets.mobilenet_net(), "qdq", "mobilenet")
    code, report, captured = run_json(capsys, ["model", str(path), "--hw", hw, "--emit", "lib", "--verify",
                                               "--json", "-o", str(tmp_path / "out")])
    assert code == 0, captured.err
    assert_int8_verified(report, "qemu-aarch64")
    assert dialect in {k["dialect"] for k in report["int8_kernels"]}
    assert report["library"]["abi"] == "arm64-v8a"


@support.needs_onnxruntime
@pytest.mark.adb
@pytest.mark.skipif(not support.HAVE_ARM, reason="no aarch64 gcc / qemu-aarch64")
def test_int8_network_on_the_virtual_device(tmp_path, capsys, server):
    from android_runner.virtual_device import VirtualDevice
    path = quantized_model(tmp_path, nets.resnet_net(blocks=1, hw=7), "qdq", "resnet")
    dev = VirtualDevice(soc="snapdragon-865").start()
    server.connect(dev.serial)
    try:
        code, report, captured = run_json(capsys, [
            "model", str(path), "--hw", "snapdragon-865", "--emit", "lib", "--verify", "--bench", "--repeat", "2",
            "--device", dev.serial, "--adb-port", str(server.port), "--json", "-o", str(tmp_path / "out")])
        assert code == 0, captured.err
        assert_int8_verified(report, "virtual-device")
        assert report["network_bench"]["xfc"]["emulated"]
    finally:
        server.disconnect(dev.serial)
        dev.stop()


@pytest.mark.unit
def test_int8_network_time_is_predicted_for_every_cluster_and_thread_count(tmp_path):
    from xfc.api import load_hardware
    from xfc.model.runtime.predict import network_predictions
    path = quantized_model(tmp_path, nets.mobilenet_net(), "qdq", "m")
    loaded = load_model(path)
    program = lower_quantized(loaded, "m").program
    hw = load_hardware("snapdragon-865")
    rows = network_predictions(loaded, "m", hw, program.dtype, program=program)
    assert {r["dtype"] for r in rows} == {"int8"}
    assert {(r["cluster"], r["threads"]) for r in rows} == {(c.role, t) for c in hw.clusters for t in {1, c.count}}
    assert all(r["predicted_ms"] and 0 < r["predicted_ms"] < float("inf") for r in rows)
    by = {(r["cluster"], r["threads"]): r["predicted_ms"] for r in rows}
    little = next(c for c in hw.clusters if c.role == "little")
    assert by[("little", little.count)] < by[("little", 1)]          # more cores, less time


@support.needs_onnxruntime
@pytest.mark.host
@pytest.mark.parametrize("family", ["resnet", "mobilenet"])
def test_compile_model_runs_a_quantized_model_equal_to_the_oracle(tmp_path, family):
    """xfc.compile_model on a quantized model: the int8 network in this process, its output equal to the
    oracle's (every step exact) for inputs it has not seen, call after call (the kernels keep their
    staging buffers between calls: MobileNet's depthwise ones too)."""
    import xfc
    model = nets.resnet_net() if family == "resnet" else nets.mobilenet_net()
    path = quantized_model(tmp_path, model, "qoperator", family[0])
    net = xfc.compile_model(path, threads=2)
    loaded = load_model(path)
    network = Q.recognise(loaded)
    name, shape, _ = loaded.inputs[0]
    for seed in (4, 5, 6):
        x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 2
        expected = Q.run(network, {name: x})[loaded.outputs[0]]
        np.testing.assert_array_equal(np.asarray(net(x)).reshape(expected.shape), expected)


def _requantizing_model(path):
    """x -> Q -> DQ -> Conv (int8 weights) -> Q(s2) -> DQ -> Q(s3) -> DQ -> y: a requantization pair
    (DQ -> Q) inside, as converters write it."""
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.float32(v), n) for n, v in (("s1", 0.02), ("s2", 0.05), ("s3", 0.07),
                                                                     ("ws", 0.01))]
    inits += [numpy_helper.from_array(np.uint8(128), "z"), numpy_helper.from_array(np.int8(0), "wz"),
              numpy_helper.from_array(rng.integers(-60, 60, (4, 3, 3, 3)).astype(np.int8), "w8")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s1", "z"], ["q1"], name="q_in"),
             helper.make_node("DequantizeLinear", ["q1", "s1", "z"], ["d1"], name="dq_in"),
             helper.make_node("DequantizeLinear", ["w8", "ws", "wz"], ["w"], name="dq_w"),
             helper.make_node("Conv", ["d1", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "s2", "z"], ["q2"], name="q_conv"),
             helper.make_node("DequantizeLinear", ["q2", "s2", "z"], ["d2"], name="dq_mid"),
             helper.make_node("QuantizeLinear", ["d2", "s3", "z"], ["q3"], name="q_mid"),
             helper.make_node("DequantizeLinear", ["q3", "s3", "z"], ["y"], name="dq_out")]
    return _qdq_model(path, nodes, inits, [1, 4, 6, 6], in_shape=[1, 3, 6, 6])


@pytest.mark.unit
def test_a_requantizing_pair_inside_the_network_is_refused_in_one_line(tmp_path, capsys):
    path = _requantizing_model(tmp_path / "requant.onnx")
    code = main(["model", str(path), "--hw", "snapdragon-865", "--emit", "lib", "-o", str(tmp_path / "out")])
    assert_one_line_error(code, capsys.readouterr().err, 2, "an int8 model (QDQ: 1 int8 layers",
                          "'dq_mid' (DequantizeLinear into 'd2'", "'q_mid' (QuantizeLinear of 'd2'")
    assert not (tmp_path / "out").exists()


def _qdq_model(path, nodes, inits, out_shape, out_type=None, in_shape=(1, 4, 6, 6)):
    """A hand-written quantized model: input x (fp32), output y, opset 17, saved at path."""
    from onnx import TensorProto, helper
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))],
                              [helper.make_tensor_value_info("y", out_type or TensorProto.FLOAT, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.mark.unit
def test_what_the_int8_runtime_cannot_hold_is_refused_in_one_line(tmp_path, capsys):
    """A broadcasting quantized Add, and a graph output left quantized (the C API returns fp32)."""
    from onnx import TensorProto, helper, numpy_helper
    inits = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.uint8(128), "z"),
             numpy_helper.from_array(np.zeros((1, 4, 1, 1), np.float32), "bias")]
    q = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q_in"),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="dq_in")]
    broadcast = q + [helper.make_node("QuantizeLinear", ["bias", "s", "z"], ["qb"], name="q_b"),
                     helper.make_node("DequantizeLinear", ["qb", "s", "z"], ["db"], name="dq_b"),
                     helper.make_node("Add", ["d", "db"], ["a"], name="add"),
                     helper.make_node("QuantizeLinear", ["a", "s", "z"], ["qa"], name="q_a"),
                     helper.make_node("DequantizeLinear", ["qa", "s", "z"], ["y"], name="dq_out")]
    left_quantized = q + [helper.make_node("MaxPool", ["d"], ["m"], name="pool", kernel_shape=[2, 2]),
                          helper.make_node("QuantizeLinear", ["m", "s", "z"], ["y"], name="q_out")]
    for name, nodes, shape, out_type, needle in (
            ("broadcast", broadcast, [1, 4, 6, 6], None, "'add' (Add: broadcasting (1, 4, 6, 6) + (1, 4, 1, 1))"),
            ("left", left_quantized, [1, 4, 5, 5], TensorProto.UINT8, "graph output 'y' (not dequantized")):
        path = _qdq_model(tmp_path / f"{name}.onnx", nodes, inits, shape, out_type)
        code = main(["model", str(path), "--hw", "snapdragon-865", "--emit", "lib", "-o", str(tmp_path / name)])
        assert_one_line_error(code, capsys.readouterr().err, 2, "an int8 model", needle)
        assert not (tmp_path / name).exists()


# MaxPool attributes for the byte pooling op (templates/runtime/ops_int8.c.j2): padding, ceil_mode,
# dilations, windows past the image, a stride of 1 and 3, a kernel wider than the stride.
QPOOLS = (
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
    dict(kernel_shape=[2, 2], strides=[2, 2]),
    dict(kernel_shape=[3, 2], strides=[1, 3], pads=[0, 1, 2, 1], dilations=[2, 1]),
    dict(kernel_shape=[5, 4], strides=[1, 1], pads=[2, 1, 2, 2]),
)


@support.needs_onnxruntime
@pytest.mark.host
@pytest.mark.parametrize("shape,activation", [((2, 5, 13, 11), "uint8"), ((1, 3, 9, 70), "uint8"),
                                              ((2, 5, 13, 11), "int8")], ids=["13x11", "9x70", "13x11-int8"])
def test_byte_max_pooling_equals_the_oracle_on_every_attribute(tmp_path, shape, activation):
    """The int8 network's MaxPool on ragged planes (narrower than one 64-byte chunk, and wider than
    one), uint8 and int8 activations (the padding's minimum 0 or -128), two threads: every output
    equal to xfc's QLinear oracle, byte for byte (max pooling of bytes is exact)."""
    import xfc
    b = nets.Builder(29)
    c = shape[1]
    y = b.node("Conv", ["x", b.const(np.eye(c, dtype=np.float32).reshape(c, c, 1, 1))])
    model = b.model({"x": list(shape)}, [b.node("MaxPool", [y], **attrs) for attrs in QPOOLS], opset=13)
    path = quantized_model(tmp_path, model, "qdq", "pools", activation)
    loaded = load_model(path)
    network = Q.recognise(loaded)
    net = xfc.compile_model(path, threads=2, out_dir=tmp_path / "net")
    x = np.random.default_rng(3).uniform(-3, 1, size=shape).astype(np.float32)
    expected = Q.run(network, {loaded.inputs[0][0]: x})
    got = dict(zip((name for name, _ in net.outputs), net(x)))
    assert set(got) == set(loaded.outputs) and len(got) == len(QPOOLS)
    for name in loaded.outputs:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    net.close()
