"""`xfc model --emit lib`: the static library, header, CMakeLists.txt and manifest, linked into a
small C program through CMake (natively, and for aarch64 run under qemu-aarch64), whose output is
checked against the float64 numpy reference; the toolchain choice per ABI (the NDK when
ANDROID_NDK_HOME is set)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import model_nets as nets  # noqa: E402

from xfc.cli import main  # noqa: E402
from xfc.errors import ToolchainError  # noqa: E402
from xfc.model.library import c_identifier, ndk_host_tag, select_toolchain  # noqa: E402
from xfc.model.load import load_model  # noqa: E402
from xfc.model.mapping import map_network  # noqa: E402
from xfc.ops.reference import check_output  # noqa: E402

HAVE_CMAKE = shutil.which("cmake") is not None
HAVE_ARM = bool(shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc")
                and Path("/usr/aarch64-linux-gnu/lib").is_dir())
TIMEOUT_S = 600
ARM_SYSROOT = "/usr/aarch64-linux-gnu"

APP_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include "@HEADER@"

static float *load(const char *path, long n)
{
    float *p = malloc(sizeof(float) * (size_t)n);
    FILE *f = fopen(path, "rb");
    if (!p || !f || fread(p, sizeof(float), (size_t)n, f) != (size_t)n) { fprintf(stderr, "cannot read %s\n", path); exit(2); }
    fclose(f);
    return p;
}

static void save(const char *path, const float *p, long n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, sizeof(float), (size_t)n, f) != (size_t)n || fclose(f)) { fprintf(stderr, "cannot write %s\n", path); exit(2); }
}

/* app IN WEIGHTS BIAS OUT_PACKED OUT_PLAIN: one layer, with pre-packed weights and without. */
int main(int argc, char **argv)
{
    if (argc != 6) return 2;
    float *in = load(argv[1], @M@_IN_FLOATS), *w = load(argv[2], @M@_WEIGHT_FLOATS), *b = load(argv[3], @M@_BIAS_FLOATS);
    float *packed = malloc(sizeof(float) * (size_t)@M@_PACKED_FLOATS);
    float *out = malloc(sizeof(float) * (size_t)@M@_OUT_FLOATS);
    if (!packed || !out || @F@_packed_floats() != @M@_PACKED_FLOATS) return 3;
    if (@F@_prepack(w, packed) || @F@_packed(in, packed, b, out)) return 4;
    save(argv[4], out, @M@_OUT_FLOATS);
    if (@F@(in, w, b, out)) return 4;
    save(argv[5], out, @M@_OUT_FLOATS);
    printf("%s %s\n", @V@, @F@ != 0 ? "ok" : "");
    return 0;
}
"""

APP_CMAKE = """cmake_minimum_required(VERSION 3.10)
project(xfc_app C)
add_subdirectory("${XFC_LIB}" xfc)
add_executable(app app.c)
target_link_libraries(app PRIVATE @TARGET@)
"""


def emit(tmp_path, capsys, hw: str, model) -> tuple[Path, dict, Path]:
    path = tmp_path / "Res-Net.onnx"
    onnx.save(model, str(path))
    out_dir = tmp_path / f"lib-{hw}"
    code = main(["model", str(path), "--hw", hw, "--emit", "lib", "--json", "-o", str(out_dir)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    return out_dir, report, path


def build_app(tmp_path, lib_dir: Path, manifest: dict, layer: dict, cross: bool) -> Path:
    app = tmp_path / ("app-arm" if cross else "app-host")
    app.mkdir()
    function = layer["function"]
    prefix = manifest["cmake_target"]
    text = (APP_C.replace("@HEADER@", manifest["header"]).replace("@M@", function.upper())
            .replace("@F@", function).replace("@V@", f"{prefix.upper()}_VERSION"))
    (app / "app.c").write_text(text)
    (app / "CMakeLists.txt").write_text(APP_CMAKE.replace("@TARGET@", prefix))
    build = app / "build"
    configure = ["cmake", "-S", str(app), "-B", str(build), f"-DXFC_LIB={lib_dir}"]
    if cross:
        configure += ["-DCMAKE_SYSTEM_NAME=Linux", "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
                      "-DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc"]
    for argv in (configure, ["cmake", "--build", str(build)]):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return build / "app"


def run_layer(tmp_path, app: Path, lib_dir: Path, layer: dict, spec, cross: bool):
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, size=spec.operand_shapes[0]).astype(np.float32)
    w = np.fromfile(lib_dir / layer["weights"]["file"], "<f4").reshape(layer["weights"]["shape"])
    b = np.fromfile(lib_dir / layer["bias"]["file"], "<f4").reshape(layer["bias"]["shape"])
    files = [tmp_path / n for n in ("in.f32", "packed.f32", "plain.f32")]
    x.tofile(files[0])
    argv = [str(app), str(files[0]), str(lib_dir / layer["weights"]["file"]), str(lib_dir / layer["bias"]["file"]),
            str(files[1]), str(files[2])]
    if cross:
        # Dynamically linked (libgomp.so through OpenMP::OpenMP_C, as in an app): the cross sysroot's loader.
        argv = ["qemu-aarch64", "-cpu", "max", "-L", ARM_SYSROOT, *argv]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    return spec, x, w, b, [np.fromfile(f, "<f4").reshape(spec.output_shape) for f in files[1:]], proc.stdout


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
