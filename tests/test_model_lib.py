"""`xfc model --emit lib`: the static library, header, CMakeLists.txt and manifest, linked into a
small C program through CMake (natively, and for aarch64 run under qemu-aarch64), whose output is
checked against the float64 numpy reference; the toolchain choice per ABI (the NDK when
ANDROID_NDK_HOME is set)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest

from support import nets
from support.model_lib import HAVE_CMAKE, build_app, emit, run_layer

from xfc.cli import main
from xfc.errors import ToolchainError
from xfc.model.library import c_identifier, ndk_host_tag, select_toolchain
from xfc.model.load import load_model
from xfc.model.mapping import map_network
from xfc.ops.reference import check_output

HAVE_ARM = bool(shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc")
                and Path("/usr/aarch64-linux-gnu/lib").is_dir())


def check_library(tmp_path, capsys, hw: str, cross: bool):
    model = nets.resnet_net(blocks=1, hw=7)            # ragged: 7x7 -> max pool 4x4 -> strided block 2x2
    lib_dir, report, path = emit(tmp_path, capsys, hw, model)
    manifest = json.loads((lib_dir / "manifest.json").read_text())
    lib = report["library"]
    assert manifest["cmake_target"] == lib["cmake_target"] == "xfc_res_net"
    abi = "arm64-v8a" if cross else "x86_64"
    assert lib["abi"] == abi and (lib_dir / lib["library"]).is_file()
    # No harness and no main in the library: only the four functions per distinct layer.
    nm = "aarch64-linux-gnu-nm" if cross else "nm"
    listing = subprocess.run([nm, "-g", "-P", "--defined-only", str(lib_dir / lib["library"])], capture_output=True,
                             text=True, timeout=60, check=True).stdout
    symbols = [ln.split()[0] for ln in listing.splitlines() if len(ln.split()) >= 2 and not ln.endswith(":")]
    functions = [f["function"] for f in manifest["functions"]]
    expected = {f + suffix for f in functions for suffix in ("", "_prepack", "_packed", "_packed_floats")}
    assert set(symbols) == expected and len(functions) == report["nodes"]["distinct_layers"]
    # Every covered ONNX node is in the manifest, with the network's (folded) weights as its blob.
    net = map_network(load_model(path))
    by_node = {layer["node"]: layer for layer in manifest["layers"]}
    assert list(by_node) == [layer.name for layer in net.layers]
    for layer in net.layers:
        entry = by_node[layer.name]
        blob = np.fromfile(lib_dir / entry["weights"]["file"], "<f4").reshape(entry["weights"]["shape"])
        assert np.array_equal(blob, layer.weight) and entry["output"]["tensor"] == layer.output
        assert entry["input"]["shape"] == list(layer.spec.operand_shapes[0])
    # One layer (a Conv with BatchNormalization folded and Relu fused) through a CMake-built program.
    layer = by_node["rb0_conv1"]
    assert "BatchNormalization" in layer["op"]
    app = build_app(tmp_path, lib_dir, manifest, layer, cross)
    spec = next(item.spec for item in net.layers if item.name == "rb0_conv1")
    spec, x, w, b, outs, stdout = run_layer(tmp_path, app, lib_dir, layer, spec, cross)
    assert stdout.split()[0] == report["xfc_version"]
    for out in outs:
        verdict = check_output(spec, out, x, w, b)
        assert verdict.ok, verdict.reason


@pytest.mark.host
@pytest.mark.skipif(not HAVE_CMAKE, reason="no cmake")
def test_library_links_natively_through_cmake(tmp_path, capsys):
    check_library(tmp_path, capsys, "host", cross=False)


@pytest.mark.emulated
@pytest.mark.skipif(not (HAVE_CMAKE and HAVE_ARM), reason="no cmake / aarch64 gcc / qemu-aarch64")
def test_library_links_for_aarch64_through_cmake_and_runs_under_qemu(tmp_path, capsys):
    check_library(tmp_path, capsys, "snapdragon-865", cross=True)


@pytest.mark.unit
def test_toolchain_per_abi(tmp_path):
    assert select_toolchain("arm64-v8a", {}).cc == "aarch64-linux-gnu-gcc"
    assert select_toolchain("x86_64", {"ANDROID_NDK_HOME": str(tmp_path)}).cc == "gcc"
    bin_dir = tmp_path / "toolchains" / "llvm" / "prebuilt" / ndk_host_tag() / "bin"
    with pytest.raises(ToolchainError, match="aarch64-linux-android24-clang not found"):
        select_toolchain("arm64-v8a", {"ANDROID_NDK_HOME": str(tmp_path)})
    bin_dir.mkdir(parents=True)
    for name in ("aarch64-linux-android24-clang", "aarch64-linux-android29-clang", "llvm-ar"):
        (bin_dir / name).write_text("")
    ndk = select_toolchain("arm64-v8a", {"ANDROID_NDK_HOME": str(tmp_path)})
    assert (ndk.cc, ndk.ar) == (str(bin_dir / "aarch64-linux-android24-clang"), str(bin_dir / "llvm-ar"))
    assert "NDK clang" in ndk.label
    assert select_toolchain("arm64-v8a", {"ANDROID_NDK_HOME": str(tmp_path),
                                          "XFC_ANDROID_API": "29"}).cc.endswith("android29-clang")
    with pytest.raises(ToolchainError, match="ABI 'armeabi-v7a'"):
        select_toolchain("armeabi-v7a", {})
    assert c_identifier("MobileNet-v2") == "mobilenet_v2" and c_identifier("18net") == "m_18net"


@pytest.mark.unit
def test_emit_lib_with_gpu_target_is_exit_2(tmp_path, capsys):
    path = tmp_path / "mlp.onnx"
    onnx.save(nets.mlp_net(), str(path))
    code = main(["model", str(path), "--hw", "snapdragon-865", "--target", "gpu", "--emit", "lib",
                 "-o", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("xfc: error:") == 1 and "--emit lib" in err and not (tmp_path / "o").exists()


@pytest.mark.host
def test_emit_lib_log_and_help_name_what_is_written(tmp_path, capsys):
    """The progress log names the archive that exists, and --emit's help names where the files go
    (the -o directory itself, not a lib/ below it)."""
    path = tmp_path / "mlp.onnx"
    onnx.save(nets.mlp_net(), str(path))
    out_dir = tmp_path / "o"
    code = main(["model", str(path), "--hw", "host", "--emit", "lib", "-o", str(out_dir)])
    err = capsys.readouterr().err
    assert code == 0, err
    logged = re.findall(r"--emit lib: (\S+\.a) ", err)
    assert logged, err
    for name in logged:
        assert (out_dir / name).is_file(), (name, sorted(p.name for p in out_dir.iterdir()))
    assert not (out_dir / "lib").exists()
    from xfc.cli import build_parser
    model_parser = next(a for a in build_parser()._subparsers._group_actions[0].choices.values()
                        if a.prog.endswith(" model"))
    emit_help = next(a.help for a in model_parser._actions if "--emit" in a.option_strings)
    assert "DIR/lib" not in emit_help and "into DIR itself" in emit_help, emit_help
    named = re.search(r"lib<[^>]+>-<[^>]+>\.a", emit_help)
    assert named, emit_help
    pattern = re.sub(r"<[^>]+>", r"[A-Za-z0-9_-]+", re.escape(named.group(0)).replace(r"\<", "<").replace(r"\>", ">"))
    archives = [p.name for p in out_dir.glob("*.a")]
    assert archives and all(re.fullmatch(pattern, a) for a in archives), (pattern, archives)
