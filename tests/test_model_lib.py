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

HAVE_CMAKE = shutil.which("cmake") is not None
HAVE_ARM = bool(shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc")
                and Path("/usr/aarch64-linux-gnu/lib").is_dir())
TIMEOUT_S = 600
ARM_SYSROOT = "/usr/aarch64-linux-gnu"

APP_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "@HEADER@"

/* app WEIGHTS IN0 ... OUT0 ...: the network through its C API, as an app uses it */
int main(int argc, char **argv)
{
    if (argc != 2 + 2 * @P@_input_count() - (@P@_input_count() - @P@_output_count())) return 2;
    if (@P@_create("/nonexistent/weights", 1) != NULL || !strstr(@P@_last_error(NULL), "cannot open")) return 5;
    @P@ *net = @P@_create(argv[1], 1);
    if (!net) { fprintf(stderr, "%s\n", @P@_last_error(NULL)); return 3; }
    const float *in[@M@_INPUT_COUNT];
    float *out[@M@_OUTPUT_COUNT];
    for (int i = 0; i < @P@_input_count(); i++) {
        long n = @P@_input_floats(i);
        float *p = malloc(sizeof(float) * (size_t)n);
        FILE *f = fopen(argv[2 + i], "rb");
        if (!p || !f || fread(p, sizeof(float), (size_t)n, f) != (size_t)n) return 2;
        fclose(f);
        in[i] = p;
        printf("input %s rank %d", @P@_input_name(i), @P@_input_rank(i));
        for (int d = 0; d < @P@_input_rank(i); d++) printf(" %ld", @P@_input_shape(i)[d]);
        printf("\n");
    }
    for (int j = 0; j < @P@_output_count(); j++) out[j] = malloc(sizeof(float) * (size_t)@P@_output_floats(j));
    if (@P@_run(net, in, out) != @M@_OK) { fprintf(stderr, "%s\n", @P@_last_error(net)); return 4; }
    for (int j = 0; j < @P@_output_count(); j++) {
        FILE *f = fopen(argv[2 + @P@_input_count() + j], "wb");
        long n = @P@_output_floats(j);
        if (!f || fwrite(out[j], sizeof(float), (size_t)n, f) != (size_t)n || fclose(f)) return 2;
        printf("output %s %ld floats\n", @P@_output_name(j), n);
    }
    printf("arena %zu threads %d version %s\n", @P@_arena_bytes(), @P@_threads(net), @M@_VERSION);
    @P@_destroy(net);
    return 0;
}
"""

APP_CMAKE = """cmake_minimum_required(VERSION 3.10)
project(xfc_app C)
add_subdirectory("${XFC_LIB}" xfc)
add_executable(app app.c)
target_link_libraries(app PRIVATE @TARGET@)
"""

CROSS = ["-DCMAKE_SYSTEM_NAME=Linux", "-DCMAKE_SYSTEM_PROCESSOR=aarch64", "-DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc"]


def emit(tmp_path, capsys, hw: str, model) -> tuple[Path, dict, Path]:
    path = tmp_path / "Res-Net.onnx"
    onnx.save(model, str(path))
    out_dir = tmp_path / f"lib-{hw}"
    code = main(["model", str(path), "--hw", hw, "--emit", "lib", "--verify", "--threads", "2", "--json",
                 "-o", str(out_dir)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    return out_dir, report, path


def cmake_build(source: Path, build: Path, cross: bool, extra=()):
    configure = ["cmake", "-S", str(source), "-B", str(build), *extra] + (CROSS if cross else [])
    for argv in (configure, ["cmake", "--build", str(build)]):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def run(argv, cross: bool):
    if cross:   # dynamically linked (libgomp.so through OpenMP::OpenMP_C, as in an app): the cross sysroot's loader
        argv = ["qemu-aarch64", "-cpu", "max", "-L", ARM_SYSROOT, *argv]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


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
    # The library holds the C API, the kernels' four entry points and the thread-count variable: no main.
    nm = "aarch64-linux-gnu-nm" if cross else "nm"
    listing = subprocess.run([nm, "-g", "-P", "--defined-only", str(lib_dir / lib["library"])], capture_output=True,
                             text=True, timeout=60, check=True).stdout
    symbols = {ln.split()[0] for ln in listing.splitlines() if len(ln.split()) >= 2 and not ln.endswith(":")}
    api = {f"{prefix}_{name}" for name in (
        "create", "create_from_buffer", "run", "destroy", "last_error", "threads", "input_count", "output_count",
        "input_name", "output_name", "input_rank", "output_rank", "input_shape", "output_shape", "input_floats",
        "output_floats", "arena_bytes", "packed_weight_bytes", "set_step_callback", "step_count", "threads_now")}
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
