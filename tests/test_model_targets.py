"""`xfc model` beyond the host: ARM kernels under qemu-aarch64 and on the virtual ADB device, GPU
kernels (Adreno, Mali) on PoCL, each verified end to end against onnxruntime; the requests that
cannot work are one-line exit 2."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from support import needs_onnxruntime, nets

from xfc.cli import main
from xfc.model import backend

HAVE_ARM = bool(shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc"))
needs_arm = pytest.mark.skipif(not HAVE_ARM, reason="no qemu-aarch64 / aarch64 gcc")


def save(model, directory: Path, name: str) -> Path:
    path = directory / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def run_json(capsys, argv):
    code = main(argv)
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if captured.out.strip().startswith("{") else None), captured


def assert_verified(report, where_fragment: str):
    v = report["verification"]
    assert v["verified"], v
    assert where_fragment in v["verified_on"] and v["reference"].startswith("onnxruntime")
    assert v["layers_checked"] == len(report["layers"]) > 0 and not v["layers_failed"]
    assert all(c["ok"] and c["bound_kind"] == "derived" for c in v["outputs"])
    assert all(layer["error_to_bound_ratio"] <= 1 for layer in report["layers"])


# ---------------------------------------------------------------------------------------------
# ARM under qemu-aarch64
# ---------------------------------------------------------------------------------------------

@pytest.mark.emulated
@needs_arm
@pytest.mark.parametrize("name, builder, extra", [
    ("mobilenet", lambda: nets.mobilenet_net(blocks=1, hw=9), []),          # ragged 5x5 after the stride-2 stem
    ("mlp", nets.mlp_net, ["--device", "qemu", "--bench", "--repeat", "2"]),   # the explicit spelling, timed
])
@needs_onnxruntime
def test_arm_verify_under_qemu(tmp_path, capsys, name, builder, extra):
    out_dir = tmp_path / "out"
    code, report, captured = run_json(capsys, ["model", str(save(builder(), tmp_path, name)), "--hw", "snapdragon-865",
                                               "--verify", "--json", "-o", str(out_dir), *extra])
    assert code == 0, captured.err
    assert_verified(report, "qemu-aarch64")
    assert "emulated" in report["verification"]["verified_on"]
    files = {p.name for p in out_dir.iterdir()}
    for d in report["distinct_layers"]:
        k = d["kernel"]
        assert {f"xfc_{k}.c", f"xfc_{k}_harness.c", f"build_arm_{k}.sh"} <= files
        assert any(f.startswith(f"xfc_{k}_") and f.endswith(".aarch64") for f in files)
        assert d["isa"] == "neon"
    bench = report["bench"]
    if "--bench" in extra:        # emulated timings, labelled so; nothing compared with onnxruntime
        assert bench["emulated"] and "emulated" in bench["xfc_measured_on"] and bench["onnxruntime"] is None
        assert all(layer["measured_seconds"] > 0 and layer["onnxruntime_seconds"] is None
                   for layer in report["layers"])
    else:
        assert bench is None and all(layer["measured_seconds"] is None for layer in report["layers"])


@pytest.mark.emulated
@needs_arm
@needs_onnxruntime
def test_arm_perturbed_kernel_output_fails(tmp_path, capsys, monkeypatch):
    """A qemu-run layer whose output is changed by 1e-3 of its largest value: exit 4, one line."""
    real = backend.RunnerKernel.run

    def perturbed(self, x, weight, bias, **kw):
        out = np.array(real(self, x, weight, bias, **kw))
        if self.label == "xfc_k02_matmul":
            out.reshape(-1)[out.size // 2] += 1e-3 * float(np.abs(out).max() + 1.0)
        return out

    monkeypatch.setattr(backend.RunnerKernel, "run", perturbed)
    code = main(["model", str(save(nets.mlp_net(), tmp_path, "mlp")), "--hw", "snapdragon-865", "--verify",
                 "-o", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 4
    errors = [ln for ln in captured.err.splitlines() if ln.startswith("xfc: error:")]
    assert len(errors) == 1 and "fc2" in errors[0] and "Traceback" not in captured.err


# ---------------------------------------------------------------------------------------------
# ARM on the virtual ADB device
# ---------------------------------------------------------------------------------------------

@pytest.mark.adb
@needs_arm
@needs_onnxruntime
def test_device_runs_the_layers_on_the_virtual_device(tmp_path, capsys, server):
    from android_runner.virtual_device import VirtualDevice
    dev = VirtualDevice(soc="snapdragon-865").start()
    server.connect(dev.serial)
    try:
        code, report, captured = run_json(capsys, [
            "model", str(save(nets.resnet_net(blocks=1, hw=7), tmp_path, "resnet")), "--hw", "snapdragon-865",
            "--device", dev.serial, "--adb-port", str(server.port), "--bench", "--repeat", "2", "--json",
            "-o", str(tmp_path / "out")])
        assert code == 0, captured.err
        assert_verified(report, "virtual-device")
        assert "emulated" in report["verification"]["verified_on"]     # never presented as phone figures
        bench = report["bench"]
        assert bench["emulated"] and "virtual-device" in bench["xfc_measured_on"] and bench["onnxruntime"] is None
        assert all(layer["measured_seconds"] > 0 for layer in report["layers"])
        assert not [p for p in dev.sandbox_files() if p.startswith("/data/local/tmp/xfc/")]   # cleaned up
    finally:
        server.disconnect(dev.serial)
        dev.stop()


# ---------------------------------------------------------------------------------------------
# GPU on PoCL
# ---------------------------------------------------------------------------------------------

@pytest.mark.opencl
@pytest.mark.parametrize("hw, gpu, name, builder", [
    ("snapdragon-865", "adreno-650", "mobilenet", lambda: nets.mobilenet_net(blocks=1, hw=9)),
    ("dimensity-1200", "mali-g77", "odd", nets.odd_net),
])
@needs_onnxruntime
def test_gpu_target_verifies_on_pocl(tmp_path, capsys, hw, gpu, name, builder):
    out_dir = tmp_path / "out"
    code, report, captured = run_json(capsys, ["model", str(save(builder(), tmp_path, name)), "--hw", hw,
                                               "--target", "gpu", "--verify", "--json", "-o", str(out_dir)])
    assert code == 0, captured.err
    assert report["target"] == "gpu" and report["gpu"] == gpu
    assert_verified(report, "PoCL")
    assert "not a phone GPU timing" in report["verification"]["verified_on"]
    files = {p.name for p in out_dir.iterdir()}
    assert "harness.c" in files
    for d in report["distinct_layers"]:
        assert d["isa"] == "opencl" and f"xfc_{d['kernel']}.cl" in files
        assert f"// xfc-launch:" in (out_dir / f"xfc_{d['kernel']}.cl").read_text()


# ---------------------------------------------------------------------------------------------
# Requests that cannot work: exit 2, one line, nothing written
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, fragment", [   # --hw host runs the host probe (gcc): a host test
    pytest.param(["--hw", "host", "--target", "gpu"], "no GPU section", marks=pytest.mark.host),
    pytest.param(["--hw", "host", "--device", "qemu"], "x86-64 description", marks=pytest.mark.host),
    pytest.param(["--hw", "snapdragon-865", "--target", "gpu", "--device", "qemu"], "PoCL", marks=pytest.mark.unit),
])
def test_impossible_requests_exit_2(tmp_path, capsys, argv, fragment):
    out_dir = tmp_path / "out"
    code = main(["model", str(save(nets.mlp_net(), tmp_path, "mlp")), *argv, "-o", str(out_dir)])
    captured = capsys.readouterr()
    assert code == 2
    errors = [ln for ln in captured.err.splitlines() if ln.startswith("xfc: error:")]
    assert len(errors) == 1 and fragment in errors[0] and "Traceback" not in captured.err
    assert not out_dir.exists()
