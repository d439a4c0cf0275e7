"""xfc.compile / xfc.pipeline: the Python API the README documents, without any CLI module."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from support import nets

import xfc
from xfc.errors import OperatorError, VerificationError, XfcError
from xfc.ops.reference import check_output, make_inputs

pytestmark = pytest.mark.host


@pytest.mark.parametrize("op,shape,kw", [
    ("matmul", dict(m=37, n=29, k=19), dict(bias=True, activation="relu")),        # ragged in m, n and k
    ("conv2d", dict(c=5, h=11, w=13, k=7, r=3, s=3), dict(pad=1, stride=2)),
    ("depthwise", dict(c=6, h=10, w=19, r=3, s=3), dict(pad=1, bias=True, activation="relu6")),
])
def test_compile_on_host_is_callable_and_correct(op, shape, kw, tmp_path):
    spec = xfc.make_spec(op, shape, **kw)
    kernel = xfc.compile(spec, xfc.load_hardware("host"), threads=1)
    assert isinstance(kernel, xfc.Kernel) and kernel.plan == xfc.synthesize(spec, xfc.load_hardware("host"),
                                                                               threads=1).plan
    a, b, bias = make_inputs(spec, 3)
    out = kernel(a, b, bias)
    assert out.shape == spec.output_shape
    verdict = check_output(spec, out, a, b, bias)
    assert verdict.ok, verdict.reason


def test_specs_and_kernels_agree_on_the_bias():
    """Issue 35 item 3: the README's spec without a bias listed a bias input and its kernel took one and
    ignored it (0.97 off a reference that added it); a kernel with a bias called without one used zeros.
    Now the inputs a spec lists are the ones its kernel takes, and either mistake is one clear error."""
    hw = xfc.load_hardware("host")
    plain = xfc.make_spec("matmul", dict(m=8, n=9, k=10))
    biased = xfc.make_spec("matmul", dict(m=8, n=9, k=10), bias=True)
    assert plain.input_shapes == ((1, 8, 10), (1, 10, 9)) and biased.input_shapes[2] == (9,)
    a, b, none = make_inputs(plain)
    assert none is None
    kernel = xfc.compile(plain, hw, threads=1)
    assert check_output(plain, kernel(a, b), a, b, None).ok
    # A wrong shape is the caller's input (OperatorError, exit 2), not a wrong result (VerificationError, 4).
    with pytest.raises(OperatorError, match=r"in0 has shape \(1, 8, 9\), expected \(1, 8, 10\)") as err:
        kernel(a[..., :-1], b)
    assert not isinstance(err.value, VerificationError)
    with pytest.raises(XfcError, match="has no bias .* would be ignored"):
        kernel(a, b, np.ones(9, np.float32))
    with_bias = xfc.compile(biased, hw, threads=1)
    a, b, bias = make_inputs(biased)
    assert check_output(biased, with_bias(a, b, bias), a, b, bias).ok
    with pytest.raises(XfcError, match=r"adds a bias .* pass bias, shape \(9,\)"):
        with_bias(a, b)
    packed = with_bias.host.prepack(b)
    with pytest.raises(XfcError, match="adds a bias"):
        with_bias.host.run_packed(a, packed)


def test_network_only_epilogues_are_refused_outside_the_network_runtime():
    """A residual epilogue adds what the output buffer holds on entry: a single kernel called from
    Python would add garbage, so xfc.compile refuses it in one line; int8 kernels fuse only bias
    and relu / relu6, so an int8 plan with a network activation is refused instead of built without it."""
    from xfc.ops.quant import QuantParams
    from xfc.pipeline.synth import plan_cpu
    hw = xfc.load_hardware("host")
    residual = xfc.make_spec("matmul", dict(m=8, n=9, k=10), residual=True)
    with pytest.raises(OperatorError, match="residual epilogue .* only the network runtime"):
        xfc.compile(residual, hw, threads=1)
    swish = xfc.make_spec("conv2d", dict(c=8, h=6, w=6, k=8, r=1, s=1), activation="hardswish")
    with pytest.raises(OperatorError, match="int8: epilogue 'hardswish' has no int8 kernels"):
        plan_cpu(swish, hw, "int8", threads=1, quant=QuantParams())


def test_compile_for_arm_needs_out_dir_and_is_not_callable(tmp_path):
    import shutil
    if shutil.which("aarch64-linux-gnu-gcc") is None:
        pytest.skip("aarch64-linux-gnu-gcc not installed")
    spec = xfc.make_spec("matmul", dict(m=9, n=10, k=11))
    hw = xfc.load_hardware("cortex-a76")
    with pytest.raises(XfcError, match="pass out_dir"):
        xfc.compile(spec, hw)
    kernel = xfc.compile(spec, hw, out_dir=tmp_path)
    assert kernel.files["binary"].exists() and kernel.plan.isa == "neon"
    with pytest.raises(XfcError, match="aarch64 binary"):
        kernel(*make_inputs(spec, 0))


def test_compile_into_a_users_directory_never_overwrites_their_files(tmp_path):
    """xfc.compile(out_dir=...) follows the output-ownership rules of the command line."""
    from xfc.outputs import OutputError
    spec = xfc.make_spec("matmul", dict(m=5, n=6, k=7))
    theirs = tmp_path / "mine"
    theirs.mkdir()
    (theirs / "xfc_matmul.c").write_text("/* my own file */\n")
    with pytest.raises(OutputError, match="choose another out_dir, .* or pass force=True"):
        xfc.compile(spec, xfc.load_hardware("host"), threads=1, out_dir=theirs)
    assert (theirs / "xfc_matmul.c").read_text() == "/* my own file */\n"
    assert sorted(p.name for p in theirs.iterdir()) == ["xfc_matmul.c"]
    beside = tmp_path / "notes"
    beside.mkdir()
    (beside / "notes.txt").write_text("mine\n")
    kernel = xfc.compile(spec, xfc.load_hardware("host"), threads=1, out_dir=beside, force=True)
    assert (beside / "notes.txt").read_text() == "mine\n" and (beside / "xfc_matmul.c").exists()
    ours = tmp_path / "ours"
    kernel = xfc.compile(spec, xfc.load_hardware("host"), threads=1, out_dir=ours)
    a, b, bias = make_inputs(spec, 0)
    assert check_output(spec, kernel(a, b, bias), a, b, bias)[0]
    assert (ours / ".xfc-output").exists() and (ours / "xfc_matmul.c").exists()


@pytest.mark.parametrize("hw_name", ["host", pytest.param("cortex-a76", marks=pytest.mark.emulated)])
def test_run_cpu_returns_one_report_with_measurements(hw_name, tmp_path):
    """pipeline.run_synth -> Report: typed fields for code, to_dict() for report.json / --json; the
    two Measurements say where they were taken (qemu: emulated, never phone timing)."""
    import dataclasses
    import json
    import shutil

    from xfc.pipeline import Report, run_synth
    if hw_name != "host" and shutil.which("qemu-aarch64") is None:
        pytest.skip("qemu-aarch64 not installed")
    spec = xfc.make_spec("matmul", dict(m=21, n=19, k=13), bias=True, activation="relu")
    hw = xfc.load_hardware(hw_name)
    report = run_synth(spec, hw, tmp_path / "out", threads=1, verify=True, bench=True, repeat=2)
    assert isinstance(report, Report) and report.target == "cpu" and report.operator == "matmul"
    # the host's name says when XFC_HOST_ISA made it look smaller ('host:avx2')
    assert report.hardware == hw.name and hw.name.split(":")[0] == hw_name
    assert report.verified is True and report.failure is None
    m, p = report.measurement, report.per_call
    assert len(m.samples_s) == 2 and len(p.samples_s) == 2 and m.flops == p.flops == spec.flops
    if hw_name == "host":
        assert (m.where, p.where, m.emulated) == ("host (weights pre-packed)", "host", False)
    else:
        assert m.emulated and p.emulated and "qemu-aarch64 -cpu cortex-a76 (emulated: not phone timing)" == m.where
    for out in (m.output, p.output):
        assert check_output(spec, out, *make_inputs(spec, 0)).ok
    data = report.to_dict()
    on_disk = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data == {**on_disk, "output_dir": str(tmp_path / "out")}
    assert data["measurement"]["median_s"] == m.median_s and data["measurement"]["where"] == m.where
    assert data["measurement_packing_per_call"]["gflops"] == p.gflops and data["verified"] is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.verified = False
    with pytest.raises(TypeError):
        report.keys["verified"] = False


@pytest.mark.host
@pytest.mark.emulated
@pytest.mark.opencl
def test_every_report_starts_with_the_same_keys(tmp_path):
    """One report schema: `xfc synth` (CPU and GPU) and `xfc bench` reports start with
    pipeline.REPORT_CORE_KEYS, in order, with the same types; target-specific keys follow."""
    import shutil

    from xfc.pipeline import REPORT_CORE_KEYS, REPORT_SCHEMA_VERSION, run_bench, run_synth, run_gpu_synth
    from xfc.runners import get_runner
    if shutil.which("qemu-aarch64") is None:
        pytest.skip("qemu-aarch64 not installed")
    spec = xfc.make_spec("matmul", dict(m=13, n=11, k=7), bias=True)
    reports = {
        "synth cpu": run_synth(spec, xfc.load_hardware("host"), tmp_path / "cpu", threads=1, verify=True, bench=True,
                             repeat=2).to_dict(),
        "synth gpu": run_gpu_synth(spec, xfc.load_hardware("snapdragon-865"), tmp_path / "gpu", bench=True,
                                   repeat=2).to_dict(),
        "bench cpu": run_bench(spec, xfc.load_hardware("cortex-a76"), get_runner("qemu", qemu_cpu="cortex-a76"),
                               threads=1, repeat=2, warmup=0).to_dict(),
    }
    for name, report in reports.items():
        command, target = name.split()
        assert tuple(report)[:len(REPORT_CORE_KEYS)] == REPORT_CORE_KEYS, name
        assert (report["xfc_report"], report["command"], report["target"]) == (REPORT_SCHEMA_VERSION, command, target)
        assert report["operator"] == "matmul" and report["shape"] == spec.describe(), name
        assert isinstance(report["tiles"], dict) and report["predicted_gflops"] > 0, name
        assert report["verified"] is True and report["failure"] is None, name
        assert 0 <= report["error_to_bound_ratio"] <= 1 and report["max_abs_error"] >= 0, name
        m = report["measurement"]
        assert m["repeats"] == 2 and len(m["samples_s"]) == 2 and m["median_s"] > 0 and m["gflops"] > 0, name
        assert isinstance(m["where"], str) and isinstance(m["emulated"], bool), name
    assert not reports["synth cpu"]["measurement"]["emulated"]
    assert reports["synth gpu"]["measurement"]["emulated"] and reports["bench cpu"]["measurement"]["emulated"]


def test_python_api_sees_the_machine_and_the_tile_db_as_the_command_line(tmp_path, capsys):
    """Issue 31 item 6: xfc.load_hardware("host") is the probed description `xfc hw show host` prints
    (it was the assumed one: 166 vs 118 GFLOP/s per core on one machine), and one request gives one
    plan from xfc.compile and from `xfc synth`, tile database included (both default to auto)."""
    import json
    from xfc.cli import main
    from xfc.cli.main import hardware_summary
    xfc.load_hardware("host")      # the probe once first: run alone, the first load says "just now", the next "cached"
    assert main(["hw", "show", "host", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert json.loads(json.dumps(hardware_summary(xfc.load_hardware("host")), default=list)) == shown
    spec = xfc.make_spec("conv2d", dict(c=24, h=17, w=17, k=40, r=3, s=3), pad=1, bias=True, activation="relu")
    assert main(["synth", "conv2d", "--hw", "host", "--shape", "c=24,h=17,w=17,k=40,r=3,s=3", "--pad", "1", "--bias",
                 "--activation", "relu", "--threads", "1", "--json", "-o", str(tmp_path / "cli")]) == 0
    report = json.loads(capsys.readouterr().out)
    kernel = xfc.compile(spec, xfc.load_hardware("host"), threads=1)
    ours = kernel.synthesis.report()
    for key in ("lowering", "isa", "tiles", "code_shape", "winograd_m", "predicted_seconds"):
        assert ours.get(key) == report.get(key), key
    assert report["tile_db"]["choice"] == "auto"
    assert xfc.synthesize(spec, xfc.load_hardware("host"), threads=1, tile_db="off").plan.spec == spec


def _readme_python_block() -> str:
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    start = text.index("```python\n", text.index("### Python API")) + len("```python\n")
    return text[start:text.index("\n```", start)]


@pytest.mark.emulated
def test_the_readme_python_block_runs_as_printed(tmp_path, monkeypatch):
    """The README's Python API block, run as printed in a fresh directory (a newcomer's first try
    failed on it: a spec without a bias unpacked into three inputs). Its model file is a small
    MobileNetV2-style network saved under the name the block uses, with the input shape it feeds."""
    import onnx
    from support.nets import mobilenet_net
    monkeypatch.chdir(tmp_path)
    onnx.save(mobilenet_net(blocks=1, c=8, hw=224), str(tmp_path / "mobilenet_v2.onnx"))
    scope: dict = {}
    exec(compile(_readme_python_block(), "README.md (Python API)", "exec"), scope)
    spec, out, x, w, bias = (scope[k] for k in ("spec", "out", "x", "w", "bias"))
    assert out.shape == spec.output_shape and check_output(spec, out, x, w, bias).ok
    assert scope["logits"].shape == (1, 10) and np.isfinite(scope["logits"]).all()
    assert scope["report"].verified is True and scope["arm"].files["binary"].is_file()


# ---------------------------------------------------------------------------------------------
# xfc.compile_model's arguments: checked in Python's terms, never a command-line flag
# ---------------------------------------------------------------------------------------------

def small_net(dynamic: bool = False):
    """One 3x3 convolution and a Relu on x (1, 3, 6, 6); dynamic: batch and height are named dims."""
    b = nets.Builder(5)
    y = b.node("Relu", [b.conv("x", 3, 4, name="conv")], name="relu")
    model = b.model({"x": [1, 3, 6, 6]}, [y])
    if dynamic:
        dims = model.graph.input[0].type.tensor_type.shape.dim
        dims[0].dim_param, dims[2].dim_param = "batch", "height"
        for d in model.graph.output[0].type.tensor_type.shape.dim:
            d.dim_param = "o"
    return model


def described_host():
    from xfc.hardware.load import load
    return load("host")     # the described host: no probe process, so these stay unit tests


def assert_python_terms(text: str, *needles: str) -> None:
    assert "\n" not in text and "--" not in text and "-o " not in text, text
    for needle in needles:
        assert needle in text, text


@pytest.mark.unit
@pytest.mark.parametrize("kwargs, needles", [
    (dict(threads=0), ["threads=0", "positive integer"]),
    (dict(threads=1.5), ["threads=1.5", "positive integer"]),
    (dict(input_shapes={"x": "1x3x6x6"}), ["input_shapes['x']", "not a string", "write (1, 3, 6, 6)"]),
    (dict(input_shapes={"x": (1, 3, 0, 6)}), ["input_shapes['x'] is (1, 3, 0, 6)", "dimensions must be positive"]),
    (dict(input_shapes={"x": 6}), ["input_shapes['x'] is 6", "sequence of positive ints"]),
    (dict(input_shapes={"x": (1, 3, 6.0, 6)}), ["input_shapes['x']", "sequence of positive ints"]),
    (dict(input_shapes=[("x", (1, 3, 6, 6))]), ["input_shapes must be a dict", "got list"]),
    (dict(input_shapes={"y": (1, 3, 6, 6)}), ["input_shapes:", "has no input 'y'", "inputs: x"]),
    (dict(input_shapes={"x": (1, 3, 6)}), ["input_shapes['x'] = (1, 3, 6)", "rank 4, not 3"]),
])
def test_compile_model_names_a_bad_argument_as_its_python_parameter(kwargs, needles):
    with pytest.raises(OperatorError) as err:
        xfc.compile_model(small_net(dynamic=True), described_host(), **kwargs)
    assert_python_terms(str(err.value), *needles)


@pytest.mark.unit
def test_compile_and_synthesize_name_threads_as_their_parameter():
    spec = xfc.make_spec("matmul", dict(m=5, n=6, k=7))
    for call in (xfc.compile, xfc.synthesize):
        for threads, needle in ((0, "threads=0: must be a positive integer"), (True, "threads=True"),
                                (10 ** 6, "threads=1000000: more than the")):
            with pytest.raises(OperatorError) as err:
                call(spec, described_host(), threads=threads)
            assert_python_terms(str(err.value), needle)


@pytest.mark.unit
def test_compile_model_suggests_input_shapes_that_work_when_pasted(tmp_path):
    """The dynamic-shape error suggests input_shapes={...} (the command line's --input-shape is no
    Python argument); the suggested dict, read back, loads the model."""
    from xfc.model.load import API_SHAPES, load_model
    model = small_net(dynamic=True)
    with pytest.raises(OperatorError) as err:
        xfc.compile_model(model, described_host())
    text = str(err.value)
    assert_python_terms(text, "input 'x' has a dynamic shape", "fix it with input_shapes={'x': (1, 3, ")
    suggested = ast.literal_eval(re.search(r"input_shapes=(\{.*?\})", text).group(1))
    path = tmp_path / "net.onnx"
    path.write_bytes(model.SerializeToString())
    loaded = load_model(path, suggested, API_SHAPES)
    assert [(name, shape) for name, shape, _ in loaded.inputs] == [("x", suggested["x"])]


@pytest.mark.unit
def test_compile_model_names_an_in_memory_model_by_its_graph_and_leaves_it_unchanged():
    """A ModelProto is loaded as it is: messages name it by its graph, never by a temporary file
    the user never made, and fixing its input shapes does not change the caller's proto."""
    model = small_net(dynamic=True)
    model.graph.name = "tiny"
    before = model.SerializeToString()
    with pytest.raises(OperatorError) as err:
        xfc.compile_model(model, described_host())
    assert_python_terms(str(err.value), "onnx.ModelProto (graph 'tiny'): input 'x' has a dynamic shape")
    assert "/tmp" not in str(err.value) and ".onnx" not in str(err.value)
    from xfc.model.load import API_SHAPES, load_model
    loaded = load_model(model, {"x": (1, 3, 6, 6)}, API_SHAPES)
    assert loaded.path == "onnx.ModelProto (graph 'tiny')" and loaded.inputs[0][1] == (1, 3, 6, 6)
    assert model.SerializeToString() == before
    for wrong in (5, model.graph):
        with pytest.raises(OperatorError) as err:
            xfc.compile_model(wrong, described_host())
        assert_python_terms(str(err.value), "model must be an ONNX file path or an onnx.ModelProto, got ")


@pytest.mark.unit
def test_compile_model_into_a_users_directory_names_out_dir_and_force(tmp_path):
    from xfc.outputs import OutputError
    theirs = tmp_path / "mine"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine\n")
    with pytest.raises(OutputError) as err:
        xfc.compile_model(small_net(), described_host(), threads=1, out_dir=theirs)
    assert_python_terms(str(err.value), f"out_dir {theirs}", "choose another out_dir", "pass force=True")
    assert sorted(p.name for p in theirs.iterdir()) == ["notes.txt"]


@pytest.mark.host
def test_compile_model_with_force_writes_beside_a_users_files(tmp_path):
    theirs = tmp_path / "mine"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine\n")
    net = xfc.compile_model(small_net(), described_host(), threads=1, out_dir=theirs, force=True)
    x = np.random.default_rng(1).uniform(-1, 1, size=(1, 3, 6, 6)).astype(np.float32)
    assert net(x).shape == (1, 4, 6, 6)
    assert (theirs / "notes.txt").read_text() == "mine\n" and (theirs / f"lib{net.prefix}.so").is_file()
    with pytest.raises(OperatorError, match=r"input 'x' has shape \(1, 3, 6, 5\), expected \(1, 3, 6, 6\)"):
        net(x[..., :5])
    net.close()
