"""The host C compiler and the machine's conditions around a measurement.

Every subprocess gets an argument list and a timeout; failures become one ToolchainError line.
Conditions are read from sysfs/procfs where the machine offers them and recorded as null where
it does not (containers and VMs often hide cpufreq and thermal zones).
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Optional

from ..errors import ToolchainError

HOST_CC = "gcc"
COMPILE_TIMEOUT_S = 120
RUN_TIMEOUT_S = 120
SYSFS_CPU = Path("/sys/devices/system/cpu")
THERMAL = Path("/sys/class/thermal")


def run(argv: list[str], what: str, timeout_s: float, cwd: Optional[Path] = None,
        errors: Optional[dict[int, type]] = None) -> str:
    """stdout of argv, or ToolchainError with the first error line (errors: exit status -> the
    XfcError type to raise instead, e.g. a driver's 'wrong result' status)."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                              cwd=str(cwd) if cwd else None)
    except subprocess.TimeoutExpired:
        raise ToolchainError(f"{what} timed out after {timeout_s:.0f} s") from None
    except OSError as exc:
        raise ToolchainError(f"{what}: cannot start {argv[0]} ({exc.strerror})") from None
    if proc.returncode != 0:
        text = (proc.stderr or proc.stdout or "").strip().splitlines()
        first = next((ln for ln in text if "error" in ln.lower()), text[0] if text else "")
        kind = (errors or {}).get(proc.returncode, ToolchainError)
        raise kind(f"{what} failed (exit {proc.returncode}): {first.strip()[:300]}")
    return proc.stdout


def require_cc() -> str:
    path = shutil.which(HOST_CC)
    if path is None:
        raise ToolchainError(f"'{HOST_CC}' was not found on PATH; install it with: apt-get install -y gcc")
    return path


@functools.lru_cache(maxsize=None)
def compiler_version() -> str:
    """e.g. 'gcc 12.2.0' (recorded with every measurement)."""
    return f"{HOST_CC} " + run([require_cc(), "-dumpfullversion"], "gcc -dumpfullversion", 30).strip()


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


def snapshot() -> dict:
    """Governor, cpu0 frequency (MHz), hottest thermal zone (C), 1-minute load average."""
    freq = _read(SYSFS_CPU / "cpu0" / "cpufreq" / "scaling_cur_freq")
    try:
        load1 = round(os.getloadavg()[0], 2)
    except OSError:
        load1 = None
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
