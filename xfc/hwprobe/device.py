"""Reading a phone for `xfc hw probe`: the only I/O of xfc.hwprobe (through xfc.runners.adb).

    facts = read_facts(AdbRunner(serial=..., adb_port=...))

Reads getprop, /proc/cpuinfo, /proc/meminfo, each CPU's cpufreq and cacheinfo files and the GPU
driver's model files, then hands the texts to the pure parsers (facts_from_files).
"""
from __future__ import annotations

import re

from xfc.runners.adb import AdbRunner

from .facts import CPUINFO, MEMINFO, DeviceFacts, facts_from_files
from .parse import CPU_ROOT, GPU_FILES, cache_paths, cpu_dir, cpufreq_paths


def read_facts(runner: AdbRunner) -> DeviceFacts:
    """Everything xfc hw probe reads from the device (DeviceError, exit 3, if it cannot)."""
    runner.connect()
    serial = runner.serial or ""
    files: dict[str, str] = {}
    for path in (CPUINFO, MEMINFO):
        text = runner.read_text(path)
        if text is not None:
            files[path] = text
    listing = runner.list_dirs([CPU_ROOT]).get(CPU_ROOT, [])
    cpus = sorted(int(m.group(1)) for n in listing if (m := re.fullmatch(r"cpu(\d+)", n)))
    cache_dirs = [f"{cpu_dir(c)}/cache" for c in cpus]
    indexes = runner.list_dirs(cache_dirs)
    paths: list[str] = []
    for c in cpus:
        paths += cpufreq_paths(c)
        for index in sorted(indexes.get(f"{cpu_dir(c)}/cache", [])):
            if re.fullmatch(r"index\d+", index):
                paths += cache_paths(c, index)
    files.update(runner.read_texts(paths))
    files.update(runner.read_texts(GPU_FILES))     # most phones have only one driver's files
    return facts_from_files(serial, dict(runner.props), files, runner.vendor_opencl_path() or "")
