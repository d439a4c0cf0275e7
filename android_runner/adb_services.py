"""ADB streams and connections, device side: the transport loop (CNXN, AUTH, OPEN, OKAY, WRTE,
CLSE, with the link faults) and the two services, `shell:` / `shell,v2,...:` and `sync:`."""
from __future__ import annotations

import errno
import os
import posixpath
import secrets
import socket
import stat as statmod
import struct
import threading
import time
from typing import Callable

from android_runner.adb_wire import (A_AUTH, A_CLSE, A_CNXN, A_OKAY, A_OPEN, A_WRTE, AUTH_SIGNATURE, AUTH_TOKEN,
                                     DEVICE_MAX_PAYLOAD, FEATURES, HEADER, PROTOCOL_VERSION, SH_EXIT, SH_STDERR,
                                     SH_STDOUT, SYNC_DATA_MAX, pack_message, recv_exact)
from android_runner.device_shell import ShellSession
from android_runner.device_system import (FakeSystem, PathError, device_norm, host_path, in_sandbox, list_dir,
                                          path_kind, read_file)


class Stream:
    """One ADB stream of a connection: bytes from the host queue in `inbuf`; writes wait for the
    host's OKAY of the previous WRTE (one outstanding write, as adbd does)."""

    def __init__(self, conn: "Connection", local_id: int, remote_id: int):
        self.conn = conn
        self.local_id = local_id
        self.remote_id = remote_id
        self.cond = threading.Condition()
        self.inbuf = bytearray()
        self.acked = True
        self.closed = False
        self.on_close: Callable[[bool], None] | None = None

    # data from the host
    def feed(self, data: bytes) -> None:
        with self.cond:
            self.inbuf += data
            self.cond.notify_all()

    def read_exact(self, n: int) -> bytes:
        with self.cond:
            while len(self.inbuf) < n:
                if self.closed:
                    raise EOFError("stream closed")
                self.cond.wait(0.5)
            data = bytes(self.inbuf[:n])
            del self.inbuf[:n]
            return data

    def ack(self) -> None:
        with self.cond:
            self.acked = True
            self.cond.notify_all()

    # data to the host
    def write(self, data: bytes) -> None:
        limit = max(1024, min(self.conn.max_payload, DEVICE_MAX_PAYLOAD))
        for off in range(0, len(data), limit):
            chunk = data[off:off + limit]
            with self.cond:
                while not self.acked:
                    if self.closed:
                        raise EOFError("stream closed")
                    self.cond.wait(0.5)
                if self.closed:
                    raise EOFError("stream closed")
                self.acked = False
            self.conn.send(A_WRTE, self.local_id, self.remote_id, chunk)

    def wait_acked(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self.acked and not self.closed and time.monotonic() < deadline:
                self.cond.wait(0.1)

    def close(self) -> None:
        with self.cond:
            was_closed = self.closed
            self.closed = True
            self.cond.notify_all()
        if not was_closed:
            self.conn.send(A_CLSE, self.local_id, self.remote_id)
            self.conn.forget(self.local_id)

    def remote_closed(self, link_lost: bool = False) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.conn.forget(self.local_id)
        if self.on_close is not None:
            self.on_close(link_lost)


class Connection:
    """One host link. `log` takes a message for the server's log; `on_end` is called with this
    connection once its link is gone (the server forgets it)."""

    def __init__(self, system: FakeSystem, sock: socket.socket, log: Callable[[str], None],
                 on_end: Callable[["Connection"], None]):
        self.system = system
        self.log = log
        self.on_end = on_end
        self.sock = sock
        self.send_lock = threading.Lock()
        self.streams: dict[int, Stream] = {}
        self.streams_lock = threading.Lock()
        self.next_id = 1
        self.max_payload = 4096
        self.dead = False

    def send(self, command: int, arg0: int, arg1: int, payload: bytes = b"") -> None:
        msg = pack_message(command, arg0, arg1, payload)
        with self.send_lock:
            if self.dead:
                raise EOFError("connection dropped")
            try:
                self.sock.sendall(msg)
            except OSError as exc:
                self.dead = True
                raise EOFError(str(exc)) from exc

    def forget(self, local_id: int) -> None:
        with self.streams_lock:
            self.streams.pop(local_id, None)

    def drop(self) -> None:
        """Abruptly cut the link, as a pulled USB cable would."""
        self.dead = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def banner(self) -> bytes:
        p = self.system.props
        return (f"device::ro.product.name={p['ro.product.name']};"
                f"ro.product.model={p['ro.product.model']};"
                f"ro.product.device={p['ro.product.device']};"
                f"features={','.join(FEATURES)}").encode()

    def serve(self) -> None:
        try:
            self._loop()
        except (ConnectionError, OSError, EOFError, struct.error):
            pass
        finally:
            self.dead = True
            with self.streams_lock:
                streams = list(self.streams.values())
                self.streams.clear()
            for s in streams:
                s.remote_closed(link_lost=True)
            try:
                self.sock.close()
            except OSError:
                pass
            self.on_end(self)

    def _loop(self) -> None:
        connected = False
        while True:
            header = recv_exact(self.sock, HEADER.size)
            command, arg0, arg1, length, _checksum, magic = HEADER.unpack(header)
            if magic != command ^ 0xFFFFFFFF:
                return  # corrupt header: close the link, as the protocol demands
            payload = recv_exact(self.sock, length) if length else b""
            with self.system.lock:
                self.system.bytes_in += HEADER.size + length
                drop_now = (self.system.drop_bytes_pending is not None
                            and self.system.bytes_in >= self.system.drop_bytes_pending)
                if drop_now:
                    self.system.drop_bytes_pending = None
            if drop_now:
                self.log(f"fault: dropping the link after {self.system.bytes_in} bytes")
                self.drop()
                return
            if command == A_CNXN:
                self.max_payload = min(arg1, DEVICE_MAX_PAYLOAD) if arg1 else 4096
                if self.system.faults.offline:
                    continue
                if self.system.faults.unauthorized:
                    self.send(A_AUTH, AUTH_TOKEN, 0, secrets.token_bytes(20))
                    continue
                version = min(arg0, PROTOCOL_VERSION) if arg0 else PROTOCOL_VERSION
                self.send(A_CNXN, version, DEVICE_MAX_PAYLOAD, self.banner())
                connected = True
            elif command == A_AUTH:
                if arg0 == AUTH_SIGNATURE:
                    # no key is ever accepted: ask again, so the host ends up 'unauthorized'
                    self.send(A_AUTH, AUTH_TOKEN, 0, secrets.token_bytes(20))
                # AUTH_RSAPUBLICKEY: a phone would show a dialog; nobody accepts it here
            elif not connected:
                continue
            elif command == A_OPEN:
                self._open(arg0, payload)
            elif command == A_OKAY:
                with self.streams_lock:
                    s = self.streams.get(arg1)
                if s is not None:
                    if s.remote_id == 0:
                        s.remote_id = arg0
                    s.ack()
            elif command == A_WRTE:
                with self.streams_lock:
                    s = self.streams.get(arg1)
                if s is None:
                    self.send(A_CLSE, 0, arg0)
                    continue
                s.feed(payload)
                self.send(A_OKAY, s.local_id, s.remote_id)
            elif command == A_CLSE:
                with self.streams_lock:
                    s = self.streams.get(arg1)
                if s is not None:
                    s.remote_closed()

    def _open(self, remote_id: int, payload: bytes) -> None:
        service = payload.rstrip(b"\x00").decode("utf-8", "replace")
        handler = None
        if service.startswith("shell"):
            head, sep, cmd = service.partition(":")
            if sep:
                opts = head.split(",")[1:]
                handler = lambda s: self._shell_service(s, cmd, "v2" in opts)  # noqa: E731
        elif service == "sync:":
            handler = self._sync_service
        if handler is None:
            self.log(f"refusing service {service!r}")
            self.send(A_CLSE, 0, remote_id)
            return
        with self.streams_lock:
            local_id = self.next_id
            self.next_id += 1
            stream = Stream(self, local_id, remote_id)
            self.streams[local_id] = stream
        self.send(A_OKAY, local_id, remote_id)
        t = threading.Thread(target=self._run_service, args=(handler, stream), daemon=True,
                             name=f"vdev-{service[:20]}")
        t.start()

    def _run_service(self, handler, stream: Stream) -> None:
        try:
            handler(stream)
        except (EOFError, OSError, ConnectionError):
            pass
        finally:
            try:
                stream.wait_acked()
                stream.close()
            except (EOFError, OSError):
                pass

    # -- shell ----------------------------------------------------------------------------------
    def _shell_service(self, stream: Stream, command: str, v2: bool) -> None:
        def packet(kind: int, data: bytes) -> None:
            if data:
                stream.write(bytes([kind]) + struct.pack("<I", len(data)) + data)

        out = (lambda d: packet(SH_STDOUT, d)) if v2 else (lambda d: d and stream.write(d))
        err = (lambda d: packet(SH_STDERR, d)) if v2 else (lambda d: d and stream.write(d))

        def run_start() -> None:
            if self.system.drop_on_run_pending:
                self.system.drop_on_run_pending = False
                self.log("fault: dropping the link as a run starts")
                self.system.kill_all()
                self.drop()
                raise EOFError("dropped on purpose")

        session = ShellSession(self.system, out, err, run_start)
        stream.on_close = session.cancel
        if not command.strip():
            err(b"xfc virtual device: interactive shells are not supported\n")
            status = 1
        else:
            status = session.run_line(command)
        if v2:
            stream.write(bytes([SH_EXIT]) + struct.pack("<I", 1) + bytes([status & 0xFF]))

    # -- sync -----------------------------------------------------------------------------------
    def _sync_service(self, stream: Stream) -> None:
        while True:
            req = stream.read_exact(8)
            ident = req[:4].decode("ascii", "replace")
            length = struct.unpack("<I", req[4:])[0]
            if ident == "QUIT":
                return
            if length > 4096:
                self._sync_fail(stream, "path too long")
                return
            path = stream.read_exact(length).decode("utf-8", "replace") if length else ""
            if ident in ("STAT", "STA2", "LST2"):
                self._sync_stat(stream, ident, path)
            elif ident in ("LIST", "LIS2"):
                self._sync_list(stream, ident, path)
            elif ident == "SEND":
                if not self._sync_send(stream, path):
                    return
            elif ident == "RECV":
                if not self._sync_recv(stream, path):
                    return
            else:
                self._sync_fail(stream, f"unknown sync request {ident!r}")
                return

    def _sync_fail(self, stream: Stream, message: str) -> None:
        data = message.encode()
        stream.write(b"FAIL" + struct.pack("<I", len(data)) + data)

    def _lookup(self, dev_path: str) -> tuple[int, os.stat_result | None, int]:
        """(mode, host stat or None, errno) for a device path."""
        try:
            kind = path_kind(self.system, dev_path)
        except PathError as exc:
            return 0, None, exc.errno
        if kind is None:
            return 0, None, errno.ENOENT
        if in_sandbox(dev_path):
            st = host_path(self.system, dev_path).stat()
            return st.st_mode, st, 0
        if kind == "d":
            return statmod.S_IFDIR | 0o755, None, 0
        return statmod.S_IFREG | 0o444, None, 0

    def _sync_stat(self, stream: Stream, ident: str, path: str) -> None:
        p = device_norm(path)
        mode, st, err = self._lookup(p)
        size = st.st_size if st else (4096 if mode else 0)
        mtime = int(st.st_mtime) if st else (int(time.time()) if mode else 0)
        if ident == "STAT":
            stream.write(b"STAT" + struct.pack("<III", mode, size & 0xFFFFFFFF, mtime))
            return
        ino = st.st_ino if st else 0
        nlink = st.st_nlink if st else (1 if mode else 0)
        stream.write(ident.encode() + struct.pack(
            "<IQQIIIIQqqq", err, 0, ino, mode, nlink, 2000 if mode else 0, 2000 if mode else 0,
            size, mtime, mtime, mtime))

    def _sync_list(self, stream: Stream, ident: str, path: str) -> None:
        p = device_norm(path)
        names = list_dir(self.system, p) or []
        for name in [".", ".."] + names:
            child = p if name == "." else (posixpath.dirname(p) if name == ".." else
                                           posixpath.join(p, name))
            mode, st, _ = self._lookup(child)
            size = st.st_size if st else 0
            mtime = int(st.st_mtime) if st else 0
            raw = name.encode()
            if ident == "LIST":
                stream.write(b"DENT" + struct.pack("<IIII", mode, size & 0xFFFFFFFF, mtime,
                                                   len(raw)) + raw)
            else:
                stream.write(b"DNT2" + struct.pack(
                    "<IQQIIIIQqqqI", 0, 0, st.st_ino if st else 0, mode, 1, 2000, 2000, size,
                    mtime, mtime, mtime, len(raw)) + raw)
        if ident == "LIST":
            stream.write(b"DONE" + bytes(16))
        else:
            stream.write(b"DONE" + bytes(struct.calcsize("<IQQIIIIQqqqI")))

    def _drain_send(self, stream: Stream) -> None:
        while True:
            head = stream.read_exact(8)
            ident, size = head[:4], struct.unpack("<I", head[4:])[0]
            if ident == b"DONE":
                return
            if ident != b"DATA":
                raise EOFError("bad sync data")
            stream.read_exact(size)

    def _sync_send(self, stream: Stream, spec: str) -> bool:
        path, _, mode_s = spec.rpartition(",")
        if not path:
            path, mode_s = spec, "33188"
        try:
            mode = int(mode_s) & 0o777
        except ValueError:
            mode = 0o644
        p = device_norm(path)
        if self.system.faults.storage_full:
            self._drain_send(stream)
            self._sync_fail(stream, f"couldn't create file: {os.strerror(errno.ENOSPC)}")
            return False
        try:
            hp = host_path(self.system, p)
        except PathError as exc:
            self._drain_send(stream)
            self._sync_fail(stream, f"couldn't create file: {os.strerror(exc.errno)}")
            return False
        tmp = hp.with_name(hp.name + ".xfc-partial")
        try:
            hp.parent.mkdir(parents=True, exist_ok=True)   # fixed_push_mkdir
            with open(tmp, "wb") as f:
                while True:
                    head = stream.read_exact(8)
                    ident, size = head[:4], struct.unpack("<I", head[4:])[0]
                    if ident == b"DONE":
                        mtime = size          # DONE carries the file's mtime
                        break
                    if ident != b"DATA" or size > SYNC_DATA_MAX:
                        raise EOFError("bad sync data")
                    f.write(stream.read_exact(size))
            os.replace(tmp, hp)
            os.chmod(hp, mode)
            if mtime:
                os.utime(hp, (mtime, mtime))
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            self._sync_fail(stream, f"couldn't write file: {exc.strerror}")
            return False
        except EOFError:
            tmp.unlink(missing_ok=True)
            raise
        stream.write(b"OKAY" + struct.pack("<I", 0))
        return True

    def _sync_recv(self, stream: Stream, path: str) -> bool:
        p = device_norm(path)
        try:
            data = read_file(self.system, p)
        except PathError as exc:
            self._sync_fail(stream, f"open failed: {os.strerror(exc.errno)}")
            return False
        for off in range(0, len(data), SYNC_DATA_MAX):
            chunk = data[off:off + SYNC_DATA_MAX]
            stream.write(b"DATA" + struct.pack("<I", len(chunk)) + chunk)
        stream.write(b"DONE" + struct.pack("<I", 0))
        return True

