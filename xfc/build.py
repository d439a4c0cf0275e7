"""Build, load, run and time rendered CPU kernels.

Host:  gcc -O3 -march=<plan.gcc_march or native> -fopenmp -shared -fPIC -std=gnu11 -> .so, ctypes.
ARM:   aarch64-linux-gnu-gcc -O3 -static -march=<plan.gcc_march> -fopenmp kernel.c harness.c -> binary,
       run with qemu-aarch64 -cpu <plan.qemu_cpu> (timings are emulator timings, not phone timings).

Every subprocess gets an argument list (never a shell string) and a timeout; every file written
into an output directory goes through a temporary file and os.replace.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from . import procs
from .codegen_cpu import RenderedKernel
from .errors import ToolchainError, VerificationError
from .guards import GuardedBuffer
from .ops import check_output
from .sigill import illegal_instruction_message, is_illegal_instruction

HOST_CC = "gcc"
ARM_CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
COMMON_FLAGS = ("-O3", "-std=gnu11", "-fopenmp", "-Wall", "-Wno-unused-function")
COMPILE_TIMEOUT_S = 180
RUN_TIMEOUT_S = 600

# tool -> Debian package that provides it
_APT = {
    HOST_CC: "gcc",
    ARM_CC: "gcc-aarch64-linux-gnu libc6-dev-arm64-cross",
    QEMU: "qemu-user",
}


@dataclass(frozen=True)
class Measurement:
    samples_s: tuple[float, ...]
    median_s: float
    min_s: float
    max_s: float
    gflops: float          # from the median
    where: str             # 'host' or 'qemu-aarch64 (emulated: not phone timing)'

    @staticmethod
    def from_samples(samples: Sequence[float], flops: int, where: str) -> "Measurement":
        samples = tuple(float(s) for s in samples)
        if not samples:
            raise ToolchainError(f"no timing samples were produced ({where})")
        med = statistics.median(samples)
        return Measurement(samples_s=samples, median_s=med, min_s=min(samples), max_s=max(samples),
                           gflops=(flops / med / 1e9) if med > 0 else float("inf"), where=where)


# ---------------------------------------------------------------------------------------------
# Toolchain checks and small helpers
# ---------------------------------------------------------------------------------------------

def require_tool(tool: str) -> str:
    """Absolute path of tool, or ToolchainError naming it and the package to install."""
    path = shutil.which(tool)
    if path is None:
        pkg = _APT.get(tool, tool)
        raise ToolchainError(f"'{tool}' was not found on PATH; install it with: apt-get install -y {pkg}")
    return path


def _write_atomic(path: Path, data: bytes | str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _run(argv: list[str], what: str, timeout: float, cwd: Optional[Path] = None,
         check: bool = True, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    try:
        proc = procs.run(argv, timeout=timeout, cwd=str(cwd) if cwd else None,
                         env=None if env is None else {**os.environ, **env})
    except subprocess.TimeoutExpired:
        raise ToolchainError(f"{what} timed out after {timeout:.0f} s: {shlex.join(argv)}") from None
    except OSError as exc:
        raise ToolchainError(f"{what} could not start '{argv[0]}': {exc}") from None
    if check and proc.returncode != 0:
        raise _failure(proc, what)
    return proc


def _failure(proc: subprocess.CompletedProcess, what: str) -> ToolchainError:
    first = next((ln for ln in (proc.stderr or proc.stdout).splitlines() if "error" in ln.lower()),
                 (proc.stderr or proc.stdout or "").strip().splitlines()[:1] or [""])
    first = first if isinstance(first, str) else first[0]
    return ToolchainError(f"{what} failed (exit {proc.returncode}): {first.strip()[:300]}")


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:12]


def _write_sources(rendered: RenderedKernel, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    kernel_c = out_dir / f"{rendered.function_name}.c"
    harness_c = out_dir / f"{rendered.function_name}_harness.c"
    for path, text in ((kernel_c, rendered.source), (harness_c, rendered.harness_source)):
        if not path.exists() or path.read_text() != text:
            _write_atomic(path, text)
    return kernel_c, harness_c


def _write_build_script(out_dir: Path, name: str, commands: list[list[str]]) -> Path:
    lines = ["#!/bin/sh", "# Generated by xfc: the exact commands used to build this kernel.", "set -e",
             'cd "$(dirname "$0")"']
    lines += [shlex.join(cmd) for cmd in commands]
    script = out_dir / name
    _write_atomic(script, "\n".join(lines) + "\n")
    script.chmod(0o755)
    return script


# ---------------------------------------------------------------------------------------------
# Host build
# ---------------------------------------------------------------------------------------------

class HostKernel:
    """A kernel compiled for this machine and loaded with ctypes. Call it with numpy arrays."""

    def __init__(self, rendered: RenderedKernel, library: Path):
        self.rendered = rendered
        self.plan = rendered.plan
        self.spec = rendered.plan.spec
        self.library = Path(library)
        self._lib = ctypes.CDLL(str(self.library))
        fp = ctypes.POINTER(ctypes.c_float)
        self._fn = getattr(self._lib, rendered.function_name)
        self._fn.argtypes = [fp, fp, fp, fp]
        self._fn.restype = ctypes.c_int
        self._bench = getattr(self._lib, rendered.bench_name)
        self._bench.argtypes = [fp, fp, fp, fp, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
        self._bench.restype = ctypes.c_int
        self._packed_floats = getattr(self._lib, f"{rendered.function_name}_packed_floats")
        self._packed_floats.argtypes = []
        self._packed_floats.restype = ctypes.c_long
        self._prepack = getattr(self._lib, f"{rendered.function_name}_prepack")
        self._prepack.argtypes = [fp, fp]
        self._prepack.restype = ctypes.c_int
        self._fn_packed = getattr(self._lib, f"{rendered.function_name}_packed")
        self._fn_packed.argtypes = [fp, fp, fp, fp]
        self._fn_packed.restype = ctypes.c_int
        self._bench_packed = getattr(self._lib, f"{rendered.bench_name}_packed")
        self._bench_packed.argtypes = self._bench.argtypes
        self._bench_packed.restype = ctypes.c_int

    _INPUT_NAMES = ("in0", "in1", "bias")

    def _input(self, index: int, arr) -> np.ndarray:
        """Input `index` (0: in0, 1: in1, 2: bias; bias None means zeros) as contiguous fp32 of its shape."""
        shape = tuple(self.spec.input_shapes[index])
        if arr is None and index == 2:
            return np.zeros(shape, np.float32)
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if arr.shape != shape:
            raise VerificationError(f"{self.rendered.function_name}: {self._INPUT_NAMES[index]} has shape "
                                    f"{arr.shape}, expected {shape}")
        return arr

    def _guarded_input(self, index: int, arr) -> GuardedBuffer:
        return GuardedBuffer.copy_of(self._input(index, arr), self._INPUT_NAMES[index])

    def _output(self) -> GuardedBuffer:
        return GuardedBuffer(int(np.prod(self.spec.output_shape)), "out")

    def _check_guards(self, *buffers: GuardedBuffer) -> None:
        for buf in buffers:
            buf.check(self.rendered.function_name)

    @staticmethod
    def _ptr(a):
        a = a.data if isinstance(a, GuardedBuffer) else a
        return a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))

    def __call__(self, in0: np.ndarray, in1: np.ndarray, bias: Optional[np.ndarray] = None) -> np.ndarray:
        """Run once. Inputs are copied into guarded buffers, the output starts as NaN, and every
        guard is checked afterwards (VerificationError naming the buffer and the side)."""
        a, b, c = (self._guarded_input(i, arr) for i, arr in enumerate((in0, in1, bias)))
        out = self._output()
        status = self._fn(self._ptr(a), self._ptr(b), self._ptr(c), self._ptr(out))
        self._check_guards(out, a, b, c)
        if status != 0:
            raise ToolchainError(f"{self.rendered.function_name}: kernel could not allocate its scratch memory")
        return out.data.reshape(self.spec.output_shape)

    def _prepack_guarded(self, b: GuardedBuffer) -> GuardedBuffer:
        packed = GuardedBuffer(int(self._packed_floats()), "packed weights")
        status = self._prepack(self._ptr(b), self._ptr(packed))
        self._check_guards(packed, b)
        if status != 0:
            raise ToolchainError(f"{self.rendered.function_name}: pre-packing the weights failed")
        return packed

    def prepack(self, in1: np.ndarray) -> np.ndarray:
        """The weights (in1) packed once into the layout the kernel's loops read (see gemm.c.j2);
        pass the result to run_packed / time(..., prepacked=True). The packed buffer starts as NaN
        and has guard zones, checked after packing."""
        return self._prepack_guarded(self._guarded_input(1, in1)).data

    def _check_packed(self, packed: np.ndarray) -> GuardedBuffer:
        packed = np.ascontiguousarray(packed, dtype=np.float32).reshape(-1)
        if packed.size != int(self._packed_floats()):
            raise VerificationError(f"{self.rendered.function_name}: packed weights have {packed.size} floats, "
                                    f"expected {int(self._packed_floats())} (from prepack of this kernel)")
        return GuardedBuffer.copy_of(packed, "packed weights")

    def run_packed(self, in0: np.ndarray, packed: np.ndarray, bias: Optional[np.ndarray] = None) -> np.ndarray:
        """Run with weights from prepack() (guarded like __call__)."""
        a, c = self._guarded_input(0, in0), self._guarded_input(2, bias)
        packed = self._check_packed(packed)
        out = self._output()
        status = self._fn_packed(self._ptr(a), self._ptr(packed), self._ptr(c), self._ptr(out))
        self._check_guards(out, a, packed, c)
        if status != 0:
            raise ToolchainError(f"{self.rendered.function_name}: kernel could not allocate its scratch memory")
        return out.data.reshape(self.spec.output_shape)

    def time(self, in0, in1, bias=None, repeats: int = 20, warmup: int = 3, prepacked: bool = False) -> Measurement:
        """Median-of-repeats timing in C. prepacked=True packs the weights once (untimed) and
        times the calls that read them, as libraries with constant weights do. Guards are
        checked after the timed calls."""
        a, b, c = (self._guarded_input(i, arr) for i, arr in enumerate((in0, in1, bias)))
        out = self._output()
        repeats = max(1, int(repeats))
        samples = (ctypes.c_double * repeats)()
        if prepacked:
            packed = self._prepack_guarded(b)
            status = self._bench_packed(self._ptr(a), self._ptr(packed), self._ptr(c), self._ptr(out),
                                        int(warmup), repeats, samples)
            self._check_guards(packed)
        else:
            status = self._bench(self._ptr(a), self._ptr(b), self._ptr(c), self._ptr(out), int(warmup), repeats,
                                 samples)
        self._check_guards(out, a, b, c)
        if status:
            raise ToolchainError(f"{self.rendered.function_name}: kernel could not allocate its scratch memory")
        return Measurement.from_samples(list(samples), self.spec.flops, "host (weights pre-packed)" if prepacked
                                        else "host")

    def verify(self, in0, in1, bias) -> tuple[np.ndarray, float]:
        """Run once and check against the numpy reference; VerificationError if a guard changed,
        an output is not finite (NaN: never written), an error is outside the K-derived bound or
        the RMS error is outside the statistical limit."""
        out = self(in0, in1, bias)
        verdict = check_output(self.spec, out, in0, in1, bias)
        if not verdict.ok:
            raise VerificationError(f"{self.rendered.function_name}: output differs from the reference "
                                    f"({verdict.reason})")
        return out, verdict.worst_ratio


def host_compile_command(rendered: RenderedKernel, kernel_c: Path, harness_c: Path, library: Path) -> list[str]:
    march = rendered.plan.gcc_march or "native"
    return [HOST_CC, *COMMON_FLAGS, f"-march={march}", "-shared", "-fPIC", "-DXFC_NO_MAIN",
            "-o", library.name, str(kernel_c.name), str(harness_c.name)]


def build_host(rendered: RenderedKernel, out_dir: str | os.PathLike) -> HostKernel:
    """Compile kernel + harness (library mode) into a shared object and load it.

    The .so name carries a hash of the sources and flags, so rebuilding an identical kernel is
    free and ctypes never reuses a stale library with the same path.
    """
    require_tool(HOST_CC)
    out_dir = Path(out_dir).resolve()
    kernel_c, harness_c = _write_sources(rendered, out_dir)
    probe = host_compile_command(rendered, kernel_c, harness_c, Path("x.so"))
    library = out_dir / f"lib{rendered.function_name}_{_digest(rendered.source, rendered.harness_source, *probe)}.so"
    cmd = host_compile_command(rendered, kernel_c, harness_c, library)
    _write_build_script(out_dir, "build.sh", [cmd])
    if not library.exists():
        tmp = library.with_name(f".{library.name}.{os.getpid()}.tmp")
        cmd_tmp = host_compile_command(rendered, kernel_c, harness_c, tmp)
        try:
            _run(cmd_tmp, f"host compile of {kernel_c.name}", COMPILE_TIMEOUT_S, cwd=out_dir)
            os.replace(tmp, library)
        finally:
            if tmp.exists():
                tmp.unlink()
    return HostKernel(rendered, library)


# ---------------------------------------------------------------------------------------------
# ARM build and qemu run
# ---------------------------------------------------------------------------------------------

def arm_compile_command(rendered: RenderedKernel, kernel_c: Path, harness_c: Path, binary: Path) -> list[str]:
    march = rendered.plan.gcc_march or "armv8-a"
    return [ARM_CC, *COMMON_FLAGS, "-static", f"-march={march}", "-o", binary.name,
            str(kernel_c.name), str(harness_c.name)]


def build_arm(rendered: RenderedKernel, out_dir: str | os.PathLike) -> Path:
    """Cross-compile kernel + harness into a static aarch64 program; returns its path."""
    require_tool(ARM_CC)
    out_dir = Path(out_dir).resolve()
    kernel_c, harness_c = _write_sources(rendered, out_dir)
    probe = arm_compile_command(rendered, kernel_c, harness_c, Path("x"))
    binary = out_dir / f"{rendered.function_name}_{_digest(rendered.source, rendered.harness_source, *probe)}.aarch64"
    _write_build_script(out_dir, "build_arm.sh", [arm_compile_command(rendered, kernel_c, harness_c, binary)])
    if not binary.exists():
        tmp = binary.with_name(f".{binary.name}.{os.getpid()}.tmp")
        try:
            _run(arm_compile_command(rendered, kernel_c, harness_c, tmp),
                 f"aarch64 compile of {kernel_c.name}", COMPILE_TIMEOUT_S, cwd=out_dir)
            os.replace(tmp, binary)
        finally:
            if tmp.exists():
                tmp.unlink()
    return binary


_QEMU_MODELS: Optional[tuple[str, ...]] = None


def qemu_cpu_models() -> tuple[str, ...]:
    """CPU models this qemu-aarch64 accepts for -cpu (e.g. qemu 7.2 has cortex-a53/a72/a76, no a55)."""
    global _QEMU_MODELS
    if _QEMU_MODELS is None:
        try:  # qemu 7.2 prints the list and exits with status 1
            proc = procs.run([require_tool(QEMU), "-cpu", "help"], timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ToolchainError(f"qemu-aarch64 -cpu help failed: {exc}") from None
        lines = (proc.stdout + proc.stderr).replace("Available CPUs:", " ").split()
        _QEMU_MODELS = tuple(sorted(set(lines)))
    return _QEMU_MODELS


# Exit status of the C harness when a guard zone changed (templates/cpu/harness.c.j2).
HARNESS_EXIT_GUARD = 5


def run_harness(argv_prefix: Sequence[str], binary: str | os.PathLike, spec, in0: np.ndarray, in1: np.ndarray,
                bias: np.ndarray, *, what: str, repeats: int = 1, warmup: int = 0, timeout: float = RUN_TIMEOUT_S,
                prepacked: bool = False, env: Optional[dict] = None,
                march: str = "", cpu_text: str = "") -> tuple[np.ndarray, list[float]]:
    """Run a harness program (templates/cpu/harness.c.j2, with main) as argv_prefix + [binary, ...]
    on raw input files in a temporary directory; returns (output, seconds per timed call).
    A guard violation (exit 5) becomes a one-line VerificationError; an illegal instruction a one-line
    ToolchainError naming march and the CPU (cpu_text); other failures ToolchainError."""
    binary = Path(binary).resolve()
    arrays = [np.ascontiguousarray(x, dtype=np.float32) for x in (in0, in1, bias)]
    for arr, shape, name in zip(arrays, spec.input_shapes, ("in0", "in1", "bias")):
        if arr.shape != tuple(shape):
            raise VerificationError(f"{what}: {name} has shape {arr.shape}, expected {tuple(shape)}")
    with tempfile.TemporaryDirectory(prefix="xfc-run-") as tmp:
        tmp = Path(tmp)
        paths = [tmp / n for n in ("in0.bin", "in1.bin", "bias.bin")]
        for path, arr in zip(paths, arrays):
            _write_atomic(path, arr.tobytes())
        out_path, times_path = tmp / "out.bin", tmp / "times.txt"
        argv = [*argv_prefix, str(binary), *map(str, paths), str(out_path), str(times_path),
                str(int(warmup)), str(max(1, int(repeats)))] + (["prepacked"] if prepacked else [])
        proc = _run(argv, what, timeout, check=False, env=env)
        if proc.returncode == HARNESS_EXIT_GUARD:
            line = next((ln for ln in proc.stderr.splitlines() if "guard violation" in ln), proc.stderr.strip())
            raise VerificationError(f"{what}: {line.replace('xfc harness: ', '').strip()[:300]}")
        if is_illegal_instruction(proc.returncode, proc.stderr):   # never only the emulator's own text
            raise ToolchainError(f"{what}: " + illegal_instruction_message(march, cpu_text))
        if proc.returncode != 0:
            raise _failure(proc, what)
        out = np.fromfile(out_path, dtype=np.float32)
        expected = int(np.prod(spec.output_shape))
        if out.size != expected:
            raise ToolchainError(f"{binary.name} wrote {out.size} floats, expected {expected}")
        samples = [float(x) for x in times_path.read_text().split()]
    return out.reshape(spec.output_shape), samples


def run_qemu(binary: str | os.PathLike, spec, in0: np.ndarray, in1: np.ndarray, bias: np.ndarray,
             qemu_cpu: str = "max", repeats: int = 1, warmup: int = 0,
             timeout: float = RUN_TIMEOUT_S, prepacked: bool = False,
             march: str = "") -> tuple[np.ndarray, Measurement]:
    """Run an aarch64 harness binary under qemu-aarch64 -cpu qemu_cpu; returns (output, timing).
    prepacked=True makes the harness pack the weights once and run the pre-packed entry point.
    The harness pre-fills the output with NaN and checks guard zones (VerificationError)."""
    require_tool(QEMU)
    qemu_cpu = qemu_cpu or "max"
    if qemu_cpu not in qemu_cpu_models():
        raise ToolchainError(f"qemu-aarch64 has no CPU model '{qemu_cpu}' (available: {', '.join(qemu_cpu_models())})")
    out, samples = run_harness([QEMU, "-cpu", qemu_cpu], binary, spec, in0, in1, bias,
                               what=f"qemu-aarch64 run of {Path(binary).name}", repeats=repeats, warmup=warmup,
                               timeout=timeout, prepacked=prepacked, march=march,
                               cpu_text=f"emulated CPU: qemu-aarch64 -cpu {qemu_cpu}")
    where = f"qemu-aarch64 -cpu {qemu_cpu} (emulated: not phone timing)"
    return out, Measurement.from_samples(samples, spec.flops, where)
