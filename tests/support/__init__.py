"""Helpers shared by the test files: spec builders, tool checks, host ISAs, coverage records,
epilogue checks, the compiled-code inspection used instead of restating the cost model, and
process trees with their listening sockets read from /proc (the Ray node tests).

Host ISAs: kernels of every x86-64 ISA (avx512, avx2, generic) are built for every machine (gcc
emits AVX-512 code on any x86-64 CPU); they are run only where the host, as xfc sees it, runs that
ISA (`xfc.hardware.host.available_isas`, which honours XFC_HOST_ISA); elsewhere a fixed one in
three is compiled only (compile_if_sampled). What was compiled, what ran
and why something did not run is recorded on the test (`record`) and printed at the end of the
run by conftest.py, so a smaller machine reports what it could not do instead of skipping.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import pytest

from xfc.toolchain.tools import ARM_CC, HOST_CC, QEMU
from xfc.errors import ToolchainError
from xfc.toolchain.cpu import COMMON_FLAGS, build_host, compile_with_pch, host_compile_command
from xfc.runners.base import Measurement, RunSpec
from xfc.runners.host import HostKernel
from xfc.runners.qemu import QemuRunner
from xfc.cpu.plans import hand_plan
from xfc.cpu.codegen import render_cpu_kernel
from xfc.settings import HOST_ISA_ENV, host_isa_cap
from xfc.hardware.host import HOST_ISAS, available_isas, describe_host, parse_cpuinfo
from xfc.hardware.load import load
from xfc.ops.reference import check_output, make_inputs, reference
from xfc.ops.spec import make_spec

# ---------------------------------------------------------------------------------------------
# Tools
# ---------------------------------------------------------------------------------------------

HAVE_ARM = shutil.which(ARM_CC) is not None and shutil.which(QEMU) is not None
needs_arm = pytest.mark.skipif(not HAVE_ARM, reason=f"{ARM_CC} or {QEMU} not installed")


def _find_adb() -> Optional[str]:
    from android_runner.testbed import find_adb
    return find_adb()


HAVE_ADB = _find_adb() is not None
needs_adb = pytest.mark.skipif(not HAVE_ADB, reason="no adb binary")
# The OpenCL harness needs headers and the ICD loader to build, and an installed ICD (PoCL) to run.
HAVE_OPENCL = (Path("/usr/include/CL/cl.h").exists()
               and any(Path(d, "libOpenCL.so").exists() for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"))
               and any(Path(os.environ.get("OCL_ICD_VENDORS", "/etc/OpenCL/vendors")).glob("*.icd")))
needs_opencl = pytest.mark.skipif(not HAVE_OPENCL, reason="no OpenCL headers, loader or ICD (apt-get install "
                                  "pocl-opencl-icd ocl-icd-opencl-dev opencl-headers)")


# onnxruntime (the test extra): the reference `xfc model --verify` and `--bench` compare with. Found,
# not imported (a broken install then fails the tests that use it instead of skipping them).
HAVE_ONNXRUNTIME = importlib.util.find_spec("onnxruntime") is not None
needs_onnxruntime = pytest.mark.skipif(not HAVE_ONNXRUNTIME, reason="onnxruntime is not installed (xfc[test]; "
                                       "xfc model --verify and --bench compare with it)")


def signals_as_default() -> None:
    """preexec_fn for a child a test will interrupt: SIGINT and SIGTERM at their default
    dispositions and unblocked, whatever the test runner's worker inherited or set."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def host_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# ---------------------------------------------------------------------------------------------
# Spec builders
# ---------------------------------------------------------------------------------------------

def mm(m, n, k, batch=1, bias=False, act="none"):
    return make_spec("matmul", dict(m=m, n=n, k=k, batch=batch), bias=bias, activation=act)


def conv(c, h, w, k, r, s, n=1, stride=1, pad=0, dilation=1, bias=False, act="none"):
    return make_spec("conv2d", dict(n=n, c=c, h=h, w=w, k=k, r=r, s=s), stride=stride, pad=pad,
                     dilation=dilation, bias=bias, activation=act)


def dw(c, h, w, r, s, n=1, stride=1, pad=0, dilation=1, bias=False, act="none"):
    return make_spec("depthwise", dict(n=n, c=c, h=h, w=w, r=r, s=s), stride=stride, pad=pad,
                     dilation=dilation, bias=bias, activation=act)


# ---------------------------------------------------------------------------------------------
# Coverage records (printed by conftest.py's pytest_terminal_summary)
# ---------------------------------------------------------------------------------------------

COVERAGE_KEY = "xfc_coverage"
_current_item = None


def set_current_item(item) -> None:
    global _current_item
    _current_item = item


def record(target: str, status: str, reason: str = "") -> None:
    """Note on the running test that `target` (an ISA or 'neon (qemu)', ...) was 'compiled' only
    (with the reason it did not run) or 'ran'. Travels to the xdist controller in user_properties."""
    if _current_item is not None:
        _current_item.user_properties.append((COVERAGE_KEY, (target, status, reason)))


# ---------------------------------------------------------------------------------------------
# Host ISAs
# ---------------------------------------------------------------------------------------------

RUNNABLE_ISAS: tuple[str, ...] = available_isas()
ALL_HOST_ISAS: tuple[str, ...] = HOST_ISAS


def supported_by_cpu() -> tuple[str, ...]:
    """The host ISAs this CPU runs, ignoring XFC_HOST_ISA."""
    from xfc.hardware.host import supported_isas
    return supported_isas(parse_cpuinfo(Path("/proc/cpuinfo").read_text())["flags"])


def why_not_runnable(isa: str) -> str:
    cap = host_isa_cap()
    if cap is not None and isa in HOST_ISAS[:HOST_ISAS.index(cap)]:
        return f"host limited to {cap} by {HOST_ISA_ENV}"
    return f"this CPU has no {isa}"


@functools.lru_cache(maxsize=None)
def host_description(isa: str):
    """The host as an `isa` core: `--hw host:<isa>` where this machine runs it; otherwise the same
    facts with that ISA's CPU flags added, for synthesis and compilation only (never run)."""
    if isa in RUNNABLE_ISAS:
        return load(f"host:{isa}")   # the described host (no probe): the same plans on every run
    info = parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    from xfc.hardware.host import X86_64_V4_FLAGS
    info["flags"] = set(info["flags"]) | set(X86_64_V4_FLAGS)
    from xfc.hardware.host import read_caches
    return describe_host(info, read_caches(), host_cpus(), "x86_64", isa=isa)


def host_march(isa: str) -> str:
    return host_description(isa).cluster().core.gcc_march


def host_plan(spec, isa: str, threads: int = 1, **overrides):
    """hand_plan for an x86-64 ISA with that ISA's -march (not 'native': an AVX-512 kernel must
    compile on an AVX2-only machine too)."""
    overrides.setdefault("gcc_march", host_march(isa))
    return hand_plan(spec, isa, threads, **overrides)


def host_kernel(rendered, out_dir: Path) -> HostKernel:
    """Build a rendered kernel for this machine (xfc.toolchain.cpu) and load it (xfc.runners.host), every
    call guarded (guard zones, NaN-filled outputs: the tests' machinery)."""
    return HostKernel(rendered, build_host(rendered, out_dir), guarded=True)


def qemu_run(binary, spec, a, b, bias, *, qemu_cpu: str = "max", prepacked: bool = False, repeats: int = 1,
             warmup: int = 0, march: str = "") -> Measurement:
    """One run of a static aarch64 CPU harness under qemu-aarch64 (xfc.runners.qemu.QemuRunner):
    the Measurement carries the output, shaped as spec.output_shape."""
    return QemuRunner(cpu=qemu_cpu).execute(RunSpec(
        harness=Path(binary), inputs=(a, b, bias), repeat=repeats, warmup=warmup, timeout_s=600,
        output_shape=tuple(spec.output_shape), protocol="times-file", prepacked=prepacked, march=march,
        input_shapes=tuple(tuple(s) for s in spec.operand_shapes), flops=spec.flops))


def compile_only(rendered, out_dir: Path) -> Path:
    """Compile kernel + harness into a shared object exactly as build_host does, without loading it
    (loading is harmless, calling it is not on a CPU without the ISA)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    kernel_c = out_dir / f"{rendered.function_name}.c"
    harness_c = out_dir / f"{rendered.function_name}_harness.c"
    kernel_c.write_text(rendered.source)
    harness_c.write_text(rendered.harness_source)
    library = out_dir / f"lib{rendered.function_name}.compile-only.so"
    command = host_compile_command(rendered, kernel_c, harness_c, library)
    (out_dir / "build.sh").write_text("#!/bin/sh\n# compile only (this CPU cannot run the kernel)\nset -e\n"
                                      'cd "$(dirname "$0")"\n' + shlex.join(command) + "\n")
    try:   # with the precompiled ISA header, as build_host compiles (the same bytes: tests/test_pch.py)
        compile_with_pch(command, f"compile-only build of {kernel_c.name}", (rendered.source,), cwd=out_dir)
    except ToolchainError as exc:
        pytest.fail(f"{rendered.function_name} ({rendered.isa}) does not compile: {exc}")
    return library


# Where this CPU cannot run an ISA (AVX-512 on an AVX2 machine), a kernel can only be compiled, and
# compiling them all was ~2 CPU-minutes of `make test` on 2 cores. One in COMPILE_ONLY_EVERY is
# compiled, chosen by its source's digest (the same ones on every run and machine); the coverage
# summary counts the others. XFC_TEST_COMPILE_EVERY=1 compiles every one. A CPU that runs the ISA
# builds and runs every kernel.
COMPILE_ONLY_EVERY = int(os.environ.get("XFC_TEST_COMPILE_EVERY", "3"))


def compile_if_sampled(rendered, out_dir: Path, every: int = COMPILE_ONLY_EVERY) -> Optional[Path]:
    """For a kernel this CPU cannot run: compile_only it if it is one of the sampled ones (every=1:
    always), and record what was done. Returns the library, or None when it was left out."""
    isa = rendered.plan.isa
    digest_value = int(hashlib.sha256(rendered.source.encode()).hexdigest()[:8], 16)
    if every > 1 and digest_value % every:
        record(isa, "sampled out", f"one in {every} compiled where the CPU cannot run it")
        return None
    library = compile_only(rendered, out_dir)
    record(isa, "compiled", why_not_runnable(isa))
    return library


def run_host_plan(plan, build_dir: Path, seed: int = 0, what: str = ""):
    """Build `plan`; where this host runs its ISA, run it and check it against numpy (and its
    clamps); else compile it only (compile_if_sampled). Returns (kernel or None, output or None)."""
    rendered = render_cpu_kernel(plan)
    if plan.isa not in RUNNABLE_ISAS:
        compile_if_sampled(rendered, build_dir)
        return None, None
    kernel = host_kernel(rendered, build_dir)
    a, b, bias = make_inputs(plan.spec, seed=seed)
    out = kernel(a, b, bias)
    assert_verified(plan.spec, out, a, b, bias, what or f"{plan.function_name} isa={plan.isa}")
    record(plan.isa, "ran")
    return kernel, out


# ---------------------------------------------------------------------------------------------
# Verification with epilogues that bite
# ---------------------------------------------------------------------------------------------

def assert_clamps_exercised(spec, reference_output) -> None:
    """Every ReLU/ReLU6 case must actually cross its clamps, or a kernel that forgets one passes:
    ReLU needs outputs clamped to 0 and outputs above 0; ReLU6 also outputs clamped to 6 and
    outputs strictly between 0 and 6 (make_inputs scales ReLU6 operands for that)."""
    act = spec.epilogue.activation
    if act == "none":
        return
    ref = np.asarray(reference_output, dtype=np.float64)
    counts = {"at 0": int(np.count_nonzero(ref == 0.0)), "above 0": int(np.count_nonzero(ref > 0.0))}
    if act == "relu6":
        counts = {"at 0": counts["at 0"], "at 6": int(np.count_nonzero(ref == 6.0)),
                  "between": int(np.count_nonzero((ref > 0.0) & (ref < 6.0)))}
    missing = [k for k, v in counts.items() if v == 0]
    assert not missing, f"{spec.describe()}: the {act} epilogue is not exercised ({counts} of {ref.size} outputs)"


def assert_verified(spec, out, a, b, bias, what: str = "") -> None:
    """check_output within the K-derived bound, and the epilogue clamps crossed."""
    ok, max_err, ratio = check_output(spec, out, a, b, bias)
    assert ok, f"{what}: {spec.describe()}: err {max_err:.3g} ratio {ratio:.3g}"
    assert_clamps_exercised(spec, reference(spec, a, b, bias))


def assert_clamps_for_seed(spec, seed: int = 0) -> None:
    """assert_clamps_exercised for the inputs make_inputs(spec, seed) (kernels run elsewhere: CLI,
    GPU harness, qemu through a runner)."""
    if spec.epilogue.activation != "none":
        assert_clamps_exercised(spec, reference(spec, *make_inputs(spec, seed)))


# ---------------------------------------------------------------------------------------------
# Timing sanity without wall-clock thresholds
# ---------------------------------------------------------------------------------------------

def assert_samples_positive(samples) -> None:
    samples = list(samples)
    assert samples and all(s > 0 for s in samples), f"timing samples must all be > 0: {samples}"


# ---------------------------------------------------------------------------------------------
# The compiled micro-kernel: registers and spills read from the assembly
# ---------------------------------------------------------------------------------------------

_X86_FMA = re.compile(r"^\s*(?:vfmadd\d*ps|addps)\s+(.*)$")   # generic x86-64: mulps + addps
_ARM_FMA = re.compile(r"^\s*fmla\s+(v\d+)\.4s,\s*(.*)$")
_LABEL = re.compile(r"^\s*(\.L\w+|\d+):")   # numeric: inline assembly's local labels ('1:' ... 'b.ne 1b')
# Conditional branches only: gcc tests loops at the bottom, and an unconditional backward jump is
# often just block layout.
_JUMP = re.compile(r"^\s*(j(?!mp)\w+|b\.?(?:eq|ne|cs|hs|cc|lo|mi|pl|vs|vc|hi|ls|ge|lt|gt|le)|cbnz|cbz|tbnz|tbz)"
                   r"\s+(?:.*,\s*)?(\.L\w+|\d+b)\s*$")
_X86_STACK_VECTOR = re.compile(r"%[xyz]mm\d+.*\(%(rsp|rbp)\)|\(%(rsp|rbp)\).*%[xyz]mm\d+")
_ARM_STACK_VECTOR = re.compile(r"^\s*(ldr|str|ldp|stp|ldur|stur)\s+[qd]\d+.*\[sp")


def compile_to_asm(rendered, out_dir: Path, arm: bool) -> str:
    """The kernel translation unit compiled with -S, with the flags the real build uses."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    src = out_dir / f"{rendered.function_name}.c"
    src.write_text(rendered.source)
    asm = src.with_suffix(".s")
    cc = ARM_CC if arm else HOST_CC
    march = rendered.plan.gcc_march or ("armv8-a" if arm else "x86-64")
    try:
        compile_with_pch([cc, *COMMON_FLAGS, f"-march={march}", "-S", "-o", asm.name, src.name],
                         f"-S compile of {src.name}", (rendered.source,), cwd=out_dir)
    except ToolchainError as exc:
        pytest.fail(f"{rendered.function_name} does not compile: {exc}")
    return asm.read_text()


def hot_loop(asm: str, arm: bool) -> list[str]:
    """The unrolled k loop of the full register tile: of the innermost loops (a label and a
    backward branch to it, with no such loop inside) the one with the most FMA instructions."""
    lines = asm.splitlines()
    fma = _ARM_FMA if arm else _X86_FMA
    labels: dict[str, int] = {}
    loops = []
    for i, line in enumerate(lines):
        m = _LABEL.match(line)
        if m:
            labels[m.group(1)] = i
            continue
        j = _JUMP.match(line)
        target = j.group(2)[:-1] if j and j.group(2)[0].isdigit() else (j.group(2) if j else None)
        if target in labels:   # '1b': the nearest '1:' above, which is the one labels holds now
            start = labels[target]
            fmas = sum(1 for ln in lines[start:i + 1] if fma.match(ln))
            if fmas:
                loops.append((start, i, fmas))
    innermost = [lp for lp in loops
                 if not any(o != lp and lp[0] <= o[0] and o[1] <= lp[1] for o in loops)]
    if not innermost:
        return []
    start, end, _ = max(innermost, key=lambda lp: (lp[2], -(lp[1] - lp[0])))
    return lines[start:end + 1]


def fma_count(loop: list[str], arm: bool) -> int:
    fma = _ARM_FMA if arm else _X86_FMA
    return sum(1 for ln in loop if fma.match(ln))


def fma_accumulators(loop: list[str], arm: bool) -> set[str]:
    """Destination registers of the FMAs in a loop (AT&T: last operand; AArch64: first)."""
    regs = set()
    for line in loop:
        if arm:
            m = _ARM_FMA.match(line)
            if m:
                regs.add(m.group(1))
        else:
            m = _X86_FMA.match(line)
            if m:
                regs.add(m.group(1).split(",")[-1].strip())
    return regs


def vector_registers_used(loop: list[str], arm: bool) -> set[str]:
    pattern = re.compile(r"\bv(\d+)\.|\b[qs](\d+)\b" if arm else r"%[xyz]mm(\d+)")
    return {next(g for g in m.groups() if g is not None) for ln in loop for m in pattern.finditer(ln)}


def stack_vector_accesses(loop: list[str], arm: bool) -> list[str]:
    """Vector loads/stores addressed off the stack inside the loop: register spills."""
    pattern = _ARM_STACK_VECTOR if arm else _X86_STACK_VECTOR
    return [ln.strip() for ln in loop if pattern.search(ln)]


# ---------------------------------------------------------------------------------------------
# A recorded x86-64 host: the same description on every machine (for tests whose expectations
# must not depend on the caches or core count of the machine they run on)
# ---------------------------------------------------------------------------------------------

RECORDED_CPUINFO = ("processor\t: 0\nmodel name\t: recorded x86-64 test host\ncpu MHz\t\t: 3000.000\n"
                    "flags\t\t: fpu sse sse2 pni ssse3 cx16 sse4_1 sse4_2 popcnt lahf_lm movbe xsave avx f16c fma abm bmi1 avx2 bmi2 avx512f avx512dq avx512cd avx512bw avx512vl\n")
RECORDED_CACHES = {"L1d": {"size_kib": 48, "line_bytes": 64, "ways": 12, "shared_by_cores": 1},
                   "L2": {"size_kib": 1024, "line_bytes": 64, "ways": 16, "shared_by_cores": 1},
                   "L3": {"size_kib": 32768, "line_bytes": 64, "ways": 16, "shared_by_cores": 8}}


def recorded_host(isa: str, cpus: int = 8):
    """A fixed 8-CPU x86-64 host described as an `isa` core (synthesis and compilation only)."""
    return describe_host(parse_cpuinfo(RECORDED_CPUINFO), RECORDED_CACHES, cpus, "x86_64", isa=isa)


def with_cores(hw, cores: int):
    """hw with its first cluster widened to `cores` cores: synthesized plans with 3, 5, 8 threads
    on a machine with fewer CPUs (OpenMP runs them oversubscribed; the numbers must not change)."""
    import dataclasses
    first = dataclasses.replace(hw.clusters[0], count=cores, cpu_ids=tuple(range(cores)))
    return dataclasses.replace(hw, clusters=(first, *hw.clusters[1:]))


# ---------------------------------------------------------------------------------------------
# Process trees and their listening sockets (Ray nodes: tests/test_ray_cluster.py), read from
# /proc: the process list, not Ray's word
# ---------------------------------------------------------------------------------------------

def _proc_stat(pid: int) -> Optional[list[str]]:
    """/proc/<pid>/stat fields after the command name (state, ppid, pgrp, session, ...), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_identity(pid: int) -> Optional[tuple[int, int]]:
    """(pid, start time in clock ticks) of a live (not zombie) process: a reused pid differs."""
    fields = _proc_stat(pid)
    if fields is None or fields[0] == "Z":
        return None
    return pid, int(fields[19])


def still_running(identities) -> list[tuple[int, int]]:
    """The (pid, start time) pairs whose process is still alive."""
    return [ident for ident in identities if process_identity(ident[0]) == ident]


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _proc_stat(int(entry.name))
            if fields is not None and fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def process_tree(root: int, children: Optional[dict[int, list[int]]] = None) -> list[int]:
    """root and every live descendant (by parent pid)."""
    children = _children() if children is None else children
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def session_members(sid: int) -> list[int]:
    """Live processes of session sid."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _proc_stat(int(entry.name))
            if fields is not None and fields[0] != "Z" and int(fields[3]) == sid:
                out.append(int(entry.name))
    return out


def session_of(pid: int) -> Optional[int]:
    fields = _proc_stat(pid)
    return None if fields is None else int(fields[3])


def _address(hex_ip: str) -> str:
    import ipaddress
    raw = bytes.fromhex(hex_ip)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    return str(ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))))


def listening_sockets() -> dict[str, tuple[str, int]]:
    """Socket inode -> (address, port) of every TCP socket in LISTEN state (/proc/net/tcp, tcp6)."""
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":                                   # TCP_LISTEN
                ip, port = fields[1].split(":")
                out[fields[9]] = (_address(ip), int(port, 16))
    return out


def listening_ports() -> set[int]:
    return {port for _, port in listening_sockets().values()}


def listening_inodes(root: int) -> set[str]:
    """Inodes of the listening sockets held by root's process tree (a socket's identity: a socket
    opened later on the same port number is another inode)."""
    sockets = listening_sockets()
    return {inode for pid in process_tree(root) for inode in _socket_inodes(pid) if inode in sockets}


def _socket_inodes(pid: int) -> list[str]:
    """Inodes of the sockets a process has open (none once it is gone)."""
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return []
    found = []
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            found.append(target[8:-1])
    return found


def process_command(pid: int) -> str:
    """A process's command line, arguments joined by spaces ('' once it is gone). Ray's workers and
    agents rewrite theirs ('ray::IDLE', 'ray::RuntimeEnvAgent')."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def tree_listeners(root: int) -> list[tuple[int, str, str, int]]:
    """(pid, command line, address, port) of every listening socket held by root's process tree."""
    return listeners_by_tree({root: root})[root]


BENCHMARKS = Path(__file__).resolve().parent.parent.parent / "benchmarks"


def load_benchmark(name: str, module_name: Optional[str] = None):
    """benchmarks/<name>.py loaded as a module (as `module_name`, default its own name). The scripts
    import their siblings as top-level modules: put those in sys.modules first (monkeypatch)."""
    spec = importlib.util.spec_from_file_location(module_name or name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def benchmark_with_siblings(name: str, siblings: tuple[str, ...], module_name: Optional[str] = None):
    """benchmarks/<name>.py loaded (load_benchmark) while the benchmarks it imports as top-level
    modules (`siblings`) stand in sys.modules; they are taken out again on exit."""
    with pytest.MonkeyPatch.context() as patch:
        for sibling in siblings:
            patch.setitem(sys.modules, sibling, load_benchmark(sibling))
        yield load_benchmark(name, module_name)


def listeners_by_tree(roots: dict) -> dict:
    """tree_listeners of several roots ({label: root pid} -> {label: [...]}), /proc read once."""
    sockets, children = listening_sockets(), _children()
    out = {}
    for label, root in roots.items():
        out[label] = []
        for pid in process_tree(root, children):
            for inode in _socket_inodes(pid):
                if inode in sockets:
                    out[label].append((pid, process_command(pid), *sockets[inode]))
    return out


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1, or an IPv4-mapped loopback address (::ffff:127.x.y.z)."""
    import ipaddress
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def stop_node_processes(procs, grace_s: float = 40.0) -> None:
    """Test clean-up for `xfc cluster head|join` children (each started with start_new_session): every
    process of their trees and of the sessions under them (Ray's `ray start` runs in its own) is
    listed first; each xfc gets SIGTERM and grace_s to stop its node; whatever is still alive of
    those lists is SIGKILLed."""
    listed, sessions = set(), set()
    for proc in procs:
        for pid in process_tree(proc.pid):
            ident = process_identity(pid)
            if ident:
                listed.add(ident)
                sessions.add(session_of(pid))
    for proc in procs:
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    end = time.monotonic() + grace_s
    while time.monotonic() < end and any(p.poll() is None for p in procs):
        time.sleep(0.2)
    left = set(still_running(listed))
    for sid in sessions - {None, os.getsid(0)}:
        left |= {i for i in map(process_identity, session_members(sid)) if i}
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for proc in procs:
        proc.wait(timeout=30)


# ---------------------------------------------------------------------------------------------
# int8 kernels through the one chain (xfc.pipeline.stages): plan, build, verify both entry points
# ---------------------------------------------------------------------------------------------

def compile_int8(spec, quant, hw, work_dir, *, threads=None, flags=frozenset(), **forced):
    """(plan, built): the int8 plan (xfc.cpu.int8_synth.plan_int8; forced: force_dialect / force_tile /
    force_rows / force_split_loads) built by the chain for where it runs."""
    from xfc.cpu.int8_arm import plan_arm_int8
    from xfc.cpu.int8_synth import plan_int8
    from xfc.pipeline import stages
    if hw.target_arch == "aarch64":
        plan = plan_arm_int8(spec, quant, hw, threads=threads, **forced)
    else:
        plan = plan_int8(spec, quant, hw, threads=threads, host_flags=frozenset(flags), **forced)
    return plan, stages.realize(plan, Path(work_dir))


def verify_int8(built, seed: int = 0, mode: str = "random") -> dict:
    """Both entry points of an int8 kernel against the exact reference (the chain's verify):
    ok, exact_share, max_lsb, saturated_share, reason."""
    from xfc.ops.dtypes import INT8, make_operands
    from xfc.pipeline import stages
    plan = built.plan
    outcome = stages.verify(built, make_operands(plan.spec, INT8, seed=seed, quant=plan.quant, mode=mode))
    return {"ok": outcome.ok, "reason": outcome.check.reason, **outcome.check.report}


def assert_int8_exact(built, seeds=((11, "random"), (12, "extreme"))):
    """verify_int8 on random and extreme inputs: every output byte exact, and on the random ones fewer
    than 90% of the outputs at a clamp bound (outputs that all clamp to one value would hide a wrong
    sum)."""
    for seed, mode in seeds:
        verdict = verify_int8(built, seed=seed, mode=mode)
        assert verdict["ok"] and verdict["exact_share"] == 1.0, (built.plan.summary(), mode, verdict)
        if mode == "random":
            assert verdict["saturated_share"] < 0.9, verdict


def run_int8_entry(built, x, w, bias, mult, *, prepacked: bool = True):
    """The output of one entry point of a built int8 kernel on given operands (any runner)."""
    from xfc.ops.dtypes import INT8, Operands
    from xfc.pipeline import stages
    return stages.run(built, Operands(INT8, (x, w, bias, mult), built.plan.quant), prepacked=prepacked).output
