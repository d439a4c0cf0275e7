"""The host C compiler and the machine's conditions around a measurement.

Subprocesses go through xfc.toolchain.tools.run (argument lists, timeouts, one-line errors).
Conditions are read from sysfs/procfs where the machine offers them and recorded as null where
it does not (containers and VMs often hide cpufreq and thermal zones).
"""
from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Optional

from ..toolchain.tools import HOST_CC, require_tool, run

COMPILE_TIMEOUT_S = 120
RUN_TIMEOUT_S = 120
SYSFS_CPU = Path("/sys/devices/system/cpu")
THERMAL = Path("/sys/class/thermal")


def require_cc() -> str:
    return require_tool(HOST_CC)


@functools.lru_cache(maxsize=None)
def compiler_version() -> str:
    """e.g. 'gcc 12.2.0' (recorded with every measurement)."""
    return f"{HOST_CC} " + run([require_cc(), "-dumpfullversion"], "gcc -dumpfullversion", 30).stdout.strip()


def compile_c(source: Path, exe: Path, flags: list[str], what: str) -> Path:
    run([require_cc(), "-std=gnu11", *flags, "-o", str(exe), str(source), "-lm"], what, COMPILE_TIMEOUT_S,
        cwd=source.parent)
    return exe


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _max_temp_c() -> Optional[float]:
    temps = []
    for zone in sorted(THERMAL.glob("thermal_zone*")):
        text = _read(zone / "temp")
        if text and text.lstrip("-").isdigit():
            temps.append(int(text) / 1000.0)
    return max(temps) if temps else None


def load_average() -> Optional[float]:
    """The 1-minute load average, or None where the system does not tell."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def snapshot() -> dict:
    """Governor, cpu0 frequency (MHz), hottest thermal zone (C), 1-minute load average."""
    freq = _read(SYSFS_CPU / "cpu0" / "cpufreq" / "scaling_cur_freq")
    load1 = load_average()
    return {
        "governor": _read(SYSFS_CPU / "cpu0" / "cpufreq" / "scaling_governor"),
        "freq_mhz": round(int(freq) / 1000.0, 1) if freq and freq.isdigit() else None,
        "temp_c": _max_temp_c(),
        "loadavg": load1,
    }


def conditions(before: dict, after: dict) -> dict:
    """The recorded conditions of one measurement; throttled is null when nothing tells."""
    throttled = None
    if before["freq_mhz"] and after["freq_mhz"]:
        throttled = after["freq_mhz"] < 0.9 * before["freq_mhz"]
    return {
        "governor": before["governor"],
        "freq_mhz_before": before["freq_mhz"], "freq_mhz_after": after["freq_mhz"],
        "temp_c_before": before["temp_c"], "temp_c_after": after["temp_c"],
        "loadavg_before": before["loadavg"], "loadavg_after": after["loadavg"],
        "throttled": throttled,
    }
