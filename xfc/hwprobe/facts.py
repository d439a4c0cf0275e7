"""Device facts: everything read from one phone, grouped into CPU clusters. Pure.

    facts = facts_from_files(serial, props, files)   # files: device path -> text
    clusters = cluster_facts(facts)                   # fastest first
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Optional

from xfc.errors import HardwareError
from xfc.hardware.identity import FEATURE_HWCAPS, CpuId, DeviceIdentity

from xfc.hardware.cpuinfo import Cpuinfo, Midr, parse_cpuinfo

from .parse import CPU_ROOT, CacheEntry, CpuSysfs, GpuFacts, cpu_sysfs, parse_gpu, parse_meminfo_bytes, source

CPUINFO = "/proc/cpuinfo"
MEMINFO = "/proc/meminfo"


@dataclass(frozen=True)
class DeviceFacts:
    serial: str
    props: Mapping[str, str]
    cpuinfo: Cpuinfo
    cpus: tuple[CpuSysfs, ...]          # one per CPU number, in order
    mem_total_bytes: Optional[int]
    gpu: Optional[GpuFacts]
    vendor_opencl: str = ""             # path of the vendor libOpenCL.so, '' when absent

    def src(self, path: str) -> str:
        return source(self.serial, path)

    def prop(self, key: str) -> str:
        return (self.props.get(key) or "").strip()

    def identity(self) -> DeviceIdentity:
        """The same identity xfc.hardware.identity matches descriptions with."""
        info = self.cpuinfo
        none = Midr(None, None)   # older format: which CPU the one MIDR belongs to is unknown
        cpus = tuple(CpuId(cpu=c, implementer=(info.midr(c) or none).implementer,
                           part=(info.midr(c) or none).part, features=info.features.get(c, ()))
                     for c in info.cpus)
        g = self.prop
        return DeviceIdentity(serial=self.serial, model=g("ro.product.model"), soc_model=g("ro.soc.model"),
                              soc_manufacturer=g("ro.soc.manufacturer"), board_platform=g("ro.board.platform"),
                              hardware=g("ro.hardware"), chipname=g("ro.chipname"), abi=g("ro.product.cpu.abi"),
                              cpus=cpus, virtual=g("ro.xfc.virtual_device") == "1")


def facts_from_files(serial: str, props: Mapping[str, str], files: Mapping[str, str],
                     vendor_opencl: str = "") -> DeviceFacts:
    """Parse everything read from the device (`files`: device path -> text; absent = unreadable)."""
    info = parse_cpuinfo(files.get(CPUINFO, ""))
    numbers = set(info.cpus)
    for path in files:
        m = re.match(rf"{CPU_ROOT}/cpu(\d+)/", path)
        if m:
            numbers.add(int(m.group(1)))
    if not numbers:
        raise HardwareError(f"device {serial}: neither /proc/cpuinfo nor /sys/devices/system/cpu lists any "
                            "CPU; nothing to draft a description from")
    return DeviceFacts(serial=serial, props=dict(props), cpuinfo=info,
                       cpus=tuple(cpu_sysfs(c, files) for c in sorted(numbers)),
                       mem_total_bytes=parse_meminfo_bytes(files.get(MEMINFO, "")),
                       gpu=parse_gpu(serial, props, files), vendor_opencl=vendor_opencl)


def xfc_features(hwcaps) -> tuple[str, ...]:
    """xfc feature names (neon, fp16, dotprod, i8mm, bf16, sve2) a Features line implies."""
    caps = set(hwcaps)
    return tuple(f for f, need in FEATURE_HWCAPS.items() if set(need) <= caps)


@dataclass(frozen=True)
class ClusterFacts:
    """One cpufreq policy (CPUs sharing a clock): what the device says about it."""
    cpu_ids: tuple[int, ...]
    cpus_source: str
    max_clock_ghz: Optional[float]
    clock_source: str
    min_clock_ghz: Optional[float]
    midr: Optional[Midr]                 # None: unknown (older cpuinfo format, or not printed)
    midr_source: str
    hwcaps: tuple[str, ...]
    l1d: Optional[CacheEntry]
    l2: Optional[CacheEntry]
    mixed_midrs: tuple[str, ...] = ()    # several parts in one policy (noted, majority used)

    @property
    def count(self) -> int:
        return len(self.cpu_ids)

    @property
    def l2_shared_by(self) -> Optional[int]:
        if self.l2 is None or not self.l2.shared_cpus:
            return None
        return len(self.l2.shared_cpus)


def _groups(facts: DeviceFacts) -> list[tuple[tuple[int, ...], str]]:
    """CPU groups with a source: cpufreq policies, else equal MIDRs, else all CPUs as one."""
    all_cpus = tuple(c.cpu for c in facts.cpus)
    groups: list[tuple[int, ...]] = []
    seen: set[int] = set()
    for c in facts.cpus:
        if c.cpu in seen:
            continue
        group = tuple(x for x in c.related_cpus if x in all_cpus) if c.cpu in c.related_cpus else ()
        if not group or seen & set(group):
            break
        groups.append(group)
        seen |= set(group)
    if groups and seen == set(all_cpus):
        return [(g, facts.src(f"{CPU_ROOT}/cpu{g[0]}/cpufreq/related_cpus")) for g in groups]
    info = facts.cpuinfo
    if info.format == "per-cpu":
        by_part: dict = {}
        for cpu in all_cpus:
            m = info.midr(cpu)
            by_part.setdefault(m.key if m else None, []).append(cpu)
        return [(tuple(v), facts.src(CPUINFO) + " (no cpufreq related_cpus: grouped by CPU part)")
                for v in by_part.values()]
    return [(all_cpus, facts.src(CPUINFO) + " (no cpufreq related_cpus: one group)")]


def cluster_facts(facts: DeviceFacts) -> tuple[ClusterFacts, ...]:
    """The device's clusters, fastest first (ties: higher CPU numbers first)."""
    by_cpu = {c.cpu: c for c in facts.cpus}
    info = facts.cpuinfo
    out = []
    for cpu_ids, cpus_source in _groups(facts):
        first = by_cpu[cpu_ids[0]]
        khz = [by_cpu[c].max_khz for c in cpu_ids if by_cpu[c].max_khz]
        top = max(khz) if khz else None
        top_cpu = next((c for c in cpu_ids if by_cpu[c].max_khz == top), cpu_ids[0])
        lows = [by_cpu[c].min_khz for c in cpu_ids if by_cpu[c].min_khz]
        mixed: tuple[str, ...] = ()
        if info.format == "per-cpu":
            parts = [info.midr(c) for c in cpu_ids if info.midr(c) is not None]
            counts: dict = {}
            for m in parts:
                counts[m.key] = counts.get(m.key, 0) + 1
            midr = max(parts, key=lambda m: counts[m.key]) if parts else None
            if len(counts) > 1:
                mixed = tuple(sorted(m.text for m in {p.key: p for p in parts}.values()))
            midr_source = facts.src(CPUINFO)
        else:
            midr, midr_source = None, facts.src(CPUINFO) + " (older-kernel format: one CPU part for all CPUs)"
        hw = [info.features.get(c, ()) for c in cpu_ids]
        common = set(hw[0]).intersection(*hw[1:]) if hw else set()
        hwcaps = tuple(c for c in hw[0] if c in common) if hw else ()
        out.append(ClusterFacts(
            cpu_ids=tuple(cpu_ids), cpus_source=cpus_source,
            max_clock_ghz=round(top / 1e6, 4) if top else None,
            clock_source=facts.src(f"{CPU_ROOT}/cpu{top_cpu}/cpufreq/cpuinfo_max_freq") if top else "",
            min_clock_ghz=round(min(lows) / 1e6, 4) if lows else None,
            midr=midr, midr_source=midr_source, hwcaps=hwcaps,
            l1d=first.cache(1), l2=first.cache(2), mixed_midrs=mixed))
    out.sort(key=lambda c: (-(c.max_clock_ghz or 0.0), -max(c.cpu_ids)))
    return tuple(out)


def l3_entry(facts: DeviceFacts) -> Optional[CacheEntry]:
    for c in facts.cpus:
        entry = c.cache(3)
        if entry is not None and entry.size_bytes:
            return entry
    return None
