"""The machine a benchmark ran on, recorded in every results file so that figures from different
machines are never compared by mistake (the CPU model, family and model number, its ISAs and the
int8 dot-product extensions, core count, platform, load)."""
from __future__ import annotations

import os
import platform
from pathlib import Path


# int8 dot-product extensions a peer may use where xfc's kernels do not (AMX: onnxruntime's MLAS)
INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8", "amx_tile")


def machine_facts() -> dict:
    from xfc.hardware.host import available_isas, parse_cpuinfo
    try:
        cpuinfo = parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        cpuinfo = {}
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    flags = cpuinfo.get("flags", set())
    return {"cpu_model": cpuinfo.get("model name", platform.processor() or "unknown"),
            # a VM's model name can be generic ("Intel(R) Xeon(R) Processor"): family and model number
            # tell the microarchitecture apart (Intel 6/207 Emerald Rapids, AMD 25/1 Zen 3, 25/17 Zen 4)
            "cpu_family": cpuinfo.get("cpu family"), "cpu_model_number": cpuinfo.get("model"),
            "dot_product_flags": sorted(f for f in INT8_DOT_FLAGS if f in flags),
            "host_isas": list(available_isas(cap=None)), "cpus": os.cpu_count(), "platform": platform.platform(),
            "load_average_at_write": load}


LOADED = 1.5   # a 1-minute load average above this on the 2-core machines: others competed for the cores


def warn_if_loaded() -> float:
    """Print one warning line when other processes competed for the cores; returns the load."""
    load = os.getloadavg()[0]
    if load > LOADED:
        print(f"warning: load average {load:.1f} on {os.cpu_count()} CPUs: other processes competed for the "
              "cores; figures are unreliable")
    return load



def host_figures(hw) -> dict:
    """The described host's facts its plans depend on, as the tile database fingerprints them
    (xfc.tiledb.fingerprint.cluster_facts: clock, FMA rate, caches, DRAM read, and the L3 read and
    past-L3 gain where measured), and that fingerprint. A re-probe can move them (the DRAM read by
    10% or more between two probes of one VM), and with them a plan near a tie: a result that
    records them says which description chose its plans."""
    from xfc.tiledb.fingerprint import cluster_facts, fingerprint
    cluster = hw.cluster()
    return dict(fingerprint=fingerprint(hw, cluster), **cluster_facts(hw, cluster))
