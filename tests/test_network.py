"""The whole network in C (`xfc model --emit lib`, xfc/model/runtime): lowering, fusion, the arena
plan, the weights file, and the network's benchmark program run natively, under qemu-aarch64 and on
the virtual device, checked step by step and against onnxruntime; bad models are exit 2 in one line,
a missing device exit 3."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import support
from support import nets
from support.cli import assert_one_line_error

from xfc.cli import main
from xfc.model.load import load_model
from xfc.model.runtime import arena
from xfc.model.runtime.arena import plan_arena
from xfc.model.runtime.emit import HEADER_BYTES, build_payload
from xfc.model.runtime.lower import lower_network
from xfc.model.runtime.network import weights_planned_from, weights_read_from_memory
from xfc.model.runtime.program import KernelStep
from xfc.ops.spec import DepthwiseSpec

FAMILIES = {"mobilenet_v3": nets.mobilenet_v3_net, "bottleneck": nets.bottleneck_net,
            "shufflenet": nets.shufflenet_net, "unet": nets.unet_net}
ARENA_LIMIT = 1.1    # the target: the arena within 1.1x the liveness lower bound


def save(model, directory: Path, name: str) -> Path:
    path = directory / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def lowered(tmp_path, name, model):
    return lower_network(load_model(save(model, tmp_path, name)), name)


def run_json(capsys, argv):
    code = main(argv)
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if code == 0 and captured.out.strip() else None), captured


# ---------------------------------------------------------------------------------------------
# Lowering, fusion, arena, weights file: pure Python
# ---------------------------------------------------------------------------------------------

@pytest.mark.unit
def test_exporter_shape_arithmetic_is_folded_and_reshapes_are_aliases(tmp_path):
    low = lowered(tmp_path, "v3", nets.mobilenet_v3_net())
    program = low.program
    folded_ops = {n.op_type for n in low.original.model.graph.node if (n.name or "") in program.folded}
    assert {"Shape", "Gather", "Unsqueeze", "Concat"} <= folded_ops
    ops = [s.label for s in program.steps if s.kind == "op"]
    assert not {"Shape", "Gather", "Concat", "Reshape"} & set(ops)
    assert any(name.startswith("t") for name in program.aliases)      # the flatten costs nothing


@pytest.mark.unit
def test_epilogues_fuse_what_frameworks_fuse(tmp_path):
    v3 = lowered(tmp_path, "v3", nets.mobilenet_v3_net()).program
    acts = {s.name: s.spec.epilogue for s in v3.kernel_steps}
    assert acts["stem"].activation == acts["b1_expand"].activation == acts["b1_dw"].activation == "hardswish"
    assert acts["b2_conv"].activation == "silu"                          # x * Sigmoid(x), two nodes
    assert acts["b2_pw"].activation == "leakyrelu" and acts["b2_pw"].alpha == pytest.approx(0.1)
    assert acts["b1_project"].residual                                   # the block's Add
    project = next(s for s in v3.kernel_steps if s.name == "b1_project")
    assert "Add" in project.fused and project.residual is not None
    assert [s.op for s in v3.steps if s.kind == "op"] == ["global_avgpool", "hardsigmoid", "mul", "avgpool",
                                                          "softmax"]
    bottleneck = lowered(tmp_path, "bn", nets.bottleneck_net()).program
    fused = [s for s in bottleneck.kernel_steps if s.spec.epilogue.residual]
    assert len(fused) == 2 and all(s.spec.epilogue.activation == "relu" for s in fused)
    assert [s.op for s in bottleneck.steps if s.kind == "op"] == ["add", "affine", "global_avgpool"]


@pytest.mark.unit
@pytest.mark.parametrize("name", ["resnet", "shufflenet"])
def test_a_network_whose_weights_exceed_the_shared_cache_is_planned_to_read_them_from_memory(tmp_path, name):
    model = {"resnet": nets.resnet_net, "shufflenet": nets.shufflenet_net}[name]()
    program = lowered(tmp_path, name, model).program
    # the oracle: the ONNX weight initializers the contractions read (grouped: all groups' filters)
    inits = {t.name: int(np.prod(t.dims)) for t in model.graph.initializer}
    weight_bytes = 4 * sum(inits[n.input[1]] for n in model.graph.node
                           if n.op_type in ("Conv", "Gemm", "MatMul") and n.input[1] in inits)
    hw = support.host_description("avx2")
    for cache_bytes, cold in ((weight_bytes - 1, True), (weight_bytes, False)):
        small = dataclasses.replace(hw, l3_bytes=cache_bytes)
        assert weights_read_from_memory(program, small) == (cold, weight_bytes, cache_bytes)
        line = weights_planned_from(program, small)
        assert line.startswith("memory:" if cold else "cache:")


@pytest.mark.unit
def test_an_output_bound_looser_than_the_heuristic_is_capped_at_it_and_can_fail():
    from xfc.model.run import HEURISTIC_RTOL, compare
    expected = np.array([0.5, -2.0, 1.0])
    tol = HEURISTIC_RTOL * 2.0
    tight = compare("y", expected + 1e-9, expected, np.full(3, 1e-8), cap_at_heuristic=True)
    assert tight.ok and tight.bound_kind == "derived" and tight.derived_max_bound is None
    for carried in (np.array([1e-8, 1e30, np.inf]), np.full(3, np.inf)):   # a deep network's worst case
        off = expected + np.array([0.0, 0.0, 3 * tol])     # far off where the derived bound says nothing
        capped = compare("y", off, expected, carried, cap_at_heuristic=True)
        assert not capped.ok and capped.bound_kind == "derived" and capped.derived_max_bound > 1e29
        assert capped.max_bound == pytest.approx(tol, rel=1e-6)
        near = expected + np.where(np.isfinite(carried) & (carried < 1), 0.0, tol / 2)
        assert compare("y", near, expected, carried, cap_at_heuristic=True).ok   # the tight element stays tight
        assert compare("y", off, expected, carried).ok      # uncapped (fp16 programs): the derived bound as it is


@pytest.mark.unit
def test_grouped_convolution_shuffle_split_and_resize_tables(tmp_path):
    shuffle = lowered(tmp_path, "sh", nets.shufflenet_net()).program
    grouped = [s for s in shuffle.kernel_steps if s.groups > 1]
    assert {s.name: s.groups for s in grouped} == {"g1_conv": 3, "g1_conv2": 3, "s_gconv": 3}
    assert all(s.spec.c * s.groups == shuffle.shapes[s.input][1] for s in grouped)
    # the residual Add and the ReLU after it fuse into the grouped conv as into any other: each
    # group's call adds its slice of the residual (copied into, or living in, the output buffer)
    g1_conv2 = next(s for s in grouped if s.name == "g1_conv2")
    assert g1_conv2.residual is not None and g1_conv2.spec.epilogue.describe() == "bias+residual+relu"
    ops = [s.op for s in shuffle.steps if s.kind == "op"]
    assert ops.count("strided_copy") == 2 and "concat" in ops        # the two shuffles; Split is two aliases
    unet = lowered(tmp_path, "un", nets.unet_net()).program
    resizes = [s for s in unet.steps if s.kind == "op" and s.op == "resize_nearest"]
    for step in resizes:   # scale 2 in either coordinate mode: every input row and column twice
        assert step.params["rows"] == [i // 2 for i in range(step.params["oh"])]
        assert step.params["cols"] == [i // 2 for i in range(step.params["ow"])]


def _after_contraction(program, plan, step_index: int) -> bool:
    """Whether the tensor that last lay where step `step_index` writes was last read by a
    convolution or matmul kernel (not a depthwise one)."""
    out = program.steps[step_index].output
    lo, hi = plan.places[out].offset, plan.places[out].offset + program.floats(out)
    before = [end for t, (begin, end) in plan.lifetimes.items() if end < step_index
              and plan.places[t].offset < hi and lo < plan.places[t].offset + program.floats(t)]
    if not before:
        return False
    reader = program.steps[max(before)]
    return isinstance(reader, KernelStep) and not isinstance(reader.spec, DepthwiseSpec)


@pytest.mark.unit
@pytest.mark.parametrize("blocks,c,hw", [(2, 8, 10), (4, 16, 16), (6, 8, 14)])
def test_arena_keeps_depthwise_outputs_off_what_a_contraction_read(tmp_path, monkeypatch, blocks, c, hw):
    """MobileNetV2 blocks: plain best fit puts every block's depthwise output where the block
    before's projection read (the lines are then in every core's cache at 2 threads); the
    cache-aware placement puts none there, in the same arena."""
    program = lowered(tmp_path, "mb", nets.mobilenet_net(blocks=blocks, c=c, hw=hw)).program
    plan = plan_arena(program)
    depthwise = [i for i, s in enumerate(program.steps) if isinstance(s, KernelStep) and isinstance(s.spec, DepthwiseSpec)]
    assert len(depthwise) == blocks + 1
    assert not [i for i in depthwise if _after_contraction(program, plan, i)]
    # best fit alone (the preference switched off): the same arena, depthwise outputs where a projection read
    best_fit = arena._place
    monkeypatch.setattr(arena, "_place", lambda order, program, prefer_clean: best_fit(order, program, False))
    plain = plan_arena(program)
    assert plain.arena_floats == plan.arena_floats
    assert len([i for i in depthwise if _after_contraction(program, plain, i)]) >= blocks


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_arena_plan_is_sound_and_within_the_target(tmp_path, name):
    """Buffers alive at the same step never overlap; the arena is within ARENA_LIMIT of the liveness
    lower bound (the largest total of buffers alive at once), which no placement can beat."""
    program = lowered(tmp_path, name, FAMILIES[name]()).program
    plan = plan_arena(program)
    assert plan.lower_bound_floats <= plan.arena_floats and plan.ratio <= ARENA_LIMIT
    roots = [t for t in plan.lifetimes]
    extent = {t: (plan.places[t].offset, plan.places[t].offset + program.floats(t)) for t in roots}
    for i, a in enumerate(roots):
        for b in roots[i + 1:]:
            (a0, a1), (b0, b1) = plan.lifetimes[a], plan.lifetimes[b]
            if a1 < b0 or b1 < a0 or plan.places[a].offset == plan.places[b].offset:
                continue   # not alive together, or an in-place pair (one buffer)
            assert extent[a][1] <= extent[b][0] or extent[b][1] <= extent[a][0], (a, b)
    for step_index in plan.residual_inplace:
        step = program.steps[step_index]
        assert plan.places[step.output] == plan.places[step.residual]
    # every tensor is a step's, the graph's or the buffer of a view of one: a fusion leaves none behind
    # (they were given buffers at step 0: ResNet-50's arena was 45 MiB against 5 MiB without them)
    touched = set(program.inputs) | set(program.outputs) | {t for s in program.steps for t in (*s.inputs, *s.outputs)}
    chains = set()
    for t in touched:   # a view's buffer, through views of views
        while t in program.aliases:
            t = program.aliases[t][0]
            chains.add(t)
    assert set(program.shapes) == touched | chains
    # the lower bound counts, at each step, the tensors written at or before it and read at or after it
    first, last = {}, {}
    for i, s in enumerate(program.steps):
        for t in s.outputs:
            first.setdefault(program.root(t)[0], i)
        for t in (*s.inputs, *s.outputs):
            last[program.root(t)[0]] = i
    live = [sum(program.floats(t) for t in plan.lifetimes if first.get(t, -1) <= i <= last.get(t, -1))
            for i in range(len(program.steps))]
    assert plan.lower_bound_floats <= max(live) + 16 * len(plan.lifetimes)   # buffers round up to 16 floats


@pytest.mark.unit
def test_weights_file_layout(tmp_path):
    program = lowered(tmp_path, "bn", nets.bottleneck_net()).program
    payload = build_payload(program, "identity")
    data = payload.file_bytes()
    assert data[:8] == b"XFCWGT01" and int.from_bytes(data[8:16], "little") == payload.data.size
    floats = np.frombuffer(data[HEADER_BYTES:], "<f4")
    for index, step in enumerate(program.steps):
        if isinstance(step, KernelStep):
            off = payload.weight_offsets[index]
            assert np.array_equal(floats[off:off + step.layer.weight.size], step.layer.weight.reshape(-1))
            boff = payload.const_section + payload.bias_offsets[index]
            assert np.array_equal(floats[boff:boff + step.layer.bias.size], step.layer.bias)
    assert build_payload(program, "other").digest != payload.digest


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "bad", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.unit
def test_bad_models_are_exit_2_in_one_line(tmp_path, capsys):
    b = nets.Builder(9)
    t = b.node("Erf", [b.conv("x", 3, 4, name="c1")], name="the_erf")
    t = b.node("Tanh", [t], name="the_tanh")
    unsupported = save(b.model({"x": [1, 3, 6, 6]}, [t]), tmp_path, "unsupported")
    out = tmp_path / "o"
    code, _, captured = run_json(capsys, ["model", str(unsupported), "--hw", "snapdragon-865", "--emit", "lib", "-o", str(out)])
    assert_one_line_error(code, captured.err, 2, "the network runtime cannot run 2 parts of this model", "'the_erf' (Erf",
                          "'the_tanh' (Tanh")
    assert not out.exists()
    dynamic = save(_model([helper.make_node("Relu", ["x"], ["y"])],
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3, 4, 4])]), tmp_path, "dynamic")
    code, _, captured = run_json(capsys, ["model", str(dynamic), "--hw", "snapdragon-865", "--emit", "lib", "-o", str(out)])
    assert_one_line_error(code, captured.err, 2, "dynamic shape", "--input-shape")
    inconsistent = save(_model([helper.make_node("Add", ["a", "b"], ["y"])],
                               [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 4, 5, 5]),
                                helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 3, 5, 5])],
                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])]), tmp_path,
                          "incons")
    code, _, captured = run_json(capsys, ["model", str(inconsistent), "--hw", "snapdragon-865", "--emit", "lib", "-o", str(out)])
    assert_one_line_error(code, captured.err, 2, str(inconsistent))
    no_kernel = save(_model([helper.make_node("Relu", ["x"], ["y"])],
                            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 4])]), tmp_path, "relu")
    code, _, captured = run_json(capsys, ["model", str(no_kernel), "--hw", "host", "--emit", "lib", "--profile",
                                          "-o", str(out)])
    assert_one_line_error(code, captured.err, 2, "--profile", "--emit lib --bench")
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# The network in C: natively, under qemu, on the virtual device
# ---------------------------------------------------------------------------------------------

def assert_network_verified(report, where: str, heuristic_ok=()):
    v = report["verification"]
    assert v["verified"] and where in v["verified_on"], v
    assert v["steps"] and not v["layers_failed"] and all(s["error_to_bound_ratio"] <= 1 for s in v["steps"])
    for c in v["outputs"]:
        assert c["ok"] and (c["bound_kind"] == "derived" or set(v["ops_without_error_rule"]) <= set(heuristic_ok)), c
    net = report["network"]
    assert net["arena_bytes"] <= ARENA_LIMIT * net["arena_lower_bound_bytes"] + 4 * 64
    assert net["runtime_ops"] + net["kernel_calls"] == net["steps"] <= len(v["steps"])   # a check per step output
    assert net["weights_planned_from"].startswith("cache: ")   # the test networks' few KiB of weights


def _runtime_ops_only():
    """Pre-processing with no contraction: Relu, a ceil-mode MaxPool, Resize and Softmax over channels."""
    b = nets.Builder(21)
    y = b.node("Relu", ["x"])
    y = b.node("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    y = b.node("Resize", [y, "", b.const(np.array([1, 1, 2, 2], np.float32), "scales")], mode="nearest")
    y = b.node("Softmax", [y], axis=1)
    return b.model({"x": [1, 5, 9, 7]}, [y])


@support.needs_onnxruntime
@pytest.mark.host
def test_a_network_of_runtime_ops_only_runs_in_c(tmp_path, capsys):
    """A network with no Conv, Gemm or MatMul (pre-processing) was refused by --emit lib (nothing to
    synthesize); it is a library of runtime ops in the cluster's dialect, verified, and a callable."""
    import xfc
    import onnxruntime as ort
    model = _runtime_ops_only()
    path = save(model, tmp_path, "prep")
    code, report, captured = run_json(capsys, ["model", str(path), "--hw", "host", "--emit", "lib", "--verify",
                                               "--json", "-o", str(tmp_path / "out")])
    assert code == 0, captured.err
    assert_network_verified(report, "host (native benchmark program)", heuristic_ok=("Softmax",))
    assert report["network"]["kernel_calls"] == 0 and report["network"]["runtime_ops"] == 4
    net = xfc.compile_model(model, threads=1)
    x = np.random.default_rng(2).uniform(-1, 1, size=(1, 5, 9, 7)).astype(np.float32)
    want, = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = net(x)
    assert got.shape == want.shape and np.max(np.abs(got - want)) <= 1e-6
    net.close()


@support.needs_onnxruntime
@pytest.mark.emulated
@pytest.mark.skipif(not support.HAVE_ARM, reason="no aarch64 gcc / qemu-aarch64")
def test_a_network_of_runtime_ops_only_runs_under_qemu(tmp_path, capsys):
    path = save(_runtime_ops_only(), tmp_path, "prep")
    code, report, captured = run_json(capsys, ["model", str(path), "--hw", "snapdragon-865", "--emit", "lib",
                                               "--verify", "--json", "-o", str(tmp_path / "out")])
    assert code == 0, captured.err
    assert_network_verified(report, "qemu-aarch64", heuristic_ok=("Softmax",))
    assert report["library"]["abi"] == "arm64-v8a" and report["network"]["kernel_calls"] == 0


@support.needs_onnxruntime
@pytest.mark.host
@pytest.mark.parametrize("name, batch", [("mobilenet_v3", 1), ("bottleneck", 1), ("shufflenet", 2), ("unet", 1)])
def test_network_runs_in_c_and_matches_onnxruntime_on_the_host(tmp_path, capsys, name, batch):
    path = save(FAMILIES[name](batch=batch), tmp_path, name)
    code, report, captured = run_json(capsys, ["model", str(path), "--hw", "host", "--emit", "lib", "--verify",
                                               "--json", "-o", str(tmp_path / "out")])
    assert code == 0, captured.err
    assert_network_verified(report, "host (native benchmark program)", heuristic_ok=("Softmax",))
    assert not report["verification"]["emulated"]
    files = {p.name for p in (tmp_path / "out").iterdir()}
    prefix = report["library"]["cmake_target"]
    assert {f"{prefix}.h", f"{prefix}.c", f"{prefix}.weights", f"benchmark_{name}", f"benchmark_{name}.c",
            "CMakeLists.txt", "manifest.json", report["library"]["library"]} <= files


@pytest.fixture(scope="module")
def tiny_benchmark(tmp_path_factory) -> Path:
    """benchmark_tiny beside its weights, as `--emit lib --verify` leaves it: one 3x3 convolution and a
    Relu on 'input' (1, 3, 16, 16), 768 floats."""
    directory = tmp_path_factory.mktemp("tiny")
    b = nets.Builder(5)
    y = b.node("Relu", [b.conv("input", 3, 4, name="conv")], name="relu")
    path = save(b.model({"input": [1, 3, 16, 16]}, [y]), directory, "tiny")
    assert main(["model", str(path), "--hw", "host", "--emit", "lib", "--verify", "--threads", "1",
                 "-o", str(directory / "out")]) == 0
    return directory / "out" / "benchmark_tiny"


def run_benchmark(program: Path, *args: str):
    import subprocess
    return subprocess.run([str(program), *args], capture_output=True, text=True, timeout=120)


def assert_benchmark_refuses(result, *needles: str) -> None:
    """Exit 2, nothing on stdout, one line on stderr holding every needle."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and result.stdout == "" and len(lines) == 1, result
    assert lines[0].startswith("benchmark_tiny: ") and all(n in lines[0] for n in needles), lines[0]


@support.needs_onnxruntime
@pytest.mark.host
@pytest.mark.parametrize("args, needles", [
    (["--input", "/nonexistent/x.f32"], ["--input '/nonexistent/x.f32': cannot open: No such file or directory"]),
    (["--random", "--bogus"], ["unknown option '--bogus'"]),
    (["--bogus", "--random"], ["unknown option '--bogus'"]),
    (["--random", "--runs"], ["--runs is missing its value"]),
    (["--random", "--runs", "abc"], ["--runs 'abc': expected a whole number", "from 1 to 2147483647"]),
    (["--random", "--runs", "0"], ["--runs '0'", "from 1 to"]),
    (["--random", "--runs", "3x"], ["--runs '3x'"]),
    (["--random", "--runs", " 3"], ["--runs ' 3'"]),
    (["--random", "--warmup", "99999999999999999999"], ["--warmup '99999999999999999999'", "from 0 to 2147483647"]),
    (["--random", "--warmup", "2147483648"], ["--warmup '2147483648'"]),
    (["--random", "--warmup", "-1"], ["--warmup '-1'"]),
    (["--random", "--seed", "-5"], ["--seed '-5'", "from 0 to 18446744073709551615"]),
    (["--random", "--seed", "18446744073709551616"], ["--seed '18446744073709551616'"]),
    (["--random", "--threads", "100000"], ["--threads '100000'", "0: the default"]),
    ([], ["0 --input file(s) for 1 graph input(s)", "or --random"]),
    # the library's own create error carries the system's reason
    (["--random", "--weights", "/nonexistent/w.weights"],
     ["cannot open the weights file '/nonexistent/w.weights': No such file or directory"]),
])
def test_the_benchmark_program_names_a_bad_argument_in_one_line(tiny_benchmark, args, needles):
    """Before: a missing --input file read as "got -1 floats", an unknown last option as "missing its
    value", and --runs / --warmup went through atoi ('abc' ran 0 times) and --seed through strtoull
    (-5 wrapped round)."""
    assert_benchmark_refuses(run_benchmark(tiny_benchmark, *args), *needles)


@support.needs_onnxruntime
@pytest.mark.host
def test_the_benchmark_program_checks_its_input_files_and_accepts_what_is_in_range(tiny_benchmark, tmp_path):
    sizes = {"short": 3000, "partial": 3073, "long": 3076, "exact": 3072}
    for name, size in sizes.items():
        (tmp_path / f"{name}.f32").write_bytes(bytes(size))
    what = "input 'input' is 768 fp32 values (3072 bytes), the file holds"
    assert_benchmark_refuses(run_benchmark(tiny_benchmark, "--input", str(tmp_path / "short.f32")),
                             f"{what} 3000 bytes")
    for name in ("partial", "long"):   # a trailing partial float is no longer read as a whole file
        assert_benchmark_refuses(run_benchmark(tiny_benchmark, "--input", str(tmp_path / f"{name}.f32")),
                                 f"{what} more than 3072 bytes")
    assert_benchmark_refuses(run_benchmark(tiny_benchmark, "--input", str(tmp_path)), "cannot read: Is a directory")
    ran = run_benchmark(tiny_benchmark, "--input", str(tmp_path / "exact.f32"), "--runs", "2", "--warmup", "0",
                        "--threads", "1")
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout)
    assert (report["runs"], report["warmup"], report["threads"], report["inputs"]) == (2, 0, 1, "files")
    ran = run_benchmark(tiny_benchmark, "--random", "--seed", "18446744073709551615", "--runs", "1", "--threads", "0")
    assert ran.returncode == 0 and json.loads(ran.stdout)["threads"] == 1, ran.stderr   # 0: the default (1 here)
    shown = run_benchmark(tiny_benchmark, "--help")
    assert shown.returncode == 0 and shown.stderr == "" and "usage: benchmark_tiny" in shown.stdout
    assert "'input': 768 values" in shown.stdout


@support.needs_onnxruntime
@pytest.mark.host
def test_bench_against_onnxruntime_and_a_wrong_step_fails_the_check(tmp_path, capsys):
    """--bench times the network's program against onnxruntime's session.run (same threads, alternating
    rounds). Then the per-step check, on that program's own step dumps, is shown to be sharp: one C
    output nudged by a few units in the last place fails that step and no step before it (the steps
    reading the nudged tensor see other inputs than the C code did, so they may fail too)."""
    from xfc.model.run import make_feeds, run_onnxruntime
    from xfc.model.runtime.check import verify_program
    from xfc.model.runtime.execute import HostProgram, ProgramRequest
    path = save(nets.bottleneck_net(), tmp_path, "bottleneck")
    out = tmp_path / "o"
    code, report, captured = run_json(capsys, ["model", str(path), "--hw", "host", "--emit", "lib", "--bench",
                                               "--profile", "--threads", "1", "--repeat", "3", "--json", "-o", str(out)])
    assert code == 0, captured.err
    b = report["network_bench"]
    assert b["threads"] == 1 and b["rounds"] == 3 and b["runs"] == 3 and not b["xfc"]["emulated"]
    # --profile: every step timed, in order, named; kernels with their GFLOP/s
    steps = b["profile"]["steps"]
    assert [s["step"] for s in steps] == list(range(report["network"]["steps"])) and all(s["ms"] > 0 for s in steps)
    assert sum(s["share"] for s in steps) == pytest.approx(1.0)
    assert all(s["gflops"] > 0 for s in steps if s["what"].startswith("conv2d"))
    assert b["onnxruntime"]["label"].startswith("onnxruntime") and "1 intra-op thread" in b["onnxruntime"]["label"]
    assert b["speedup"] == pytest.approx(b["onnxruntime"]["median_ms"] / b["xfc"]["median_ms"])
    assert b["xfc"]["arena_bytes"] == report["network"]["arena_bytes"] > 0
    low = lower_network(load_model(path), "bottleneck")
    program = low.program
    feeds = make_feeds(low.net, 0)
    np.ascontiguousarray(feeds["x"], "<f4").tofile(tmp_path / "x.f32")
    for d in ("outs", "dump"):
        (tmp_path / d).mkdir()
    HostProgram().run(ProgramRequest(binary=out / "benchmark_bottleneck", weights=out / report["library"]["weights"],
                                     inputs=(tmp_path / "x.f32",), outputs_dir=tmp_path / "outs",
                                     dump_dir=tmp_path / "dump", warmup=0, runs=1, threads=1))
    dumps = [[np.fromfile(tmp_path / "dump" / f"step{i}_{k}.f32", "<f4") for k in range(len(s.outputs))]
             for i, s in enumerate(program.steps)]
    outputs = [np.fromfile(tmp_path / "outs" / "output0.f32", "<f4")]

    class Original:
        loaded = low.original
    expected, label = run_onnxruntime(Original, feeds)
    tile = {k["spec"]: k["winograd_m"] for k in report["network"]["kernels"]}
    winograd = {s.spec: tile[s.spec.describe()] for s in program.kernel_steps}

    def check(dumps):
        return verify_program(program, low.folded_loaded.opset, low.folded_loaded.constants, feeds, dumps, outputs,
                              expected, label, winograd=winograd, where="host", emulated=False, seed=0)
    assert check(dumps).ok
    victim = next(i for i, s in enumerate(program.steps) if s.kind == "op" and s.op == "affine")
    bad = [list(d) for d in dumps]
    bad[victim][0] = bad[victim][0].copy()
    bad[victim][0][7] = np.nextafter(np.nextafter(np.nextafter(bad[victim][0][7], np.inf), np.inf), np.inf) * 1.0001
    result = check(bad)
    assert not result.ok and [c.index for c in result.steps if not c.ok][0] == victim


@support.needs_onnxruntime
@pytest.mark.emulated
@pytest.mark.skipif(not support.HAVE_ARM, reason="no aarch64 gcc / qemu-aarch64")
def test_network_under_qemu_matches_onnxruntime(tmp_path, capsys):
    """The squeeze-excitation / hard-swish / SiLU net: the NEON spelling of the activations and ops."""
    name = "mobilenet_v3"
    path = save(FAMILIES[name](), tmp_path, name)
    code, report, captured = run_json(capsys, ["model", str(path), "--hw", "snapdragon-865", "--emit", "lib",
                                               "--verify", "--bench", "--repeat", "2", "--json",
                                               "-o", str(tmp_path / "out")])
    assert code == 0, captured.err
    assert_network_verified(report, "qemu-aarch64", heuristic_ok=("Softmax",))
    assert report["verification"]["emulated"] and report["library"]["abi"] == "arm64-v8a"
    b = report["network_bench"]
    assert b["xfc"]["emulated"] and "emulated" in b["xfc"]["measured_on"] and b["onnxruntime"] is None


@support.needs_onnxruntime
@pytest.mark.adb
@pytest.mark.skipif(not support.HAVE_ARM, reason="no aarch64 gcc / qemu-aarch64")
def test_network_on_the_virtual_device(tmp_path, capsys, server):
    from android_runner.virtual_device import VirtualDevice
    dev = VirtualDevice(soc="snapdragon-865").start()
    server.connect(dev.serial)
    try:
        path = save(nets.resnet_net(blocks=1, hw=7), tmp_path, "resnet")
        code, report, captured = run_json(capsys, [
            "model", str(path), "--hw", "snapdragon-865", "--emit", "lib", "--verify", "--bench", "--repeat", "2",
            "--device", dev.serial, "--adb-port", str(server.port), "--json", "-o", str(tmp_path / "out")])
        assert code == 0, captured.err
        assert_network_verified(report, "virtual-device")
        x = report["network_bench"]["xfc"]
        assert x["emulated"] and "virtual-device" in x["measured_on"] and x["telemetry"]["notes"]
        assert "pinned with taskset" in x["telemetry"]["notes"][0]
        assert not [p for p in dev.sandbox_files() if p.startswith("/data/local/tmp/xfc/")]   # cleaned up
    finally:
        server.disconnect(dev.serial)
        dev.stop()


@pytest.mark.adb
def test_bench_on_a_missing_device_is_exit_3(tmp_path, capsys, server):
    path = save(nets.mlp_net(), tmp_path, "mlp")
    code, _, captured = run_json(capsys, ["model", str(path), "--hw", "snapdragon-865", "--emit", "lib", "--bench",
                                          "--device", "NO-SUCH-PHONE", "--adb-port", str(server.port),
                                          "-o", str(tmp_path / "o")])
    assert_one_line_error(code, captured.err, 3, "NO-SUCH-PHONE")
    assert not (tmp_path / "o").exists()


@support.needs_onnxruntime
@pytest.mark.host
def test_compile_model_is_one_c_call_per_inference(tmp_path):
    """xfc.compile_model: the network as a callable on this machine (the sources --emit lib writes, as a
    shared library), inputs by position or by name, outputs in the graph's order. Against onnxruntime
    under a plain tolerance here: the derived-bound checks of the same C are the tests above."""
    import xfc
    import onnxruntime as ort
    model = nets.unet_net(batch=1)
    net = xfc.compile_model(model, threads=1, out_dir=tmp_path / "net")
    assert [n for n, _ in net.inputs] == ["x"] and len(net.outputs) == 2 and net.threads == 1
    assert (tmp_path / "net" / f"lib{net.prefix}.so").is_file()
    x = np.random.default_rng(3).uniform(-1, 1, size=(1, 3, 10, 10)).astype(np.float32)
    seg, aux = net(x)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for got, want in zip((seg, aux), expected):
        assert got.shape == want.shape and np.max(np.abs(got - want)) <= 1e-5 * max(1.0, np.abs(want).max())
    again = net({"x": x})
    assert all(np.array_equal(a, b) for a, b in zip(again, (seg, aux)))
    with pytest.raises(Exception, match="shape"):
        net(x[:, :2])
    net.close()


@support.needs_onnxruntime
@pytest.mark.host
def test_a_graph_output_that_is_a_view_is_written_to_the_callers_buffer(tmp_path):
    """A network ending in a view (Reshape after a channel shuffle, as `xfc fuzz --networks` drew it):
    the tensor the view names is placed in the caller's output buffer. It was left in the arena, so
    the output was never written while every step checked fine on its own inputs."""
    import xfc
    import onnxruntime as ort
    b = nets.Builder(11)
    y = b.relu6(b.conv("x", 9, 12, k=3, pad=0, group=3))
    y = b.node("Reshape", [y, b.const(np.array([1, 2, 6, 12, 3], np.int64), "shape")])
    y = b.node("Transpose", [y], perm=[0, 2, 1, 3, 4])
    y = b.node("Reshape", [y, b.const(np.array([1, 12, 12, 3], np.int64), "shape")])
    model = b.model({"x": [1, 9, 14, 5]}, [y])
    program = lower_network(load_model(save(model, tmp_path, "view_out")), "view_out").program
    assert program.outputs[0] in program.aliases
    assert plan_arena(program).places[program.outputs[0]].where == "output"
    net = xfc.compile_model(model, threads=1, out_dir=tmp_path / "net")
    x = np.random.default_rng(5).uniform(-1, 1, size=(1, 9, 14, 5)).astype(np.float32)
    want, = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = net(x)
    assert got.shape == want.shape and np.max(np.abs(got - want)) <= 1e-5 * max(1.0, np.abs(want).max())
    net.close()


@support.needs_onnxruntime
@pytest.mark.host
def test_grouped_calls_go_side_by_side_only_where_they_deal_out_evenly(tmp_path, monkeypatch):
    """A grouped convolution's small per-group calls run one whole call per thread only when the team
    (known at create) deals them out evenly; 3 groups on 2 threads split each call across the team
    instead. Both paths on 2 threads (3 groups, and 4 at batch 1 and 2), and 1 thread, equal
    onnxruntime; the emitted rule, compiled from the network's source, against a table."""
    import subprocess
    import xfc
    import onnxruntime as ort
    from xfc.model.runtime.emit import GROUP_SPREAD_EIGHTHS
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)     # spinning threads: these small steps split
    b = nets.Builder(13)
    y = b.node("Relu", [b.conv("x", 12, 24, k=1, pad=0, group=3)])
    y = b.relu6(b.conv(y, 24, 24, k=3, pad=1, group=4))
    for batch in (1, 2):
        model = b.model({"x": [batch, 12, 9, 11]}, [y])
        x = np.random.default_rng(batch).uniform(-1, 1, size=(batch, 12, 9, 11)).astype(np.float32)
        want, = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
        for threads in (2, 1):
            net = xfc.compile_model(model, threads=threads, out_dir=tmp_path / f"net_{batch}_{threads}")
            got = net(x)
            assert got.shape == want.shape and np.max(np.abs(got - want)) <= 1e-4 * max(1.0, np.abs(want).max())
            network_c = (tmp_path / f"net_{batch}_{threads}" / f"{net.prefix}.c").read_text()
            net.close()
            assert f"xfc_rt_groups_side_by_side({3 * batch}L, " in network_c
            assert f"xfc_rt_groups_side_by_side({4 * batch}L, " in network_c
    start = network_c.index("static int xfc_rt_groups_side_by_side")
    rule = network_c[start:network_c.index("\n}\n", start) + 3]
    assert f"#define XFC_GROUP_SPREAD_EIGHTHS {GROUP_SPREAD_EIGHTHS}" in network_c
    cases = {(3, 2): 0, (4, 2): 1, (6, 2): 1, (5, 4): 0, (32, 3): 1, (2, 2): 1, (1, 2): 0, (8, 1): 0, (9, 8): 0,
             (8, 3): 1}   # 3 calls against 8/3: exactly 9/8 of the mean
    driver = tmp_path / "spread.c"
    driver.write_text("#include <stdio.h>\n#include <stdlib.h>\n"
                      f"#define XFC_GROUP_SPREAD_EIGHTHS {GROUP_SPREAD_EIGHTHS}\n" + rule + "\nint main(int argc, char **argv)\n{\n"
                      "    for (int i = 1; i + 1 < argc; i += 2)\n"
                      "        printf(\"%d\", xfc_rt_groups_side_by_side(atol(argv[i]), atoi(argv[i + 1])));\n"
                      "    return 0;\n}\n")
    subprocess.run(["gcc", "-O1", "-Wall", "-Werror", str(driver), "-o", str(tmp_path / "spread")], check=True)
    args = [str(v) for pair in cases for v in pair]
    out = subprocess.run([str(tmp_path / "spread"), *args], capture_output=True, text=True, check=True).stdout
    assert out == "".join(str(v) for v in cases.values())


@support.needs_onnxruntime
@support.needs_arm
@pytest.mark.host
@pytest.mark.emulated
def test_fuzz_networks_verify_on_the_host_and_under_qemu(tmp_path, capsys):
    """`xfc fuzz --networks`: random small networks through --emit lib --verify, cycling host fp32, qemu
    fp32, qemu fp16, host int8, qemu int8 (quantized by onnxruntime); the same seed draws the same
    networks. Seed 3's second network is the view-output case above."""
    out = tmp_path / "nets.json"
    code = main(["fuzz", "--networks", "5", "--seed", "3", "--targets", "host,qemu", "--save-dir",
                 str(tmp_path / "saved"), "--out", str(out), "--quiet"])
    captured = capsys.readouterr()
    doc = json.loads(out.read_text())
    assert code == 0, captured.err[-2000:]
    assert doc["networks"] == 5 and doc["passed"] == 5 and doc["failures"] == 0
    assert [(r["hardware"], r["dtype"]) for r in doc["rows"]] == [
        ("host", "fp32"), ("snapdragon-865", "fp32"), ("snapdragon-865", "fp16"), ("host", "int8"),
        ("snapdragon-865", "int8")]
    assert doc["rows"][1]["blocks"] == ["grouped 3x3/1 g3 ->12 relu6", "shuffle g2"]
    assert all(r["steps"] >= 1 and r["worst_step_ratio"] <= 1 for r in doc["rows"])
    assert all(r["worst_step_ratio"] == 0 for r in doc["rows"] if r["dtype"] == "int8")   # byte for byte
    assert "5/5 networks verified" in captured.out and not (tmp_path / "saved").exists()


# Pooling attributes the families do not reach: ceil_mode, asymmetric pads, dilations (MaxPool), both
# count_include_pad values, windows that stick out past the padded image, kernels larger than the stride.
POOLS = (
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)),
    ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2])),
    ("MaxPool", dict(kernel_shape=[3, 2], strides=[1, 3], pads=[0, 1, 2, 1], dilations=[2, 1])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),
    # ceil mode whose last column window would start in the padding: dropped (ONNX's shape inference
    # keeps it: 5 columns, where the operator and onnxruntime give 4); the last with rows in ceil mode
    ("MaxPool", dict(kernel_shape=[2, 2], strides=[3, 3], pads=[0, 0, 1, 1], ceil_mode=1)),
    ("AveragePool", dict(kernel_shape=[2, 2], strides=[3, 3], pads=[0, 0, 1, 1], ceil_mode=1, count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[2, 2], strides=[3, 3], pads=[0, 0, 0, 1], ceil_mode=1, count_include_pad=0)),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=0)),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[2, 3], strides=[1, 2], pads=[1, 0, 0, 2], count_include_pad=1)),
    # 3-wide windows take three column loops: stride 1, stride 2 (above), any other stride or dilation
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], count_include_pad=0)),
    ("MaxPool", dict(kernel_shape=[2, 3], strides=[1, 2], pads=[0, 2, 0, 2], dilations=[1, 2])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 3], pads=[1, 1, 1, 1])),
    ("AveragePool", dict(kernel_shape=[5, 5], strides=[3, 3], pads=[2, 2, 2, 2], count_include_pad=0)),
)


@support.needs_onnxruntime
@pytest.mark.host
def test_pooling_matches_onnxruntime_on_every_attribute(tmp_path):
    """MaxPool and AveragePool in the runtime (templates/runtime/ops.c.j2: the row buffer padded with
    the identity, counts per row and column) against onnxruntime, one output per configuration, on
    ragged planes (13 x 11), two threads so that planes split. Max pooling must be exact."""
    import xfc
    import onnxruntime as ort
    b = nets.Builder(23)
    # a network needs one xfc kernel: a 1x1 convolution with identity weights passes x through exactly
    y = b.node("Conv", ["x", b.const(np.eye(5, dtype=np.float32).reshape(5, 5, 1, 1))])
    outputs = [b.node(op, [y], **attrs) for op, attrs in POOLS]
    model = b.model({"x": [2, 5, 13, 11]}, outputs, opset=13)
    net = xfc.compile_model(model, threads=2, out_dir=tmp_path / "net")
    x = np.random.default_rng(9).uniform(-3, 1, size=(2, 5, 13, 11)).astype(np.float32)   # mostly negative: max of pads
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = net(x)
    for (op, attrs), g, w in zip(POOLS, got, want):
        assert g.shape == w.shape, (op, attrs, g.shape, w.shape)
        if op == "MaxPool":
            assert np.array_equal(g, w), (op, attrs)
        else:
            assert np.max(np.abs(g - w)) <= 1e-6 * max(1.0, np.abs(w).max()), (op, attrs, np.max(np.abs(g - w)))
    net.close()


@support.needs_onnxruntime
@pytest.mark.host
def test_pooling_resize_and_channel_concat_split_rows_on_two_threads_and_match_onnxruntime(tmp_path):
    """Above the runtime's parallel minimum (32768 floats) pooling, a nearest resize and a channel
    concat of one image give each of two threads a share of every plane's rows (positions): ragged
    planes (67 x 65, 51 x 47) whose rows do not split evenly, a concat of 5 + 3 channels, a resize by 2
    whose second thread starts on a repeated row (102 rows: it may not copy the first thread's), a max
    and an average pool with padding, and pools to a single row (7 x 7 -> 1 x 1 and 7 x 7 -> 1 x 3 on
    1024 planes: fewer rows than threads, split by planes), against onnxruntime (all but the average
    pools exactly)."""
    import xfc
    import onnxruntime as ort
    b = nets.Builder(29)
    x5 = b.node("Conv", ["x", b.const(np.eye(5, dtype=np.float32).reshape(5, 5, 1, 1))])
    x3 = b.node("Conv", ["x", b.const(np.eye(5, dtype=np.float32)[:3].reshape(3, 5, 1, 1))])
    cat = b.node("Concat", [x5, x3], axis=1)
    mx = b.node("MaxPool", [cat], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    av = b.node("AveragePool", [cat], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], count_include_pad=0)
    small = b.node("Conv", ["s", b.const(np.eye(4, dtype=np.float32).reshape(4, 4, 1, 1))])
    up = b.node("Resize", [small, "", b.const(np.array([1, 1, 2, 2], np.float32), "scales")], mode="nearest")
    deep = b.node("Conv", ["g", b.const(np.eye(1024, dtype=np.float32).reshape(1024, 1024, 1, 1))])
    pooled = b.node("AveragePool", [deep], kernel_shape=[7, 7])
    strip = b.node("MaxPool", [deep], kernel_shape=[7, 3], strides=[1, 2])
    model = b.model({"x": [1, 5, 67, 65], "s": [1, 4, 51, 47], "g": [1, 1024, 7, 7]},
                    [cat, mx, av, up, pooled, strip], opset=13)
    net = xfc.compile_model(model, threads=2, out_dir=tmp_path / "net")
    rng = np.random.default_rng(4)
    feeds = {"x": rng.uniform(-3, 1, size=(1, 5, 67, 65)).astype(np.float32),
             "s": rng.uniform(-1, 1, size=(1, 4, 51, 47)).astype(np.float32),
             "g": rng.uniform(-1, 1, size=(1, 1024, 7, 7)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = net(feeds["x"], feeds["s"], feeds["g"])
    source = (tmp_path / "net" / f"{net.prefix}.c").read_text()
    net.close()
    assert 8 * 67 * 65 >= 32768 and 4 * 102 * 94 >= 32768 and 1024 * 7 * 7 >= 32768
    assert "xfc_rt_rows_or_planes(oh, planes" in source
    for name, g, w in zip(("concat", "maxpool", "avgpool", "resize", "avgpool to 1x1", "maxpool to 1x3"), got, want):
        assert g.shape == w.shape, (name, g.shape, w.shape)
        if name.startswith("avgpool"):
            assert np.max(np.abs(g - w)) <= 1e-6 * max(1.0, np.abs(w).max()), name
        else:
            assert np.array_equal(g, w), name


def _brute_max_pool(x, kernel, strides, dilations, pads, ceil_mode):
    """MaxPool by its definition, one window at a time (explicit pads [top, left, bottom, right])."""
    n, c, h, w = x.shape
    out = []
    for size, k, s, d, p0, p1 in zip((h, w), kernel, strides, dilations, pads[:2], pads[2:]):
        span = size + p0 + p1 - (k - 1) * d - 1
        o = (-(-span // s) if ceil_mode else span // s) + 1
        out.append(o - 1 if ceil_mode and (o - 1) * s >= size + p0 else o)
    y = np.empty((n, c, *out), x.dtype)
    for i in range(out[0]):
        for j in range(out[1]):
            rows = [i * strides[0] - pads[0] + a * dilations[0] for a in range(kernel[0])]
            cols = [j * strides[1] - pads[1] + b * dilations[1] for b in range(kernel[1])]
            rows, cols = [r for r in rows if 0 <= r < h], [q for q in cols if 0 <= q < w]
            y[:, :, i, j] = x[:, :, rows][:, :, :, cols].max(axis=(2, 3))
    return y


@pytest.mark.unit
@pytest.mark.parametrize("kernel,strides,dilations,pads,ceil_mode", [
    ((5, 4), (1, 1), (1, 1), (2, 1, 2, 2), 0),     # onnx.reference 1.23: 12 x 12 instead of 13 x 11
    ((3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1),
    ((3, 2), (1, 3), (2, 1), (0, 1, 2, 1), 0),
    ((2, 3), (3, 2), (1, 2), (1, 0, 0, 2), 1),
])
def test_the_max_pool_oracle_follows_the_operator(kernel, strides, dilations, pads, ceil_mode):
    """run_node's MaxPool (xfc/model/nodes.py, the oracle of --verify's per-step checks and of the int8
    network) against the operator's definition written out window by window, on a ragged plane."""
    from xfc.model.nodes import run_node
    x = np.random.default_rng(1).standard_normal((2, 3, 13, 11)).astype(np.float32)
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=list(kernel), strides=list(strides),
                            dilations=list(dilations), pads=list(pads), ceil_mode=ceil_mode)
    np.testing.assert_array_equal(run_node(node, {"x": x}, 13)[0], _brute_max_pool(x, kernel, strides, dilations,
                                                                                   pads, ceil_mode))


@pytest.mark.unit
def test_the_max_pool_oracle_lets_a_valid_ceil_window_reach_past_the_image():
    """auto_pad VALID with ceil_mode: 10 columns, 3-wide windows, stride 2 give 5 (onnxruntime and ONNX's
    inference), the last window reaching one column past the image (which never wins): the same as
    explicit end pads of 1 in floor mode. The oracle said 4 (review)."""
    from xfc.model.nodes import run_node
    x = np.random.default_rng(2).standard_normal((1, 2, 10, 10)).astype(np.float32)
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], auto_pad="VALID", ceil_mode=1)
    np.testing.assert_array_equal(run_node(node, {"x": x}, 13)[0],
                                  _brute_max_pool(x, (3, 3), (2, 2), (1, 1), (0, 0, 1, 1), 0))


@support.needs_onnxruntime
@pytest.mark.host
def test_kernels_share_one_scratch_and_leave_nothing_another_relies_on(tmp_path):
    """Every kernel of a network packs and stages into the runtime's per-thread scratch (one set of
    buffers, still in cache from the layer before). A 3x3 stride-2 convolution (staged image), a
    depthwise one (staged rows whose padding it zeroes), pointwise ones (packed panels) and a 3x3
    stride-1 one, called with one input, another and the first again, two threads: each output
    equal to onnxruntime's (a kernel that relied on what it left in its own buffers last call would
    find another kernel's data there)."""
    import xfc
    import onnxruntime as ort
    b = nets.Builder(31)
    y = b.relu6(b.conv("x", 3, 24, k=3, stride=2, pad=1))
    y = nets.mobilenet_block(b, y, 24, 4, 32, stride=1, prefix="b1")
    y = b.relu6(b.conv(y, 32, 32, k=3, stride=1, pad=1))
    y = nets.mobilenet_block(b, y, 32, 3, 40, stride=2, prefix="b2")
    model = b.model({"x": [1, 3, 38, 30]}, [y])
    net = xfc.compile_model(model, threads=2, out_dir=tmp_path / "net")
    sources = [p.read_text() for p in (tmp_path / "net").rglob("*.c") if "_k" in p.name]
    assert sources and all(f"extern __thread void *{net.prefix}_scratch_ptr" in s for s in sources)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    first, second = (rng.uniform(-1, 1, size=(1, 3, 38, 30)).astype(np.float32) for _ in range(2))
    for x in (first, second, first):
        want, = session.run(None, {"x": x})
        got = net(x)
        assert got.shape == want.shape and np.max(np.abs(got - want)) <= 1e-4 * max(1.0, np.abs(want).max())
    net.close()


@pytest.mark.host
def test_small_steps_run_on_one_thread_only_when_the_team_sleeps(tmp_path, monkeypatch):
    """Steps under 1 MFLOP (a 7x7 depthwise, squeeze-excitation's fully connected layers) are split
    across the team like every other step while its threads spin (a region costs under a
    microsecond), and run on the calling thread when OMP_WAIT_POLICY says passive, read at create
    (every region would wake sleeping threads). The network's own parser of the variable, compiled
    from the emitted source, against what libgomp accepts; each serial switch guarded by what create
    read; both paths, two threads, equal onnxruntime."""
    import subprocess
    import xfc
    import onnxruntime as ort
    b = nets.Builder(7)
    y = b.relu6(b.conv("x", 3, 16, k=3, stride=2, pad=1))
    y = nets.mobilenet_block(b, y, 16, 3, 24, stride=1, prefix="b1")
    y = nets.mobilenet_block(b, y, 24, 2, 24, stride=2, prefix="b2")
    model = b.model({"x": [1, 3, 17, 15]}, [y])
    x = np.random.default_rng(5).uniform(-1, 1, size=(1, 3, 17, 15)).astype(np.float32)
    want, = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for policy in (None, "passive"):
        if policy is None:
            monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
        else:
            monkeypatch.setenv("OMP_WAIT_POLICY", policy)
        net = xfc.compile_model(model, threads=2, out_dir=tmp_path / f"net_{policy}")
        for _ in range(2):
            got = net(x)
            assert got.shape == want.shape and np.max(np.abs(got - want)) <= 1e-4 * max(1.0, np.abs(want).max())
        network_c = (tmp_path / f"net_{policy}" / f"{net.prefix}.c").read_text()
        net.close()
    serial = network_c.count("FLOPs: waking a sleeping team would cost more")
    assert serial >= 3 and network_c.count("if (net->sleeping_team)") == serial
    assert "net->sleeping_team = xfc_wait_policy_passive(getenv(\"OMP_WAIT_POLICY\"));" in network_c
    start = network_c.index("static int xfc_wait_policy_passive")
    parser = network_c[start:network_c.index("\n}\n", start) + 3]
    cases = {"passive": 1, "PASSIVE": 1, " Passive\n": 1, "\tpassive\r\n": 1, "active": 0, "": 0,
             "passivex": 0, "pass": 0, "passive x": 0}
    driver = tmp_path / "policy.c"
    driver.write_text("#include <ctype.h>\n#include <stdio.h>\n" + parser + "\nint main(int argc, char **argv)\n{\n"
                      "    for (int i = 1; i < argc; i++) printf(\"%d\", xfc_wait_policy_passive(argv[i]));\n"
                      "    printf(\"%d\\n\", xfc_wait_policy_passive(NULL));\n    return 0;\n}\n")
    subprocess.run(["gcc", "-O1", "-Wall", "-Werror", str(driver), "-o", str(tmp_path / "policy")], check=True)
    out = subprocess.run([str(tmp_path / "policy"), *cases], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "".join(str(v) for v in cases.values()) + "0"


@pytest.mark.unit
def test_a_step_whose_shape_the_reference_disagrees_with_fails_in_one_line(tmp_path):
    """When the loader's shape for a step's output and what the operator computes differ (the ceil-mode
    pooling shapes of issue 32 were such a case), the step fails verification with both shapes (the
    outputs and report are kept; --verify exits 4 naming the step), instead of numpy's reshape error;
    a shape that differs only in size-1 axes is the same tensor."""
    from xfc.errors import VerificationError
    from xfc.model.pipeline import raise_if_unverified
    from xfc.model.runtime.check import ShapeMismatch, StepCheck, _as_step_shape, _Walk
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3, 3])
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], name="pool")
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    low = lowered(tmp_path, "pool", model)
    program = low.program
    step = next(s for s in program.steps if getattr(s, "op", None) == "maxpool")
    program.shapes[step.outputs[0]] = (1, 2, 3, 2)      # what a wrong shape inference would have said
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 2, 6, 6)).astype(np.float32)}
    walk = _Walk(program, low.folded_loaded.opset, feeds, low.folded_loaded.constants, {})
    with pytest.raises(ShapeMismatch, match=r"\[1, 2, 3, 3\].*\[1, 2, 3, 2\]"):
        walk.op(step, [np.zeros((1, 2, 3, 2), np.float32)])
    with pytest.raises(ShapeMismatch):
        _as_step_shape(np.zeros((1, 2, 2, 3)), (1, 2, 3, 2), "'y'")     # same size, other tensor
    assert _as_step_shape(np.zeros((2, 3)), (1, 2, 1, 3), "'y'").shape == (1, 2, 1, 3)
    bad = StepCheck(3, "pool", "MaxPool", float("inf"), float("inf"), "shape mismatch ('y': ...)")
    report = {"model": "m", "hardware": "host", "output_dir": "out",
              "verification": {"verified": False, "outputs": [], "layers_failed": ["3:pool"],
                               "steps": [{**bad.__dict__, "ok": False}]}}
    with pytest.raises(VerificationError, match=r"step 3 \(pool\): shape mismatch.*outputs kept in out"):
        raise_if_unverified(report)
