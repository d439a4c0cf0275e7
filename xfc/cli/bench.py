"""`xfc bench`: find the device and its description, run the library pipeline (xfc.pipeline.run_bench:
synthesize, cross-build, run on an Android device (ADB) or under QEMU, verify, time), print a table.

The measurement always says where it was taken: a phone over ADB, the virtual ADB device
(emulated), or local qemu-aarch64 (emulated). Emulated timings say nothing about phone speed.

With a device, its identity (SoC properties, /proc/cpuinfo CPU parts and Features, ABI) is read
before anything is built: without --hw the matching shipped description is used; a --hw whose
ISA features the device lacks is refused (exit 2) instead of dying of SIGILL on the phone.
Ctrl-C or SIGTERM during a run kills the harness on the device and removes its files there.
"""
from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading

from ..errors import OperatorError, VerificationError
from .adb_options import add_adb_server_options
from .arg_types import non_negative_int, positive_float

EXIT_TERMINATED = 128 + signal.SIGTERM


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so that every `finally` (device cleanup) runs."""


@contextlib.contextmanager
def _sigterm_raises():
    """Map SIGTERM to _Terminated while benchmarking, unless the CLI already handles SIGTERM."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def handler(signum, frame):
        raise _Terminated()

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def cmd_bench(args) -> int:
    try:
        with _sigterm_raises():
            return _bench(args)
    except _Terminated:
        print("xfc: terminated", file=sys.stderr)
        return EXIT_TERMINATED


def _device_and_description(args, say):
    """(hardware description, runner or None, identity or None, match or None), before building."""
    from .hardware import load_for_command_line as load
    from ..runners import get_runner
    from ..hardware.identity import match_identity, pick_description

    if args.device == "qemu":
        if not args.hw:
            raise OperatorError("--hw is required with --device qemu (there is no device to identify)")
        return load(args.hw), None, None, None
    runner = get_runner(args.device, adb_host=args.adb_host, adb_port=args.adb_port,
                        start_server=not args.no_start_server)
    identity = runner.read_identity()
    match = match_identity(identity)
    if args.hw:
        return load(args.hw), runner, identity, match
    hw, match = pick_description(identity, match)
    say(f"device {identity.serial} is a {hw.marketing_name} (matched by {match.how} '{match.value}'): "
        f"using hardware description {hw.name}")
    return hw, runner, identity, match


def _bench(args) -> int:
    from .synth import spec_from_args
    from ..hardware.identity import check_description
    from ..pipeline import run_bench

    if args.repeat < 1:
        raise OperatorError(f"--repeat must be >= 1, got {args.repeat}")
    spec = spec_from_args(args)
    say = (lambda msg: None) if args.json else (lambda msg: print(f"[xfc] {msg}", file=sys.stderr, flush=True))
    hw, runner, identity, match = _device_and_description(args, say)
    if hw.target_arch != "aarch64":
        raise OperatorError(f"xfc bench runs ARM kernels on a device or QEMU; {hw.name} is {hw.target_arch} "
                            f"(use 'xfc synth ... --hw host --bench' to time host kernels)")
    if identity is not None:
        target = hw.cluster(args.cluster)
        if args.skip_device_check:
            say(f"--skip-device-check: not checking that {identity.serial} can run {hw.name} kernels")
        else:
            for note in check_description(identity, hw, target, match):
                say(f"note: {note}")
    device_identity = None if identity is None else {
        "serial": identity.serial, "soc_model": identity.soc_model,
        "board_platform": identity.board_platform, "abi": identity.abi,
        "cpus": identity.cpu_summary(), "matches": match.name if match else None,
        "matched_by": match.how if match else None, "hw_given": bool(args.hw)}
    result = run_bench(spec, hw, runner, cluster=args.cluster, threads=args.threads,
                       repeat=args.repeat, warmup=args.warmup, timeout_s=args.timeout, seed=args.seed,
                       progress=say, device=args.device, device_identity=device_identity)
    report, run, ok = result.to_dict(), result.measurement, result.verified
    max_err = report["max_abs_error"]
    cluster_role, cpu_ids, synth_s, build_s = report["cluster"], report["cpu_ids"], report["synthesis_seconds"], \
        report["build_seconds"]
    gflops, predicted_gflops = report["gflops"], report["predicted_gflops"]
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        rows = [["operator", spec.describe()], ["hardware", f"{hw.name}, {cluster_role} cluster, CPUs {cpu_ids}"],
                ["measured on", run.where], ["verified", f"{'yes' if ok else 'NO'} (max abs error {max_err:.3g})"],
                ["median", f"{run.median_s * 1e3:.4f} ms ({run.repeats} runs; min {run.min_s * 1e3:.4f}, max {run.max_s * 1e3:.4f})"],
                ["GFLOP/s", f"{gflops:.3f}" + ("  (emulated: not phone speed)" if run.emulated else "")],
                ["predicted", f"{predicted_gflops:.1f} GFLOP/s on the device (static cost model)"],
                ["throttling", {True: "YES: frequency dropped or temperature rose; rerun after cooling",
                                False: "none seen", None: "unknown"}[run.throttled]],
                ["synthesis", f"{synth_s * 1e3:.1f} ms (build {build_s:.2f} s)"]]
        width = max(len(r[0]) for r in rows)
        for key, value in rows:
            print(f"{key.ljust(width)}  {value}")
        for note in run.notes:
            print(f"note: {note}")
    if not ok:
        raise VerificationError(f"{spec.name} kernel output from {run.where} differs from the numpy reference "
                                f"({result.failure})")
    return 0


def register(sub) -> None:
    from .synth import add_operator_arguments
    p = sub.add_parser("bench", help="build, run, verify and time a kernel on an Android device (ADB) or QEMU",
                       description="Synthesize a CPU kernel, cross-compile a static aarch64 harness, run it pinned "
                       "to the chosen cluster on a device over ADB (or under qemu-aarch64), verify against numpy, "
                       "and print a timing table. QEMU and the virtual device give emulated timings only.")
    add_operator_arguments(p)
    hw = p._option_string_actions["--hw"]   # bench only: a device can name its own description
    hw.required = False
    hw.help += "; with a device, default: the shipped description that matches it"
    p.add_argument("--device", required=True, metavar="SERIAL|qemu",
                   help="an adb serial (see 'xfc devices'), 'adb' for the only device, or 'qemu'")
    p.add_argument("--skip-device-check", action="store_true",
                   help="run even if the device lacks CPU features the --hw description needs "
                   "(the kernel then dies of SIGILL: 'illegal instruction ...')")
    p.add_argument("--repeat", type=int, default=10, help="timed runs after warm-up (median reported)")
    p.add_argument("--warmup", type=non_negative_int, default=2, help="untimed warm-up runs (default 2)")
    p.add_argument("--timeout", type=positive_float, default=300.0,
                   help="seconds before a run is considered hung (default 300)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of the random inputs (default 0)")
    add_adb_server_options(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_bench)
