"""`xfc model --emit lib`: the toolchain per ABI and the names the network library uses.

The library itself (the whole network: kernels, runtime ops, the planned arena, the C API, the
benchmark program) is rendered and built by xfc/model/runtime (emit.py); this module holds what it
shares with the rest of `xfc model`:

  abi_for(hw)            arm64-v8a for AArch64 descriptions, x86_64 for the host
  select_toolchain       the compiler per ABI: arm64-v8a uses the NDK's clang when ANDROID_NDK_HOME is
                         set (XFC_ANDROID_API, default 24), else aarch64-linux-gnu-gcc; x86_64 the host gcc
  c_identifier           the model's C identifier ('MobileNet-v2.onnx' -> mobilenet_v2), so two models'
                         libraries link into one app
  packed_floats          the floats a rendered kernel's _prepack writes
"""
from __future__ import annotations

import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from ..cpu.winograd import packed_floats as winograd_packed_floats
from ..toolchain.cpu import CODE_ALIGN_FLAGS
from ..toolchain.tools import ARM_CC, HOST_CC
from ..errors import ToolchainError

LIB_FLAGS = ("-O3", "-std=gnu11", "-fopenmp", "-fPIC", "-Wall", "-Wno-unused-function", *CODE_ALIGN_FLAGS)
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
