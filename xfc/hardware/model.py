"""The hardware description types: frozen dataclasses, nothing else (no I/O, no YAML).

A HardwareDescription is what xfc.hardware.load returns for a SoC, a single CPU core, a single
GPU or this machine ('host'); see hardware_descriptions/SCHEMA.md for the file format.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import HardwareError

CPU_FEATURES = ("neon", "fp16", "dotprod", "i8mm", "bf16", "sve2", "avx2", "avx512f", "fma")
CLUSTER_ROLES = ("prime", "big", "mid", "little")


@dataclass(frozen=True)
class CacheLevel:
    size_bytes: int
    line_bytes: int
    ways: int
    shared_by_cores: int = 1


@dataclass(frozen=True)
class LoadRules:
    vector_loads_per_cycle: float     # 128-bit vector loads issued per cycle
    ld128_dual_issues_with_fma: bool  # False on A53/A55-class in-order cores
    ld128_blocking_cycles: int        # cycles a 128-bit load blocks the pipe
    ld64_dual_issues_with_fma: bool


@dataclass(frozen=True)
class CpuCore:
    name: str
    vendor: str
    isa: str
    features: tuple[str, ...]
    gcc_march: str
    qemu_cpu: str
    pipeline: str                 # 'in_order' | 'out_of_order'
    decode_width: int
    vector_bits: int
    vector_registers: int
    fma_per_cycle: float          # vector FMA instructions of vector_bits per cycle
    fma_latency_cycles: int
    load_rules: LoadRules
    l1d: CacheLevel
    l2: CacheLevel
    typical_max_clock_ghz: float
    cpuinfo_id: Optional[tuple[int, int]] = None   # (CPU implementer, CPU part) in /proc/cpuinfo
    fp16_fma_per_cycle: Optional[float] = None     # FMLA .8h (fp16) instructions per cycle; None: as fma_per_cycle
    sdot_per_cycle: Optional[float] = None    # 128-bit SDOT/UDOT per cycle (dotprod cores); None: not given
    smmla_per_cycle: Optional[float] = None   # 128-bit SMMLA per cycle (i8mm cores); None: not given

    @property
    def fp32_lanes(self) -> int:
        return self.vector_bits // 32

    @property
    def fp16_fma_rate(self) -> Optional[float]:
        """Vector fp16 FMA instructions per cycle: the described figure, else fma_per_cycle (FMLA .8h
        issues like FMLA .4s on the Arm cores with FP16 arithmetic: SCHEMA.md); None without fp16."""
        if "fp16" not in self.features:
            return None
        return self.fp16_fma_per_cycle if self.fp16_fma_per_cycle is not None else self.fma_per_cycle

    @property
    def fp32_flop_per_cycle(self) -> float:
        return self.fp32_lanes * 2 * self.fma_per_cycle


@dataclass(frozen=True)
class CpuCluster:
    role: str
    core: CpuCore
    count: int
    clock_ghz: float
    cpu_ids: tuple[int, ...]
    l2: CacheLevel               # the core's L2, with this SoC's size override applied
    cpuinfo_ids: tuple[tuple[int, int], ...] = ()  # (implementer, part) pairs its CPUs may report

    @property
    def peak_gflops_per_core(self) -> float:
        return self.core.fp32_flop_per_cycle * self.clock_ghz

    @property
    def peak_gflops(self) -> float:
        return self.peak_gflops_per_core * self.count


@dataclass(frozen=True)
class GpuDescription:
    name: str
    vendor: str
    family: str                  # 'mali' | 'adreno'
    architecture: str
    compute_unit_name: str
    compute_units: int
    max_clock_mhz: float
    warp_width: int
    half_warp_width: Optional[int]
    fp32_flop_per_clock_per_cu: float
    fp16_flop_per_clock_per_cu: Optional[float]
    registers_per_thread_full_occupancy: int
    register_file_bytes_per_cu: Optional[int]
    max_waves_per_cu: Optional[int]
    local_memory_kib: float
    local_memory_on_chip: bool
    max_work_group_size: int
    preferred_work_group_size: int
    l1_kib_per_cu: float
    l2_kib: float
    opencl_version: str
    extensions: tuple[str, ...]
    coalescing_threads: int
    image_support: bool

    @property
    def peak_fp32_gflops(self) -> float:
        return self.compute_units * self.fp32_flop_per_clock_per_cu * self.max_clock_mhz / 1000.0

    @property
    def peak_fp16_gflops(self) -> Optional[float]:
        if self.fp16_flop_per_clock_per_cu is None:
            return None
        return self.compute_units * self.fp16_flop_per_clock_per_cu * self.max_clock_mhz / 1000.0


@dataclass(frozen=True)
class MemoryDescription:
    type: str
    peak_bandwidth_gbps: float
    channels: int
    # True where peak_bandwidth_gbps is a sustained read measured on the machine (the host probe),
    # not a datasheet peak: a stream runs at it as measured, with no efficiency taken off
    measured_sustained_read: bool = False


@dataclass(frozen=True)
class AndroidIds:
    """What identifies a SoC on Android (compared case-insensitively)."""
    soc_models: tuple[str, ...]          # ro.soc.model (Android 12+)
    board_platforms: tuple[str, ...]     # ro.board.platform, ro.hardware or ro.chipname
    soc_manufacturer: str = ""           # ro.soc.manufacturer (the virtual device reports it)


@dataclass(frozen=True)
class HardwareDescription:
    name: str
    kind: str                         # 'soc' | 'cpu_core' | 'gpu' | 'host'
    marketing_name: str
    clusters: tuple[CpuCluster, ...]  # fastest first; empty for a GPU-only description
    gpu: Optional[GpuDescription]
    l3_bytes: Optional[int]
    slc_bytes: Optional[int]
    memory: Optional[MemoryDescription]
    target_arch: str                  # 'aarch64' | 'x86_64'
    sources: tuple[str, ...]
    uncertain: tuple[str, ...]        # field paths to check on a device, prefixed by file name
    source_path: str                  # the file it was loaded from ('' for host detection)
    notes: str = ""
    android: Optional["AndroidIds"] = None   # how an Android phone with this SoC names it
    # What one core reads from the shared cache (L3), GB/s: the host probe's measurement; None where
    # nothing measured it (the cost model then assumes cost_model.SHARED_CACHE_BYTES_PER_CYCLE)
    shared_cache_read_gbps: Optional[float] = None
    # How many times faster every CPU together reads a buffer a little larger than the L3, over and
    # over, than one thread does, less what the DRAM figure already holds of that: the host probe's
    # measurement (xfc.tiledb.probe); None where nothing measured it or it measured no gain (the
    # cost model then streams such a buffer at one chip-wide rate, whatever the threads)
    l3_overflow_read_speedup: Optional[float] = None

    def cluster(self, role: Optional[str] = None) -> CpuCluster:
        """The cluster to synthesize for: the named role, or the default 'big' one.

        Default: the 'big' cluster, else the only/fastest one (XNNPACK likewise tunes for the
        big cores and gives the others the same tile shapes).
        """
        if not self.clusters:
            raise HardwareError(f"{self.name}: has no CPU clusters (it describes only a GPU)")
        roles = [c.role for c in self.clusters]
        if role is None:
            return self.clusters[roles.index("big")] if "big" in roles else self.clusters[0]
        if role not in roles:
            raise HardwareError(f"{self.name}: no '{role}' cluster (it has: {', '.join(roles)})")
        return self.clusters[roles.index(role)]
