"""The `xfc` command line. The only module that reads the environment and maps errors to exits.

Exit status: 0 ok, 2 bad input (hardware file, operator, shape), 3 missing toolchain or device,
4 a kernel that did not match the numpy reference, 130 interrupted (SIGINT), 143 terminated (SIGTERM).
Both signals raise `Interrupted` in the main thread, so every clean-up runs (see xfc/outputs.py,
xfc/procs.py).
"""
from __future__ import annotations

import argparse
import difflib
import functools
import json
import signal
import sys
import threading

from .._version import __version__
from .. import settings
from ..errors import XfcError


def _print_table(rows: list[list[str]], header: list[str], out=None) -> None:
    out = out if out is not None else sys.stdout   # looked up per call: redirections and capture apply
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    print(line.rstrip(), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip(), file=out)


def _fmt(value, digits=1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


# ---------------------------------------------------------------------------------------------
# xfc hw ...
# ---------------------------------------------------------------------------------------------

def cmd_hw_list(args) -> int:
    from ..hardware.load import load_path, shipped_files
    from .hardware import load_for_command_line
    from ..hardware.figures import derived_figures
    rows, payload = [], []
    entries = [(p.parent.name if p.parent.name in ("cpu", "gpu", "soc") else "alias", p) for p in shipped_files()]
    entries.append(("host", None))
    for layer, path in entries:
        hw = load_for_command_line("host") if path is None else load_path(path)   # as 'xfc hw show host' sees it
        figs = derived_figures(hw)
        name = "host" if path is None else path.stem
        if layer == "alias":
            what = f"-> {hw.name}"
        elif hw.kind in ("soc", "host"):
            what = hw.marketing_name
        elif hw.kind == "cpu_core":
            what = f"{hw.clusters[0].core.isa}, {hw.clusters[0].core.pipeline.replace('_', '-')}"
        else:
            what = f"{hw.gpu.family} {hw.gpu.architecture}, {hw.gpu.compute_units} {hw.gpu.compute_unit_name}s"
        per_core = max((c["peak_gflops_per_core"] for c in figs["clusters"]), default=None)
        rows.append([layer, name, what, _fmt(per_core), _fmt(figs["cpu_peak_gflops"]),
                     _fmt(figs["gpu_peak_fp32_gflops"], 0)])
        payload.append({"layer": layer, "name": name, "description": what, **figs})
    if args.json:
        print(json.dumps(payload, indent=2))
        return 0
    _print_table(rows, ["layer", "name", "description", "GFLOP/s/core", "CPU GFLOP/s", "GPU GFLOP/s"])
    print("\nPeaks are FP32 at the listed clocks (single core: the fastest; CPU: all clusters). "
          "'xfc hw show NAME' for details.")
    return 0


def hardware_summary(hw) -> dict:
    from dataclasses import asdict
    from ..hardware.figures import derived_figures
    data = {
        "name": hw.name, "kind": hw.kind, "marketing_name": hw.marketing_name, "source_path": hw.source_path,
        "target_arch": hw.target_arch,
        "clusters": [{"role": c.role, "count": c.count, "clock_ghz": c.clock_ghz, "cpu_ids": list(c.cpu_ids),
                      "l2_bytes": c.l2.size_bytes, "core": asdict(c.core)} for c in hw.clusters],
        "gpu": asdict(hw.gpu) if hw.gpu else None,
        "l3_bytes": hw.l3_bytes, "slc_bytes": hw.slc_bytes, "shared_cache_read_gbps": hw.shared_cache_read_gbps,
        "l3_overflow_read_speedup": hw.l3_overflow_read_speedup,
        "memory": asdict(hw.memory) if hw.memory else None,
        "derived": derived_figures(hw), "uncertain": list(hw.uncertain), "sources": list(hw.sources),
        "notes": hw.notes,
    }
    if hw.kind == "host":
        from ..tiledb.hostdesc import measured_or_assumed
        data["host_figures"] = measured_or_assumed(hw)
    return data


def cmd_hw_show(args) -> int:
    from ..hardware.load import is_host_name
    from ..hardware.figures import derived_figures
    from ..tiledb.hostdesc import measured_or_assumed
    from .hardware import load_for_command_line
    if args.remeasure and not is_host_name(args.name):
        raise XfcError(f"--remeasure: only the host is measured ('xfc hw show host --remeasure'), not {args.name}")
    hw = load_for_command_line(args.name, remeasure=args.remeasure)
    if args.json:
        print(json.dumps(hardware_summary(hw), indent=2, default=list))
        return 0
    figs = derived_figures(hw)
    print(f"{hw.name}: {hw.marketing_name}  [{hw.kind}; {hw.source_path or 'detected on this machine'}]")
    if hw.clusters:
        print("\nCPU clusters:")
        rows = []
        for c, f in zip(hw.clusters, figs["clusters"]):
            core = c.core
            rows.append([c.role, f"{c.count}x {core.name}", f"{c.clock_ghz:.2f}", ",".join(map(str, c.cpu_ids)),
                         core.pipeline.replace("_", "-"), f"{core.vector_bits}b x{core.vector_registers}",
                         f"{core.fma_per_cycle:g}", f"{core.l1d.size_bytes // 1024}",
                         f"{c.l2.size_bytes // 1024}", ",".join(core.features),
                         _fmt(f["peak_gflops_per_core"]), _fmt(f["peak_gflops_cluster"])])
        _print_table(rows, ["role", "cores", "GHz", "cpu ids", "pipeline", "SIMD", "FMA/cyc", "L1d KiB",
                            "L2 KiB", "features", "GFLOP/s/core", "GFLOP/s"])
    if hw.l3_bytes or hw.slc_bytes:
        print(f"\nShared caches: L3 {(hw.l3_bytes or 0) // 1024} KiB, SLC {(hw.slc_bytes or 0) // 1024} KiB")
    if hw.gpu:
        g = hw.gpu
        print(f"\nGPU: {g.name} ({g.family}, {g.architecture}): {g.compute_units} {g.compute_unit_name}s @ "
              f"{g.max_clock_mhz:g} MHz, warp {g.warp_width}, {g.fp32_flop_per_clock_per_cu:g} FP32 FLOP/clk/CU, "
              f"local memory {g.local_memory_kib:g} KiB ({'on chip' if g.local_memory_on_chip else 'not on chip'}), "
              f"max work-group {g.max_work_group_size}, OpenCL {g.opencl_version}")
        print(f"     peak FP32 {_fmt(figs['gpu_peak_fp32_gflops'])} GFLOP/s"
              + (f", FP16 {_fmt(figs['gpu_peak_fp16_gflops'])} GFLOP/s" if figs["gpu_peak_fp16_gflops"] else ""))
    if hw.memory:
        print(f"\nMemory: {hw.memory.type}, {hw.memory.peak_bandwidth_gbps:g} GB/s peak")
    print("\nDerived:")
    if figs["cpu_peak_gflops"] is not None:
        print(f"  CPU peak FP32: {_fmt(figs['cpu_peak_gflops'])} GFLOP/s (all clusters)")
    for key, label in (("cpu_bytes_per_flop", "CPU balance"), ("gpu_bytes_per_flop", "GPU balance")):
        if key in figs:
            print(f"  {label}: {figs[key]:.4f} bytes/FLOP (DRAM bandwidth / peak)")
    if hw.kind == "host":
        figures = measured_or_assumed(hw)
        core, cluster = hw.cluster().core, hw.cluster()
        values = {"fma_per_cycle": f"{core.fma_per_cycle:g} vector FMA/cycle at {core.vector_bits} bit",
                  "fma_latency_cycles": f"{core.fma_latency_cycles} cycles FMA latency",
                  "clock_ghz": f"{cluster.clock_ghz:g} GHz",
                  "memory.peak_bandwidth_gbps": f"{hw.memory.peak_bandwidth_gbps:g} GB/s DRAM",
                  "shared_cache_read_gbps": (f"{hw.shared_cache_read_gbps:g} GB/s L3 read per core"
                                             if hw.shared_cache_read_gbps else "L3 read per core"),
                  "l3_overflow_read_speedup": f"{hw.l3_overflow_read_speedup or 1:g}x past-L3 read, all CPUs"}
        print("\nHost figures:")
        for field, how in figures.items():
            print(f"  {values[field]:<36} {how}")
        print(f"  ({hw.notes})")
    if hw.uncertain:
        print(f"\nUncertain values (check on a device): {len(hw.uncertain)}")
        for line in wrap_values(hw.uncertain):
            print(line)
    return 0


def wrap_values(values, width: int = 100, indent: str = "  ") -> list[str]:
    """Comma-separated values in lines of at most `width` columns (a longer value gets a line of
    its own); a value is never split."""
    lines, line = [], ""
    for i, value in enumerate(values):
        item = value + ("," if i < len(values) - 1 else "")
        if line and len(indent) + len(line) + 1 + len(item) > width:
            lines.append(indent + line)
            line = item
        else:
            line = f"{line} {item}" if line else item
    if line:
        lines.append(indent + line)
    return lines


def cmd_hw_validate(args) -> int:
    from ..hardware.load import validate_file
    failures = 0
    for path in args.paths:
        try:
            hw = validate_file(path)
            print(f"OK    {path} ({hw.kind} {hw.name})")
        except XfcError as exc:
            failures += 1
            print(f"ERROR {exc}")
    return 2 if failures else 0


# ---------------------------------------------------------------------------------------------
# Parser.
# ---------------------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (exit 2): the command, what was wrong, the closest valid
    name for a mistyped choice (difflib), and where the usage is; never the usage block itself."""

    def _check_value(self, action, value):
        if action.choices is not None and value not in action.choices:
            choices = [str(c) for c in action.choices]
            close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise argparse.ArgumentError(action, f"invalid choice '{value}' (choose from {', '.join(choices)}){hint}")

    def error(self, message):
        self.exit(2, f"xfc: error: {self.prog}: {message} (see '{self.prog} --help')\n")

    def parse_known_args(self, args=None, namespace=None):
        # The innermost subcommand parses first and names itself, so arguments it does not know are
        # reported against it ('xfc bench --help'), not against 'xfc'.
        namespace, extras = super().parse_known_args(args, namespace)
        if not hasattr(namespace, _COMMAND_PROG):
            setattr(namespace, _COMMAND_PROG, self.prog)
        return namespace, extras


_COMMAND_PROG = "_xfc_command_prog"   # the namespace attribute naming the subcommand that parsed


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="xfc", description="Bottom-up synthesis of fast tensor kernels for mobile SoCs "
                     "(XFC-style: register tiles first, then cache levels, then cores).")
    parser.add_argument("--version", action="version", version=f"xfc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    hw = sub.add_parser("hw", help="list, show, validate and probe hardware descriptions")
    hw_sub = hw.add_subparsers(dest="hw_command", metavar="SUBCOMMAND", parser_class=_Parser)
    p = hw_sub.add_parser("list", help="table of every shipped description with its peak figures")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_hw_list)
    p = hw_sub.add_parser("show", help="resolved description and derived figures")
    p.add_argument("name", metavar="NAME|PATH", help="e.g. snapdragon.yaml, snapdragon-865, cortex-a76, host, ./my.yaml")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--remeasure", action="store_true",
                   help="host only: run the FMA probe again (under a second) instead of using its cached result")
    p.set_defaults(func=cmd_hw_show)
    p = hw_sub.add_parser("validate", help="check files; prints OK or the error for each")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.set_defaults(func=cmd_hw_validate)
    from . import hwprobe  # xfc hw probe --device SERIAL
    hwprobe.register(hw_sub)
    hw.set_defaults(func=lambda a: (hw.print_help(), 2)[1])

    from . import bench, cluster, devices, fuzz, model, synth, tiledb
    synth.register(sub)
    bench.register(sub)
    tiledb.register(sub)   # the tile database (docs/tile-db.md)
    model.register(sub)
    fuzz.register(sub)
    devices.register(sub)
    cluster.register(sub)   # Ray nodes for tiledb build --executor ray
    return parser


class Interrupted(KeyboardInterrupt):
    """Raised in the main thread by SIGINT or SIGTERM, so `finally` blocks and context managers
    clean up (staging directories, temporary files, child process groups) on the way out."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _InterruptsRaise:
    """SIGINT and SIGTERM raise Interrupted once; a repeated signal during the clean-up is
    ignored so the clean-up can finish. Signals a parent set to be ignored stay ignored."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self):
        self._old, self._fired = {}, False
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in self.SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                self._old[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, frame):
        if not self._fired:
            self._fired = True
            raise Interrupted(signum)

    def __exit__(self, *exc):
        for signum, handler in self._old.items():
            signal.signal(signum, handler)


def main(argv=None) -> int:
    with _InterruptsRaise():
        try:
            return _main(argv)
        except KeyboardInterrupt as exc:   # also while parsing arguments or importing
            signum = getattr(exc, "signum", signal.SIGINT)
            print(f"xfc: {'terminated' if signum == signal.SIGTERM else 'interrupted'}", file=sys.stderr)
            return 128 + signum


@functools.lru_cache(maxsize=1)
def _parser() -> argparse.ArgumentParser:
    """The parser, built once per process (parsing leaves it unchanged): a program or test that calls
    main() many times in one process does not rebuild every subcommand's parser each time."""
    return build_parser()


def _main(argv=None) -> int:
    parser = _parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        prog = getattr(args, _COMMAND_PROG, parser.prog)
        parser.exit(2, f"xfc: error: {prog}: unrecognized arguments: {' '.join(extras)} (see '{prog} --help')\n")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        # the on/off switches, read strictly at start: a typo is one line now, not an error inside a
        # compile worker after synthesis (XFC_PCH) or only under --hw host (XFC_HOST_PROBE)
        for name in ("XFC_PCH", "XFC_HOST_PROBE"):
            settings.switch(settings.environment(), name)
        return int(args.func(args) or 0)
    except XfcError as exc:
        print(f"xfc: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug in xfc: still one line unless asked for the traceback
        if settings.debug():
            raise
        print(f"xfc: internal error: {type(exc).__name__}: {exc} (set XFC_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
