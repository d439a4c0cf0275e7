"""The machine a benchmark ran on, recorded in every results file so that figures from different
machines are never compared by mistake (the CPU model, its ISAs, core count, platform, load)."""
from __future__ import annotations

import os
import platform
from pathlib import Path


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
    return {"cpu_model": cpuinfo.get("model name", platform.processor() or "unknown"),
            "host_isas": list(available_isas(cap=None)), "cpus": os.cpu_count(), "platform": platform.platform(),
            "load_average_at_write": load}
