"""`xfc model --emit lib`: the network's layer kernels as a static library an app links.

For the description's ABI (arm64-v8a for AArch64 descriptions, x86_64 for the host) the output
directory (flat, like every xfc output directory: xfc/outputs.py) gets, with <name> =
xfc_<model file stem>:

    <name>.h                     layer functions, per-layer sizes (packed weights too), a version
    lib<name>-<abi>.a            one object per distinct layer kernel: no harness, no main
    <name>_kNN_<op>.c            the kernels' sources (what the library was compiled from)
    CMakeLists.txt               an IMPORTED target for add_subdirectory (ABI from ANDROID_ABI or
                                 CMAKE_SYSTEM_PROCESSOR; OpenMP linked through find_package)
    manifest.json                ONNX node -> function, weight / bias blobs, shapes, feed
    wNNN_<node>.weight.f32       per layer, the weights and bias in the kernel's layout (after
    wNNN_<node>.bias.f32         BatchNormalization folding, Gemm alpha/beta, transposes), raw fp32

The compiler per ABI (select_toolchain): arm64-v8a uses the NDK's clang when ANDROID_NDK_HOME is
set, else aarch64-linux-gnu-gcc; x86_64 uses the host gcc. Kernels are rendered by the same
renderer as every other xfc kernel, only with a symbol prefix naming the model, so two models'
libraries can be linked into one app.
"""
from __future__ import annotations

import dataclasses
import json
import platform
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional

import jinja2
import numpy as np

from .._version import __version__
from ..cpu.winograd import packed_floats as winograd_packed_floats
from ..toolchain.tools import ARM_CC, COMPILE_TIMEOUT_S, HOST_CC, require_tool, run
from ..outputs import write_atomic
from ..errors import ToolchainError
from ..paths import TEMPLATES_DIR
from .graph import ConvFeed, MappedNetwork

LIB_FLAGS = ("-O3", "-std=gnu11", "-fopenmp", "-fPIC", "-Wall", "-Wno-unused-function")
NDK_API_DEFAULT = 24        # the lowest Android API level the NDK's -fopenmp static runtime is used with here


@dataclass(frozen=True)
class Toolchain:
    abi: str                 # 'arm64-v8a' or 'x86_64'
    cc: str                  # compiler path or name
    ar: str
    label: str               # what it is, for the report


def abi_for(hw) -> str:
    return "arm64-v8a" if hw.target_arch == "aarch64" else "x86_64"


def ndk_host_tag() -> str:
    system = platform.system().lower()
    return f"{'darwin' if system == 'darwin' else 'linux'}-x86_64"   # the NDK ships x86-64 hosts (Rosetta on Macs)


def select_toolchain(abi: str, env: Mapping[str, str]) -> Toolchain:
    """The compiler and archiver for abi (pure apart from checking that NDK files exist). env: the
    command line's environment (ANDROID_NDK_HOME, XFC_ANDROID_API); xfc.cli reads it, not this module."""
    if abi == "arm64-v8a":
        ndk = env.get("ANDROID_NDK_HOME", "").strip()
        if ndk:
            api = env.get("XFC_ANDROID_API", "").strip() or str(NDK_API_DEFAULT)
            if not api.isdigit():
                raise ToolchainError(f"XFC_ANDROID_API={api!r}: expected an Android API level such as 24")
            bin_dir = Path(ndk) / "toolchains" / "llvm" / "prebuilt" / ndk_host_tag() / "bin"
            cc, ar = bin_dir / f"aarch64-linux-android{api}-clang", bin_dir / "llvm-ar"
            for tool in (cc, ar):
                if not tool.is_file():
                    raise ToolchainError(f"ANDROID_NDK_HOME={ndk}: {tool} not found (is it an NDK r21 or newer?)")
            return Toolchain(abi=abi, cc=str(cc), ar=str(ar), label=f"NDK clang ({cc.name}, ANDROID_NDK_HOME={ndk})")
        return Toolchain(abi=abi, cc=ARM_CC, ar="aarch64-linux-gnu-ar", label=f"{ARM_CC} (ANDROID_NDK_HOME not set)")
    if abi == "x86_64":
        return Toolchain(abi=abi, cc=HOST_CC, ar="ar", label=HOST_CC)
    raise ToolchainError(f"no toolchain for ABI '{abi}' (known: arm64-v8a, x86_64)")


def c_identifier(text: str) -> str:
    """A lower-case C identifier from a model's file name: 'MobileNet-v2.onnx' -> 'mobilenet_v2'."""
    ident = re.sub(r"[^0-9a-zA-Z_]+", "_", text).strip("_").lower() or "model"
    return f"m_{ident}" if ident[0].isdigit() else ident


def _file_name(index: int, node: str) -> str:
    return f"w{index:03d}_{re.sub(r'[^0-9A-Za-z_.-]+', '_', node).strip('_.') or 'layer'}"


def packed_floats(rendered) -> int:
    """Floats the kernel's _prepack writes (its XFC_PACKED_FLOATS; depthwise: the filters)."""
    found = re.search(r"#define XFC_PACKED_FLOATS (\d+)L", rendered.source)
    if found:
        return int(found.group(1))
    plan = rendered.plan
    spec = plan.spec
    if getattr(plan, "lowering", "") == "winograd":   # U: (m+2)^2 x C x K rounded up to the register tile
        return winograd_packed_floats(spec, plan.winograd_m, plan.winograd_vectors, plan.gemm.mr, plan.gemm.nr)
    return int(np.prod(spec.operand_shapes[1]))


def _templates() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR / "lib")),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)


def _feed(layer) -> dict:
    if isinstance(layer.feed, ConvFeed):
        return {"input": layer.feed.input_name, "layout": "NCHW as is"}
    f = dataclasses.asdict(layer.feed)
    f["layout"] = ("A: the ONNX operand, last two axes swapped if a_transpose, viewed as a_view, broadcast to "
                   "a_broadcast, reshaped to the input shape; B likewise when b_name is set (not a constant)")
    return f


def emit_library(net: MappedNetwork, syntheses: Mapping, names: Mapping, hw, lib_dir: Path, model_name: str,
                 scratch: Path, progress: Optional[Callable[[str], None]] = None,
                 env: Optional[Mapping[str, str]] = None) -> dict:
    """Write the library's files (module docstring) into lib_dir (a staging directory); objects are
    compiled in scratch. Returns what the report says about the library."""
    from ..cpu.codegen import render_cpu_kernel
    say = progress or (lambda msg: None)
    abi = abi_for(hw)
    tools = select_toolchain(abi, env or {})
    require_tool(tools.cc)
    require_tool(tools.ar)
    prefix = f"xfc_{c_identifier(model_name)}"
    lib_dir = Path(lib_dir)
    src_dir = lib_dir
    kernels, objects = [], []
    nodes_of = {}
    for layer in net.layers:
        nodes_of.setdefault(layer.spec, []).append(layer.name)
    functions = {}
    for i, (spec, syn) in enumerate(syntheses.items(), start=1):
        function = f"{prefix}_{names[spec]}"
        functions[spec] = function
        plan = dataclasses.replace(syn.result.plan, function_name=function)
        rendered = render_cpu_kernel(plan)
        source = src_dir / f"{function}.c"
        write_atomic(source, rendered.source)
        obj = Path(scratch) / f"{function}.o"
        march = plan.gcc_march or ("armv8-a" if abi == "arm64-v8a" else "native")
        say(f"--emit lib: compiling {source.name} for {abi} ({i}/{len(syntheses)})")
        run([tools.cc, *LIB_FLAGS, f"-march={march}", "-c", str(source), "-o", str(obj)],
            f"{abi} compile of {source.name}", COMPILE_TIMEOUT_S)
        objects.append(obj)
        kernels.append({"function": function, "macro": function.upper(), "spec": spec.describe(),
                        "nodes": nodes_of.get(spec, []), "march": march,
                        "in_floats": int(np.prod(spec.operand_shapes[0])),
                        "weight_floats": int(np.prod(spec.operand_shapes[1])),
                        "bias_floats": int(np.prod(spec.operand_shapes[2])),
                        "out_floats": int(np.prod(spec.output_shape)), "packed_floats": packed_floats(rendered)})
    archive_name = f"lib{prefix}-{abi}.a"
    tmp = Path(scratch) / archive_name
    run([tools.ar, "rcs", str(tmp), *map(str, objects)], f"archiving {archive_name}", COMPILE_TIMEOUT_S)
    shutil.copy2(tmp, lib_dir / archive_name)

    context = {"version": __version__, "model": model_name, "hardware": hw.name, "kernels": kernels,
               "header_name": f"{prefix}.h", "guard": f"{prefix.upper()}_H", "macro": prefix.upper(),
               "target": prefix, "abis": [abi]}
    header = lib_dir / f"{prefix}.h"
    write_atomic(header, _templates().get_template("model.h.j2").render(**context))
    write_atomic(lib_dir / "CMakeLists.txt", _templates().get_template("CMakeLists.txt.j2").render(**context))

    layers = []
    by_spec = {k["function"]: k for k in kernels}
    for index, layer in enumerate(net.layers, start=1):
        function = functions[layer.spec]
        stem = _file_name(index, layer.name)
        entry = {"node": layer.name, "nodes": list(layer.nodes), "op": layer.label, "notes": list(layer.notes),
                 "kernel": names[layer.spec], "function": function, "prepack_function": f"{function}_prepack",
                 "packed_function": f"{function}_packed", "packed_floats": by_spec[function]["packed_floats"],
                 "spec": layer.spec.describe(),
                 "input": {"shape": list(layer.spec.operand_shapes[0]), "feed": _feed(layer)},
                 "output": {"tensor": layer.output, "shape": list(layer.spec.output_shape),
                            "onnx_shape": list(layer.out_shape)}}
        if layer.weight is not None:
            write_atomic(lib_dir / f"{stem}.weight.f32", np.ascontiguousarray(layer.weight, "<f4").tobytes())
            entry["weights"] = {"file": f"{stem}.weight.f32", "shape": list(layer.spec.operand_shapes[1]),
                                "dtype": "float32 little-endian"}
        else:
            entry["weights"] = {"tensor": layer.feed.b_name, "shape": list(layer.spec.operand_shapes[1]),
                                "note": "not a constant: computed by the network; call the unpacked function"}
        write_atomic(lib_dir / f"{stem}.bias.f32", np.ascontiguousarray(layer.bias, "<f4").tobytes())
        entry["bias"] = {"file": f"{stem}.bias.f32", "shape": list(layer.spec.operand_shapes[2]),
                         "dtype": "float32 little-endian"}
        layers.append(entry)
    manifest = {"xfc_library": 1, "xfc_version": __version__, "model": model_name, "hardware": hw.name,
                "abis": {abi: {"library": archive_name, "compiler": tools.label}},
                "header": f"{prefix}.h", "cmake": "CMakeLists.txt", "cmake_target": prefix,
                "functions": [{k: v for k, v in k.items() if k != "macro"} for k in kernels],
                "layers": layers,
                "not_covered": [{"node": u.name, "op": u.op_type, "reason": u.reason} for u in net.uncovered]}
    write_atomic(lib_dir / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    say(f"--emit lib: {archive_name} ({abi}, {len(kernels)} layer functions) with {prefix}.h, CMakeLists.txt and "
        f"manifest.json, into the output directory")
    return {"abi": abi, "compiler": tools.label, "library": archive_name, "header": f"{prefix}.h",
            "cmake": "CMakeLists.txt", "manifest": "manifest.json", "cmake_target": prefix, "functions": len(kernels)}
