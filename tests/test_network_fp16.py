"""fp16 whole networks (`xfc model --emit lib --dtype fp16`, issue 33 item 3): the lowering casts at the
edges and fuses only what fp16 kernels fuse, the weights file holds fp16, the per-step checks accept
an ideal fp16 execution and reject a perturbed one, and the network runs under qemu-aarch64 for a
core with FP16 arithmetic, verified step by step and against the fp32 model; refusals are one line."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from support import nets
from support.cli import assert_one_line_error

from xfc.cli import main
from xfc.errors import OperatorError
from xfc.model.load import load_model
from xfc.model.nodes import run_node
from xfc.model.runtime.arena import plan_arena
from xfc.model.runtime.check import as_fp16, verify_program
from xfc.model.runtime.emit import HEADER_BYTES, build_payload
from xfc.model.runtime.lower import lower_network
from xfc.model.runtime.program import KernelStep
from xfc.ops.dtypes import FP16, FP32
from xfc.ops.reference import activate, reference
from xfc.ops.spec import Epilogue

ARM_FP16 = "snapdragon-865"     # Cortex-A77 / A55: FP16 arithmetic


def lowered_fp16(tmp_path, name, model):
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return lower_network(load_model(path), name, dtype=FP16)


@pytest.mark.unit
def test_fp16_program_casts_at_the_edges_and_fuses_only_what_fp16_kernels_fuse(tmp_path):
    low = lowered_fp16(tmp_path, "v3", nets.mobilenet_v3_net())
    program = low.program
    first, last = program.steps[0], program.steps[-1]
    assert first.op == "cast" and first.params == {"from": "fp32", "to": "fp16"} and first.inputs == program.inputs
    assert last.op == "cast" and last.params == {"from": "fp16", "to": "fp32"} and last.outputs == program.outputs
    assert program.element_type(program.inputs[0]) == program.element_type(program.outputs[0]) == FP32
    assert program.element_type(first.outputs[0]) == FP16 and program.dtype == FP16
    kernels = program.kernel_steps
    # fp16 kernels fuse bias, relu, relu6: residual Adds and the network activations stay runtime ops
    assert kernels and all(not k.spec.epilogue.extended and k.residual is None for k in kernels)
    ops = [s.op for s in program.steps if s.kind == "op"]
    assert "add" in ops and "hardswish" in ops and "silu" in ops
    fp32 = lower_network(load_model(tmp_path / "v3.onnx"), "v3").program
    assert any(k.spec.epilogue.extended for k in fp32.kernel_steps)     # the same net in fp32 fuses them
    assert plan_arena(program).element_bytes == 2 and plan_arena(fp32).element_bytes == 4


@pytest.mark.unit
def test_the_weights_file_holds_fp16_and_a_weight_fp16_cannot_hold_is_one_line(tmp_path):
    program = lowered_fp16(tmp_path, "bn", nets.bottleneck_net()).program
    payload = build_payload(program, "id")
    assert payload.data.dtype == np.float16
    assert len(payload.file_bytes()) == HEADER_BYTES + 2 * payload.data.size
    step = next(i for i, s in enumerate(program.steps) if isinstance(s, KernelStep))
    weight = np.asarray(program.steps[step].layer.weight, np.float32).reshape(-1)
    offset = payload.weight_offsets[step]
    assert np.array_equal(payload.data[offset:offset + weight.size], weight.astype(np.float16))
    # a weight past fp16's 65504 in a model of one convolution: refused naming the layer and the value
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])
    w = np.full((4, 2, 3, 3), 0.5, np.float32)
    w[1, 0, 2, 2] = 1e5
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="huge", pads=[1, 1, 1, 1])], "g",
                              [x], [y], [numpy_helper.from_array(w, "w")])
    huge = lowered_fp16(tmp_path, "huge", helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    with pytest.raises(OperatorError) as err:
        build_payload(huge.program, "id")
    assert "--dtype fp16" in str(err.value) and "'huge'" in str(err.value) and "100000" in str(err.value) \
        and "\n" not in str(err.value)


def ideal_fp16_run(program, feeds, opset, constants, fault=None):
    """Each step computed exactly (float64) on the previous steps' fp16 values and rounded to fp16
    once: what a correct fp16 network may produce; returns the per-step dumps. fault: (step name,
    function) changing that step's output before the later steps read it."""
    values = {k: np.asarray(v, np.float64) for k, v in feeds.items()}
    casts = [s for s in program.steps if s.kind == "op" and s.op == "cast"]
    onnx_name = {s.inputs[0]: s.outputs[0] for s in casts if s.params["to"] == "fp32"}   # Y@fp16 -> Y
    internal = {s.inputs[0]: s.outputs[0] for s in casts if s.params["to"] == "fp16"}   # X -> X@fp16
    internal.update({v: k for k, v in onnx_name.items()})

    def value(name):
        if name in values:
            return values[name]
        if name in program.aliases:
            root, offset = program.aliases[name]
            return value(root).reshape(-1)[offset:offset + program.floats(name)].reshape(program.shapes[name])
        return np.asarray(constants[name], np.float64)

    dumps = []
    for step in program.steps:
        if isinstance(step, KernelStep):
            spec = step.spec
            plain = type(spec)(**spec.shape_dict(), epilogue=Epilogue(bias=spec.epilogue.bias))
            x = value(step.input).reshape(plain.operand_shapes[0])
            w = as_fp16(step.layer.weight).reshape(plain.operand_shapes[1])
            outs = [as_fp16(activate(reference(plain, x, w, as_fp16(step.layer.bias)), spec.epilogue.activation))]
        elif step in casts:
            x = value(step.inputs[0])
            outs = [as_fp16(x) if step.params["to"] == "fp16" else x]
        else:
            feeds_now = {}
            for node in step.onnx_nodes:
                for n in node.input:
                    if n and n not in feeds_now:
                        feeds_now[n] = value(internal.get(n, n))
                feeds_now.update(zip([o for o in node.output if o], run_node(node, feeds_now, opset)))
            outs = [as_fp16(feeds_now[onnx_name.get(t, t)]) for t in step.outputs]
        if fault is not None and step.name == fault[0]:
            outs = [fault[1](np.asarray(outs[0], np.float64))] + outs[1:]
        for t, v in zip(step.outputs, outs):
            values[t] = np.asarray(v, np.float64).reshape(program.shapes[t])
        dumps.append([values[t].astype(np.float32).reshape(-1) for t in step.outputs])
    return dumps


def four_ulps_up(y: np.ndarray) -> np.ndarray:
    """y with its largest element 4 fp16 units in the last place higher."""
    y = y.copy()
    j = np.unravel_index(int(np.argmax(np.abs(y))), y.shape)
    y[j] = float(y[j]) + 4 * float(np.spacing(np.float16(y[j])))
    return y


def a_quarter_up(y: np.ndarray) -> np.ndarray:
    """y with its largest element a quarter larger (a kernel's bound on K terms is wider than an op's)."""
    y = y.copy()
    j = np.unravel_index(int(np.argmax(np.abs(y))), y.shape)
    y[j] = float(np.float16(y[j] * 1.25))
    return y


@pytest.mark.unit
@pytest.mark.parametrize("step, fault", [("bn1_add", four_ulps_up), ("bn1_conv", a_quarter_up),
                                         ("bn1_conv", "folded weights")])
def test_per_step_fp16_checks_accept_an_ideal_fp16_run_and_catch_a_fault_in_one_step(tmp_path, step, fault):
    low = lowered_fp16(tmp_path, "bn", nets.bottleneck_net())
    program, loaded = low.program, low.folded_loaded
    rng = np.random.default_rng(3)
    feeds = {name: rng.standard_normal(program.shapes[name]).astype(np.float32) for name in program.inputs}
    dumps = ideal_fp16_run(program, feeds, loaded.opset, loaded.constants)
    outputs = [dumps[-1][0]]
    expected = {program.outputs[0]: dumps[-1][0].reshape(program.shapes[program.outputs[0]]).astype(np.float64)}
    kc = {s.spec: 64 for s in program.kernel_steps}
    args = dict(winograd={}, where="numpy", emulated=False, seed=0, kc=kc)
    good = verify_program(program, loaded.opset, loaded.constants, feeds, dumps, outputs, expected, "itself", **args)
    assert good.ok and good.dtype == "fp16" and len(good.steps) == len(program.steps), \
        [(c.name, c.error_to_bound_ratio) for c in good.steps if not c.ok]
    assert good.agreement and good.agreement[0]["max_abs_error"] == 0.0
    # one element of one step wrong (the later steps computed from it as a correct network would), or a
    # kernel given wrong weights (a mapping or folding fault: the kernel computes them faithfully): that
    # step fails, alone
    if fault == "folded weights":
        wrong = [dataclasses.replace(s, layer=dataclasses.replace(s.layer, weight=-s.layer.weight))
                 if isinstance(s, KernelStep) and s.name == step else s for s in program.steps]
        faulty = dataclasses.replace(program, steps=tuple(wrong))
        bad = ideal_fp16_run(faulty, feeds, loaded.opset, loaded.constants)
        program = faulty
    else:
        bad = ideal_fp16_run(program, feeds, loaded.opset, loaded.constants, fault=(step, fault))
    caught = verify_program(program, loaded.opset, loaded.constants, feeds, bad, [bad[-1][0]], expected, "itself",
                            **args)
    failed = [c.name for c in caught.steps if not c.ok]
    assert not caught.ok and failed == [step], failed


@pytest.mark.emulated
def test_fp16_network_runs_under_qemu_verified_step_by_step_and_close_to_the_fp32_model(tmp_path, capsys):
    path = tmp_path / "bn.onnx"
    onnx.save(nets.bottleneck_net(), str(path))
    out = tmp_path / "lib"
    code = main(["model", str(path), "--hw", ARM_FP16, "--emit", "lib", "--dtype", "fp16", "--verify", "--json",
                 "-o", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    v = report["verification"]
    assert v["verified"] and v["emulated"] and v["dtype"] == "fp16" and not v["layers_failed"]
    assert {s["bound_kind"] for s in v["steps"]} == {"derived", "exact"}
    assert v["steps"][0]["op"] == v["steps"][-1]["op"] == "cast"
    [agree] = v["agreement_with_fp32"]
    assert agree["argmax_agree"] == agree["argmax_rows"] == 1
    assert 0 < agree["relative_to_largest_output"] < 0.02     # fp16 arithmetic, not fp32 relabelled
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dtype"] == "fp16" and {f["isa"] for f in manifest["functions"]} == {"neon_fp16"}
    weights = (out / manifest["weights"]["file"]).read_bytes()
    values = int.from_bytes(weights[8:16], "little")                      # the header's payload count
    assert len(weights) == manifest["weights"]["bytes"] == HEADER_BYTES + 2 * values
    assert report["network"]["dtype"] == "fp16"
    header = (out / f"{manifest['cmake_target']}.h").read_text()
    assert "computes in fp16" in header and "const __fp16 *in0" in header


@pytest.mark.unit
@pytest.mark.parametrize("argv, needles", [
    (["--hw", "cortex-a53", "--emit", "lib"], ["cortex-a53", "'fp16'"]),
    (["--hw", ARM_FP16], ["--emit lib"]),
    (["--hw", ARM_FP16, "--emit", "lib", "--target", "gpu"], ["--emit lib"]),
])
def test_fp16_networks_are_refused_in_one_line_where_they_cannot_run(tmp_path, capsys, argv, needles):
    path = tmp_path / "bn.onnx"
    onnx.save(nets.bottleneck_net(), str(path))
    code = main(["model", str(path), "--dtype", "fp16", "-o", str(tmp_path / "out"), *argv])
    assert_one_line_error(code, capsys.readouterr().err, 2, *needles)
    assert not (tmp_path / "out").exists()


@pytest.mark.host
def test_fp16_networks_are_refused_on_the_host_in_one_line(tmp_path, capsys):
    path = tmp_path / "bn.onnx"
    onnx.save(nets.bottleneck_net(), str(path))
    code = main(["model", str(path), "--dtype", "fp16", "--hw", "host", "--emit", "lib", "-o", str(tmp_path / "out")])
    assert_one_line_error(code, capsys.readouterr().err, 2, "--dtype fp16", "x86_64")
    assert not (tmp_path / "out").exists()


@pytest.mark.unit
@pytest.mark.parametrize("argv, needles", [
    (["--targets", "host", "--dtype", "fp16"], ["no target of host runs --dtype fp16", "qemu"]),
])
def test_fuzz_networks_refuse_a_dtype_no_target_runs_in_one_line(tmp_path, capsys, argv, needles):
    code = main(["fuzz", "--networks", "2", "--out", str(tmp_path / "n.json"), *argv])
    assert_one_line_error(code, capsys.readouterr().err, 2, *needles)
    assert not (tmp_path / "n.json").exists()


@pytest.mark.unit
def test_fuzz_networks_cycle_through_the_dtypes_each_target_runs():
    from xfc.cli.fuzz import network_plan
    assert network_plan(["host", "qemu"], ("fp32", "fp16", "int8")) == [
        ("host", "fp32"), ("qemu", "fp32"), ("qemu", "fp16"), ("host", "int8"), ("qemu", "int8")]
    assert network_plan(["host", "qemu"], ("fp32", "fp16")) == [("host", "fp32"), ("qemu", "fp32"), ("qemu", "fp16")]
    assert network_plan(["qemu"], ("fp16",)) == [("qemu", "fp16")]


@pytest.mark.unit
def test_predicted_kernel_time_for_every_cluster_thread_count_and_dtype_the_cores_run(tmp_path):
    from xfc.hardware import load
    from xfc.model.runtime.predict import network_predictions, predict_kernels
    path = tmp_path / "bn.onnx"
    onnx.save(nets.bottleneck_net(), str(path))
    loaded = load_model(path)
    hw = load(ARM_FP16)
    rows = network_predictions(loaded, "bn", hw, FP16)
    expected = {(c.role, t, d) for c in hw.clusters for t in {1, c.count} for d in ("fp32", "fp16")}
    assert {(r["cluster"], r["threads"], r["dtype"]) for r in rows} == expected
    assert rows[0]["dtype"] == "fp16" and all(r["predicted_ms"] > 0 for r in rows)
    # the sum is per kernel call: the big cluster's 3-thread fp16 figure is the library's own kernels
    program = lower_network(loaded, "bn", dtype=FP16).program
    big = next(r for r in rows if (r["cluster"], r["threads"], r["dtype"]) == ("big", 3, "fp16"))
    assert big["predicted_ms"] == pytest.approx(predict_kernels(program, hw, "big", 3, "fp16") * 1e3, rel=1e-3)
    a53 = network_predictions(loaded, "bn", load("cortex-a53"))             # no FP16 arithmetic: fp32 only
    assert {r["dtype"] for r in a53} == {"fp32"}
