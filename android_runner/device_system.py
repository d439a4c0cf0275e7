"""The fake Android system the virtual device plays, and its sandbox.

`FakeSystem` holds the state every connection shares: properties, processes, clocks and thermal
zones, and the read-only fake files (/sys cpufreq, cacheinfo, thermal, /proc/cpuinfo, meminfo,
GPU model files), all derived from the SoC's hardware description. Device paths under
/data/local/tmp map into a host directory the device created and marked (`claim_home`); the
path helpers refuse anything outside it, symlink escapes included."""
from __future__ import annotations

import errno
import os
import posixpath
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from xfc.hardware.model import CpuCore, HardwareDescription
from xfc.hardware.identity import core_hwcaps, required_hwcaps, shipped_socs

SANDBOX_ROOT = "/data/local/tmp"
# The device writes only below a directory it created; this file marks such a directory.
HOME_MARKER = ".xfc-virtual-device"


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
class FakeProcess:
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
        self.processes: dict[int, FakeProcess] = {}
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
    def new_process(self, argv: list[str]) -> FakeProcess:
        with self.lock:
            self._next_pid += 1
            proc = FakeProcess(self._next_pid, list(argv))
            self.processes[proc.pid] = proc
            return proc

    def end_process(self, proc: FakeProcess) -> None:
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


def fake_dirs(files: dict[str, bytes]) -> dict[str, set[str]]:
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
# Device paths and the sandbox
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


def read_file(system: FakeSystem, p: str) -> bytes:
    """The bytes of a fake file or a sandbox file (PathError EISDIR / ENOENT otherwise)."""
    fake = system.fake_files()
    if p in fake:
        return fake[p]
    if p in fake_dirs(fake):
        raise PathError(errno.EISDIR, p)
    if in_sandbox(p):
        hp = host_path(system, p)
        if hp.is_dir():
            raise PathError(errno.EISDIR, p)
        if not hp.exists():
            raise PathError(errno.ENOENT, p)
        return hp.read_bytes()
    raise PathError(errno.ENOENT, p)


def list_dir(system: FakeSystem, p: str) -> list[str] | None:
    """Sorted names in a device directory (fake and sandbox entries), None if it is none."""
    fake = system.fake_files()
    dirs = fake_dirs(fake)
    names: set[str] = set()
    found = False
    if p in dirs:
        names |= dirs[p]
        found = True
    if in_sandbox(p):
        hp = host_path(system, p)
        if hp.is_dir():
            names |= set(os.listdir(hp))
            found = True
    return sorted(names) if found else None


def path_kind(system: FakeSystem, p: str) -> str | None:
    """'f' (file), 'd' (directory) or None (absent) for a device path."""
    fake = system.fake_files()
    if p in fake:
        return "f"
    if p in fake_dirs(fake):
        return "d"
    if in_sandbox(p):
        hp = host_path(system, p)
        if hp.is_dir():
            return "d"
        if hp.exists():
            return "f"
    return None


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

