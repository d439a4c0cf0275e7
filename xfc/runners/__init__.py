"""Runners: run a built kernel somewhere, bring back its output and ONE Measurement.

    from xfc.runners import get_runner, make_spec
    runner = get_runner("qemu")                        # or an adb serial, or "adb" for the only one
    m = runner.execute(make_spec("build/harness", a, b, bias, repeat=10, cpu_ids=(4, 5, 6, 7)))
    m.output, m.median_s, m.where, m.emulated, m.throttled

The host (runners.host.HostRunner) and PoCL (runners.pocl.PoclRunner) runners are built from what
they run (a loaded library, a built OpenCL harness) and take the same RunSpec.
"""
from __future__ import annotations

from xfc.runners.base import (WHERE_VIRTUAL, HarnessRunner, Measurement, RunContext, Runner, RunSpec, hexmask,
                              make_spec, where_qemu)


def get_runner(device: str, adb_host: str | None = None, adb_port: int | None = None,
               **options) -> Runner:
    """A runner for `device`: "qemu" (local qemu-aarch64), "adb" (the single adb device) or an
    adb serial such as "R58M123ABC" or "127.0.0.1:5599".

    Options: qemu_cpu / qemu (QemuRunner); cpu_ids, vendor_libs, start_server, ... (AdbRunner).
    """
    dev = (device or "").strip()
    if dev.lower() == "qemu" or dev.lower().startswith("qemu:"):
        from xfc.runners.qemu import QemuRunner
        cpu = options.pop("qemu_cpu", None) or (dev.split(":", 1)[1] if ":" in dev else "max")
        return QemuRunner(cpu=cpu, **{k: v for k, v in options.items() if k in ("qemu",)})
    from xfc.runners.adb import AdbRunner
    options.pop("qemu_cpu", None)
    serial = None if dev.lower() in ("", "adb", "auto") else dev
    return AdbRunner(serial=serial, adb_host=adb_host, adb_port=adb_port, **options)


__all__ = ["Runner", "HarnessRunner", "RunSpec", "Measurement", "RunContext", "get_runner", "make_spec", "hexmask",
           "where_qemu", "WHERE_VIRTUAL"]
