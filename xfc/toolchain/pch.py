"""Precompiled ISA headers: gcc parses <immintrin.h> or <arm_neon.h> once per compiler and flag set.

Much of a kernel's compile time is not the kernel but gcc parsing <immintrin.h> or <arm_neon.h>
(benchmarks/compile_time.py times builds both ways: host kernels 1.7-2.75x faster with the header
precompiled, aarch64 ones 1.25-1.7x, on a 2-vCPU EPYC). The header is compiled once into

    <cache_dir>/pch/<digest of compiler, its version and target, the flags, the header>/xfc_isa.h.gch

and every compile whose sources include it gets `-include .../xfc_isa.h`, which gcc reads from the
.gch. The kernels include the same header themselves (its include guard makes that a no-op), so
what is built is byte-identical with or without it: artifact digests and the build.sh beside a
kernel leave it out, and a compile that fails with it is retried without it before it counts as a
failure. gcc ignores a .gch that does not match its options and parses the header instead, so a
stale or foreign file can only cost time, never change a kernel.

XFC_PCH=off turns it off (xfc.settings.precompiled_headers). Only gcc is given one (clang's NDK
toolchain has its own mechanism); a cache that cannot be written means compiling without.
"""
from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from .. import settings
from ..errors import ToolchainError
from .tools import COMPILE_TIMEOUT_S, digest, run

HEADER_NAME = "xfc_isa.h"
# the one header per architecture worth precompiling: the others together parse in ~0.05 s
ISA_HEADERS = ("immintrin.h", "arm_neon.h")
# flags that only choose what the compile outputs (object, assembly, a linked file): not given to the
# header's compile (-S there would write assembly, not a .gch) and left out of the digest, so one
# .gch serves a kernel's build and its llvm-mca assembly alike
_OUTPUT_KIND = frozenset({"-shared", "-static", "-c", "-S"})


@functools.lru_cache(maxsize=None)
def _compiler_identity(cc_path: str) -> Optional[str]:
    """'<path> <version> <target>' of a gcc, or None for another compiler (or one that will not say)."""
    try:
        proc = run([cc_path, "-v"], f"{cc_path} -v", 30, check=False)
    except ToolchainError:
        return None
    said = [ln.strip() for ln in proc.stderr.splitlines() if ln.startswith(("Target:", "gcc version"))]
    if proc.returncode != 0 or not any(ln.startswith("gcc version") for ln in said):
        return None
    stat = os.stat(cc_path)
    return f"{cc_path} {stat.st_size} {stat.st_mtime_ns} {'; '.join(said)}"


def header_for(sources: Sequence[str]) -> Optional[str]:
    """The ISA header a source includes, or None (a generic kernel includes none). The other
    sources of the same compile get it too: declarations they never use, which change no object."""
    for header in ISA_HEADERS:
        if any(f"#include <{header}>" in text for text in sources):
            return header
    return None


def include_flags(cc: str, flags: Sequence[str], sources: Sequence[str],
                  environ=None) -> list[str]:
    """['-include', <header>] whose .gch was compiled with cc and flags (built now when missing),
    or [] when there is none to use: turned off, not gcc, no ISA header, or the cache not writable."""
    if not settings.precompiled_headers(environ):
        return []
    header = header_for(sources)
    cc_path = shutil.which(cc)
    identity = _compiler_identity(cc_path) if cc_path else None
    if header is None or identity is None:
        return []
    flags = [f for f in flags if f not in _OUTPUT_KIND]
    text = f"/* xfc: precompiled for {' '.join(flags)} */\n#include <{header}>\n"
    directory = settings.cache_dir(environ) / "pch" / digest(identity, *flags, text)
    if not (directory / f"{HEADER_NAME}.gch").exists() and not _build(cc_path, flags, header, text, directory):
        return []
    return ["-include", str(directory / HEADER_NAME)]


def _build(cc_path: str, flags: list[str], header: str, text: str, directory: Path) -> bool:
    """Compile the header into directory (staged beside it, renamed into place: concurrent builders
    race harmlessly). False when it cannot be done."""
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    except OSError:
        return False
    try:
        (staging / HEADER_NAME).write_text(text)
        proc = run([cc_path, *flags, "-x", "c-header", HEADER_NAME, "-o", f"{HEADER_NAME}.gch"],
                   f"precompiling <{header}>", COMPILE_TIMEOUT_S, cwd=staging, check=False)
        if proc.returncode != 0:
            return False
        if not directory.exists():   # never over a directory already there (rename would replace an empty one)
            try:
                os.rename(staging, directory)
            except OSError:          # another process put it there first
                pass
        return (directory / f"{HEADER_NAME}.gch").exists()
    except (OSError, ToolchainError):
        return False
    finally:
        shutil.rmtree(staging, ignore_errors=True)
