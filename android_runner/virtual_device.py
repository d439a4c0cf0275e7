"""A virtual Android device that speaks the device side of the ADB wire protocol over TCP.

The real adb server can `adb connect 127.0.0.1:PORT` to it, after which `adb shell`, `adb push`,
`adb pull` and adbutils work against it. It is a test double for xfc's AdbRunner, never a phone:
its model string says "xfc virtual device (<soc>)" and every measurement taken on it is labelled
as emulated. Aarch64 ELF files pushed to it run on the host under `qemu-aarch64`.

What it implements
  * transport: CNXN (banner with shell_v2,cmd,stat_v2,ls_v2,fixed_push_mkdir), OPEN, OKAY, WRTE,
    CLSE; no AUTH unless --unauthorized (then it only ever answers AUTH with a new token).
  * services: `shell:CMD`, `shell,v2,...:CMD` (stdout/stderr/exit packets), `sync:`
    (STAT, STA2, LST2, LIST, LIS2, SEND, RECV, QUIT).
  * a tiny shell: `;`, `&&`, `||`, quoting as produced by shlex.quote, `$?`; commands getprop,
    echo, true, false, mkdir, rm, chmod, cat, ls, df, stat-less `test -e/-f/-d`, sleep, env,
    taskset MASK (accepted and recorded), timeout, ps, kill, sh -c, uname, id, whoami, and
    running pushed aarch64 ELF files.
  * the identity of the SoC it plays, from hardware_descriptions/soc/<soc>.yaml: getprop
    ro.soc.model / ro.board.platform, /proc/cpuinfo CPU parts and Features per cluster, and the
    qemu -cpu model of the cores a run may use (so an armv9 kernel dies of SIGILL on an A77).
  * a sandbox: device paths under /data/local/tmp map to a host directory that the device
    created and marked (it never writes into or deletes one it did not create); arguments of an
    executed ELF that start with /data/local/tmp are rewritten to the host path (a binary run
    under qemu-user sees the host file system). Everything else is read-only fake state:
    /sys cpufreq (related_cpus, max/min clocks), cacheinfo (cache/index*: L1d, L1i, the
    cluster's L2, the DSU L3) and thermal files, /proc/cpuinfo, /proc/meminfo, the GPU driver's
    model file (kgsl gpu_model/max_gpuclk or Mali gpuinfo), ro.hardware.egl, and optionally
    /vendor/lib64/libOpenCL.so (what `xfc hw probe` reads).

Fault injection (for tests): --drop-after-bytes N, --drop-on-run, --hang, --abi, --storage-full,
--unauthorized, --offline (never completes the handshake), --throttle (clock drops and zones
heat up after each run), --drop-cache-levels 1,2,3 (no cacheinfo of those levels),
--cpuinfo-format older-kernel (the 3.10-era /proc/cpuinfo: one CPU part for all CPUs).

Where it lives: adb_wire (header, command ids, packet constants) · device_system (Faults,
FakeSystem: properties, /sys and /proc files, processes; the /data/local/tmp sandbox and its
paths) · device_shell (tokenizer, ShellSession, running ELFs under qemu) · adb_services (streams,
the transport loop, shell and sync services) · this module (the TCP server and the CLI).

Run:  python -m android_runner.virtual_device --port 5599 --soc snapdragon-865
"""
from __future__ import annotations

import argparse
import os
import posixpath
import shutil
import signal
import socket
import sys
import threading

from android_runner.adb_services import Connection
from android_runner.device_system import SANDBOX_ROOT, Faults, FakeSystem, claim_home, soc_names
from xfc.hardware.identity import shipped_socs

# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


class VirtualDevice:
    """A TCP server speaking the device side of ADB. Use start()/stop() or a `with` block."""

    def __init__(self, port: int = 0, soc: str = "snapdragon-865", faults: Faults | None = None,
                 sandbox: str | os.PathLike | None = None, with_opencl: bool = False,
                 qemu: str = "qemu-aarch64", verbose: bool = False):
        socs = {hw.name: hw for hw in shipped_socs() if hw.android is not None}
        if soc not in socs:
            raise ValueError(f"unknown SoC '{soc}'; known: {', '.join(sorted(socs))}")
        self.requested_port = port
        self.faults = faults or Faults()
        # home: a directory this device created (marked); /data/local/tmp lives inside it.
        self.home, self._created_home = claim_home(sandbox)
        self.sandbox = self.home / "data-local-tmp"
        self.sandbox.mkdir(exist_ok=True)
        self.system = FakeSystem(socs[soc], self.sandbox, self.faults, f"xfc-virtual-{soc}",
                                 with_opencl=with_opencl, qemu=qemu)
        self.verbose = verbose
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[Connection] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.port = 0

    @property
    def serial(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self, msg: str) -> None:
        if self.verbose:
            print(f"[xfc-virtual-device] {msg}", file=sys.stderr, flush=True)

    def start(self) -> "VirtualDevice":
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind(("127.0.0.1", self.requested_port))
        lsock.listen(8)
        lsock.settimeout(0.2)
        self._listener = lsock
        self.port = lsock.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, daemon=True,
                                        name="vdev-accept")
        self._thread.start()
        return self

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                sock, addr = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Connection(self.system, sock, self.log, self._connection_ended)
            with self._lock:
                self._connections.add(conn)
            self.log(f"connection from {addr[0]}:{addr[1]}")
            threading.Thread(target=conn.serve, daemon=True, name="vdev-conn").start()

    def _connection_ended(self, conn: Connection) -> None:
        with self._lock:
            self._connections.discard(conn)
        self.log("connection closed")

    def drop_connections(self) -> None:
        with self._lock:
            conns = list(self._connections)
        for c in conns:
            c.drop()

    def stop(self) -> None:
        self._stopping.set()
        self.system.kill_all()
        if self._listener is not None:
            try:
                self._listener.close()
            except OSError:
                pass
        self.drop_connections()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._created_home:   # only what it created; a reused (marked) home keeps its files
            shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> "VirtualDevice":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # helpers for tests
    def sandbox_files(self) -> list[str]:
        """Device paths of every file and directory under /data/local/tmp."""
        out = []
        for root, dirs, files in os.walk(self.sandbox):
            for name in dirs + files:
                rel = os.path.relpath(os.path.join(root, name), self.sandbox)
                out.append(posixpath.join(SANDBOX_ROOT, rel.replace(os.sep, "/")))
        return sorted(out)


def _levels(text: str) -> tuple[int, ...]:
    """'2,3' -> (2, 3); argparse turns the ValueError into a one-line usage error."""
    levels = tuple(int(x) for x in text.split(",") if x.strip())
    if any(not 1 <= level <= 4 for level in levels):
        raise ValueError(text)
    return levels


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m android_runner.virtual_device",
        description="A virtual ADB device (emulated with qemu-aarch64; not a phone).")
    ap.add_argument("--port", type=int, default=5599, help="TCP port on 127.0.0.1 (0 = any)")
    ap.add_argument("--soc", default="snapdragon-865", choices=soc_names())
    ap.add_argument("--sandbox", help="a new host directory for the device's files (it is created, "
                                      "marked, and /data/local/tmp is its data-local-tmp/; an "
                                      "existing one must carry the marker); default: a temporary "
                                      "directory removed on exit")
    ap.add_argument("--with-opencl", action="store_true",
                    help="pretend /vendor/lib64/libOpenCL.so exists")
    ap.add_argument("--qemu", default="qemu-aarch64", help="the qemu-user binary to run ELFs")
    ap.add_argument("--drop-after-bytes", type=int, metavar="N",
                    help="fault: cut the link once N bytes came in (once)")
    ap.add_argument("--drop-on-run", action="store_true",
                    help="fault: cut the link when a binary starts (once)")
    ap.add_argument("--hang", action="store_true", help="fault: binaries never finish")
    ap.add_argument("--abi", default="arm64-v8a", help="fault: report another ABI")
    ap.add_argument("--storage-full", action="store_true", help="fault: pushes fail (ENOSPC)")
    ap.add_argument("--unauthorized", action="store_true",
                    help="fault: never accept the host's key (state 'unauthorized')")
    ap.add_argument("--offline", action="store_true", help="fault: never finish the handshake")
    ap.add_argument("--throttle", action="store_true",
                    help="fault: clocks drop 30%% and zones heat 15 C after each run")
    ap.add_argument("--drop-cache-levels", default=(), type=_levels, metavar="LEVELS",
                    help="fault: no sysfs cache entries of these levels, e.g. 2,3 or 1,2,3")
    ap.add_argument("--cpuinfo-format", choices=("per-cpu", "older-kernel"), default="per-cpu",
                    help="fault: serve the 3.10-era /proc/cpuinfo (one CPU part for all CPUs)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if shutil.which(args.qemu) is None:
        print(f"warning: '{args.qemu}' not found: pushed binaries cannot run", file=sys.stderr)
    faults = Faults(drop_after_bytes=args.drop_after_bytes, drop_on_run=args.drop_on_run,
                    hang=args.hang, abi=args.abi, storage_full=args.storage_full,
                    unauthorized=args.unauthorized, offline=args.offline,
                    throttle=args.throttle,
                    drop_cache_levels=args.drop_cache_levels,
                    cpuinfo_format=args.cpuinfo_format)
    try:
        dev = VirtualDevice(args.port, args.soc, faults, sandbox=args.sandbox,
                            with_opencl=args.with_opencl, qemu=args.qemu, verbose=args.verbose)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    dev.start()
    print(f"xfc virtual device ({args.soc}; emulated by qemu-aarch64, not a phone) "
          f"listening on 127.0.0.1:{dev.port}", flush=True)
    print(f"sandbox for /data/local/tmp: {dev.sandbox}", flush=True)
    print(f"connect with:  adb connect 127.0.0.1:{dev.port}   "
          f"(then: adb -s 127.0.0.1:{dev.port} shell getprop ro.product.model)", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        dev.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
