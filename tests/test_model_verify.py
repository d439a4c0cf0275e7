"""`xfc model --verify` on the host: the small networks run end to end with xfc's kernels and match
onnxruntime; a deliberately perturbed kernel makes the check fail (exit 4)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from support import needs_onnxruntime, nets

from xfc.cli import main
from xfc.hardware.load import load as load_hw
from xfc.model import backend
from xfc.model.load import load_model
from xfc.model.mapping import map_network
from xfc.model.pipeline import kernel_names
from xfc.model.run import verify_network

pytestmark = [pytest.mark.host, needs_onnxruntime]   # every test here compares with onnxruntime


def save(model, directory: Path, name: str) -> Path:
    path = directory / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("name, builder", [("mobilenet", nets.mobilenet_net), ("resnet", nets.resnet_net),
                                           ("mlp", nets.mlp_net), ("odd", nets.odd_net)])
def test_verify_matches_onnxruntime(tmp_path, capsys, name, builder):
    path = save(builder(), tmp_path, name)
    out_dir = tmp_path / "out"
    code = main(["model", str(path), "--hw", "host", "--verify", "--json", "-o", str(out_dir)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    v = report["verification"]
    assert v["verified"] and v["verified_on"] == "host (native)" and v["reference"].startswith("onnxruntime")
    assert v["layers_checked"] == len(report["layers"]) and not v["layers_failed"]
    assert v["outputs"] and all(c["ok"] and c["bound_kind"] == "derived" for c in v["outputs"])
    assert all(0 <= c["error_to_bound_ratio"] <= 1 for c in v["outputs"])
    assert all(layer["error_to_bound_ratio"] <= 1 for layer in report["layers"])
    assert not v["ops_without_error_rule"]
    # One kernel per distinct layer shape, each with its sources, build script and library.
    distinct = report["distinct_layers"]
    assert len(distinct) == report["nodes"]["distinct_layers"] <= len(report["layers"])
    files = {p.name for p in out_dir.iterdir()}
    assert {"report.json", ".xfc-output"} <= files
    for d in distinct:
        k = d["kernel"]
        assert {f"xfc_{k}.c", f"xfc_{k}_harness.c", f"build_{k}.sh"} <= files
        assert any(f.startswith(f"libxfc_{k}_") and f.endswith(".so") for f in files)
        assert d["synthesis_seconds"] > 0 and d["levels"]
    saved = json.loads((out_dir / "report.json").read_text())
    assert saved["flops"] == report["flops"] and saved["verification"]["verified"]
    if name == "odd":
        uncovered = {u["node"]: u["reason"] for u in report["uncovered"]}
        assert "group 2" in uncovered["grouped"] and "graph output" in uncovered["r1"]


def test_table_and_explain(tmp_path, capsys):
    path = save(nets.resnet_net(blocks=1), tmp_path, "resnet")
    code = main(["model", str(path), "--hw", "host", "--verify", "--explain", "-o", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = captured.out
    assert "Conv+BatchNormalization+Relu" in out and "k01_conv2d" in out and "static" in out
    assert "covered: " in out and "not covered: Add x" in out and "MaxPool" in out
    assert "verified: yes on host (native) against onnxruntime" in out
    assert "lowering:" in out and "<-" in out           # --explain: each level and what decided it
    assert "[xfc] building kernel 1/" in captured.err


class _Perturbed:
    """A host kernel whose output is changed after it ran: the verification must notice."""

    def __init__(self, host, delta):
        self.host, self.delta = host, delta

    def _change(self, out):
        out = out.copy()
        out.reshape(-1)[:] += self.delta(out)
        return out

    def prepack(self, weight):
        return self.host.prepack(weight)

    def run_packed(self, x, packed, bias):
        return self._change(self.host.run_packed(x, packed, bias))

    def __call__(self, x, weight, bias):
        return self._change(self.host(x, weight, bias))


def _one_element(relative):
    def delta(out):
        d = np.zeros(out.size, np.float32)
        d[out.size // 2] = relative * float(np.abs(out).max() + 1.0)
        return d
    return delta


@pytest.fixture(scope="module")
def mlp_kernels(tmp_path_factory):
    directory = tmp_path_factory.mktemp("mlp")
    net = map_network(load_model(save(nets.mlp_net(), directory, "mlp")))
    hw = load_hw("host")
    names = kernel_names(net.distinct_specs())
    kernels = {spec: backend.build_layer_kernel(spec, hw, name=names[spec], work_dir=directory)
               for spec in net.distinct_specs()}
    return net, kernels


def test_perturbed_kernels_fail_the_check(mlp_kernels):
    net, kernels = mlp_kernels
    assert verify_network(net, kernels).ok
    first, last = net.layers[0].spec, net.layers[-1].spec
    # A 1e-4 relative change of one element of the first layer: far inside any tolerance one would
    # tune, far outside the layer's rounding bound.
    small = dict(kernels)
    small[first] = dataclasses.replace(kernels[first], host=_Perturbed(kernels[first].host, _one_element(1e-4)))
    v = verify_network(net, small)
    assert not v.ok and [c.name for c in v.layers if not c.ok] == [net.layers[0].name]
    # A change of the last layer's whole output beyond the propagated bound fails the comparison
    # with onnxruntime too.
    large = dict(kernels)
    large[last] = dataclasses.replace(kernels[last], host=_Perturbed(kernels[last].host, lambda out: 0.05))
    v = verify_network(net, large)
    assert not v.ok and not v.outputs[0].ok and v.outputs[0].max_abs_error == pytest.approx(0.05, rel=1e-3)


def test_cli_exit_4_when_a_kernel_is_perturbed(tmp_path, capsys, monkeypatch):
    real = backend.build_layer_kernel

    def perturbed(spec, hw, **kw):
        kernel = real(spec, hw, **kw)
        if kernel.name == "k02_matmul":
            kernel = dataclasses.replace(kernel, host=_Perturbed(kernel.host, _one_element(1e-3)))
        return kernel

    monkeypatch.setattr(backend, "build_layer_kernel", perturbed)
    path = save(nets.mlp_net(), tmp_path, "mlp")
    out_dir = tmp_path / "out"
    code = main(["model", str(path), "--hw", "host", "--verify", "-o", str(out_dir)])
    captured = capsys.readouterr()
    assert code == 4
    errors = [ln for ln in captured.err.splitlines() if ln.startswith("xfc: error:")]
    assert len(errors) == 1 and "fc2" in errors[0] and "Traceback" not in captured.err
    assert "verified: NO" in captured.out
    report = json.loads((out_dir / "report.json").read_text())      # kept, as `xfc synth` keeps its outputs
    assert report["verification"]["layers_failed"] == ["fc2"]
