"""Describe the x86-64 machine xfc runs on, so the same synthesizer can target it ('--hw host').

Facts are read from /proc/cpuinfo (flags, model, clock) and sysfs (cache sizes, CPU count);
the parsing is split from the reading so tests can feed recorded text.
"""
from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Optional

from .errors import HardwareError
from .hardware import CacheLevel, CpuCluster, CpuCore, HardwareDescription, LoadRules, MemoryDescription

SYSFS_CPU = Path("/sys/devices/system/cpu")

# Vector FMA instructions per cycle assumed for x86 cores: two FMA pipes is the common case for
# AVX2 and AVX-512 server cores of the last decade. It only scales predictions; marked uncertain.
ASSUMED_FMA_PER_CYCLE = 2
# A single-socket server/VM memory roof used only for the bytes/FLOP balance; marked uncertain.
ASSUMED_DRAM_GBPS = 25.0


def parse_cpuinfo(text: str) -> dict:
    """First processor block of /proc/cpuinfo as a dict (flags split into a set)."""
    info: dict = {}
    for line in text.splitlines():
        if not line.strip():
            if info:
                break
            continue
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
    info["flags"] = set(info.get("flags", "").split())
    return info


def _size_kib(text: str) -> Optional[float]:
    text = text.strip().upper()
    try:
        if text.endswith("K"):
            return float(text[:-1])
        if text.endswith("M"):
            return float(text[:-1]) * 1024
        return float(text) / 1024
    except ValueError:
        return None


def read_caches(cpu_dir: Path = SYSFS_CPU / "cpu0" / "cache") -> dict[str, dict]:
    """{'L1d': {...}, 'L2': {...}, 'L3': {...}} from sysfs; empty dict when unavailable."""
    caches: dict[str, dict] = {}
    for index in sorted(cpu_dir.glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            ctype = (index / "type").read_text().strip()
            size_kib = _size_kib((index / "size").read_text())
            line = int((index / "coherency_line_size").read_text())
            ways = int((index / "ways_of_associativity").read_text() or 0)
            shared = (index / "shared_cpu_list").read_text().strip()
        except (OSError, ValueError):
            continue
        if ctype == "Instruction" or size_kib is None:
            continue
        label = f"L{level}d" if level == "1" else f"L{level}"
        caches[label] = {"size_kib": size_kib, "line_bytes": line, "ways": max(ways, 1),
                         "shared_by_cores": _count_cpus(shared)}
    return caches


def _count_cpus(cpu_list: str) -> int:
    count = 0
    for part in filter(None, cpu_list.split(",")):
        lo, _, hi = part.partition("-")
        count += (int(hi) - int(lo) + 1) if hi else 1
    return max(count, 1)


def describe_host(cpuinfo: dict, caches: dict, n_cpus: int, machine: str) -> HardwareDescription:
    """Build the host description from parsed facts. Pure: same facts, same description."""
    if machine not in ("x86_64", "AMD64"):
        raise HardwareError(f"--hw host: this machine is {machine}; host synthesis supports x86-64 only")
    flags = cpuinfo.get("flags", set())
    features = [f for f, flag in (("avx2", "avx2"), ("fma", "fma"), ("avx512f", "avx512f")) if flag in flags]
    if "avx512f" in features:
        vector_bits, registers, march = 512, 32, "x86-64-v4"
    elif "avx2" in features and "fma" in features:
        vector_bits, registers, march = 256, 16, "x86-64-v3"
    else:
        vector_bits, registers, march = 128, 16, "x86-64"
    try:
        clock_ghz = round(float(cpuinfo.get("cpu MHz", "0")) / 1000.0, 3)
    except ValueError:
        clock_ghz = 0.0
    uncertain = ["fma_per_cycle", "fma_latency_cycles", "memory.peak_bandwidth_gbps"]
    if clock_ghz <= 0:
        clock_ghz = 2.0
        uncertain.append("clock_ghz")
    l1 = caches.get("L1d", {"size_kib": 32, "line_bytes": 64, "ways": 8, "shared_by_cores": 1})
    l2 = caches.get("L2", {"size_kib": 1024, "line_bytes": 64, "ways": 8, "shared_by_cores": 1})
    l3 = caches.get("L3")
    for label, present in (("l1d", "L1d" in caches), ("l2", "L2" in caches)):
        if not present:
            uncertain.append(f"{label}.size_kib")
    core = CpuCore(
        name="host", vendor="x86", isa="x86-64", features=tuple(features), gcc_march=march, qemu_cpu="",
        pipeline="out_of_order", decode_width=4, vector_bits=vector_bits, vector_registers=registers,
        fma_per_cycle=ASSUMED_FMA_PER_CYCLE, fma_latency_cycles=4,
        load_rules=LoadRules(vector_loads_per_cycle=2, ld128_dual_issues_with_fma=True,
                             ld128_blocking_cycles=0, ld64_dual_issues_with_fma=True),
        l1d=CacheLevel(int(l1["size_kib"] * 1024), l1["line_bytes"], l1["ways"], 1),
        l2=CacheLevel(int(l2["size_kib"] * 1024), l2["line_bytes"], l2["ways"], l2["shared_by_cores"]),
        typical_max_clock_ghz=clock_ghz)
    cluster = CpuCluster(role="big", core=core, count=n_cpus, clock_ghz=clock_ghz,
                         cpu_ids=tuple(range(n_cpus)), l2=core.l2)
    model = cpuinfo.get("model name", "unknown x86-64 CPU")
    return HardwareDescription(
        name="host", kind="host", marketing_name=f"{model} ({n_cpus} CPUs)", clusters=(cluster,), gpu=None,
        l3_bytes=int(l3["size_kib"] * 1024) if l3 else None, slc_bytes=None,
        memory=MemoryDescription(type="host DRAM", peak_bandwidth_gbps=ASSUMED_DRAM_GBPS, channels=1),
        target_arch="x86_64", sources=("/proc/cpuinfo", "/sys/devices/system/cpu/cpu0/cache"),
        uncertain=tuple(f"host:{u}" for u in uncertain), source_path="",
        notes="detected at run time; vector FMA rate per cycle and DRAM bandwidth are assumptions")


def detect_host() -> HardwareDescription:
    """Read this machine's facts (the only I/O) and describe it."""
    try:
        cpuinfo_text = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo_text = ""
    try:
        n_cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n_cpus = os.cpu_count() or 1
    return describe_host(parse_cpuinfo(cpuinfo_text), read_caches(), n_cpus, platform.machine())
