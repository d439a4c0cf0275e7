"""Raw device text -> typed facts. Pure functions; no device, no file system.

Inputs are the texts a phone gives over adb: `getprop` output, /proc/cpuinfo (the per-CPU
format of current arm64 kernels and the older one that prints a single MIDR block for all
CPUs), /proc/meminfo and small sysfs files (cpufreq, cacheinfo, the GPU driver's model file).
Every fact keeps the device path it was read from, as `device:<serial> <path>`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Optional

from xfc.hardware.cpuinfo import parse_int

CPU_ROOT = "/sys/devices/system/cpu"
# GPU driver files: Qualcomm's kgsl names the Adreno model and its top clock (Hz); Arm's Mali
# kbase driver prints "<model> <n> cores r<x>p<y> 0x<id>" in gpuinfo.
ADRENO_MODEL = "/sys/class/kgsl/kgsl-3d0/gpu_model"
ADRENO_MAX_CLOCK = "/sys/class/kgsl/kgsl-3d0/max_gpuclk"
MALI_GPUINFO = "/sys/class/misc/mali0/device/gpuinfo"
GPU_FILES = (ADRENO_MODEL, ADRENO_MAX_CLOCK, MALI_GPUINFO)
CPUFREQ_FILES = ("related_cpus", "cpuinfo_max_freq", "cpuinfo_min_freq")
CACHE_FILES = ("level", "type", "size", "ways_of_associativity", "coherency_line_size",
               "shared_cpu_list")


def source(serial: str, path: str) -> str:
    """How a value read from the device is cited: 'device:<serial> <path>'."""
    return f"device:{serial} {path}"


# ---------------------------------------------------------------------------------------------
# small sysfs / procfs files
# ---------------------------------------------------------------------------------------------

def parse_cpulist(text: str) -> tuple[int, ...]:
    """'0-3,6' (cpulist) or '0 1 2 3' (related_cpus) -> (0, 1, 2, 3, 6); () when unreadable."""
    out: list[int] = []
    for item in re.split(r"[\s,]+", text.strip()):
        if not item:
            continue
        lo, dash, hi = item.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            return ()
        out += range(int(lo), int(hi) + 1) if dash else [int(lo)]
    return tuple(sorted(set(out)))


def parse_size_bytes(text: str) -> Optional[int]:
    """cacheinfo 'size': '32K', '4096K', '1M' (or plain bytes) -> bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.IGNORECASE)
    if not m:
        return None
    return int(m.group(1)) * {"": 1, "K": 1024, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]


def parse_meminfo_bytes(text: str) -> Optional[int]:
    """MemTotal from /proc/meminfo, in bytes."""
    m = re.search(r"^MemTotal:\s*(\d+)\s*kB", text, re.MULTILINE)
    return int(m.group(1)) * 1024 if m else None


def parse_getprop(text: str) -> dict[str, str]:
    """`getprop` output ('[key]: [value]' lines) as a dict."""
    from xfc.hardware.identity import parse_getprop as parse
    return parse(text)


# ---------------------------------------------------------------------------------------------
# per-CPU sysfs
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CacheEntry:
    """One /sys/devices/system/cpu/cpuN/cache/indexK directory (None: the file was missing)."""
    cpu: int
    path: str
    level: Optional[int]
    type: str                       # 'Data', 'Instruction', 'Unified' or ''
    size_bytes: Optional[int]
    ways: Optional[int]
    line_bytes: Optional[int]
    shared_cpus: tuple[int, ...]

    @property
    def holds_data(self) -> bool:
        return self.type in ("Data", "Unified")


@dataclass(frozen=True)
class CpuSysfs:
    cpu: int
    related_cpus: tuple[int, ...]   # the cpufreq policy: CPUs that share this CPU's clock
    max_khz: Optional[int]
    min_khz: Optional[int]
    caches: tuple[CacheEntry, ...]

    def cache(self, level: int) -> Optional[CacheEntry]:
        """The data (or unified) cache of this level, if the kernel exposes it."""
        for c in self.caches:
            if c.level == level and c.holds_data:
                return c
        return None


def cpu_dir(cpu: int) -> str:
    return f"{CPU_ROOT}/cpu{cpu}"


def cpufreq_paths(cpu: int) -> list[str]:
    return [f"{cpu_dir(cpu)}/cpufreq/{name}" for name in CPUFREQ_FILES]


def cache_paths(cpu: int, index: str) -> list[str]:
    return [f"{cpu_dir(cpu)}/cache/{index}/{name}" for name in CACHE_FILES]


def cpu_sysfs(cpu: int, files: Mapping[str, str]) -> CpuSysfs:
    """Parse what was read for one CPU; `files` maps device paths to their text."""
    d = cpu_dir(cpu)

    def get(path: str) -> Optional[str]:
        value = files.get(path)
        return value.strip() if value is not None else None

    def num(path: str) -> Optional[int]:
        v = get(path)
        return parse_int(v) if v else None

    related = parse_cpulist(get(f"{d}/cpufreq/related_cpus") or "")
    indexes = sorted({p[len(d) + 7:].split("/")[0] for p in files if p.startswith(f"{d}/cache/index")},
                     key=lambda s: int(s[5:]) if s[5:].isdigit() else 99)
    caches = []
    for index in indexes:
        base = f"{d}/cache/{index}"
        caches.append(CacheEntry(
            cpu=cpu, path=base, level=num(f"{base}/level"), type=get(f"{base}/type") or "",
            size_bytes=parse_size_bytes(get(f"{base}/size") or ""),
            ways=num(f"{base}/ways_of_associativity"), line_bytes=num(f"{base}/coherency_line_size"),
            shared_cpus=parse_cpulist(get(f"{base}/shared_cpu_list") or "")))
    return CpuSysfs(cpu=cpu, related_cpus=related, max_khz=num(f"{d}/cpufreq/cpuinfo_max_freq"),
                    min_khz=num(f"{d}/cpufreq/cpuinfo_min_freq"), caches=tuple(caches))


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuFacts:
    family: str                     # 'adreno' | 'mali' | '' (unknown)
    model: str                      # xfc's GPU file name it would be, e.g. 'adreno-650', or ''
    compute_units: Optional[int]
    clock_mhz: Optional[float]
    source: str                     # where the model came from
    clock_source: str = ""
    raw: str = ""                   # what the driver printed


def parse_gpu(serial: str, props: Mapping[str, str], files: Mapping[str, str]) -> Optional[GpuFacts]:
    """The GPU from the driver's sysfs files, else its family from ro.hardware.egl/vulkan."""
    model = (files.get(ADRENO_MODEL) or "").strip()
    m = re.match(r"adreno\s*(\d{3})", model, re.IGNORECASE)
    if m:
        hz = parse_int(files.get(ADRENO_MAX_CLOCK) or "")
        return GpuFacts("adreno", f"adreno-{m.group(1)}", None,
                        round(hz / 1e6, 1) if hz else None, source(serial, ADRENO_MODEL),
                        source(serial, ADRENO_MAX_CLOCK) if hz else "", model)
    info = (files.get(MALI_GPUINFO) or "").strip()
    m = re.match(r"mali-([gt]\d+)\s+(\d+)\s+cores?", info, re.IGNORECASE)
    if m:
        return GpuFacts("mali", f"mali-{m.group(1).lower()}", int(m.group(2)), None,
                        source(serial, MALI_GPUINFO), "", info)
    for prop in ("ro.hardware.egl", "ro.hardware.vulkan"):
        value = (props.get(prop) or "").strip().lower()
        if value in ("adreno", "mali"):
            return GpuFacts(value, "", None, None, source(serial, f"getprop {prop}"), "", value)
    return None
