"""`xfc model --bench` on the host: every covered layer timed (weights pre-packed), onnxruntime's
per-node profiler times matched to the layers (fused and NCHWc-rewritten nodes too), the sums.
No speed is asserted: the figures only have to exist, be positive and add up."""
from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from support import needs_onnxruntime, nets

from xfc.cli import main
from xfc.model.bench import ProfiledNode, fused_away, match_profiled
from xfc.model.load import load_model
from xfc.model.mapping import map_network


def save(model, directory: Path, name: str) -> Path:
    path = directory / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


@pytest.mark.unit
def test_profiled_nodes_are_matched_to_layers_through_onnxruntime_rewrites(tmp_path):
    net = map_network(load_model(save(nets.mlp_net(), tmp_path, "mlp")))
    fc2 = next(layer for layer in net.layers if layer.name == "fc2")
    node = lambda name, op="Gemm": ProfiledNode(name=name, op_type=op, median_s=1e-6)   # noqa: E731
    profiled = [node("fused fc1", "FusedGemm"), node("fc2"), node("clip2", "Clip"),
                node("fc3/MatMulAddFusion", "FusedGemm"), node(f"{fc2.output}_nchwc", "Conv"),
                node("ReorderOutput_token_3", "ReorderOutput"), node("somewhere/else")]
    per_layer, unmatched = match_profiled(net, profiled)
    assert [n.name for n in per_layer["fc1"]] == ["fused fc1"]
    # the Clip xfc fused into fc2 (onnxruntime ran it apart) and a node named after fc2's output tensor
    assert [n.name for n in per_layer["fc2"]] == ["fc2", "clip2", f"{fc2.output}_nchwc"]
    assert [n.name for n in per_layer["fc3"]] == ["fc3/MatMulAddFusion"]
    assert [n.name for n in unmatched] == ["ReorderOutput_token_3", "somewhere/else"]


@pytest.mark.unit
def test_uncovered_nodes_missing_from_the_profile_are_reported_as_fused_away(tmp_path):
    net = map_network(load_model(save(nets.resnet_net(blocks=1), tmp_path, "resnet")))
    add = next(u for u in net.uncovered if u.name == "rb0_add")
    profiled = [ProfiledNode(name=n, op_type="?", median_s=1e-6)
                for n in ("maxpool", f"{add.node.output[0]}_nchwc", "rb1_add", "pool", "flatten")]
    # rb0_add seen through its output tensor; the Relus after the Adds never appear
    assert fused_away(net, profiled) == ("rb0_relu2", "rb1_relu2")


@pytest.mark.unit
def test_nodes_the_model_leaves_unnamed_match_by_the_name_onnxruntime_gives_them(tmp_path):
    """An exporter that names no node: onnxruntime profiles them as '<op type>_<graph index>'. The
    classifier matched no layer, and the unnamed pooling and Flatten were reported both as
    unmatched and as fused away."""
    model = nets.mobilenet_net(blocks=1)
    for node in model.graph.node:
        node.name = ""
    net = map_network(load_model(save(model, tmp_path, "unnamed")))
    ops = [n.op_type for n in model.graph.node]
    classifier, pool, flatten = (f"{op}_{ops.index(op)}" for op in ("Gemm", "GlobalAveragePool", "Flatten"))
    profiled = [ProfiledNode(name=n, op_type=n.split("_")[0], median_s=1e-6) for n in (classifier, pool, flatten)]
    per_layer, unmatched = match_profiled(net, profiled)
    assert [n.name for nodes in per_layer.values() for n in nodes] == [classifier]
    assert [n.name for n in unmatched] == [pool, flatten]
    assert pool not in fused_away(net, profiled) and flatten not in fused_away(net, profiled)


@pytest.mark.host
@pytest.mark.parametrize("name, builder", [("resnet", lambda: nets.resnet_net(blocks=1, hw=9)),
                                           ("odd", nets.odd_net)])            # odd: a MatMul with B not constant
@needs_onnxruntime
def test_bench_times_layers_and_matches_onnxruntime(tmp_path, capsys, name, builder):
    out_dir = tmp_path / "out"
    code = main(["model", str(save(builder(), tmp_path, name)), "--hw", "host", "--bench", "--threads", "1",
                 "--repeat", "3", "--json", "-o", str(out_dir)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    bench = report["bench"]
    assert bench["threads"] == 1 and bench["repeats"] == 3 and "1 intra-op thread" in bench["onnxruntime"]
    assert "pre-packed" in bench["xfc_measured_on"] and "noisy" in bench["note"]
    layers = report["layers"]
    assert all(layer["measured_seconds"] > 0 for layer in layers)
    assert bench["xfc_covered_seconds"] == pytest.approx(sum(layer["measured_seconds"] for layer in layers))
    matched = [layer for layer in layers if layer["onnxruntime_seconds"] is not None]
    assert bench["layers_matched"] == len(matched) and bench["layers"] == len(layers)
    assert bench["onnxruntime_matched_seconds"] == pytest.approx(sum(layer["onnxruntime_seconds"] for layer in matched))
    assert all(layer["onnxruntime_seconds"] > 0 and layer["onnxruntime_nodes"] for layer in matched)
    # Identical shapes share a kernel, hence a time.
    by_kernel = {}
    for layer in layers:
        by_kernel.setdefault(layer["kernel"], set()).add(layer["measured_seconds"])
    assert all(len(times) == 1 for times in by_kernel.values())
    if name == "resnet":
        # Every conv (BatchNormalization folded by both) and the Gemm are found in onnxruntime's profile.
        assert len(matched) == len(layers)
        assert {n["op"] for n in bench["onnxruntime_unmatched"]} >= {"MaxPool"}
    assert json.loads((out_dir / "report.json").read_text())["bench"] == bench


@pytest.mark.unit
@pytest.mark.parametrize("argv, fragment", [
    (["--hw", "snapdragon-865", "--bench"], "--bench times host kernels"),
    (["--hw", "host", "--bench", "--repeat", "0"], "--repeat must be >= 1"),
])
def test_bench_bad_requests_exit_2(tmp_path, capsys, argv, fragment):
    code = main(["model", str(save(nets.mlp_net(), tmp_path, "mlp")), *argv, "-o", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("xfc: error:") == 1 and fragment in err and not (tmp_path / "o").exists()


@pytest.mark.host
@needs_onnxruntime
def test_unnamed_nodes_after_a_constant_match_onnxruntimes_own_profile(tmp_path):
    """onnxruntime numbers unnamed nodes after it turns Constant nodes into initializers: a Constant
    ahead of them shifted every index by one, and the classifier matched no layer (or another's time)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from xfc.model.bench import profile_onnxruntime
    from xfc.model.run import make_feeds
    rng = np.random.default_rng(3)
    init = lambda name, *shape: numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)  # noqa: E731
    nodes = [helper.make_node("Constant", [], ["shape"], value=numpy_helper.from_array(np.array([1, 4], np.int64))),
             helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Reshape", ["p", "shape"], ["f"]),
             helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "unnamed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
                              [init("w", 4, 3, 3, 3), init("b", 4), init("fc_w", 5, 4), init("fc_b", 5)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    net = map_network(load_model(save(model, tmp_path, "unnamed_const")))
    profiled, _ = profile_onnxruntime(net, make_feeds(net, 0), threads=1, repeats=2, warmup=1)
    per_layer, unmatched = match_profiled(net, profiled)
    gemm = next(layer.name for layer in net.layers if layer.op_type == "Gemm")
    assert [n.op_type for n in per_layer.get(gemm, [])] == ["Gemm"], (per_layer, unmatched)
    conv = next(layer.name for layer in net.layers if layer.op_type.startswith("Conv"))
    assert conv in per_layer, (per_layer, unmatched)
