"""The tools xfc runs and the one way it runs them.

  require_tool(name)      absolute path, or ToolchainError naming the Debian package to install
  run(argv, what, ...)    a child process (argument list, timeout, own process group via procs),
                          returning its CompletedProcess; failures become one ToolchainError line
  failure(proc, what)     that one line for a process that exited non-zero
  digest(*texts)          a short content hash (cache keys, file names of build products)

Every subprocess xfc starts goes through `run` (or procs.run for callers that read the exit
status themselves): an argument list, never a shell string, and a timeout.
"""
from __future__ import annotations

import hashlib
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Mapping, Optional

from ..errors import ToolchainError
from . import procs

HOST_CC = "gcc"
ARM_CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
COMPILE_TIMEOUT_S = 180
RUN_TIMEOUT_S = 600

# tool -> Debian packages that provide it (and what it needs to be useful)
APT_PACKAGES = {
    HOST_CC: "gcc",
    ARM_CC: "gcc-aarch64-linux-gnu libc6-dev-arm64-cross",
    QEMU: "qemu-user",
    "opencl": "gcc ocl-icd-opencl-dev opencl-headers pocl-opencl-icd",
}


def install_hint(tool: str) -> str:
    return f"apt-get install -y {APT_PACKAGES.get(tool, tool)}"


def require_tool(tool: str) -> str:
    """Absolute path of tool, or ToolchainError naming it and the package to install."""
    path = shutil.which(tool)
    if path is None:
        raise ToolchainError(f"'{tool}' was not found on PATH; install it with: {install_hint(tool)}")
    return path


def run(argv: list[str], what: str, timeout: float, cwd: Optional[Path] = None, check: bool = True,
        env: Optional[Mapping[str, str]] = None,
        errors: Optional[Mapping[int, type]] = None) -> subprocess.CompletedProcess:
    """Run argv (procs.run: own process group, stopped as a group on timeout or interrupt).

    env: variables added to the inherited environment. check: a non-zero exit raises the one-line
    failure(), as ToolchainError or as errors[exit status] (e.g. a driver's 'wrong result' status).
    """
    try:
        # A private TMPDIR that xfc removes afterwards: the group is stopped with SIGTERM on an
        # interrupt, and a cc1 or as that was still starting can create its temporary file after
        # the gcc driver has deleted the ones it knew of; that file must not stay in the user's TMPDIR.
        with tempfile.TemporaryDirectory(prefix="xfc-tool-", ignore_cleanup_errors=True) as private_tmp:
            proc = procs.run(argv, timeout=timeout, cwd=str(cwd) if cwd else None,
                             env_extra={"TMPDIR": private_tmp, **(env or {})})
    except subprocess.TimeoutExpired:
        raise ToolchainError(f"{what} timed out after {timeout:.0f} s: {shlex.join(argv)}") from None
    except OSError as exc:
        raise ToolchainError(f"{what} could not start '{argv[0]}': {exc}") from None
    if check and proc.returncode != 0:
        raise failure(proc, what, (errors or {}).get(proc.returncode, ToolchainError))
    return proc


def failure(proc: subprocess.CompletedProcess, what: str, kind: type = ToolchainError) -> Exception:
    """One line for a failed process: its first line mentioning 'error', else its first line."""
    first = next((ln for ln in (proc.stderr or proc.stdout).splitlines() if "error" in ln.lower()),
                 (proc.stderr or proc.stdout or "").strip().splitlines()[:1] or [""])
    first = first if isinstance(first, str) else first[0]
    return kind(f"{what} failed (exit {proc.returncode}): {first.strip()[:300]}")


def digest(*parts: str) -> str:
    """12 hex digits of sha256 over the parts (NUL-separated)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:12]
