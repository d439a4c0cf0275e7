"""A virtual Android device that speaks the device side of the ADB wire protocol over TCP.

The real adb server can `adb connect 127.0.0.1:PORT` to it, after which `adb shell`, `adb push`,
`adb pull` and adbutils work against it. It is a test double for xfc's AdbRunner, never a phone:
its model string says "xfc virtual device (<soc>)" and every measurement taken on it is labelled
as emulated. Aarch64 ELF files pushed to it run on the host under `qemu-aarch64`.

What it implements
  * transport: CNXN (banner with shell_v2,cmd,stat_v2,ls_v2,fixed_push_mkdir), OPEN, OKAY, WRTE,
    CLSE; no AUTH unless --unauthorized (then it only ever answers AUTH with a new token).
  * services: `shell:CMD`, `shell,v2,...:CMD` (stdout/stderr/exit packets), `sync:`
    (STAT, STA2, LST2, LIST, LIS2, SEND, RECV, QUIT).
  * a tiny shell: `;`, `&&`, `||`, quoting as produced by shlex.quote, `$?`; commands getprop,
    echo, true, false, mkdir, rm, chmod, cat, ls, df, stat-less `test -e/-f/-d`, sleep, env,
    taskset MASK (accepted and recorded), timeout, ps, kill, sh -c, uname, id, whoami, and
    running pushed aarch64 ELF files.
  * the identity of the SoC it plays, from hardware_descriptions/soc/<soc>.yaml: getprop
    ro.soc.model / ro.board.platform, /proc/cpuinfo CPU parts and Features per cluster, and the
    qemu -cpu model of the cores a run may use (so an armv9 kernel dies of SIGILL on an A77).
  * a sandbox: device paths under /data/local/tmp map to a host directory that the device
    created and marked (it never writes into or deletes one it did not create); arguments of an
    executed ELF that start with /data/local/tmp are rewritten to the host path (a binary run
    under qemu-user sees the host file system). Everything else is read-only fake state:
    /sys cpufreq (related_cpus, max/min clocks), cacheinfo (cache/index*: L1d, L1i, the
    cluster's L2, the DSU L3) and thermal files, /proc/cpuinfo, /proc/meminfo, the GPU driver's
    model file (kgsl gpu_model/max_gpuclk or Mali gpuinfo), ro.hardware.egl, and optionally
    /vendor/lib64/libOpenCL.so (what `xfc hw probe` reads).

Fault injection (for tests): --drop-after-bytes N, --drop-on-run, --hang, --abi, --storage-full,
--unauthorized, --offline (never completes the handshake), --throttle (clock drops and zones
heat up after each run), --drop-cache-levels 1,2,3 (no cacheinfo of those levels),
--cpuinfo-format older-kernel (the 3.10-era /proc/cpuinfo: one CPU part for all CPUs).

Run:  python -m android_runner.virtual_device --port 5599 --soc snapdragon-865
"""
from __future__ import annotations

import argparse
import errno
import os
import posixpath
import secrets
import shutil
import signal
import socket
import stat as statmod
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from xfc.hardware.model import CpuCore, HardwareDescription
from xfc.hardware.identity import core_hwcaps, required_hwcaps, shipped_socs

# --------------------------------------------------------------------------------------------
# Wire format
# --------------------------------------------------------------------------------------------


def _cmd_id(text: str) -> int:
    return int.from_bytes(text.encode("ascii"), "little")


A_CNXN = _cmd_id("CNXN")
A_AUTH = _cmd_id("AUTH")
A_OPEN = _cmd_id("OPEN")
A_OKAY = _cmd_id("OKAY")
A_WRTE = _cmd_id("WRTE")
A_CLSE = _cmd_id("CLSE")
A_SYNC = _cmd_id("SYNC")
A_STLS = _cmd_id("STLS")

PROTOCOL_VERSION = 0x01000001      # the version that lets both sides skip payload checksums
DEVICE_MAX_PAYLOAD = 1024 * 1024
AUTH_TOKEN, AUTH_SIGNATURE, AUTH_RSAPUBLICKEY = 1, 2, 3
HEADER = struct.Struct("<6I")
FEATURES = ("shell_v2", "cmd", "stat_v2", "ls_v2", "fixed_push_mkdir")

# shell protocol (shell_v2) packet ids: 1-byte id, 4-byte little-endian length, payload
SH_STDIN, SH_STDOUT, SH_STDERR, SH_EXIT, SH_CLOSE_STDIN, SH_WINDOW = 0, 1, 2, 3, 4, 5

SYNC_DATA_MAX = 64 * 1024
SANDBOX_ROOT = "/data/local/tmp"
# The device writes only below a directory it created; this file marks such a directory.
HOME_MARKER = ".xfc-virtual-device"


def pack_message(command: int, arg0: int, arg1: int, payload: bytes = b"") -> bytes:
    checksum = sum(payload) & 0xFFFFFFFF
    return HEADER.pack(command, arg0 & 0xFFFFFFFF, arg1 & 0xFFFFFFFF, len(payload), checksum,
                       command ^ 0xFFFFFFFF) + payload


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("peer closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


# --------------------------------------------------------------------------------------------
# Configuration and fake system state
# --------------------------------------------------------------------------------------------


@dataclass
class Faults:
    drop_after_bytes: int | None = None   # drop the TCP link once this many bytes came in
    drop_on_run: bool = False             # drop the TCP link when an ELF starts (once)
    hang: bool = False                    # an ELF never finishes (until killed)
    abi: str = "arm64-v8a"
    storage_full: bool = False            # SEND fails with ENOSPC, df reports 0 free
    unauthorized: bool = False            # answer CNXN with AUTH tokens only
    offline: bool = False                 # never answer CNXN
    throttle: bool = False                # each run lowers clocks by 30% and heats zones by 15 C
    drop_cache_levels: tuple[int, ...] = ()   # sysfs cache/index* entries of these levels are absent
    cpuinfo_format: str = "per-cpu"       # or "older-kernel": one MIDR block for all CPUs (3.10-era)


@dataclass
class _FakeProcess:
    pid: int
    argv: list[str]
    popen: subprocess.Popen | None = None
    killed: threading.Event = field(default_factory=threading.Event)

    def kill(self) -> None:
        self.killed.set()
        if self.popen is not None and self.popen.poll() is None:
            try:
                self.popen.kill()
            except OSError:
                pass


def soc_names() -> list[str]:
    """SoCs the virtual device can play: every shipped SoC description with Android ids."""
    return [hw.name for hw in shipped_socs() if hw.android is not None]


def _weakest(cores: list[CpuCore]) -> CpuCore:
    """The core with the fewest ISA features: what code may meet when it can run on any of them."""
    return min(cores, key=lambda c: (len(required_hwcaps(c)), c.name))


class FakeSystem:
    """Properties, /sys files and processes of the virtual device (shared by all connections).

    Everything it reports about the SoC comes from the SoC's hardware description: properties
    from `android:`, CPU topology and clocks from `clusters`, /proc/cpuinfo CPU implementer/part
    from the cores' `cpuinfo:` (the SoC's own ids first), Features from the cores' ISA, and the
    qemu-aarch64 -cpu model from the cores' `qemu_cpu`."""

    def __init__(self, soc: HardwareDescription, sandbox: Path, faults: Faults, serial_hint: str,
                 with_opencl: bool = False, qemu: str = "qemu-aarch64"):
        if soc.android is None or not soc.clusters:
            raise ValueError(f"{soc.name}: the description has no Android ids or no CPU clusters")
        self.soc = soc
        self.cpu_core = {cpu: cl.core for cl in soc.clusters for cpu in cl.cpu_ids}
        self.cpu_count = max(self.cpu_core) + 1
        self.max_khz = {cpu: int(round(cl.clock_ghz * 1e6)) for cl in soc.clusters for cpu in cl.cpu_ids}
        self.sandbox = sandbox
        self.faults = faults
        self.with_opencl = with_opencl
        self.qemu = qemu
        self.lock = threading.RLock()
        self.taskset_log: list[tuple[str, list[str]]] = []   # (mask, argv) of every taskset run
        self.commands: list[str] = []                        # every shell command received
        self.processes: dict[int, _FakeProcess] = {}
        self._next_pid = 4200
        self.run_count = 0
        self.drop_on_run_pending = faults.drop_on_run
        self.drop_bytes_pending = faults.drop_after_bytes
        self.bytes_in = 0
        self.cur_khz = dict(self.max_khz)
        self.zones = [("cpu-0-0-usr", 36.0), ("cpu-1-0-usr", 37.5), ("gpuss-0-usr", 34.0),
                      ("battery", 31.0), ("skin-therm", 32.5)]
        abilist = "arm64-v8a,armeabi-v7a,armeabi" if faults.abi == "arm64-v8a" else (
            f"{faults.abi},armeabi" if faults.abi.startswith("armeabi") else faults.abi)
        self.props = {
            "ro.product.model": f"xfc virtual device ({soc.name})",
            "ro.product.name": "xfc_virtual",
            "ro.product.device": "xfc_virtual",
            "ro.product.brand": "xfc",
            "ro.product.manufacturer": "xfc (virtual, not a phone)",
            "ro.product.cpu.abi": faults.abi,
            "ro.product.cpu.abilist": abilist,
            "ro.product.cpu.abilist64": "arm64-v8a" if faults.abi == "arm64-v8a" else "",
            "ro.board.platform": soc.android.board_platforms[0],
            "ro.hardware": soc.android.board_platforms[0],
            "ro.soc.manufacturer": soc.android.soc_manufacturer or soc.marketing_name.split()[0],
            "ro.soc.model": soc.android.soc_models[0],
            "ro.build.version.sdk": "33",
            "ro.build.version.release": "13",
            "ro.serialno": serial_hint,
            "ro.xfc.virtual_device": "1",
            "ro.xfc.emulator": "qemu-aarch64 " + " ".join(
                f"-cpu {cl.core.qemu_cpu} ({cl.role})" for cl in soc.clusters),
        }
        if soc.gpu is not None:   # what the graphics HAL names (Android reads these to load drivers)
            self.props["ro.hardware.egl"] = soc.gpu.family
            self.props["ro.hardware.vulkan"] = soc.gpu.family

    def qemu_cpu(self, cpus: set[int] | None = None) -> str:
        """The qemu -cpu model for a run allowed on these CPUs (default: any): the weakest core's,
        because the scheduler may put the run on any of them."""
        cores = [core for cpu, core in self.cpu_core.items() if cpus is None or cpu in cpus]
        return _weakest(cores or list(self.cpu_core.values())).qemu_cpu or "max"

    # -- processes ----------------------------------------------------------------------------
    def new_process(self, argv: list[str]) -> _FakeProcess:
        with self.lock:
            self._next_pid += 1
            proc = _FakeProcess(self._next_pid, list(argv))
            self.processes[proc.pid] = proc
            return proc

    def end_process(self, proc: _FakeProcess) -> None:
        with self.lock:
            self.processes.pop(proc.pid, None)

    def kill_all(self) -> None:
        with self.lock:
            procs = list(self.processes.values())
        for proc in procs:
            proc.kill()

    def after_run(self) -> None:
        with self.lock:
            self.run_count += 1
            if self.faults.throttle:
                self.cur_khz = {cpu: int(khz * 0.7) for cpu, khz in self.cur_khz.items()}
                self.zones = [(name, t + 15.0) for name, t in self.zones]
            else:
                # a little warmth, well below any throttling threshold
                self.zones = [(name, t + 0.1) for name, t in self.zones]

    # -- read-only fake files -------------------------------------------------------------------
    def cpuinfo(self) -> str:
        """arm64 /proc/cpuinfo: per CPU its Features, implementer and part (or, with the
        older-kernel fault, the 3.10-era layout: every `processor` line, then one block for the
        CPU that read the file: here cpu0)."""
        ids = {cpu: cl.cpuinfo_ids[0] if cl.cpuinfo_ids else (0x41, 0)
               for cl in self.soc.clusters for cpu in cl.cpu_ids}
        if self.faults.cpuinfo_format == "older-kernel":
            common = set.intersection(*(set(core_hwcaps(c)) for c in self.cpu_core.values()))
            impl, part = ids[min(ids)]
            return ("Processor\t: AArch64 Processor rev 0 (aarch64)\n"
                    + "".join(f"processor\t: {cpu}\n" for cpu in sorted(self.cpu_core))
                    + f"Features\t: {' '.join(c for c in core_hwcaps(self.cpu_core[min(ids)]) if c in common)}\n"
                    f"CPU implementer\t: {impl:#04x}\nCPU architecture: AArch64\nCPU variant\t: 0x1\n"
                    f"CPU part\t: {part:#05x}\nCPU revision\t: 0\n\n"
                    f"Hardware\t: xfc virtual device ({self.soc.marketing_name}, emulated)\n")
        blocks = []
        for cpu in range(self.cpu_count):
            core = self.cpu_core.get(cpu)
            if core is None:
                continue
            impl, part = ids[cpu]
            blocks.append(f"processor\t: {cpu}\nBogoMIPS\t: 38.40\n"
                          f"Features\t: {' '.join(core_hwcaps(core))}\n"
                          f"CPU implementer\t: {impl:#04x}\nCPU architecture: 8\n"
                          f"CPU variant\t: 0x1\nCPU part\t: {part:#05x}\nCPU revision\t: 0\n")
        return ("\n".join(blocks) + f"\nHardware\t: xfc virtual device "
                f"({self.soc.marketing_name}, emulated)\n")

    def fake_files(self) -> dict[str, bytes]:
        files: dict[str, bytes] = {}
        cpu_root = "/sys/devices/system/cpu"
        n = self.cpu_count
        files[f"{cpu_root}/possible"] = f"0-{n - 1}\n".encode()
        files[f"{cpu_root}/online"] = f"0-{n - 1}\n".encode()
        policy = {}
        for cl in self.soc.clusters:
            for cpu in cl.cpu_ids:
                policy[cpu] = min(cl.cpu_ids)
        for cl in self.soc.clusters:
            siblings = ",".join(str(c) for c in cl.cpu_ids)
            for cpu in cl.cpu_ids:
                d = f"{cpu_root}/cpu{cpu}"
                files[f"{d}/cpufreq/scaling_cur_freq"] = f"{self.cur_khz[cpu]}\n".encode()
                files[f"{d}/cpufreq/cpuinfo_max_freq"] = f"{self.max_khz[cpu]}\n".encode()
                files[f"{d}/cpufreq/cpuinfo_min_freq"] = b"300000\n"
                files[f"{d}/cpufreq/scaling_max_freq"] = f"{self.max_khz[cpu]}\n".encode()
                files[f"{d}/cpufreq/scaling_governor"] = b"schedutil\n"
                files[f"{d}/cpufreq/related_cpus"] = f"{siblings.replace(',', ' ')}\n".encode()
                files[f"{d}/topology/core_siblings_list"] = f"{siblings}\n".encode()
                files[f"{d}/topology/cluster_id"] = f"{policy[cpu]}\n".encode()
                files[f"{d}/online"] = b"1\n"
        files.update(self.cache_files())
        files.update(self.gpu_files())
        files["/proc/meminfo"] = (b"MemTotal:        7612340 kB\nMemFree:          912344 kB\n"
                                  b"MemAvailable:    3911208 kB\n")
        for i, (name, temp) in enumerate(self.zones):
            files[f"/sys/class/thermal/thermal_zone{i}/type"] = f"{name}\n".encode()
            files[f"/sys/class/thermal/thermal_zone{i}/temp"] = f"{int(temp * 1000)}\n".encode()
        files["/proc/cpuinfo"] = self.cpuinfo().encode()
        files["/proc/version"] = b"Linux version 5.4.0-xfc-virtual (emulated by qemu-aarch64)\n"
        if self.with_opencl:
            files["/vendor/lib64/libOpenCL.so"] = b"\x7fELF (fake vendor OpenCL library)\n"
        files["/system/bin/sh"] = b"\x7fELF (virtual)\n"
        return files


    def cache_files(self) -> dict[str, bytes]:
        """cacheinfo as an arm64 kernel exposes it from the device tree: per CPU its L1d, L1i,
        the cluster's L2 (shared by `shared_by_cores` neighbours) and the DSU L3 (all CPUs)."""
        files: dict[str, bytes] = {}
        every = ",".join(str(c) for c in sorted(self.cpu_core))
        for cl in self.soc.clusters:
            core = cl.core
            ids = sorted(cl.cpu_ids)
            share = max(1, cl.l2.shared_by_cores)
            for pos, cpu in enumerate(ids):
                group = ids[pos - pos % share: pos - pos % share + share]
                entries = [(1, "Data", core.l1d.size_bytes, core.l1d.ways, core.l1d.line_bytes, str(cpu)),
                           (1, "Instruction", core.l1d.size_bytes, 4, 64, str(cpu)),
                           (2, "Unified", cl.l2.size_bytes, cl.l2.ways, cl.l2.line_bytes,
                            ",".join(map(str, group)))]
                if self.soc.l3_bytes:
                    entries.append((3, "Unified", self.soc.l3_bytes, 16, 64, every))
                for index, (level, kind, size, ways, line, shared) in enumerate(entries):
                    if level in self.faults.drop_cache_levels:
                        continue
                    d = f"/sys/devices/system/cpu/cpu{cpu}/cache/index{index}"
                    sets = size // (ways * line)
                    for name, value in (("level", level), ("type", kind), ("size", f"{size // 1024}K"),
                                        ("ways_of_associativity", ways), ("coherency_line_size", line),
                                        ("number_of_sets", sets), ("shared_cpu_list", shared)):
                        files[f"{d}/{name}"] = f"{value}\n".encode()
        return files

    def gpu_files(self) -> dict[str, bytes]:
        """The GPU driver's model files: Qualcomm kgsl (Adreno) or Arm kbase gpuinfo (Mali)."""
        gpu = self.soc.gpu
        if gpu is None:
            return {}
        if gpu.family == "adreno":
            number = gpu.name.split("-")[-1]
            return {"/sys/class/kgsl/kgsl-3d0/gpu_model": f"Adreno{number}v2\n".encode(),
                    "/sys/class/kgsl/kgsl-3d0/max_gpuclk": f"{int(gpu.max_clock_mhz * 1e6)}\n".encode()}
        model = gpu.name.split("-", 1)[-1].upper()
        return {"/sys/class/misc/mali0/device/gpuinfo":
                f"Mali-{model} {gpu.compute_units} cores r0p1 0x9091\n".encode()}


def _fake_dirs(files: dict[str, bytes]) -> dict[str, set[str]]:
    dirs: dict[str, set[str]] = {"/": set()}
    for path in files:
        parts = path.strip("/").split("/")
        for i in range(len(parts)):
            parent = "/" + "/".join(parts[:i])
            dirs.setdefault(posixpath.normpath(parent), set()).add(parts[i])
    for p in ("/data", "/data/local"):
        dirs.setdefault(p, set())
    dirs["/"].add("data")
    dirs["/data"].add("local")
    dirs["/data/local"].add("tmp")
    return dirs


# --------------------------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------------------------


class PathError(Exception):
    def __init__(self, err: int, path: str):
        super().__init__(f"{path}: {os.strerror(err)}")
        self.errno = err
        self.path = path


def device_norm(path: str, cwd: str = "/") -> str:
    if not path.startswith("/"):
        path = posixpath.join(cwd, path)
    return posixpath.normpath(path).replace("//", "/")


def in_sandbox(dev_path: str) -> bool:
    return dev_path == SANDBOX_ROOT or dev_path.startswith(SANDBOX_ROOT + "/")


def host_path(system: FakeSystem, dev_path: str) -> Path:
    """Host path for a device path inside /data/local/tmp (PathError EACCES otherwise)."""
    if not in_sandbox(dev_path):
        raise PathError(errno.EACCES, dev_path)
    rel = dev_path[len(SANDBOX_ROOT):].lstrip("/")
    root = system.sandbox.resolve()
    target = (root / rel) if rel else root
    # refuse anything that escapes the sandbox through symlinks
    resolved = target.resolve()
    if resolved != root and root not in resolved.parents:
        raise PathError(errno.EACCES, dev_path)
    return target


# --------------------------------------------------------------------------------------------
# The mini shell
# --------------------------------------------------------------------------------------------

_OPERATORS = (";", "&&", "||", "|", ">", "<", "&", ">>")


class _Op(str):
    """An unquoted shell operator token."""


STATUS_MARK = "\x00?\x00"   # stands for `$?` until the command runs


def tokenize(line: str) -> list[str]:
    """Split a POSIX-style command line. Unquoted operators come back as `_Op` tokens;
    `$?` (outside single quotes) comes back as STATUS_MARK, replaced when the command runs."""
    tokens: list[str] = []
    cur: list[str] = []
    have = False
    i, n = 0, len(line)

    def flush() -> None:
        nonlocal cur, have
        if have:
            tokens.append("".join(cur))
        cur, have = [], False

    while i < n:
        ch = line[i]
        if ch in " \t\n":
            flush()
            i += 1
        elif ch == "'":
            j = line.find("'", i + 1)
            if j < 0:
                raise ValueError("unterminated single quote")
            cur.append(line[i + 1:j])
            have = True
            i = j + 1
        elif ch == '"':
            i += 1
            have = True
            while True:
                if i >= n:
                    raise ValueError("unterminated double quote")
                c = line[i]
                if c == '"':
                    i += 1
                    break
                if c == "\\" and i + 1 < n and line[i + 1] in '"\\$`\n':
                    cur.append(line[i + 1])
                    i += 2
                elif c == "$" and line.startswith("$?", i):
                    cur.append(STATUS_MARK)
                    i += 2
                else:
                    cur.append(c)
                    i += 1
        elif ch == "\\":
            if i + 1 < n:
                cur.append(line[i + 1])
                have = True
            i += 2
        elif ch == "$" and line.startswith("$?", i):
            cur.append(STATUS_MARK)
            have = True
            i += 2
        elif ch in ";&|<>":
            flush()
            two = line[i:i + 2]
            op = two if two in ("&&", "||", ">>") else ch
            tokens.append(_Op(op))
            i += len(op)
        elif ch == "#" and not have:
            break
        else:
            cur.append(ch)
            have = True
            i += 1
    flush()
    return tokens


class ShellSession:
    """Runs one `shell:` command line. out/err are callables taking bytes."""

    def __init__(self, system: FakeSystem, out: Callable[[bytes], None],
                 err: Callable[[bytes], None], on_run_start: Callable[[], None]):
        self.system = system
        self.out = out
        self.err = err
        self.on_run_start = on_run_start
        self.status = 0
        self.current: _FakeProcess | None = None
        self.cancelled = threading.Event()
        self.affinity: set[int] | None = None     # CPUs allowed by an enclosing taskset

    # -- entry ----------------------------------------------------------------------------------
    def run_line(self, line: str) -> int:
        with self.system.lock:
            self.system.commands.append(line)
        # Split on top-level ; && || first, expanding $? lazily per command.
        try:
            probe = tokenize(line)
        except ValueError as exc:
            self.err(f"/system/bin/sh: syntax error: {exc}\n".encode())
            return 2
        if any(isinstance(t, _Op) and t in ("|", ">", "<", "&", ">>") for t in probe):
            self.err(b"/system/bin/sh: pipes, redirections and background jobs are not supported "
                     b"by the xfc virtual device\n")
            return 2
        segments: list[tuple[str, list[str]]] = []   # (operator before, tokens)
        op_before = ";"
        current: list[str] = []
        for tok in probe:
            if isinstance(tok, _Op):
                segments.append((op_before, current))
                op_before, current = str(tok), []
            else:
                current.append(tok)
        segments.append((op_before, current))
        status = 0
        for op, argv in segments:
            if self.cancelled.is_set():
                return 137
            if op == "&&" and status != 0:
                continue
            if op == "||" and status == 0:
                continue
            if not argv:
                continue
            argv = [a.replace(STATUS_MARK, str(status)).replace("\x00", "") for a in argv]
            status = self.run_argv(argv)
            self.status = status
        return status

    # -- commands -------------------------------------------------------------------------------
    def run_argv(self, argv: list[str], env: dict[str, str] | None = None) -> int:
        name, args = argv[0], argv[1:]
        builtin = getattr(self, "cmd_" + name.replace("-", "_"), None) if "/" not in name else None
        if builtin is not None:
            try:
                return builtin(args, env or {})
            except PathError as exc:
                self.err(f"{name}: {exc}\n".encode())
                return 1
        return self.exec_path(argv, env or {})

    def _write_lines(self, lines: list[str]) -> None:
        if lines:
            self.out(("\n".join(lines) + "\n").encode())

    def cmd_true(self, args, env):
        return 0

    def cmd_false(self, args, env):
        return 1

    def cmd_echo(self, args, env):
        newline = True
        if args and args[0] == "-n":
            newline, args = False, args[1:]
        self.out((" ".join(args) + ("\n" if newline else "")).encode())
        return 0

    def cmd_getprop(self, args, env):
        props = self.system.props
        if not args:
            self._write_lines([f"[{k}]: [{v}]" for k, v in sorted(props.items())])
        else:
            default = args[1] if len(args) > 1 else ""
            self.out((props.get(args[0], default) + "\n").encode())
        return 0

    def cmd_uname(self, args, env):
        self.out(b"aarch64\n" if "-m" in args else b"Linux\n")
        return 0

    def cmd_id(self, args, env):
        self.out(b"uid=2000(shell) gid=2000(shell) groups=2000(shell) context=u:r:shell:s0\n")
        return 0

    def cmd_whoami(self, args, env):
        self.out(b"shell\n")
        return 0

    def cmd_sleep(self, args, env):
        try:
            secs = float(args[0]) if args else 0.0
        except ValueError:
            self.err(b"sleep: invalid number\n")
            return 1
        self.cancelled.wait(secs)
        return 0

    def cmd_mkdir(self, args, env):
        parents = False
        status = 0
        for a in args:
            if a.startswith("-"):
                parents = parents or "p" in a
                continue
            p = device_norm(a)
            if not in_sandbox(p):
                if p in ("/data", "/data/local") and parents:
                    continue
                self.err(f"mkdir: '{a}': Permission denied\n".encode())
                status = 1
                continue
            hp = host_path(self.system, p)
            try:
                if parents:
                    hp.mkdir(parents=True, exist_ok=True)
                else:
                    hp.mkdir()
            except FileExistsError:
                self.err(f"mkdir: '{a}': File exists\n".encode())
                status = 1
            except OSError as exc:
                self.err(f"mkdir: '{a}': {exc.strerror}\n".encode())
                status = 1
        return status

    def cmd_rm(self, args, env):
        recursive = force = False
        status = 0
        for a in args:
            if a.startswith("-") and len(a) > 1:
                recursive = recursive or "r" in a.lower()
                force = force or "f" in a
                continue
            p = device_norm(a)
            if not in_sandbox(p) or p == SANDBOX_ROOT:
                self.err(f"rm: '{a}': Permission denied\n".encode())
                status = 1
                continue
            hp = host_path(self.system, p)
            if not hp.exists() and not hp.is_symlink():
                if not force:
                    self.err(f"rm: '{a}': No such file or directory\n".encode())
                    status = 1
                continue
            if hp.is_dir() and not hp.is_symlink():
                if not recursive:
                    self.err(f"rm: '{a}': Is a directory\n".encode())
                    status = 1
                    continue
                shutil.rmtree(hp, ignore_errors=True)
            else:
                hp.unlink()
        return status

    def cmd_chmod(self, args, env):
        if len(args) < 2:
            self.err(b"chmod: needs MODE FILE...\n")
            return 1
        mode_s, files = args[0], args[1:]
        if mode_s.startswith("-"):
            mode_s, files = files[0], files[1:]
        status = 0
        for a in files:
            hp = host_path(self.system, device_norm(a))
            if not hp.exists():
                self.err(f"chmod: '{a}': No such file or directory\n".encode())
                status = 1
                continue
            mode = hp.stat().st_mode & 0o7777
            try:
                if all(c in "01234567" for c in mode_s):
                    mode = int(mode_s, 8)
                else:
                    for clause in mode_s.split(","):
                        who = clause.rstrip("rwx+-=") or "a"
                        opi = max(clause.find("+"), clause.find("-"), clause.find("="))
                        perms = clause[opi + 1:]
                        bits = 0
                        for w in ("a" if who == "a" else who):
                            shift = {"u": [6], "g": [3], "o": [0], "a": [6, 3, 0]}[w]
                            for s in shift:
                                for p in perms:
                                    bits |= {"r": 4, "w": 2, "x": 1}[p] << s
                        op = clause[opi]
                        mode = mode | bits if op == "+" else (mode & ~bits if op == "-" else bits)
            except (KeyError, IndexError, ValueError):
                self.err(f"chmod: invalid mode '{mode_s}'\n".encode())
                return 1
            os.chmod(hp, mode)
        return status

    def _read_file(self, p: str) -> bytes:
        fake = self.system.fake_files()
        if p in fake:
            return fake[p]
        if p in _fake_dirs(fake):
            raise PathError(errno.EISDIR, p)
        if in_sandbox(p):
            hp = host_path(self.system, p)
            if hp.is_dir():
                raise PathError(errno.EISDIR, p)
            if not hp.exists():
                raise PathError(errno.ENOENT, p)
            return hp.read_bytes()
        raise PathError(errno.ENOENT, p)

    def cmd_cat(self, args, env):
        status = 0
        for a in args:
            try:
                self.out(self._read_file(device_norm(a)))
            except PathError as exc:
                self.err(f"cat: {a}: {os.strerror(exc.errno)}\n".encode())
                status = 1
        return status

    def _list_dir(self, p: str) -> list[str] | None:
        fake = self.system.fake_files()
        dirs = _fake_dirs(fake)
        names: set[str] = set()
        found = False
        if p in dirs:
            names |= dirs[p]
            found = True
        if in_sandbox(p):
            hp = host_path(self.system, p)
            if hp.is_dir():
                names |= set(os.listdir(hp))
                found = True
        return sorted(names) if found else None

    def _exists(self, p: str) -> str | None:
        """'f', 'd' or None."""
        fake = self.system.fake_files()
        if p in fake:
            return "f"
        if p in _fake_dirs(fake):
            return "d"
        if in_sandbox(p):
            hp = host_path(self.system, p)
            if hp.is_dir():
                return "d"
            if hp.exists():
                return "f"
        return None

    def cmd_ls(self, args, env):
        paths = [a for a in args if not a.startswith("-")] or ["/"]
        status = 0
        for a in paths:
            p = device_norm(a)
            kind = self._exists(p)
            if kind is None:
                self.err(f"ls: {a}: No such file or directory\n".encode())
                status = 1
            elif kind == "f":
                self.out((a + "\n").encode())
            else:
                names = self._list_dir(p) or []
                if len(paths) > 1:
                    self.out(f"{a}:\n".encode())
                self._write_lines(names)
        return status

    def cmd_test(self, args, env):
        if len(args) == 2 and args[0] in ("-e", "-f", "-d"):
            kind = self._exists(device_norm(args[1]))
            want = {"-e": ("f", "d"), "-f": ("f",), "-d": ("d",)}[args[0]]
            return 0 if kind in want else 1
        self.err(b"test: only -e/-f/-d PATH are supported\n")
        return 2

    def cmd_df(self, args, env):
        total = 110_000_000
        avail = 0 if self.system.faults.storage_full else 52_000_000
        used = total - avail
        pct = int(round(100 * used / total))
        self.out(b"Filesystem      1K-blocks     Used Available Use% Mounted on\n")
        self.out(f"/dev/block/dm-8 {total:10d} {used:8d} {avail:9d} {pct:3d}% /data\n".encode())
        return 0

    def cmd_env(self, args, env):
        new_env = dict(env)
        while args and "=" in args[0] and not args[0].startswith("="):
            k, v = args[0].split("=", 1)
            new_env[k] = v
            args = args[1:]
        if not args:
            self._write_lines([f"{k}={v}" for k, v in sorted(new_env.items())])
            return 0
        return self.run_argv(args, new_env)

    def cmd_taskset(self, args, env):
        if len(args) < 2 or args[0].startswith("-"):
            self.err(b"taskset: only 'taskset MASK COMMAND...' is supported\n")
            return 1
        mask_s, rest = args[0], args[1:]
        try:
            mask = int(mask_s, 16)
        except ValueError:
            self.err(f"taskset: bad mask '{mask_s}'\n".encode())
            return 1
        cpus = {c for c in self.system.cpu_core if mask >> c & 1}
        if not cpus:
            self.err(b"taskset: sched_setaffinity: Invalid argument\n")
            return 1
        with self.system.lock:
            self.system.taskset_log.append((mask_s, list(rest)))
        outer, self.affinity = self.affinity, cpus
        try:
            return self.run_argv(rest, env)
        finally:
            self.affinity = outer

    def cmd_timeout(self, args, env):
        sig = "TERM"
        while args and args[0].startswith("-"):
            if args[0] == "-s" and len(args) > 1:
                sig, args = args[1], args[2:]
            else:
                args = args[1:]
        if len(args) < 2:
            self.err(b"timeout: needs SECONDS COMMAND...\n")
            return 125
        try:
            secs = float(args[0].rstrip("s"))
        except ValueError:
            self.err(b"timeout: bad duration\n")
            return 125
        timer_fired = threading.Event()

        def fire() -> None:
            timer_fired.set()
            proc = self.current
            if proc is not None:
                proc.kill()
            self.cancelled.set()

        timer = threading.Timer(secs, fire)
        timer.daemon = True
        timer.start()
        try:
            status = self.run_argv(args[1:], env)
        finally:
            timer.cancel()
        if timer_fired.is_set():
            self.cancelled.clear()
            return 124
        return status

    def cmd_ps(self, args, env):
        with self.system.lock:
            procs = sorted(self.system.processes.values(), key=lambda p: p.pid)
        lines = ["  PID ARGS"] + [f"{p.pid:5d} {' '.join(p.argv)}" for p in procs]
        self._write_lines(lines)
        return 0

    def cmd_kill(self, args, env):
        status = 0
        for a in args:
            if a.startswith("-"):
                continue
            try:
                pid = int(a)
            except ValueError:
                self.err(f"kill: bad pid '{a}'\n".encode())
                status = 1
                continue
            with self.system.lock:
                proc = self.system.processes.get(pid)
            if proc is None:
                self.err(f"kill: {pid}: No such process\n".encode())
                status = 1
            else:
                proc.kill()
        return status

    def cmd_sh(self, args, env):
        if len(args) >= 2 and args[0] == "-c":
            return self.run_line(args[1])
        self.err(b"sh: only 'sh -c COMMAND' is supported\n")
        return 2

    # -- executing files ------------------------------------------------------------------------
    def exec_path(self, argv: list[str], env: dict[str, str]) -> int:
        name = argv[0]
        if "/" not in name:
            self.err(f"/system/bin/sh: {name}: inaccessible or not found\n".encode())
            return 127
        p = device_norm(name)
        if not in_sandbox(p):
            self.err(f"/system/bin/sh: {name}: inaccessible or not found\n".encode())
            return 127
        hp = host_path(self.system, p)
        if not hp.is_file():
            self.err(f"/system/bin/sh: {name}: inaccessible or not found\n".encode())
            return 127
        if not os.access(hp, os.X_OK):
            self.err(f"/system/bin/sh: {name}: can't execute: Permission denied\n".encode())
            return 126
        with open(hp, "rb") as f:
            head = f.read(20)
        if head[:4] != b"\x7fELF" or head[4] != 2 or struct.unpack("<H", head[18:20])[0] != 183:
            self.err(f"/system/bin/sh: {name}: not an aarch64 ELF executable "
                     "(the xfc virtual device runs only those)\n".encode())
            return 126
        args = []
        for a in argv[1:]:
            if a.startswith(SANDBOX_ROOT + "/") or a == SANDBOX_ROOT:
                args.append(str(host_path(self.system, device_norm(a))))
            else:
                args.append(a)
        proc = self.system.new_process(argv)
        self.current = proc
        try:
            self.on_run_start()
            if self.system.faults.hang:
                proc.killed.wait()
                self.err(b"Killed\n")
                return 137
            cmd = [self.system.qemu, "-cpu", self.system.qemu_cpu(self.affinity), str(hp), *args]
            child_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env}
            try:
                proc.popen = subprocess.Popen(cmd, cwd=str(hp.parent), env=child_env,
                                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE)
            except OSError as exc:
                self.err(f"xfc virtual device: cannot start {self.system.qemu}: {exc}\n".encode())
                return 127
            if proc.killed.is_set():
                proc.kill()
            stdout, stderr = proc.popen.communicate()
            self.out(stdout)
            self.err(stderr)
            rc = proc.popen.returncode
            return 128 - rc if rc < 0 else rc
        finally:
            self.current = None
            self.system.end_process(proc)
            self.system.after_run()

    def cancel(self, link_lost: bool = False) -> None:
        """The host closed the stream: end the command, as adbd does (SIGHUP). A --hang
        process plays one that ignores SIGHUP: only an explicit kill or a lost link ends it."""
        self.cancelled.set()
        proc = self.current
        if proc is not None and (link_lost or not self.system.faults.hang):
            proc.kill()


# --------------------------------------------------------------------------------------------
# ADB streams and connections
# --------------------------------------------------------------------------------------------


class _Stream:
    def __init__(self, conn: "_Connection", local_id: int, remote_id: int):
        self.conn = conn
        self.local_id = local_id
        self.remote_id = remote_id
        self.cond = threading.Condition()
        self.inbuf = bytearray()
        self.acked = True
        self.closed = False
        self.on_close: Callable[[bool], None] | None = None

    # data from the host
    def feed(self, data: bytes) -> None:
        with self.cond:
            self.inbuf += data
            self.cond.notify_all()

    def read_exact(self, n: int) -> bytes:
        with self.cond:
            while len(self.inbuf) < n:
                if self.closed:
                    raise EOFError("stream closed")
                self.cond.wait(0.5)
            data = bytes(self.inbuf[:n])
            del self.inbuf[:n]
            return data

    def ack(self) -> None:
        with self.cond:
            self.acked = True
            self.cond.notify_all()

    # data to the host
    def write(self, data: bytes) -> None:
        limit = max(1024, min(self.conn.max_payload, DEVICE_MAX_PAYLOAD))
        for off in range(0, len(data), limit):
            chunk = data[off:off + limit]
            with self.cond:
                while not self.acked:
                    if self.closed:
                        raise EOFError("stream closed")
                    self.cond.wait(0.5)
                if self.closed:
                    raise EOFError("stream closed")
                self.acked = False
            self.conn.send(A_WRTE, self.local_id, self.remote_id, chunk)

    def wait_acked(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self.acked and not self.closed and time.monotonic() < deadline:
                self.cond.wait(0.1)

    def close(self) -> None:
        with self.cond:
            was_closed = self.closed
            self.closed = True
            self.cond.notify_all()
        if not was_closed:
            self.conn.send(A_CLSE, self.local_id, self.remote_id)
            self.conn.forget(self.local_id)

    def remote_closed(self, link_lost: bool = False) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.conn.forget(self.local_id)
        if self.on_close is not None:
            self.on_close(link_lost)


class _Connection:
    def __init__(self, device: "VirtualDevice", sock: socket.socket):
        self.device = device
        self.system = device.system
        self.sock = sock
        self.send_lock = threading.Lock()
        self.streams: dict[int, _Stream] = {}
        self.streams_lock = threading.Lock()
        self.next_id = 1
        self.max_payload = 4096
        self.dead = False

    def send(self, command: int, arg0: int, arg1: int, payload: bytes = b"") -> None:
        msg = pack_message(command, arg0, arg1, payload)
        with self.send_lock:
            if self.dead:
                raise EOFError("connection dropped")
            try:
                self.sock.sendall(msg)
            except OSError as exc:
                self.dead = True
                raise EOFError(str(exc)) from exc

    def forget(self, local_id: int) -> None:
        with self.streams_lock:
            self.streams.pop(local_id, None)

    def drop(self) -> None:
        """Abruptly cut the link, as a pulled USB cable would."""
        self.dead = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def banner(self) -> bytes:
        p = self.system.props
        return (f"device::ro.product.name={p['ro.product.name']};"
                f"ro.product.model={p['ro.product.model']};"
                f"ro.product.device={p['ro.product.device']};"
                f"features={','.join(FEATURES)}").encode()

    def serve(self) -> None:
        try:
            self._loop()
        except (ConnectionError, OSError, EOFError, struct.error):
            pass
        finally:
            self.dead = True
            with self.streams_lock:
                streams = list(self.streams.values())
                self.streams.clear()
            for s in streams:
                s.remote_closed(link_lost=True)
            try:
                self.sock.close()
            except OSError:
                pass
            self.device._connection_ended(self)

    def _loop(self) -> None:
        connected = False
        while True:
            header = _recv_exact(self.sock, HEADER.size)
            command, arg0, arg1, length, _checksum, magic = HEADER.unpack(header)
            if magic != command ^ 0xFFFFFFFF:
                return  # corrupt header: close the link, as the protocol demands
            payload = _recv_exact(self.sock, length) if length else b""
            with self.system.lock:
                self.system.bytes_in += HEADER.size + length
                drop_now = (self.system.drop_bytes_pending is not None
                            and self.system.bytes_in >= self.system.drop_bytes_pending)
                if drop_now:
                    self.system.drop_bytes_pending = None
            if drop_now:
                self.device.log(f"fault: dropping the link after {self.system.bytes_in} bytes")
                self.drop()
                return
            if command == A_CNXN:
                self.max_payload = min(arg1, DEVICE_MAX_PAYLOAD) if arg1 else 4096
                if self.system.faults.offline:
                    continue
                if self.system.faults.unauthorized:
                    self.send(A_AUTH, AUTH_TOKEN, 0, secrets.token_bytes(20))
                    continue
                version = min(arg0, PROTOCOL_VERSION) if arg0 else PROTOCOL_VERSION
                self.send(A_CNXN, version, DEVICE_MAX_PAYLOAD, self.banner())
                connected = True
            elif command == A_AUTH:
                if arg0 == AUTH_SIGNATURE:
                    # no key is ever accepted: ask again, so the host ends up 'unauthorized'
                    self.send(A_AUTH, AUTH_TOKEN, 0, secrets.token_bytes(20))
                # AUTH_RSAPUBLICKEY: a phone would show a dialog; nobody accepts it here
            elif not connected:
                continue
            elif command == A_OPEN:
                self._open(arg0, payload)
            elif command == A_OKAY:
                with self.streams_lock:
                    s = self.streams.get(arg1)
                if s is not None:
                    if s.remote_id == 0:
                        s.remote_id = arg0
                    s.ack()
            elif command == A_WRTE:
                with self.streams_lock:
                    s = self.streams.get(arg1)
                if s is None:
                    self.send(A_CLSE, 0, arg0)
                    continue
                s.feed(payload)
                self.send(A_OKAY, s.local_id, s.remote_id)
            elif command == A_CLSE:
                with self.streams_lock:
                    s = self.streams.get(arg1)
                if s is not None:
                    s.remote_closed()

    def _open(self, remote_id: int, payload: bytes) -> None:
        service = payload.rstrip(b"\x00").decode("utf-8", "replace")
        handler = None
        if service.startswith("shell"):
            head, sep, cmd = service.partition(":")
            if sep:
                opts = head.split(",")[1:]
                handler = lambda s: self._shell_service(s, cmd, "v2" in opts)  # noqa: E731
        elif service == "sync:":
            handler = self._sync_service
        if handler is None:
            self.device.log(f"refusing service {service!r}")
            self.send(A_CLSE, 0, remote_id)
            return
        with self.streams_lock:
            local_id = self.next_id
            self.next_id += 1
            stream = _Stream(self, local_id, remote_id)
            self.streams[local_id] = stream
        self.send(A_OKAY, local_id, remote_id)
        t = threading.Thread(target=self._run_service, args=(handler, stream), daemon=True,
                             name=f"vdev-{service[:20]}")
        t.start()

    def _run_service(self, handler, stream: _Stream) -> None:
        try:
            handler(stream)
        except (EOFError, OSError, ConnectionError):
            pass
        finally:
            try:
                stream.wait_acked()
                stream.close()
            except (EOFError, OSError):
                pass

    # -- shell ----------------------------------------------------------------------------------
    def _shell_service(self, stream: _Stream, command: str, v2: bool) -> None:
        def packet(kind: int, data: bytes) -> None:
            if data:
                stream.write(bytes([kind]) + struct.pack("<I", len(data)) + data)

        out = (lambda d: packet(SH_STDOUT, d)) if v2 else (lambda d: d and stream.write(d))
        err = (lambda d: packet(SH_STDERR, d)) if v2 else (lambda d: d and stream.write(d))

        def run_start() -> None:
            if self.system.drop_on_run_pending:
                self.system.drop_on_run_pending = False
                self.device.log("fault: dropping the link as a run starts")
                self.system.kill_all()
                self.drop()
                raise EOFError("dropped on purpose")

        session = ShellSession(self.system, out, err, run_start)
        stream.on_close = session.cancel
        if not command.strip():
            err(b"xfc virtual device: interactive shells are not supported\n")
            status = 1
        else:
            status = session.run_line(command)
        if v2:
            stream.write(bytes([SH_EXIT]) + struct.pack("<I", 1) + bytes([status & 0xFF]))

    # -- sync -----------------------------------------------------------------------------------
    def _sync_service(self, stream: _Stream) -> None:
        while True:
            req = stream.read_exact(8)
            ident = req[:4].decode("ascii", "replace")
            length = struct.unpack("<I", req[4:])[0]
            if ident == "QUIT":
                return
            if length > 4096:
                self._sync_fail(stream, "path too long")
                return
            path = stream.read_exact(length).decode("utf-8", "replace") if length else ""
            if ident in ("STAT", "STA2", "LST2"):
                self._sync_stat(stream, ident, path)
            elif ident in ("LIST", "LIS2"):
                self._sync_list(stream, ident, path)
            elif ident == "SEND":
                if not self._sync_send(stream, path):
                    return
            elif ident == "RECV":
                if not self._sync_recv(stream, path):
                    return
            else:
                self._sync_fail(stream, f"unknown sync request {ident!r}")
                return

    def _sync_fail(self, stream: _Stream, message: str) -> None:
        data = message.encode()
        stream.write(b"FAIL" + struct.pack("<I", len(data)) + data)

    def _lookup(self, dev_path: str) -> tuple[int, os.stat_result | None, int]:
        """(mode, host stat or None, errno) for a device path."""
        shell = ShellSession(self.system, lambda d: None, lambda d: None, lambda: None)
        try:
            kind = shell._exists(dev_path)
        except PathError as exc:
            return 0, None, exc.errno
        if kind is None:
            return 0, None, errno.ENOENT
        if in_sandbox(dev_path):
            st = host_path(self.system, dev_path).stat()
            return st.st_mode, st, 0
        if kind == "d":
            return statmod.S_IFDIR | 0o755, None, 0
        return statmod.S_IFREG | 0o444, None, 0

    def _sync_stat(self, stream: _Stream, ident: str, path: str) -> None:
        p = device_norm(path)
        mode, st, err = self._lookup(p)
        size = st.st_size if st else (4096 if mode else 0)
        mtime = int(st.st_mtime) if st else (int(time.time()) if mode else 0)
        if ident == "STAT":
            stream.write(b"STAT" + struct.pack("<III", mode, size & 0xFFFFFFFF, mtime))
            return
        ino = st.st_ino if st else 0
        nlink = st.st_nlink if st else (1 if mode else 0)
        stream.write(ident.encode() + struct.pack(
            "<IQQIIIIQqqq", err, 0, ino, mode, nlink, 2000 if mode else 0, 2000 if mode else 0,
            size, mtime, mtime, mtime))

    def _sync_list(self, stream: _Stream, ident: str, path: str) -> None:
        p = device_norm(path)
        shell = ShellSession(self.system, lambda d: None, lambda d: None, lambda: None)
        names = shell._list_dir(p) or []
        for name in [".", ".."] + names:
            child = p if name == "." else (posixpath.dirname(p) if name == ".." else
                                           posixpath.join(p, name))
            mode, st, _ = self._lookup(child)
            size = st.st_size if st else 0
            mtime = int(st.st_mtime) if st else 0
            raw = name.encode()
            if ident == "LIST":
                stream.write(b"DENT" + struct.pack("<IIII", mode, size & 0xFFFFFFFF, mtime,
                                                   len(raw)) + raw)
            else:
                stream.write(b"DNT2" + struct.pack(
                    "<IQQIIIIQqqqI", 0, 0, st.st_ino if st else 0, mode, 1, 2000, 2000, size,
                    mtime, mtime, mtime, len(raw)) + raw)
        if ident == "LIST":
            stream.write(b"DONE" + bytes(16))
        else:
            stream.write(b"DONE" + bytes(struct.calcsize("<IQQIIIIQqqqI")))

    def _drain_send(self, stream: _Stream) -> None:
        while True:
            head = stream.read_exact(8)
            ident, size = head[:4], struct.unpack("<I", head[4:])[0]
            if ident == b"DONE":
                return
            if ident != b"DATA":
                raise EOFError("bad sync data")
            stream.read_exact(size)

    def _sync_send(self, stream: _Stream, spec: str) -> bool:
        path, _, mode_s = spec.rpartition(",")
        if not path:
            path, mode_s = spec, "33188"
        try:
            mode = int(mode_s) & 0o777
        except ValueError:
            mode = 0o644
        p = device_norm(path)
        if self.system.faults.storage_full:
            self._drain_send(stream)
            self._sync_fail(stream, f"couldn't create file: {os.strerror(errno.ENOSPC)}")
            return False
        try:
            hp = host_path(self.system, p)
        except PathError as exc:
            self._drain_send(stream)
            self._sync_fail(stream, f"couldn't create file: {os.strerror(exc.errno)}")
            return False
        tmp = hp.with_name(hp.name + ".xfc-partial")
        try:
            hp.parent.mkdir(parents=True, exist_ok=True)   # fixed_push_mkdir
            with open(tmp, "wb") as f:
                while True:
                    head = stream.read_exact(8)
                    ident, size = head[:4], struct.unpack("<I", head[4:])[0]
                    if ident == b"DONE":
                        mtime = size          # DONE carries the file's mtime
                        break
                    if ident != b"DATA" or size > SYNC_DATA_MAX:
                        raise EOFError("bad sync data")
                    f.write(stream.read_exact(size))
            os.replace(tmp, hp)
            os.chmod(hp, mode)
            if mtime:
                os.utime(hp, (mtime, mtime))
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            self._sync_fail(stream, f"couldn't write file: {exc.strerror}")
            return False
        except EOFError:
            tmp.unlink(missing_ok=True)
            raise
        stream.write(b"OKAY" + struct.pack("<I", 0))
        return True

    def _sync_recv(self, stream: _Stream, path: str) -> bool:
        p = device_norm(path)
        shell = ShellSession(self.system, lambda d: None, lambda d: None, lambda: None)
        try:
            data = shell._read_file(p)
        except PathError as exc:
            self._sync_fail(stream, f"open failed: {os.strerror(exc.errno)}")
            return False
        for off in range(0, len(data), SYNC_DATA_MAX):
            chunk = data[off:off + SYNC_DATA_MAX]
            stream.write(b"DATA" + struct.pack("<I", len(chunk)) + chunk)
        stream.write(b"DONE" + struct.pack("<I", 0))
        return True


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


def claim_home(path: str | os.PathLike | None) -> tuple[Path, bool]:
    """(home directory, created now). A new temporary directory when path is None; else path
    is created (its parent must exist) or must already carry this device's marker: the device
    never writes into, or deletes, a directory it did not create."""
    if path is None:
        home = Path(tempfile.mkdtemp(prefix="xfc-vdev-"))
    else:
        home = Path(path)
        if home.exists() or home.is_symlink():
            if not home.is_dir() or home.is_symlink() or not (home / HOME_MARKER).is_file():
                raise ValueError(f"{home} exists and was not created by the xfc virtual device (no "
                                 f"{HOME_MARKER} file in it); give a path that does not exist yet")
            return home, False
        try:
            home.mkdir()
        except OSError as exc:
            raise ValueError(f"cannot create the sandbox directory {home}: {exc.strerror}") from None
    (home / HOME_MARKER).write_text("created by the xfc virtual device; /data/local/tmp is in "
                                    "data-local-tmp/\n")
    return home, True


class VirtualDevice:
    """A TCP server speaking the device side of ADB. Use start()/stop() or a `with` block."""

    def __init__(self, port: int = 0, soc: str = "snapdragon-865", faults: Faults | None = None,
                 sandbox: str | os.PathLike | None = None, with_opencl: bool = False,
                 qemu: str = "qemu-aarch64", verbose: bool = False):
        socs = {hw.name: hw for hw in shipped_socs() if hw.android is not None}
        if soc not in socs:
            raise ValueError(f"unknown SoC '{soc}'; known: {', '.join(sorted(socs))}")
        self.requested_port = port
        self.faults = faults or Faults()
        # home: a directory this device created (marked); /data/local/tmp lives inside it.
        self.home, self._created_home = claim_home(sandbox)
        self.sandbox = self.home / "data-local-tmp"
        self.sandbox.mkdir(exist_ok=True)
        self.system = FakeSystem(socs[soc], self.sandbox, self.faults, f"xfc-virtual-{soc}",
                                 with_opencl=with_opencl, qemu=qemu)
        self.verbose = verbose
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[_Connection] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.port = 0

    @property
    def serial(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self, msg: str) -> None:
        if self.verbose:
            print(f"[xfc-virtual-device] {msg}", file=sys.stderr, flush=True)

    def start(self) -> "VirtualDevice":
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind(("127.0.0.1", self.requested_port))
        lsock.listen(8)
        lsock.settimeout(0.2)
        self._listener = lsock
        self.port = lsock.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, daemon=True,
                                        name="vdev-accept")
        self._thread.start()
        return self

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                sock, addr = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(self, sock)
            with self._lock:
                self._connections.add(conn)
            self.log(f"connection from {addr[0]}:{addr[1]}")
            threading.Thread(target=conn.serve, daemon=True, name="vdev-conn").start()

    def _connection_ended(self, conn: _Connection) -> None:
        with self._lock:
            self._connections.discard(conn)
        self.log("connection closed")

    def drop_connections(self) -> None:
        with self._lock:
            conns = list(self._connections)
        for c in conns:
            c.drop()

    def stop(self) -> None:
        self._stopping.set()
        self.system.kill_all()
        if self._listener is not None:
            try:
                self._listener.close()
            except OSError:
                pass
        self.drop_connections()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._created_home:   # only what it created; a reused (marked) home keeps its files
            shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> "VirtualDevice":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # helpers for tests
    def sandbox_files(self) -> list[str]:
        """Device paths of every file and directory under /data/local/tmp."""
        out = []
        for root, dirs, files in os.walk(self.sandbox):
            for name in dirs + files:
                rel = os.path.relpath(os.path.join(root, name), self.sandbox)
                out.append(posixpath.join(SANDBOX_ROOT, rel.replace(os.sep, "/")))
        return sorted(out)


def _levels(text: str) -> tuple[int, ...]:
    """'2,3' -> (2, 3); argparse turns the ValueError into a one-line usage error."""
    levels = tuple(int(x) for x in text.split(",") if x.strip())
    if any(not 1 <= level <= 4 for level in levels):
        raise ValueError(text)
    return levels


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m android_runner.virtual_device",
        description="A virtual ADB device (emulated with qemu-aarch64; not a phone).")
    ap.add_argument("--port", type=int, default=5599, help="TCP port on 127.0.0.1 (0 = any)")
    ap.add_argument("--soc", default="snapdragon-865", choices=soc_names())
    ap.add_argument("--sandbox", help="a new host directory for the device's files (it is created, "
                                      "marked, and /data/local/tmp is its data-local-tmp/; an "
                                      "existing one must carry the marker); default: a temporary "
                                      "directory removed on exit")
    ap.add_argument("--with-opencl", action="store_true",
                    help="pretend /vendor/lib64/libOpenCL.so exists")
    ap.add_argument("--qemu", default="qemu-aarch64", help="the qemu-user binary to run ELFs")
    ap.add_argument("--drop-after-bytes", type=int, metavar="N",
                    help="fault: cut the link once N bytes came in (once)")
    ap.add_argument("--drop-on-run", action="store_true",
                    help="fault: cut the link when a binary starts (once)")
    ap.add_argument("--hang", action="store_true", help="fault: binaries never finish")
    ap.add_argument("--abi", default="arm64-v8a", help="fault: report another ABI")
    ap.add_argument("--storage-full", action="store_true", help="fault: pushes fail (ENOSPC)")
    ap.add_argument("--unauthorized", action="store_true",
                    help="fault: never accept the host's key (state 'unauthorized')")
    ap.add_argument("--offline", action="store_true", help="fault: never finish the handshake")
    ap.add_argument("--throttle", action="store_true",
                    help="fault: clocks drop 30%% and zones heat 15 C after each run")
    ap.add_argument("--drop-cache-levels", default=(), type=_levels, metavar="LEVELS",
                    help="fault: no sysfs cache entries of these levels, e.g. 2,3 or 1,2,3")
    ap.add_argument("--cpuinfo-format", choices=("per-cpu", "older-kernel"), default="per-cpu",
                    help="fault: serve the 3.10-era /proc/cpuinfo (one CPU part for all CPUs)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if shutil.which(args.qemu) is None:
        print(f"warning: '{args.qemu}' not found: pushed binaries cannot run", file=sys.stderr)
    faults = Faults(drop_after_bytes=args.drop_after_bytes, drop_on_run=args.drop_on_run,
                    hang=args.hang, abi=args.abi, storage_full=args.storage_full,
                    unauthorized=args.unauthorized, offline=args.offline,
                    throttle=args.throttle,
                    drop_cache_levels=args.drop_cache_levels,
                    cpuinfo_format=args.cpuinfo_format)
    try:
        dev = VirtualDevice(args.port, args.soc, faults, sandbox=args.sandbox,
                            with_opencl=args.with_opencl, qemu=args.qemu, verbose=args.verbose)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    dev.start()
    print(f"xfc virtual device ({args.soc}; emulated by qemu-aarch64, not a phone) "
          f"listening on 127.0.0.1:{dev.port}", flush=True)
    print(f"sandbox for /data/local/tmp: {dev.sandbox}", flush=True)
    print(f"connect with:  adb connect 127.0.0.1:{dev.port}   "
          f"(then: adb -s 127.0.0.1:{dev.port} shell getprop ro.product.model)", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        dev.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
