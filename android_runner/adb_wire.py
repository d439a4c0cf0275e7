"""The ADB wire format, device side: message header, command ids, limits, features, and the
shell_v2 / sync packet constants the services use. Pure data and two helpers; no state."""
from __future__ import annotations

import socket
import struct


def _cmd_id(text: str) -> int:
    return int.from_bytes(text.encode("ascii"), "little")


A_CNXN = _cmd_id("CNXN")
A_AUTH = _cmd_id("AUTH")
A_OPEN = _cmd_id("OPEN")
A_OKAY = _cmd_id("OKAY")
A_WRTE = _cmd_id("WRTE")
A_CLSE = _cmd_id("CLSE")
A_SYNC = _cmd_id("SYNC")
A_STLS = _cmd_id("STLS")

PROTOCOL_VERSION = 0x01000001      # the version that lets both sides skip payload checksums
DEVICE_MAX_PAYLOAD = 1024 * 1024
AUTH_TOKEN, AUTH_SIGNATURE, AUTH_RSAPUBLICKEY = 1, 2, 3
HEADER = struct.Struct("<6I")
FEATURES = ("shell_v2", "cmd", "stat_v2", "ls_v2", "fixed_push_mkdir")

# shell protocol (shell_v2) packet ids: 1-byte id, 4-byte little-endian length, payload
SH_STDIN, SH_STDOUT, SH_STDERR, SH_EXIT, SH_CLOSE_STDIN, SH_WINDOW = 0, 1, 2, 3, 4, 5

SYNC_DATA_MAX = 64 * 1024


def pack_message(command: int, arg0: int, arg1: int, payload: bytes = b"") -> bytes:
    checksum = sum(payload) & 0xFFFFFFFF
    return HEADER.pack(command, arg0 & 0xFFFFFFFF, arg1 & 0xFFFFFFFF, len(payload), checksum,
                       command ^ 0xFFFFFFFF) + payload


def recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("peer closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)
