"""Hardware fingerprints: the resolved description facts that matter to a tile, hashed.

A fingerprint names one CPU cluster of one resolved description. It hashes exactly these facts
(canonical JSON, SHA-256, first 32 hex digits):

  fingerprint_version                   bumped if this list changes
  target_arch                           'aarch64' | 'x86_64'
  core: name, vendor, isa, features (sorted), gcc_march, pipeline, decode_width, vector_bits,
        vector_registers, fma_per_cycle, fma_latency_cycles, load_rules (all four),
        l1d (size, line, ways), l2 (the cluster's, with an SoC's size override applied)
  clock_ghz                             the cluster's clock
  shared caches: l3_bytes, slc_bytes
  dram_gbps                             peak memory bandwidth (operator-level rows depend on it)
  shared_cache_read_gbps                one core's measured L3 read rate, only where measured
  l3_overflow_read_speedup              every CPU's past-L3 read over one thread's, less what the DRAM
                                        figure holds of it, only where measured above 1

Left out on purpose: names and marketing text of the SoC, sources, notes, the 'uncertain' list,
core counts and CPU ids (threads are part of operator keys instead), qemu_cpu (an emulator
setting), and the GPU. So editing any listed field of a hardware file changes the fingerprint
and its old rows stop matching, while fixing a typo in a note does not.
"""
from __future__ import annotations


from ..hardware.model import CpuCluster, HardwareDescription
from .records import canonical_json, fingerprint_of_facts  # noqa: F401  (part of this module's face)

FINGERPRINT_VERSION = 1


def _cache(level) -> dict:
    return {"size_bytes": level.size_bytes, "line_bytes": level.line_bytes, "ways": level.ways,
            "shared_by_cores": level.shared_by_cores}


def cluster_facts(hw: HardwareDescription, cluster: CpuCluster) -> dict:
    """The facts a fingerprint hashes (see the module docstring), as plain JSON types."""
    core = cluster.core
    rules = core.load_rules
    return {
        "fingerprint_version": FINGERPRINT_VERSION,
        "target_arch": hw.target_arch,
        "core": {
            "name": core.name, "vendor": core.vendor, "isa": core.isa, "features": sorted(core.features),
            "gcc_march": core.gcc_march, "pipeline": core.pipeline, "decode_width": int(core.decode_width),
            "vector_bits": int(core.vector_bits), "vector_registers": int(core.vector_registers),
            # floats where the schema allows fractions, so 2 and 2.0 hash alike
            "fma_per_cycle": float(core.fma_per_cycle), "fma_latency_cycles": int(core.fma_latency_cycles),
            "load_rules": {"vector_loads_per_cycle": float(rules.vector_loads_per_cycle),
                           "ld128_dual_issues_with_fma": bool(rules.ld128_dual_issues_with_fma),
                           "ld128_blocking_cycles": int(rules.ld128_blocking_cycles),
                           "ld64_dual_issues_with_fma": bool(rules.ld64_dual_issues_with_fma)},
            "l1d": _cache(core.l1d),
            "l2": _cache(cluster.l2),
        },
        "clock_ghz": float(cluster.clock_ghz),
        "l3_bytes": hw.l3_bytes,
        "slc_bytes": hw.slc_bytes,
        "dram_gbps": float(hw.memory.peak_bandwidth_gbps) if hw.memory else None,
        # only where measured, so every description without the figure keeps its fingerprint
        **({"shared_cache_read_gbps": float(hw.shared_cache_read_gbps)} if hw.shared_cache_read_gbps else {}),
        **({"l3_overflow_read_speedup": float(hw.l3_overflow_read_speedup)} if hw.l3_overflow_read_speedup else {}),
    }


def fingerprint(hw: HardwareDescription, cluster: CpuCluster) -> str:
    return fingerprint_of_facts(canonical_json(cluster_facts(hw, cluster)))


def label(hw: HardwareDescription, cluster: CpuCluster) -> str:
    """A human name for the fingerprint's hardware: '<description>:<cluster role>'."""
    return f"{hw.name}:{cluster.role}"
