"""Run a harness on an Android phone (or the virtual device) through the adb server.

Everything goes through adbutils: shell commands as argument lists (adbutils quotes each
element with shlex.quote, so serials, paths and arguments never reach the device shell
unquoted), files through the sync protocol. A run lives in /data/local/tmp/xfc/<run-id>/ and
is removed afterwards whenever the device is still reachable.
"""
from __future__ import annotations

import logging
import shutil
import socket
import struct
import subprocess
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from xfc import settings
from xfc.errors import DeviceError
from xfc.runners.base import (WHERE_VIRTUAL, HarnessRunner, RunContext, harness_args, hexmask,
                              load_output, parse_report, report_from_times, where_adb)
from xfc.hardware.identity import DeviceIdentity, cpu_features_text, identity_from, match_identity, parse_getprop
from xfc.runners.sigill import illegal_instruction_message, is_illegal_instruction

log = logging.getLogger(__name__)

REMOTE_ROOT = "/data/local/tmp/xfc"
REQUIRED_ABI = "arm64-v8a"
VENDOR_LIB_DIRS = ("/vendor/lib64", "/system/vendor/lib64")
SYNC_CHUNK = 64 * 1024
CONNECT_HINT = ("plug in a phone with USB debugging enabled, or start the virtual device: "
                "python -m android_runner.virtual_device --port 5599 and then "
                "adb connect 127.0.0.1:5599")


def _adbutils():
    try:
        import adbutils
    except ImportError:  # pragma: no cover - adbutils is a dependency
        raise DeviceError("the Python package 'adbutils' is not installed "
                          "(pip install adbutils)") from None
    return adbutils


def default_port() -> int:
    """ANDROID_ADB_SERVER_PORT, else 5037 (xfc.settings)."""
    return settings.adb_server()[1]


def default_host() -> str:
    """ANDROID_ADB_SERVER_HOST, else 127.0.0.1 (xfc.settings)."""
    return settings.adb_server()[0]


def adb_binary() -> str | None:
    """The adb executable used to start a server: $XFC_ADB, adbutils' bundled one, or PATH."""
    env = settings.adb_binary()
    if env:
        return env
    try:
        from adbutils._utils import adb_path
        path = adb_path()
        if path and Path(path).exists():
            return path
    except Exception:  # noqa: BLE001 - any failure means: not bundled
        pass
    return shutil.which("adb")


def server_reachable(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def ensure_server(host: str, port: int, start: bool = True) -> None:
    """Make sure an adb server listens on host:port; start one locally if allowed."""
    if server_reachable(host, port):
        return
    local = host in ("127.0.0.1", "localhost", "::1")
    if not start or not local:
        raise DeviceError(f"no adb server reachable at {host}:{port}"
                          + ("" if local else " (only a local server can be started)")
                          + f"; start one with: adb -P {port} start-server")
    adb = adb_binary()
    if adb is None:
        raise DeviceError(f"no adb server at {host}:{port} and no adb binary to start one "
                          "(install the 'adb' package or adbutils)")
    try:
        proc = subprocess.run([adb, "-P", str(port), "start-server"], capture_output=True,
                              text=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DeviceError(f"no adb server at {host}:{port} and starting one with {adb} "
                          f"failed: {exc}") from None
    for _ in range(50):
        if server_reachable(host, port):
            return
        time.sleep(0.1)
    detail = (proc.stderr or proc.stdout).strip().splitlines()
    raise DeviceError(f"no adb server at {host}:{port} and starting one failed"
                      + (f": {detail[-1]}" if detail else ""))


def make_client(host: str | None = None, port: int | None = None, start_server: bool = True):
    host = host or default_host()
    port = int(port or default_port())
    ensure_server(host, port, start=start_server)
    return _adbutils().AdbClient(host=host, port=port, socket_timeout=30)


def list_states(client) -> list[tuple[str, str]]:
    """(serial, state) for every device the server knows, including offline/unauthorized."""
    try:
        return [(info.serial, info.state) for info in client.list()]
    except Exception as exc:  # noqa: BLE001 - adbutils raises several types
        raise DeviceError(f"cannot list devices from the adb server at "
                          f"{client.host}:{client.port}: {exc}") from None


def _state_problem(serial: str, state: str) -> str:
    if state == "unauthorized":
        return (f"device {serial} is unauthorized: unlock it and accept the 'Allow USB "
                "debugging' prompt (or revoke USB debugging authorizations and reconnect)")
    if state == "offline":
        return (f"device {serial} is offline: reconnect the cable or run "
                f"'adb -s {serial} reconnect'")
    if "permission" in state:
        return f"device {serial}: {state} (check the udev rules for the phone's USB ID)"
    return f"device {serial} is in state '{state}', not 'device'"


def select_serial(client, serial: str | None) -> str:
    """The serial to use, or a one-line DeviceError saying why there is none."""
    states = list_states(client)
    where = f"adb server {client.host}:{client.port}"
    if serial:
        for s, st in states:
            if s == serial:
                if st != "device":
                    raise DeviceError(_state_problem(s, st))
                return s
        known = ", ".join(f"{s} ({st})" for s, st in states) or "none"
        raise DeviceError(f"device '{serial}' not found on the {where} (connected: {known}); "
                          f"for a network or virtual device run: adb connect {serial}"
                          if ":" in serial else
                          f"device '{serial}' not found on the {where} (connected: {known})")
    ready = [s for s, st in states if st == "device"]
    if len(ready) == 1:
        return ready[0]
    if len(ready) > 1:
        raise DeviceError(f"several devices are connected ({', '.join(ready)}): "
                          "choose one with --device SERIAL")
    if states:
        s, st = states[0]
        raise DeviceError(_state_problem(s, st))
    raise DeviceError(f"no Android device found by the {where}: {CONNECT_HINT}")


def _sync_message(c, head: bytes) -> str:
    """The text after a sync-protocol FAIL header (8 bytes: id + little-endian length)."""
    n = struct.unpack("<I", head[4:8])[0]
    return c.read_exact(n).decode("utf-8", "replace") if n else ""


def _sync_quit(c) -> None:
    """End a sync session politely; the device may already have closed it."""
    try:
        c.conn.sendall(b"QUIT" + bytes(4))
    except OSError:
        pass


class AdbRunner(HarnessRunner):
    """Runs harnesses on one adb device, pinned to the caller's CPU ids."""

    def __init__(self, serial: str | None = None, adb_host: str | None = None,
                 adb_port: int | None = None, cpu_ids: Sequence[int] | None = None,
                 vendor_libs: bool = False, start_server: bool = True,
                 freq_drop_limit: float = 0.10, temp_rise_limit_c: float = 10.0,
                 temp_limit_c: float = 85.0, cleanup_wait_s: float = 5.0,
                 io_timeout_s: float = 30.0, check_abi: bool = True):
        self.requested_serial = serial
        self.adb_host = adb_host or default_host()
        self.adb_port = int(adb_port or default_port())
        self.cpu_ids = tuple(cpu_ids) if cpu_ids else None
        self.vendor_libs = vendor_libs
        self.start_server = start_server
        self.freq_drop_limit = freq_drop_limit
        self.temp_rise_limit_c = temp_rise_limit_c
        self.temp_limit_c = temp_limit_c
        self.cleanup_wait_s = cleanup_wait_s
        self.io_timeout_s = io_timeout_s
        self.check_abi = check_abi
        self._client = None
        self._device = None
        self.serial: str | None = None
        self.props: dict[str, str] = {}
        self.identity: DeviceIdentity | None = None
        self._zones: list[str] | None = None
        self._zone_types: dict[str, str] = {}

    # -- connection -----------------------------------------------------------------------------
    def connect(self) -> "AdbRunner":
        if self._device is not None:
            return self
        self._client = make_client(self.adb_host, self.adb_port, self.start_server)
        self.serial = select_serial(self._client, self.requested_serial)
        self._device = self._client.device(serial=self.serial)
        res = self._shell(["getprop"], what="read the device properties")
        self.props = parse_getprop(res.stdout)
        if self.check_abi:
            abi = self.props.get("ro.product.cpu.abi", "")
            if abi != REQUIRED_ABI:
                raise DeviceError(f"device {self.serial} reports ABI '{abi or 'unknown'}'; "
                                  f"xfc harnesses need {REQUIRED_ABI} (a 64-bit ARM phone)")
        return self

    def read_identity(self) -> DeviceIdentity:
        """Properties and /proc/cpuinfo of the device (connecting first); cached."""
        self.connect()
        if self.identity is None:
            res = self._shell(["cat", "/proc/cpuinfo"], what="read /proc/cpuinfo", check=False)
            text = res.stdout if res.returncode == 0 else ""
            self.identity = identity_from(self.serial or "", self.props, text)
        return self.identity

    @property
    def virtual(self) -> bool:
        return self.props.get("ro.xfc.virtual_device") == "1"

    @property
    def emulated(self) -> bool:  # type: ignore[override]
        return self.virtual

    @property
    def where(self) -> str:  # type: ignore[override]
        if self.virtual:
            return WHERE_VIRTUAL
        return where_adb(self.serial or "?", self.props.get("ro.product.model", "unknown model"))

    def describe(self) -> dict:
        p = self.props
        info = {
            "runner": "adb", "serial": self.serial, "model": p.get("ro.product.model", ""),
            "manufacturer": p.get("ro.product.manufacturer", ""),
            "abi": p.get("ro.product.cpu.abi", ""),
            "board_platform": p.get("ro.board.platform", ""),
            "soc_model": p.get("ro.soc.model", ""),
            "sdk": p.get("ro.build.version.sdk", ""),
            "fingerprint": p.get("ro.build.fingerprint", ""),
            "hardware": match_identity(ident).name if (ident := self._identity_for_error()) else None,
            "virtual": self.virtual,
            "cpu_ids": list(self.cpu_ids) if self.cpu_ids else None,
        }
        if self._zone_types:
            info["thermal_zone_types"] = dict(self._zone_types)
        return info

    def state(self) -> str | None:
        """The device's current state on the server, or None when it is gone."""
        if self._client is None:
            return None
        try:
            infos = self._client.list()
        except Exception:  # noqa: BLE001 - server gone counts as device gone
            return None
        for info in infos:
            if info.serial == self.serial:
                return info.state
        return None

    # -- low-level helpers ----------------------------------------------------------------------
    def _shell(self, argv: Sequence[str], what: str, timeout: float | None = None,
               check: bool = True):
        """Run argv on the device (shell_v2; adbutils quotes every element)."""
        adbutils = _adbutils()
        args = [str(a) for a in argv]
        try:
            res = self._device.shell2(args, timeout=timeout or self.io_timeout_s, v2=True,
                                      rstrip=False)
        except adbutils.AdbTimeout:
            raise _Timeout(what) from None
        except (adbutils.AdbError, OSError, EOFError) as exc:
            raise self._lost(what, exc) from None
        if check and res.returncode != 0:
            msg = (res.stderr.strip() or res.stdout.strip()).splitlines()
            raise DeviceError(f"could not {what} on {self.serial} (exit {res.returncode})"
                              + (f": {msg[-1][:300]}" if msg else ""))
        return res

    def _lost(self, what: str, exc: BaseException) -> DeviceError:
        st = self.state()
        now = "gone" if st is None else f"now '{st}'"
        return DeviceError(f"lost the connection to device {self.serial} while trying to {what} "
                           f"(device {now}; {type(exc).__name__}: {str(exc)[:120] or 'closed'}); "
                           "check the cable or network link")

    def _sync(self):
        c = self._device.open_transport(timeout=self.io_timeout_s)
        c.send_command("sync:")
        c.check_okay()
        return c

    def push_file(self, local: Path, remote: str, mode: int = 0o644) -> None:
        adbutils = _adbutils()
        what = f"push {local.name} to {remote}"
        try:
            c = self._sync()
        except (adbutils.AdbError, OSError, EOFError) as exc:
            raise self._lost(what, exc) from None
        try:
            spec = f"{remote},{0o100000 | mode}".encode()
            send_error = None
            try:
                c.conn.sendall(b"SEND" + struct.pack("<I", len(spec)) + spec)
                with open(local, "rb") as f:
                    while chunk := f.read(SYNC_CHUNK):
                        c.conn.sendall(b"DATA" + struct.pack("<I", len(chunk)) + chunk)
                c.conn.sendall(b"DONE" + struct.pack("<I", int(time.time())))
            except OSError as exc:        # the device may have failed early and closed
                send_error = exc
            try:
                status = c.read_exact(8)
            except (adbutils.AdbError, OSError, EOFError) as exc:
                raise self._lost(what, send_error or exc) from None
            if status[:4] == b"FAIL":
                msg = _sync_message(c, status) or "unknown error"
                if "space" in msg.lower() or "ENOSPC" in msg:
                    raise DeviceError(f"device {self.serial} storage is full: could not {what} "
                                      f"({msg}); free space in /data/local/tmp")
                raise DeviceError(f"could not {what} on {self.serial}: {msg}")
            if status[:4] != b"OKAY":
                raise DeviceError(f"could not {what} on {self.serial}: unexpected sync reply "
                                  f"{status[:4]!r}")
            _sync_quit(c)
        finally:
            c.close()

    def pull_bytes(self, remote: str) -> bytes:
        adbutils = _adbutils()
        what = f"pull {remote}"
        try:
            c = self._sync()
            try:
                raw = remote.encode()
                c.conn.sendall(b"RECV" + struct.pack("<I", len(raw)) + raw)
                parts = []
                while True:
                    head = c.read_exact(8)
                    ident, n = head[:4], struct.unpack("<I", head[4:])[0]
                    if ident == b"DATA":
                        parts.append(c.read_exact(n))
                    elif ident == b"DONE":
                        break
                    elif ident == b"FAIL":
                        raise DeviceError(f"could not {what} from {self.serial}: {_sync_message(c, head) or '?'}")
                    else:
                        raise DeviceError(f"could not {what} from {self.serial}: unexpected "
                                          f"sync reply {ident!r}")
                _sync_quit(c)
                return b"".join(parts)
            finally:
                c.close()
        except adbutils.AdbTimeout:
            raise DeviceError(f"timed out trying to {what} from {self.serial}") from None
        except (adbutils.AdbError, OSError, EOFError) as exc:
            raise self._lost(what, exc) from None

    def read_ints(self, paths: Sequence[str]) -> dict[str, int]:
        """Integer contents of small files (sysfs), skipping unreadable ones."""
        if not paths:
            return {}
        res = self._shell(["cat", *paths], what="read sysfs", check=False)
        lines = [ln.strip() for ln in res.stdout.splitlines()]
        if len(lines) == len(paths) and res.returncode == 0:
            out = {}
            for p, ln in zip(paths, lines):
                try:
                    out[p] = int(ln)
                except ValueError:
                    pass
            return out
        out = {}   # some file failed: read them one at a time
        for p in paths:
            r = self._shell(["cat", p], what="read sysfs", check=False)
            try:
                out[p] = int(r.stdout.strip().splitlines()[0])
            except (ValueError, IndexError):
                pass
        return out

    def read_texts(self, paths: Sequence[str], max_command_chars: int = 3000) -> dict[str, str]:
        """Contents of small one-line files (sysfs), skipping unreadable ones. Batched into `cat`
        commands short enough for old adbd's 4 KiB service limit; a batch whose line count does
        not match (a missing file) is read again one file at a time."""
        out: dict[str, str] = {}
        batch: list[str] = []

        def flush() -> None:
            if not batch:
                return
            res = self._shell(["cat", *batch], what="read sysfs", check=False)
            lines = res.stdout.splitlines()
            if res.returncode == 0 and len(lines) == len(batch):
                out.update(zip(batch, lines))
            else:
                for p in batch:
                    r = self._shell(["cat", p], what="read sysfs", check=False)
                    if r.returncode == 0:
                        out[p] = r.stdout.rstrip("\n")
            batch.clear()

        for p in paths:
            if batch and sum(len(x) + 1 for x in batch) + len(p) > max_command_chars:
                flush()
            batch.append(p)
        flush()
        return out

    def read_text(self, path: str) -> str | None:
        """A whole (text) file such as /proc/cpuinfo, or None when it cannot be read."""
        res = self._shell(["cat", path], what=f"read {path}", check=False)
        return res.stdout if res.returncode == 0 else None

    def list_dirs(self, paths: Sequence[str]) -> dict[str, list[str]]:
        """Entries of each directory that exists (`ls` with several paths prints 'path:' headers)."""
        out: dict[str, list[str]] = {}
        for p in paths:
            res = self._shell(["ls", p], what=f"list {p}", check=False)
            if res.returncode == 0:
                out[p] = [n.strip() for n in res.stdout.split() if n.strip()]
        return out

    def thermal_zones(self) -> list[str]:
        if self._zones is None:
            res = self._shell(["ls", "/sys/class/thermal"], what="list thermal zones",
                              check=False)
            zones = [z.strip() for z in res.stdout.split() if z.strip().startswith("thermal_zone")]
            self._zones = sorted(zones, key=lambda z: int(z[12:]) if z[12:].isdigit() else 0)
            if self._zones:
                r = self._shell(["cat", *[f"/sys/class/thermal/{z}/type" for z in self._zones]],
                                what="read thermal zone types", check=False)
                types = r.stdout.splitlines()
                if len(types) == len(self._zones):
                    self._zone_types = {z: t.strip() for z, t in zip(self._zones, types)}
        return self._zones

    def telemetry(self, cpu_ids: Sequence[int] | None) -> tuple[dict, dict]:
        """({cpu: kHz}, {zone: degrees C}) right now."""
        freqs = {}
        if cpu_ids:
            paths = {f"/sys/devices/system/cpu/cpu{c}/cpufreq/scaling_cur_freq": c
                     for c in cpu_ids}
            for p, v in self.read_ints(list(paths)).items():
                freqs[paths[p]] = v
        temps = {}
        zones = self.thermal_zones()
        if zones:
            paths = {f"/sys/class/thermal/{z}/temp": z for z in zones}
            for p, v in self.read_ints(list(paths)).items():
                c = v / 1000.0 if abs(v) >= 1000 else float(v)
                if -40.0 <= c <= 150.0:
                    temps[paths[p]] = round(c, 2)
        return freqs, temps

    def judge_throttling(self, fb: dict, fa: dict, tb: dict, ta: dict) -> tuple[bool | None, list]:
        notes = []
        if not (fb and fa) and not (tb and ta):
            return None, ["no cpufreq or thermal readings: throttling unknown"]
        throttled = False
        for cpu in sorted(set(fb) & set(fa)):
            if fb[cpu] > 0 and fa[cpu] < fb[cpu] * (1.0 - self.freq_drop_limit):
                throttled = True
                notes.append(f"cpu{cpu} clock dropped {fb[cpu]} -> {fa[cpu]} kHz "
                             f"(> {self.freq_drop_limit:.0%})")
        common = set(tb) & set(ta)
        if common:
            zone, rise = max(((z, ta[z] - tb[z]) for z in common), key=lambda x: x[1])
            if rise > self.temp_rise_limit_c:
                throttled = True
                notes.append(f"{zone} rose {rise:.1f} C during the run "
                             f"(> {self.temp_rise_limit_c:g} C)")
            hottest = max(common, key=lambda z: ta[z])
            if ta[hottest] > self.temp_limit_c:
                throttled = True
                notes.append(f"{hottest} at {ta[hottest]:.1f} C after the run "
                             f"(> {self.temp_limit_c:g} C)")
        return throttled, notes

    # -- OpenCL -----------------------------------------------------------------------------------
    def vendor_opencl_path(self, required: bool = False) -> str | None:
        """Path of the vendor libOpenCL.so, or None (DeviceError when required)."""
        self.connect()
        for d in VENDOR_LIB_DIRS:
            p = f"{d}/libOpenCL.so"
            res = self._shell(["ls", p], what="look for libOpenCL.so", check=False)
            if res.returncode == 0 and p in res.stdout:
                return p
        if required:
            raise DeviceError(f"device {self.serial} has no libOpenCL.so in "
                              f"{' or '.join(VENDOR_LIB_DIRS)}: its GPU driver is not reachable "
                              "from shell programs, so OpenCL kernels cannot run there")
        return None

    # -- life cycle -----------------------------------------------------------------------------
    def prepare(self, spec):
        self.connect()
        ctx = super().prepare(spec)
        ctx.remote_dir = f"{REMOTE_ROOT}/{ctx.run_id}"
        return ctx

    def upload(self, ctx: RunContext) -> None:
        self._shell(["mkdir", "-p", REMOTE_ROOT], what=f"create {REMOTE_ROOT}")
        # The run directory must be new (plain mkdir): xfc never writes into, or removes, a
        # directory it did not create. Recorded before mkdir so an interrupted mkdir is cleaned
        # too; forgotten again when mkdir says it could not create it.
        ctx.uploaded.append(ctx.remote_dir)
        try:
            self._shell(["mkdir", ctx.remote_dir], what=f"create {ctx.remote_dir}")
        except DeviceError:
            ctx.uploaded.remove(ctx.remote_dir)
            raise
        self.push_file(Path(ctx.spec.harness), f"{ctx.remote_dir}/harness", 0o755)
        for p in ctx.input_files:
            self.push_file(p, f"{ctx.remote_dir}/{p.name}", 0o644)
        self._shell(["chmod", "755", f"{ctx.remote_dir}/harness"], what="chmod the harness")

    def run(self, ctx: RunContext) -> dict:
        spec = ctx.spec
        cpu_ids = spec.cpu_ids or self.cpu_ids
        d = ctx.remote_dir
        argv: list[str] = []
        env = list(spec.env)
        if self.vendor_libs:
            env.insert(0, ("LD_LIBRARY_PATH", "/vendor/lib64"))
        if env:
            argv += ["env", *[f"{k}={v}" for k, v in env]]
        notes = ctx.extra.setdefault("notes", [])
        if cpu_ids:
            argv += ["taskset", hexmask(cpu_ids)]
            notes.append(f"pinned with taskset {hexmask(cpu_ids)} (cpus {list(cpu_ids)})")
        else:
            notes.append("not pinned: no cpu ids given, the scheduler picked the cores")
        argv += [f"{d}/harness", *harness_args(spec, [f"{d}/{p.name}" for p in ctx.input_files],
                                               f"{d}/out.bin", f"{d}/times.txt")]
        fb, tb = self.telemetry(cpu_ids)
        try:
            res = self._shell(argv, what="run the harness", timeout=spec.timeout_s, check=False)
        except _Timeout:
            killed = self._kill_harness(d)
            raise DeviceError(f"harness on {self.serial} did not finish within "
                              f"{spec.timeout_s:g} s (hung?); "
                              + ("killed it on the device" if killed else
                                 "no process was left to kill")) from None
        except BaseException:
            # Ctrl-C, SIGTERM or a lost link: the harness may still run on the device. Kill it
            # there before cleanup removes its directory (best effort; the error still wins).
            try:
                self._kill_harness(d)
            except Exception:  # noqa: BLE001
                pass
            raise
        if res.returncode != 0 and is_illegal_instruction(res.returncode, res.stderr + res.stdout):
            raise DeviceError(f"harness failed on {self.where}: " + illegal_instruction_message(
                spec.march, cpu_features_text(self._identity_for_error(), cpu_ids)))
        if res.returncode != 0:
            msg = (res.stderr.strip() or res.stdout.strip()).splitlines()
            raise DeviceError(f"harness failed on {self.where} (exit {res.returncode})"
                              + (f": {msg[-1][:300]}" if msg else ""))
        fa, ta = self.telemetry(cpu_ids)
        if spec.protocol == "times-file":
            times = self.pull_bytes(f"{d}/times.txt").decode("ascii", "replace")
            ctx.report = report_from_times(times, self.where, spec.label or Path(spec.harness).name)
        else:
            ctx.report = parse_report(res.stdout, self.where)
        throttled, tnotes = self.judge_throttling(fb, fa, tb, ta)
        notes.extend(tnotes)
        ctx.extra["telemetry"] = {"throttled": throttled, "freq_before": fb, "freq_after": fa,
                                  "temps_before": tb, "temps_after": ta}
        return ctx.report

    def run_program(self, files: Sequence[Path], argv: Sequence[str], *, mkdirs: Sequence[str] = (),
                    pulls: Sequence[tuple[str, Path]] = (), cpu_ids: Sequence[int] | None = None,
                    timeout: float = 600.0, env: Sequence[tuple[str, str]] = ()) -> tuple[str, dict]:
        """Run a program of its own command line (the network's benchmark program): push `files`
        (the first is the program) into a new run directory, create `mkdirs` there, run argv[0] =
        the program's file name with argv[1:] (every '{dir}' replaced by the run directory), pinned to
        cpu_ids (with `env` set) with the governor, clocks and temperatures read before and after; pull `pulls`
        (run-directory-relative path -> local file); remove the run directory. Returns (stdout,
        telemetry)."""
        import uuid
        self.connect()
        remote = f"{REMOTE_ROOT}/net-{uuid.uuid4().hex[:12]}"
        self._shell(["mkdir", "-p", REMOTE_ROOT], what=f"create {REMOTE_ROOT}")
        self._shell(["mkdir", remote], what=f"create {remote}")
        try:
            program = Path(files[0])
            self.push_file(program, f"{remote}/{program.name}", 0o755)
            for f in files[1:]:
                self.push_file(Path(f), f"{remote}/{Path(f).name}", 0o644)
            self._shell(["chmod", "755", f"{remote}/{program.name}"], what="chmod the program")
            for d in mkdirs:
                self._shell(["mkdir", f"{remote}/{d}"], what=f"create {remote}/{d}")
            cmd = ["env", *[f"{k}={v}" for k, v in env]] if env else []
            cmd += ["taskset", hexmask(cpu_ids)] if cpu_ids else []
            cmd += [f"{remote}/{program.name}", *[a.replace("{dir}", remote) for a in argv]]
            fb, tb = self.telemetry(cpu_ids)
            try:
                res = self._shell(cmd, what=f"run {program.name}", timeout=timeout, check=False)
            except _Timeout:
                raise DeviceError(f"{program.name} on {self.serial} did not finish within {timeout:g} s") from None
            if res.returncode != 0 and is_illegal_instruction(res.returncode, res.stderr + res.stdout):
                raise DeviceError(f"{program.name} failed on {self.where}: illegal instruction (the build's -march "
                                  f"needs features this device lacks)")
            if res.returncode != 0:
                msg = (res.stderr.strip() or res.stdout.strip()).splitlines()
                raise DeviceError(f"{program.name} failed on {self.where} (exit {res.returncode})"
                                  + (f": {msg[-1][:300]}" if msg else ""))
            fa, ta = self.telemetry(cpu_ids)
            throttled, notes = self.judge_throttling(fb, fa, tb, ta)
            for rel, local in pulls:
                Path(local).write_bytes(self.pull_bytes(f"{remote}/{rel}"))
            pinned = f"pinned with taskset {hexmask(cpu_ids)} (cpus {list(cpu_ids)})" if cpu_ids else "not pinned"
            return res.stdout, {"throttled": throttled, "freq_before": fb, "freq_after": fa, "temps_before": tb,
                                "temps_after": ta, "notes": [pinned, *notes]}
        finally:
            self._remove_remote(remote)

    def _identity_for_error(self) -> DeviceIdentity | None:
        try:
            return self.read_identity()
        except DeviceError:
            return None

    def _kill_harness(self, remote_dir: str) -> bool:
        """Kill any process still running the harness of this run (by its unique path)."""
        needle = f"{remote_dir}/harness"
        try:
            res = self._shell(["ps", "-A", "-o", "PID,ARGS"], what="list processes",
                              check=False)
        except DeviceError:
            return False
        pids = []
        for line in res.stdout.splitlines()[1:]:
            parts = line.split(None, 1)
            if len(parts) == 2 and parts[0].isdigit() and needle in parts[1]:
                pids.append(parts[0])
        if pids:
            try:
                self._shell(["kill", "-9", *pids], what="kill the hung harness", check=False)
            except DeviceError:
                return False
        return bool(pids)

    def fetch(self, ctx: RunContext) -> np.ndarray:
        data = self.pull_bytes(f"{ctx.remote_dir}/out.bin")
        return load_output(data, ctx.spec, self.where)

    def cleanup(self, ctx: RunContext) -> None:
        try:
            if ctx.uploaded and self._device is not None:
                self._remove_remote(ctx.remote_dir)
        finally:
            super().cleanup(ctx)

    def _remove_remote(self, remote_dir: str) -> None:
        if not remote_dir.startswith(REMOTE_ROOT + "/") or ".." in remote_dir.split("/"):
            return  # never remove anything outside our own run directories
        deadline = time.monotonic() + self.cleanup_wait_s
        while True:
            if self.state() == "device":
                try:
                    self._shell(["rm", "-rf", remote_dir], what=f"remove {remote_dir}",
                                timeout=15)
                    return
                except DeviceError as exc:
                    last = exc
            else:
                last = None
            if time.monotonic() >= deadline:
                log.warning("could not remove %s on %s (%s); remove it by hand with: "
                            "adb -s %s shell rm -rf %s", remote_dir, self.serial,
                            last or "device unreachable", self.serial, remote_dir)
                return
            time.sleep(0.25)


class _Timeout(DeviceError):
    def __init__(self, what: str):
        super().__init__(f"timed out trying to {what}")


def device_rows(host: str | None = None, port: int | None = None,
                start_server: bool = True) -> list[dict]:
    """One dict per device the adb server knows (for `xfc devices`)."""
    client = make_client(host, port, start_server)
    rows = []
    for serial, state in list_states(client):
        row = {"serial": serial, "state": state, "model": "", "abi": "", "soc": "",
               "board_platform": "", "hardware": None, "virtual": False}
        if state == "device":
            try:
                dev = client.device(serial=serial)
                props = parse_getprop(dev.shell2(["getprop"], timeout=15, v2=True).stdout)
                cpuinfo = dev.shell2(["cat", "/proc/cpuinfo"], timeout=15, v2=True)
                ident = identity_from(serial, props,
                                      cpuinfo.stdout if cpuinfo.returncode == 0 else "")
                match = match_identity(ident)
                row.update(model=ident.model, abi=ident.abi, soc=ident.soc_model,
                           board_platform=ident.board_platform, hardware=match.name,
                           matched_by=match.how, candidates=list(match.candidates),
                           cpus=ident.cpu_summary(), virtual=ident.virtual)
            except Exception as exc:  # noqa: BLE001 - keep listing the others
                row["error"] = f"{type(exc).__name__}: {exc}"[:200]
        rows.append(row)
    return rows
