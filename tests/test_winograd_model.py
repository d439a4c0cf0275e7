"""Whole networks with Winograd layers (issue 19): `xfc model` lets the synthesizer pick Winograd
plans for 3x3 stride-1 convolutions, and the network error bound carries them with the Winograd
magnitude (bounds.winograd_layer_bound). Unit: the layer rule against the numpy Winograd model in
fp32 with perturbed inputs; host: a small network verified against onnxruntime."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from support import needs_onnxruntime, nets
from xfc.cli import main
from xfc.model import bounds as B
from xfc.ops.reference import make_inputs, reference
from xfc.ops.spec import make_spec
from xfc.ops.winograd import winograd_conv, winograd_error_bound


@pytest.mark.unit
@pytest.mark.parametrize("m", (2, 4, 6))
def test_the_winograd_layer_rule_holds_for_fp32_winograd_with_perturbed_inputs(m):
    spec = make_spec("conv2d", dict(n=1, c=19, h=11, w=13, k=7, r=3, s=3), pad=(1, 0, 2, 1), bias=True)
    plain = make_spec("conv2d", dict(n=1, c=19, h=11, w=13, k=7, r=3, s=3), pad=(1, 0, 2, 1))
    x_exact, w, bias = make_inputs(spec, seed=5)
    # the layer's input arrives with an error of up to e_x (an upstream layer's bound)
    rng = np.random.default_rng(3)
    e_x = np.full(x_exact.shape, 1e-4)
    x_got = (x_exact + rng.uniform(-1, 1, x_exact.shape) * e_x).astype(np.float32)
    y_exact = reference(spec, x_exact.astype(np.float64), w.astype(np.float64), bias.astype(np.float64))
    y_got = winograd_conv(spec, x_got, w, bias, m, dtype=np.float32)
    bound = B.layer_bound(spec, x_got, e_x, w, B.ZERO, np.abs(bias), 0, winograd_m=m)
    assert np.all(np.abs(y_got - y_exact) <= bound)
    # with no incoming error it is the Winograd verification bound (not the direct rule's)
    local = B.layer_bound(spec, x_got, B.ZERO, w, B.ZERO, np.abs(bias), 0, winograd_m=m)
    np.testing.assert_allclose(local, winograd_error_bound(spec, x_got, w, bias, m), rtol=1e-12)
    direct = B.layer_bound(spec, x_got, B.ZERO, w, B.ZERO, np.abs(bias), 0)
    assert not np.allclose(local, direct, rtol=1e-3)
    # the carried part is the direct rule's: the bound grows by at least |W| e_x
    carried = reference(plain, e_x, np.abs(w.astype(np.float64)), np.zeros(7))
    assert np.all(bound - local >= carried * 0.999)


def _winograd_net() -> onnx.ModelProto:
    """Two 3x3 stride-1 convolutions the host's static model lowers to Winograd (checked by the
    test), with a folded BatchNormalization, ReLU and ReLU6, then a classifier."""
    b = nets.Builder(11)
    t = b.node("Relu", [b.bn(b.conv("x", 24, 40, k=3, stride=1, pad=1, bias=False, name="c1"), 40, name="c1_bn")],
               name="c1_relu")
    t = b.relu6(b.conv(t, 40, 40, k=3, stride=1, pad=1, name="c2"), name="c2_clip")
    t = b.node("GlobalAveragePool", [t], name="pool")
    t = b.node("Flatten", [t], name="flatten", axis=1)
    y = b.node("Gemm", [t, b.const(b.rand(40, 10, scale=0.3)), b.const(b.rand(10, scale=0.1), "b")], name="fc")
    return b.model({"x": [1, 24, 20, 20]}, [y])


@pytest.mark.host
@needs_onnxruntime
def test_a_network_with_winograd_layers_verifies_against_onnxruntime(tmp_path, capsys):
    path = tmp_path / "wnet.onnx"
    onnx.save(_winograd_net(), str(path))
    code = main(["model", str(path), "--hw", "host", "--threads", "1", "--verify", "--json", "-o",
                 str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    lowerings = [d.get("lowering") for d in report["distinct_layers"]]
    assert "winograd" in lowerings, lowerings
    v = report["verification"]
    assert v["verified"] and not v["layers_failed"]
    assert v["outputs"] and all(c["ok"] and c["bound_kind"] == "derived" for c in v["outputs"])
    assert all(layer["error_to_bound_ratio"] <= 1 for layer in report["layers"])


@pytest.mark.host
def test_the_emitted_library_runs_a_winograd_layer(tmp_path, capsys):
    """`--emit lib`: a Winograd layer's _packed_floats matches the manifest (U, not the filter) and
    both entry points of the linked library verify under the Winograd bound."""
    from support import model_lib
    if not model_lib.HAVE_CMAKE:
        pytest.skip("no cmake")
    from xfc.model.load import load_model
    from xfc.model.mapping import map_network
    from xfc.ops.reference import check_output
    lib_dir, report, path = model_lib.emit(tmp_path, capsys, "host", _winograd_net())
    manifest = json.loads((lib_dir / "manifest.json").read_text())
    by_node = {layer["node"]: layer for layer in manifest["layers"]}
    net = map_network(load_model(path))
    wino = {d["kernel"] for d in report["distinct_layers"] if d.get("lowering") == "winograd"}
    assert wino
    layer = next(entry for entry in by_node.values() if any(entry["function"].endswith(k) for k in wino))
    item = next(i for i in net.layers if i.name == layer["node"])
    app = model_lib.build_app(tmp_path, lib_dir, manifest, layer, cross=False)
    spec, x, w, b, outs, _ = model_lib.run_layer(tmp_path, app, lib_dir, layer, item.spec, cross=False)
    m = next(d["winograd_m"] for d in report["distinct_layers"] if layer["function"].endswith(d["kernel"]))
    for out in outs:
        verdict = check_output(spec, out, x, w, b, winograd_m=m)
        assert verdict.ok, verdict.reason
