"""Helpers to stand up a private adb server + virtual device (tests, demos, CI).

    with AdbServer() as server, VirtualDevice(soc="snapdragon-865") as dev:
        server.connect(dev.serial)
        runner = AdbRunner(serial=dev.serial, adb_port=server.port, cpu_ids=(4, 5, 6, 7))

Everything listens on 127.0.0.1 only; every server started here is killed on exit.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STANDIN_SOURCE = HERE / "standin_harness.c"   # shipped with the package (pyproject package-data)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_adb() -> str | None:
    from xfc.runners.adb import adb_binary
    return adb_binary()


class AdbServer:
    """A private adb server on a free 127.0.0.1 port, killed on stop()."""

    def __init__(self, adb: str | None = None, port: int | None = None):
        self.adb = adb or find_adb()
        if not self.adb:
            raise RuntimeError("no adb binary found (install 'adb' or adbutils)")
        self.port = port or free_port()
        self.started = False

    def _run(self, *args: str, timeout: float = 20) -> subprocess.CompletedProcess:
        env = dict(os.environ, ANDROID_ADB_SERVER_PORT=str(self.port))
        return subprocess.run([self.adb, "-P", str(self.port), *args], capture_output=True,
                              text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)

    def start(self) -> "AdbServer":
        self._run("start-server")
        self.started = True
        return self

    def client(self):
        import adbutils
        return adbutils.AdbClient(host="127.0.0.1", port=self.port, socket_timeout=20)

    def connect(self, serial: str, want_state: str | None = "device",
                timeout: float = 10.0, attempt_timeout: float = 5.0) -> str:
        """`adb connect serial`; wait until it is listed in want_state; return the state."""
        client = self.client()
        deadline = time.monotonic() + timeout
        state = None
        while time.monotonic() < deadline:
            try:
                client.connect(serial, timeout=attempt_timeout)
            except Exception:  # noqa: BLE001 - keep trying until the deadline
                pass
            end = min(deadline, time.monotonic() + 2.0)
            while time.monotonic() < end:
                state = self.state(serial)
                if state is not None and (want_state is None or state == want_state):
                    return state
                time.sleep(0.1)
        return state or "absent"

    def state(self, serial: str) -> str | None:
        try:
            for info in self.client().list():
                if info.serial == serial:
                    return info.state
        except Exception:  # noqa: BLE001
            return None
        return None

    def disconnect(self, serial: str) -> None:
        try:
            self.client().disconnect(serial)
        except Exception:  # noqa: BLE001
            pass

    def stop(self) -> None:
        if self.started:
            try:
                self._run("kill-server", timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self.started = False

    def __enter__(self) -> "AdbServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def build_standin(dest_dir: str | os.PathLike, cc: str = "aarch64-linux-gnu-gcc") -> Path:
    """Compile the stand-in harness (out = a + b + bias) as a static aarch64 binary."""
    if shutil.which(cc) is None:
        raise RuntimeError(f"{cc} not found")
    out = Path(dest_dir) / "standin_harness"
    subprocess.run([cc, "-O2", "-static", "-o", str(out), str(STANDIN_SOURCE)], check=True,
                   capture_output=True, timeout=120)
    return out
