"""The hardware a command line names, with the host described as measured.

`--hw host` (and `host:<isa>`) gets the host probe's figures (xfc.tiledb.probe: FMA throughput
of the chosen vector width, FMA latency and the sustained clock, cached per machine in the
per-user tile database) instead of the assumed two FMAs per cycle; every other name loads as
before. The probe lives here, above xfc.hardware, because measuring needs the compiler and the
cache needs the database; xfc.hardware only applies a HostMeasurement it is given.

When the probe cannot run (no gcc, no FMA, not x86-64) the description keeps its assumptions,
marks them uncertain, and the caller gets one warning line.
"""
from __future__ import annotations

from typing import Callable, Mapping

from ..cpu.cost_model import SHARED_CACHE_BYTES_PER_CYCLE
from ..hardware.host import MAX_CLOCK_SOURCE
from ..hardware.load import is_host_name, load
from ..hardware.model import HardwareDescription
from ..settings import FROM_ENVIRONMENT, switch
from .probe import host_probe_or_none

PROBE_ENV = "XFC_HOST_PROBE"   # 'off': keep the assumed host figures (no measurement, no cache)


def probe_enabled(environ: Mapping[str, str]) -> bool:
    return switch(environ, PROBE_ENV)


def load_hardware(name: str, environ: Mapping[str, str], *, remeasure: bool = False,
                  warn: Callable[[str], None] = lambda message: None,
                  host_isa_cap=FROM_ENVIRONMENT) -> HardwareDescription:
    """xfc.hardware.load.load(name), with the host measured (see the module docstring).

    remeasure: run the probe again instead of reading the cached result (and cache the new one).
    """
    described = load(name, host_isa_cap=host_isa_cap)   # bad names fail here, before any measuring
    if not is_host_name(name) or not (remeasure or probe_enabled(environ)):
        return described
    probe = host_probe_or_none(environ, remeasure=remeasure, warn=warn)
    if probe is None:
        return described
    return load(name, host_isa_cap=host_isa_cap, host_measurement=probe.measurement())


def measured_or_assumed(hw: HardwareDescription) -> dict[str, str]:
    """For a host description: which of its core figures were measured and which assumed."""
    if hw.kind != "host":
        return {}
    uncertain = {u.partition(":")[2] for u in hw.uncertain}
    probed = any(source.startswith("host FMA probe") for source in hw.sources)
    out = {field: ("assumed" if field in uncertain or not probed else "measured")
           for field in ("fma_per_cycle", "fma_latency_cycles")}
    out["clock_ghz"] = ("measured" if probed and "clock_ghz" not in uncertain
                        else "cpufreq maximum (not measured)" if MAX_CLOCK_SOURCE in hw.sources
                        else "/proc/cpuinfo 'cpu MHz' at that moment (not measured; uncertain)")
    out["memory.peak_bandwidth_gbps"] = ("assumed" if "memory.peak_bandwidth_gbps" in uncertain or not probed
                                         else "measured (sustained read)")
    if hw.l3_bytes:
        out["shared_cache_read_gbps"] = ("measured (one core)" if hw.shared_cache_read_gbps
                                         else f"not measured (assumed {SHARED_CACHE_BYTES_PER_CYCLE:g} bytes/cycle per core)")
        # describe_host lists the measured fields in its notes; a measured figure below 1.5 is left
        # out of the description (host.quantized_speedup)
        out["l3_overflow_read_speedup"] = (
            "measured (every CPU against one thread, less the DRAM figure's share)" if hw.l3_overflow_read_speedup
            else "measured (below 1.5x: not used)" if probed and "l3_overflow_read_speedup" in hw.notes
            else "not measured (one chip-wide rate assumed)")
    return out
