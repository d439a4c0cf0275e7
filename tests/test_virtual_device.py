"""The virtual ADB device: wire protocol (raw and through the real adb server), shell, sync."""
from __future__ import annotations

import os
import shlex
import socket
import struct
import subprocess
import sys

import numpy as np
import pytest

from android_runner.testbed import build_standin
from android_runner.adb_wire import A_CLSE, A_CNXN, A_OKAY, A_OPEN, A_WRTE, HEADER, pack_message
from android_runner.device_shell import tokenize
from android_runner.virtual_device import Faults, VirtualDevice
from support import needs_adb, needs_arm


# --------------------------------------------------------------------------------------------
# raw protocol, no adb involved
# --------------------------------------------------------------------------------------------

class RawHost:
    """A minimal host side, to check the device's bytes on the wire."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)

    def send(self, cmd, a0, a1, payload=b""):
        self.sock.sendall(pack_message(cmd, a0, a1, payload))

    def recv(self):
        head = self._exact(HEADER.size)
        cmd, a0, a1, n, _chk, magic = HEADER.unpack(head)
        assert magic == cmd ^ 0xFFFFFFFF
        return cmd, a0, a1, self._exact(n) if n else b""

    def _exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            assert chunk, "device closed the link"
            buf += chunk
        return buf

    def handshake(self):
        self.send(A_CNXN, 0x01000001, 1024 * 1024, b"host::features=shell_v2\x00")
        return self.recv()

    def open(self, local_id, service: str):
        self.send(A_OPEN, local_id, 0, service.encode() + b"\x00")
        cmd, dev_id, a1, _ = self.recv()
        assert cmd == A_OKAY and a1 == local_id
        return dev_id

    def read_stream(self, local_id, dev_id) -> bytes:
        data = b""
        while True:
            cmd, a0, a1, payload = self.recv()
            if cmd == A_WRTE:
                data += payload
                self.send(A_OKAY, local_id, dev_id)
            elif cmd == A_CLSE:
                return data

    def close(self):
        self.sock.close()


@pytest.fixture
def vdev():
    with VirtualDevice(soc="snapdragon-865") as dev:
        yield dev


@pytest.mark.unit
def test_cnxn_banner(vdev):
    host = RawHost(vdev.port)
    cmd, version, maxdata, banner = host.handshake()
    assert cmd == A_CNXN and version == 0x01000001 and maxdata >= 4096
    text = banner.decode()
    assert text.startswith("device::")
    assert "ro.product.model=xfc virtual device (snapdragon-865)" in text
    feats = text.split("features=")[1].split(",")
    for f in ("shell_v2", "cmd", "stat_v2", "ls_v2", "fixed_push_mkdir"):
        assert f in feats
    host.close()


@pytest.mark.unit
def test_shell_v2_packets(vdev):
    host = RawHost(vdev.port)
    host.handshake()
    dev_id = host.open(7, "shell,v2,raw:echo out; cat /nonexistent; getprop ro.soc.model")
    data = host.read_stream(7, dev_id)
    packets, i = [], 0
    while i < len(data):
        kind, n = data[i], struct.unpack("<I", data[i + 1:i + 5])[0]
        packets.append((kind, data[i + 5:i + 5 + n]))
        i += 5 + n
    stdout = b"".join(p for k, p in packets if k == 1)
    stderr = b"".join(p for k, p in packets if k == 2)
    assert stdout == b"out\nSM8250\n"
    assert b"No such file" in stderr
    assert packets[-1] == (3, b"\x00")   # exit packet: last command succeeded
    host.close()


@pytest.mark.unit
def test_unknown_service_is_refused(vdev):
    host = RawHost(vdev.port)
    host.handshake()
    host.send(A_OPEN, 3, 0, b"tcp:8080\x00")
    cmd, a0, a1, _ = host.recv()
    assert cmd == A_CLSE and a0 == 0 and a1 == 3
    host.close()


@pytest.mark.unit
def test_sync_send_recv_raw(vdev):
    host = RawHost(vdev.port)
    host.handshake()
    dev_id = host.open(5, "sync:")
    spec = b"/data/local/tmp/x/y/file.bin,33188"
    body = b"SEND" + struct.pack("<I", len(spec)) + spec + b"DATA" + struct.pack("<I", 3) + b"abc"
    body += b"DONE" + struct.pack("<I", 1700000000)
    host.send(A_WRTE, 5, dev_id, body)
    cmd, *_ = host.recv()
    assert cmd == A_OKAY
    cmd, _, _, payload = host.recv()
    assert cmd == A_WRTE and payload == b"OKAY\x00\x00\x00\x00"
    host.send(A_OKAY, 5, dev_id)
    assert (vdev.sandbox / "x" / "y" / "file.bin").read_bytes() == b"abc"   # fixed_push_mkdir
    path = b"/data/local/tmp/x/y/file.bin"
    host.send(A_WRTE, 5, dev_id, b"STA2" + struct.pack("<I", len(path)) + path)
    assert host.recv()[0] == A_OKAY
    cmd, _, _, payload = host.recv()
    ident, err, _dev, _ino, mode, _nl, _uid, _gid, size = struct.unpack("<4sIQQIIIIQ",
                                                                         payload[:48])
    assert ident == b"STA2" and err == 0 and size == 3 and mode & 0o170000 == 0o100000
    host.close()


@pytest.mark.parametrize("line,expected", [
    ("echo a b", [["echo", "a", "b"]]),
    ("echo 'a;b' \"c d\" e\\ f", [["echo", "a;b", "c d", "e f"]]),
    ("true && echo x || echo y; echo z", [["true"], ["echo", "x"], ["echo", "y"], ["echo", "z"]]),
])
@pytest.mark.unit
def test_tokenize(line, expected):
    toks, cur, segs = tokenize(line), [], []
    for t in toks:
        if type(t) is not str:
            segs.append(cur)
            cur = []
        else:
            cur.append(t)
    segs.append(cur)
    assert segs == expected


@pytest.mark.parametrize("arg", ["plain", "with space", "semi;colon", "it's", "$HOME", "a&&b",
                                 "back\\slash", 'dq"x', "", "*"])
@pytest.mark.unit
def test_tokenize_roundtrips_shlex_quote(arg):
    assert tokenize("echo " + shlex.quote(arg)) == ["echo", arg]


# --------------------------------------------------------------------------------------------
# through the real adb server (the `server` fixture of conftest.py)
# --------------------------------------------------------------------------------------------

@pytest.fixture
def connected(server, vdev):
    assert server.connect(vdev.serial) == "device"
    try:
        yield server, vdev
    finally:
        server.disconnect(vdev.serial)


def _adb(server, serial, *args, timeout=30):
    env = dict(os.environ, ANDROID_ADB_SERVER_PORT=str(server.port))
    return subprocess.run([server.adb, "-P", str(server.port), "-s", serial, *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.adb
@needs_adb
def test_adb_cli_shell_and_exit_codes(connected):
    server, dev = connected
    r = _adb(server, dev.serial, "shell", "getprop", "ro.product.model")
    assert r.returncode == 0 and r.stdout.strip() == "xfc virtual device (snapdragon-865)"
    assert _adb(server, dev.serial, "shell", "false").returncode == 1
    assert _adb(server, dev.serial, "shell", "no-such-command").returncode == 127
    r = _adb(server, dev.serial, "shell", "getprop")
    assert "[ro.product.cpu.abi]: [arm64-v8a]" in r.stdout
    assert "[ro.build.version.sdk]: [33]" in r.stdout


@pytest.mark.adb
@needs_adb
def test_adb_cli_push_pull_ls(connected, tmp_path):
    server, dev = connected
    src = tmp_path / "blob.bin"
    payload = os.urandom(300_000)        # several sync DATA chunks and ADB packets
    src.write_bytes(payload)
    assert _adb(server, dev.serial, "push", str(src), "/data/local/tmp/t/blob.bin").returncode == 0
    assert (dev.sandbox / "t" / "blob.bin").read_bytes() == payload
    back = tmp_path / "back.bin"
    assert _adb(server, dev.serial, "pull", "/data/local/tmp/t/blob.bin", str(back)).returncode == 0
    assert back.read_bytes() == payload
    r = _adb(server, dev.serial, "ls", "/data/local/tmp/t")
    assert "blob.bin" in r.stdout
    r = _adb(server, dev.serial, "shell", "cat", "/sys/devices/system/cpu/cpu7/cpufreq/scaling_cur_freq")
    assert r.stdout.strip() == "2840000"
    _adb(server, dev.serial, "shell", "rm", "-rf", "/data/local/tmp/t")
    assert dev.sandbox_files() == []


@pytest.mark.adb
@needs_adb
def test_adbutils_quotes_list_arguments(connected):
    import adbutils
    server, dev = connected
    d = adbutils.AdbClient(host="127.0.0.1", port=server.port).device(serial=dev.serial)
    tricky = ["a; rm -rf /data/local/tmp", "$HOME", "it's", "x && y", "*", "new\nline"]
    res = d.shell2(["echo", *tricky], v2=True)
    assert res.returncode == 0
    assert res.stdout == " ".join(tricky) + "\n"
    # the device saw one quoted command line, nothing executed
    assert dev.system.commands[-1] == " ".join(shlex.quote(a) for a in ["echo", *tricky])


@pytest.mark.adb
@needs_adb
@needs_arm
def test_elf_runs_under_qemu_with_taskset(connected, tmp_path):
    server, dev = connected
    harness = build_standin(tmp_path)
    a = np.arange(8, dtype="<f4")
    (tmp_path / "a.bin").write_bytes(a.tobytes())
    (tmp_path / "z.bin").write_bytes(b"")
    d = "/data/local/tmp/run1"
    for local, remote in ((harness, f"{d}/h"), (tmp_path / "a.bin", f"{d}/a.bin"),
                          (tmp_path / "z.bin", f"{d}/z.bin")):
        assert _adb(server, dev.serial, "push", str(local), remote).returncode == 0
    r = _adb(server, dev.serial, "shell", "taskset", "80", f"{d}/h", f"{d}/a.bin", f"{d}/a.bin",
             f"{d}/z.bin", f"{d}/o.bin", "--repeat", "2")
    assert r.returncode == 0, r.stderr
    assert '"repeats": 2' in r.stdout
    assert np.array_equal(np.fromfile(dev.sandbox / "run1" / "o.bin", "<f4"), 2 * a)
    assert dev.system.taskset_log[-1][0] == "80"
    # a mask selecting no CPU fails like the real taskset
    r = _adb(server, dev.serial, "shell", "taskset", "100", f"{d}/h")
    assert r.returncode == 1 and "Invalid argument" in r.stderr


@pytest.mark.adb
@needs_adb
def test_unauthorized_and_offline_states(server):
    with VirtualDevice(faults=Faults(unauthorized=True)) as dev:
        assert server.connect(dev.serial, want_state="unauthorized") == "unauthorized"
        server.disconnect(dev.serial)
    with VirtualDevice(faults=Faults(offline=True)) as dev:
        state = server.connect(dev.serial, want_state="offline", timeout=8, attempt_timeout=1)
        server.disconnect(dev.serial)
        assert state == "offline"


@pytest.mark.subprocess
def test_cli_prints_how_to_connect():
    proc = subprocess.Popen([sys.executable, "-m", "android_runner.virtual_device", "--port", "0",
                             "--soc", "snapdragon-888"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert "not a phone" in lines[0] and "snapdragon-888" in lines[0]
    assert "adb connect 127.0.0.1:" in lines[2]
