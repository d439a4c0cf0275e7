"""The OpenCL host harness: one shape-free C program (templates/opencl/harness.c.j2) that loads a
kernel file, runs it and reports timings. Built once per source text with the host gcc and cached
under the per-user cache directory (settings.cache_dir()). Returns paths; running it is
xfc.runners.pocl's business.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Optional

from .. import settings
from ..errors import ToolchainError
from ..gpu.codegen import render_harness
from . import procs
from ..outputs import write_atomic
from .tools import APT_PACKAGES as TOOL_PACKAGES

APT_PACKAGES = TOOL_PACKAGES["opencl"]
HARNESS_COMPILE_TIMEOUT_S = 180

_harness_cache: dict[str, Path] = {}


def _cache_root() -> Path:
    return settings.cache_dir()


def _compile_command(source: Path, binary: Path) -> list[str]:
    return ["gcc", "-O2", "-std=c11", "-Wall", str(source), "-o", str(binary), "-lOpenCL", "-lm"]


def build_harness(out_dir: Optional[Path] = None) -> Path:
    """Compile the shape-free harness once per source text (cached); copy it to out_dir if given."""
    source = render_harness()
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    binary = _harness_cache.get(digest)
    if binary is None or not binary.exists():
        if shutil.which("gcc") is None:
            raise ToolchainError(f"gcc not found; the OpenCL harness needs it: apt-get install {APT_PACKAGES}")
        cache = _cache_root() / "opencl-harness" / digest
        binary = cache / "harness"
        if not binary.exists():
            cache.mkdir(parents=True, exist_ok=True)
            src = cache / "harness.c"
            write_atomic(src, source)
            tmp_bin = cache / f".harness.{os.getpid()}"
            try:
                try:
                    proc = procs.run(_compile_command(src, tmp_bin), timeout=HARNESS_COMPILE_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    raise ToolchainError(f"building the OpenCL harness timed out after "
                                         f"{HARNESS_COMPILE_TIMEOUT_S} s") from None
                if proc.returncode != 0:
                    first = next((l for l in proc.stderr.splitlines() if "error" in l), proc.stderr.strip()[:200])
                    raise ToolchainError(f"building the OpenCL harness failed ({first.strip()}); install the OpenCL "
                                         f"headers and loader: apt-get install {APT_PACKAGES}")
                os.replace(tmp_bin, binary)
            finally:  # a failed or interrupted build leaves nothing in the cache
                tmp_bin.unlink(missing_ok=True)
        _harness_cache[digest] = binary
    if out_dir is not None:
        dest = Path(out_dir) / "harness"
        if not dest.exists() or dest.stat().st_size != binary.stat().st_size:
            shutil.copy2(binary, dest)
        return dest
    return binary
