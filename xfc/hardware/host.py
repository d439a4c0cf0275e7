"""Describe the x86-64 machine xfc runs on, so the same synthesizer can target it ('--hw host').

Facts are read from /proc/cpuinfo (flags, model, clock) and sysfs (cache sizes, CPU count);
the parsing is split from the reading so tests can feed recorded text.

The host can be made to look like a smaller x86-64 core, so that an AVX-512 machine synthesizes,
builds, verifies and times the AVX2 and generic paths end to end:
  --hw host:avx2 / host:generic / host:avx512   one run, that ISA (it must be one the CPU has);
  XFC_HOST_ISA=avx512|avx2|generic              the environment variable (xfc.settings.host_isa_cap,
                                                passed in as `cap`): plain 'host' becomes that ISA
                                                and wider ones count as absent.
The smaller description is a real core of that class (AVX2: 256-bit, 16 registers, x86-64-v3;
generic: 128-bit, 16 registers, plain x86-64) and is named 'host:<isa>'. Asking for an ISA the
CPU (or the XFC_HOST_ISA cap) lacks is a HardwareError (exit 2).
"""
from __future__ import annotations

import math
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .. import settings
from ..errors import HardwareError
from ..settings import FROM_ENVIRONMENT, HOST_ISA_ENV
from .model import CacheLevel, CpuCluster, CpuCore, HardwareDescription, LoadRules, MemoryDescription

SYSFS_CPU = Path("/sys/devices/system/cpu")
MAX_CLOCK_SOURCE = "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"

# Vector FMA instructions per cycle assumed for x86 cores: two FMA pipes is the common case for
# AVX2 and AVX-512 server cores of the last decade. It only scales predictions; marked uncertain.
ASSUMED_FMA_PER_CYCLE = 2
# A single-socket server/VM memory roof used only for the bytes/FLOP balance; marked uncertain.
ASSUMED_DRAM_GBPS = 25.0

# The x86-64 code paths xfc generates, widest first, with what each needs from the CPU and the
# core it describes: (cpuinfo flags, vector bits, vector registers, gcc -march).
# The flags are everything the -march level lets gcc emit (the x86-64 psABI micro-architecture
# levels, as /proc/cpuinfo spells them: 'pni' is SSE3, 'abm' LZCNT, 'lahf_lm' LAHF/SAHF), so a CPU
# with AVX512F but not AVX512BW/VL is never given -march=x86-64-v4 code (SIGILL).
X86_64_V2_FLAGS = ("cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3")
X86_64_V3_FLAGS = X86_64_V2_FLAGS + ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")
X86_64_V4_FLAGS = X86_64_V3_FLAGS + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
HOST_ISAS = ("avx512", "avx2", "generic")
_ISA_FACTS = {
    "avx512": (X86_64_V4_FLAGS, 512, 32, "x86-64-v4"),
    "avx2": (X86_64_V3_FLAGS, 256, 16, "x86-64-v3"),
    "generic": ((), 128, 16, "x86-64"),       # the x86-64 baseline every 64-bit x86 CPU has
}
_LABELS = {"avx512": "AVX-512", "avx2": "AVX2", "generic": "generic 128-bit x86-64 code"}


# Measured figures are quantized before they enter the description, so that run-to-run noise of
# the probe cannot change a synthesized kernel: the FMA rate to half an instruction per cycle
# (a port count; a core that splits a wide FMA counts 0.5 per port), the clock to 0.05 GHz, the
# latency to whole cycles.
CLOCK_QUANTUM_GHZ = 0.05
DRAM_QUANTUM = 1.05


@dataclass(frozen=True)
class HostMeasurement:
    """What the host FMA probe measured on this machine (xfc.tiledb.probe fills it; this module
    only applies it, so hardware description stays free of measuring and caching)."""
    clock_ghz: float                                  # sustained clock while the probe ran
    fma_per_cycle: tuple[tuple[int, float], ...]      # (vector bits, vector FMA instructions per cycle)
    fma_latency_cycles: float
    measured_at: str                                  # UTC timestamp of the measurement
    cached: bool                                      # True: read back from the per-user cache
    dram_read_gbps: Optional[float] = None            # sustained all-CPU read bandwidth; None: not measured
    shared_cache_read_gbps: Optional[float] = None    # one core's read from the L3; None: not measured
    l3_overflow_read_speedup: Optional[float] = None  # the probe's past-L3 stream gain; None: not measured

    def fma_per_cycle_at(self, vector_bits: int) -> Optional[float]:
        return dict(self.fma_per_cycle).get(vector_bits)


def quantized_fma_per_cycle(rate: float) -> float:
    return max(0.5, round(rate * 2) / 2)


def quantized_dram_gbps(gbps: float) -> float:
    """To 5% steps on a log scale (noise of a few percent between probe runs keeps one value)."""
    return round(DRAM_QUANTUM ** round(math.log(gbps) / math.log(DRAM_QUANTUM)), 1)


def quantized_speedup(speedup: float, cpus: int) -> Optional[float]:
    """Down to half steps, within [1, cpus]; None below 1.5 (no gain the model uses: the
    description and its fingerprint stay as without the figure). Down, not to the nearest: the
    figure never claims more gain than was measured (the committed Zen 4 runs,
    benchmarks/results/stream_past_cache_zen4_s62*.json, give 0.91, 1.54 and 1.60: none, 1.5, 1.5;
    it keys the plan cache through the fingerprint, and still moves between none and 1.5 there).
    Capped at the CPUs the description counts: a figure probed with more CPUs than a later process
    may use."""
    stepped = min(math.floor(speedup * 2) / 2, float(max(cpus, 1)))
    return stepped if stepped > 1.0 else None


def quantized_clock_ghz(clock_ghz: float) -> float:
    return round(round(clock_ghz / CLOCK_QUANTUM_GHZ) * CLOCK_QUANTUM_GHZ, 3)


def supported_isas(flags) -> tuple[str, ...]:
    """The host ISAs a CPU with these /proc/cpuinfo flags runs, widest first (generic always)."""
    flags = set(flags)
    return tuple(isa for isa in HOST_ISAS if all(f in flags for f in _ISA_FACTS[isa][0]))


def _check_isa_name(isa: str, where: str) -> str:
    if isa not in HOST_ISAS:
        raise HardwareError(f"{where}: unknown host ISA '{isa}' (expected one of: {', '.join(HOST_ISAS)})")
    return isa


def capped_isas(flags, cap: Optional[str] = None) -> tuple[str, ...]:
    """supported_isas(flags), limited to `cap` and narrower ones (the XFC_HOST_ISA value)."""
    isas = supported_isas(flags)
    if cap is None:
        return isas
    _check_isa_name(cap, f"{HOST_ISA_ENV}={cap}")
    if cap not in isas:
        raise HardwareError(f"{HOST_ISA_ENV}={cap}: this CPU cannot run {cap} code "
                            f"(its /proc/cpuinfo flags lack {_missing(flags, cap)}; it runs: {', '.join(isas)})")
    return isas[isas.index(cap):]


def _missing(flags, isa: str) -> str:
    return " ".join(f for f in _ISA_FACTS[isa][0] if f not in set(flags))


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


def read_max_clock_ghz(cpu_dir: Path = SYSFS_CPU / "cpu0" / "cpufreq") -> Optional[float]:
    """cpufreq's maximum clock of cpu0 in GHz (cpuinfo_max_freq, kHz); None where the kernel has no
    cpufreq (common in virtual machines)."""
    try:
        khz = int((cpu_dir / "cpuinfo_max_freq").read_text().strip())
    except (OSError, ValueError):
        return None
    return round(khz / 1e6, 3) if khz > 0 else None


def _count_cpus(cpu_list: str) -> int:
    count = 0
    for part in filter(None, cpu_list.split(",")):
        lo, _, hi = part.partition("-")
        count += (int(hi) - int(lo) + 1) if hi else 1
    return max(count, 1)


def describe_host(cpuinfo: dict, caches: dict, n_cpus: int, machine: str, isa: Optional[str] = None,
                  cap: Optional[str] = None, measured: Optional[HostMeasurement] = None,
                  max_clock_ghz: Optional[float] = None) -> HardwareDescription:
    """Build the host description from parsed facts. Pure: same facts, same description.

    isa: the code path asked for ('--hw host:avx2'); None means the widest one available.
    cap: the XFC_HOST_ISA value (the widest ISA the host may claim); None means no cap.
    measured: the host probe's figures; they replace the assumed FMA rate of the chosen width, the
    FMA latency and the clock (quantized, see CLOCK_QUANTUM_GHZ). None: assumptions, listed as
    uncertain. max_clock_ghz: cpufreq's maximum (read_max_clock_ghz); without it or the probe the
    clock is /proc/cpuinfo's momentary 'cpu MHz', listed as uncertain.
    """
    if machine not in ("x86_64", "AMD64"):
        raise HardwareError(f"--hw host: this machine is {machine}; host synthesis supports x86-64 only")
    flags = cpuinfo.get("flags", set())
    available = capped_isas(flags, cap)
    if isa is not None:
        _check_isa_name(isa, f"--hw host:{isa}")
        if isa not in available:
            why = (f"{HOST_ISA_ENV}={cap} limits the host to {cap}" if isa in supported_isas(flags)
                   else f"its /proc/cpuinfo flags lack {_missing(flags, isa)}")
            raise HardwareError(f"--hw host:{isa}: this CPU cannot run {isa} code ({why}; "
                                f"available: {', '.join('host:' + i for i in available)})")
    chosen = isa or available[0]
    needed, vector_bits, registers, march = _ISA_FACTS[chosen]
    # Only the features of the chosen code path: xfc.cpu.isa.isa_for then picks that dialect.
    features = [f for f in ("avx2", "fma", "avx512f") if f in needed]
    forced = isa is not None or cap is not None
    uncertain = ["fma_per_cycle", "fma_latency_cycles", "memory.peak_bandwidth_gbps"]
    clock_ghz = max_clock_ghz or 0.0
    if clock_ghz <= 0:
        # 'cpu MHz' is the clock of the moment (an idle core reads low), hence uncertain; the
        # probe's measured clock replaces it below
        try:
            clock_ghz = round(float(cpuinfo.get("cpu MHz", "0")) / 1000.0, 3)
        except ValueError:
            clock_ghz = 0.0
        uncertain.append("clock_ghz")
    if clock_ghz <= 0:
        clock_ghz = 2.0
    fma_per_cycle: float = ASSUMED_FMA_PER_CYCLE
    fma_latency_cycles = 4
    dram_gbps = ASSUMED_DRAM_GBPS
    shared_cache_gbps: Optional[float] = None
    overflow_speedup: Optional[float] = None
    measured_fields: list[str] = []
    if measured is not None:
        rate = measured.fma_per_cycle_at(vector_bits)
        if rate is not None and rate > 0:
            fma_per_cycle = quantized_fma_per_cycle(rate)
            measured_fields.append("fma_per_cycle")
        if measured.fma_latency_cycles > 0:
            fma_latency_cycles = max(1, round(measured.fma_latency_cycles))
            measured_fields.append("fma_latency_cycles")
        if measured.clock_ghz > 0:
            clock_ghz = quantized_clock_ghz(measured.clock_ghz)
            measured_fields.append("clock_ghz")
        if measured.dram_read_gbps is not None and measured.dram_read_gbps > 0:
            dram_gbps = quantized_dram_gbps(measured.dram_read_gbps)
            measured_fields.append("memory.peak_bandwidth_gbps")
        if measured.shared_cache_read_gbps and "L3" in caches:
            shared_cache_gbps = quantized_dram_gbps(measured.shared_cache_read_gbps)
            measured_fields.append("shared_cache_read_gbps")
        if measured.l3_overflow_read_speedup and "L3" in caches and n_cpus > 1:
            overflow_speedup = quantized_speedup(measured.l3_overflow_read_speedup, n_cpus)
            measured_fields.append("l3_overflow_read_speedup")
        uncertain = [u for u in uncertain if u not in measured_fields]
    l1 = caches.get("L1d", {"size_kib": 32, "line_bytes": 64, "ways": 8, "shared_by_cores": 1})
    l2 = caches.get("L2", {"size_kib": 1024, "line_bytes": 64, "ways": 8, "shared_by_cores": 1})
    l3 = caches.get("L3")
    for label, present in (("l1d", "L1d" in caches), ("l2", "L2" in caches)):
        if not present:
            uncertain.append(f"{label}.size_kib")
    core = CpuCore(
        name="host", vendor="x86", isa="x86-64", features=tuple(features), gcc_march=march, qemu_cpu="",
        pipeline="out_of_order", decode_width=4, vector_bits=vector_bits, vector_registers=registers,
        fma_per_cycle=fma_per_cycle, fma_latency_cycles=fma_latency_cycles,
        load_rules=LoadRules(vector_loads_per_cycle=2, ld128_dual_issues_with_fma=True,
                             ld128_blocking_cycles=0, ld64_dual_issues_with_fma=True),
        l1d=CacheLevel(int(l1["size_kib"] * 1024), l1["line_bytes"], l1["ways"], 1),
        l2=CacheLevel(int(l2["size_kib"] * 1024), l2["line_bytes"], l2["ways"], l2["shared_by_cores"]),
        typical_max_clock_ghz=clock_ghz)
    cluster = CpuCluster(role="big", core=core, count=n_cpus, clock_ghz=clock_ghz,
                         cpu_ids=tuple(range(n_cpus)), l2=core.l2)
    model = cpuinfo.get("model name", "unknown x86-64 CPU")
    how = f"--hw host:{isa}" if isa is not None else f"{HOST_ISA_ENV}={cap}"
    marketing = f"{model} ({n_cpus} CPUs)" + (f" limited to {_LABELS[chosen]} by {how}" if forced else "")
    if measured_fields:
        when = "cached" if measured.cached else "just now"
        dram_note = ("DRAM bandwidth is the probe's sustained read (a lower bound on the peak)"
                     if "memory.peak_bandwidth_gbps" in measured_fields else "DRAM bandwidth is an assumption")
        notes = (f"detected at run time; {', '.join(measured_fields)} measured by the host FMA probe "
                 f"at {measured.measured_at} ({when}; 'xfc hw show host --remeasure' measures again); "
                 f"{dram_note}")
    else:
        notes = "detected at run time; vector FMA rate per cycle and DRAM bandwidth are assumptions"
    if forced:
        notes += (f"; made to look like a {chosen} core ({vector_bits}-bit, {registers} vector registers, "
                  f"-march={march}) by {how}")
    return HardwareDescription(
        name=f"host:{chosen}" if forced else "host", kind="host", marketing_name=marketing,
        clusters=(cluster,), gpu=None,
        l3_bytes=int(l3["size_kib"] * 1024) if l3 else None, slc_bytes=None,
        memory=MemoryDescription(type="host DRAM", peak_bandwidth_gbps=dram_gbps, channels=1,
                                 measured_sustained_read="memory.peak_bandwidth_gbps" in measured_fields),
        target_arch="x86_64",
        sources=("/proc/cpuinfo", "/sys/devices/system/cpu/cpu0/cache",
                 *((MAX_CLOCK_SOURCE,) if max_clock_ghz else ()),
                 *(("host FMA probe (xfc.tiledb.probe)",) if measured_fields else ())),
        uncertain=tuple(f"host:{u}" for u in uncertain), source_path="",
        notes=notes, shared_cache_read_gbps=shared_cache_gbps, l3_overflow_read_speedup=overflow_speedup)


def _cap(cap) -> Optional[str]:
    return settings.host_isa_cap() if cap is FROM_ENVIRONMENT else cap


def read_flags() -> set[str]:
    """This machine's /proc/cpuinfo flags (empty when unreadable): the one reader, for the ISA
    choice here and for what the description does not list (avx512_vnni for the int8 planner)."""
    try:
        return parse_cpuinfo(Path("/proc/cpuinfo").read_text())["flags"]
    except OSError:
        return set()


def available_isas(cap=FROM_ENVIRONMENT) -> tuple[str, ...]:
    """The host ISAs this machine runs, widest first, after the cap (default: XFC_HOST_ISA)."""
    return capped_isas(read_flags(), _cap(cap))


def detect_host(isa: Optional[str] = None, cap=FROM_ENVIRONMENT,
                measured: Optional[HostMeasurement] = None) -> HardwareDescription:
    """Read this machine's facts (the only I/O) and describe it; isa, cap and measured as in
    describe_host (cap default: the XFC_HOST_ISA setting)."""
    try:
        cpuinfo_text = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo_text = ""
    try:
        n_cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n_cpus = os.cpu_count() or 1
    return describe_host(parse_cpuinfo(cpuinfo_text), read_caches(), n_cpus, platform.machine(),
                         isa=isa, cap=_cap(cap), measured=measured, max_clock_ghz=read_max_clock_ghz())
