"""`xfc model --emit lib` from the outside: the network library emitted for a model (with --verify),
a small C program built against it with CMake (natively or for aarch64, run under qemu-aarch64), the
benchmark program its own CMakeLists.txt builds, and one layer kernel's four entry points on their own."""
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


def emit(tmp_path, capsys, hw: str, model, *, verify: bool = True) -> tuple[Path, dict, Path]:
    """`xfc model --emit lib` (with --verify: the network run in C against onnxruntime) into tmp_path:
    (the library directory, the JSON report, the saved model)."""
    path = tmp_path / "Res-Net.onnx"
    onnx.save(model, str(path))
    out_dir = tmp_path / f"lib-{hw}"
    code = main(["model", str(path), "--hw", hw, "--emit", "lib", *(["--verify"] if verify else []), "--threads", "2",
                 "--json", "-o", str(out_dir)])
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


KERNEL_APP_C = r"""
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

/* kernel_app IN WEIGHTS BIAS OUT_PACKED OUT_PLAIN: one layer kernel of the library, with pre-packed
   weights and without. */
int main(int argc, char **argv)
{
    if (argc != 6) return 2;
    float *in = load(argv[1], @IN@L), *w = load(argv[2], @WEIGHTS@L), *b = load(argv[3], @BIAS@L);
    float *packed = malloc(sizeof(float) * (size_t)@PACKED@L);
    float *out = malloc(sizeof(float) * (size_t)@OUT@L);
    if (!packed || !out || @F@_packed_floats() != @PACKED@L) return 3;
    if (@F@_prepack(w, packed) || @F@_packed(in, packed, b, out)) return 4;
    save(argv[4], out, @OUT@L);
    if (@F@(in, w, b, out)) return 4;
    save(argv[5], out, @OUT@L);
    printf("%s\n", @M@_VERSION);
    return 0;
}
"""


def kernel_step(lib_dir: Path, manifest: dict, step: dict):
    """A kernel step's weights and bias as the library's weights file holds them (float32 arrays)."""
    weights = manifest["weights"]
    payload = np.fromfile(lib_dir / weights["file"], "<f4", offset=weights["header_bytes"])
    offset, shape = step["weights"]["payload_offset_floats"], step["weights"]["shape"]
    w = payload[offset:offset + int(np.prod(shape))].reshape(shape)
    start = weights["constants_section_offset_floats"] + step["bias"]["constants_offset_floats"]
    b = payload[start:start + step["bias"]["floats"]]
    return w, b


def run_kernel(tmp_path, lib_dir: Path, manifest: dict, step: dict, spec, cross: bool = False):
    """One kernel step's function through its four entry points, in a program linked with CMake against
    the library: (x, w, b, [output through _prepack/_packed, output of the plain call], stdout)."""
    w, b = kernel_step(lib_dir, manifest, step)
    function = step["function"]
    packed = next(f["packed_floats"] for f in manifest["functions"] if f["function"] == function)
    prefix = manifest["cmake_target"]
    out_floats = int(np.prod(spec.output_shape))
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, size=spec.operand_shapes[0]).astype(np.float32)
    app = tmp_path / f"kernel-app-{function}"
    app.mkdir()
    text = KERNEL_APP_C
    for key, value in (("@HEADER@", manifest["header"]), ("@F@", function), ("@M@", prefix.upper()),
                       ("@IN@", x.size), ("@WEIGHTS@", w.size), ("@BIAS@", max(b.size, 1)), ("@PACKED@", packed),
                       ("@OUT@", out_floats)):
        text = text.replace(key, str(value))
    (app / "app.c").write_text(text)
    (app / "CMakeLists.txt").write_text(APP_CMAKE.replace("@TARGET@", prefix))
    cmake_build(app, app / "build", cross, [f"-DXFC_LIB={lib_dir}"])
    files = [app / n for n in ("in.f32", "w.f32", "b.f32", "packed.f32", "plain.f32")]
    x.tofile(files[0])
    w.tofile(files[1])
    (b if b.size else np.zeros(1, np.float32)).tofile(files[2])
    stdout = run([str(app / "build" / "app"), *map(str, files)], cross)
    outs = [np.fromfile(f, "<f4").reshape(spec.output_shape) for f in files[3:]]
    return x, w, b, outs, stdout
