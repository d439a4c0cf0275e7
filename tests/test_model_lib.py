"""`xfc model --emit lib`: the network library (static library, C API header, weights file,
benchmark program source, CMakeLists.txt, manifest), linked into a small C app through CMake and
built on its own through its CMakeLists.txt (benchmark_<name>), natively and for aarch64 (run under
qemu-aarch64), checked against onnxruntime; the toolchain choice per ABI (the NDK when
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

from support import needs_onnxruntime, nets
from support.model_lib import APP_C, APP_CMAKE, HAVE_CMAKE, cmake_build, emit, run

from xfc.cli import main
from xfc.errors import ToolchainError
from xfc.model.library import c_identifier, ndk_host_tag, select_toolchain
from xfc.model.load import load_model
from xfc.model.mapping import map_network

HAVE_ARM = bool(shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc")
                and Path("/usr/aarch64-linux-gnu/lib").is_dir())


def check_library(tmp_path, capsys, hw: str, cross: bool):
    model = nets.resnet_net(blocks=1, hw=7)            # ragged: 7x7 -> max pool 4x4 -> strided block 2x2
    lib_dir, report, path = emit(tmp_path, capsys, hw, model)
    manifest = json.loads((lib_dir / "manifest.json").read_text())
    lib = report["library"]
    prefix = manifest["cmake_target"]
    assert prefix == lib["cmake_target"] == "xfc_res_net"
    abi = "arm64-v8a" if cross else "x86_64"
    assert lib["abi"] == abi and (lib_dir / lib["library"]).is_file()
    v = report["verification"]
    assert v["verified"] and v["emulated"] == cross and all(c["bound_kind"] == "derived" for c in v["outputs"])
    # The library holds the C API, the kernels' four entry points, the thread-count variable and the
    # kernels' shared scratch: no main.
    nm = "aarch64-linux-gnu-nm" if cross else "nm"
    listing = subprocess.run([nm, "-g", "-P", "--defined-only", str(lib_dir / lib["library"])], capture_output=True,
                             text=True, timeout=60, check=True).stdout
    symbols = {ln.split()[0] for ln in listing.splitlines() if len(ln.split()) >= 2 and not ln.endswith(":")}
    api = {f"{prefix}_{name}" for name in (
        "create", "create_from_buffer", "run", "destroy", "last_error", "threads", "input_count", "output_count",
        "input_name", "output_name", "input_rank", "output_rank", "input_shape", "output_shape", "input_floats",
        "output_floats", "arena_bytes", "packed_weight_bytes", "set_step_callback", "set_step_timer", "step_count",
        "threads_now", "scratch_ptr", "scratch_cap")}
    kernels = {f["function"] + suffix for f in manifest["functions"] for suffix in ("", "_prepack", "_packed",
                                                                                   "_packed_floats")}
    assert symbols == api | kernels
    assert len(manifest["functions"]) == report["network"]["distinct_kernels"]
    # Every layer's weights are in the weights file where the manifest says (after the 64-byte header).
    net = map_network(load_model(path))
    payload = np.fromfile(lib_dir / manifest["weights"]["file"], "<f4", offset=manifest["weights"]["header_bytes"])
    kernel_steps = [s for s in manifest["steps"] if s["kind"] == "kernel"]
    first = next(layer for layer in net.layers if layer.name == "stem")
    step = next(s for s in kernel_steps if s["name"] == "stem")
    offset, shape = step["weights"]["payload_offset_floats"], step["weights"]["shape"]
    assert np.array_equal(payload[offset:offset + int(np.prod(shape))].reshape(shape), first.weight)
    # The graph's input, as --verify fed it (seed 0), through an app linked with CMake and through the
    # benchmark program its own CMakeLists.txt builds: both equal, and within the verified bound of onnxruntime.
    x = np.random.default_rng(0).uniform(-1.0, 1.0, size=(1, 3, 7, 7)).astype(np.float32)
    x.tofile(tmp_path / "x.f32")
    app = tmp_path / "app"
    app.mkdir()
    (app / "app.c").write_text(APP_C.replace("@HEADER@", manifest["header"]).replace("@P@", prefix)
                               .replace("@M@", prefix.upper()))
    (app / "CMakeLists.txt").write_text(APP_CMAKE.replace("@TARGET@", prefix))
    cmake_build(app, app / "build", cross, [f"-DXFC_LIB={lib_dir}"])
    stdout = run([str(app / "build" / "app"), str(lib_dir / manifest["weights"]["file"]), str(tmp_path / "x.f32"),
                  str(tmp_path / "app_out.f32")], cross)
    assert "input x rank 4 1 3 7 7" in stdout and f"version {report['xfc_version']}" in stdout, stdout
    cmake_build(lib_dir, tmp_path / "bench-build", cross)
    program = tmp_path / "bench-build" / manifest["benchmark"]["program"]
    assert (program.parent / manifest["weights"]["file"]).is_file()   # copied beside the program
    (tmp_path / "outs").mkdir()
    line = run([str(program), "--input", str(tmp_path / "x.f32"), "--runs", "3", "--warmup", "1", "--threads", "1",
                "--outputs", str(tmp_path / "outs")], cross)
    timing = json.loads(line)
    assert timing["runs"] == 3 and timing["threads"] == 1 and timing["arena_bytes"] == report["network"]["arena_bytes"]
    assert 0 < timing["p10_ms"] <= timing["median_ms"] <= timing["p90_ms"]
    got = np.fromfile(tmp_path / "outs" / "output0.f32", "<f4")
    assert np.array_equal(got, np.fromfile(tmp_path / "app_out.f32", "<f4"))
    import onnxruntime as ort
    (expected,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.max(np.abs(got - expected.reshape(-1))) <= v["outputs"][0]["max_bound"]


@pytest.mark.host
@needs_onnxruntime
@pytest.mark.skipif(not HAVE_CMAKE, reason="no cmake")
def test_library_links_natively_through_cmake(tmp_path, capsys):
    check_library(tmp_path, capsys, "host", cross=False)


@pytest.mark.emulated
@needs_onnxruntime
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
