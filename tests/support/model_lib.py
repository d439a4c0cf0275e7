"""`xfc model --emit lib` from the outside: the library emitted for a network, a small C program
built against it with CMake (natively or for aarch64), and one layer run through it."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx

from xfc.cli import main

HAVE_CMAKE = shutil.which("cmake") is not None
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
